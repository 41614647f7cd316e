"""A plan's parallelism applied to a model this rank holds (torchtitan's `parallelize`): each block's recomputation
and compilation, bf16's activation policy, and the data-parallel wrapper over the batch ranks: FSDP2 for the ZeRO
stages that shard gradients (zero2, fsdp; `Parallel.shards_grads`), DDP for the replicated ones (ddp, zero1). The
tensor- and expert-parallel shards are in the generated program's code and in each rank's initialisation (its
slice of every tensor: runtime.layers.init_parameters, runtime.hf); here only the experts' own FSDP units read them.

Also the data-parallel gradient sync of pipeline stages (no DDP: `average_dense_grads`) and the `.scale` lines and
words the watchdog gives the data-parallel collectives (`site`, `sync_phrase`).
"""
from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch import nn

from runtime import compile, faults, fp8, mesh, moe, moe_nodes, offload, precision, rebalance, recompute
from runtime import tensor_parallel as tp
from runtime.config import Config
from runtime.layers import Repeat


def apply_recompute(module: nn.Module, mode: str) -> nn.Module:
    """Set the recomputation `mode` of every runtime.layers.Repeat in `module` (a whole model or a pipeline stage):
    each block then runs under runtime.recompute.run_block."""
    if mode not in recompute.MODES:
        raise ValueError(f"recompute must be one of {', '.join(recompute.MODES)}, not {mode!r}")
    for m in module.modules():
        if isinstance(m, Repeat):
            m.recompute = mode
    return module


def apply(module: nn.Module, cfg: Config, ctx: mesh.Context, shards: tp.Shards, compiled: bool) -> nn.Module:
    """What is applied to `module` while it is still on the meta device: recomputation, then (`compiled`)
    compilation of its regions, bf16's fp32 residual, and FSDP2 when the plan shards gradients (sharded before
    anything is materialised: no rank ever holds more than its share of the weights)."""
    par = cfg.parallel
    moe_nodes.set_fp8(bool(cfg.fp8))  # the node dispatch's rows in FP8 under precision = fp8
    if cfg.fp8:  # torchao's Float8Linears in place of the chosen linears, before anything wraps them
        names = fp8.convert(module, cfg.fp8, cfg.fp8_filter, gathers_fp8(cfg, ctx),
                            row_parallel=lambda n: _row_parallel(shards, n))
        if ctx.is_logger:
            print(fp8.summary(cfg.fp8, cfg.fp8_filter, names, gathers_fp8(cfg, ctx)), flush=True)
    apply_recompute(module, par.recompute)  # each block of a repeat, whole model or pipeline stage
    if compiled:
        compile.apply(module)
    if cfg.precision == "bf16":  # the fp32 residual, if asked (before wrapping)
        precision.apply_policy(module, par.fp32_residual)
    if par.offload == "activations":  # each block's saved tensors to the host (runtime.offload)
        offload.install(module, par.offload_modules)
    if par.shards_grads:
        module = wrap_data_parallel(module, ctx, cfg, shards)
    return module


def gathers_fp8(cfg: Config, ctx: mesh.Context) -> bool:
    """Whether FSDP2 all-gathers the FP8 linears' weights in FP8 (runtime.fp8.gathers_fp8) on this run."""
    return bool(cfg.fp8) and fp8.gathers_fp8(cfg.fp8, cfg.parallel.shards_grads and ctx.batch_size > 1)


def _row_parallel(shards: tp.Shards, name: str) -> bool:
    """Whether parameter `name` is a row-parallel weight: sharded over tp along its input dim."""
    s = shards.of(name)
    return s is not None and s[2] == "tp" and s[0] == 1


def wrap_data_parallel(model: nn.Module, ctx: mesh.Context, cfg: Config, shards: tp.Shards) -> nn.Module:
    """`model` under its data parallelism over the batch ranks: FSDP2 (zero2, fsdp) or DDP (ddp, zero1); as it is
    on one batch rank."""
    if ctx.batch_size == 1:
        return model
    if cfg.parallel.shards_grads:
        return _fully_shard(model, ctx, cfg, shards)
    from torch.nn.parallel import DistributedDataParallel as DDP
    # Dense weights: averaged over every batch shard (dp × ep). Experts sharded over ep are left to
    # moe.sync_expert_grads, over dp only.
    experts = [name for name, _ in model.named_parameters() if shards.expert(name)]
    # DeepSeek-V3's expert biases and loads (moe.ExpertBias): each rank counts its own tokens' load, and the biases
    # move alike on every rank (moe.update_expert_bias); DDP's broadcast of rank 0's buffers would overwrite both
    experts += [f"{where}.{b}" for where, m in model.named_modules() if isinstance(m, moe.ExpertBias)
                for b in ("bias", "load")]
    # re-placed experts' placement and loads (runtime.rebalance.Slots): each rank counts its own, summed when used
    experts += [f"{where}.{b}" for where, m in model.named_modules() if isinstance(m, rebalance.Slots)
                for b in ("slot_expert", "load", "slot_load")]
    if experts:
        DDP._set_params_and_buffers_to_ignore_for_model(model, experts)
    with faults.op("DDP's start-up (the parameters broadcast from rank 0 over the batch ranks)", site(False)):
        return DDP(model, process_group=ctx.batch_group, bucket_cap_mb=cfg.parallel.ddp_bucket_mb,
                   device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)


