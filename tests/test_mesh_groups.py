"""runtime.mesh builds exactly the process groups the compiler lists (compiler/layout/groups.py), ranks in order.

Eight gloo ranks run runtime.mesh.setup on the list codegen writes into Parallel.groups (`Groups.contract`); each
rank then reads every process group it is a member of from torch.distributed and holds them to the Layout: the set
of groups is the listed groups' rows holding this rank (no group the list does not name, none missing), each with
its ranks in the listed order, and the Context's batch_group, dense_mesh and expert_group are the batch, dense and
experts rows. Two meshes cover the folded groups: dp × cp × ep (the batch and dense groups over all three, the
experts' dp × cp), and ep, tp, dp (dp × ep folded around tp: strided, not a block of consecutive ranks). A third
runs dp × cp × ep under `placement = order(dp, ep, cp)` (Parallel.ranks): each axis's group is the RankMap's row,
in coordinate order, and each folded group its ranks in the process group's own (sorted) order.
"""
from __future__ import annotations

import os
import sys
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from compiler.layout import placement
from compiler.layout.groups import groups
from tests.multirank import free_port

pytestmark = pytest.mark.e2e  # gloo ranks: not the fast part

WORLD = 8


def _worker(rank: int, port: int, axes: tuple, order: tuple = ()) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    code = 0
    try:
        _check(rank, axes, order)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    if dist.is_initialized():
        dist.destroy_process_group()
    os._exit(code)


def _check(rank: int, axes: tuple, order: tuple) -> None:
    from runtime import mesh
    layout = groups(axes)
    listed = layout.contract()
    placed = placement.order(axes, order) if order else placement.RankMap.identity(axes)
    ctx = mesh.setup(axes, 60.0, groups=listed, ranks=placed.ranks if order else ())
    names = [a for a, _ in axes]

    def row_of(name):  # the planned ranks of this rank's group: an axis's in coordinate order, a fold's sorted
        row = next(r for r in placed.apply(layout[name].rows()) if rank in r)
        return list(row) if name in names else sorted(row)
    world = dist.distributed_c10d._world
    made = [dist.get_process_group_ranks(pg) for pg in world.pg_group_ranks if pg is not dist.group.WORLD]
    made = [ranks for ranks in made if rank in ranks]  # torch records the groups of other ranks' rows too
    expected = {tuple(row_of(name)) for name, _ in listed if layout[name].size > 1}
    assert sorted(made) == sorted(list(r) for r in expected), (rank, made, expected)
    for name, pattern in listed:
        assert [list(r) for r in layout[name].rows()] == mesh.expand(pattern, WORLD)
    assert ctx.mesh.mesh.flatten().tolist() == list(placed.ranks)
    for a, _ in axes:
        assert dist.get_process_group_ranks(ctx.mesh[a].get_group()) == row_of(a)
        assert ctx.coords[a] == placed.coord(rank)[names.index(a)]
    assert dist.get_process_group_ranks(ctx.batch_group) == row_of("batch")
    assert dist.get_process_group_ranks(ctx.dense_mesh.get_group()) == row_of("dense")
    assert ctx.dense_mesh.mesh.tolist() == row_of("dense")
    if "experts" in layout:
        assert dist.get_process_group_ranks(ctx.expert_group) == row_of("experts")
        assert ctx.expert_mesh.mesh.tolist() == row_of("experts")
    else:
        assert ctx.expert_group is None
    dist.barrier(group=ctx.batch_group)  # the groups work, not only exist


# dp-cp-ep in the default order is the slow tier (22 s of a loaded run): dp-cp-ep-placed builds the same three
# axes' groups from a non-trivial order, and ep-tp-dp the default order's
@pytest.mark.parametrize("axes,order", [pytest.param((("dp", 2), ("cp", 2), ("ep", 2)), (), marks=pytest.mark.slow),
                                        ((("ep", 2), ("tp", 2), ("dp", 2)), ()),
                                        ((("dp", 2), ("cp", 2), ("ep", 2)), ("dp", "ep", "cp"))],
                         ids=["dp-cp-ep", "ep-tp-dp", "dp-cp-ep-placed"])
def test_every_process_group_is_the_layouts(axes, order):
    mp.spawn(_worker, args=(free_port(), axes, order), nprocs=WORLD, join=True)


def test_an_axis_row_out_of_rank_order_is_refused():
    """A rank map that puts an axis's row out of increasing order (a snake) would have its collectives assemble
    the shards in the process group's (sorted) order, not the mesh's: setup refuses it before any group exists."""
    from runtime import mesh
    axes = (("dp", 2), ("tp", 4))
    snake = placement.snake_order(axes, ("tp", "dp"))  # tp's second row runs 7, 6, 5, 4
    assert any(list(r) != sorted(r) for r in snake.rows("tp"))
    with pytest.raises(ValueError, match="not each in increasing rank order"):
        mesh.planned(groups(axes).contract(), ("dp", "tp"), snake.ranks, WORLD)
    assert mesh.planned(groups(axes).contract(), ("dp", "tp"), (), WORLD)["tp"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
