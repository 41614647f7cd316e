"""The entry point every generated program calls: `main(Model, CONFIG)` parses the program's flags, starts the mesh,
runs one runtime.trainer.Trainer and ends the job with the exit code its outcome calls for.

Flags on the command line override a few settings for experiments and tests: `--steps`, `--metrics FILE` (one JSON
line per step on rank 0), `--dump-grads FILE` (the full gradients after the first backward, on rank 0), `--seed`,
and the trackers (runtime.tracking, rank 0): `--tensorboard DIR`, `--wandb PROJECT` (`--wandb-dir DIR`),
`--mlflow URI`; and what a resume may change (runtime.resume): `--resume-changed KEY,...`,
`--resume-schedule keep|reanchor`.

The run's parts, each in a module of its own (torchtitan's split): runtime.parallelize (recomputation,
compilation, FSDP2 / DDP applied to the model), runtime.optimizer (AdamW, ZeRO-1, bf16's masters, the
learning-rate schedule, clipping), runtime.model_parts (the whole model or the pipeline stages, and how a step
feeds them), runtime.startup (the start-up checks) and runtime.trainer (set-up, step, evaluate, log, save).
"""
from __future__ import annotations

import argparse
import sys
import traceback
import os
from dataclasses import replace

from runtime import data, faults, leaving, mesh, resume, tracking
# The contract's classes: generated programs build them as train.Config, train.Parallel, ...
from runtime.config import (Checkpoint, Config, Data, Eval, Init, Memory, Optim, Parallel, Resilience,  # noqa: F401
                            Speed)
from runtime.errors import EXIT_CODE, EXIT_PEER, FatalError, announce, leave_after_reporter
from runtime.trainer import Trainer


class _Arguments(argparse.ArgumentParser):
    """The program's flags. A bad flag is the same on every attempt: printed once (by rank 0) and the job ended
    with FatalError's exit code, which runtime.launch does not restart on (argparse's own exit 2 would be)."""

    def error(self, message: str):
        if os.environ.get("RANK", "0") == "0":
            self.print_usage(sys.stderr)
            print(f"{self.prog}: error: {message}", file=sys.stderr, flush=True)
        else:  # rank 0 reports it: its exit, not this one, ends the job
            leave_after_reporter()
        raise SystemExit(EXIT_CODE)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"takes a positive number of steps, not {value}")
    return value


def _parse_args(cfg: Config) -> tuple[Config, argparse.Namespace]:
    p = _Arguments(description=f"Train {cfg.name} (generated from {cfg.source}). Run under torchrun.")
    p.add_argument("--steps", type=_positive, help=f"optimizer steps (default {cfg.steps})")
    p.add_argument("--seed", type=int, help=f"seed (default {cfg.seed})")
    p.add_argument("--metrics", help="write one JSON line per step to this file (rank 0); reads the loss, the "
                                     "gradient norm (and on CUDA the peak memory) every step: one host-device "
                                     "synchronisation per step that runs without it only on logged steps")
    p.add_argument("--tensorboard", metavar="DIR",
                   help="also write the logged scalars as TensorBoard events in DIR (rank 0; needs the "
                        "`tensorboard` package: pip install 'scalec[tensorboard]')")
    p.add_argument("--wandb", metavar="PROJECT",
                   help="also track the run in Weights & Biases project PROJECT (rank 0): the plan, its predictions "
                        "and the settings as config, the logged scalars, a summary; offline unless WANDB_MODE says "
                        "otherwise (needs `wandb`: pip install 'scalec[track]')")
    p.add_argument("--wandb-dir", metavar="DIR",
                   help="where W&B writes its run directory (default the checkpoint directory, else the current one)")
    p.add_argument("--mlflow", metavar="URI",
                   help="also track the run in MLflow at tracking URI (file:./mlruns, a directory, http://...), "
                        "experiment named after the model (rank 0; needs `mlflow-skinny`: pip install "
                        "'scalec[track]')")
    p.add_argument("--dump-grads", help="save the full gradients after the first backward to this file (rank 0)")
    p.add_argument("--checkpoint-dir", help="override the checkpoint directory (relative to the current directory; "
                                            "the .scale file's checkpoint_dir is relative to that file)")
    p.add_argument("--resume-changed", metavar="KEY,...", type=_resume_keys, default=frozenset(),
                   help="resume a checkpoint although these settings changed since it was written (the log says "
                        f"what changed); without it such a resume is refused. KEYs: {', '.join(resume.KEYS)}")
    p.add_argument("--resume-schedule", choices=resume.SCHEDULES, default="keep",
                   help="when a resumed run has more steps than the checkpoint's: keep the schedule's curve (a "
                        "cosine stays at min_lr after its old last step; the default) or reanchor its decay to the "
                        "new last step")
    p.add_argument("--stop-after", type=_positive, metavar="N",
                   help="stop after N steps of the run (checkpointing then), as an interruption would")
    p.add_argument("--count-bytes", metavar="FILE",
                   help="count the bytes of every runtime collective during the last step (the steady state, after "
                        "one-time work such as pipeline shape inference); write JSON (rank 0)")
    p.add_argument("--memory-report", metavar="FILE",
                   help="measure what every rank allocates during the last step (peak, activations, model state; "
                        "runtime.memory) and write one JSON (rank 0)")
    p.add_argument("--debug", action="store_true", help="on failure, print the traceback after the one-line cause")
    args = p.parse_args()
    overrides = {k: v for k, v in (("steps", args.steps), ("seed", args.seed)) if v is not None}
    if args.checkpoint_dir is not None:  # a flag: from the current directory (the program resolves the rest)
        overrides["checkpoint"] = replace(cfg.checkpoint, dir=os.path.abspath(args.checkpoint_dir))
    return replace(cfg, **overrides), args


