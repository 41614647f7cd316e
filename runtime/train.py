"""The training loop every generated program runs: mesh, data parallelism, optimizer, schedule, logging, checkpoints.

Generated programs call `main(Model, CONFIG)`. Flags on the command line override a few settings for experiments
and tests: `--steps`, `--metrics FILE` (one JSON line per step on rank 0), `--dump-grads FILE` (the full
gradients after the first backward, on rank 0), `--seed`, and the trackers (runtime.tracking, rank 0):
`--tensorboard DIR`, `--wandb PROJECT` (`--wandb-dir DIR`), `--mlflow URI`; and what a resume may change
(runtime.resume): `--resume-changed KEY,...`, `--resume-schedule keep|reanchor`.

A step waits for the device only where it must: the loss and the gradient norm stay on the device and are read on
logged steps (every step with `--metrics`); the preemption vote is read without waiting for the step's end
(faults.StopVote); the next step's batch is prepared while a step runs (data.Prefetcher). Between logged steps the
host queues work ahead of the device, so the time a logged line shows is the mean over the steps since the last one.
"""
from __future__ import annotations

import argparse
import sys
import traceback
import contextlib
import json
import os
import time
import warnings
from dataclasses import replace

import torch
import torch.distributed as dist
from torch import nn

from runtime import (checkpoint, collectives, compile, context_parallel, data, faults, hf, memory, mesh, moe,
                     packed, precision, progress, recompute, resume, tracking)
# The contract's classes: generated programs build them as train.Config, train.Parallel, ...
from runtime.config import Checkpoint, Config, Data, Eval, Init, Memory, Optim, Parallel, Speed  # noqa: F401
from runtime.errors import EXIT_CODE, FatalError, announce
from runtime import tensor_parallel as tp
from runtime.layers import Repeat, init_parameters


class _Arguments(argparse.ArgumentParser):
    """The program's flags. A bad flag is the same on every attempt: printed once (by rank 0) and the job ended
    with FatalError's exit code, which runtime.launch does not restart on (argparse's own exit 2 would be)."""

    def error(self, message: str):
        if os.environ.get("RANK", "0") == "0":
            self.print_usage(sys.stderr)
            print(f"{self.prog}: error: {message}", file=sys.stderr, flush=True)
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


def lr_lambda(cfg: Config, anchor: int | None = None):
    """Multiplier of the peak learning rate at each step: linear warm-up, then constant or cosine to min_lr at step
    `anchor` (default the run's last, cfg.steps; runtime.resume: an extended run may keep its old anchor)."""
    opt = cfg.optim
    end = cfg.steps if anchor is None else anchor

    def f(step: int) -> float:
        return resume.multiplier(step, schedule=opt.lr_schedule, warmup=opt.warmup, lr=opt.lr, min_lr=opt.min_lr,
                                 anchor=end)
    return f


def _wrap_data_parallel(model: nn.Module, ctx: mesh.Context, cfg: Config, shards: tp.Shards) -> nn.Module:
    if ctx.batch_size == 1:
        return model
    if _dp_kind(cfg, ctx) == "fsdp":  # fsdp or zero2
        group_mesh = ctx.dense_mesh  # dp, dp × ep or dp × cp (torchtitan's folding: the dense weights shard over
        # both; FSDP2 divides the reduce-scattered gradients by its mesh's size, the batch group's under cp)
        from torch.distributed.fsdp import fully_shard
        # ZeRO-3 (fsdp): each block is one unit (gathered for its forward, freed, gathered again for its backward,
        # freed), the rest is the root.
        # ZeRO-2 (zero2): the same units with reshard_after_forward=False: a unit gathered for its forward stays
        # gathered until its backward (no second all-gather), gradients are reduce-scattered and AdamW's state is
        # the dp shard's. What a rank holds: at rest (between steps, and between micro-batches: FSDP2 reshards
        # after backward) its 1/dp shard of the weights, gradients and optimizer state, as fsdp; at the backward's
        # peak every unit's whole weights (gathered in forward, not yet freed) beside the sharded gradients and
        # optimizer state: what ZeRO-2 holds (whole weights, 1/dp of the rest), plus the one unit's whole gradient
        # waiting for its reduce-scatter.
        reshard = cfg.parallel.data_parallel == "fsdp"
        # FSDP2 warns, on every rank, that a unit returning a view (the last pipeline stage's logits, flattened)
        # would lose its pre-backward hook to an in-place op on it: the schedule only sends a stage's output or
        # gives it to the loss, out of place (tests/e2e runs fail on any warning printed).
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor",
                                category=UserWarning)
        blocks = [block for child in model.children() if isinstance(child, Repeat) for block in child.values()]
        # bf16: FSDP2 gathers bf16 weights from the fp32 shards (the masters) and reduces in grad_reduce's dtype
        mp = ({"mp_policy": precision.fsdp_policy(cfg.parallel.grad_reduce, cfg.parallel.fp32_residual)}
              if cfg.precision == "bf16" else {})
        _shard_experts(model, ctx, shards, reshard, mp)
        for block in blocks:
            fully_shard(block, mesh=group_mesh, reshard_after_forward=reshard, **mp)
        fully_shard(model, mesh=group_mesh, reshard_after_forward=reshard, **mp)
        _fsdp_prefetch(blocks, cfg.parallel.fsdp_prefetch)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP
    # Dense weights: averaged over every batch shard (dp × ep). Experts sharded over ep are left to
    # moe.sync_expert_grads, over dp only.
    experts = [name for name, _ in model.named_parameters() if shards.expert(name)]
    # DeepSeek-V3's expert biases and loads (moe.ExpertBias): each rank counts its own tokens' load, and the biases
    # move alike on every rank (moe.update_expert_bias); DDP's broadcast of rank 0's buffers would overwrite both
    experts += [f"{where}.{b}" for where, m in model.named_modules() if isinstance(m, moe.ExpertBias)
                for b in ("bias", "load")]
    if experts:
        DDP._set_params_and_buffers_to_ignore_for_model(model, experts)
    with faults.op("DDP's start-up (the parameters broadcast from rank 0 over the batch ranks)", _dp_site("ddp")):
        return DDP(model, process_group=ctx.batch_group, bucket_cap_mb=cfg.parallel.ddp_bucket_mb,
                   device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)


