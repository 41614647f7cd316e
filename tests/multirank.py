"""The one harness for tests that run a body on several gloo processes on CPU (CONVENTIONS 11).

Every multi-rank unit test used to write the same forty lines: pick a free port, spawn the workers, start the gloo
group, register the tensor-parallel group with runtime.collectives, run the body, and leave with os._exit. Those
lines carry two lessons that a copy can lose, so they live here once:

- a worker leaves with os._exit, because a normal interpreter exit after gloo can SIGABRT in its teardown and turn
  a passing rank into a crashed one; the body's failure is carried in the exit code instead, which mp.spawn turns
  into an exception in the test;
- the worker prints the body's traceback on stderr before leaving, since os._exit discards what an uncaught
  exception would have printed, and a test that fails with "exit code 1" alone is unreadable.

Tests whose processes are not Python functions (a `python -c` script under a FileStore, a torchrun launch) keep their
own shape; this module is for a body that is a picklable function (a module-level function or a functools.partial
of one, since mp.spawn starts fresh interpreters).
"""
from __future__ import annotations

import datetime
import os
import socket
import sys
import traceback
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port free on loopback now (the OS picks it), for the group's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(body: Callable, world: int = 2, *, axes: tuple[str, ...] = ("tp",), mesh: str | None = None,
          timeout: float | None = None) -> None:
    """Run `body(rank, arg)` on `world` gloo processes and raise if any rank failed.

    `arg` is the runtime.collectives module with every name in `axes` registered as the whole world's group
    (("tp",) for the tensor-parallel pieces, ("ep",) for the experts', () when the body calls torch.distributed
    itself). With `mesh` set to an axis name, `arg` is instead a runtime.mesh.Context on a 1-D DeviceMesh of that
    name over the world, every rank one batch shard (as train.run builds it under dp), and `axes` is not consulted.
    `timeout` (seconds) bounds the group's start and each collective, so that a rank stuck on a peer fails the test
    instead of hanging it; None keeps torch's default.

    A failing rank prints its traceback on stderr and exits 1; mp.spawn then raises ProcessExitedException."""
    mp.spawn(_worker, args=(free_port(), world, body, tuple(axes), mesh, timeout), nprocs=world, join=True)


def _worker(rank: int, port: int, world: int, body: Callable, axes: tuple[str, ...], mesh: str | None,
            timeout: float | None) -> None:
    """One rank: start the group, run the body, leave with os._exit carrying failure in the exit code (see the
    module's docstring for why not a normal exit)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # the ranks share the machine's cores
    kwargs = {} if timeout is None else {"timeout": datetime.timedelta(seconds=timeout)}
    dist.init_process_group("gloo", rank=rank, world_size=world, **kwargs)
    code = 0
    try:
        body(rank, _mesh_context(rank, world, mesh) if mesh is not None else _collectives(axes))
    except BaseException:
        traceback.print_exc()
        code = 1
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _collectives(axes: tuple[str, ...]):
    from runtime import collectives
    for axis in axes:
        collectives.register(axis, dist.group.WORLD)
    return collectives


def _mesh_context(rank: int, world: int, axis: str):
    from torch.distributed.device_mesh import init_device_mesh

    from runtime import mesh
    dm = init_device_mesh("cpu", (world,), mesh_dim_names=(axis,))
    return mesh.Context(rank=rank, world_size=world, local_rank=rank, device=torch.device("cpu"), mesh=dm,
                        coords={axis: rank}, batch_group=dm[axis].get_group(), batch_size=world, batch_rank=rank)
