"""Offload (`plan { offload }`): model state or activations kept on the host instead of the device.

- **optimizer(fraction = f)** (Megatron's `--optimizer-cpu-offload --optimizer-offload-fraction`). `host_share`
  picks the parameters: of those whose optimizer state this rank holds (all of them, or under zero1 its partition),
  in the order the model lists them, the shortest prefix holding at least f of their elements (whole tensors: f = 0
  none, f = 1 all; the device never keeps more than 1 − f, which is what the memory model counts). `HostAdamW`
  keeps their fp32 masters (the parameter's value under fp32, the master under bf16) and AdamW's moments on the
  host; each step it copies their gradients to the host (into pinned buffers, asynchronously, on CUDA), steps the
  rest on the device meanwhile, runs AdamW on the host (torch's own per-tensor kernel, the one torch.optim.AdamW
  takes on CPU), and copies each updated parameter back (from pinned memory, asynchronously, in the parameter's
  dtype: under bf16 the host casts first, so half the bytes cross). On CPU the copies are plain copies. AdamW's
  arithmetic is torch's whichever side runs it: on CPU an offloaded run is bitwise the run without (the device's
  AdamW is the same per-tensor kernel); on CUDA the device side takes the multi-tensor kernels, which may round in
  the last place.
- **params**: FSDP2's CPUOffloadPolicy (runtime.parallelize): FSDP2 keeps each unit's parameter shards, their
  gradients and therefore AdamW's state on the host and copies a shard to the device for each all-gather.
- **activations(modules = ...)**: `ActivationOffload` wraps each block of a `repeat` in saved-tensor hooks
  (torch.autograd.graph.saved_tensors_hooks, as torch's save_on_cpu): a tensor the block saves for its backward
  is copied to the host in forward (pinned on CUDA) and back to the device when the backward reads it. With
  `modules`, only the tensors saved while attention's or the MLP's leaves run (named `attn_*`, `mlp_*` in a
  generated program; the ops after a leaf, up to the next one, belong to it: the attention core after the value
  projection is attention's, the activation function after the up projection the MLP's); norms and the residual
  stream stay. Parameters (and views of them) are never copied: they live on the device anyway.

Bytes counted (`COPIED`, "d2h" and "h2d" per kind): what each copy moves, the tensor's bytes, on CPU too, where
the "host" is the same memory and the copies are copies all the same. runtime.trainer reports them per step in
the metrics (`offload_d2h_bytes`, `offload_h2d_bytes`) and under `--count-bytes` as `d2h/host` and `h2d/host`.
FSDP2's own copies (offload = params) are torch's and not counted here.
"""
from __future__ import annotations

import collections
import contextlib

import torch
from torch import nn

from runtime import choices, precision

COPIED: collections.Counter = collections.Counter()
"""(direction, kind) -> bytes copied since the last `reset`: direction "d2h" (device to host) or "h2d"; kind
"optimizer" or "activations"."""

KIND_PREFIX = {"attention": "attn_", "mlp": "mlp_"}
"""The prefix of a block module's leaves in a generated program (compiler/layers' LEAF: attention and mla `attn`,
mlp `mlp`), by the kind `offload_modules` names."""
assert set(KIND_PREFIX) == set(choices.OFFLOAD_MODULES)


_PAUSED = False


@contextlib.contextmanager
def paused():
    """Nothing offloaded inside: a forward that is no training step (a pipeline stage's shape inference on
    micro-batch 0, runtime.pipeline), whose saved tensors no backward reads."""
    global _PAUSED
    outer, _PAUSED = _PAUSED, True
    try:
        yield
    finally:
        _PAUSED = outer


def reset() -> None:
    COPIED.clear()


def counts() -> dict:
    """The bytes copied since the last `reset`, by direction: {"d2h": n, "h2d": n} (every kind summed)."""
    out = {"d2h": 0, "h2d": 0}
    for (direction, _), n in COPIED.items():
        out[direction] += n
    return out


def _count(direction: str, kind: str, t: torch.Tensor) -> None:
    COPIED[(direction, kind)] += t.numel() * t.element_size()


# -- the optimizer ---------------------------------------------------------------------------------------------------


def host_share(params: list, fraction: float) -> set:
    """The parameters whose optimizer state goes to the host: the shortest prefix of `params` holding at least
    `fraction` of their elements (whole tensors). Every rank holding the same list computes the same."""
    return set(params[:host_prefix([p.numel() for p in params], fraction)])


def host_prefix(sizes: list, fraction: float) -> int:
    """How many of the parameters of element counts `sizes` (in order) `host_share` takes (the compiler's ledger
    computes the same: compiler/cost/offload.py `host_elements`)."""
    want, held, k = fraction * sum(sizes), 0, 0
    for n in sizes:
        if held >= want:
            break
        held, k = held + n, k + 1
    return k


