"""The training loop every generated program runs: mesh, data parallelism, optimizer, schedule, logging, checkpoints.

Generated programs call `main(Model, CONFIG)`. Flags on the command line override a few settings for experiments
and tests: `--steps`, `--metrics FILE` (one JSON line per step on rank 0), `--dump-grads FILE` (the full
gradients after the first backward, on rank 0), `--seed`.
"""
from __future__ import annotations

import argparse
import sys
import traceback
import contextlib
import json
import math
import os
import time
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch import nn

from runtime import checkpoint, collectives, data, faults, mesh, moe
from runtime import tensor_parallel as tp
from runtime.layers import Repeat, init_parameters


@dataclass(frozen=True, kw_only=True)
class Config:
    """Everything the compiler decided that the runtime needs; written out literally in the generated program."""

    name: str
    """Model name, from `model NAME` in the .scale file."""
    source: str
    """The .scale file this program was generated from."""
    axes: tuple
    """Mesh axes ((name, size), ...), outermost first."""
    data_parallel: str
    """`ddp` or `fsdp` over the dp axis."""
    micro_batches: int
    """Gradient-accumulation micro-batches per optimizer step on each dp rank."""
    global_batch: int
    """Sequences per optimizer step over all dp ranks."""
    seq_len: int
    """Tokens per sequence."""
    vocab: int
    """Vocabulary size (for the synthetic task)."""
    steps: int
    """Optimizer steps."""
    seed: int
    """Seed of initialisation and data."""
    precision: str
    """`fp32` or `bf16` (autocast; weights, gradients and optimizer state stay fp32)."""
    lr: float
    betas: tuple
    weight_decay: float
    eps: float
    schedule: str
    """`cosine` or `constant`, after `warmup` linear steps."""
    warmup: int
    min_lr: float
    grad_clip: float
    """Clip the global gradient norm to this; 0 turns clipping off."""
    data: str
    """`synthetic` or `tokens`."""
    data_path: str
    """The token file: relative to the program's directory (main's `program`), or absolute."""
    data_dtype: str
    log_every: int
    checkpoint_dir: str
    checkpoint_every: int
    init_std: float
    """Standard deviation of weight initialisation."""
    residual_out: tuple
    """Linears writing into the residual stream; their initialisation is scaled by 1/sqrt(2·layers)."""
    layers: int
    """Number of blocks (for that scaling)."""
    tp_shards: tuple = ()
    """Parameters sharded over tp: (name pattern, dim, full size of that dim)."""
    tp_partial_grads: tuple = ()
    """Parameters whose gradients are partial over tp (sequence parallelism): summed after backward."""
    pp_schedule: str = "1f1b"
    """Pipeline schedule over pp: gpipe, 1f1b, interleaved-1f1b, zero-bubble."""
    virtual_stages: int = 1
    """Pipeline stages per pp rank."""
    tied_embedding: bool = False
    """The LM head reuses the embedding: under pp its two copies' gradients are summed."""
    ep_shards: tuple = ()
    """Expert weights sharded over ep: (name pattern, dim, full size); their gradients are summed over dp only (the
    all-to-all backward already brought every ep rank's tokens' contributions), then divided by dp × ep."""
    moe: bool = False
    """The model has Mixture-of-Experts layers: log dropped tokens, expert load and the auxiliary loss."""
    timeout: float = 600.0
    """Seconds a collective may take before the watchdog ends the job naming it (runtime.faults); 0: no watchdog."""


def _parse_args(cfg: Config) -> tuple[Config, argparse.Namespace]:
    p = argparse.ArgumentParser(description=f"Train {cfg.name} (generated from {cfg.source}). Run under torchrun.")
    p.add_argument("--steps", type=int, help=f"optimizer steps (default {cfg.steps})")
    p.add_argument("--seed", type=int, help=f"seed (default {cfg.seed})")
    p.add_argument("--metrics", help="write one JSON line per step to this file (rank 0)")
    p.add_argument("--dump-grads", help="save the full gradients after the first backward to this file (rank 0)")
    p.add_argument("--checkpoint-dir", help="override the checkpoint directory")
    p.add_argument("--stop-after", type=int, metavar="N",
                   help="stop after N steps of the run (checkpointing then), as an interruption would")
    p.add_argument("--count-bytes", metavar="FILE",
                   help="count the bytes of every runtime collective during the last step (the steady state, after "
                        "one-time work such as pipeline shape inference); write JSON (rank 0)")
    p.add_argument("--debug", action="store_true", help="on failure, print the traceback after the one-line cause")
    args = p.parse_args()
    overrides = {k: v for k, v in (("steps", args.steps), ("seed", args.seed),
                                   ("checkpoint_dir", args.checkpoint_dir)) if v is not None}
    return replace(cfg, **overrides), args


