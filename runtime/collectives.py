"""Autograd-aware collectives over a named mesh axis, each named by its contract: what it does forward, backward.

  identity_fwd_all_reduce_bwd     before a column-parallel linear: every rank needs the whole input; the gradient
                                  each rank computes for it is partial and must be summed
  all_reduce_fwd_identity_bwd     after a row-parallel linear: each rank holds a partial sum of the output
  all_gather_fwd_reduce_scatter_bwd   sequence parallelism, before a column-parallel linear (dim = sequence)
  reduce_scatter_fwd_all_gather_bwd   sequence parallelism, after a row-parallel linear
  split_fwd_all_gather_bwd        take this rank's chunk of a replicated tensor (dim = sequence)
  all_gather_fwd_split_bwd        sequence parallelism, before work every rank repeats on the whole sequence (a
                                  `moe`'s routing): each rank's gradient of the result is already whole
  vocab_parallel_cross_entropy    the mean cross-entropy of logits sharded over the vocabulary, never gathering them

Each is the identity when the axis has size 1. Groups are registered by runtime.mesh at start-up. Byte counting is
opt-in (`count_bytes(True)`): each collective then adds the bytes of the full tensor it moves, the measure the
compiler's ledger predicts; when off it costs one boolean test per call.
"""
from __future__ import annotations

import collections

import torch
import torch.distributed as dist

from runtime import faults, recompute

_GROUPS: dict[str, dist.ProcessGroup] = {}
_COUNTING = False
BYTES: collections.Counter = collections.Counter()  # (op, axis) -> bytes moved since the last reset


def register(axis: str, group) -> None:
    _GROUPS[axis] = group


def _group(axis: str):
    return _GROUPS.get(axis)


def registered(axis: str) -> bool:
    """Whether this program registered a process group for `axis` (a group of one rank is not registered)."""
    return axis in _GROUPS


def axis_size(axis: str) -> int:
    g = _GROUPS.get(axis)
    return 1 if g is None else dist.get_world_size(g)


def axis_rank(axis: str) -> int:
    g = _GROUPS.get(axis)
    return 0 if g is None else dist.get_rank(g)


def count_bytes(on: bool) -> None:
    """Turn byte counting on or off, and clear the counts."""
    global _COUNTING
    _COUNTING = on
    BYTES.clear()


def _count(op: str, axis: str, t: torch.Tensor, times: int = 1) -> None:
    """Count `times` × the bytes of `t` (an all-gather's output is its input times the group's size)."""
    # Selective recomputation reads a collective's saved output back instead of running it: nothing moves then,
    # except for an all-gather, which it runs again (runtime.recompute.RECOMPUTE).
    if _COUNTING and (recompute.recomputing() != "selective" or op == "all_gather"):
        BYTES[(op, axis)] += times * t.numel() * t.element_size()


def count_moved(op: str, axis: str, t: torch.Tensor, times: int = 1) -> None:
    """Count a collective issued outside this module, as its own are (`_count`): FSDP2's FP8 gathers on gloo
    (runtime.fp8.ByteAllGather)."""
    _count(op, axis, t, times)


def _name(axis: str) -> str:
    g = _group(axis)
    return (g if g is not None else dist.group.WORLD).group_name


# The primitives issue torch's functional collectives (out of place, `torch.ops._c10d_functional`), not the in-place
# `dist.*` calls: selective recomputation (runtime.recompute) saves their outputs by op, so a recomputed block reads
# them back instead of communicating again; an in-place collective's result could not be returned that way.
_F = torch.ops._c10d_functional


# -- primitives (no autograd) -------------------------------------------------------------------------------------


def _all_reduce(x: torch.Tensor, axis: str, site=None, when: str = "forward") -> torch.Tensor:
    _count("all_reduce", axis, x)
    with faults.op(f"all_reduce over {axis} ({when})", faults.axis_site(site, axis), "all_reduce"):
        return _F.wait_tensor(_F.all_reduce(x.contiguous(), "sum", _name(axis)))


def _all_gather(x: torch.Tensor, axis: str, dim: int, site=None, when: str = "forward") -> torch.Tensor:
    n = axis_size(axis)
    x = x.movedim(dim, 0).contiguous()
    _count("all_gather", axis, x, n)
    with faults.op(f"all_gather over {axis} ({when})", faults.axis_site(site, axis), "all_gather"):
        out = _F.wait_tensor(_F.all_gather_into_tensor(x, n, _name(axis)))
    return out.movedim(0, dim).contiguous()  # downstream: matmuls, and pipeline sends that need contiguity