def _shard_experts(model: nn.Module, ctx: mesh.Context, shards: tp.Shards, reshard: bool, mp: dict) -> None:
    """FSDP with ep: each module of `model` holding expert weights (already sharded over ep, so replicated over dp
    alone) becomes a unit of its own over dp (dp × cp under context parallelism: runtime.mesh's expert_mesh),
    before its block's unit over dp × ep (× cp) takes the rest. Its gradients are summed there and divided by
    dp · ep (· cp), the batch shards, as moe.sync_expert_grads does without FSDP: each
    rank's expert gradient already sums the tokens of its ep peers (through the all-to-all's backward)."""
    if ctx.axis_size("ep") == 1:
        return
    from torch.distributed.fsdp import fully_shard
    over = ctx.expert_mesh if ctx.expert_mesh is not None else ctx.mesh["dp"]  # dp, or dp × cp under cp
    for name, module in model.named_modules():
        own = [n for n, _ in module.named_parameters(recurse=False)]
        if own and all(shards.expert(f"{name}.{n}" if name else n) for n in own):
            fully_shard(module, mesh=over, reshard_after_forward=reshard, **mp)
            module.set_gradient_divide_factor(float(ctx.batch_size))
            if dist.get_backend(over.get_group()) == "gloo":  # no PREMUL_SUM: divide after a plain sum
                module.set_force_sum_reduction_for_comms(True)


def _fsdp_prefetch(blocks: list, depth: int) -> None:
    """FSDP2's explicit prefetch (Parallel.fsdp_prefetch): each block's forward issues the all-gathers of the
    `depth` blocks after it, its backward those of the `depth` blocks before it (the order backward reaches them),
    so a gather runs under the previous block's compute even when the host is not ahead of the device."""
    if depth <= 0:
        return
    for i, block in enumerate(blocks):
        ahead = blocks[i + 1:i + 1 + depth]
        behind = blocks[max(0, i - depth):i][::-1]
        if ahead:
            block.set_modules_to_forward_prefetch(ahead)
        if behind:
            block.set_modules_to_backward_prefetch(behind)


def _average_dense_grads(named_params, ctx: mesh.Context, shards: tp.Shards, bucket_bytes: float) -> None:
    """Data parallelism of pipeline stages (fp32): the mean over the dp × ep batch shards of every gradient but the
    experts' (moe.sync_expert_grads), after the pipeline step, in buckets of about `bucket_bytes` (DDP's
    bucket_cap_mb): each bucket flattened, all-reduced and copied back before the next, so the step holds one
    bucket beside the gradients rather than a flat copy of all of them (bf16 reduces its main gradients' own
    buckets in place: precision.MainGrads.reduce_now)."""
    if ctx.batch_size == 1:
        return
    grads = [p.grad for name, p in named_params if p.grad is not None and not shards.expert(name)]
    bucket, size = [], 0
    for g in grads + [None]:
        if bucket and (g is None or size + g.numel() * g.element_size() > bucket_bytes):
            flat = torch._utils._flatten_dense_tensors(bucket)
            dist.all_reduce(flat, group=ctx.batch_group)
            flat /= ctx.batch_size
            for each, avg in zip(bucket, torch._utils._unflatten_dense_tensors(flat, bucket)):
                each.copy_(avg)
            bucket, size = [], 0
        if g is not None:
            bucket.append(g)
            size += g.numel() * g.element_size()


def _dp_kind(cfg: Config, ctx: mesh.Context) -> str | None:
    """How a whole model's gradients are synchronised over the batch ranks: `ddp` (DDP, or the coalesced all-reduce
    of pipeline stages; zero1 too: only its optimizer differs), `fsdp` (FSDP2: fsdp and zero2), or None (one rank).
    With dp = 1 the ZeRO stages have nothing to shard and are ddp."""
    if ctx.batch_size == 1:
        return None
    return "fsdp" if cfg.parallel.data_parallel in ("fsdp", "zero2") and ctx.axis_size("dp") > 1 else "ddp"


def _dp_site(kind: str | None) -> str | None:
    """The `.scale` lines behind the gradient collectives of data parallelism (faults.scale): FSDP's gathers and
    reduce-scatters come from `data_parallel = fsdp|zero2` (else the dp axis), DDP's all-reduce from the dp axis
    (the ep axis too: the batch ranks are dp × ep) and `data_parallel` when written."""
    if kind == "fsdp":
        return faults.scale("data_parallel" if faults.has_source("data_parallel") else "axis dp")
    return faults.scale("axis dp", "axis ep", "data_parallel")


def _dp_sync(kind: str | None, sync: bool, buckets: bool = False) -> str:
    if not sync or kind is None:
        return "no data-parallel collective"
    if buckets:  # bf16 without DDP (runtime.precision.MainGrads)
        return "with the main gradients' bucketed all-reduces over the batch ranks"
    return ("with FSDP's gradient reduce-scatter over dp" if kind == "fsdp"
            else "with DDP's gradient all-reduce over the batch ranks")


