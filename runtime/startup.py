"""What a run checks at start-up, before anything is built, on every rank alike: the batch split the compiler
planned is this mesh's, `--metrics FILE` can be written, checkpoints are where the run looks for them; and the
resume contract's side of this run (runtime.resume). A question about the filesystem is answered by rank 0 (one
filesystem every rank sees) and its answer given to all (`from_rank0`), so that every rank decides alike.
"""
from __future__ import annotations

import os

import torch.distributed as dist

from runtime import checkpoint, mesh, resume
from runtime.config import Config
from runtime.errors import FatalError


def check_contract(cfg: Config, ctx: mesh.Context) -> None:
    """The batch split the compiler planned is the one this mesh gives (a program run on another mesh stops)."""
    par = cfg.parallel
    if (ctx.data_ranks != par.batch_ranks
            or par.micro_batch_size * par.micro_batches * par.batch_ranks != cfg.data.global_batch):
        raise FatalError(f"scalec: this program splits the global batch of {cfg.data.global_batch} over "
                         f"{par.batch_ranks} batch rank(s) × {par.micro_batches} micro-batch(es) of "
                         f"{par.micro_batch_size}, but the mesh has {ctx.data_ranks} batch rank(s): recompile it")



def check_metrics(path: str | None, ctx: mesh.Context) -> None:
    """At start-up, before anything is built: `--metrics FILE` must be a file rank 0 can write (a directory, or a
    file in a directory that does not exist, is the same on every attempt: one line, exit 78, as the checkpoint
    directory's check). Rank 0 looks; every rank stops with it."""
    if not path:
        return
    error = None
    if ctx.is_logger:
        if os.path.isdir(path):
            error = f"scalec: --metrics {path} is a directory: give a file to write one JSON line per step to"
        else:
            try:
                with open(path, "a"):
                    pass
            except OSError as exc:
                error = f"scalec: --metrics {path} cannot be written ({exc.strerror or type(exc).__name__})"
    error = from_rank0(error)
    if error:
        raise FatalError(error if ctx.is_logger else None)


def contract(cfg: Config, ctx: mesh.Context, args) -> resume.Contract:
    """This run's side of the resume contract (runtime.resume): its record, the data's identity read by rank 0
    (one filesystem every rank sees) and given to all, so that every rank decides alike."""
    d = cfg.data
    identity = from_rank0(resume.data_identity(d.kind, d.path, d.dtype, d.document_separator)
                           if ctx.is_logger else None)
    return resume.Contract(resume.record(cfg, identity), allowed=args.resume_changed, schedule=args.resume_schedule)


def has_checkpoint(directory: str, ctx: mesh.Context) -> bool:
    """Whether `directory` holds a complete checkpoint (rank 0 looks; every rank gets the answer): the run will
    resume from one, or stop because none is intact."""
    return bool(from_rank0(bool(checkpoint.newest_complete(directory)) if ctx.is_logger else None))


def legacy_checkpoints(cfg: Config, ctx: mesh.Context, args) -> None:
    """`checkpoint_dir` is relative to the .scale file; programs compiled before read it from the current directory.
    When that reading (Checkpoint.as_written from the cwd) holds checkpoints and the directory this run uses holds
    none, the run would silently start again at step 1 beside them: it stops with one line saying where they are
    and what to do (a `--checkpoint-dir` flag chooses, and is not second-guessed)."""
    written, here = cfg.checkpoint.as_written, cfg.checkpoint.dir
    if not written or args.checkpoint_dir is not None:
        return
    old = os.path.abspath(written)
    error = None
    if ctx.is_logger and old != os.path.abspath(here) and not checkpoint.newest_complete(here):
        found = checkpoint.newest_complete(old)
        if found:
            error = (f"scalec: checkpoint_dir = \"{written}\" is relative to the .scale file: {here} holds no "
                     f"checkpoint, but {old} (the same path from the current directory, where earlier versions "
                     f"looked) holds {found}: move its checkpoints to {here}, or pass --checkpoint-dir {old} to "
                     "resume from there")
    error = from_rank0(error)
    if error:
        raise FatalError(error if ctx.is_logger else None)


def from_rank0(value):
    """Rank 0's `value` on every rank (one object broadcast; as it is with one process)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
