"""The device mesh of a plan, and this process's place in it.

The backend is chosen at start-up: NCCL when CUDA is available, gloo otherwise. A program started without torchrun
runs as a world of one.
"""
from __future__ import annotations

import math
import os
import socket
import sys
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from runtime import choices, collectives, errors, faults, node_record


@dataclass(frozen=True)
class Context:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    mesh: DeviceMesh
    coords: dict  # axis -> this rank's index along it
    batch_group: object = None  # the ranks the step's tokens are split over, dp × ep × cp (None when only this rank):
    # the dense gradients and the loss are averaged over it (each holds as many tokens)
    batch_size: int = 1         # dp × ep × cp
    batch_rank: int = 0         # this rank's share of the sequences: dp index × ep + ep index
    data_ranks: int = 1         # the ranks whole sequences are split over, dp × ep (cp splits each sequence)
    # FSDP's mesh for the dense weights: dp, or dp × ep or dp × cp flattened (torchtitan's folding: the dense weights
    # are replicated over every batch shard and every cp rank, so they shard over all of them; the experts over dp
    # alone)
    dense_mesh: DeviceMesh | None = None
    # the ranks that hold the same experts as this one and route other tokens under ep, when cp splits the batch
    # beside dp: dp × cp (None: dp's own group, or this rank alone). FSDP's mesh for the experts, and its group
    expert_mesh: DeviceMesh | None = None
    expert_group: object = None

    def axis_size(self, axis: str) -> int:
        return self.mesh.size(self.mesh.mesh_dim_names.index(axis)) if axis in self.mesh.mesh_dim_names else 1

    @property
    def is_logger(self) -> bool:
        return self.rank == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup(axes: tuple[tuple[str, int], ...], timeout: float, groups: tuple, ranks: tuple = (),
          shrunk=None) -> Context:
    """Start the process group and build the mesh `axes` ((name, size), outermost first) and the process groups
    `groups` (runtime.config.Parallel.groups: the compiler's list, compiler/layout/groups.py), exactly as listed:
    each axis's groups are the DeviceMesh's (checked against the list), the folded ones (batch, dense, experts)
    new groups over the listed ranks, every rank creating every group in the list's order: the runtime folds no axis
    itself. Each torchrun attempt meets under its own store prefix
    (faults.attempt_store); `timeout` (seconds) bounds the start and, with a margin for the watchdog to speak first,
    every collective. `ranks` (runtime.config.Parallel.ranks, expanded from its `placement`): the global rank of
    each mesh coordinate, row-major (empty: rank i holds coordinate i); the mesh and every group are built over the mapped ranks (`planned`).
    `shrunk(world, expected, store_of)`: where torchrun started another number of processes than the axes need, an
    exit status to end with (runtime.leaving.shrunk: a node gone, re-planned), or None to refuse the world.""" 
    if "RANK" not in os.environ:  # plain `python program.py`: a world of one
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(_free_port()))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    expected = 1
    for _, n in axes:
        expected *= n
    if world != expected and shrunk is not None:  # fewer: a node gone, re-planned where the run asks for it
        code = shrunk(world, expected, lambda: faults.attempt_store(
            timedelta(seconds=timeout) if timeout > 0 else timedelta(hours=24)))
        if code is not None:
            raise SystemExit(code)
    if world != expected:  # the same on every attempt: printed once (no process group yet to elect a rank)
        note = node_record.world_note()  # after a node was left out: each node's first rank says why
        if rank == 0 or (note and local_rank == 0):
            print(f"scalec: this program needs {expected} processes ({' × '.join(f'{a}={n}' for a, n in axes)}), "
                  f"but torchrun started {world}{note}", file=sys.stderr, flush=True)
        else:
            errors.leave_after_reporter()  # rank 0's exit, with its message, ends the job first
        raise SystemExit(errors.EXIT_CODE)
    if not groups:  # a program written before the contract listed its groups
        if rank == 0:
            print("scalec: this program lists no process groups (Parallel.groups): it was compiled by an older "
                  "scalec; compile its .scale file again", file=sys.stderr, flush=True)
        else:
            errors.leave_after_reporter()
        raise SystemExit(errors.EXIT_CODE)
    listed = planned(groups, tuple(a for a, _ in axes), ranks, world)
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend, device_type = "nccl", "cuda"
    else:
        device = torch.device("cpu")
        backend, device_type = "gloo", "cpu"
    if backend == "nccl":
        faults.nccl_flight_recorder_env()
    # The process group's own timeout is the backstop: the watchdog (faults) reports a stuck collective first.
    limit = timedelta(seconds=timeout + 60 if timeout > 0 else 24 * 3600)
    faults.start_watchdog(timeout)
    with faults.op("the process group's start-up (rendezvous of all ranks)", faults.scale()):
        store = faults.attempt_store(timedelta(seconds=timeout) if timeout > 0 else limit)
        dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world, timeout=limit)
    names = tuple(a for a, _ in axes)
    with faults.op("building the device mesh (new process groups)", faults.scale()):
        if ranks:  # the rank tensor as the compiler placed it, never re-sorted
            shape = tuple(n for _, n in axes)
            mesh = DeviceMesh(device_type, torch.tensor(ranks, dtype=torch.int).reshape(shape), mesh_dim_names=names)
        else:
            mesh = init_device_mesh(device_type, tuple(n for _, n in axes), mesh_dim_names=names)
    for a in names:
        if listed.get(a) != rows(mesh, (a,)):
            raise ValueError(f"Parallel.groups: axis {a}'s groups are {listed.get(a)}, but the mesh "
                             f"{' × '.join(f'{x}={n}' for x, n in axes)} groups its ranks as {rows(mesh, (a,))}")
        _same(a, mesh[a].get_group(), next(r for r in listed[a] if rank in r), rank)
        collectives.register(a, mesh[a].get_group())
    coords = {a: mesh.get_local_rank(a) for a in names}
    sizes = dict(axes)
    folded = _build_folded(mesh, listed, names, rank, device_type)
    for name in choices.EP_NODE_GROUPS:  # ep's halves where experts are dispatched by node (runtime/moe_nodes.py)
        if name in folded:
            collectives.register(name, folded[name].get_group())
    dp, ep, cp = sizes.get("dp", 1), sizes.get("ep", 1), sizes.get("cp", 1)
    batch = folded.get("batch")
    expert_mesh = folded.get("experts")
    ctx = Context(rank=rank, world_size=world, local_rank=local_rank, device=device, mesh=mesh, coords=coords,
                  batch_group=batch.get_group() if batch is not None else None, batch_size=dp * ep * cp,
                  dense_mesh=folded.get("dense"), data_ranks=dp * ep, expert_mesh=expert_mesh,
                  expert_group=expert_mesh.get_group() if expert_mesh is not None else None,
                  batch_rank=coords.get("dp", 0) * ep + coords.get("ep", 0))
    faults.configure(ctx, store)
    return ctx


