"""Mixed precision as Megatron-LM does it (`precision = bf16`): bf16 compute weights, fp32 main gradients, fp32
master weights in the optimizer beside AdamW's moments.

- **Weights.** Every layout initialises fp32 weights by name (runtime.layers.init_parameters) or loads them
  (runtime.hf); `to_compute` keeps those values as the fp32 masters and turns the parameters into bf16: the model
  computes in bf16 weights, with no autocast and no per-call weight cast (nothing saves a weight copy per
  micro-batch). What computes in fp32 inside and returns bf16, op by op, as Megatron's kernels do: the norms
  (torch's LayerNorm and RMSNorm kernels accumulate a bf16 input's statistics in fp32), the loss (the generated
  program's `.float()` before the cross-entropy: log-softmax in fp32), rotary embeddings (angles in fp32, cast to
  the queries' dtype: runtime.rotary) and a MoE router's softmax (runtime.moe.route).
- **Residual stream.** bf16, as every activation; `Parallel.fp32_residual` (Megatron's
  `--fp32-residual-connection`) keeps it fp32: each `repeat` casts its input to fp32, the residual adds then stay
  fp32 (fp32 + bf16 promotes), and the norms reading it normalise in fp32 and hand the block bf16 (`_fp32_norm`).
- **Gradients.** `MainGrads`: each parameter's bf16 gradient is added, as soon as autograd has accumulated it
  (`register_post_accumulate_grad_hook`), into an fp32 buffer `p.main_grad` (Megatron's main_grad) and freed; the
  reduction over the batch ranks and clipping work on those. `Parallel.grad_reduce = "bf16"` keeps the buffers bf16
  (accumulated and reduced in bf16; upcast for AdamW). Without FSDP and with data parallelism, no DDP (it would
  reduce the bf16 `.grad`): the main gradients are bucketed and each bucket all-reduced from the hooks of the last
  micro-batch as its gradients complete, overlapping the backward (DDP's scheme); pipeline stages all-reduce the
  same buckets in place after the schedule (`reduce_now`).
- **Optimizer.** `MasterAdamW`: AdamW on the fp32 masters with the main gradients, then the masters copied into the
  bf16 weights. Whole under ddp (12 bytes per parameter: master and two moments); under zero1 sharded over dp by
  whole parameters (ZeRO's partition, as torch's ZeroRedundancyOptimizer partitions): each rank updates and keeps
  the master and moments of its partition only (12/Nd bytes per parameter) and broadcasts the bf16 weights it
  updated. fsdp and zero2 need none of this: FSDP2's MixedPrecisionPolicy computes in bf16 from its sharded fp32
  parameters (the masters) and plain AdamW steps those (`fsdp_policy`).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from runtime.layers import ZeroCenteredRMSNorm

COMPUTE = torch.bfloat16


def grad_dtype(grad_reduce: str) -> torch.dtype:
    """The dtype gradients are accumulated and reduced in (`Parallel.grad_reduce`)."""
    return torch.float32 if grad_reduce == "fp32" else COMPUTE


def main_grads(precision: str, parallel) -> bool:
    """Whether a run takes this module's bf16 weights, main gradients and masters: bf16 without FSDP (under FSDP2,
    fsdp and zero2 with dp > 1, `parallel.shards_grads`, its MixedPrecisionPolicy does the same: `fsdp_policy`)."""
    return precision == "bf16" and not parallel.shards_grads


def fsdp_policy(grad_reduce: str, fp32_residual: bool):
    """FSDP2's mixed precision for fsdp and zero2: gathers cast to bf16, gradients reduce-scattered (and, with
    gradient accumulation, accumulated unsharded) in `grad_reduce`'s dtype, the sharded fp32 parameters the
    masters. With an fp32 residual a unit's (block's) input is left fp32, not cast to bf16."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    return MixedPrecisionPolicy(param_dtype=COMPUTE, reduce_dtype=grad_dtype(grad_reduce),
                                cast_forward_inputs=not fp32_residual)


def _fp32_norm(module: nn.Module):
    """The forward of a norm that may read the fp32 residual stream: an fp32 input is normalised in fp32 (its bf16
    weights read as fp32: one hidden-sized vector) and handed on in bf16; a bf16 input takes torch's kernel as is."""
    original = module.forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        w = module.weight
        if x.dtype == w.dtype:
            return original(x)
        if isinstance(module, nn.LayerNorm):
            b = module.bias.float() if module.bias is not None else None
            y = F.layer_norm(x, module.normalized_shape, w.float(), b, module.eps)
        elif isinstance(module, ZeroCenteredRMSNorm):  # scaled by 1 + weight (Gemma), in fp32 as its own forward
            y = F.rms_norm(x.float(), module.normalized_shape, None, module.eps) * (1.0 + w.float())
        else:
            y = F.rms_norm(x, module.normalized_shape, w.float(), module.eps)
        return y.to(w.dtype)
    return forward