def _reduce_scatter(x: torch.Tensor, axis: str, dim: int, site=None, when: str = "forward") -> torch.Tensor:
    n = axis_size(axis)
    if x.shape[dim] % n:
        raise ValueError(f"reduce-scatter over {axis}: dim {dim} of size {x.shape[dim]} does not divide by {n}")
    _count("reduce_scatter", axis, x)
    x = x.movedim(dim, 0).contiguous()
    with faults.op(f"reduce_scatter over {axis} ({when})", faults.axis_site(site, axis),
                   "reduce_scatter"):
        out = _F.wait_tensor(_F.reduce_scatter_tensor(x, "sum", n, _name(axis)))
    return out.movedim(0, dim).contiguous()


def _split(x: torch.Tensor, axis: str, dim: int) -> torch.Tensor:
    n = axis_size(axis)
    if x.shape[dim] % n:
        raise ValueError(f"split over {axis}: dim {dim} of size {x.shape[dim]} does not divide by {n}")
    return x.chunk(n, dim)[axis_rank(axis)].contiguous()


# -- autograd pairs -----------------------------------------------------------------------------------------------


class _IdentityFwdAllReduceBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, axis, site):
        ctx.axis, ctx.site = axis, site
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return _all_reduce(g, ctx.axis, ctx.site, "backward"), None, None


class _AllReduceFwdIdentityBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, axis, site):
        return _all_reduce(x, axis, site)  # out of place: x is not written

    @staticmethod
    def backward(ctx, g):
        return g, None, None


class _AllGatherFwdReduceScatterBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, axis, dim, site):
        ctx.axis, ctx.dim, ctx.site = axis, dim, site
        return _all_gather(x, axis, dim, site)

    @staticmethod
    def backward(ctx, g):
        return _reduce_scatter(g, ctx.axis, ctx.dim, ctx.site, "backward"), None, None, None


class _ReduceScatterFwdAllGatherBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, axis, dim, site):
        ctx.axis, ctx.dim, ctx.site = axis, dim, site
        return _reduce_scatter(x, axis, dim, site)

    @staticmethod
    def backward(ctx, g):
        return _all_gather(g, ctx.axis, ctx.dim, ctx.site, "backward"), None, None, None


class _SplitFwdAllGatherBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, axis, dim, site):
        ctx.axis, ctx.dim, ctx.site = axis, dim, site
        return _split(x, axis, dim)

    @staticmethod
    def backward(ctx, g):
        return _all_gather(g, ctx.axis, ctx.dim, ctx.site, "backward"), None, None, None


class _AllGatherFwdSplitBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, axis, dim, site):
        ctx.axis, ctx.dim = axis, dim
        return _all_gather(x, axis, dim, site)

    @staticmethod
    def backward(ctx, g):
        return _split(g, ctx.axis, ctx.dim), None, None, None


def identity_fwd_all_reduce_bwd(x: torch.Tensor, axis: str) -> torch.Tensor:
    """Forward: identity. Backward: all-reduce (sum) over `axis`."""
    return x if axis_size(axis) == 1 else _IdentityFwdAllReduceBwd.apply(x, axis, faults.caller_site())


def all_reduce_fwd_identity_bwd(x: torch.Tensor, axis: str) -> torch.Tensor:
    """Forward: all-reduce (sum) over `axis`. Backward: identity."""
    return x if axis_size(axis) == 1 else _AllReduceFwdIdentityBwd.apply(x, axis, faults.caller_site())


def all_gather_fwd_reduce_scatter_bwd(x: torch.Tensor, axis: str, dim: int) -> torch.Tensor:
    """Forward: all-gather the chunks along `dim` over `axis`. Backward: reduce-scatter (sum) along `dim`."""
    return x if axis_size(axis) == 1 else _AllGatherFwdReduceScatterBwd.apply(x, axis, dim, faults.caller_site())


def reduce_scatter_fwd_all_gather_bwd(x: torch.Tensor, axis: str, dim: int) -> torch.Tensor:
    """Forward: reduce-scatter (sum) along `dim` over `axis`. Backward: all-gather along `dim`."""
    return x if axis_size(axis) == 1 else _ReduceScatterFwdAllGatherBwd.apply(x, axis, dim, faults.caller_site())


def split_fwd_all_gather_bwd(x: torch.Tensor, axis: str, dim: int) -> torch.Tensor:
    """Forward: keep this rank's chunk along `dim`. Backward: all-gather along `dim`."""
    return x if axis_size(axis) == 1 else _SplitFwdAllGatherBwd.apply(x, axis, dim, faults.caller_site())


