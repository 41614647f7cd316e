"""Packed documents: many documents per sequence of a token file, cut at a separator id
(`data = tokens(path = ..., document_separator = ID)`), each attending only to itself.

The convention is Megatron-LM's `--reset-position-ids --reset-attention-mask --eod-mask-loss`:
  - the separator ends its document: it belongs to the document before it (that document predicts it, so a model
    learns where documents end), and the next document starts at the token after it;
  - document ids: `documents(tokens, sep)`, for each position the number of separators strictly before it in the
    sequence (so the first document of a window is 0, whether or not it starts at the window's first token);
  - positions restart at 0 at each document's first token (rotary and learned positions alike);
  - attention is block-diagonal causal: a query reads the keys of its own document at or before it;
  - the loss: a target whose input token is the separator (the next document's first token, or whatever follows
    the separator) is not predicted (`IGNORE`); the loss is the sum of the other targets' cross entropies divided by
    the number of tokens of the micro-batch, B·S, masked ones included (`cross_entropy`). Every rank of every plan
    holds as many tokens, so the mean over ranks and micro-batches of these figures is the global batch's, exactly
    the single device's, without a count of the masked targets being exchanged.

The document ids of a micro-batch travel beside its tokens and targets (runtime.model_parts): the loop enters
`batch(docs)` around the micro-batch's forward and backward, and the calls the model makes read it:
  - `positions(tokens)`: the positions of the rank's tokens within their documents, (B, n) (learned positions);
  - `rotate(q, k, theta, scaling)`: rotary embeddings at those positions;
  - `attention(q, k, v, gqa)`: block-diagonal causal attention; on CUDA FlexAttention with a block mask built from
    the document ids (blocks wholly across documents are skipped), elsewhere scaled_dot_product_attention with a
    dense additive mask (B, 1, Sq, Sk). The mask is made once per micro-batch and shared by every layer.
Under context parallelism (`axis cp`, all_gather) `docs` is the whole sequence's: a rank's queries are its chunks'
(runtime.context_parallel.positions), its keys the gathered ones in rank order (gathered_positions), so the mask is
the document ids of the local queries against the gathered keys and the positions are the true ones. Under cp's
all_to_all (Ulysses) `positions` and `rotate` take the cp axis, but `attention` runs after the heads-to-sequence
all-to-alls on whole sequences in natural order, without an axis: the single device's mask. Under tensor
parallelism each rank calls `rotate` and `attention` on its own heads (the mask has one head dim, shared), and its
vocabulary-parallel loss ignores the same targets (runtime.collectives.vocab_parallel_cross_entropy, `ignore`).
"""
from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn.functional as F

from runtime import collectives, context_parallel, rotary

IGNORE = -100
"""The target value of a token that is not predicted (cross_entropy's ignore_index)."""


def documents(tokens_BS: torch.Tensor, separator: int) -> torch.Tensor:
    """(B, S) int64: the document of each position, the number of separators strictly before it."""
    ends = (tokens_BS == separator).to(torch.int64)
    return torch.cumsum(ends, dim=1) - ends


def mask_targets(tokens_BS: torch.Tensor, targets_BS: torch.Tensor, separator: int) -> torch.Tensor:
    """The targets with those after a separator (input token = separator) set to IGNORE: never predicted across a
    boundary."""
    return targets_BS.masked_fill(tokens_BS == separator, IGNORE)


def restart_positions(docs_BS: torch.Tensor) -> torch.Tensor:
    """(B, S) int64: each position's offset from its document's first token."""
    s = docs_BS.shape[1]
    idx = torch.arange(s, device=docs_BS.device).expand_as(docs_BS)
    first = torch.zeros_like(docs_BS, dtype=torch.bool)
    first[:, 0] = True
    first[:, 1:] = docs_BS[:, 1:] != docs_BS[:, :-1]
    start = torch.cummax(torch.where(first, idx, torch.zeros_like(idx)), dim=1).values
    return idx - start


class _Batch:
    """The current micro-batch's documents: the whole sequences' ids (B, S), and what is made from them once."""

    def __init__(self, docs_BS: torch.Tensor):
        self.docs = docs_BS
        self.cache: dict = {}


_current: list = []


@contextlib.contextmanager
def batch(docs_BS: torch.Tensor):
    """The document ids of the micro-batch whose forward (and backward: recomputation re-reads them) runs inside."""
    _current.append(_Batch(docs_BS))
    try:
        yield
    finally:
        _current.pop()


def _now() -> _Batch:
    if not _current:
        raise RuntimeError("packed documents: the model ran outside `packed.batch(documents)` (the training loop "
                           "enters it around each micro-batch)")
    return _current[-1]