class ModelParts:
    """This rank's part of the model as a list of modules (torchtitan's `model_parts`): the whole model, or the
    pipeline stages this pp rank runs. The optimizer, clipping, the gradient syncs and checkpoints all work over
    this one list; only `step` (the forward and backward of one optimizer step) differs between the two kinds."""

    modules: list
    """The modules, in the order their parameters are given to the optimizer and checkpoints."""
    tied_elsewhere: tuple = ()
    """Parameter names held here that are copies of a parameter another rank owns (the last stage's tied
    embedding): left out of the norm, the parameter count and saving, so each is counted once."""
    pp_group = None
    """The group the gradient norm is summed over besides dp and tp (the pp row), or None."""
    aux_loss_scale = 1.0
    """The MoE auxiliary loss's scale: each micro-batch's loss is scaled by 1/m, by the schedule under pp."""
    where = ""
    """What the parameter count of the start-up line covers."""
    measure = None
    """runtime.memory.Measure of the step being measured (its forwards record activations), or None."""

    def named_parameters(self, counted_once: bool = False):
        """(name, parameter) over every module; `counted_once`: without the `tied_elsewhere` copies."""
        for module in self.modules:
            for name, p in module.named_parameters():
                if counted_once and name.removeprefix("module.") in self.tied_elsewhere:
                    continue
                yield name, p

    def batches(self, source, step: int, held_out: bool = False) -> list:
        """This rank's (tokens, targets) host tensors of step `step`, one pair per micro-batch the step feeds;
        `held_out`: of evaluation's held-out batch `step` instead."""
        raise NotImplementedError

    def step(self, batches: list) -> torch.Tensor:
        """Forward and backward of this rank's share of a step's batch (`batches`, on the device), gradients
        averaged over the batch ranks (all but the experts'); returns this rank's mean loss, on the device."""
        raise NotImplementedError

    def eval_loss(self, batches: list) -> torch.Tensor:
        """The forward alone (under no_grad) of this rank's share of one held-out batch (`batches`, as `step`'s):
        the sum of the cross entropy over its tokens, float64, on the device, the same on every rank of a batch
        rank's tp and pp groups."""
        raise NotImplementedError


class WholeModel(ModelParts):
    """No pipeline: one module, `micro_batches` micro-batches accumulated; the data-parallel wrapper (DDP or FSDP)
    synchronises the gradients during the last micro-batch's backward only."""

    mains = None
    """runtime.precision.MainGrads under bf16 without FSDP (set by `run`); with dp, its buckets replace DDP."""

    def __init__(self, model_cls, cfg: Config, ctx: mesh.Context, prepare):
        with torch.device("meta"):
            model = model_cls()
        self.model = prepare(model)
        self.modules = [self.model]
        self.cfg, self.ctx = cfg, ctx
        self.kind = _dp_kind(cfg, ctx)
        self.aux_loss_scale = 1.0 / cfg.parallel.micro_batches
        self.measure = None  # runtime.memory.Measure of this step, when one is taken
        self.site = _dp_site(self.kind)  # the lines behind the forward's and backward's data-parallel collectives
        # What a forward waits for: FSDP's weight gathers; DDP's bucket order (broadcast from rank 0 at the first
        # forward after a backward) and buffers, over the batch ranks.
        self.gathers = {"fsdp": " (with FSDP's weight all-gathers over dp)",
                        "ddp": " (with DDP's bucket and buffer synchronisation over the batch ranks)",
                        }.get(self.kind, "")

    def batches(self, source, step: int, held_out: bool = False) -> list:
        m, ctx = self.cfg.parallel.micro_batches, self.ctx
        return [_packed_shard(data.micro_batch(source, step, self.cfg.data.global_batch, ctx.batch_rank,
                                               ctx.data_ranks, j, m, held_out), self.cfg.data.document_separator)
                for j in range(m)]

    def step(self, batches: list) -> torch.Tensor:
        m, ctx, model = self.cfg.parallel.micro_batches, self.ctx, self.model
        ddp = self.kind == "ddp" and self.mains is None  # DDP-wrapped (fp32)
        if self.measure is not None:  # what each micro-batch's forward keeps for its backward
            self.measure.watch_model(model.module if ddp else model)
        total = torch.zeros((), device=ctx.device)
        for j, (tokens, targets, *docs) in enumerate(batches):
            sync = j == m - 1
            no_sync = model.no_sync() if (not sync and ddp) else contextlib.nullcontext()
            if self.kind == "fsdp":  # FSDP2 (fsdp, zero2): reduce-scatter only on the last micro-batch; the ones
                # before accumulate whole (unsharded) gradients, held until that reduce-scatter (memory model);
                # fsdp_grad_sync = micro_batch: on every one, the gradients accumulating sharded
                sync = sync or self.cfg.parallel.fsdp_grad_sync == "micro_batch"
                model.set_requires_gradient_sync(sync)
            if sync and self.mains is not None:  # bf16 without DDP: the last backward launches the buckets
                self.mains.start_sync()
            with no_sync, _documents(docs):
                with faults.op(f"the forward{self.gathers if ddp or self.kind == 'fsdp' else ''}", self.site):
                    loss = model(tokens, targets) / m
                with faults.op(f"the backward ({_dp_sync(self.kind, sync, self.mains is not None)})", self.site):
                    loss.backward()
            total += loss.detach()
        if self.mains is not None:
            with faults.op("the bucketed gradient all-reduces over the batch ranks (main gradients)",
                           _dp_site("ddp")):
                self.mains.wait()
            self.mains.finish()
        return total

    def eval_loss(self, batches: list) -> torch.Tensor:
        from torch.nn.parallel import DistributedDataParallel as DDP
        # DDP's own forward would synchronise buffers over the batch ranks: its module is the same model.
        model = self.model.module if isinstance(self.model, DDP) else self.model
        total = torch.zeros((), dtype=torch.float64, device=self.ctx.device)
        with faults.op(f"the evaluation forward{self.gathers if self.kind == 'fsdp' else ''}", self.site):
            for tokens, targets, *docs in batches:  # each micro-batch's loss is the mean over its tokens
                with _documents(docs):
                    total += model(tokens, targets).double() * targets.numel()
        return total