def _build_folded(mesh: DeviceMesh, listed: dict, names: tuple, rank: int, device_type: str) -> dict:
    """The listed groups that are not an axis's, by name, each as a 1-D DeviceMesh of this rank's group: an axis's
    own where its ranks are that axis's groups (batch over dp alone), else new groups over the listed ranks, every
    rank creating every group of the list in order (as new_group requires); one set of groups per distinct list
    (dense is the batch group when dp > 1)."""
    out, made = {}, {}
    for name, groups_ranks in listed.items():
        if name in names:
            continue
        key = tuple(map(tuple, groups_ranks))
        axis = next((a for a in names if rows(mesh, (a,)) == groups_ranks), None)
        if axis is not None:
            out[name] = mesh[axis]
            continue
        if key not in made:
            with faults.op(f"building the {name} groups (new process groups)", faults.scale()):
                mine = None
                for row in groups_ranks:
                    group = dist.new_group(row)
                    if rank in row:
                        mine = (group, row)
                        _same(name, group, row, rank)
            made[key] = DeviceMesh.from_group(mine[0], device_type, mesh=mine[1], mesh_dim_names=(name,))
        out[name] = made[key]
    return out


def planned(groups: tuple, names: tuple, ranks: tuple, world: int) -> dict:
    """Every listed group's rows as global ranks, by name: the stride pattern's rows of row-major mesh indices
    (`expand`) mapped through `ranks` (the rank of each coordinate; empty: the identity).

    A process group orders its members by global rank, whatever order it is given: torch 2.13's
    distributed_c10d.py `new_group` (`group_ranks = sorted(ranks)`, line 5919), `_new_group_with_tag`
    (`ranks = sorted(ranks)` under its default sort_ranks=True, line 5998) and `split_group` (`split_group =
    sorted(split_group)`, line 5682), which DeviceMesh's `_init_one_process_group` calls with each row of the mesh
    tensor (device_mesh.py lines 531-590). A collective over an axis's group then assembles its shards in
    global-rank order while the DeviceMesh (and DTensor, the pipeline's neighbours, tensor parallelism) reads a
    rank's coordinate from its place in the mesh tensor: the two agree only where each axis's row is increasing.
    An axis order (compiler/layout/placement.py `order`: rank = Σ coordinate × stride, strides positive) keeps every
    axis row increasing; a snake or a rank-level re-cut need not, and the compiler does not write one (compiler/
    layout/rank_order.py); a row out of order is refused here. The folded groups (batch, dense, experts) fold axes
    whose members are interchangeable (the gradients' mean, FSDP's shards, which it numbers by group rank itself):
    their rows are listed in the process group's own order, sorted; under the identity they are sorted already."""
    out = {}
    for name, pattern in groups:
        rows_ = expand(pattern, world)
        if ranks:
            rows_ = [[ranks[i] for i in row] for row in rows_]
            if name not in names:
                rows_ = sorted(sorted(row) for row in rows_)
            elif any(row != sorted(row) for row in rows_):
                raise ValueError(f"Parallel.ranks: axis {name}'s groups {rows_} are not each in increasing rank "
                                 "order; a process group orders its ranks by number (torch.distributed.new_group), so "
                                 "its collectives would assemble the shards out of the mesh's order")
        out[name] = rows_
    return out