def lr_lambda(cfg: Config):
    """Multiplier of the peak learning rate at each step: linear warm-up, then constant or cosine to min_lr."""
    def f(step: int) -> float:
        if step < cfg.warmup:
            return (step + 1) / (cfg.warmup + 1)
        if cfg.schedule == "constant":
            return 1.0
        progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
        floor = cfg.min_lr / cfg.lr
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return f


def _wrap_data_parallel(model: nn.Module, ctx: mesh.Context, cfg: Config, shards: tp.Shards) -> nn.Module:
    if ctx.batch_size == 1:
        return model
    if cfg.data_parallel == "fsdp" and ctx.axis_size("dp") > 1:  # the compiler refuses fsdp with ep
        group_mesh = ctx.mesh["dp"]
        from torch.distributed.fsdp import fully_shard
        # ZeRO-3: each block is one unit (gathered for its forward and backward, then freed), the rest is the root.
        for child in model.children():
            if isinstance(child, Repeat):
                for block in child.values():
                    fully_shard(block, mesh=group_mesh)
        fully_shard(model, mesh=group_mesh)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP
    # Dense weights: averaged over every batch shard (dp × ep). Experts sharded over ep are left to
    # moe.sync_expert_grads, over dp only.
    experts = [name for name, _ in model.named_parameters() if shards.expert(name)]
    if experts:
        DDP._set_params_and_buffers_to_ignore_for_model(model, experts)
    return DDP(model, process_group=ctx.batch_group,
               device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)


def _average_dense_grads(named_params, ctx: mesh.Context, shards: tp.Shards) -> None:
    """Data parallelism of pipeline stages: the mean over the dp × ep batch shards of every gradient but the
    experts' (moe.sync_expert_grads), as one coalesced all-reduce after the pipeline step."""
    if ctx.batch_size == 1:
        return
    grads = [p.grad for name, p in named_params if p.grad is not None and not shards.expert(name)]
    flat = torch._utils._flatten_dense_tensors(grads)
    dist.all_reduce(flat, group=ctx.batch_group)
    flat /= ctx.batch_size
    for g, avg in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
        g.copy_(avg)


def _dp_sync(model, sync: bool) -> str:
    if not sync or not hasattr(model, "no_sync") and not hasattr(model, "set_requires_gradient_sync"):
        return "no data-parallel collective"
    return ("with FSDP's gradient reduce-scatter over dp" if hasattr(model, "set_requires_gradient_sync")
            else "with DDP's gradient all-reduce over the batch ranks")


def _optimizer(params: list, cfg: Config) -> torch.optim.Optimizer:
    # As Megatron does: no weight decay on biases and norm scales (the 1-D parameters).
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)


def _dump_grads(named_params, path: str, ctx: mesh.Context, shards: tp.Shards) -> None:
    """Whole gradients (gathered over dp, tp and ep); under pp each stage's rank writes `path.ppN`."""
    grads = tp.full_grads(named_params, shards)
    if ctx.axis_size("pp") > 1:
        if all(ctx.coords.get(a, 0) == 0 for a in ("dp", "tp", "ep")):
            torch.save(grads, f"{path}.pp{ctx.coords['pp']}")
    elif ctx.is_logger:
        torch.save(grads, path)


def _write_counts(path: str, ctx: mesh.Context) -> None:
    counts = {f"{op}/{axis}": n for (op, axis), n in sorted(collectives.BYTES.items())}
    collectives.count_bytes(False)
    if ctx.is_logger:
        with open(path, "w") as f:
            json.dump(counts, f, indent=2, sort_keys=True)


def _open_metrics(path: str, start: int):
    """The metrics file, appended to: the records of steps up to `start` (those a resumed run continues from) are
    kept, later ones (written after that checkpoint by the run that was interrupted) dropped, so that every step has
    one record; a run from step 0 starts the file afresh."""
    kept = []
    if start and os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    if json.loads(line)["step"] <= start:
                        kept.append(line if line.endswith("\n") else line + "\n")
                except (ValueError, KeyError, TypeError):  # a line cut short by a kill
                    pass
    f = open(path, "w")
    f.writelines(kept)
    f.flush()
    return f


def _autocast(cfg: Config, ctx: mesh.Context):
    """The context every forward runs in: bf16 autocast (weights, gradients, optimizer state stay fp32)."""
    return (torch.autocast(ctx.device.type, dtype=torch.bfloat16) if cfg.precision == "bf16"
            else contextlib.nullcontext())


