"""The network's shape as values: which tier two ranks' traffic crosses, and the bandwidth share each device has
there when every rank crosses it at once.

A topology describes the fabric; the Cluster (compiler/layout/cluster.py) says how many nodes and devices per
node it has, so every question takes `devices_per_node` and validation also takes `nodes`. A rank sits on
`(node, local device)`; `locate(rank, devices_per_node)` is the usual mapping (node-major), and the placement
(compiler/layout/placement.py) decides which mesh coordinate gets which rank.

The levels, fastest first (a level's index grows as bandwidth shrinks), are the same few words everywhere:
    scale_up     inside one NVLink (or similar) domain: a node, or `scale_up` devices over several nodes (GB200
                 NVL72: 72 GPUs, 18 trays of 4, one NVLink domain; NVIDIA's GB200 NVL72 datasheet)
    node         the same node, another scale-up domain (only when `scale_up` is smaller than a node)
    then the network's own levels, e.g. a fat-tree's `leaf`, `spine` and `top` (across pods, through the
    aggregation tier), a torus's hop counts, a dragonfly's `group` and `global`.

A level's `share` is the fraction of its base bandwidth one device gets when all ranks cross that level at once:
the base is the scale-up bandwidth for `scale_up` and the per-device network (NIC) bandwidth for every other level
(compiler/layout/devices.py's intra_node_gbps and inter_node_gbps). In a fat-tree each uplink level oversubscribed
o:1 divides it by o, so a 1:7 top tier above non-blocking leaves gives 1/7 of the leaf's per-device bandwidth
(Leiserson, "Fat-trees", IEEE Trans. Computers 1985; Meta's Llama 3 fabric, "The Llama 3 Herd of Models" §3.3.1:
pods of full bisection bandwidth joined by an aggregation layer oversubscribed 1:7).

`problems(nodes, devices_per_node)` lists what cannot be built, each a `Problem(field, message, hint)` that the
checker turns into a located diagnostic. `parse_slurm` reads a Slurm `topology.conf` (tree plugin) into a
`SwitchTree`. Torch-free; imports nothing of compiler.cost.
"""
from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One impossible shape: the setting at fault, what is wrong, what would fit."""

    field: str
    message: str
    hint: str


@dataclass(frozen=True)
class Crossing:
    """Where two ranks' traffic goes: the level's index and name, the per-device share there (see the module's
    docstring) and, on a torus, the hops per dimension."""

    level: int
    name: str
    share: float
    hops: tuple = ()


def locate(rank: int, devices_per_node: int) -> tuple:
    """(node, local device) of `rank` when ranks fill nodes in order: the launcher's default (torchrun's node rank
    times nproc_per_node plus the local rank)."""
    return divmod(rank, devices_per_node)


class Topology:
    """What every topology answers. A subclass names its network levels (`network_levels`), says which of them two
    nodes' traffic crosses (`network_level`) and each level's share (`network_share`); this class adds the
    scale-up domain in front."""

    scale_up: int = 0

    # -- the subclass's part --------------------------------------------------------------------------------
    def network_levels(self) -> tuple:
        raise NotImplementedError

    def network_level(self, a: tuple, b: tuple) -> int:
        """The network level between (node, local) `a` and `b` on different nodes: an index into network_levels."""
        raise NotImplementedError

    def network_share(self, index: int) -> float:
        raise NotImplementedError

    def shape_problems(self, nodes: int) -> list:
        raise NotImplementedError

    def domains(self, nodes: int) -> tuple | None:
        """The network's nested domains, finest first, each a tuple of one id per node (a fat-tree's leaves, then
        pods): two nodes' traffic stays below level i+1 when they share domain i. None where the network is not a
        tree (a torus) or the domains do not nest; the placement then searches node orders instead."""
        return None

    def node_orders(self, nodes: int) -> tuple:
        """Orders of the nodes worth starting a placement search from (a torus's snakes); the identity always."""
        return (tuple(range(nodes)),)

    # -- common -------------------------------------------------------------------------------------------------
    def scale_up_devices(self, devices_per_node: int) -> int:
        return self.scale_up or devices_per_node

    def levels(self, devices_per_node: int) -> tuple:
        """The level names, fastest first."""
        node = ("node",) if self.scale_up_devices(devices_per_node) < devices_per_node else ()
        return ("scale_up", *node, *self.network_levels())

    def level(self, a: tuple, b: tuple, devices_per_node: int) -> int:
        """The level between (node, local) `a` and `b`: an index into `levels`. Placing 16,384 ranks asks it
        millions of times, so the scale-up domains are compared inline: one of at least a node holds ranks
        node·devices_per_node + local in blocks of its size; a smaller one, a node's locals in blocks of its size."""
        su = self.scale_up_devices(devices_per_node)
        (na, la), (nb, lb) = a, b
        if su >= devices_per_node:
            if (na * devices_per_node + la) // su == (nb * devices_per_node + lb) // su:
                return 0
            inner = 0
        elif na == nb and la // su == lb // su:
            return 0
        else:
            inner = 1
        if na == nb:
            return 1
        return 1 + inner + self.network_level(a, b)

    def share(self, level: int, devices_per_node: int) -> float:
        """The per-device share of the level's base bandwidth when every rank crosses it at once."""
        inner = 2 if self.scale_up_devices(devices_per_node) < devices_per_node else 1
        return 1.0 if level < inner else self.network_share(level - inner)

    def crossing(self, rank_a: int, rank_b: int, devices_per_node: int, locate=locate) -> Crossing:
        """Which level the traffic between two ranks crosses, given `locate(rank, devices_per_node)` ->
        (node, local)."""
        a, b = locate(rank_a, devices_per_node), locate(rank_b, devices_per_node)
        lv = self.level(a, b, devices_per_node)
        return Crossing(lv, self.levels(devices_per_node)[lv], self.share(lv, devices_per_node))

    def slowest_crossing(self, steps, devices_per_node: int, locate=locate) -> Crossing | None:
        """The slowest crossing of the (rank, rank) `steps` of a ring (the one that sets its pace, the least share
        among the slowest levels); None when there are none. Here a level's share is the level's own (`crossing`),
        so it is the highest level's: one level per step, not a Crossing each (a 16,384-rank group has as many
        steps). A subclass whose crossing's share is not its level's (Torus: the hops') compares the crossings."""
        top = max((self.level(locate(a, devices_per_node), locate(b, devices_per_node), devices_per_node)
                   for a, b in steps), default=None)
        if top is None:
            return None
        return Crossing(top, self.levels(devices_per_node)[top], self.share(top, devices_per_node))

    def problems(self, nodes: int, devices_per_node: int) -> tuple:
        """Every reason this topology cannot describe `nodes` nodes of `devices_per_node` devices."""
        out = []
        if nodes < 1 or devices_per_node < 1:
            out.append(Problem("nodes", f"a cluster of {nodes} nodes of {devices_per_node} devices is empty",
                               "give at least one node of at least one device"))
            return tuple(out)
        su = self.scale_up_devices(devices_per_node)
        if su < 1 or (su % devices_per_node and devices_per_node % su):
            out.append(Problem("scale_up", f"a scale-up domain of {su} devices neither divides nor is a multiple "
                               f"of devices_per_node = {devices_per_node}",
                               f"use a divisor of {devices_per_node} or a multiple of it (GB200 NVL72: "
                               "scale_up = 72 over nodes of 4)"))
        elif su > devices_per_node and nodes % (su // devices_per_node):
            out.append(Problem("scale_up", f"a scale-up domain spans {su // devices_per_node} nodes, which does "
                               f"not divide the {nodes} nodes",
                               f"use a node count that is a multiple of {su // devices_per_node}"))
        out.extend(self.shape_problems(nodes))
        return tuple(out)


def _ratio_problems(values: tuple, count: int, name: str = "oversubscription") -> list:
    out = []
    if len(values) != count:
        out.append(Problem(name, f"{len(values)} ratios given for {count} uplink levels",
                           f"give one ratio per level above the first ({count})"))
    for i, o in enumerate(values):
        if not o >= 1:
            out.append(Problem(name, f"ratio {o:g} at level {i + 1} is below 1 (1 is non-blocking, 7 is 1:7)",
                               "write oversubscription as down:up bandwidth, at least 1"))
    return out


def _divides(field: str, part: int, whole: int, what: str, whole_name: str) -> list:
    if part < 1 or whole % part:
        return [Problem(field, f"{what} of {part} nodes does not divide the {whole} {whole_name}",
                        f"choose a divisor of {whole}: {', '.join(map(str, _divisors(whole)[:8]))}")]
    return []


def _divisors(n: int, scan: int = 10**5) -> list:
    """n's divisors in order, found from those up to min(√n, scan) and their complements: every divisor of an n up
    to scan², and a hint's worth of a larger one (a mesh section's `nodes = 1e12` is checked, not enumerated)."""
    if n < 1:
        return []
    small = [d for d in range(1, min(math.isqrt(n), scan) + 1) if n % d == 0]
    return sorted(set(small) | {n // d for d in small})


def _ratios(value, count: int) -> tuple:
    """A scalar ratio is the top uplink's, the lower ones non-blocking; a sequence is taken as given."""
    if isinstance(value, (int, float)):
        return (1.0,) * max(count - 1, 0) + (float(value),) if count else ()
    return tuple(float(v) for v in value)


@dataclass(frozen=True)
class FatTree(Topology):
    """A folded Clos: leaves of `nodes_per_leaf` nodes, spines joining the leaves of a pod of `nodes_per_pod` nodes
    (0: one pod, a two-level tree) and, with pods, an aggregation (top) tier joining the pods. `oversubscription`
    holds down:up ratios per uplink level (leaf -> spine, spine -> top); a single number is the top uplink's.

    FatTree(nodes_per_leaf=2, nodes_per_pod=384, oversubscription=7) on nodes of 8: Llama 3's RoCE cluster as
    §3.3.1 of its paper gives it (racks of two servers, 16 GPUs, under one ToR switch; 192 racks, 3,072 GPUs, a
    pod of full bisection bandwidth; eight pods under an aggregation layer at 1:7).
    """

    nodes_per_leaf: int
    """Nodes under one leaf (top-of-rack) switch."""
    nodes_per_pod: int = 0
    """Nodes under one pod's spines; 0: no pods, the spines are the top."""
    oversubscription: object = 1.0
    """Down:up bandwidth per uplink level, leaf first (≥ 1); a number is the top uplink's, the others 1."""
    scale_up: int = 0
    """Devices in one NVLink domain; 0: a node's."""

    def __post_init__(self):
        object.__setattr__(self, "oversubscription",
                           _ratios(self.oversubscription, len(self.network_levels()) - 1))

    def network_levels(self) -> tuple:
        return ("leaf", "spine", "top") if self.nodes_per_pod else ("leaf", "top")

    def network_level(self, a: tuple, b: tuple) -> int:
        if a[0] // self.nodes_per_leaf == b[0] // self.nodes_per_leaf:
            return 0
        if self.nodes_per_pod and a[0] // self.nodes_per_pod == b[0] // self.nodes_per_pod:
            return 1
        return len(self.network_levels()) - 1

    def network_share(self, index: int) -> float:
        return 1.0 / math.prod(self.oversubscription[:index])

    def shape_problems(self, nodes: int) -> list:
        out = _divides("nodes_per_leaf", self.nodes_per_leaf, self.nodes_per_pod or nodes, "a leaf",
                       "nodes of a pod" if self.nodes_per_pod else "nodes")
        if self.nodes_per_pod:
            out += _divides("nodes_per_pod", self.nodes_per_pod, nodes, "a pod", "nodes")
        return out + _ratio_problems(self.oversubscription, len(self.network_levels()) - 1)

    def domains(self, nodes: int) -> tuple | None:
        sizes = (self.nodes_per_leaf, *((self.nodes_per_pod,) if self.nodes_per_pod else ()))
        return tuple(tuple(n // s for n in range(nodes)) for s in sizes)


@dataclass(frozen=True)
class RailOptimized(Topology):
    """Rail-optimized leaves (NVIDIA DGX SuperPOD reference architecture): in a group (scalable unit) of
    `nodes_per_group` nodes, device i of every node hangs off rail leaf i, so same-index devices of a group meet one
    switch away; groups meet at the spines, pods (`nodes_per_pod`, 0: none) at a top tier. With `pxn` (NCCL 2.12's
    PXN, on by default) a device reaches another rail by moving its data over NVLink to the node's device on the
    right rail first, so any two devices of a group stay on the rails; without it cross-rail traffic climbs to the
    spines. `oversubscription`: down:up per uplink level (rail -> spine, spine -> top)."""

    nodes_per_group: int
    """Nodes of one rail group (scalable unit), device i of each on rail leaf i."""
    nodes_per_pod: int = 0
    """Nodes under one pod's spines; 0: no pods."""
    oversubscription: object = 1.0
    """Down:up bandwidth per uplink level, rail first (≥ 1); a number is the top uplink's, the others 1."""
    pxn: bool = True
    """Whether NCCL's PXN moves cross-rail traffic over NVLink to the right rail first."""
    scale_up: int = 0
    """Devices in one NVLink domain; 0: a node's."""

    def __post_init__(self):
        object.__setattr__(self, "oversubscription",
                           _ratios(self.oversubscription, len(self.network_levels()) - 1))

    def network_levels(self) -> tuple:
        return ("rail", "spine", "top") if self.nodes_per_pod else ("rail", "spine")

    def network_level(self, a: tuple, b: tuple) -> int:
        if a[0] // self.nodes_per_group == b[0] // self.nodes_per_group and (self.pxn or a[1] == b[1]):
            return 0
        if not self.nodes_per_pod or a[0] // self.nodes_per_pod == b[0] // self.nodes_per_pod:
            return 1
        return 2

    def network_share(self, index: int) -> float:
        return 1.0 / math.prod(self.oversubscription[:index])

    def shape_problems(self, nodes: int) -> list:
        out = _divides("nodes_per_group", self.nodes_per_group, self.nodes_per_pod or nodes, "a rail group",
                       "nodes of a pod" if self.nodes_per_pod else "nodes")
        if self.nodes_per_pod:
            out += _divides("nodes_per_pod", self.nodes_per_pod, nodes, "a pod", "nodes")
        return out + _ratio_problems(self.oversubscription, len(self.network_levels()) - 1)

    def domains(self, nodes: int) -> tuple | None:
        if not self.pxn:
            return None  # the level depends on the local devices, not only on the nodes
        sizes = (self.nodes_per_group, *((self.nodes_per_pod,) if self.nodes_per_pod else ()))
        return tuple(tuple(n // s for n in range(nodes)) for s in sizes)


@dataclass(frozen=True)
class Torus(Topology):
    """A torus of x × y × z nodes with wrap-around links (`wrap=False`: a mesh), node n at x = n % x, y = n // x % y,
    z = n // (x·y) (x fastest, as TPU device ids run). The levels are hop counts 1 .. diameter. Under dimension-
    order routing, when every node sends to the node displaced by the same (dx, dy, dz), each link of dimension d
    carries |d| flows, so a flow gets 1/max(dx, dy, dz) of a link (Dally & Towles, "Principles and Practices of
    Interconnection Networks": channel load, ch. 3; tori, ch. 5): `crossing` gives that per pair, `share(level)`
    the worst case of a level (all its hops in one dimension)."""

    x: int
    y: int = 1
    z: int = 1
    wrap: bool = True
    """Wrap-around links in every dimension (a torus); False: a mesh."""
    scale_up: int = 0
    """Devices in one scale-up domain; 0: a node's."""

    @property
    def dims(self) -> tuple:
        return (self.x, self.y, self.z)

    def coords(self, node: int) -> tuple:
        return (node % self.x, node // self.x % self.y, node // (self.x * self.y))

    def hops(self, a: int, b: int) -> tuple:
        out = []
        for ca, cb, n in zip(self.coords(a), self.coords(b), self.dims):
            d = abs(ca - cb)
            out.append(min(d, n - d) if self.wrap else d)
        return tuple(out)

    def network_levels(self) -> tuple:
        diameter = sum(n // 2 if self.wrap else n - 1 for n in self.dims)
        return tuple(f"{h} hop" if h == 1 else f"{h} hops" for h in range(1, max(diameter, 1) + 1))

    def network_level(self, a: tuple, b: tuple) -> int:
        return sum(self.hops(a[0], b[0])) - 1

    def network_share(self, index: int) -> float:
        return 1.0 / (index + 1)

    def crossing(self, rank_a: int, rank_b: int, devices_per_node: int, locate=locate) -> Crossing:
        c = super().crossing(rank_a, rank_b, devices_per_node, locate)
        a, b = locate(rank_a, devices_per_node)[0], locate(rank_b, devices_per_node)[0]
        h = self.hops(a, b)
        return Crossing(c.level, c.name, c.share if a == b else 1.0 / max(h), h)

    def slowest_crossing(self, steps, devices_per_node: int, locate=locate) -> Crossing | None:
        worst = None  # the share is the hops': every step's crossing compared
        for a, b in steps:
            c = self.crossing(a, b, devices_per_node, locate)
            if worst is None or (c.level, -c.share) > (worst.level, -worst.share):
                worst = c
        return worst

    def shape_problems(self, nodes: int) -> list:
        out = [Problem(name, f"a torus dimension of {n}", "every dimension has at least one node")
               for name, n in zip("xyz", self.dims) if n < 1]
        if not out and math.prod(self.dims) != nodes:
            out.append(Problem("torus", f"{self.x} × {self.y} × {self.z} = {math.prod(self.dims)} nodes, but the "
                               f"cluster has {nodes}", f"give dimensions whose product is {nodes}"))
        return out

    def node_orders(self, nodes: int) -> tuple:
        """The identity and a snake (boustrophedon) over each order of the dimensions: consecutive nodes one hop
        apart, and with an even dimension the last one hop from the first (a Hamiltonian ring on the torus)."""
        out = [tuple(range(nodes))]
        for perm in itertools.permutations(range(3)):
            order = tuple(self._node(c, perm) for c in snake([self.dims[d] for d in perm]))
            if order not in out:
                out.append(order)
        return tuple(out)

    def _node(self, c: tuple, perm: tuple) -> int:
        xyz = [0, 0, 0]
        for d, v in zip(perm, c):
            xyz[d] = v
        return xyz[0] + self.x * (xyz[1] + self.y * xyz[2])


def snake(sizes: list) -> list:
    """Coordinates of a box in boustrophedon order (a reflected mixed-radix Gray code): the first dimension
    fastest, each step of a dimension reversing the order of those inside it, so consecutive coordinates differ
    by one along one dimension."""
    if len(sizes) == 1:
        return [(i,) for i in range(sizes[0])]
    inner = snake(sizes[:-1])
    out = []
    for k in range(sizes[-1]):
        out += [(*c, k) for c in (inner if k % 2 == 0 else inner[::-1])]
    return out


@dataclass(frozen=True)
class Dragonfly(Topology):
    """A dragonfly (Kim, Dally, Scott, Abts, "Technology-Driven, Highly-Scalable Dragonfly Topology", ISCA 2008;
    HPE Slingshot on Frontier): `groups` groups of `nodes_per_group` nodes, all-to-all local links inside a group
    (with `nodes_per_switch`, also a switch level below it), and global links between groups, a group's injection
    bandwidth over its global bandwidth being `global_oversubscription`. Modelled under minimal routing and traffic
    spread over all groups; a ring whose neighbours sit in two fixed groups uses only the few links between them,
    which adaptive (Valiant) routing spreads at up to twice the hops: not modelled."""

    groups: int
    nodes_per_group: int
    nodes_per_switch: int = 0
    """Nodes on one switch of a group; 0: the group's switches not modelled apart."""
    global_oversubscription: float = 1.0
    """A group's injection bandwidth over its global links' (≥ 1)."""
    scale_up: int = 0
    """Devices in one NVLink domain; 0: a node's."""

    def network_levels(self) -> tuple:
        return ("switch", "group", "global") if self.nodes_per_switch else ("group", "global")

    def network_level(self, a: tuple, b: tuple) -> int:
        top = len(self.network_levels()) - 1
        if a[0] // self.nodes_per_group != b[0] // self.nodes_per_group:
            return top
        sw = self.nodes_per_switch
        return 0 if sw and a[0] // sw == b[0] // sw else top - 1

    def network_share(self, index: int) -> float:
        return 1.0 / self.global_oversubscription if index == len(self.network_levels()) - 1 else 1.0

    def shape_problems(self, nodes: int) -> list:
        out = []
        if self.groups < 1 or self.nodes_per_group < 1 or self.groups * self.nodes_per_group != nodes:
            out.append(Problem("groups", f"{self.groups} groups of {self.nodes_per_group} nodes are not the "
                               f"cluster's {nodes} nodes",
                               f"give groups × nodes_per_group = {nodes}"))
        if self.nodes_per_switch:
            out += _divides("nodes_per_switch", self.nodes_per_switch, max(self.nodes_per_group, 0), "a switch",
                            "nodes of a group")
        return out + _ratio_problems((self.global_oversubscription,), 1, "global_oversubscription")

    def domains(self, nodes: int) -> tuple | None:
        sizes = (*((self.nodes_per_switch,) if self.nodes_per_switch else ()), self.nodes_per_group)
        return tuple(tuple(n // s for n in range(nodes)) for s in sizes)


@dataclass(frozen=True)
class SwitchTree(Topology):
    """A tree of named switches, as Slurm's topology/tree plugin describes it: node i is `hosts[i]`, `chains[i]`
    its switches from its leaf up to the root. Two nodes' traffic crosses the level of the lowest switch they share
    (a short chain, a node hung higher up, counts its root at every level above it). `oversubscription`: down:up
    per uplink level, a single number the top uplink's (Slurm's file says nothing of bandwidth)."""

    hosts: tuple
    chains: tuple
    oversubscription: object = 1.0
    scale_up: int = 0

    def __post_init__(self):
        object.__setattr__(self, "oversubscription", _ratios(self.oversubscription, self.depth - 1))

    @property
    def depth(self) -> int:
        return max((len(c) for c in self.chains), default=1)

    def _padded(self, node: int) -> tuple:
        chain = self.chains[node]
        return chain + (chain[-1],) * (self.depth - len(chain))

    def network_levels(self) -> tuple:
        middle = ("spine",) if self.depth == 3 else tuple(f"level {k}" for k in range(2, self.depth))
        return ("leaf", *middle, "top") if self.depth > 1 else ("leaf",)

    def network_level(self, a: tuple, b: tuple) -> int:
        pa, pb = self._padded(a[0]), self._padded(b[0])
        return next((k for k in range(self.depth) if pa[k] == pb[k]), self.depth - 1)

    def network_share(self, index: int) -> float:
        return 1.0 / math.prod(self.oversubscription[:index])

    def shape_problems(self, nodes: int) -> list:
        out = []
        if len(self.hosts) != nodes:
            out.append(Problem("topology", f"the switch tree holds {len(self.hosts)} nodes, the cluster {nodes}",
                               f"set nodes = {len(self.hosts)} or describe the cluster's {nodes} nodes"))
        roots = sorted({c[-1] for c in self.chains})
        if len(roots) > 1:
            out.append(Problem("topology", f"the switches form {len(roots)} trees ({', '.join(roots[:4])}) with no "
                               "switch joining them", "add a switch whose Switches= lists every root"))
        return out + _ratio_problems(self.oversubscription, self.depth - 1)

    def domains(self, nodes: int) -> tuple | None:
        out = []
        for k in range(self.depth - 1):
            ids: dict = {}
            out.append(tuple(ids.setdefault(self._padded(n)[k], len(ids)) for n in range(nodes)))
        return tuple(out)


class SlurmError(ValueError):
    """A topology.conf that does not describe a tree: every problem found, each located by its line."""

    def __init__(self, problems: tuple):
        super().__init__("; ".join(f"{p.field}: {p.message}" for p in problems))
        self.problems = problems


def expand_hostlist(text: str) -> list:
    """Slurm's hostlist expression: `node[001-003,7],gpu5` -> node001 node002 node003 node7 gpu5 (a range keeps the
    width of its lower bound; several bracket groups in a name make every combination)."""
    out = []
    for item in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", text.strip()):
        parts = re.split(r"(\[[^\]]*\])", item)
        choices = []
        for part in parts:
            if not part.startswith("["):
                choices.append([part])
                continue
            values = []
            for rng in part[1:-1].split(","):
                lo, _, hi = rng.partition("-")
                if not lo.isdigit() or (hi and not hi.isdigit()):
                    raise ValueError(f"`{rng}` in `{item}` is not a number or a range of numbers")
                values += [str(i).zfill(len(lo)) for i in range(int(lo), int(hi or lo) + 1)]
            choices.append(values)
        out += ["".join(c) for c in itertools.product(*choices)]
    return out


def parse_slurm(text: str, oversubscription=1.0, scale_up: int = 0) -> SwitchTree:
    """A Slurm `topology.conf` (topology/tree: `SwitchName=s0 Nodes=node[01-16]`, `SwitchName=top Switches=s[0-3]`;
    other keys such as LinkSpeed are read past) as a SwitchTree whose node order is the hosts' order in the file.
    Raises SlurmError listing every problem, each field naming the line."""
    leaves, parents, problems, seen = [], {}, [], set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        keys = dict((k.lower(), v) for k, _, v in (t.partition("=") for t in line.split()))
        where = f"line {number}"
        name = keys.get("switchname")
        if not name:
            problems.append(Problem(where, f"`{line}` names no switch", "start the line with SwitchName=..."))
            continue
        if name in seen:
            problems.append(Problem(where, f"switch {name} is described twice", "describe each switch once"))
        seen.add(name)
        try:
            if "nodes" in keys:
                leaves.append((name, expand_hostlist(keys["nodes"]), where))
            for child in expand_hostlist(keys.get("switches", "")):
                if child in parents:
                    problems.append(Problem(where, f"switch {child} has two parents ({parents[child][0]} and "
                                            f"{name})", "a tree gives each switch one parent"))
                parents[child] = (name, where)
        except ValueError as e:
            problems.append(Problem(where, str(e), "write ranges as prefix[001-016,020]"))
    hosts, chains = [], []
    for leaf, names, where in leaves:
        chain = _chain(leaf, parents, where, problems)
        for host in names:
            if host in hosts:
                problems.append(Problem(where, f"node {host} hangs off two switches", "list each node once"))
            hosts.append(host)
            chains.append(chain)
    problems += [Problem(w, f"switch {c} is listed under {p} but never described", f"add SwitchName={c}")
                 for c, (p, w) in parents.items() if c not in seen]
    if not hosts:
        problems.append(Problem("topology", "no switch lists any node", "give the leaves Nodes=..."))
    if problems:
        raise SlurmError(tuple(problems))
    return SwitchTree(tuple(hosts), tuple(chains), oversubscription, scale_up)


def _chain(leaf: str, parents: dict, where: str, problems: list) -> tuple:
    chain = [leaf]
    while chain[-1] in parents:
        up = parents[chain[-1]][0]
        if up in chain:
            problems.append(Problem(where, f"switches {' -> '.join(chain + [up])} form a loop",
                                    "a tree has no loops"))
            break
        chain.append(up)
    return tuple(chain)
