"""Each process group's link, and what a collective costs on it: the step-time model's communication part.

A group's link is the tier the Cluster says it crosses (compiler/layout/cluster.py `Cluster.tier` of a group of
compiler/layout/groups.py: inside a node at the device's figure × its intra-node efficiency, across nodes at the
inter-node figure); a collective on it is costed with an alpha-beta model of its algorithm (`collective_s`).

Where the mesh section describes the network (a `topology` or a `fabric`), each link of a group that leaves its node
carries its group's span instead (compiler/cost/network.py `GroupSpan`: the slowest level its rings cross,
oversubscription included, on the mesh's own rank order) and a collective is priced as NCCL's fastest algorithm
there (`network.price`: ring, tree, NVLS); a group inside a node, and a file that describes neither, are priced as
before. Every group of one name runs its collective at the same moment (every dp group's gradients, every pp
boundary's sends), so they are priced together: each at the share of its NIC the others' flows leave it on the
uplinks they cross (compiler/layout/contention.py says what is taken to overlap), once per mesh, rank map and
cluster (`_LINKS`), never per candidate.

Where the mesh also writes a `placement`, each group's rows are mapped through its rank map first
(compiler/layout/rank_order.py `resolve`; auto reads the step's bytes per group, `traffic`), so a group is priced
on the ranks it runs on; without a described network a placement changes no price (the two tiers see only nodes).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from compiler.cost import network as NET
from compiler.layout import cluster as CL
from compiler.layout import groups as G
from compiler.layout import placement as P
from compiler.layout import rank_order as RO


# -- the device and its links -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    """How the group of one mesh axis sits on the hardware."""

    axis: str
    size: int
    crosses_nodes: bool
    gbps: float          # per-device bandwidth, one direction
    latency_us: float    # per algorithm step
    network: tuple | None = field(default=None, compare=False)
    """(GroupSpan, device, fabric) where the cluster describes its network: collective_s prices by network.price."""
    tier: str = ""
    """The level the group's traffic crosses, where the cluster describes its network (GroupSpan.tier)."""

    def describe(self) -> str:
        if self.network is not None:  # priced on the described network: the level its rings cross, NCCL's busbw
            span = self.network[0]
            shared = f"; its slowest uplink shared by {span.sharing} groups" if span.sharing > 1 else ""
            return (f"{self.axis} {self.size}: crosses the {self.tier} level ({self.gbps:.3g} GB/s bus "
                    f"bandwidth{shared})")
        where = "crosses nodes" if self.crosses_nodes else "inside a node"
        return f"{self.axis} {self.size}: {where} ({self.gbps:g} GB/s per device)"


def links(plan, cluster, ledger=None) -> dict:
    """The link each of the plan's process groups uses on `cluster` (compiler/layout/cluster.py), by the group's
    name (compiler/layout/groups.py: every axis and the folded groups "dp×ep", "dp×cp", "dp×cp×ep", "batch", ...),
    at the bandwidth and latency of the tier the Cluster says it crosses (`Cluster.tier`: inside a node the
    device's figure × its `intra_node_efficiency`, between nodes the figure as given). A plan whose axes do not
    multiply to the cluster's devices is refused (ValueError). `ledger` (() -> cost.Ledger): the step's
    collectives, which `placement = auto` places by on a described topology (without it, auto keeps the mesh's
    order)."""
    return dict(_kept_links(tuple(plan.axes), cluster, rank_map(plan, cluster, ledger),
                            tuple(getattr(plan, "ep_nodes", ()))))


def _kept_links(axes: tuple, cluster, placed, ep_nodes: tuple = ()) -> dict:
    """`_links`, kept per mesh, placement, ep split by node and cluster (not to be changed: `links` hands out
    copies)."""
    key = (axes, placed.ranks if placed is not None else None, id(cluster), ep_nodes)
    got = _LINKS.get(key)
    if got is None or got[0] is not cluster:  # the cluster kept: its id is not reused
        got = _LINKS[key] = (cluster, _links(axes, cluster, placed, ep_nodes))
    return got[1]