def main(model_cls, cfg: Config, loss_fn=None, program: str | None = None) -> None:
    """Train; `model_cls` is the whole model, or under pp the Stage class and `loss_fn` the last stage's loss.
    `program` is the generated program's file: a relative data path is relative to its directory."""
    cfg, args = _parse_args(cfg)
    cfg = replace(cfg, data_path=data.resolve(cfg.data_path, program))
    ctx = mesh.setup(cfg.axes, cfg.timeout)
    code = 0
    try:
        run(model_cls, cfg, ctx, args, loss_fn)
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
        mesh.shutdown(code)


def run(model_cls, cfg: Config, ctx: mesh.Context, args, loss_fn=None) -> list[float]:
    torch.manual_seed(cfg.seed)
    shards = tp.Shards(cfg.tp_shards, cfg.tp_partial_grads, cfg.ep_shards)
    fsdp = cfg.data_parallel == "fsdp" and ctx.axis_size("dp") > 1

    def prepare(module: nn.Module, ddp: bool = True) -> nn.Module:
        if fsdp:  # shard while still on meta: no rank ever holds more than its share of the weights
            module = _wrap_data_parallel(module, ctx, cfg, shards)
        module.to_empty(device=ctx.device)
        # Initialise by name, as the single-device model would be, so every layout starts from the same weights.
        init_parameters(module, seed=cfg.seed, std=cfg.init_std, residual_out=cfg.residual_out, layers=cfg.layers,
                        shard_of=shards.of, local_slice=tp.local_slice)
        return module if (fsdp or not ddp) else _wrap_data_parallel(module, ctx, cfg, shards)

    pipe = None
    if ctx.axis_size("pp") > 1:
        from runtime.pipeline import TIED as pipeline_tied, Pipeline
        # Without DDP: its pipelining hook fails a reducer assert when micro-batches = pp (torch 2.13); the
        # stages' dense gradients are averaged after the step instead (_average_dense_grads).
        pipe = Pipeline(model_cls, cfg, ctx, loss_fn, lambda module: prepare(module, ddp=False),
                        autocast=lambda: _autocast(cfg, ctx))
        model = None
        all_named, norm_named = pipe.all_named_parameters, pipe.named_parameters
    else:
        with torch.device("meta"):
            model = model_cls()
        model = prepare(model)
        all_named = norm_named = model.named_parameters
    pp_group = ctx.mesh["pp"].get_group() if pipe else None
    opt = _optimizer([p for _, p in all_named()], cfg)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg))
    # Checkpoints hold the single-device model's tensors: this rank's modules, by name (module docstring).
    modules = pipe.modules if pipe is not None else [model]
    tied_elsewhere = (pipeline_tied,) if pipe is not None and pipe.tie is not None and not pipe.holds_first else ()
    start = (checkpoint.load_latest(cfg.checkpoint_dir, modules, opt, sched, ctx, cfg.steps, shards)
             if cfg.checkpoint_dir else 0)
    stop = min(cfg.steps, args.stop_after) if args.stop_after else cfg.steps

    # The batch is split over dp × ep ranks (ep is folded out of data parallelism).
    n_batch, batch_rank = ctx.batch_size, ctx.batch_rank
    dp = ctx.axis_size("dp")
    dp_group = ctx.mesh["dp"].get_group() if dp > 1 else None
    # The auxiliary MoE loss is scaled like each micro-batch's loss: 1/m here, by the pipeline schedule under pp.
    moe.set_aux_loss_scale(1.0 if pipe is not None else 1.0 / cfg.micro_batches)
    source = (data.Synthetic(cfg.vocab, cfg.seq_len, cfg.seed) if cfg.data == "synthetic"
              else data.TokenFile(cfg.data_path, cfg.data_dtype, cfg.seq_len, cfg.seed, cfg.vocab))
    autocast = _autocast(cfg, ctx)
    tokens_per_step = cfg.global_batch * cfg.seq_len
    # A resumed run (a restart after a failure) keeps the records up to its checkpoint and appends.
    metrics = _open_metrics(args.metrics, start) if (args.metrics and ctx.is_logger) else None
    if ctx.is_logger:
        n = sum(tp.numel_full(p, name, shards) for name, p in norm_named())
        where = " in rank 0's pipeline stages" if pipe else ""
        print(f"scalec: {cfg.name} from {cfg.source}: {n:,} parameters{where}, mesh "
              f"{' × '.join(f'{a}={k}' for a, k in cfg.axes)} on {ctx.world_size} {ctx.device.type} process(es), "
              f"{cfg.steps} steps of {tokens_per_step:,} tokens", flush=True)
    losses = []
    t_start = time.perf_counter()
    for step in range(start, stop):
        t0 = time.perf_counter()
        faults.set_step(step + 1)
        faults.test_hooks(ctx.rank, step + 1)
        moe.stats_reset()
        if args.count_bytes and step == stop - 1:
            collectives.count_bytes(True)
        total = torch.zeros((), device=ctx.device)
        if pipe is not None:  # the schedule splits this rank's batch into the micro-batches itself
            tokens, targets = data.micro_batch(source, step, cfg.global_batch, batch_rank, n_batch, 0, 1)
            with faults.op("the pipeline schedule (sends and receives between stages over pp)"):
                total = pipe.step(tokens.to(ctx.device), targets.to(ctx.device))
            if not fsdp:
                with faults.op("the gradient all-reduce over the batch ranks (data parallelism of stages)"):
                    _average_dense_grads(all_named(), ctx, shards)
        for j in range(cfg.micro_batches if pipe is None else 0):
            tokens, targets = data.micro_batch(source, step, cfg.global_batch, batch_rank, n_batch, j,
                                               cfg.micro_batches)
            with faults.device_wait("copying the micro-batch to the device"):
                tokens, targets = tokens.to(ctx.device), targets.to(ctx.device)
            sync = j == cfg.micro_batches - 1
            no_sync = model.no_sync() if (not sync and hasattr(model, "no_sync")) else contextlib.nullcontext()
            if hasattr(model, "set_requires_gradient_sync"):  # FSDP2: reduce-scatter only on the last micro-batch
                model.set_requires_gradient_sync(sync)
            with no_sync:
                with autocast:
                    loss = model(tokens, targets) / cfg.micro_batches
                with faults.op(f"the backward ({_dp_sync(model, sync)})"):
                    loss.backward()
            total += loss.detach()
        with faults.op("the expert and partial-gradient all-reduces over dp and tp"):
            if cfg.ep_shards:
                moe.sync_expert_grads(all_named(), shards.expert, dp_group, n_batch)
            tp.sync_partial_grads(all_named(), shards)
        if args.count_bytes and step == stop - 1:
            _write_counts(args.count_bytes, ctx)
        if args.dump_grads and step == start:
            _dump_grads(all_named(), args.dump_grads, ctx, shards)
        with faults.op("the gradient-norm all-reduce (clipping)"):
            norm = tp.clip_grad_norm(norm_named(), cfg.grad_clip, shards, dp_group, pp_group=pp_group,
                                     scale=[p for _, p in all_named()])
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if n_batch > 1:  # the logged loss is the mean over the global batch
            with faults.op("the loss all-reduce over the batch ranks"):
                dist.all_reduce(total, op=dist.ReduceOp.SUM, group=ctx.batch_group)
            total /= n_batch
        vote = faults.StopVote(ctx.device)  # SIGTERM on any rank: all stop after this step (read below)
        with faults.device_wait("reading the step's loss"):
            loss_value = total.item()
        losses.append(loss_value)
        dt = time.perf_counter() - t0
        log_now = (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps or step == start
        # Every rank joins the (small) reduction of the MoE counters; each layer counted once (tp ranks repeat it).
        experts = (moe.stats_read(ctx.device, duplicates=ctx.axis_size("tp"))
                   if cfg.moe and (log_now or args.metrics) else None)
        if metrics:
            record = {"step": step + 1, "loss": loss_value, "grad_norm": float(norm), "lr": sched.get_last_lr()[0],
                      "step_time": dt, "tokens_per_s": tokens_per_step / dt}
            if experts:
                record.update({f"moe_{k}": v for k, v in experts.items()})
            metrics.write(json.dumps(record) + "\n")
            metrics.flush()
        if ctx.is_logger and log_now:
            moe_text = (f" | dropped {experts['dropped']:,}/{experts['routed']:,} choices | max expert load "
                        f"{experts['max_load']:.2f}× | aux {experts['aux_loss']:.4f}" if experts else "")
            print(f"step {step + 1:>5}/{cfg.steps} | loss {loss_value:8.4f} | lr {sched.get_last_lr()[0]:.3e} | "
                  f"grad-norm {float(norm):7.3f} | {tokens_per_step / dt:10,.0f} tok/s | {dt * 1000:7.1f} ms/step"
                  + moe_text, flush=True)
        preempted = vote.result()
        if cfg.checkpoint_dir and ((cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0)
                                   or step + 1 == stop or preempted):
            with faults.op("saving the checkpoint"):
                checkpoint.save(cfg.checkpoint_dir, step + 1, modules, opt, sched, ctx, cfg.steps, shards,
                                skip_on_save=tied_elsewhere)
        if preempted:
            if ctx.is_logger:
                print(f"scalec: stopped by SIGTERM after step {step + 1}"
                      + (f"; checkpoint saved in {cfg.checkpoint_dir}" if cfg.checkpoint_dir else
                         " (no checkpoint_dir: nothing saved)"), flush=True)
            break
    faults.save_weights_if_asked(norm_named, ctx)
    if ctx.is_logger:
        print(f"scalec: done in {time.perf_counter() - t_start:.1f} s", flush=True)
    if metrics:
        metrics.close()
    return losses


