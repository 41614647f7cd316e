"""runtime/collectives.py on two gloo processes, each result against the single-process computation."""
from __future__ import annotations

import pytest

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tests import multirank

pytestmark = pytest.mark.e2e  # gloo ranks (tests/multirank.py): not the fast part

WORLD = 2


def _cross_entropy(rank, C):
    torch.manual_seed(0)
    vocab, tokens = 7, 10  # 7 does not divide by 2: each rank holds 4 columns, the last one padding
    logits = torch.randn(tokens, vocab, dtype=torch.float64)
    targets = torch.randint(0, vocab, (tokens,))
    full = logits.clone().requires_grad_()
    ref = F.cross_entropy(full, targets)
    ref.backward()
    padded = torch.cat([logits, torch.zeros(tokens, 1, dtype=torch.float64)], 1)
    local = padded[:, rank * 4:(rank + 1) * 4].clone().requires_grad_()
    C.count_bytes(True)
    loss = C.vocab_parallel_cross_entropy(local, targets, "tp", vocab)
    loss.backward()
    assert torch.allclose(loss, ref, rtol=1e-12, atol=0), (loss, ref)
    grad_ref = torch.cat([full.grad, torch.zeros(tokens, 1, dtype=torch.float64)], 1)[:, rank * 4:(rank + 1) * 4]
    assert torch.allclose(local.grad, grad_ref, rtol=1e-12, atol=1e-15)
    assert C.BYTES[("all_reduce", "tp")] == 3 * tokens * 8  # max, sum of exponentials, target logit


def test_vocab_parallel_cross_entropy_matches_cross_entropy_with_padding():
    multirank.spawn(_cross_entropy, WORLD)


def _embedding(rank, C):
    torch.manual_seed(1)
    weight = torch.randn(8, 3, dtype=torch.float64)
    tokens = torch.randint(0, 8, (2, 5))
    local = weight[rank * 4:(rank + 1) * 4].clone().requires_grad_()
    out = C.all_reduce_fwd_identity_bwd(C.vocab_parallel_lookup(tokens, local, "tp"), "tp")
    assert torch.equal(out, F.embedding(tokens, weight))
    full = weight.clone().requires_grad_()
    F.embedding(tokens, full).pow(2).sum().backward()
    out.pow(2).sum().backward()
    assert torch.allclose(local.grad, full.grad[rank * 4:(rank + 1) * 4])


def test_vocab_parallel_embedding():
    multirank.spawn(_embedding, WORLD)


def _pairs(rank, C):
    torch.manual_seed(2)
    x = torch.randn(2, 6, 3, dtype=torch.float64)  # (batch, seq, hidden): dim 1 is the sequence
    w = torch.randn(3, 3, dtype=torch.float64)
    # Sequence parallel round trip: gather, a per-rank computation, reduce-scatter, against one process.
    chunk = x.chunk(WORLD, 1)[rank].clone().requires_grad_()
    gathered = C.all_gather_fwd_reduce_scatter_bwd(chunk, "tp", 1)
    assert torch.equal(gathered, x)
    partial = gathered @ w * (rank + 1)  # rank r's partial sum
    y = C.reduce_scatter_fwd_all_gather_bwd(partial, "tp", 1)
    full_x = x.clone().requires_grad_()
    full_y = full_x @ w * sum(r + 1 for r in range(WORLD))
    assert torch.allclose(y, full_y.chunk(WORLD, 1)[rank])
    y.pow(2).sum().backward()
    full_y.chunk(WORLD, 1)[rank].pow(2).sum().backward()
    # Each rank's chunk gradient includes every rank's loss term through the collectives.
    g = full_x.grad.clone()
    dist.all_reduce(g)
    assert torch.allclose(chunk.grad, g.chunk(WORLD, 1)[rank])
    # Split: this rank's chunk forward, the whole gradient gathered backward.
    whole = x.clone().requires_grad_()
    part = C.split_fwd_all_gather_bwd(whole, "tp", 1)
    assert torch.equal(part, x.chunk(WORLD, 1)[rank])
    (part * (rank + 1)).sum().backward()
    expected = torch.cat([torch.full_like(c, r + 1) for r, c in enumerate(x.chunk(WORLD, 1))], 1)
    assert torch.equal(whole.grad, expected)
    # All-gather forward, this rank's chunk of the (whole, replicated) gradient backward.
    mine = x.chunk(WORLD, 1)[rank].clone().requires_grad_()
    whole_again = C.all_gather_fwd_split_bwd(mine, "tp", 1)
    assert torch.equal(whole_again, x)
    (whole_again * expected).sum().backward()  # the same whole gradient on every rank
    assert torch.equal(mine.grad, expected.chunk(WORLD, 1)[rank])
    # Identity forward, all-reduce backward.
    a = x.clone().requires_grad_()
    (C.identity_fwd_all_reduce_bwd(a, "tp") * (rank + 1)).sum().backward()
    assert torch.all(a.grad == sum(r + 1 for r in range(WORLD)))


def test_autograd_pairs():
    multirank.spawn(_pairs, WORLD)