def described(cluster) -> bool:
    """Whether the mesh describes its network (a topology or a fabric)."""
    return getattr(cluster, "topology", None) is not None or getattr(cluster, "fabric", None) is not None


def rank_map(plan, cluster, ledger=None):
    """The RankMap the plan's groups are priced on: its written placement resolved (`resolved`) where the mesh
    describes its network, else None (the mesh's own order). A placement that names axes the plan's mesh lacks (a
    searched mesh) is priced on the mesh's own order."""
    written = getattr(plan, "placement", None)
    if written is None or not described(cluster):
        return None
    if written != "auto" and P.order_problems(tuple(plan.axes), tuple(written)):
        return None
    return resolved(plan, cluster, ledger() if ledger is not None else None).rank_map


def resolved(plan, cluster, ledger=None):
    """The plan's written placement resolved (compiler/layout/rank_order.py `Resolved`), whatever the network
    says: what codegen writes into Parallel.placement and the plan output shows; None where none is written. auto
    reads `ledger` (cost.Ledger: the step's collectives; without it, auto keeps the mesh's order)."""
    written = getattr(plan, "placement", None)
    if written is None:
        return None
    axes = tuple(plan.axes)
    flows = traffic(plan, ledger) if ledger is not None and written == "auto" else {}
    calls = tuple(sorted((c.op, c.axis, c.times, c.bytes) for c in ledger.entries if c.bytes)) if flows else ()
    key = (axes, written, id(cluster), calls)
    got = _PLACED.get(key)
    if got is None or got[0] is not cluster:  # auto takes seconds on a large mesh: once per mesh and traffic
        got = _PLACED[key] = (cluster, RO.resolve(written, axes, cluster, lambda: flows,
                                                  lambda placed: collectives_s(axes, cluster, placed, calls)))
    return got[1]


def collectives_s(axes: tuple, cluster, placed, calls) -> float:
    """The time of one step's collectives `calls` ((op, group, times, bytes per step), the ledger's) on `cluster`
    with the mesh's coordinates on the ranks of `placed` (a RankMap; None: the mesh's own order), each priced on its
    group's link (`collective_s`), one after another: what auto breaks ties by."""
    on = _kept_links(axes, cluster, placed)
    return sum(times * collective_s(op, nbytes / times, on[group]) for op, group, times, nbytes in calls
               if group in on)


_PLACED: dict = {}
"""(axes, placement, id(cluster), the ledger's collectives) -> (cluster, its rank_order.Resolved)."""


def traffic(plan, ledger) -> dict:
    """The bytes each rank sends per step over each group (axis, or tuple of axes for a folded group): the ledger's
    collectives as rings (an all-reduce sends 2(n-1)/n of its tensor, the others (n-1)/n, a send its tensor)."""
    layout = G.groups(tuple(plan.axes))
    out: dict = {}
    for c in ledger.entries:
        if c.axis not in layout:
            continue
        g = layout[c.axis]
        n = g.size
        if n <= 1:
            continue
        factor = 1.0 if c.op == "send_recv" else (2 * (n - 1) / n if c.op == "all_reduce" else (n - 1) / n)
        key = g.axes[0] if len(g.axes) == 1 else g.axes
        out[key] = out.get(key, 0.0) + float(c.bytes) * factor
    return out


_LINKS: dict = {}
"""(axes, id(cluster)) -> (cluster, its links): a search asks for the same few meshes' links tens of thousands of
times, and a cluster's device figures are too many to hash on each call."""


