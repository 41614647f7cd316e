"""The optimizer of a run, its learning-rate schedule and gradient clipping (torchtitan's `build_optimizers`,
`build_lr_schedulers`): AdamW; under zero1 torch's ZeroRedundancyOptimizer over the ZeRO group; under bf16
without FSDP runtime.precision's MasterAdamW beside the main gradients; under `offload = optimizer`
runtime.offload's HostAdamW (its share of the state on the host) in place of the last two. Which of them a plan takes reads the
data-parallel mode's properties (runtime.config.Parallel: `zero_stage`, `shards_grads`), never its name.
"""
from __future__ import annotations

import torch

from runtime import mesh, offload, precision, resume
from runtime import tensor_parallel as tp
from runtime.config import Config, Optim


def lr_lambda(cfg: Config, anchor: int | None = None):
    """Multiplier of the peak learning rate at each step: linear warm-up, then constant or cosine to min_lr at step
    `anchor` (default the run's last, cfg.steps; runtime.resume: an extended run may keep its old anchor)."""
    opt = cfg.optim
    end = cfg.steps if anchor is None else anchor

    def f(step: int) -> float:
        return resume.multiplier(step, schedule=opt.lr_schedule, warmup=opt.warmup, lr=opt.lr, min_lr=opt.min_lr,
                                 anchor=end)
    return f


def adamw(params: list, opt: Optim, zero_group=None) -> torch.optim.Optimizer:
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


def zero1_group(cfg: Config, ctx: mesh.Context):
    """The group zero1 partitions AdamW's state over: dp, or None (ZeRO stage other than 1, or dp = 1). With ep too,
    dp alone: the ranks of a dp group hold the same parameters, the experts included, so each owns whole ones and
    broadcasts them there; the dense state stays replicated over ep (Megatron's distributed optimizer shards it
    over dp × ep: a known difference the memory model counts)."""
    if cfg.parallel.zero_stage != 1:
        return None
    if ctx.axis_size("cp") > 1:  # dp × cp: cp ranks hold the same parameters and gradients (with ep, the experts'
        # group: ep ranks hold other experts)
        return ctx.expert_group if ctx.axis_size("ep") > 1 else ctx.batch_group
    return ctx.mesh["dp"].get_group()


def build(parts, cfg: Config, ctx: mesh.Context, shards: tp.Shards, mixed: bool):
    """The optimizer over every parameter of `parts` (runtime.model_parts), its main gradients (`mixed`: bf16
    without FSDP, runtime.precision; else None) and its learning-rate scheduler. Under bf16 with replicated data
    parallelism the main gradients are laid in buckets, all-reduced in place over the batch ranks (a whole model's
    from the last backward's hooks, as DDP would; pipeline stages' after the schedule)."""
    every = [p for _, p in parts.named_parameters()]
    zero_group = zero1_group(cfg, ctx)
    host = cfg.parallel.offload == "optimizer"  # a share of the state on the host (runtime.offload.HostAdamW)
    if mixed:
        reduce = None
        if ctx.batch_size > 1 and not cfg.parallel.shards_grads:
            reduce = (ctx.batch_group, ctx.batch_size,
                      {p for name, p in parts.named_parameters() if shards.expert(name)})
        if host:  # precision.mixed_adamw's main gradients and masters, the masters stepped by HostAdamW
            masters = precision.to_compute(parts.modules)
            mains = precision.MainGrads(every, precision.grad_dtype(cfg.parallel.grad_reduce), reduce=reduce,
                                        bucket_bytes=cfg.parallel.ddp_bucket_mb * 2**20)
            opt = host_adamw(every, cfg, zero_group, masters)
        else:
            opt, mains = precision.mixed_adamw(every, parts.modules, cfg, zero_group, reduce)
    else:
        opt = host_adamw(every, cfg, zero_group) if host else adamw(every, cfg.optim, zero_group)
        mains = None
    return opt, mains, torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg))


def host_adamw(params: list, cfg: Config, zero_group=None, masters=None) -> offload.HostAdamW:
    """`offload = optimizer(fraction)`: AdamW with that share of this rank's state on the host (runtime.offload),
    its own ZeRO partition under zero1 (`zero_group`), over bf16's fp32 `masters` where given."""
    opt = cfg.optim
    return offload.HostAdamW(precision.decay_groups(params, opt.weight_decay), lr=opt.lr, betas=opt.betas,
                             eps=opt.eps, fraction=cfg.parallel.offload_fraction, masters=masters,
                             shard_group=zero_group)


class Clipping:
    """Gradient clipping at `Optim.grad_clip` over the norm of the whole model's gradient (runtime.tensor_parallel.
    clip_grad_norm), summed over the groups that hold its pieces: the dense gradients' FSDP shards (the dense mesh
    under zero2 and fsdp, else dp), the experts' holders, and the pipeline row."""

    def __init__(self, cfg: Config, ctx: mesh.Context, shards: tp.Shards, pp_group=None):
        dp_group = ctx.mesh["dp"].get_group() if ctx.axis_size("dp") > 1 else None
        self.dense_group = ctx.dense_mesh.get_group() if cfg.parallel.shards_grads else dp_group
        self.expert_group = ctx.expert_group if ctx.expert_group is not None else dp_group  # holding our experts
        self.max_norm, self.shards, self.pp_group = cfg.optim.grad_clip, shards, pp_group

    def __call__(self, named_once: list, named: list) -> torch.Tensor:
        """Clip the gradients of `named` (every parameter this rank holds) by the norm over `named_once` (each
        counted once: without the tied copies); returns the norm, on the device."""
        return tp.clip_grad_norm(named_once, self.max_norm, self.shards, self.expert_group, pp_group=self.pp_group,
                                 scale=[p for _, p in named], dense_group=self.dense_group)