class PipelineStages(ModelParts):
    """Pipeline parallelism: the stages this pp rank runs, driven by the schedule the compiler proved; their dense
    gradients are averaged over the batch ranks after the schedule (no DDP: its pipelining hook fails a reducer
    assert when micro-batches = pp, torch 2.13), FSDP's own reduce-scatter under fsdp."""

    where = " in rank 0's pipeline stages"

    def __init__(self, model_cls, cfg: Config, ctx: mesh.Context, loss_fn, prepare, shards: tp.Shards):
        from runtime.pipeline import Pipeline
        self.pipe = Pipeline(model_cls, cfg, ctx, loss_fn, lambda module: prepare(module, ddp=False),
                             main_grads=precision.main_grads(cfg.precision, _dp_kind(cfg, ctx)))
        self.modules = self.pipe.modules
        self.tied_elsewhere = self.pipe.tied_elsewhere
        self.pp_group = ctx.mesh["pp"].get_group()
        self.cfg, self.ctx, self.shards = cfg, ctx, shards
        self.measure = None  # runtime.memory.Measure of this step, when one is taken

    def batches(self, source, step: int, held_out: bool = False) -> list:
        # The schedule splits this rank's batch into the micro-batches itself.
        ctx = self.ctx
        return [_packed_shard(data.micro_batch(source, step, self.cfg.data.global_batch, ctx.batch_rank,
                                               ctx.data_ranks, 0, 1, held_out), self.cfg.data.document_separator)]

    def step(self, batches: list) -> torch.Tensor:
        ctx = self.ctx
        if self.measure is not None:  # the stages' forwards and the loss, recorded over the schedule
            self.pipe.watch(self.measure)
        ((tokens, targets, *docs),) = batches
        with faults.op("the pipeline schedule (sends and receives between stages over pp)",
                       faults.scale("axis pp", "schedule")):
            total = self.pipe.step(tokens, targets, *docs)
        if _dp_kind(self.cfg, ctx) != "fsdp":
            with faults.op("the gradient all-reduce over the batch ranks (data parallelism of stages)",
                           _dp_site("ddp")):
                if self.pipe.mains is not None:  # bf16: the main gradients' buckets, in place
                    self.pipe.mains.reduce_now()
                else:
                    _average_dense_grads(self.named_parameters(), ctx, self.shards,
                                         self.cfg.parallel.ddp_bucket_mb * 2**20)
        return total

    def eval_loss(self, batches: list) -> torch.Tensor:
        ((tokens, targets, *docs),) = batches
        with faults.op("the evaluation's forward sends and receives between stages over pp",
                       faults.scale("axis pp", "schedule")):
            return self.pipe.evaluate(tokens, targets, *docs)


def evaluate(parts: ModelParts, source, cfg: Config, ctx: mesh.Context) -> float:
    """The evaluation loss: the mean cross entropy over every token of `cfg.eval.batches` held-out global batches
    (the same ones at every evaluation: runtime.data's `eval_samples`), the model's forward only. Each batch is
    split over the batch ranks and micro-batches as a step's is; each rank sums its tokens' losses (float64), one
    all-reduce over the batch ranks adds them, and the sum is divided by the tokens: on any plan the figure the
    single device computes. The MoE auxiliary loss is not in it (it is a training signal for the router, not a
    loss of the data), and its statistics are left to the training log (moe.not_recording). Nothing here draws
    from a random stream or moves the training data's position, so training goes on as if it had not run."""
    total = torch.zeros((), dtype=torch.float64, device=ctx.device)
    with torch.no_grad(), moe.not_recording():
        for b in range(cfg.eval.batches):
            batches = [tuple(t.to(ctx.device) for t in pair) for pair in parts.batches(source, b, held_out=True)]
            total += parts.eval_loss(batches)
    if _dp_kind(cfg, ctx) == "fsdp":  # zero2 keeps a unit gathered after a forward until its backward: free it now
        from torch.distributed.fsdp import FSDPModule
        for module in parts.modules:
            for m in module.modules():
                if isinstance(m, FSDPModule):
                    m.reshard()
    if ctx.batch_size > 1:
        with faults.op("the evaluation loss all-reduce over the batch ranks", faults.scale("axis dp", "axis ep")):
            dist.all_reduce(total, op=dist.ReduceOp.SUM, group=ctx.batch_group)
    with faults.device_wait("reading the evaluation loss"):
        return total.item() / (cfg.eval.batches * cfg.data.global_batch * cfg.data.seq_len)


def _packed_shard(pair: tuple, separator: int | None) -> tuple:
    """`_sequence_shard` of (tokens, targets); with packed documents (runtime.packed) the targets after a separator
    masked first, and the whole sequences' document ids appended (under cp every rank reads its queries' and the
    gathered keys' documents from them)."""
    if separator is None:
        return _sequence_shard(pair)
    tokens, targets = pair
    docs = packed.documents(tokens, separator)
    return (*_sequence_shard((tokens, packed.mask_targets(tokens, targets, separator))), docs)


def _documents(docs: list):
    """packed.batch over the micro-batch's document ids, when it has them."""
    return packed.batch(docs[0]) if docs else contextlib.nullcontext()


def _sequence_shard(pair: tuple) -> tuple:
    """This cp rank's tokens of a micro-batch's (tokens, targets): chunks i and 2·cp − 1 − i of each sequence
    (runtime.context_parallel); the pair as it is without cp."""
    return tuple(context_parallel.chunks(t, 1) for t in pair)