def _same(name: str, group, row: list, rank: int) -> None:
    """The process group holds exactly the planned ranks, in the planned order (its own: by global rank)."""
    made = dist.get_process_group_ranks(group)
    if made != list(row):
        raise ValueError(f"rank {rank}: the {name} process group holds ranks {made}, but the plan lists {list(row)}")


def expand(pattern, world: int) -> list[list[int]]:
    """The groups of a stride pattern ((stride, size), ... per folded axis, outermost first) over `world` ranks
    numbered row-major on the mesh: each group's ranks are base + Σ i·stride (0 ≤ i < size), ordered along the
    axes; the groups are ordered by their first rank (compiler/layout/groups.py `Group.rows`)."""
    offsets = [0]
    for stride, n in pattern:
        offsets = [o + i * stride for o in offsets for i in range(n)]
    bases = [r for r in range(world) if not any((r // stride) % n for stride, n in pattern)]
    return [[b + o for o in offsets] for b in bases]


def rows(mesh: DeviceMesh, axes: tuple[str, ...]) -> list[list[int]]:
    """The ranks grouped by their coordinates on every other axis: one row per group, ordered along `axes` (the
    first of them outermost)."""
    dims = [mesh.mesh_dim_names.index(a) for a in axes]
    size = math.prod(mesh.mesh.shape[d] for d in dims)
    return mesh.mesh.movedim(dims, list(range(-len(dims), 0))).reshape(-1, size).tolist()


def shutdown(code: int = 0) -> None:
    """Leave cleanly: tear the process group down, then exit without running interpreter finalisers, which can
    abort (SIGABRT) after gloo and the distributed modules are loaded."""
    import sys
    sys.stdout.flush()
    sys.stderr.flush()
    if dist.is_initialized():
        dist.destroy_process_group()
    os._exit(code)
