"""runtime.mesh builds exactly the process groups the compiler lists (compiler/layout/groups.py), ranks in order.

Eight gloo ranks run runtime.mesh.setup on the list codegen writes into Parallel.groups (`Groups.contract`); each
rank then reads every process group it is a member of from torch.distributed and holds them to the Layout: the set
of groups is the listed groups' rows holding this rank (no group the list does not name, none missing), each with
its ranks in the listed order, and the Context's batch_group, dense_mesh and expert_group are the batch, dense and
experts rows. Two meshes cover the folded groups: dp × cp × ep (the batch and dense groups over all three, the
experts' dp × cp), and ep, tp, dp (dp × ep folded around tp: strided, not a block of consecutive ranks).
"""
from __future__ import annotations

import os
import sys
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from compiler.layout.groups import groups
from tests.multirank import free_port

pytestmark = pytest.mark.e2e  # gloo ranks: not the fast part

WORLD = 8


def _worker(rank: int, port: int, axes: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    code = 0
    try:
        _check(rank, axes)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    if dist.is_initialized():
        dist.destroy_process_group()
    os._exit(code)


def _check(rank: int, axes: tuple) -> None:
    from runtime import mesh
    layout = groups(axes)
    listed = layout.contract()
    ctx = mesh.setup(axes, 60.0, groups=listed)
    world = dist.distributed_c10d._world
    made = [dist.get_process_group_ranks(pg) for pg in world.pg_group_ranks if pg is not dist.group.WORLD]
    made = [ranks for ranks in made if rank in ranks]  # torch records the groups of other ranks' rows too
    expected = {layout[name].row_of(rank) for name, _ in listed if layout[name].size > 1}
    assert sorted(made) == sorted(list(r) for r in expected), (rank, made, expected)
    for name, pattern in listed:
        assert [list(r) for r in layout[name].rows()] == mesh.expand(pattern, WORLD)
    for a, _ in axes:
        assert dist.get_process_group_ranks(ctx.mesh[a].get_group()) == list(layout[a].row_of(rank))
    assert dist.get_process_group_ranks(ctx.batch_group) == list(layout["batch"].row_of(rank))
    assert dist.get_process_group_ranks(ctx.dense_mesh.get_group()) == list(layout["dense"].row_of(rank))
    assert ctx.dense_mesh.mesh.tolist() == list(layout["dense"].row_of(rank))
    if "experts" in layout:
        assert dist.get_process_group_ranks(ctx.expert_group) == list(layout["experts"].row_of(rank))
        assert ctx.expert_mesh.mesh.tolist() == list(layout["experts"].row_of(rank))
    else:
        assert ctx.expert_group is None
    dist.barrier(group=ctx.batch_group)  # the groups work, not only exist


@pytest.mark.parametrize("axes", [(("dp", 2), ("cp", 2), ("ep", 2)), (("ep", 2), ("tp", 2), ("dp", 2))],
                         ids=["dp-cp-ep", "ep-tp-dp"])
def test_every_process_group_is_the_layouts(axes):
    mp.spawn(_worker, args=(free_port(), axes), nprocs=WORLD, join=True)