def _check_contract(cfg: Config, ctx: mesh.Context) -> None:
    """The batch split the compiler planned is the one this mesh gives (a program run on another mesh stops)."""
    par = cfg.parallel
    if (ctx.data_ranks != par.batch_ranks
            or par.micro_batch_size * par.micro_batches * par.batch_ranks != cfg.data.global_batch):
        raise FatalError(f"scalec: this program splits the global batch of {cfg.data.global_batch} over "
                         f"{par.batch_ranks} batch rank(s) × {par.micro_batches} micro-batch(es) of "
                         f"{par.micro_batch_size}, but the mesh has {ctx.data_ranks} batch rank(s): recompile it")


def _optimizer(params: list, opt: Optim, zero_group=None) -> torch.optim.Optimizer:
    """AdamW over `params`; with `zero_group` (zero1 over dp), torch's ZeroRedundancyOptimizer over that group: each
    rank keeps AdamW's state of its partition of the parameters (whole parameters, balanced by size within each
    param group), updates those, and broadcasts them to the group. The learning-rate scheduler and clipping act on
    its param groups and gradients as on AdamW's; checkpoints read its local AdamW's state (`local_state`)."""
    groups = precision.decay_groups(params, opt.weight_decay)
    kernels = precision.adamw_kernels(params)
    if zero_group is not None:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW, process_group=zero_group,
                                       parameters_as_bucket_view=True,
                                       lr=opt.lr, betas=opt.betas, eps=opt.eps, **kernels)
    return torch.optim.AdamW(groups, lr=opt.lr, betas=opt.betas, eps=opt.eps, **kernels)


def _zero1_group(cfg: Config, ctx: mesh.Context):
    """The group zero1 partitions AdamW's state over: dp, or None. With ep too, dp alone: the ranks of a dp group
    hold the same parameters, the experts included, so each owns whole ones and broadcasts them there; the dense
    state stays replicated over ep (Megatron's distributed optimizer shards it over dp × ep: a known difference
    the memory model counts)."""
    if cfg.parallel.data_parallel != "zero1" or ctx.axis_size("dp") == 1:
        return None
    if ctx.axis_size("cp") > 1:  # dp × cp: cp ranks hold the same parameters and gradients (with ep, the experts'
        # group: ep ranks hold other experts)
        return ctx.expert_group if ctx.axis_size("ep") > 1 else ctx.batch_group
    return ctx.mesh["dp"].get_group()


def _dump_grads(named_params, path: str, ctx: mesh.Context, shards: tp.Shards) -> None:
    """Whole gradients (gathered over dp, tp and ep); under pp each stage's rank writes `path.ppN`."""
    grads = tp.full_grads(named_params, shards)
    if ctx.axis_size("pp") > 1:
        if all(ctx.coords.get(a, 0) == 0 for a in ("dp", "cp", "tp", "ep")):
            torch.save(grads, f"{path}.pp{ctx.coords['pp']}")
    elif ctx.is_logger:
        torch.save(grads, path)


def _write_counts(path: str, ctx: mesh.Context) -> None:
    counts = {f"{op}/{axis}": n for (op, axis), n in sorted(collectives.BYTES.items())}
    collectives.count_bytes(False)
    if ctx.is_logger:
        with open(path, "w") as f:
            json.dump(counts, f, indent=2, sort_keys=True)


def main(model_cls, cfg: Config, loss_fn=None, program: str | None = None) -> None:
    """Train; `model_cls` is the whole model, or under pp the Stage class and `loss_fn` the last stage's loss.
    `program` is the generated program's file: a relative data path is relative to its directory."""
    cfg, args = _parse_args(cfg)
    # Every path the .scale file names is relative to it; the compiler wrote them relative to the program.
    cfg = replace(cfg, data=replace(cfg.data, path=data.resolve(cfg.data.path, program)),
                  init=replace(cfg.init, path=data.resolve(cfg.init.path, program)),
                  checkpoint=replace(cfg.checkpoint, dir=data.resolve(cfg.checkpoint.dir, program)))
    faults.set_sources(cfg.sources)  # the .scale lines the watchdog names, from the start-up's rendezvous on
    ctx = mesh.setup(cfg.parallel.axes, cfg.timeout)
    code = 0
    try:
        run(model_cls, cfg, ctx, args, loss_fn, program=program)
    except FatalError as exc:  # a restart cannot fix it: one message for the job, and the launcher does not restart
        code = exc.code
        announce(exc, ctx.rank)
    except SystemExit as exc:  # a message of ours: print it, not a traceback
        code = exc.code if isinstance(exc.code, int) else 1
        if not isinstance(exc.code, int):
            print(f"[rank {ctx.rank}] {exc.code}", file=sys.stderr)
    except BaseException as exc:  # shutdown() leaves with os._exit, so print now or it is lost
        code = 1
        print(faults.failure_line(exc), file=sys.stderr, flush=True)  # the cause in one line; --debug: the trace
        if args.debug:
            traceback.print_exc()
    finally:
        if code:
            tracking.abandon()  # the tracked runs are marked failed, not left running
        mesh.shutdown(code)


def _check_metrics(path: str | None, ctx: mesh.Context) -> None:
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
    error = _from_rank0(error)
    if error:
        raise FatalError(error if ctx.is_logger else None)


def _contract(cfg: Config, ctx: mesh.Context, args) -> resume.Contract:
    """This run's side of the resume contract (runtime.resume): its record, the data's identity read by rank 0
    (one filesystem every rank sees) and given to all, so that every rank decides alike."""
    d = cfg.data
    identity = _from_rank0(resume.data_identity(d.kind, d.path, d.dtype, d.document_separator)
                           if ctx.is_logger else None)
    return resume.Contract(resume.record(cfg, identity), allowed=args.resume_changed, schedule=args.resume_schedule)