def _resume_keys(text: str) -> frozenset:
    try:
        return resume.parse_keys(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def main(model_cls, cfg: Config, loss_fn=None, program: str | None = None) -> None:
    """Train; `model_cls` is the whole model, or under pp the Stage class and `loss_fn` the last stage's loss.
    `program` is the generated program's file: a relative data path is relative to its directory."""
    cfg, args = _parse_args(cfg)
    # Every path the .scale file names is relative to it; the compiler wrote them relative to the program.
    cfg = replace(cfg, data=replace(cfg.data, path=data.resolve(cfg.data.path, program)),
                  init=replace(cfg.init, path=data.resolve(cfg.init.path, program)),
                  checkpoint=replace(cfg.checkpoint, dir=data.resolve(cfg.checkpoint.dir, program)))
    faults.set_sources(cfg.sources)  # the .scale lines the watchdog names, from the start-up's rendezvous on
    ctx = mesh.setup(cfg.parallel.axes, cfg.timeout, cfg.parallel.groups, cfg.parallel.ranks,
                     shrunk=lambda world, expected, store_of: leaving.shrunk(
                         cfg.resilience, cfg.checkpoint.dir, world, expected, store_of))
    code = 0
    try:
        run(model_cls, cfg, ctx, args, loss_fn, program=program)
    except FatalError as exc:  # a restart cannot fix it: one message for the job, and the launcher does not restart
        code = exc.code
        if not announce(exc, ctx.rank):
            leave_after_reporter()  # the rank that reports it exits first, so the job ends with its message
    except SystemExit as exc:  # a message of ours: print it, not a traceback
        code = exc.code if isinstance(exc.code, int) else 1
        if not isinstance(exc.code, int):
            print(f"[rank {ctx.rank}] {exc.code}", file=sys.stderr)
    except BaseException as exc:  # shutdown() leaves with os._exit, so print now or it is lost
        code = EXIT_PEER if faults.lost_peer(exc) else 1  # a victim of another rank's failure says so (launch.py)
        print(faults.failure_line(exc), file=sys.stderr, flush=True)  # the cause in one line; --debug: the trace
        if args.debug:
            traceback.print_exc()
    finally:
        if code:
            tracking.abandon()  # the tracked runs are marked failed, not left running
        mesh.shutdown(code)


def run(model_cls, cfg: Config, ctx: mesh.Context, args, loss_fn=None, program: str | None = None) -> list[float]:
    """Train `model_cls` (under pp the Stage class, `loss_fn` the last stage's loss) on this rank of `ctx` with the
    parsed flags `args`: one runtime.trainer.Trainer, set up and run; returns the losses it read."""
    return Trainer(model_cls, cfg, ctx, args, loss_fn, program=program).train()
