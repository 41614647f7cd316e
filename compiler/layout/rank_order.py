"""The mesh's `placement` resolved to the rank of every mesh coordinate (compiler/layout/placement.py `RankMap`):
what codegen writes into runtime.config.Parallel.placement (as its `generator`) and what compiler/cost/links.py
prices each group on.

    not written       None: the mesh's own order (coordinate i on rank i); nothing is written, nothing changes.
    order(tp, ...)    placement.order: an axis order, innermost first.
    auto              placement.auto on the Cluster's topology with the step's bytes per group (`traffic`, from the
                      ledger: compiler/cost/links.py `traffic`); with no topology written, the mesh's own order.

Only placements whose every axis row is in increasing rank order are written. torch orders a process group's
members by global rank whatever order it is given (torch 2.13 distributed_c10d.py: `new_group` sorts its ranks,
`split_group` too; DeviceMesh builds each axis's groups with them, device_mesh.py `_init_one_process_group`),
while the DeviceMesh reads a rank's coordinate from its place in the rank tensor: where an axis row runs out of
increasing order, its collectives would assemble the shards out of the mesh's order (runtime/mesh.py `planned`
gives the source lines). An axis order always keeps its rows increasing (rank = Σ coordinate × stride, strides
positive); auto's snakes, its node relocations and its rank-level re-cuts need not. Nor is every placement
written as its generator, the contract's form (`generator`: per axis, factors and their strides; the program does
not list 16,384 ranks). So auto chooses among the placements that are both (`buildable`; every axis order laid out
plainly is one of its candidates), and the resolution says so where its best was not. Torch-free; imports nothing
of compiler.cost.
"""
from __future__ import annotations

from dataclasses import dataclass

from compiler.layout import placement as P


@dataclass(frozen=True)
class Resolved:
    """A written placement resolved: the rank map, the axis order it is (innermost first; None where it is not one
    laid out plainly) and what the plan says of it."""

    rank_map: P.RankMap
    order: tuple | None
    note: str

    def named(self) -> str:
        """`order(...)` where the map is an axis order laid out plainly, else `a rank map`."""
        return f"order({', '.join(self.order)})" if self.order is not None else "a rank map"

    def describe(self) -> str:
        return f"{self.named()}{': ' + self.note if self.note else ''}"


def in_order(rank_map: P.RankMap) -> bool:
    """Whether every axis's rows are in increasing rank order (what a process group's own order is)."""
    return all(list(row) == sorted(row) for a, n in rank_map.axes if n > 1 for row in rank_map.rows(a))


def buildable(rank_map: P.RankMap) -> bool:
    """Whether the program can build the rank map: every axis's rows in increasing rank order (`in_order`) and
    the map written as its generator (`generator`: the contract holds that, not every rank)."""
    return in_order(rank_map) and generator(rank_map) is not None


def _mesh_order(axes: tuple) -> tuple:
    return tuple(a for a, _ in reversed(axes))


def resolve(placement, axes: tuple, cluster, traffic=None, seconds=None) -> Resolved | None:
    """The rank map of `placement` (Plan.placement: None, "auto" or a tuple of axis names) on the mesh `axes` and
    `cluster` (compiler/layout/cluster.py); `traffic`: () -> {axis or tuple of axes: bytes each rank sends per
    step}, read only by auto on a described topology; `seconds`: RankMap -> the time of the groups' collectives
    under it (the step-time model's, compiler/cost/links.py), auto's tie-break among placements with the same bytes
    over the slowest level. None where no placement is written."""
    axes = tuple(axes)
    if placement is None:
        return None
    if placement != "auto":
        return Resolved(P.order(axes, placement), tuple(placement), "")
    topology = getattr(cluster, "topology", None)
    if topology is None:
        return Resolved(P.RankMap.identity(axes), _mesh_order(axes),
                        "auto keeps the mesh's order: the mesh describes no topology")
    flows = {k: v for k, v in (traffic() if traffic is not None else {}).items() if v}
    if not flows:
        return Resolved(P.RankMap.identity(axes), _mesh_order(axes), "auto keeps the mesh's order: no traffic")
    choice = P.auto(axes, flows, topology, cluster.nodes, cluster.devices_per_node, seconds=seconds, keep=buildable)
    plain = not choice.snake and choice.rank_map == P.order(axes, choice.order)
    note = "auto's choice, the least bytes over the slowest level"
    if choice.refused:
        note += (" that the program can build: one with fewer bytes puts an axis's ranks out of increasing "
                 "order, which torch's process groups cannot hold, or is no sum of strides over the axes' factors")
    return Resolved(choice.rank_map, choice.order if plain else None, note)


def generator(rank_map: P.RankMap) -> tuple | None:
    """The rank map as runtime.config.Parallel.placement's generator: ((axis, ((size, stride), ...)), ...) per axis
    of the mesh, each axis's coordinate cut into factors (outermost first) whose digits × strides sum to its share of
    the rank, where the rank is the sum of the axes' shares (runtime.config.placed_ranks expands it); None where the
    map is not of that form. Every axis order is (one factor per axis); so is auto's grid of boxes (JAX's
    mesh_utils' factored axes). The innermost factor is found first: the longest run of equal steps whose length
    divides what is left of the axis."""
    axes = rank_map.axes
    zero = [0] * len(axes)
    out = []
    for i, (axis, n) in enumerate(axes):
        def share(c, i=i):
            coord = list(zero)
            coord[i] = c
            return rank_map.rank(tuple(coord))
        factors, block = [], 1
        while block < n:
            stride, run = share(block), 1
            while run < n // block and share(run * block) == run * stride:
                run += 1
            k = max(d for d in range(1, run + 1) if (n // block) % d == 0)
            if k == 1:
                return None
            factors.append((k, stride))
            block *= k
        out.append((axis, tuple(reversed(factors)) or ((1, 0),)))
    out = tuple(out)
    return out if _expand(axes, out) == rank_map.ranks else None


def _expand(axes: tuple, gen: tuple) -> tuple:
    """runtime.config.placed_ranks, restated here (the compiler does not import the runtime)."""
    ranks = [0]
    for (_, n), (_, factors) in zip(axes, gen):
        offsets = [0]
        for k, stride in factors:
            offsets = [o + d * stride for o in offsets for d in range(k)]
        ranks = [r + o for r in ranks for o in offsets]
    return tuple(ranks)