def _has_checkpoint(directory: str, ctx: mesh.Context) -> bool:
    """Whether `directory` holds a complete checkpoint (rank 0 looks; every rank gets the answer): the run will
    resume from one, or stop because none is intact."""
    return bool(_from_rank0(bool(checkpoint.newest_complete(directory)) if ctx.is_logger else None))


def _legacy_checkpoints(cfg: Config, ctx: mesh.Context, args) -> None:
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
    error = _from_rank0(error)
    if error:
        raise FatalError(error if ctx.is_logger else None)


def _from_rank0(value):
    """Rank 0's `value` on every rank (one object broadcast; as it is with one process)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def run(model_cls, cfg: Config, ctx: mesh.Context, args, loss_fn=None, program: str | None = None) -> list[float]:
    _check_contract(cfg, ctx)
    _check_metrics(args.metrics, ctx)
    if cfg.checkpoint.dir:
        _legacy_checkpoints(cfg, ctx, args)
    torch.manual_seed(cfg.seed)
    par = cfg.parallel
    shards = tp.Shards(par.tp_shards, par.tp_partial_grads, par.ep_shards)
    fsdp = _dp_kind(cfg, ctx) == "fsdp"
    mixed = precision.main_grads(cfg.precision, _dp_kind(cfg, ctx))  # bf16 weights, main gradients, masters

    loaded = []  # runtime.hf.Loaded of each module this rank prepared from `init`
    # A run that resumes (or stops: none intact) takes its weights from the checkpoint: `init = from(...)` is not
    # read, and the log says so after "resumed from"
    skip_init = bool(cfg.init.path and cfg.checkpoint.dir and _has_checkpoint(cfg.checkpoint.dir, ctx))

    def prepare(module: nn.Module, ddp: bool = True) -> nn.Module:
        recompute.apply(module, par.recompute)  # each block of a repeat, whole model or pipeline stage
        if par.compile and not args.count_bytes:  # compiled regions count no bytes per call (runtime.compile)
            compile.apply(module)
        if cfg.precision == "bf16":  # the fp32 residual, if asked (before wrapping)
            precision.apply_policy(module, par.fp32_residual)
        if fsdp:  # shard while still on meta: no rank ever holds more than its share of the weights
            module = _wrap_data_parallel(module, ctx, cfg, shards)
        module.to_empty(device=ctx.device)
        moe.reset_expert_bias(module)  # buffers come out of to_empty uninitialised: the expert biases start at 0
        if cfg.init.path and not skip_init:  # a Hugging Face checkpoint: each rank reads only its part of each tensor
            loaded.append(hf.load(module, cfg.init.path, shard_of=shards.of, axis_rank=collectives.axis_rank,
                                  stack=cfg.init.stack))
        else:  # by name, as the single-device model would be, so every layout starts from the same weights
            init_parameters(module, seed=cfg.seed, std=cfg.init.std, residual_out=cfg.init.residual_out,
                            layers=cfg.init.layers, shard_of=shards.of, local_slice=tp.local_slice)
        return module if (fsdp or not ddp or mixed) else _wrap_data_parallel(module, ctx, cfg, shards)

    if par.compile and args.count_bytes and ctx.is_logger:
        print("scalec: --count-bytes runs the program uncompiled: a compiled region counts no bytes per call",
              flush=True)
    parts = (PipelineStages(model_cls, cfg, ctx, loss_fn, prepare, shards) if ctx.axis_size("pp") > 1
             else WholeModel(model_cls, cfg, ctx, prepare))
    every = [p for _, p in parts.named_parameters()]
    # bf16 data parallelism without FSDP: the main gradients laid in buckets, all-reduced in place (a whole model's
    # from the last backward's hooks, as DDP would; pipeline stages' after the schedule)
    reduce = None
    if mixed and _dp_kind(cfg, ctx) == "ddp":
        reduce = (ctx.batch_group, ctx.batch_size, {p for name, p in parts.named_parameters() if shards.expert(name)})
    opt, mains = (precision.mixed_adamw(every, parts.modules, cfg, _zero1_group(cfg, ctx), reduce) if mixed
                  else (_optimizer(every, cfg.optim, _zero1_group(cfg, ctx)), None))
    parts.mains = mains
    if isinstance(parts, PipelineStages):
        parts.pipe.mains = mains
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg))
    # Checkpoints hold the single-device model's tensors: this rank's modules, by name (module docstring).
    ckpt = cfg.checkpoint
    # Asynchronous checkpoints: DCP's writer thread coordinates the ranks over a gloo group used by nothing else
    # (a collective of the training on the same group from another thread would interleave with it).
    save_group = dist.new_group(backend="gloo") if ckpt.dir and ckpt.asynchronous else None
    saving = None  # runtime.checkpoint.Saving still being written in the background
    contract = _contract(cfg, ctx, args) if ckpt.dir else None
    with faults.op("loading the latest checkpoint", faults.scale("checkpoint_dir", "checkpoint_every")):
        start = (checkpoint.load_latest(ckpt.dir, parts.modules, opt, sched, ctx, cfg.steps, shards,
                                        contract=contract)
                 if ckpt.dir else 0)
    if skip_init and ctx.is_logger:
        print(f"scalec: init = from({cfg.init.path}) was not read: the run resumed from its checkpoint (step "
              f"{start}), whose weights it continues", flush=True)
    stop = min(cfg.steps, args.stop_after) if args.stop_after else cfg.steps
    # Listed once, not walked every step: the parameters keep their identity through the run (FSDP2 registers the
    # same sharded DTensors again at each reshard; checkpoints load in place).
    named = list(parts.named_parameters())
    named_once = list(parts.named_parameters(counted_once=True))
    params = [p for _, p in named]
    if mains is not None:  # what the gradient code reads: the main gradients (runtime.precision)
        named, named_once = mains.named(named), mains.named(named_once)
    partial = [(name, p) for name, p in named if shards.partial(name)]
    # DeepSeek-V3's expert biases (moe.ExpertBias), moved after each optimizer step: listed once, as the parameters
    biases = [m for module in parts.modules for m in module.modules() if isinstance(m, moe.ExpertBias)]

    # The batch is split over dp × ep ranks (ep is folded out of data parallelism).
    n_batch = ctx.batch_size
    dp = ctx.axis_size("dp")
    dp_group = ctx.mesh["dp"].get_group() if dp > 1 else None
    dense_group = ctx.dense_mesh.get_group() if fsdp else dp_group  # FSDP's shards of the dense weights
    expert_group = ctx.expert_group if ctx.expert_group is not None else dp_group  # the ranks holding our experts
    moe.set_aux_loss_scale(parts.aux_loss_scale)
    d = cfg.data
    ev = cfg.eval
    source = (data.Synthetic(d.vocab, d.seq_len, cfg.seed) if d.kind == "synthetic"
              else data.TokenFile(d.path, d.dtype, d.seq_len, cfg.seed, d.vocab, eval_split=ev.split,
                                  eval_sequences=ev.batches * d.global_batch if ev.every else 0, format=d.format))
    tokens_per_step = d.global_batch * d.seq_len
    # A resumed run (a restart after a failure) keeps the records up to its checkpoint and appends.
    metrics = progress.open_metrics(args.metrics, start) if (args.metrics and ctx.is_logger) else None
    speed = cfg.speed
    if ctx.is_logger:
        n = sum(tp.numel_full(p, name, shards) for name, p in parts.named_parameters(counted_once=True))
        print(f"scalec: {cfg.name} from {cfg.source}: {n:,} parameters{parts.where}, mesh "
              f"{' × '.join(f'{a}={k}' for a, k in par.axes)}{' (sequence parallel)' if par.sequence_parallel else ''}"
              f" on {ctx.world_size} {ctx.device.type} process(es), {cfg.steps} steps of {tokens_per_step:,} tokens",
              flush=True)
        for got in loaded:  # where the weights came from (`init = from(...)`), or nothing: initialised
            print(f"scalec: {got.describe()}", flush=True)
        if speed.flops_per_step and speed.peak_flops:
            predicted = f"; predicted {speed.predicted_step_s * 1e3:,.1f} ms/step" if speed.predicted_step_s else ""
            print(f"scalec: {speed.flops_per_step:.3e} model FLOP per step; MFU against the plan's device "
                  f"({speed.device}: {speed.peak_flops / 1e12:g} TFLOP/s peak per device){predicted}", flush=True)
    # TensorBoard, W&B, MLflow (rank 0; the others' calls do nothing): started with the plan and these settings
    track = (tracking.open_tracking(args, cfg, world_size=ctx.world_size, device=ctx.device.type, start=start,
                                    program=program, loaded=loaded) if ctx.is_logger else tracking.Tracking([]))
    # Peak memory: CUDA's allocator counters every step (cheap); the tracker only for --memory-report's last step.
    cuda = ctx.device.type == "cuda"
    if ctx.is_logger and not cuda:
        print("scalec: peak memory is measured on CUDA only"
              + (" (and by runtime.memory's tracker in the last step, --memory-report)" if args.memory_report
                 else ""), flush=True)
    run_peak, report = None, None  # this rank's largest measured peak; the --memory-report record
    losses = []
    job_start = progress.launch_time()
    clock, finished = progress.Clock(start), start
    loader = data.Prefetcher(lambda t: parts.batches(source, t), ctx.device, stop)
    vote = faults.StopVote(ctx.device)  # SIGTERM on any rank: all stop after the same step
    zero1 = _zero1_group(cfg, ctx) is not None  # its step broadcasts: timed (others are no collective: not marked)
    for step in range(start, stop):
        faults.set_step(step + 1)
        faults.test_hooks(ctx.rank, step + 1)
        vote.start()  # this step's preemption vote, read at its end
        moe.stats_reset()
        if args.count_bytes and step == stop - 1:
            collectives.count_bytes(True)
        log_now = (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps or step == start
        read_now = log_now or bool(args.metrics)  # the steps whose figures are read (a host-device sync)
        report_now = bool(args.memory_report) and step == stop - 1
        measure = memory.Measure(ctx.device, track=report_now, reread=fsdp) if (cuda or report_now) else None
        if measure is not None:
            measure.begin(params, [p.grad for _, p in named if p.grad is not None], memory.optimizer_tensors(opt))
            parts.measure = measure
        total = parts.step(loader.get(step))
        with faults.op("the expert and partial-gradient all-reduces over dp and tp",
                       faults.scale("axis ep", "axis tp")):
            if par.ep_shards and not fsdp:  # under FSDP the experts' own units reduce them (_shard_experts)
                moe.sync_expert_grads(named, shards.expert, expert_group, n_batch)
            tp.sync_partial_grads(partial, shards)
        if args.count_bytes and step == stop - 1:
            _write_counts(args.count_bytes, ctx)
        if args.dump_grads and step == start:
            _dump_grads(named, args.dump_grads, ctx, shards)
        with faults.op("the gradient-norm all-reduce (clipping)", faults.scale("grad_clip")):
            norm = tp.clip_grad_norm(named_once, cfg.optim.grad_clip, shards, expert_group, pp_group=parts.pp_group,
                                     scale=[p for _, p in named], dense_group=dense_group)
        with (faults.op("the optimizer step (zero1's parameter broadcasts over dp)",
                        faults.scale("data_parallel", "axis dp")) if zero1 else contextlib.nullcontext()):
            opt.step()  # zero1: each rank broadcasts the partition it updated
        if biases:  # moved against the step's load summed over the batch ranks
            with faults.op("the expert-load all-reduce (auxiliary-loss-free balancing)", faults.scale("axis ep")):
                moe.update_expert_bias(biases, ctx.batch_group)
        sched.step()
        opt.zero_grad(set_to_none=True)
        finished = step + 1
        peak = None
        if measure is not None:
            measure.end()
            parts.measure = None
            run_peak = max(run_peak or 0, measure.peak)
            if report_now:
                report = measure.record(ctx.rank, ctx.coords)
            if read_now:  # every rank joins (the same condition everywhere)
                with faults.op("the peak-memory all-reduce (MAX over ranks)", faults.scale()):
                    peak = memory.largest(measure.peak, ctx)
        # After the step's optimizer update and its measurement, before its record: steps N, 2N, ... and the last.
        # Its time is not the step's: the clock skips it (the step's queued device work finished first).
        evaluated = None
        if ev.every and ((step + 1) % ev.every == 0 or step + 1 == cfg.steps):
            if cuda:
                torch.cuda.synchronize(ctx.device)
            began = time.perf_counter()
            evaluated = progress.eval_record(step + 1, evaluate(parts, source, cfg, ctx))
            clock.skip(time.perf_counter() - began)
        if read_now:
            faults.test_hooks(ctx.rank, step + 1, "loss")
            if n_batch > 1:  # the logged loss is the mean over the global batch
                with faults.op("the loss all-reduce over the batch ranks", faults.scale("axis dp", "axis ep")):
                    dist.all_reduce(total, op=dist.ReduceOp.SUM, group=ctx.batch_group)
                total /= n_batch
            with faults.device_wait("reading the step's loss"):
                loss_value, norm_value = total.item(), float(norm)
            losses.append(loss_value)
            dt = clock.lap(step + 1)  # mean seconds per step since the last read
            # Every rank joins the (small) reduction of the MoE counters; each layer counted once (tp ranks repeat it).
            with faults.op("the MoE statistics all-reduces over all ranks", faults.scale("axis ep")):
                experts = moe.stats_read(ctx.device, duplicates=ctx.axis_size("tp")) if cfg.moe else None
            record = {"step": step + 1, "loss": loss_value, "grad_norm": norm_value, "lr": sched.get_last_lr()[0],
                      "step_time": dt, "tokens_per_s": tokens_per_step / dt,
                      **progress.speed_figures(speed, ctx.world_size, dt),
                      "elapsed_s": time.time() - job_start, "eta_s": dt * (stop - step - 1)}
            if experts:
                record.update({f"moe_{k}": v for k, v in experts.items()})
            if peak:
                record.update(peak_memory_bytes=peak[0], peak_memory_rank=peak[1])
            if evaluated:  # the step's record gains eval_loss and eval_ppl
                record.update({k: v for k, v in evaluated.items() if k != "step"})
            if metrics:
                metrics.write(json.dumps(record) + "\n")
                metrics.flush()
            track.log(step + 1, progress.train_scalars(record))
            if ctx.is_logger and log_now:
                print(progress.log_line(record, cfg.steps), flush=True)
        if evaluated:  # below the step's own line, logged or not
            if ctx.is_logger:
                print(progress.eval_line(evaluated, cfg.steps), flush=True)
            if not read_now:  # else its scalars went with the step's record
                track.log(step + 1, progress.train_scalars(evaluated))
        preempted = vote.result()
        if ckpt.dir and ((ckpt.every and (step + 1) % ckpt.every == 0) or step + 1 == stop or preempted):
            with faults.op("saving the checkpoint", faults.scale("checkpoint_dir", "checkpoint_every")):
                if saving is not None:  # one in flight at a time: the previous one finishes first
                    saving.finish()
                # a run ends only once its last checkpoint is on disk: the last save (the loop's last step, or
                # SIGTERM's, which breaks out) is finished here, so none is left in flight after the loop
                last = step + 1 == stop or preempted
                saving = checkpoint.begin(ckpt.dir, step + 1, parts.modules, opt, sched, ctx, cfg.steps, shards,
                                          skip_on_save=parts.tied_elsewhere, group=None if last else save_group,
                                          run=contract.record)
                if last or save_group is None:
                    saving.finish()
                    saving = None
        if preempted:
            if ctx.is_logger:
                print(f"scalec: stopped by {faults.stop_signal()} after step {step + 1}"
                      + (f"; checkpoint saved in {ckpt.dir}" if ckpt.dir else
                         " (no checkpoint_dir: nothing saved)"), flush=True)
            break
    loader.close()
    faults.save_weights_if_asked(lambda: parts.named_parameters(counted_once=True), ctx)
    measured = {}  # what the trackers' summary gets beside what they saw logged
    if run_peak is not None:  # measured on every rank or on none
        with faults.op("the peak-memory all-reduce (MAX over ranks)", faults.scale()):
            peak, at = memory.largest(run_peak, ctx)
        measured = {"peak_memory_bytes": peak, "peak_memory_rank": at}
        if ctx.is_logger:
            print("scalec: " + memory.summary(cfg.memory.predicted_peak_bytes, cfg.memory.device_bytes, peak, at,
                                               "" if cuda else "the last step, runtime.memory's tracker"), flush=True)
    if report is not None:
        with faults.op("gathering the memory report", faults.scale()):
            memory.write_report(args.memory_report, report, ctx, stop, cfg.memory.predicted_peak_bytes,
                                cfg.memory.device_bytes)
    if ctx.is_logger:
        print(f"scalec: done in {time.time() - job_start:.1f} s since the job started "
              f"({finished - start} step(s) in {time.perf_counter() - clock.t_loop:.1f} s)", flush=True)
    if metrics:
        metrics.close()
    track.finish(measured)
    return losses


