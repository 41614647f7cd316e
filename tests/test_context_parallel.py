"""runtime/context_parallel.py on one process: each cp rank's chunks, positions, rotation and attention, stitched
back together, are the whole sequence's (the multi-rank runs: tests/e2e cases cp2_all_gather, cp4_all_gather,
dp2_cp2)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from runtime import collectives, context_parallel as CP, rotary


@pytest.fixture
def as_rank(monkeypatch):
    def set_rank(rank: int, n: int):
        monkeypatch.setattr(collectives, "axis_size", lambda axis: n)
        monkeypatch.setattr(collectives, "axis_rank", lambda axis: rank)
    return set_rank


@pytest.mark.parametrize("n", [2, 4])
def test_ranks_hold_balanced_chunks_at_their_true_positions(as_rank, n):
    s = 8 * n
    x = torch.arange(s).repeat(3, 1)  # tokens whose value is their position
    seen = []
    for r in range(n):
        as_rank(r, n)
        mine = CP.chunks(x, 1)
        assert torch.equal(mine[0], CP.positions(s // n))  # each token keeps its true position
        c = s // (2 * n)
        assert mine[0, :c].tolist() == list(range(r * c, (r + 1) * c))  # chunk i, then chunk 2n - 1 - i
        assert mine[0, c:].tolist() == list(range((2 * n - 1 - r) * c, (2 * n - r) * c))
        seen += mine[0].tolist()
    assert sorted(seen) == list(range(s))
    assert CP.gathered_positions(s // n, torch.device("cpu")).tolist() == seen


@pytest.mark.parametrize("n,gqa", [(2, False), (4, True)])
def test_attention_over_gathered_keys_is_the_whole_sequences(as_rank, n, gqa):
    torch.manual_seed(0)
    b, h, k, s, d = 2, 4, 2 if gqa else 4, 8 * n, 16
    q, kk, v = torch.randn(b, h, s, d), torch.randn(b, k, s, d), torch.randn(b, k, s, d)
    qr, kr = rotary.rotate(q, kk, 10000.0)
    want = F.scaled_dot_product_attention(qr, kr, v, is_causal=True, enable_gqa=gqa)
    local = {}
    for r in range(n):
        as_rank(r, n)
        ql, kl = CP.rotate(CP.chunks(q, 2), CP.chunks(kk, 2), 10000.0)
        local[r] = (ql, kl, CP.chunks(v, 2))
    k_all = torch.cat([local[r][1] for r in range(n)], 2)  # what the all-gather over cp returns, in rank order
    v_all = torch.cat([local[r][2] for r in range(n)], 2)
    for r in range(n):
        as_rank(r, n)
        got = CP.attention(local[r][0], k_all, v_all, gqa)
        torch.testing.assert_close(got, CP.chunks(want, 2), rtol=1e-5, atol=1e-6)


def test_a_sequence_that_does_not_cut_into_2cp_chunks_is_refused(as_rank):
    as_rank(0, 2)
    with pytest.raises(ValueError, match="does not cut into 4 equal chunks"):
        CP.chunks(torch.zeros(1, 6), 1)


def _variant_matches_whole_attention(variant: str, gqa: bool, rank: int, collectives) -> None:
    """One cp rank of `variant` (ring or all_to_all) on its chunks: the output, the gradients of q, k and v and the
    bytes moved against scaled_dot_product_attention on the whole sequence (every rank computes the reference)."""
    n = collectives.axis_size("cp")
    torch.manual_seed(0)
    b, h, k, s, d = 2, 4, 2 if gqa and n == 2 else 4, 8 * n, 16
    q, kk, v = (torch.randn(b, heads, s, d, dtype=torch.float64) for heads in (h, k, k))
    dout = torch.randn(b, h, s, d, dtype=torch.float64)
    whole = [t.clone().requires_grad_() for t in (q, kk, v)]
    F.scaled_dot_product_attention(*whole, is_causal=True, enable_gqa=k != h).backward(dout)
    mine = [CP.chunks(t, 2).requires_grad_() for t in (q, kk, v)]
    collectives.count_bytes(True)
    if variant == "ring":
        out = CP.ring_attention(*mine, k != h)
    else:
        out = CP.sequence_to_heads(F.scaled_dot_product_attention(*(CP.heads_to_sequence(t) for t in mine),
                                                                  is_causal=True, enable_gqa=k != h))
    want = F.scaled_dot_product_attention(q, kk, v, is_causal=True, enable_gqa=k != h)
    torch.testing.assert_close(out, CP.chunks(want, 2), rtol=1e-10, atol=1e-10)
    out.backward(CP.chunks(dout, 2))
    for got, ref in zip(mine, whole):
        torch.testing.assert_close(got.grad, CP.chunks(ref.grad, 2), rtol=1e-10, atol=1e-10)
    kv_block = 8 * b * k * (s // n) * d  # bytes of one rank's keys (float64)
    if variant == "ring":  # forward: keys and values, cp - 1 steps; backward: again, with their gradients, one
        assert dict(collectives.BYTES) == {("send_recv", "cp"): kv_block * (2 * (n - 1) + 2 * (n - 1) + 2 * n)}
    else:  # q, k, v and the output forward; their gradients backward
        assert dict(collectives.BYTES) == {("all_to_all", "cp"): 2 * 8 * b * (s // n) * d * (2 * h + 2 * k)}
    collectives.count_bytes(False)


# Over 4 ranks: the slow tier (`pytest --slow -m slow`, docs/testing.md); cp over 4 ranks trains in CI (e2e cp4_ring)
@pytest.mark.e2e
@pytest.mark.parametrize("variant,n,gqa", [("ring", 2, True), pytest.param("ring", 4, False, marks=pytest.mark.slow),
                                           ("all_to_all", 2, True),
                                           pytest.param("all_to_all", 4, False, marks=pytest.mark.slow)])
def test_variant_equals_whole_attention_forward_and_backward(variant, n, gqa):
    import functools

    from tests import multirank
    multirank.spawn(functools.partial(_variant_matches_whole_attention, variant, gqa), world=n, axes=("cp",),
                    timeout=120)


def test_plan_shows_attention_kept_per_rank_and_cp_traffic():
    """`plan` of the 128K sample (cp 32, ring, bf16, 2 sequences a micro-batch): each rank's 4,096 tokens;
    attention keeps per layer and micro-batch its 32 query heads and 8 key/value heads of 128 dimensions for those
    tokens of both sequences, the output and an fp32 log-sum-exp per head and token; the cp traffic is the
    ledger's."""
    from pathlib import Path
    from compiler.check import check_text
    from compiler.pipeline import compile_spec
    from compiler.report.plan import plan_text
    from compiler.report.units import nbytes
    root = Path(__file__).resolve().parents[1]
    path = root / "samples" / "llama3_8b_128k.scale"
    compiled = compile_spec(check_text(path.read_text(), str(path)))
    text = plan_text(compiled)
    b, tokens, heads, kv, d = 2, 131072 // 32, 32, 8, 128
    kept = b * (2 * tokens * heads * d * 2 + 2 * tokens * kv * d * 2 + tokens * heads * 4)  # q, out; k, v; lse
    assert kept == 168_820_736
    assert "each rank holds 4,096 of every sequence's 131,072 tokens" in text
    assert f"attention keeps {nbytes(kept)} per layer and micro-batch" in text
    assert f"32 layers: {nbytes(32 * kept)} per micro-batch" in text
    spec, plan = compiled.spec, compiled.plan
    fwd = sum(spec.value(c.bytes_per_step(), plan) for c in compiled.costs.ledger.entries
              if c.axis == "cp" and c.direction == "forward")
    assert fwd > 0 and f"cp traffic per step and rank: {nbytes(fwd)} forward" in text