def _local(n: int, device: torch.device, axis: str | None) -> tuple:
    """(query positions in the whole sequence, key positions) of this rank's n tokens: 0..n-1 for both without cp;
    under cp the rank's chunks and the gathered order."""
    if axis is None or collectives.axis_size(axis) == 1:
        idx = torch.arange(n, device=device)
        return idx, idx
    return context_parallel.positions(n, device, axis), context_parallel.gathered_positions(n, device, axis)


def positions(tokens_BS: torch.Tensor, axis: str | None = None) -> torch.Tensor:
    """(B, n) int64: the positions within their documents of this rank's n tokens `tokens_BS` (read for its length
    and device only)."""
    return _positions(tokens_BS.shape[1], tokens_BS.device, axis)


def _positions(n: int, device, axis: str | None) -> torch.Tensor:
    if torch.device(device).type == "meta" and not _current:  # the compiler's shapes: no batch, no values
        return torch.zeros((1, n), dtype=torch.int64, device=device)
    b = _now()
    key = ("positions", n, axis)
    if key not in b.cache:
        docs = b.docs.to(device)
        q, _ = _local(n, docs.device, axis)
        b.cache[key] = restart_positions(docs)[:, q]
    return b.cache[key]


def rotate(q_BHSD: torch.Tensor, k_BKSD: torch.Tensor, theta: float, scaling=None, interleaved: bool = False,
           axis: str | None = None):
    """rotary.rotate at each token's position within its document (each row of the batch its own positions)."""
    pos_BS = _positions(q_BHSD.shape[2], q_BHSD.device, axis)
    return rotary.rotate(q_BHSD, k_BKSD, theta, scaling, interleaved=interleaved, positions=pos_BS[:, None, :])


def _dense_mask(docs: torch.Tensor, q: torch.Tensor, k: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    dq, dk = docs[:, q], docs[:, k]
    keep = (dq[:, :, None] == dk[:, None, :]) & (k[None, None, :] <= q[None, :, None])
    return torch.zeros(keep.shape, device=docs.device, dtype=dtype).masked_fill(~keep, float("-inf"))[:, None]


@functools.cache
def _flex():
    """FlexAttention compiled once (runtime.attention's reason)."""
    from torch.nn.attention.flex_attention import flex_attention
    return torch.compile(flex_attention, dynamic=False)


def _block_mask(docs: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
    from torch.nn.attention.flex_attention import create_block_mask
    dq, dk = docs[:, q].contiguous(), docs[:, k].contiguous()

    def keep(b, h, q_idx, kv_idx):
        return (dq[b, q_idx] == dk[b, kv_idx]) & (k[kv_idx] <= q[q_idx])
    return create_block_mask(keep, B=docs.shape[0], H=None, Q_LEN=len(q), KV_LEN=len(k), device=docs.device)


def attention(q_BHSD: torch.Tensor, k_BKTD: torch.Tensor, v_BKTD: torch.Tensor, gqa: bool, axis: str | None = None,
              scale: float | None = None) -> torch.Tensor:
    """Block-diagonal causal attention of this rank's queries (B, H, S, D) over the keys and values (B, K, T, D):
    T = S without cp, the whole sequence gathered over cp with it. (B, H, S, Dv) out; `scale` None is 1/sqrt(D)."""
    if q_BHSD.is_meta and not _current:  # the compiler's shapes: no batch, no values
        return F.scaled_dot_product_attention(q_BHSD, k_BKTD[:, :, :q_BHSD.shape[2]], v_BKTD[:, :, :q_BHSD.shape[2]],
                                              is_causal=True, enable_gqa=gqa, scale=scale)
    b = _now()
    n = q_BHSD.shape[2]
    if q_BHSD.is_cuda:
        key = ("block", n, axis)
        if key not in b.cache:
            docs = b.docs.to(q_BHSD.device)
            b.cache[key] = _block_mask(docs, *_local(n, docs.device, axis))
        return _flex()(q_BHSD, k_BKTD, v_BKTD, block_mask=b.cache[key], enable_gqa=gqa, scale=scale)
    key = ("dense", n, axis, q_BHSD.dtype)
    if key not in b.cache:
        docs = b.docs.to(q_BHSD.device)
        b.cache[key] = _dense_mask(docs, *_local(n, docs.device, axis), q_BHSD.dtype)
    return F.scaled_dot_product_attention(q_BHSD, k_BKTD, v_BKTD, attn_mask=b.cache[key], enable_gqa=gqa,
                                          scale=scale)


def cross_entropy(logits_NV: torch.Tensor, targets_N: torch.Tensor) -> torch.Tensor:
    """The sum of the predicted targets' cross entropies (IGNORE ones count zero) over the N tokens, divided by N."""
    return F.cross_entropy(logits_NV, targets_N, ignore_index=IGNORE, reduction="sum") / targets_N.numel()
