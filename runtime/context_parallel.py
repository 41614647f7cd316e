"""Context parallelism over the `cp` mesh axis: each rank of a cp group holds 1/cp of every sequence.

The sequence is cut into 2·cp chunks and cp rank i holds chunks i and 2·cp − 1 − i (the "head-tail" balancer of
Megatron-Core and torchtitan): under a causal mask every rank then has the same work, the first chunk's few keys per
query paired with the last chunk's many. Everything position-dependent follows the permutation, so each token keeps
its true position:
  - `chunks(x, dim)`: this rank's tokens and targets of a batch (runtime.train, before the model sees them);
  - `positions(n, device)`: the true positions of this rank's n tokens (the learned `positional` lookup);
  - `rotate(q, k, theta, scaling, interleaved)`: rotary embeddings at those positions;
  - `attention(q, k, v, gqa)`: causal attention of this rank's queries against the keys and values gathered over cp
    (`context_parallel = all_gather`: the pass inserts the all-gathers, collectives.all_gather_fwd_reduce_scatter_bwd
    along the sequence, before it), each query reading the keys at or before its true position. On CPU and CUDA a
    dense additive mask with scaled_dot_product_attention, made once per (length, cp rank, device, dtype).

The all-gather concatenates the ranks' chunks in rank order, so the gathered keys are at positions
`gathered_positions()`: rank 0's two chunks, then rank 1's, ... The loss needs nothing: every rank holds as many
tokens, so the mean of the ranks' token means is the sequence's mean (the batch group averages over cp).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from runtime import collectives, rotary

AXIS = "cp"


def _order(n: int, rank: int) -> list:
    """The chunk indices (of 2n) rank `rank` of n holds, in the order it holds them."""
    return [rank, 2 * n - 1 - rank]


@functools.lru_cache(maxsize=64)
def _positions(local: int, n: int, rank: int, device: torch.device) -> torch.Tensor:
    if local % 2:
        raise ValueError(f"context parallelism: {local} tokens per rank do not split into two chunks")
    c = local // 2
    return torch.cat([torch.arange(i * c, (i + 1) * c, device=device) for i in _order(n, rank)])


def positions(local: int, device: torch.device | None = None, axis: str = AXIS) -> torch.Tensor:
    """The true positions (int64) of this cp rank's `local` tokens: chunks i and 2·cp − 1 − i of the sequence."""
    n = collectives.axis_size(axis)
    if n == 1:
        return torch.arange(local, device=device)
    return _positions(local, n, collectives.axis_rank(axis), torch.device(device) if device is not None else
                      torch.device("cpu"))


def gathered_positions(local: int, device: torch.device, axis: str = AXIS) -> torch.Tensor:
    """The positions of the keys gathered over cp (every rank's `local` tokens, in rank order)."""
    n = collectives.axis_size(axis)
    return torch.cat([_positions(local, n, r, device) for r in range(n)]) if n > 1 else torch.arange(local,
                                                                                                     device=device)


def chunks(x: torch.Tensor, dim: int = 1, axis: str = AXIS) -> torch.Tensor:
    """This cp rank's tokens of `x` along `dim` (the sequence): chunks i and 2·cp − 1 − i of 2·cp, contiguous."""
    n = collectives.axis_size(axis)
    if n == 1:
        return x
    if x.shape[dim] % (2 * n):
        raise ValueError(f"context parallelism over {n} ranks: a sequence of {x.shape[dim]} tokens does not cut into "
                         f"{2 * n} equal chunks")
    parts = x.chunk(2 * n, dim)
    return torch.cat([parts[i] for i in _order(n, collectives.axis_rank(axis))], dim).contiguous()


def rotate(q_BHSD: torch.Tensor, k_BKSD: torch.Tensor, theta: float, scaling=None, interleaved: bool = False,
           axis: str = AXIS):
    """rotary.rotate at this cp rank's true positions (its queries and keys before the gather)."""
    pos = positions(q_BHSD.shape[2], q_BHSD.device, axis)
    return rotary.rotate(q_BHSD, k_BKSD, theta, scaling, interleaved=interleaved, positions=pos)


def _make_mask(local: int, n: int, rank: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    q = _positions(local, n, rank, device)
    k = torch.cat([_positions(local, n, r, device) for r in range(n)])
    keep = k[None, :] <= q[:, None]
    return torch.zeros(keep.shape, device=device, dtype=dtype).masked_fill(~keep, float("-inf"))


_mask = functools.lru_cache(maxsize=16)(_make_mask)


def causal_mask(local: int, device: torch.device, dtype: torch.dtype, axis: str = AXIS) -> torch.Tensor:
    """(local, cp · local), added to the scores: 0 where this rank's query may read a gathered key (the key's true
    position at or before the query's), -inf elsewhere. Additive, in the scores' dtype, and made once per (length,
    rank, device, dtype): scaled_dot_product_attention keeps it for backward as it is (a boolean mask would be
    converted, and the copy kept, at every call)."""
    n, rank = collectives.axis_size(axis), collectives.axis_rank(axis)
    return (_make_mask if torch.compiler.is_compiling() else _mask)(local, n, rank, device, dtype)


def attention(q_BHSD: torch.Tensor, k_BKTD: torch.Tensor, v_BKTD: torch.Tensor, gqa: bool, axis: str = AXIS,
              scale: float | None = None) -> torch.Tensor:
    """Causal attention of this rank's queries (B, H, S/cp, D) over the keys and values of the whole sequence
    (B, K, S, D), gathered over cp in rank order: each query reads the keys at or before its true position.
    (B, H, S/cp, Dv) out; `scale` None is 1/sqrt(D)."""
    mask = causal_mask(q_BHSD.shape[2], q_BHSD.device, q_BHSD.dtype, axis)
    return F.scaled_dot_product_attention(q_BHSD, k_BKTD, v_BKTD, attn_mask=mask, enable_gqa=gqa, scale=scale)