def apply_policy(module: nn.Module, fp32_residual: bool) -> None:
    """The activation side of the policy, on a module before it is wrapped: with an fp32 residual, each `repeat`
    starts its stream in fp32 and each norm accepts it (`_fp32_norm`)."""
    if not fp32_residual:
        return
    from runtime.layers import Repeat
    for m in module.modules():
        if isinstance(m, Repeat):
            m.fp32_residual = True
        elif isinstance(m, (nn.LayerNorm, nn.RMSNorm)) and m.weight is not None:
            m.forward = _fp32_norm(m)


@torch.no_grad()
def to_compute(modules: list) -> dict:
    """Turn every floating parameter of `modules` into a bf16 compute weight; return {parameter: its fp32 value}
    (the masters, before rounding). The parameter objects stay the same (hooks, names, checkpoints)."""
    masters = {}
    for module in modules:
        for p in module.parameters():
            if p in masters or not p.is_floating_point():
                continue
            masters[p] = p.detach().clone()
            p.data = p.data.to(COMPUTE)
    return masters



def owners(params: list, shard_group) -> tuple:
    """zero1's ownership of `params` over `shard_group` (None: this rank owns them all): (parameter -> owning
    rank of the group, each rank's parameters, each rank's global rank, this rank's index), by `partition`."""
    n = dist.get_world_size(shard_group) if shard_group is not None else 1
    me = dist.get_rank(shard_group) if shard_group is not None else 0
    owner = dict(zip(params, partition(params, n))) if n > 1 else {p: 0 for p in params}
    by_rank = [[p for p in params if owner[p] == r] for r in range(n)]
    src = [dist.get_global_rank(shard_group, r) for r in range(n)] if n > 1 else [0]
    return owner, by_rank, src, me


@torch.no_grad()
def broadcast_owned(by_rank: list, src: list, group) -> None:
    """zero1's publish: each owner's parameters (`by_rank[r]`, owned by global rank `src[r]`) to every rank of
    `group`, one flat broadcast per owner (nothing with no group or one owner)."""
    if group is None or len(by_rank) == 1:
        return
    for r, params in enumerate(by_rank):
        if not params:
            continue
        flat = torch._utils._flatten_dense_tensors([p.data for p in params])
        dist.broadcast(flat, src=src[r], group=group)
        torch._foreach_copy_(params, torch._utils._unflatten_dense_tensors(flat, params))

class _MainGradOf:
    """A parameter as the training loop's gradient code reads it (clipping, the reductions, --dump-grads):
    `.grad` is its main gradient."""

    __slots__ = ("param",)

    def __init__(self, param: torch.Tensor):
        self.param = param

    @property
    def grad(self):
        return getattr(self.param, "main_grad", None)