def _links(axes: tuple, cluster: CL.Cluster, placed=None, ep_nodes: tuple = ()) -> dict:
    """`links`, once per mesh, placement and cluster; with `ep_nodes` (Plan.ep_nodes) the ep_rail and ep_node
    groups too (compiler/layout/groups.py), the rail across nodes, the node's inside one."""
    world = math.prod(n for _, n in axes)
    if world != cluster.world_size:
        raise ValueError(f"plan axes {axes} hold {world} devices, the cluster {cluster.world_size} "
                         f"({cluster.nodes} × {cluster.devices_per_node})")
    out, groups = {}, G.groups(axes, ep_nodes)
    # every group's rank lists, only where they are read (a search asks for the links of hundreds of meshes of
    # thousands of ranks: listing them all was a third of its time): placed, each group's; on the mesh's own order,
    # only those priced on the network, and only where no mesh before had the same rows (`_worst`)
    rows = None
    if placed is not None:
        listed: dict = {}  # by pattern: dp, data, batch and dense are often the same ranks
        rows = {g.name: listed[g.pattern] if g.pattern in listed else listed.setdefault(
            g.pattern, placed.apply(g.rows())) for g in groups}
    per_node = cluster.devices_per_node
    for g in groups:
        if placed is None:
            crosses, tier = cluster.crosses(g), cluster.tier(g)
        else:  # a group crosses nodes where some row of its placed ranks does
            crosses = g.size > 1 and any(len({r // per_node for r in row}) > 1 for row in rows[g.name])
            tier = cluster.tiers["inter_node" if crosses else "intra_node"]
        out[g.name] = Link(g.name, g.size, crosses, tier.gbps, tier.latency_us)
    if described(cluster):
        priced: dict = {}  # placed: by pattern, the same groups priced once (their contention too)
        out = {name: _on_network(link, groups[name], cluster, priced, None if rows is None else rows[name])
               for name, link in out.items()}
    return out


def _on_network(link: Link, group, cluster, priced: dict, rows) -> Link:
    """`link` priced on the described network: the span of its slowest group (network.price_on), its tier and its
    effective bandwidth for the plan's words. A group inside one node keeps the two tiers' link: inside a node the
    step-time model's figures are fitted to published step times (devices.py `intra_node_efficiency`), which
    network.py's nccl-tests fractions are not; a group that leaves its node, over the network or over NVLink to
    another node of a scale-up domain, is priced on the network."""
    if link.size <= 1 or not link.crosses_nodes:
        return link
    # the slowest of its groups at a 1 GiB all-reduce: the large-message regime the step's big collectives are in
    if rows is None:  # the mesh's own order: kept across meshes, by the rows' canonical pattern
        worst = _worst(cluster, group.pattern, group.world)
    else:
        worst = priced.get(group.pattern)
        if worst is None:
            worst = priced[group.pattern] = NET.price_on(cluster, "all_reduce", 2 ** 30, rows)
    best = min(worst.algorithms, key=lambda a: a.seconds)
    return Link(link.axis, link.size, worst.group.crosses, best.busbw_gbps, link.latency_us,
                network=(worst.group, cluster.device, getattr(cluster, "fabric", None)), tier=worst.group.tier)


_WORST: dict = {}
"""(id(cluster), world, canonical pattern) -> (cluster, network.price_on of the pattern's rows): the groups of one
pattern priced together once per cluster, whichever mesh they are a group of (Llama 3 405B's search prices 281
meshes of 16,384 ranks, most of whose groups' rows an earlier mesh had)."""


def _worst(cluster, pattern: tuple, world: int):
    """network.price_on of every group of the stride `pattern` over `world` ranks on the mesh's own order (all of
    them at once), kept in `_WORST`."""
    key = (id(cluster), world, G.canonical(pattern))
    got = _WORST.get(key)
    if got is None or got[0] is not cluster:  # the cluster kept: its id is not reused
        if len(_WORST) > 4096:  # a process planning many clusters (the tests): keep the recent ones
            _WORST.clear()
        got = _WORST[key] = (cluster, NET.price_on(cluster, "all_reduce", 2 ** 30, G.expand(key[2], world)))
    return got[1]


def collective_s(op: str, nbytes: float, link: Link) -> float:
    """Seconds one collective of `nbytes` (the full tensor, as the ledger counts it) takes on `link`: `collective`'s
    time."""
    return collective(op, nbytes, link)[0]


def collective(op: str, nbytes: float, link: Link) -> tuple:
    """(seconds, algorithm) of one collective of `nbytes` (the full tensor, as the ledger counts it) on `link`.

    On a described network (`link.network`), NCCL's fastest algorithm there (network.price: ring, tree, nvls, p2p).
    Otherwise ring algorithms (Patarasuk & Yuan 2009; NCCL): an all-reduce is a reduce-scatter then an all-gather,
    2(n-1) steps moving 2(n-1)/n of the tensor; all-gather and reduce-scatter (n-1) steps moving (n-1)/n; across
    nodes NCCL switches to a tree for latency, 2·log2(n) steps moving about 2× the tensor: the faster of the two is
    taken. An all-to-all is point-to-point ("p2p": each rank sends (n-1)/n of its tensor in n-1 steps). A broadcast
    is pipelined down a chain (the tensor once plus log2(n) latencies); a point-to-point send is one step."""
    n = link.size
    if n <= 1 or nbytes <= 0:
        return 0.0, "none"
    if link.network is not None and op in NET.OPS:
        span, device, fabric = link.network
        p = NET.price(op, nbytes, span, device, fabric)
        return min(a.seconds for a in p.algorithms), p.chosen
    beta = 1.0 / (link.gbps * 1e9)
    alpha = link.latency_us * 1e-6
    if op == "all_reduce":
        ring = 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes * beta
        tree = 2 * math.log2(n) * alpha + 2 * nbytes * beta
        return (tree, "tree") if link.crosses_nodes and tree < ring else (ring, "ring")
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) * alpha + (n - 1) / n * nbytes * beta, "ring"
    if op == "all_to_all":
        return (n - 1) * alpha + (n - 1) / n * nbytes * beta, "p2p"
    if op == "broadcast":
        return math.log2(n) * alpha + nbytes * beta, "chain"
    if op == "send_recv":
        return alpha + nbytes * beta, "p2p"
    raise ValueError(f"no cost rule for collective {op}")


# -- one ledger collective on its link -----------------------------------------------------------------------------


def tier_name(link: Link) -> str:
    """The tier a group's traffic crosses: on a described network the slowest level its rings cross (a topology's
    `scale_up`, `leaf`, `spine`, `top`, ..., or `inter_node` with a fabric and no topology), otherwise, and for a
    group inside one node, `intra_node` or `inter_node` (the Cluster's two tiers)."""
    if link.network is not None:
        return link.tier
    return "inter_node" if link.crosses_nodes else "intra_node"


@dataclass(frozen=True)
class Priced:
    """One ledger collective (all its calls in one step) on its group's link, as the step-time model charges it."""

    tier: str            # tier_name of the link
    algorithm: str       # `collective`'s: ring, tree, nvls, p2p, chain
    seconds: float       # its calls' time together: times × one call's
    busbw_gbps: float    # nccl-tests' bus bandwidth of one call: algbw (its bytes / its time) × the op's factor


def priced(c, link: Link) -> Priced:
    """What the ledger's collective `c` (cost.Collective: `bytes` per step over `times` calls) costs on `link`:
    each call `collective`'s time for its share of the bytes, as step_time.py charges it (a call inside a piece per
    micro-batch; the once-a-step collectives the same, step_tail.py `data_parallel_exposed`). Ring attention's
    sends over cp are charged there only for what its compute does not hide (op_times.ring_exposed): here, their
    transfer time."""
    calls = max(c.times, 1)
    one, algorithm = collective(c.op, c.bytes / calls, link)
    factor = 1.0 if c.op == "broadcast" or link.size <= 1 else NET.bus_factor(c.op, link.size)
    busbw = c.bytes / calls / one * factor / 1e9 if one > 0 else 0.0
    return Priced(tier_name(link), algorithm, one * calls, busbw)
