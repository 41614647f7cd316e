"""What the runtime needs to know about parameters sharded over `tp`: which, along which dim, from what full size.

The compiler writes the table into the generated program (`Config.tp_shards`: (name pattern, dim, full size)), with
`*` standing for a block's index. Parameters are initialised whole and sliced (`shard_of`), so every tp degree
starts from the single-device model's weights; gradients are gathered back whole for comparisons.
"""
from __future__ import annotations

import fnmatch
import math

import torch
import torch.distributed as dist

from runtime import collectives


class Shards:
    def __init__(self, shards: tuple, partial_grads: tuple):
        self._shards = tuple(shards)
        self._partial = tuple(partial_grads)

    def of(self, name: str) -> tuple[int, int] | None:
        """(dim, full size of that dim) if parameter `name` is sharded over tp, else None."""
        name = name.removeprefix("module.")
        for pattern, dim, full in self._shards:
            if fnmatch.fnmatchcase(name, pattern):
                return dim, full
        return None

    def partial(self, name: str) -> bool:
        """Whether the gradient of `name` is partial over tp (sequence parallelism) and must be summed."""
        name = name.removeprefix("module.")
        return any(fnmatch.fnmatchcase(name, p) for p in self._partial)


def local_slice(full: torch.Tensor, dim: int, local: int) -> torch.Tensor:
    """This tp rank's slice of `full` along `dim`, zero-padded at the end to `local` × tp."""
    n, rank = collectives.axis_size("tp"), collectives.axis_rank("tp")
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
                   scale=None) -> torch.Tensor:
    """The global gradient norm of the single-device model, from sharded pieces; scales gradients down to
    `max_norm` when above it (as torch.nn.utils.clip_grad_norm_). tp-sharded gradients are summed over tp,
    replicated ones counted once; FSDP's dp shards (DTensor gradients) are summed over dp; pipeline stages' norms
    over pp. `scale` (default: the parameters measured) are the gradients scaled: a tied copy is measured once
    but scaled on both stages."""
    named = [(n, p) for n, p in named_params if p.grad is not None]
    device = named[0][1].grad.device if named else torch.device("cpu")
    sharded = torch.zeros((), device=device, dtype=torch.float64)
    replicated = torch.zeros((), device=device, dtype=torch.float64)
    dp_sharded = False
    for name, p in named:
        dp_sharded |= hasattr(p.grad, "to_local")
        sq = _local(p.grad).double().pow(2).sum()
        if shards.of(name) is not None:
            sharded += sq
        else:
            replicated += sq
    if collectives.axis_size("tp") > 1:
        dist.all_reduce(sharded, group=collectives._group("tp"))
    total = sharded + replicated
    if dp_sharded and dp_group is not None:
        dist.all_reduce(total, group=dp_group)
    if pp_group is not None:
        dist.all_reduce(total, group=pp_group)
    norm = total.sqrt()
    if max_norm > 0:
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for p in (scale if scale is not None else [p for _, p in named]):
            if p.grad is not None:
                _local(p.grad).mul_(coef.to(p.grad.dtype))
    return norm.float()


def full_grads(named_params, shards: Shards) -> dict:
    """Every gradient as the single-device model's whole tensor (gathered over dp and tp), on the CPU."""
    out = {}
    for name, p in named_params:
        name = name.removeprefix("module.")
        if p.grad is None:
            out[name] = None
            continue
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        s = shards.of(name)
        if s is not None and collectives.axis_size("tp") > 1:
            dim, full = s
            parts = [torch.empty_like(g) for _ in range(collectives.axis_size("tp"))]
            dist.all_gather(parts, g.contiguous(), group=collectives._group("tp"))
            g = torch.cat(parts, dim).narrow(dim, 0, full)
        out[name] = g.detach().cpu().clone()
    return out


def numel_full(p: torch.nn.Parameter, name: str, shards: Shards) -> int:
    s = shards.of(name)
    shape = list(p.shape)
    if s is not None:
        shape[s[0]] = s[1]
    return math.prod(shape)