class MainGrads:
    """fp32 (or `dtype`) gradient buffers beside bf16 parameters (Megatron's main_grad): a post-accumulate hook
    adds each parameter's bf16 gradient into `p.main_grad` (made at its first gradient of a step) and frees it,
    so a step holds one bf16 gradient at a time per parameter, and the micro-batches accumulate in `dtype`.

    With `reduce = (group, n, skip)` (a whole model's data parallelism, where DDP would reduce the bf16 `.grad`):
    the parameters not in `skip` (experts, reduced by runtime.moe) are laid in buckets of about `bucket_bytes`
    (DDP's bucket_cap_mb, the compiler's rule), last parameter first (the order backward reaches them); their main
    gradients are views of one flat buffer per bucket. During the backward of the last micro-batch (`sync`) each
    bucket is all-reduced over `group` as soon as its gradients are complete, asynchronously and in bucket order
    on every rank (as DDP launches its buckets), so the reduction overlaps the rest of the backward; `wait` ends
    them and divides by `n` (the mean over the batch ranks)."""

    def __init__(self, params: list, dtype: torch.dtype = torch.float32, reduce=None, bucket_bytes: float = 25e6):
        self.params, self.dtype = params, dtype
        self.group, self.n, skip = reduce if reduce is not None else (None, 1, ())
        self.buckets: list = []
        self.bucket_of: dict = {}
        if reduce is not None:
            size = 0
            for p in reversed(params):
                if p in skip:
                    continue
                if not self.buckets or size + p.numel() * dtype.itemsize > bucket_bytes:
                    self.buckets.append([])
                    size = 0
                self.bucket_of[p] = len(self.buckets) - 1
                self.buckets[-1].append(p)
                size += p.numel() * dtype.itemsize
        self.flat: list = [None] * len(self.buckets)
        self.works: list = [None] * len(self.buckets)
        self.pending: list = [0] * len(self.buckets)
        self.sync, self.next = False, 0
        for p in params:
            p.main_grad = None
            p.register_post_accumulate_grad_hook(self._accumulate)

    def _allocate(self, b: int) -> None:
        """Bucket `b`'s flat buffer (zeros) and its parameters' main gradients as views of it."""
        params = self.buckets[b]
        flat = torch.zeros(sum(p.numel() for p in params), dtype=self.dtype, device=params[0].device)
        offset = 0
        for p in params:
            p.main_grad = flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        self.flat[b] = flat

    def _accumulate(self, p: torch.Tensor) -> None:
        b = self.bucket_of.get(p)
        if p.main_grad is None and b is not None:
            self._allocate(b)
        if p.main_grad is None:
            p.main_grad = p.grad.to(self.dtype, copy=True)
        else:
            p.main_grad.add_(p.grad)
        p.grad = None
        if self.sync and b is not None:
            self.pending[b] -= 1
            while self.next < len(self.buckets) and self.pending[self.next] == 0:
                self._launch(self.next)

    def start_sync(self) -> None:
        """The next backward is the step's last: launch each bucket's all-reduce once its gradients are in."""
        if self.buckets:
            self.sync, self.next = True, 0
            self.pending = [len(ps) for ps in self.buckets]

    def _launch(self, b: int) -> None:
        if self.flat[b] is None or self.buckets[b][0].main_grad is None:  # no gradient here this step: zeros
            self._allocate(b)
        self.works[b] = dist.all_reduce(self.flat[b], group=self.group, async_op=True)
        self.next = b + 1

    @torch.no_grad()
    def wait(self) -> None:
        """End the buckets' all-reduces (launching those whose gradients never all arrived: an unused parameter)
        and divide by the batch ranks."""
        if not self.sync:
            return
        for b in range(self.next, len(self.buckets)):
            self._launch(b)
        for b, work in enumerate(self.works):
            work.wait()
            self.flat[b].div_(self.n)
        self.works = [None] * len(self.buckets)
        self.sync = False

    @torch.no_grad()
    def reduce_now(self) -> None:
        """Every bucket's all-reduce, in place, then the mean: pipeline stages, whose backwards the schedule runs
        interleaved with other micro-batches' forwards, reduce after the schedule (and after `finish`), with no
        copy of the gradients (Megatron's contiguous gradient buffer)."""
        if self.buckets:
            self.sync, self.next = True, 0
            self.wait()

    @torch.no_grad()
    def finish(self, scale: float = 1.0) -> None:
        """After a step's backwards: a gradient accumulated without the hook (torch pipelining's split weight
        backward sets `.grad` itself) is added in too; all are multiplied by `scale` (the pipeline's 1/m)."""
        for p in self.params:
            if p.grad is not None:
                self._accumulate(p)
            if scale != 1.0 and p.main_grad is not None:
                p.main_grad.mul_(scale)

    def named(self, named_params) -> list:
        """(name, holder) with `holder.grad` the main gradient: what clipping and the reductions are given."""
        return [(name, _MainGradOf(p)) for name, p in named_params]

    def clear(self) -> None:
        for p in self.params:
            p.main_grad = None
        self.flat = [None] * len(self.buckets)


def partition(params: list, n: int) -> list[int]:
    """ZeRO's partition by whole parameters: each parameter, largest first, to the least loaded of `n` ranks (ties
    to the lower rank); the owner of each parameter, in `params`' order. Every rank computes the same."""
    return partition_sizes([p.numel() for p in params], n)