class HostAdamW(torch.optim.Optimizer):
    """AdamW with `fraction` of this rank's state on the host (module docstring). `state[p]` holds `exp_avg`,
    `exp_avg_sq`, `step` and `master`, what AdamW steps: a copy of the parameter's fp32 value on the host for an
    offloaded parameter; beside a bf16 parameter on the device its fp32 master (`masters`, bf16 plans, as
    runtime.precision.MasterAdamW); else the parameter's own storage, stepped in place. Under zero1 (`shard_group`)
    each rank holds the state of its partition (runtime.precision.partition) and broadcasts the parameters it
    updated; checkpoints (runtime.checkpoint) read `state` and `owner` as MasterAdamW's."""

    def __init__(self, groups: list, *, lr: float, betas: tuple, eps: float, fraction: float, masters=None,
                 shard_group=None):
        super().__init__(groups, dict(lr=lr, betas=betas, eps=eps, weight_decay=0.0))
        params = [p for g in self.param_groups for p in g["params"]]
        self.shard_group = shard_group
        self.owner, self.by_rank, self.src, me = precision.owners(params, shard_group)
        mine = self.by_rank[me]
        self.host = host_share(mine, fraction)
        device = params[0].device if params else torch.device("cpu")
        self.pin = device.type == "cuda"
        self.fused = bool(mine) and all(p.device.type == "cuda" for p in mine)  # runtime.precision.adamw_kernels
        self.grad_buffer: dict = {}  # offloaded parameter -> its gradient's host buffer (pinned on CUDA)
        self.send_buffer: dict = {}  # offloaded bf16 parameter -> its cast value's host buffer
        for p in mine:  # eager, so checkpoints have a state to load into before any step
            master = masters[p] if masters is not None else None
            if p in self.host:
                value = (master if master is not None else p.detach()).to("cpu", copy=True)
                value = value.pin_memory() if self.pin else value
                st = {"step": torch.zeros((), dtype=torch.float32), "master": value}
                self.grad_buffer[p] = torch.empty(p.shape, dtype=torch.float32, pin_memory=self.pin)
                if p.dtype != value.dtype:
                    self.send_buffer[p] = torch.empty(p.shape, dtype=p.dtype, pin_memory=self.pin)
            else:
                # fp32: the parameter's own storage is its master (stepped in place; checkpoints read `master` as
                # the parameter's value for every parameter this rank owns, runtime.checkpoint)
                value = master if master is not None else p.data
                # `step` where torch.optim.AdamW keeps it: on the device for its fused kernel, else on the CPU
                st = {"step": torch.zeros((), dtype=torch.float32, device=p.device if self.fused else "cpu"),
                      "master": value}
            st["exp_avg"] = torch.zeros_like(value)
            st["exp_avg_sq"] = torch.zeros_like(value)
            self.state[p] = st

    @staticmethod
    def _grad(p):
        g = getattr(p, "main_grad", None)  # bf16 plans: the main gradient (runtime.precision.MainGrads)
        return g if g is not None else p.grad

    @torch.no_grad()
    def step(self, closure=None):
        from torch.optim.adamw import adamw
        work = []
        for group in self.param_groups:
            mine = [p for p in group["params"] if p in self.state and self._grad(p) is not None]
            off = [p for p in mine if p in self.host]
            for p in off:  # device -> host, queued before the device's own AdamW so the two overlap
                self.grad_buffer[p].copy_(self._grad(p), non_blocking=self.pin)
                _count("d2h", "optimizer", self._grad(p))
            work.append((group, [p for p in mine if p not in self.host], off))
        copied = torch.cuda.Event() if self.pin else None
        if copied is not None:
            copied.record()
        for group, on, _ in work:
            if on:
                self._adamw(adamw, group, on, [self._grad(p) for p in on],
                            fused=self.fused or None)
        if copied is not None:
            copied.synchronize()  # the gradients are on the host
        for group, _, off in work:
            if not off:
                continue
            # torch's per-tensor loop, as torch.optim.AdamW runs on CPU tensors
            self._adamw(adamw, group, off, [self.grad_buffer[p] for p in off], foreach=False)
            for p in off:  # host -> device, from pinned memory, asynchronously on CUDA
                value = self.state[p]["master"]
                if p in self.send_buffer:
                    value = self.send_buffer[p].copy_(value)
                p.data.copy_(value, non_blocking=self.pin)
                _count("h2d", "optimizer", value)
        self.publish()

    def _adamw(self, adamw, group, params, grads, **kernel):
        st = [self.state[p] for p in params]
        targets = [s["master"] for s in st]
        beta1, beta2 = group["betas"]
        adamw(targets, [g.float() if g.dtype != t.dtype else g for g, t in zip(grads, targets)],
              [s["exp_avg"] for s in st], [s["exp_avg_sq"] for s in st], [], [s["step"] for s in st],
              amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"],
              eps=group["eps"], maximize=False, **kernel)
        on_device = [(p, s["master"]) for p, s in zip(params, st) if p not in self.host and not _aliases(p, s)]
        if on_device:  # bf16's masters on the device: the weights recast from them
            torch._foreach_copy_([p for p, _ in on_device], [m for _, m in on_device])

    @torch.no_grad()
    def publish(self) -> None:
        """zero1: every rank's parameters from their owners, one flat broadcast per owner over dp."""
        precision.broadcast_owned(self.by_rank, self.src, self.shard_group)

    @torch.no_grad()
    def load_masters(self) -> None:
        """After a checkpoint was read into the masters: the parameters recast from them (and shared, zero1)."""
        for p, st in self.state.items():
            if not _aliases(p, st):
                p.data.copy_(st["master"])
        self.publish()

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for group in self.param_groups:
            for p in group["params"]:
                if hasattr(p, "main_grad"):
                    p.main_grad = None


