"""The mesh's `placement` resolved to the rank of every mesh coordinate (compiler/layout/placement.py `RankMap`):
what codegen writes into runtime.config.Parallel.ranks and what compiler/cost/links.py prices each group on.

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
positive); auto's snakes, its node relocations and its rank-level re-cuts need not, so where auto's best breaks
the rule, the best placement that keeps it by the same measure is taken instead (every axis order laid out plainly is
one of auto's candidates) and the resolution says so. Torch-free; imports nothing of compiler.cost.
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

    def describe(self) -> str:
        said = f"order({', '.join(self.order)})" if self.order is not None else "a rank map"
        return f"{said}{': ' + self.note if self.note else ''}"


def in_order(rank_map: P.RankMap) -> bool:
    """Whether every axis's rows are in increasing rank order (what a process group's own order is)."""
    return all(list(row) == sorted(row) for a, n in rank_map.axes if n > 1 for row in rank_map.rows(a))


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
    choice = P.auto(axes, flows, topology, cluster.nodes, cluster.devices_per_node, seconds=seconds, keep=in_order)
    plain = not choice.snake and choice.rank_map == P.order(axes, choice.order)
    note = "auto's choice, the least bytes over the slowest level"
    if choice.refused:
        note += (" that torch's process groups can hold: one with fewer bytes puts an axis's ranks out of "
                 "increasing order, which they cannot hold")
    return Resolved(choice.rank_map, choice.order if plain else None, note)