def partition_sizes(sizes: list, n: int) -> list[int]:
    """`partition` over the parameters' element counts (the compiler's ledger computes the same split:
    compiler/cost/offload.py `host_elements`)."""
    load, owner = [0] * n, [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        r = min(range(n), key=lambda r: (load[r], r))
        owner[i], load[r] = r, load[r] + sizes[i]
    return owner


class MasterAdamW(torch.optim.Optimizer):
    """AdamW over bf16 parameters whose fp32 masters it keeps (module docstring): `state[p]` holds `master`,
    `exp_avg`, `exp_avg_sq` (fp32) and `step`, for the parameters this rank owns: all of them, or under zero1
    (`shard_group`, dp) the rank's partition (`partition`). A step: AdamW (torch's own kernel, as torch.optim.AdamW
    runs it) on the masters with the main gradients upcast, the masters copied into the bf16 weights, and under zero1
    each rank's updated weights broadcast to the others as one flat bf16 buffer per rank.
    Checkpoints (runtime.checkpoint) store a master as the parameter's value and the rest as AdamW's state, so a
    checkpoint moves between this and plain AdamW."""

    def __init__(self, groups: list, masters: dict, *, lr: float, betas: tuple, eps: float, shard_group=None):
        super().__init__(groups, dict(lr=lr, betas=betas, eps=eps, weight_decay=0.0))
        params = [p for g in self.param_groups for p in g["params"]]
        self.shard_group = shard_group
        self.owner, self.by_rank, self.src, me = owners(params, shard_group)
        for p in self.by_rank[me]:  # eager, so checkpoints have a state to load into before any step
            # `step` on the master's device, as torch.optim.AdamW makes it for its fused kernel (which refuses a
            # CPU step beside CUDA tensors); on CPU that is where the unfused loop keeps it anyway.
            self.state[p] = {"step": torch.zeros((), dtype=torch.float32, device=masters[p].device),
                             "master": masters[p],
                             "exp_avg": torch.zeros_like(masters[p]), "exp_avg_sq": torch.zeros_like(masters[p])}

    @torch.no_grad()
    def step(self, closure=None):
        from torch.optim.adamw import adamw
        for group in self.param_groups:
            mine = [p for p in group["params"] if p in self.state and getattr(p, "main_grad", None) is not None]
            if not mine:
                continue
            st = [self.state[p] for p in mine]
            masters = [s["master"] for s in st]
            beta1, beta2 = group["betas"]
            adamw(masters, [p.main_grad.float() for p in mine], [s["exp_avg"] for s in st],
                  [s["exp_avg_sq"] for s in st], [], [s["step"] for s in st],
                  fused=adamw_kernels(masters).get("fused"),
                  amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"],
                  eps=group["eps"], maximize=False)
            torch._foreach_copy_(mine, masters)
        self.publish()

    @torch.no_grad()
    def publish(self) -> None:
        """zero1: every rank's bf16 weights from their owners, one flat broadcast per owner over dp."""
        broadcast_owned(self.by_rank, self.src, self.shard_group)

    @torch.no_grad()
    def load_masters(self) -> None:
        """After a checkpoint was read into the masters: the bf16 weights recast from them (and shared, zero1)."""
        mine = [p for p in self.state]
        if mine:
            torch._foreach_copy_(mine, [self.state[p]["master"] for p in mine])
        self.publish()

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for group in self.param_groups:
            for p in group["params"]:
                p.main_grad = None


def decay_groups(params: list, weight_decay: float) -> list:
    """AdamW's param groups as Megatron's: no weight decay on biases and norm scales (the 1-D parameters)."""
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def adamw_kernels(params: list) -> dict:
    """AdamW's implementation: `fused` (one kernel per group of tensors: the update reads and writes each state
    tensor once, no temporaries) when every parameter is on CUDA, else torch's default (on CPU a loop over the
    tensors: no whole-group temporaries, which the memory model counts as none there)."""
    if params and all(p.device.type == "cuda" for p in params):
        return {"fused": True}
    return {}


def mixed_adamw(params: list, modules: list, cfg, zero_group=None, reduce=None):
    """bf16 without FSDP: the parameters of `modules` become bf16 compute weights, their gradients land in main
    gradients (fp32 unless `grad_reduce = bf16`), and MasterAdamW keeps the fp32 masters and moments, whole or
    (zero1, `zero_group`) sharded over dp. `reduce`: (group, ranks, parameters left out) of a whole model's data
    parallelism, reduced in buckets from the backward's hooks (MainGrads). Returns (optimizer, main gradients)."""
    opt = cfg.optim
    masters = to_compute(modules)
    mains = MainGrads(params, grad_dtype(cfg.parallel.grad_reduce), reduce=reduce,
                      bucket_bytes=cfg.parallel.ddp_bucket_mb * 2**20)
    return MasterAdamW(decay_groups(params, opt.weight_decay), masters, lr=opt.lr, betas=opt.betas, eps=opt.eps,
                       shard_group=zero_group), mains
