"""Deterministic training data, split across dp ranks and micro-batches.

Sample `i` of step `t` is a function of (seed, t, i) only, so that any dp × micro-batch layout of the same global
batch sees the same sequences: the single-device run is the reference for every plan.
"""
from __future__ import annotations

import numpy as np
import torch


class Synthetic:
    """Arithmetic sequences modulo the vocabulary: each sequence starts at a random token and steps by a random
    stride in 1..4. A model first learns that tokens step forward, then infers each sequence's stride from its
    context, so the loss falls visibly from ln(vocab) within a few dozen steps."""

    def __init__(self, vocab: int, seq_len: int, seed: int):
        self.vocab, self.seq_len, self.seed = vocab, seq_len, seed

    def samples(self, step: int, global_batch: int, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        start = torch.randint(0, self.vocab, (global_batch,), generator=g)[lo:hi]
        stride = torch.randint(1, 5, (global_batch,), generator=g)[lo:hi]
        pos = torch.arange(self.seq_len + 1)
        seq = (start[:, None] + stride[:, None] * pos[None, :]) % self.vocab
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


class TokenFile:
    """Windows of a flat binary file of token ids, at offsets drawn from (seed, step)."""

    def __init__(self, path: str, dtype: str, seq_len: int, seed: int):
        self.tokens = np.memmap(path, dtype=np.dtype(dtype), mode="r")
        if len(self.tokens) <= seq_len + 1:
            raise SystemExit(f"scalec: {path} holds {len(self.tokens)} tokens, fewer than one sequence of {seq_len}")
        self.seq_len, self.seed = seq_len, seed

    def samples(self, step: int, global_batch: int, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(0, len(self.tokens) - self.seq_len - 1, (global_batch,), generator=g)[lo:hi]
        rows = np.stack([np.asarray(self.tokens[s:s + self.seq_len + 1], dtype=np.int64) for s in starts.tolist()])
        seq = torch.from_numpy(rows)
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def micro_batch(source, step: int, global_batch: int, dp_rank: int, dp: int, index: int, micro_batches: int):
    """Micro-batch `index` of this dp rank's share of step `step`'s global batch."""
    per_rank = global_batch // dp
    per_micro = per_rank // micro_batches
    lo = dp_rank * per_rank + index * per_micro
    return source.samples(step, global_batch, lo, lo + per_micro)