def _aliases(p, st: dict) -> bool:
    """Whether a parameter's master is its own storage (fp32 on the device)."""
    return st["master"].data_ptr() == p.data_ptr() and st["master"].device == p.device


# -- activations -----------------------------------------------------------------------------------------------------


def _is_parameter(t: torch.Tensor) -> bool:
    base = t._base if t._base is not None else t
    return isinstance(base, nn.Parameter) or (base.is_leaf and base.requires_grad)


class ActivationOffload:
    """Saved-tensor hooks around each block of a `repeat` (module docstring): `modules` empty, every tensor a block
    saves goes to the host; else those saved while a leaf of those kinds (KIND_PREFIX) last started."""

    def __init__(self, modules: tuple = ()):
        self.prefixes = tuple(KIND_PREFIX[m] for m in modules)
        self.current = None  # the kind of the leaf that last started, within the block running
        self.pin = torch.cuda.is_available()

    def watch(self, block: nn.Module) -> None:
        """Follow which leaf of `block` runs (forward pre-hooks on its direct children)."""
        if not self.prefixes:
            return
        for name, child in block.named_children():
            chosen = name.startswith(self.prefixes)
            child.register_forward_pre_hook(lambda module, args, chosen=chosen: self._enter(chosen))

    def _enter(self, chosen: bool) -> None:
        self.current = chosen

    def _pack(self, t: torch.Tensor):
        if _PAUSED or (self.prefixes and not self.current) or _is_parameter(t):
            return t
        host = torch.empty(t.size(), dtype=t.dtype, layout=t.layout, pin_memory=self.pin and t.is_cuda)
        host.copy_(t, non_blocking=host.is_pinned())
        _count("d2h", "activations", t)
        return (t.device, host)

    @staticmethod
    def _unpack(packed):
        if isinstance(packed, torch.Tensor):
            return packed
        device, host = packed
        _count("h2d", "activations", host)
        return host.to(device, non_blocking=host.is_pinned(), copy=True)  # a copy on CPU too, as on a device

    @contextlib.contextmanager
    def around(self):
        """One block's forward: its saved tensors through the hooks, the leaf followed from the block's start."""
        self.current = None
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield
        self.current = None


def install(module: nn.Module, modules: tuple) -> None:
    """Activation offload on every `repeat` of `module` (a whole model or a pipeline stage): each of its blocks run
    under one ActivationOffload's hooks (runtime.layers.Repeat.offload)."""
    from runtime.layers import Repeat
    offload = ActivationOffload(modules)
    for m in module.modules():
        if isinstance(m, Repeat):
            m.offload = offload
            for block in m.values():
                offload.watch(block)


def describe(parallel, opt, modules: list) -> str:
    """Rank 0's start-up line of what it offloads, read from what the run built (empty without offload): the
    optimizer's parameters on the host, FSDP2's units holding a CPUOffloadPolicy, the repeats whose blocks offload."""
    if parallel.offload == "optimizer" and isinstance(opt, HostAdamW):
        mine = [p for p in opt.state]
        n, total = sum(p.numel() for p in opt.host), sum(p.numel() for p in mine)
        return (f"offload: the optimizer state of {len(opt.host)} of {len(mine)} parameter tensors ({n:,} of "
                f"{total:,} elements, {n / max(total, 1):.1%}; asked {parallel.offload_fraction:g}) on the host")
    if parallel.offload == "params":
        from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule
        units = [m for module in modules for m in module.modules() if isinstance(m, FSDPModule)]
        held = [m for m in units if isinstance(_offload_policy(m), CPUOffloadPolicy)]
        return (f"offload: FSDP2's CPUOffloadPolicy on {len(held)} of {len(units)} units (their parameter shards, "
                "gradients and AdamW's state on the host)")
    if parallel.offload == "activations":
        from runtime.layers import Repeat
        repeats = [m for module in modules for m in module.modules() if isinstance(m, Repeat) and m.offload]
        what = ", ".join(parallel.offload_modules) or "every module"
        return (f"offload: the saved activations of {what} in the blocks of {len(repeats)} repeat(s) copied to the "
                "host")
    return ""


def _offload_policy(unit):
    """The offload policy FSDP2 holds for a unit (its parameter group's; torch keeps it in private state)."""
    state = unit._get_fsdp_state()
    group = getattr(state, "_fsdp_param_group", None)
    return getattr(group, "offload_policy", None)