def _fully_shard(model: nn.Module, ctx: mesh.Context, cfg: Config, shards: tp.Shards) -> nn.Module:
    """FSDP2 over the dense mesh: dp, dp × ep or dp × cp (torchtitan's folding: the dense weights shard over
    both; FSDP2 divides the reduce-scattered gradients by its mesh's size, the batch group's under cp).

    ZeRO-3 (fsdp): each block is one unit (gathered for its forward, freed, gathered again for its backward,
    freed), the rest is the root.
    ZeRO-2 (zero2): the same units with reshard_after_forward=False: a unit gathered for its forward stays
    gathered until its backward (no second all-gather), gradients are reduce-scattered and AdamW's state is
    the dp shard's. What a rank holds: at rest (between steps, and between micro-batches: FSDP2 reshards
    after backward) its 1/dp shard of the weights, gradients and optimizer state, as fsdp; at the backward's
    peak every unit's whole weights (gathered in forward, not yet freed) beside the sharded gradients and
    optimizer state: what ZeRO-2 holds (whole weights, 1/dp of the rest), plus the one unit's whole gradient
    waiting for its reduce-scatter."""
    from torch.distributed.fsdp import fully_shard
    group_mesh = ctx.dense_mesh
    reshard = cfg.parallel.shards_params
    # FSDP2 warns, on every rank, that a unit returning a view (the last pipeline stage's logits, flattened)
    # would lose its pre-backward hook to an in-place op on it: the schedule only sends a stage's output or
    # gives it to the loss, out of place (tests/e2e runs fail on any warning printed).
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor",
                            category=UserWarning)
    blocks = [block for child in model.children() if isinstance(child, Repeat) for block in child.values()]
    # bf16: FSDP2 gathers bf16 weights from the fp32 shards (the masters) and reduces in grad_reduce's dtype
    mp = ({"mp_policy": precision.fsdp_policy(cfg.parallel.grad_reduce, cfg.parallel.fp32_residual)}
          if cfg.precision == "bf16" else {})
    if cfg.parallel.offload == "params":  # shards, gradients and AdamW's state on the host (pinned on CUDA)
        from torch.distributed.fsdp import CPUOffloadPolicy
        mp["offload_policy"] = CPUOffloadPolicy(pin_memory=ctx.device.type == "cuda")
    _shard_experts(model, ctx, shards, reshard, mp)
    for block in blocks:
        fully_shard(block, mesh=group_mesh, reshard_after_forward=reshard, **mp)
    fully_shard(model, mesh=group_mesh, reshard_after_forward=reshard, **mp)
    if gathers_fp8(cfg, ctx):  # gloo has no float8 dtypes: the FP8 gathers move bytes
        # counted under the ledger's name of the dense group: dp, dp×cp, dp×ep or dp×cp×ep (compiler/cost)
        fp8.on_gloo(blocks + [model],  # the dense units (the experts' hold no FP8 weight)
                    "×".join(a for a in ("dp", "cp", "ep") if ctx.axis_size(a) > 1) or "dp")
    fsdp_prefetch(blocks, cfg.parallel.fsdp_prefetch)
    return model


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


def fsdp_prefetch(blocks: list, depth: int) -> None:
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


def reshard(modules: list) -> None:
    """Free the weights FSDP2 units of `modules` hold gathered (zero2 keeps a unit gathered after a forward until
    its backward: after an evaluation's forwards, none comes)."""
    from torch.distributed.fsdp import FSDPModule
    for module in modules:
        for m in module.modules():
            if isinstance(m, FSDPModule):
                m.reshard()


def average_dense_grads(named_params, ctx: mesh.Context, shards: tp.Shards, bucket_bytes: float) -> None:
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


def site(sharded: bool) -> str | None:
    """The `.scale` lines behind the gradient collectives of data parallelism (faults.scale): FSDP's gathers and
    reduce-scatters (`sharded`: zero2, fsdp) come from `data_parallel` (else the dp axis), DDP's all-reduce from
    the dp axis (the ep axis too: the batch ranks are dp × ep) and `data_parallel` when written."""
    if sharded:
        return faults.scale("data_parallel" if faults.has_source("data_parallel") else "axis dp")
    return faults.scale("axis dp", "axis ep", "data_parallel")


def reduces_in_backward(par, ctx) -> bool:
    """Whether a backward can end in the gradient reduction over the batch ranks (FSDP2's reduce-scatter, or DDP's
    or the main gradients' all-reduce: more than one batch rank): its last micro-batch's, runtime.model_parts."""
    return par.shards_grads or ctx.batch_size > 1


def sync_phrase(sync: bool, sharded: bool, buckets: bool = False) -> str:
    """What a backward's gradient sync over the batch ranks is, in the watchdog's words: none (`sync` false: a
    micro-batch before the last, or one batch rank), FSDP's reduce-scatter (`sharded`), the main gradients'
    buckets (`buckets`: bf16 without DDP, runtime.precision.MainGrads) or DDP's all-reduce."""
    if not sync:
        return "no data-parallel collective"
    if buckets:
        return "with the main gradients' bucketed all-reduces over the batch ranks"
    return ("with FSDP's gradient reduce-scatter over dp" if sharded
            else "with DDP's gradient all-reduce over the batch ranks")
