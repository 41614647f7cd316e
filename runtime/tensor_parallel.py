"""What the runtime needs to know about sharded parameters: which, over which axis, along which dim, from what
full size.

The compiler writes the tables into the generated program (`Config.tp_shards` and, for experts sharded over `ep`,
`Config.ep_shards`: (name pattern, dim, full size)), with `*` standing for a block's index. Parameters are
initialised whole and sliced (`shard_of`), so every tp and ep degree starts from the single-device model's weights;
gradients are gathered back whole for comparisons.
"""
from __future__ import annotations

import fnmatch
import math

import torch
import torch.distributed as dist

from runtime import collectives


class Shards:
    def __init__(self, shards: tuple, partial_grads: tuple, ep_shards: tuple = ()):
        self._shards = tuple((p, d, f, "tp") for p, d, f in shards) + tuple((p, d, f, "ep") for p, d, f in ep_shards)
        self._partial = tuple(partial_grads)
        self._of, self._partial_of = {}, {}  # by name: the loop asks every step, the answers never change

    def of(self, name: str) -> tuple[int, int, str] | None:
        """(dim, full size of that dim, axis) if parameter `name` is sharded over tp or ep, else None."""
        if name not in self._of:
            bare = name.removeprefix("module.")
            self._of[name] = next(((dim, full, axis) for pattern, dim, full, axis in self._shards
                                   if fnmatch.fnmatchcase(bare, pattern)), None)
        return self._of[name]

    def expert(self, name: str) -> bool:
        """Whether `name` is an expert weight sharded over ep (its gradient is synchronised over dp only)."""
        s = self.of(name)
        return s is not None and s[2] == "ep"

    def partial(self, name: str) -> bool:
        """Whether the gradient of `name` is partial over tp (sequence parallelism) and must be summed."""
        if name not in self._partial_of:
            bare = name.removeprefix("module.")
            self._partial_of[name] = any(fnmatch.fnmatchcase(bare, p) for p in self._partial)
        return self._partial_of[name]


def local_slice(full: torch.Tensor, dim: int, local: int, axis: str = "tp") -> torch.Tensor:
    """This rank's slice of `full` along `dim` over `axis`, zero-padded at the end to `local` × its size."""
    n, rank = collectives.axis_size(axis), collectives.axis_rank(axis)
    pad = local * n - full.shape[dim]
    if pad:
        widths = [0, 0] * (full.ndim - dim - 1) + [0, pad]
        full = torch.nn.functional.pad(full, widths)
    return full.narrow(dim, rank * local, local)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def sync_partial_grads(named_params, shards: Shards) -> None:
    """Sum over tp the gradients that each rank computed for its sequence chunk only."""
    for name, p in named_params:
        if p.grad is not None and shards.partial(name):
            g = _local(p.grad)
            g.copy_(collectives._all_reduce(g.clone(), "tp"))


def clip_grad_norm(named_params, max_norm: float, shards: Shards, dp_group, pp_group=None,
                   scale=None, dense_group=None) -> torch.Tensor:
    """The global gradient norm of the single-device model, from sharded pieces; scales gradients down to
    `max_norm` when above it (as torch.nn.utils.clip_grad_norm_). tp-sharded gradients are summed over tp,
    replicated ones counted once; experts sharded over ep summed over ep; FSDP's dp shards (DTensor gradients)
    are summed over dp (the dense ones over `dense_group`, dp × ep, when FSDP shards them there; `dp_group`: the
    ranks holding the same experts, dp or dp × cp); pipeline stages'
    norms over pp. `scale` (default: the parameters measured) are the gradients scaled: a tied copy is measured once
    but scaled on both stages."""
    named = [(n, p) for n, p in named_params if p.grad is not None]
    device = named[0][1].grad.device if named else torch.device("cpu")
    if device.type == "cpu" and dist.is_initialized() and dist.get_backend() == "nccl":
        # gradients on the host (FSDP2's CPUOffloadPolicy, `offload = params`): the norms are reduced on the device
        device = torch.device("cuda", torch.cuda.current_device())
    sums = {axis: torch.zeros((), device=device, dtype=torch.float64) for axis in ("tp", "ep", None)}
    dp_sharded = any(hasattr(p.grad, "to_local") for _, p in named)
    by_axis: dict = {}
    for name, p in named:
        s = shards.of(name)
        by_axis.setdefault(s[2] if s is not None else None, []).append(_local(p.grad))
    for axis, grads in by_axis.items():  # each tensor's norm (one multi-tensor kernel, as torch's clip_grad_norm_),
        # then the squares summed in fp64; fp64 norms would first copy every gradient to fp64
        sums[axis] = torch.stack(torch._foreach_norm(grads, 2)).double().pow(2).sum().to(device)
    for axis in ("tp", "ep"):
        if collectives.axis_size(axis) > 1:
            dist.all_reduce(sums[axis], group=collectives._group(axis))
    if dp_sharded and dense_group is not None and dense_group is not dp_group:
        # FSDP with ep: the dense shards lie over dp × ep, the experts' over dp (runtime.parallelize)
        dense = sums["tp"] + sums[None]
        dist.all_reduce(dense, group=dense_group)
        if dp_group is not None:
            dist.all_reduce(sums["ep"], group=dp_group)
        total = dense + sums["ep"]
    else:
        total = sums["tp"] + sums["ep"] + sums[None]
        if dp_sharded and dp_group is not None:
            dist.all_reduce(total, group=dp_group)
    if pp_group is not None:
        dist.all_reduce(total, group=pp_group)
    norm = total.sqrt()
    if max_norm > 0:
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)  # a tensor: no host synchronisation
        grouped: dict = {}
        for p in (scale if scale is not None else [p for _, p in named]):
            if p.grad is not None:
                g = _local(p.grad)
                grouped.setdefault((g.device, g.dtype), []).append(g)
        for (where, dtype), grads in grouped.items():
            torch._foreach_mul_(grads, coef.to(where, dtype))
    return norm.float()


def full_grads(named_params, shards: Shards) -> dict:
    """Every gradient as the single-device model's whole tensor (gathered over dp, tp and ep), on the CPU."""
    out = {}
    for name, p in named_params:
        name = name.removeprefix("module.")
        if p.grad is None:
            out[name] = None
            continue
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        s = shards.of(name)
        if s is not None and collectives.axis_size(s[2]) > 1:
            dim, full, axis = s
            parts = [torch.empty_like(g) for _ in range(collectives.axis_size(axis))]
            dist.all_gather(parts, g.contiguous(), group=collectives._group(axis))
            if axis == "ep":  # re-placed experts (runtime.rebalance), canonical: each rank's first E/ep slots
                parts = [t.narrow(dim, 0, min(t.shape[dim], full // len(parts))) for t in parts]
            g = torch.cat(parts, dim).narrow(dim, 0, full)
        out[name] = g.detach().cpu().clone()
    return out


def numel_full(p: torch.nn.Parameter, name: str, shards: Shards) -> int:
    s = shards.of(name)
    shape = list(p.shape)
    if s is not None:
        shape[s[0]] = s[1]
    return math.prod(shape)