def _ring_under_selective_recomputation(rank: int, collectives) -> None:
    """Selective recomputation of a block holding ring attention (runtime.recompute.run_block): the ring's forward is
    one operator whose output and log-sum-exp the policy saves, so the recomputation sends nothing (no transfer runs
    while recomputing) and the result, the gradients and the bytes are those of the block without recomputation."""
    from runtime import recompute
    n = collectives.axis_size("cp")
    torch.manual_seed(rank)
    b, h, k, s, d = 2, 4, 2, 8, 16  # s: this rank's tokens

    class Block(torch.nn.Module):
        def forward(self, x):
            q, kk, v = (x * 1.5).split([h, k, k], 1)  # a product, recomputed: the ring's inputs made again
            return CP.ring_attention(q, kk, v, True)

    sent = []
    transfer = CP._Transfer

    class Counted(transfer):
        def __init__(self, *args, **kwargs):
            sent.append(recompute.recomputing())
            super().__init__(*args, **kwargs)
    CP._Transfer = Counted
    x = torch.randn(b, h + 2 * k, s, d, dtype=torch.float64)
    g = torch.randn(b, h, s, d, dtype=torch.float64)
    got = {}
    for mode in ("none", "selective"):
        xr = x.clone().requires_grad_()
        collectives.count_bytes(True)
        collectives.BYTES.clear()
        sent.clear()
        out = recompute.run_block(Block(), xr, mode)
        out.backward(g)
        got[mode] = (out.detach(), xr.grad, dict(collectives.BYTES), list(sent))
        collectives.count_bytes(False)
    CP._Transfer = transfer
    assert torch.equal(got["none"][0], got["selective"][0]) and torch.equal(got["none"][1], got["selective"][1])
    assert got["none"][2] == got["selective"][2]
    assert got["selective"][3] == [None] * (2 * n - 1 + n - 1)  # cp − 1 forward, cp backward, none recomputing


@pytest.mark.e2e
def test_ring_under_selective_recomputation_keeps_its_output_and_sends_nothing_again():
    import functools

    from tests import multirank
    multirank.spawn(functools.partial(_ring_under_selective_recomputation), world=2, axes=("cp",), timeout=120)


@pytest.mark.parametrize("variant", ["all_gather", "all_to_all", "ring"])
def test_compile_is_refused_only_with_ring(variant):
    """`compile = true` under cp: all_gather and all_to_all compile (e2e cp2_compile, cp2_all_to_all_compile against
    the single device; tests/test_memory_compiled.py for what their regions keep); ring stays refused (E0315), at
    `compile` when written, at `context_parallel` when compile is the GPUs' default."""
    from pathlib import Path
    from compiler.check import check_text
    from compiler.diagnostics import ScaleError
    root = Path(__file__).resolve().parents[1]
    base = (root / "samples" / "gpt_tp.scale").read_text().replace("axis tp = 2", "axis cp = 2").replace(
        "device = cpu", "device = h100")
    for plan in (f"context_parallel = {variant}  compile = true", f"context_parallel = {variant}"):
        text = base.replace("sequence_parallel = false", plan)
        if variant != "ring":
            assert check_text(text, "m.scale").plan.compile
            continue
        with pytest.raises(ScaleError) as info:
            check_text(text, "m.scale")
        [d] = info.value.diagnostics
        assert d.code == "E0315" and d.key == ("compile" if "compile" in plan else "context_parallel")
