"""Every process group a program uses, by name: its axes, its size and its ranks (a stride pattern).

The mesh's axes are listed outermost first and the innermost varies fastest over the ranks (rank = the row-major
index of its coordinates; runtime/mesh.py's DeviceMesh has the same shape), so the ranks that differ from a rank
only along some axes are `base + Σ iₐ·strideₐ`, strideₐ the product of the sizes inside axis a. A group is that
stride pattern; `rows` expands it to every such group's ranks, ordered along its axes (the first outermost).

The groups, by name:
    dp, pp, tp, ep, cp   each axis of the mesh
    dp×ep                the dense gradients' group under ep (the cost model's ledger names it)
    dp×cp                the ranks the ZeRO stages shard a rank's state over when dp > 1 (cost.zero_ranks; dp's
                         group without cp); the dense gradients' group under cp; the experts' replicas under cp
                         and ep
    dp×cp×ep             the dense gradients' group under cp and ep
                         (each of these three exists when the mesh has its axes: FOLDED)
    data                 the ranks whole sequences are split over: dp and ep (Plan.batch_ranks; runtime.mesh's
                         data_ranks)
    batch                the ranks the step's tokens are split over: dp, ep and cp of size > 1, in mesh order. The
                         dense gradients and the loss are averaged over it (runtime.mesh's batch_group)
    dense                FSDP's and the ZeRO stages' mesh for the dense weights when dp > 1: the batch group
                         (torchtitan's folding: the dense weights are replicated over every batch shard and every
                         cp rank, so they shard over all of them)
    experts              the ranks that hold the same experts when cp splits the batch beside dp under ep: dp and
                         cp of size > 1 (runtime.mesh's expert_mesh and expert_group)
    ep_rail, ep_node     where experts are dispatched by node (Plan.ep_nodes, `ep_split`): the ep ranks of one
                         local index, one per node, and the ep ranks of one node (runtime/moe_nodes.py)
The groups are the axes' alone: which link tier a group's collectives cross is asked of the machines
(compiler/layout/cluster.py `Cluster.tier(group)`). The cost model reads the axes and the three after them (their
sizes, and their tiers on the Cluster: compiler/cost/links.py `links`), the Plan the data and batch groups' sizes
(batch_ranks, grad_ranks); the runtime builds the axes and the last three, exactly as listed (`contract`,
written into runtime.config.Parallel.groups as stride patterns).

Torch-free; a search costs hundreds of thousands of candidate plans, so a mesh's groups are computed once
(`groups` is cached) and the ranks only when asked for (`Group.rows`).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from runtime import choices  # torch-free: the names the compiler shares with the runtime

FOLDED = (("dp×ep", ("dp", "ep"), ("dp", "ep")),
          ("dp×cp", ("dp", "cp"), ("dp", "cp")),
          ("dp×cp×ep", ("dp", "cp", "ep"), ("cp", "ep")))
"""(name, the axes it folds, the axes the mesh must have for it to exist): each folds those of its axes the mesh
has (of any size, so an axis of size 1 still widens its span: cluster.crosses), in mesh order. A mesh without dp has no
"dp×ep": the cost model then costs no collective over it (moe_1t's dense all-reduce over ep is uncosted today)."""
RUNTIME = choices.GROUPS
"""The folded groups the runtime builds beside the axes (runtime.mesh.Context's batch_group, dense_mesh,
expert_mesh)."""


@dataclass(frozen=True)
class Group:
    """One named process group: the ranks that differ from each other only along `axes`."""

    name: str
    axes: tuple
    """The mesh axes it folds, in mesh order (outermost first)."""
    pattern: tuple
    """((stride, size), ...) per axis of `axes`: a member's ranks are base + Σ i·stride, 0 ≤ i < size."""
    world: int

    @functools.cached_property
    def size(self) -> int:  # kept: a search asks a mesh's groups' sizes some 150,000 times (Plan.batch_ranks)
        return math.prod(n for _, n in self.pattern)

    def offsets(self) -> tuple:
        """The ranks of the group holding rank 0, ordered along the axes (the first outermost)."""
        out = [0]
        for stride, n in self.pattern:
            out = [o + i * stride for o in out for i in range(n)]
        return tuple(out)

    def rows(self) -> tuple:
        """Every group of this pattern: a tuple of rank tuples, each ordered along the axes, the groups ordered by
        their first rank."""
        offsets = self.offsets()
        bases = [r for r in range(self.world) if not _covered(r, self.pattern)]
        return tuple(tuple(b + o for o in offsets) for b in bases)

    def row_of(self, rank: int) -> tuple:
        """The ranks of the group that holds `rank`."""
        base = rank
        for stride, n in self.pattern:
            base -= ((rank // stride) % n) * stride
        return tuple(base + o for o in self.offsets())


def _covered(rank: int, pattern: tuple) -> bool:
    """Whether `rank` has a non-zero coordinate along some axis of `pattern` (so it is not a group's first rank)."""
    return any((rank // stride) % n for stride, n in pattern)


@dataclass(frozen=True)
class Groups:
    """The groups of one mesh, by name."""

    axes: tuple
    """((axis, size), ...) outermost first."""
    by_name: dict

    def __getitem__(self, name: str) -> Group:
        return self.by_name[name]

    def __contains__(self, name: str) -> bool:
        return name in self.by_name

    def __iter__(self):
        return iter(self.by_name.values())

    def size(self, name: str) -> int:
        """The group's size; 1 for a group this mesh does not have."""
        g = self.by_name.get(name)
        return g.size if g is not None else 1

    def contract(self) -> tuple:
        """What the runtime builds (runtime.config.Parallel.groups): ((name, pattern), ...), the axes' groups in mesh
        order (every axis, as the DeviceMesh has them), then batch, dense, experts, ep_rail and ep_node where they
        hold more than one rank (ep_rail also where it is ep's own, as batch may be dp's). Stride patterns, not rank
        lists: a program does not grow with the world size (a 1,536-rank mesh would list 7,680 ranks);
        runtime.mesh.expand gives the same rows as `Group.rows`."""
        folded = tuple(n for n in RUNTIME if n in self.by_name and (self.by_name[n].size > 1 or
                                                                    n == choices.EP_NODE_GROUPS[0]))
        return tuple((n, self.by_name[n].pattern) for n in (*(a for a, _ in self.axes), *folded))


def ep_split(axes: tuple, per_node: int) -> tuple:
    """(nodes, local) where each ep group of the mesh `axes` spans `nodes` nodes of `per_node` consecutive ranks with
    `local` ranks on each, its ranks on one node consecutive along ep (ep rank = node · local + local index), so that
    a token can cross to each node once (runtime/moe_nodes.py); () where ep has one rank, lies inside one node, or
    its ranks do not cut into whole nodes that way. With ep's stride s (the ranks inside it): s ≥ per_node puts each
    ep rank on its own node (local 1, when per_node divides s); otherwise per_node / s of them share one."""
    sizes = dict(axes)
    n = sizes.get("ep", 1)
    if n <= 1:
        return ()
    stride = math.prod(m for a, m in axes[[a for a, _ in axes].index("ep") + 1:])
    if stride >= per_node:
        return (n, 1) if stride % per_node == 0 else ()
    if per_node % stride:
        return ()
    local = per_node // stride
    if n <= local or n % local:
        return ()
    return (n // local, local)


@functools.lru_cache(maxsize=4096)
def groups(axes: tuple, ep_nodes: tuple = ()) -> Groups:
    """Every group of the mesh `axes` ((axis, size), ... outermost first); with `ep_nodes` ((nodes, local): `ep_split`,
    where the plan dispatches experts by node) ep_rail and ep_node too."""
    strides, inner = {}, 1
    for axis, n in reversed(axes):
        strides[axis] = inner
        inner *= n
    world = inner
    sizes = dict(axes)
    order = [a for a, _ in axes]

    def group(name, folded):
        ax = tuple(a for a in order if a in folded)
        pattern = tuple((strides[a], sizes[a]) for a in ax)
        return Group(name, ax, pattern, world)

    out = {a: group(a, (a,)) for a in order}
    for name, folded, needs in FOLDED:
        if all(a in sizes for a in needs):
            out[name] = group(name, folded)
    over = tuple(a for a in ("dp", "ep", "cp") if sizes.get(a, 1) > 1)
    out["data"] = group("data", tuple(a for a in over if a != "cp"))
    out["batch"] = group("batch", over)
    if sizes.get("dp", 1) > 1:
        out["dense"] = group("dense", over)
    if sizes.get("ep", 1) > 1 and sizes.get("cp", 1) > 1:
        out["experts"] = group("experts", tuple(a for a in ("dp", "cp") if sizes.get(a, 1) > 1))
    if ep_nodes:
        nodes, local = ep_nodes
        s, _ = out["ep"].pattern[0]
        rail, node = choices.EP_NODE_GROUPS
        out[rail] = Group(rail, ("ep",), ((s * local, nodes),), world)
        out[node] = Group(node, ("ep",), ((s, local),), world)
    return Groups(tuple(axes), out)


def canonical(pattern: tuple) -> tuple:
    """The shortest stride pattern with the same rows, in the same order (`expand`): axes of one rank dropped, and
    an axis whose stride is the extent of the axis inside it merged with it (((s·n, m), (s, n)) is ((s, m·n)): i·s·n
    + j·s = (i·n + j)·s). Meshes of different shapes share many groups' ranks this way (dp 1,024 over cp 8 and over
    cp 4 × tp 2: the same dp rows), so what is priced of a group's rows is kept per this."""
    out: list = []
    for stride, n in reversed(pattern):
        if n <= 1:
            continue
        if out and out[-1][0] * out[-1][1] == stride:
            out[-1] = (out[-1][0], out[-1][1] * n)
        else:
            out.append((stride, n))
    return tuple(reversed(out))


def expand(pattern: tuple, world: int) -> tuple:
    """The rows of a stride pattern over `world` ranks (Group.rows without a name)."""
    return Group("", (), tuple(pattern), world).rows()