def all_gather_fwd_split_bwd(x: torch.Tensor, axis: str, dim: int) -> torch.Tensor:
    """Forward: all-gather the chunks along `dim` over `axis`. Backward: keep this rank's chunk of the gradient
    (every rank computed the same whole gradient from the same whole input: summing them would count it n times)."""
    return x if axis_size(axis) == 1 else _AllGatherFwdSplitBwd.apply(x, axis, dim, faults.caller_site())


# -- vocabulary parallelism ---------------------------------------------------------------------------------------


def vocab_parallel_lookup(tokens: torch.Tensor, weight: torch.Tensor, axis: str) -> torch.Tensor:
    """This rank's part of the embedding of `tokens`: the rows it holds, zeros for the others. Its `weight` holds
    rows [rank·V_local, (rank+1)·V_local); summing the parts over `axis` gives the full embedding. No collective."""
    if axis_size(axis) == 1:
        return torch.nn.functional.embedding(tokens, weight)
    n_local = weight.shape[0]
    lo = axis_rank(axis) * n_local
    outside = (tokens < lo) | (tokens >= lo + n_local)
    rows = torch.nn.functional.embedding((tokens - lo).masked_fill(outside, 0), weight)
    return rows.masked_fill(outside.unsqueeze(-1), 0.0)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of logits sharded over the vocabulary (Megatron-LM's algorithm): three all-reduces of one
    number per token (max, sum of exponentials, target logit); the backward is local. With `ignore` (packed
    documents, runtime.packed.IGNORE) the targets equal to it count zero, loss and gradient, and the sum is still
    divided by every token (runtime.packed.cross_entropy's convention)."""

    @staticmethod
    def forward(ctx, logits, targets, axis, vocab, ignore):
        n_local = logits.shape[-1]
        lo = axis_rank(axis) * n_local
        if lo + n_local > vocab:  # padded columns past the real vocabulary never take probability
            logits = logits.clone()
            logits[:, max(0, vocab - lo):] = float("-inf")
        peak = logits.max(dim=-1).values
        _count("all_reduce", axis, peak)
        site = faults.caller_site()
        with faults.op(f"all_reduce (MAX) over {axis} (forward)", faults.axis_site(site, axis), "all_reduce"):
            peak = _F.wait_tensor(_F.all_reduce(peak, "max", _name(axis)))
        shifted = logits - peak.unsqueeze(-1)
        mine = (targets >= lo) & (targets < lo + n_local)
        local = (targets - lo).masked_fill(~mine, 0)
        target_logit = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(~mine, 0.0)
        target_logit = _all_reduce(target_logit, axis, site)
        exp = shifted.exp()
        sum_exp = _all_reduce(exp.sum(dim=-1), axis, site)
        loss = sum_exp.log() - target_logit
        softmax = exp / sum_exp.unsqueeze(-1)
        if ignore is None:
            ctx.save_for_backward(softmax, mine, local)
            return loss.mean()
        kept = targets != ignore  # an ignored target is in no rank's slice (it is negative): `mine` is False there
        ctx.save_for_backward(softmax, mine, local, kept)
        return loss.masked_fill(~kept, 0.0).sum() / loss.numel()

    @staticmethod
    def backward(ctx, g):
        softmax, mine, local, *kept = ctx.saved_tensors
        grad = softmax.clone()
        rows = torch.arange(grad.shape[0], device=grad.device)
        grad[rows, local] -= mine.to(grad.dtype)
        if kept:
            grad *= kept[0].unsqueeze(-1).to(grad.dtype)
        return grad * (g / grad.shape[0]), None, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, axis: str, vocab: int,
                                 ignore: int | None = None) -> torch.Tensor:
    """Mean cross-entropy of (tokens, V_local) logits sharded over `axis` against (tokens,) targets; columns at or
    past `vocab` are padding and masked out. `ignore` (packed documents): targets equal to it count zero, and the
    sum is divided by all the tokens, the ignored ones included."""
    if axis_size(axis) == 1:
        if ignore is None:
            return torch.nn.functional.cross_entropy(logits[:, :vocab], targets)
        return torch.nn.functional.cross_entropy(logits[:, :vocab], targets, ignore_index=ignore,
                                                 reduction="sum") / targets.numel()
    return _VocabParallelCrossEntropy.apply(logits, targets, axis, vocab, ignore)
