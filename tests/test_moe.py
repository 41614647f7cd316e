"""runtime/moe.py against a naive reference, expert parallelism on two gloo processes, and the MoE trace, its
expert-parallel pass and its ledger.

The reference is written here from the definitions (GShard, Lepikhin et al. 2020; Switch, Fedus et al. 2021), with
plain Python loops over sequences, choices and tokens, and shares no code with runtime/moe.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import sympy
import torch
import torch.distributed as dist

from pathlib import Path

from compiler import spec as SPEC
from runtime import moe
from tests import multirank

ROOT = Path(__file__).resolve().parents[1]

B, S, H, E, FFN = 2, 6, 5, 4, 6   # sequences, tokens per sequence, width, experts, expert inner width
F64 = torch.float64
# route() computes the softmax in float32, so the gates carry float32 rounding: compare at about 1e-6.
TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.fixture(autouse=True)
def _aux_scale_and_stats():
    """Every test sees the auxiliary-gradient scale at 1.0 and leaves it (and the router statistics) as found."""
    saved = moe._AUX_GRAD_SCALE
    moe.set_aux_loss_scale(1.0)
    moe.stats_reset()
    yield
    moe.set_aux_loss_scale(saved)
    moe.stats_reset()


# -- the naive reference ------------------------------------------------------------------------------------------


def _softmax(v: torch.Tensor) -> list:
    m = max(float(t.detach()) for t in v)
    ex = [torch.exp(t - m) for t in v]
    total = sum(ex)
    return [t / total for t in ex]


def _gelu(t):
    return 0.5 * t * (1.0 + torch.erf(t / math.sqrt(2.0)))


def _silu(t):
    return t / (1.0 + torch.exp(-t))


def _expert(token, e: int, w: dict, act: str):
    up = token @ w["w_up"][e]
    hid = _silu(token @ w["w_gate"][e]) * up if act == "swiglu" else _gelu(up)
    return hid @ w["w_down"][e]


@dataclass
class Ref:
    out: torch.Tensor     # B × S × H
    aux: torch.Tensor     # the load-balancing loss, averaged over sequences
    dropped: int          # choices over capacity
    kept: list            # per sequence, the set of kept (token, choice) pairs
    counts: list          # per sequence, choices (all k, before dropping) per expert


def reference(x, logits, w: dict, act: str, top_k: int, cap: int, dropped: str = "residual",
              priority: str = "choice", renormalise: bool | None = None) -> Ref:
    """`priority`: "choice" (GShard: every first choice in token order, then every second choice, ...) or "token"
    (a deliberately wrong order, token by token, to show the comparison notices); `renormalise`: each gate divided by
    the sum of the token's k chosen probabilities (None: when k > 1), else the probability itself."""
    nb, ns, nh = x.shape
    ne = logits.shape[-1]
    rows, auxes, kept_all, counts_all = [], [], [], []
    n_dropped = 0
    for b in range(nb):
        probs = [_softmax(logits[b, s]) for s in range(ns)]
        choices = []
        for s in range(ns):
            order = sorted(range(ne), key=lambda e: -float(probs[s][e].detach()))
            choices.append(order[:top_k])
        if priority == "choice":
            queue = [(s, j) for j in range(top_k) for s in range(ns)]
        else:
            queue = [(s, j) for s in range(ns) for j in range(top_k)]
        used = [0] * ne
        kept = set()
        for s, j in queue:
            e = choices[s][j]
            if used[e] < cap:
                kept.add((s, j))
                used[e] += 1
        row = []
        for s in range(ns):
            total = sum(probs[s][e] for e in choices[s])
            acc = torch.zeros(nh, dtype=x.dtype)
            for j, e in enumerate(choices[s]):
                gate = probs[s][e] / total if (top_k > 1 if renormalise is None else renormalise) else probs[s][e]
                if (s, j) in kept:
                    acc = acc + gate * _expert(x[b, s], e, w, act)
                else:
                    n_dropped += 1
                    if dropped == "identity":
                        acc = acc + gate * x[b, s]
            row.append(acc)
        rows.append(torch.stack(row))
        counts = [sum(1 for s in range(ns) for c in choices[s] if c == e) for e in range(ne)]
        f = [counts[e] / (top_k * ns) for e in range(ne)]
        p_mean = [sum(probs[s][e] for s in range(ns)) / ns for e in range(ne)]
        auxes.append(ne * sum(f[e] * p_mean[e] for e in range(ne)))
        kept_all.append(kept)
        counts_all.append(counts)
    return Ref(torch.stack(rows), sum(auxes) / nb, n_dropped, kept_all, counts_all)


# -- the runtime, and the inputs both see ----------------------------------------------------------------------


def _weights(act: str, n_experts: int = E, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    w = {"router": torch.randn(H, n_experts, generator=g, dtype=F64) * 1.5,
         "w_up": torch.randn(n_experts, H, FFN, generator=g, dtype=F64) * 0.5,
         "w_down": torch.randn(n_experts, FFN, H, generator=g, dtype=F64) * 0.5}
    if act == "swiglu":
        w["w_gate"] = torch.randn(n_experts, H, FFN, generator=g, dtype=F64) * 0.5
    return w


def _experts_module(w: dict, act: str, lo: int = 0, hi: int | None = None) -> moe.Experts:
    """An Experts leaf holding experts [lo, hi) of the full weights `w`."""
    hi = w["w_up"].shape[0] if hi is None else hi
    mod = moe.Experts(hi - lo, H, FFN, act).to(F64)
    with torch.no_grad():
        for name, p in mod.named_parameters():
            p.copy_(w[name][lo:hi])
    return mod


def _run(x, router, experts: moe.Experts, n_experts: int, top_k: int, cap: int, aux_weight: float, dropped: str,
         axis: str | None = None, **renormalize):
    """The layer as compiler/model.py writes it (router → route → dispatch → experts → combine), with the two
    all-to-alls the expert-parallel pass inserts when `axis` is given."""
    slot, gate = moe.route(x @ router, top_k, cap, aux_weight, **renormalize)
    buf = moe.dispatch(x, slot, n_experts, cap)
    if axis is not None:
        buf = moe.all_to_all_dispatch(buf, axis)
    y = experts(buf)
    if axis is not None:
        y = moe.all_to_all_combine(y, axis)
    return moe.combine(y, slot, gate, x if dropped == "identity" else None), slot


def _inputs(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, S, H, generator=g, dtype=F64), torch.randn(B, S, H, generator=g, dtype=F64)


def _small_cap(top_k: int) -> int:
    return 1 if top_k == 1 else 2   # S·k choices into E·cap < S·k slots: some must drop


# -- 1. route + dispatch + Experts + combine against the reference -------------------------------------------


@pytest.mark.parametrize("dropped", ["residual", "identity"])
@pytest.mark.parametrize("cap_kind", ["small", "large"])
@pytest.mark.parametrize("act", ["gelu", "swiglu"])
@pytest.mark.parametrize("top_k", [1, 2])
def test_forward_matches_reference(top_k, act, cap_kind, dropped):
    w = _weights(act)
    x, _ = _inputs()
    cap = _small_cap(top_k) if cap_kind == "small" else S
    out, slot = _run(x, w["router"], _experts_module(w, act), E, top_k, cap, 0.0, dropped)
    ref = reference(x, x @ w["router"], w, act, top_k, cap, dropped)
    if cap_kind == "small":
        assert ref.dropped > 0
    else:
        assert ref.dropped == 0
    assert int((slot == E * cap).sum()) == ref.dropped
    # In each sequence, every kept choice sits in a distinct slot.
    for b in range(B):
        kept = slot[b][slot[b] != E * cap]
        assert kept.unique().numel() == kept.numel()
    assert out.dtype == F64 and out.shape == (B, S, H)
    torch.testing.assert_close(out, ref.out, **TOL)


@pytest.mark.parametrize("aux_weight", [0.0, 0.3])
@pytest.mark.parametrize("act,top_k,cap_kind,dropped", [
    ("gelu", 1, "small", "residual"), ("swiglu", 1, "large", "identity"),
    ("gelu", 2, "large", "residual"), ("swiglu", 2, "small", "identity"), ("swiglu", 2, "small", "residual")])
def test_gradients_match_reference(act, top_k, cap_kind, dropped, aux_weight):
    w = _weights(act)
    x0, probe = _inputs()
    cap = _small_cap(top_k) if cap_kind == "small" else S
    # The runtime: sum(output · probe); the auxiliary loss enters only through _AddAuxLoss in backward.
    x = x0.clone().requires_grad_()
    router = w["router"].clone().requires_grad_()
    experts = _experts_module(w, act)
    out, _ = _run(x, router, experts, E, top_k, cap, aux_weight, dropped)
    (out * probe).sum().backward()
    # The reference: sum(output · probe) + aux_weight · aux, differentiated by autograd.
    rx = x0.clone().requires_grad_()
    rw = {k: v.clone().requires_grad_() for k, v in w.items()}
    ref = reference(rx, rx @ rw["router"], rw, act, top_k, cap, dropped)
    assert (ref.dropped > 0) == (cap_kind == "small")
    ((ref.out * probe).sum() + aux_weight * ref.aux).backward()
    torch.testing.assert_close(x.grad, rx.grad, **TOL)
    torch.testing.assert_close(router.grad, rw["router"].grad, **TOL)
    for name, p in experts.named_parameters():
        torch.testing.assert_close(p.grad, rw[name].grad, **TOL, msg=lambda m: f"{name}: {m}")
    if aux_weight > 0:  # the auxiliary term is large enough that a missing or doubled one would show
        rr = w["router"].clone().requires_grad_()
        again = reference(x0, x0 @ rr, w, act, top_k, cap, dropped)
        (again.out * probe).sum().backward()
        assert not torch.allclose(router.grad, rr.grad, **TOL)


def test_aux_gradient_follows_the_loss_scale():
    """set_aux_loss_scale(s): the auxiliary gradient is scaled by s, as the training loop scales the loss."""
    act, top_k, cap, aux_weight, scale = "gelu", 2, 2, 0.4, 0.25
    w = _weights(act)
    x0, probe = _inputs()
    router = w["router"].clone().requires_grad_()
    moe.set_aux_loss_scale(scale)
    out, _ = _run(x0, router, _experts_module(w, act), E, top_k, cap, aux_weight, "residual")
    (out * probe).sum().backward()
    rr = w["router"].clone().requires_grad_()
    ref = reference(x0, x0 @ rr, w, act, top_k, cap)
    ((ref.out * probe).sum() + scale * aux_weight * ref.aux).backward()
    torch.testing.assert_close(router.grad, rr.grad, **TOL)


def test_forward_without_grad_mode_and_an_aux_weight():
    """Under no_grad (evaluation) route skips _AddAuxLoss: the output is unchanged and nothing fails."""
    w = _weights("gelu")
    x, _ = _inputs()
    with torch.no_grad():
        out, _ = _run(x, w["router"], _experts_module(w, "gelu"), E, 2, 2, 0.5, "residual")
    torch.testing.assert_close(out, reference(x, x @ w["router"], w, "gelu", 2, 2).out, **TOL)


def test_reference_notices_wrong_priority_gates_and_dropping():
    """The comparisons above are not vacuous: on the same inputs, a token-major queue, unnormalised gates or the
    other treatment of dropped choices each give a clearly different output."""
    act, top_k = "swiglu", 2
    w = _weights(act)
    x, _ = _inputs()
    cap = _small_cap(top_k)
    logits = x @ w["router"]
    out, _ = _run(x, w["router"], _experts_module(w, act), E, top_k, cap, 0.0, "residual")
    good = reference(x, logits, w, act, top_k, cap)
    torch.testing.assert_close(out, good.out, **TOL)
    token_major = reference(x, logits, w, act, top_k, cap, priority="token")
    assert token_major.kept != good.kept
    assert not torch.allclose(out, token_major.out, **TOL)
    assert not torch.allclose(out, reference(x, logits, w, act, top_k, cap, renormalise=False).out, **TOL)
    assert not torch.allclose(out, reference(x, logits, w, act, top_k, cap, dropped="identity").out, **TOL)


def test_route_priority_by_hand():
    """Capacity 1, top-2, three experts. Token 0 prefers e0 then e1; token 1 prefers e1 then e2. GShard fills all
    first choices first: t0→e0, t1→e1; then t0's second choice finds e1 full (dropped) and t1's goes to e2.
    Token-major order would have kept t0→e1 and dropped t1→e1."""
    logits = torch.tensor([[[3.0, 2.0, 0.0], [0.0, 3.0, 2.0]]])
    slot, gate = moe.route(logits, 2, 1, 0.0)
    trash = 3 * 1
    assert slot.tolist() == [[[0, trash], [1, 2]]]
    p = torch.softmax(torch.tensor([3.0, 2.0]), 0)
    torch.testing.assert_close(gate[0, 0], p)
    # Capacity 2: everything fits; slot = expert · C + position in the expert's queue (first choices first).
    slot, _ = moe.route(logits, 2, 2, 0.0)
    assert slot.tolist() == [[[0 * 2 + 0, 1 * 2 + 1], [1 * 2 + 0, 2 * 2 + 0]]]
    # Top-1: the gate is the probability itself, not renormalised to 1.
    _, gate1 = moe.route(logits, 1, 1, 0.0)
    torch.testing.assert_close(gate1[0, :, 0], torch.softmax(logits[0], -1).max(-1).values)


def test_dispatch_and_combine_by_hand():
    """One sequence of two tokens, two experts, capacity 1: token 0 kept in expert 1's slot, token 1 dropped."""
    x = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]], dtype=F64)
    slot = torch.tensor([[[1], [2]]])               # slot 2 = E·C: the trash slot
    buf = moe.dispatch(x, slot, 2, 1)
    assert buf.tolist() == [[[0.0, 0.0]], [[1.0, 2.0]]]
    y = torch.tensor([[[10.0, 20.0]], [[30.0, 40.0]]], dtype=F64)
    gate = torch.tensor([[[0.5], [0.25]]])
    assert moe.combine(y, slot, gate).tolist() == [[[15.0, 20.0], [0.0, 0.0]]]
    assert moe.combine(y, slot, gate, x).tolist() == [[[15.0, 20.0], [0.75, 1.0]]]


# -- 2. capacity -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seq,experts,top_k,factor,expected", [
    (32, 8, 2, 1.25, 10),   # 1.25 · 2 · 32 / 8 = 10 exactly
    (12, 4, 2, 1.25, 8),    # 7.5 → 8
    (10, 3, 1, 1.0, 4),     # 3.33 → 4
    (50, 5, 1, 1.1, 11),    # 1.1 · 50 / 5 is 11.000000000000002 in floating point: still 11
    (25, 5, 2, 1.1, 11),    # likewise
    (4, 2, 2, 2.0, 4),      # 8 would exceed the sequence: an expert takes each token at most once
    (6, 1, 2, 1.0, 6),      # one expert, top-2 (12 choices): still at most S
])
def test_capacity(seq, experts, top_k, factor, expected):
    assert moe.capacity(seq, experts, top_k, factor) == expected


def test_capacity_never_above_seq():
    for seq in (1, 3, 8, 17):
        for experts in (1, 2, 8):
            for top_k in (1, 2):
                for factor in (0.5, 1.0, 1.25, 4.0):
                    c = moe.capacity(seq, experts, top_k, factor)
                    assert 1 <= c <= seq
                    assert c == min(seq, math.ceil(round(factor * top_k * seq / experts, 9)))


def test_dropless_capacity_is_the_sequence():
    """`capacity_factor = none`: every expert has a slot for every token of a sequence (the "large" cases above
    route with it: nothing dropped, equal to the reference)."""
    for seq, experts, top_k in ((32, 8, 2), (7, 64, 1), (5, 1, 1)):
        assert moe.capacity(seq, experts, top_k, "none") == seq


def test_dropless_moe_is_checked_planned_and_ledgered():
    from compiler.check import check_text
    from compiler.report.plan import plan_text
    from compiler.pipeline import compile_spec
    text = (ROOT / "samples" / "moe_gpt.scale").read_text()
    text = text.replace("capacity_factor = 1.25", "capacity_factor = none")
    compiled = compile_spec(check_text(text, "dropless.scale"))
    spec = compiled.spec
    (layer,) = [x for x in SPEC.walk(spec.model.layers) if isinstance(x, SPEC.MoE)]
    assert layer.capacity_factor == "none" and spec.value(layer.capacity) == spec.value(spec.train.seq_len)
    out = plan_text(compiled)
    assert "dropless (capacity_factor = none)" in out
    reasons = [e.reason for e in compiled.costs.ledger.entries if e.op == "all_to_all"]
    assert reasons and all("dropless: buffers sized for the worst case" in r for r in reasons)


def test_capacity_of_a_tiny_positive_factor_is_one():
    """A positive factor, however small, leaves every expert at least one slot (the size is declared positive)."""
    assert moe.capacity(8, 8, 1, 1e-10) == 1


# -- 5. router statistics ---------------------------------------------------------------------------------------


def test_stats_match_reference():
    nb, ns, k, cap = 3, 8, 2, 3
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(nb, ns, E, generator=g, dtype=F64) * 2
    ref = reference(torch.zeros(nb, ns, H, dtype=F64), logits, _weights("gelu"), "gelu", k, cap)
    assert ref.dropped > 0
    moe.stats_reset()
    moe.route(logits, k, cap, 0.0)
    st = moe.stats_read(device="cpu")
    assert st["dropped"] == ref.dropped
    assert st["routed"] == nb * ns * k
    assert st["aux_loss"] == pytest.approx(float(ref.aux), rel=1e-6)
    assert st["max_load"] == pytest.approx(max(max(c) for c in ref.counts) / (k * ns / E))
    # A second call adds to the sums; the auxiliary loss is averaged over the calls.
    moe.route(logits[:1], k, cap, 0.0)
    ref1 = reference(torch.zeros(1, ns, H, dtype=F64), logits[:1], _weights("gelu"), "gelu", k, cap)
    st = moe.stats_read(device="cpu")
    assert st["dropped"] == ref.dropped + ref1.dropped
    assert st["routed"] == (nb + 1) * ns * k
    assert st["aux_loss"] == pytest.approx((float(ref.aux) + float(ref1.aux)) / 2, rel=1e-6)
    moe.stats_reset()
    assert moe.stats_read(device="cpu") == {"dropped": 0, "routed": 0, "aux_loss": 0.0, "max_load": 0.0}


# -- 3. expert parallelism over ep on two gloo processes -------------------------------------------------------

WORLD = 2


# (act, top_k, capacity, dropped, aux_weight)
EP_CASES = [("gelu", 1, 1, "residual", 0.0), ("swiglu", 2, 2, "identity", 0.2), ("swiglu", 2, S, "residual", 0.0)]


def _ep_body(rank, C):
    from runtime import moe as M
    local = E // WORLD
    lo, hi = rank * local, (rank + 1) * local
    for act, top_k, cap, dropped, aux in EP_CASES:
        w = _weights(act)                              # the same full weights on every rank
        x0, probe = _inputs(seed=100 + rank)           # each rank its own tokens
        # One process with every expert, on this rank's tokens.
        x1 = x0.clone().requires_grad_()
        r1 = w["router"].clone().requires_grad_()
        full = _experts_module(w, act)
        out1, slot1 = _run(x1, r1, full, E, top_k, cap, aux, dropped)
        (out1 * probe).sum().backward()
        # Expert parallel: this rank holds experts [lo, hi), slices of the same weights.
        x2 = x0.clone().requires_grad_()
        r2 = w["router"].clone().requires_grad_()
        mine = _experts_module(w, act, lo, hi)
        C.count_bytes(True)
        out2, slot2 = _run(x2, r2, mine, E, top_k, cap, aux, dropped, axis="ep")
        n = B * cap
        assert C.BYTES[("all_to_all", "ep")] == 2 * E * n * H * 8, C.BYTES   # dispatch + combine, float64
        (out2 * probe).sum().backward()
        assert C.BYTES[("all_to_all", "ep")] == 4 * E * n * H * 8, C.BYTES   # and their reverses
        C.count_bytes(False)
        assert torch.equal(slot1, slot2)
        if cap < S:
            assert bool((slot1 == E * cap).any()), "no choice was dropped: the case tests less than it should"
        # The same routing and the same arithmetic per token; only the batched matmuls see 2N rows instead of N
        # (and the expert-weight gradients sum both ranks' slots in another order), which a BLAS may round
        # differently: equal to float64 rounding (the forward is bit-identical on our machines, x.grad is not).
        exact = dict(rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(out2, out1, **exact)
        torch.testing.assert_close(x2.grad, x1.grad, **exact)
        torch.testing.assert_close(r2.grad, r1.grad, **exact)   # the router stays local (replicated weights)
        for name, p in mine.named_parameters():
            assert p.shape[0] == local
            # The all-to-all backward brings every rank's contribution to the experts' owner: the sum over ranks
            # of the single-process gradients, sliced.
            total = dict(full.named_parameters())[name].grad.clone()
            dist.all_reduce(total)
            torch.testing.assert_close(p.grad, total[lo:hi], **exact, msg=lambda m: f"{name}: {m}")
        # The ranks' tokens differ, so a rank answering with only its own slots would have been caught.
        gathered = [torch.empty_like(out1) for _ in range(WORLD)]
        dist.all_gather(gathered, out1.detach().contiguous())
        assert not torch.allclose(gathered[0], gathered[1])
    # The shapes the all-to-alls produce: E × N × H -> (E/ep) × (ep·N) × H and back.
    buf = torch.randn(E, 3, H, generator=torch.Generator().manual_seed(rank), dtype=F64)   # differs per rank
    sent = M.all_to_all_dispatch(buf, "ep")
    assert sent.shape == (local, WORLD * 3, H)
    back = M.all_to_all_combine(sent, "ep")
    assert torch.equal(back, buf)
    everyone = [torch.empty_like(buf) for _ in range(WORLD)]
    dist.all_gather(everyone, buf)
    # The slots rank i holds for this rank's experts arrive as block i of their rows.
    for i in range(WORLD):
        assert torch.equal(sent[:, i * 3:(i + 1) * 3], everyone[i][lo:hi])


@pytest.mark.e2e
def test_expert_parallel_matches_single_process():
    multirank.spawn(_ep_body, WORLD, axes=("ep",), timeout=120)


# -- 4. tracing, the expert-parallel pass and the ledger -----------------------------------------------------------

# samples/moe_gpt.scale at small sizes; {second} is the second layer of each block's dense pair, {ep} the ep degree.
MOE_TEXT = """
model moe_gpt {{
  vocab   = 32
  hidden  = 16
  heads   = 2
  layers  = 4                # layers/2 blocks of (dense layer, MoE layer): two MoE layers
  seq     = 12
  ffn     = 4 * hidden
  experts = 4

  embedding(vocab, hidden)
  positional(seq, hidden)
  repeat layers / 2 {{
    residual {{ layernorm(hidden)  attention(hidden, heads) }}
    residual {{ layernorm(hidden)  {second} }}
    residual {{ layernorm(hidden)  attention(hidden, heads) }}
    residual {{ layernorm(hidden)  moe(hidden, ffn / 2, experts, top_k = 2, capacity_factor = 1.25, act = swiglu,
                                      aux_loss = 0.01, dropped = residual) }}
  }}
  layernorm(hidden)
  lm_head(vocab, hidden, tied = true)
  cross_entropy
}}

mesh {{
  axis dp = 1
  axis ep = {ep}
  nodes = 1
  devices_per_node = {ep}
  device = cpu
}}

plan {{
  data_parallel = ddp
  micro_batches = 2
}}

train {{
  global_batch = 8
  seq_len      = seq
  steps        = 2
  seed         = 1234
  precision    = fp32
  optimizer    = adamw(lr = 3e-3)
  data         = synthetic
}}
"""
DENSE = "mlp(hidden, ffn, act = gelu)"
SECOND_MOE = "moe(hidden, ffn, 2, top_k = 1, capacity_factor = 1.0, act = gelu, aux_loss = 0.0)"


@pytest.fixture(scope="module")
def compiled():
    from compiler.check import check_text
    from compiler.pipeline import compile_spec
    out = {}
    for key, ep, second in (("ep1", 1, DENSE), ("ep2", 2, DENSE), ("ep2_two", 2, SECOND_MOE)):
        spec = check_text(MOE_TEXT.format(ep=ep, second=second), f"moe_{key}.scale")
        out[key] = compile_spec(spec, check_between=True)
    return out


def _block(c):
    (gm,) = c.traced.blocks.values()
    return gm


def _calls(gm, target):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is target]


def _experts_nodes(gm):
    return [n for n in gm.graph.nodes if n.op == "call_module" and isinstance(gm.get_submodule(n.target), moe.Experts)]


def test_trace_keeps_moe_calls_and_experts_leaf(compiled):
    from compiler import trace as T
    from compiler.symbols import MICRO_BATCH, size
    c = compiled["ep1"]
    gm = _block(c)
    (route,) = _calls(gm, moe.route)
    (disp,) = _calls(gm, moe.dispatch)
    (comb,) = _calls(gm, moe.combine)
    (experts,) = _experts_nodes(gm)
    assert not _calls(gm, moe.all_to_all_dispatch) and not _calls(gm, moe.all_to_all_combine)
    # capacity = min(seq, ceil(1.25 · 2 · 12 / 4)) = ceil(7.5) = 8
    assert c.spec.values[size("capacity")] == 8
    assert route.args[1:] == (2, 8, 0.01)
    assert disp.args[2:] == (4, 8)
    assert experts.args == (disp,) and comb.args[0] is experts
    assert gm.get_submodule(experts.target).w_up.shape == (4, 16, 32)
    assert tuple(disp.meta[T.SHAPE]) == (size("experts"), MICRO_BATCH * size("capacity"), size("hidden"))
    assert tuple(experts.meta[T.SHAPE]) == tuple(disp.meta[T.SHAPE])
    assert tuple(comb.meta[T.SHAPE]) == (MICRO_BATCH, size("seq"), size("hidden"))
    # The experts' FLOPs count every slot: 3 matmuls (SwiGLU) of 2 · E · µb·C · hidden · ffn/2.
    assert sympy.simplify(experts.meta[T.FLOPS] - 3 * 2 * size("experts") * MICRO_BATCH * size("capacity")
                          * size("hidden") * 2 * size("hidden")) == 0
    assert not [e for e in c.costs.ledger.entries if e.op == "all_to_all"]


def test_expert_parallel_pass_wraps_experts_in_all_to_alls(compiled):
    from compiler import trace as T
    from compiler.symbols import MICRO_BATCH, size
    gm = _block(compiled["ep2"])
    (disp,) = _calls(gm, moe.dispatch)
    (comb,) = _calls(gm, moe.combine)
    (experts,) = _experts_nodes(gm)
    (to,) = _calls(gm, moe.all_to_all_dispatch)
    (back,) = _calls(gm, moe.all_to_all_combine)
    assert to.args == (disp, "ep")
    assert experts.args == (to,)
    assert back.args == (experts, "ep")
    assert comb.args[0] is back
    assert list(experts.users) == [back]
    leaf = gm.get_submodule(experts.target)
    for name in ("w_up", "w_gate", "w_down"):
        assert getattr(leaf, name).shape[0] == 2   # 4 experts / ep 2
        shape = gm.meta[T.PARAM_SHAPES][f"{experts.target}.{name}"]
        assert sympy.simplify(shape[0] - size("experts") / size("ep")) == 0
    assert set(gm.meta[T.EP_SHARDS]) == {f"{experts.target}.{n}" for n in ("w_up", "w_gate", "w_down")}
    ep, e, c, h = size("ep"), size("experts"), size("capacity"), size("hidden")
    assert sympy.simplify(to.meta[T.SHAPE][0] - e / ep) == 0
    assert sympy.simplify(to.meta[T.SHAPE][1] - ep * MICRO_BATCH * c) == 0
    assert sympy.simplify(to.meta[T.SHAPE][2] - h) == 0
    assert tuple(back.meta[T.SHAPE]) == tuple(disp.meta[T.SHAPE]) == (e, MICRO_BATCH * c, h)
    assert "runtime_moe_all_to_all_dispatch" in gm.code and "runtime_moe_all_to_all_combine" in gm.code


def _all_to_alls(c):
    return [e for e in c.costs.ledger.entries if e.op == "all_to_all"]


def test_ledger_all_to_all_bytes_by_hand(compiled):
    c = compiled["ep2"]
    entries = _all_to_alls(c)
    # One MoE layer in the block: dispatch and combine, each forward and backward.
    assert len(entries) == 4
    assert sorted(e.direction for e in entries) == ["backward", "backward", "forward", "forward"]
    assert {e.axis for e in entries} == {"ep"}
    # By hand: fp32 (4 bytes) × 4 experts × capacity 8 × hidden 16 × 4 sequences per rank per step
    # (global batch 8 over dp 1 × ep 2) × 2 MoE layers (layers / 2 blocks, one each) = 16384 bytes.
    for e in entries:
        assert c.spec.value(e.bytes_per_step(), c.plan) == 16384


def test_ledger_two_moe_layer_types(compiled):
    c = compiled["ep2_two"]
    gm = _block(c)
    assert len(_experts_nodes(gm)) == 2
    assert len(_calls(gm, moe.all_to_all_dispatch)) == len(_calls(gm, moe.all_to_all_combine)) == 2
    got = sorted(c.spec.value(e.bytes_per_step(), c.plan) for e in _all_to_alls(c))
    # The second moe: 2 experts, top-1, factor 1 → capacity min(12, ceil(12 / 2)) = 6, hidden 16:
    # 4 × 2 × 6 × 16 × 4 sequences × 2 layers = 6144; the first as before, 16384.
    assert got == [6144] * 4 + [16384] * 4
    leaves = {gm.get_submodule(n.target).w_up.shape[0] for n in _experts_nodes(gm)}
    assert leaves == {1, 2}


def test_ep_policy_places_experts_evenly_and_refuses_a_remainder(compiled):
    """The policy alone, on the traced (pre-pass) block: each Experts leaf split evenly over ep, in order."""
    from compiler.passes.expert_parallel import Placement, ep_policy
    gm = _block(compiled["ep1"])  # ep = 1: the pass left the graph as traced
    (node,) = _experts_nodes(gm)
    assert ep_policy(gm, 2) == (Placement(node.name, 4, 2),)
    assert ep_policy(gm, 4) == (Placement(node.name, 4, 1),)
    with pytest.raises(AssertionError, match="do not divide over ep = 3"):
        ep_policy(gm, 3)


# -- 5. the shared expert (`shared_ffn`, `shared_gate`) ------------------------------------------------------------

SHARED = ("moe(hidden, ffn / 2, experts, top_k = 2, capacity_factor = 1.25, act = swiglu,\n"
          "                                      aux_loss = 0.01, dropped = residual)")


def _shared_text(ep: int, tp: int, act: str = "swiglu", gate: str = "sigmoid") -> str:
    text = MOE_TEXT.format(ep=ep, second=DENSE)
    text = text.replace(SHARED, SHARED[:-1].replace("act = swiglu", f"act = {act}")
                        + f", shared_ffn = 3 * hidden, shared_gate = {gate})")
    assert "shared_ffn" in text
    if tp > 1:
        text = text.replace("  axis ep = 1\n", f"  axis tp = {tp}\n").replace(
            "devices_per_node = 1", f"devices_per_node = {tp}")
    return text


@pytest.mark.parametrize("act,gate", [("swiglu", "sigmoid"), ("gelu", "none")])
def test_shared_expert_adds_an_mlp_of_every_token(act, gate):
    """The moe layer's output with a shared expert is the routed experts' output plus, for every token,
    [sigmoid(x · w) ·] down(act(x)), computed here from the weights by hand; without the shared expert's leaves
    (the same layer with `shared_ffn` removed, its other weights copied) the routed part alone."""
    from compiler.check import check_text
    from compiler.model import build
    from runtime.layers import init_parameters
    torch.manual_seed(0)
    spec = check_text(_shared_text(1, 1, act, gate), "shared.scale")
    plain = check_text(_shared_text(1, 1, act, gate).replace(f", shared_ffn = 3 * hidden, shared_gate = {gate}", ""),
                       "plain.scale")
    model, base = build(spec, "cpu"), build(plain, "cpu")
    init_parameters(model, seed=1, std=0.2, residual_out=(), layers=4)
    base.load_state_dict(model.state_dict(), strict=False)
    block, plain_block = model.blocks[0], base.blocks[0]
    names = {n for n, _ in block.named_parameters()}
    assert {n for n in names if "shared" in n} == {"moe_shared_up.weight", "moe_shared_down.weight"} | (
        {"moe_shared_gate.weight"} if act == "swiglu" else set()) | (
        {"moe_shared_sigmoid.weight"} if gate == "sigmoid" else set())
    step = block._program[-1].body[1]
    plain_step = plain_block._program[-1].body[1]
    assert isinstance(step.layer, SPEC.MoE) and step.layer.shared_gate == gate
    x = torch.randn(2, 12, 16)
    with torch.no_grad():
        got, routed = step.run(block, x), plain_step.run(plain_block, x)
        up = x @ block.moe_shared_up.weight.T
        h = torch.nn.functional.silu(x @ block.moe_shared_gate.weight.T) * up if act == "swiglu" else _gelu(up)
        shared = h @ block.moe_shared_down.weight.T
        if gate == "sigmoid":
            shared = shared / (1 + torch.exp(-(x @ block.moe_shared_sigmoid.weight.T)))
    assert shared.abs().max() > 1e-3
    torch.testing.assert_close(got, routed + shared, rtol=1e-5, atol=1e-6)


def test_shared_expert_under_tp_shards_as_an_mlp_and_under_ep_stays_dense():
    """tp: the shared expert's up and gate are column-parallel, its down row-parallel (one all-reduce each way, in
    the ledger), the router, the sigmoid gate and the routed experts whole. ep: the shared expert is a dense part:
    not among the expert shards, its gradients in the dp × ep average."""
    from compiler import trace as T
    from compiler.check import check_text
    from compiler.pipeline import compile_spec
    from compiler.symbols import size
    tp = compile_spec(check_text(_shared_text(1, 2), "shared_tp.scale"), check_between=True)
    gm = _block(tp)
    shapes = gm.meta[T.PARAM_SHAPES]
    h, t = size("hidden"), size("tp")
    assert sympy.simplify(shapes["moe_shared_up.weight"][0] - 3 * h / t) == 0
    assert sympy.simplify(shapes["moe_shared_gate.weight"][0] - 3 * h / t) == 0
    assert sympy.simplify(shapes["moe_shared_down.weight"][1] - 3 * h / t) == 0
    assert tuple(shapes["moe_shared_sigmoid.weight"]) == (1, h)
    assert tuple(shapes["moe_router.weight"]) == (size("experts"), h)
    assert gm.get_submodule("moe_shared_up").weight.shape == (24, 16)
    reasons = [e.reason for e in tp.costs.ledger.entries if "moe_shared_down" in e.reason]
    assert len(reasons) == 2 and any("row-parallel" in r for r in reasons), reasons
    ep = compile_spec(check_text(_shared_text(2, 1), "shared_ep.scale"), check_between=True)
    gm = _block(ep)
    assert not [n for n in gm.meta[T.EP_SHARDS] if "shared" in n]
    # 4 · 16 · 48 · 3 shared weights + 16 sigmoid weights per moe layer, two layers: in the dense average only
    plain = compile_spec(check_text(MOE_TEXT.format(ep=2, second=DENSE), "plain_ep.scale"))
    extra = 2 * (3 * 16 * 48 + 16)
    assert ep.costs.params_n - plain.costs.params_n == extra
    assert ep.costs.expert_params_rank == plain.costs.expert_params_rank
    dense = [e for e in ep.costs.ledger.entries if e.axis == "dp×ep"]
    plain_dense = [e for e in plain.costs.ledger.entries if e.axis == "dp×ep"]
    assert len(dense) == len(plain_dense) == 1
    assert (ep.spec.value(dense[0].bytes_per_step(), ep.plan)
            - plain.spec.value(plain_dense[0].bytes_per_step(), plain.plan)) == 4 * extra


def test_shared_gate_without_a_shared_expert_warns():
    from compiler.check import check_text
    from compiler.diagnostics import ScaleError
    text = MOE_TEXT.format(ep=1, second=DENSE).replace("dropped = residual)", "dropped = residual, "
                                                                                "shared_gate = sigmoid)")
    spec = check_text(text, "gate_only.scale")
    assert [d.code for d in spec.warnings] == ["W0711"]
    (m,) = [x for x in SPEC.walk(spec.model.layers) if isinstance(x, SPEC.MoE)]
    assert m.shared_ffn is None and m.shared_gate == "none"


# -- 6. the router's renormalisation (`renormalize`) ---------------------------------------------------------------


@pytest.mark.parametrize("top_k,renormalize", [(2, False), (2, True), (1, True), (1, False), (3, False)])
def test_renormalize_matches_reference_forward_and_gradients(top_k, renormalize):
    """renormalize = false: each gate is its softmax probability over all the experts (Qwen2-MoE's
    norm_topk_prob = false); true: divided by the sum of the token's k (Qwen3-MoE, Mixtral); with k = 1 every
    gate is then 1. Forward and gradients against the reference."""
    act = "swiglu"
    w = _weights(act)
    x0, probe = _inputs()
    x = x0.clone().requires_grad_()
    router = w["router"].clone().requires_grad_()
    experts = _experts_module(w, act)
    out, _ = _run(x, router, experts, E, top_k, S, 0.0, "residual", renormalize=renormalize)
    (out * probe).sum().backward()
    rx = x0.clone().requires_grad_()
    rw = {k: v.clone().requires_grad_() for k, v in w.items()}
    ref = reference(rx, rx @ rw["router"], rw, act, top_k, S, renormalise=renormalize)
    (ref.out * probe).sum().backward()
    torch.testing.assert_close(out, ref.out, **TOL)
    torch.testing.assert_close(x.grad, rx.grad, **TOL)
    torch.testing.assert_close(router.grad, rw["router"].grad, **TOL)
    # the setting matters: the other choice computes something else (for k = 1 and false, the default itself)
    other = reference(x0, x0 @ w["router"], w, act, top_k, S, renormalise=not renormalize)
    assert not torch.allclose(out.detach(), other.out, **TOL)
    if top_k == 1 and renormalize:  # every gate 1 (p / p, in fp32): the router's gradient is only rounding
        assert float(router.grad.abs().max()) < 1e-7


def test_renormalize_default_keeps_the_call_and_its_opposite_is_written():
    """The default (true when top_k > 1) leaves route's call as before the setting existed (goldens unchanged);
    the other value is written into the call as `renormalize=`, and the saved bytes lose the division's."""
    from compiler import trace as T
    from compiler.check import check_text
    from compiler.pipeline import compile_spec
    base = MOE_TEXT.format(ep=1, second=DENSE)
    for text, kwargs in ((base, {}), (base.replace("dropped = residual)", "dropped = residual, renormalize = true)"),
                                      {}),
                         (base.replace("dropped = residual)", "dropped = residual, renormalize = false)"),
                          {"renormalize": False})):
        gm = _block(compile_spec(check_text(text, "renorm.scale")))
        (route,) = _calls(gm, moe.route)
        assert dict(route.kwargs) == kwargs
    spec = check_text(base.replace("top_k = 2", "top_k = 1").replace("dropped = residual)",
                                                                       "dropped = residual, renormalize = true)"),
                      "top1.scale")
    assert [d.code for d in spec.warnings] == ["W0712"]


def test_plan_names_the_shared_expert_and_unrenormalised_gates_only_when_there():
    from compiler.check import check_text
    from compiler.pipeline import compile_spec
    from compiler.report.plan import plan_text
    text = _shared_text(2, 1).replace("dropped = residual,", "dropped = residual, renormalize = false,")
    out = plan_text(compile_spec(check_text(text, "shared.scale")))
    assert "a shared expert of width 3*hidden = 48 for every token, scaled by sigmoid(x · w); a dense part " \
           "(replicated over ep)" in out, out
    assert "gates: each the chosen experts' softmax probability, not renormalised" in out
    plain = plan_text(compile_spec(check_text(MOE_TEXT.format(ep=2, second=DENSE), "plain.scale")))
    assert "shared expert" not in plain and "gates:" not in plain


@pytest.mark.parametrize("groups,topk_groups,top_k,renormalize", [(1, 1, 2, True), (4, 2, 3, True),
                                                                  (8, 3, 4, False), (2, 1, 2, True)])
def test_sigmoid_group_limited_routing_is_deepseek_v3s(groups, topk_groups, top_k, renormalize):
    """`moe(..., scoring = sigmoid, groups, topk_groups, routed_scale)` chooses the experts transformers'
    DeepseekV3TopkRouter chooses (sigmoid scores; each group scored by its two best experts; the top_k within the
    topk_groups best groups) with its gates (the chosen sigmoids, renormalised or not, times routed_scaling_factor),
    to 1e-6, and its gradient reaches the router through the gates."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
    e, h, b, s = 16, 32, 3, 20
    config = transformers.DeepseekV3Config(hidden_size=h, n_routed_experts=e, num_experts_per_tok=top_k,
                                           n_group=groups, topk_group=topk_groups, norm_topk_prob=renormalize,
                                           routed_scaling_factor=2.5)
    hf = DeepseekV3TopkRouter(config)
    torch.manual_seed(0)
    with torch.no_grad():
        hf.weight.normal_(0, 0.5)
    x = torch.randn(b, s, h)
    _, want_gate, want_expert = hf(x)
    logits = (x @ hf.weight.detach().t()).requires_grad_()
    slot, gate = moe.route(logits, top_k, s, 0.0, renormalize=renormalize, scoring="sigmoid", groups=groups,
                           topk_groups=topk_groups, scale=2.5)
    expert = (slot // s).reshape(b * s, top_k)  # dropless (capacity = seq): slot = expert · seq + position
    def choices(experts, gates):
        return {(t, int(i), round(float(g), 6)) for t in range(b * s) for i, g in zip(experts[t], gates[t])}
    assert choices(expert, gate.detach().reshape(-1, top_k)) == choices(want_expert, want_gate.detach())
    gate.sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_the_expert_bias_shifts_choices_not_gates_and_moves_against_the_load():
    """DeepSeek-V3's auxiliary-loss-free balancing: the bias is added to the scores a token chooses by, never to
    its gates; the forward counts each expert's choices into the load (not without grad, not while recording is
    off); the update raises the bias of the experts under the mean load by the rate, lowers those over it, and
    resets the load."""
    torch.manual_seed(0)
    b, s, e = 2, 6, 4
    logits = torch.randn(b, s, e)
    bias = moe.ExpertBias(e, rate=0.25)
    bias.bias.copy_(torch.tensor([0.0, 0.0, 0.0, 5.0]))  # expert 3 is every token's choice
    slot, gate = moe.route(logits, 2, s, 0.0, scoring="sigmoid", bias=bias())
    expert = slot // s
    assert (expert == 3).any(-1).all()
    want = torch.sigmoid(logits).gather(-1, expert)
    torch.testing.assert_close(gate, want / want.sum(-1, keepdim=True))  # the bias is not in the gates
    load = torch.zeros(e).index_add_(0, expert.flatten(), torch.ones(b * s * 2))
    assert torch.equal(bias.load, load) and bias.load[3] == b * s
    with torch.no_grad():
        moe.route(logits, 2, s, 0.0, scoring="sigmoid", bias=bias())  # evaluation: not counted
    with moe.not_recording():
        moe.route(logits, 2, s, 0.0, scoring="sigmoid", bias=bias())
    assert torch.equal(bias.load, load)
    before = bias.bias.clone()
    moe.update_expert_bias([bias])
    torch.testing.assert_close(bias.bias, before + 0.25 * torch.sign(load.mean() - load))
    assert not bias.load.any()


def _bias_body(rank: int, _) -> None:
    """Each of two ranks routes its half of the batch; the update sums their loads: the biases equal one process's
    routing the whole batch, step after step."""
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 6, 8)  # 3 steps of 4 sequences
    ours, whole = moe.ExpertBias(8, rate=0.05), moe.ExpertBias(8, rate=0.05)
    for step in range(3):
        moe.route(logits[step, 2 * rank:2 * rank + 2], 2, 6, 0.0, scoring="sigmoid", groups=4, topk_groups=2,
                  bias=ours())
        moe.route(logits[step], 2, 6, 0.0, scoring="sigmoid", groups=4, topk_groups=2, bias=whole())
        moe.update_expert_bias([ours], dist.group.WORLD)
        moe.update_expert_bias([whole])
        assert torch.equal(ours.bias, whole.bias), (step, ours.bias, whole.bias)
    assert whole.bias.abs().sum() > 0


@pytest.mark.e2e
def test_the_expert_bias_over_batch_ranks_is_the_single_process_bias():
    multirank.spawn(_bias_body, 2, axes=(), timeout=120)


# -- dropless without padding (`dispatch = grouped`, issue 25) ------------------------------------------------------


def _run_grouped(x, router, experts: moe.Experts, n_experts: int, top_k: int, aux_weight: float,
                 axis: str | None = None):
    """The grouped layer as compiler/model.py writes it (route with capacity = S → sort_tokens → experts(rows,
    counts) → unsort_combine), with the counts exchange and the two variable all-to-alls of the expert-parallel
    pass when `axis` is given."""
    s = x.shape[1]
    slot, gate = moe.route(x @ router, top_k, s, aux_weight)
    rows, counts = moe.sort_tokens(x, slot, n_experts, s)
    if axis is None:
        y = experts(rows, counts)
    else:
        layout = moe.exchange_counts(counts, axis)
        y = experts(moe.all_to_all_dispatch_grouped(rows, counts, layout, axis), layout)
        y = moe.all_to_all_combine_grouped(y, counts, layout, axis)
    return moe.unsort_combine(y, slot, gate, s), slot, counts


def _skewed(n_experts: int, seed: int = 0):
    """fp32 weights whose router sends no token to the last two experts and most to expert 0: uneven loads,
    experts with zero rows."""
    w = {k: v.float() for k, v in _weights("swiglu", n_experts, seed).items()}
    w["router"][:, -2:] = 0.0
    w["router"][-1] = 0.0
    w["router"][-1, -2:] = -50.0   # the tokens' last feature is a constant 5 (_constant_feature)
    w["router"][-1, 0] = 0.3
    return w


def _constant_feature(x):
    """`x` with its last feature 5 everywhere, which _skewed's router turns into a bias per expert."""
    x[..., -1] = 5.0
    return x


def _reassociated(want: torch.Tensor) -> dict:
    """The tolerance of one fp32 computation against the same sums taken in another order.

    Float addition is not associative: a sum reassociated (another BLAS blocking, which differs between x86 CPUs
    and their AVX2 / AVX-512 kernels, or a scatter-add in another order) differs by a few ulps of its largest
    terms, not of its result, so an element that is a small difference of large terms (a gradient near 0) can miss
    a fixed atol of 1e-6: another x86 CPU measured 1.27e-6 here, where this machine gives at most 0.81 ulp of the
    tensor's largest element (3.8e-6 beside 39.5). So the absolute tolerance is 8 ulps (float32 eps = 2^-23) of the
    tensor's largest element: at least 3.7e-6 for these tensors (the smallest largest element is 3.9), above both
    CPUs' figures with room, and still five orders below what a wrong row, expert or gate changes (O(1))."""
    scale = float(want.detach().abs().max())
    return dict(rtol=1e-5, atol=8 * torch.finfo(torch.float32).eps * max(scale, 1.0))


@pytest.mark.parametrize("act", ["gelu", "swiglu"])
@pytest.mark.parametrize("top_k", [1, 2])
def test_grouped_equals_padded_dropless_exactly(act, top_k):
    """One process, fp32: the grouped path (rows sorted by expert, one matmul per expert's rows) computes what the
    padded dropless path (every expert a buffer of S slots per sequence) computes, with uneven loads and experts
    that receive no token: the same outputs and gradients to float32 rounding."""
    n_experts = 6
    w = _skewed(n_experts)
    g = torch.Generator().manual_seed(3)
    x0, probe = _constant_feature(torch.randn(B, S, H, generator=g)), torch.randn(B, S, H, generator=g)
    outs = []
    for grouped in (False, True):
        x = x0.clone().requires_grad_()
        router = w["router"][:, :n_experts].clone().requires_grad_()
        mod = _experts_module({k: v for k, v in w.items()}, act).float()
        if grouped:
            out, slot, counts = _run_grouped(x, router, mod, n_experts, top_k, 0.01)
            assert counts.tolist()[-2:] == [0, 0] and counts.sum() == B * S * top_k
            assert len(set(counts.tolist())) > 2, counts   # uneven
        else:
            out, slot = _run(x, router, mod, n_experts, top_k, S, 0.01, "residual")
        (out * probe).sum().backward()
        outs.append((out, x.grad, router.grad, {n: p.grad for n, p in mod.named_parameters()}))
    (o1, x1, r1, p1), (o2, x2, r2, p2) = outs
    # The same products per token; a BLAS may block a matmul of n rows differently from one of S·B rows, and the
    # backward sums in another order (a gather's gradient is a scatter-add; the padded buffer's zero slots add
    # exact zeros to the weight gradients): equal to float32 rounding.
    for got, want in ((o2, o1), (x2, x1), (r2, r1)):
        torch.testing.assert_close(got, want, **_reassociated(want))
    for name in p1:
        torch.testing.assert_close(p2[name], p1[name], **_reassociated(p1[name]), msg=lambda m: f"{name}: {m}")
        assert not p2[name][-2:].any()   # the experts without tokens get no gradient


def test_grouped_experts_of_no_rows():
    mod = moe.Experts(3, H, FFN, "gelu")
    assert mod(torch.zeros(0, H), torch.zeros(3, dtype=torch.long)).shape == (0, H)


def _grouped_ep_body(rank, C):
    local = E // WORLD
    lo, hi = rank * local, (rank + 1) * local
    w = {k: v for k, v in _weights("swiglu", E).items()}
    w["router"][:, -1] = 0.0
    w["router"][-1] = 0.0
    w["router"][-1, -1] = -50.0                     # the last expert (rank 1's) gets nothing: uneven splits
    x0, probe = _inputs(seed=100 + rank)
    x0 = _constant_feature(x0)
    x1 = x0.clone().requires_grad_()
    r1 = w["router"].clone().requires_grad_()
    full = _experts_module(w, "swiglu")
    out1, _, counts = _run_grouped(x1, r1, full, E, 2, 0.01)
    (out1 * probe).sum().backward()
    x2 = x0.clone().requires_grad_()
    r2 = w["router"].clone().requires_grad_()
    mine = _experts_module(w, "swiglu", lo, hi)
    C.count_bytes(True)
    out2, _, _ = _run_grouped(x2, r2, mine, E, 2, 0.01, axis="ep")
    sent = counts.reshape(WORLD, local).sum(1)
    everyone = [torch.empty_like(counts) for _ in range(WORLD)]
    dist.all_gather(everyone, counts)
    received = sum(c[lo:hi].sum() for c in everyone)
    t = B * S * 2
    # the counts (E int64), then this rank's T rows out, then the rows it received back
    assert C.BYTES[("all_to_all", "ep")] == E * 8 + (t + received) * H * 8, (C.BYTES, received)
    (out2 * probe).sum().backward()
    assert C.BYTES[("all_to_all", "ep")] == E * 8 + 2 * (t + received) * H * 8, C.BYTES
    C.count_bytes(False)
    assert int(sent.sum()) == t
    exact = dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out2, out1, **exact)
    torch.testing.assert_close(x2.grad, x1.grad, **exact)
    torch.testing.assert_close(r2.grad, r1.grad, **exact)
    for name, p in mine.named_parameters():
        total = dict(full.named_parameters())[name].grad.clone()
        dist.all_reduce(total)
        torch.testing.assert_close(p.grad, total[lo:hi], **exact, msg=lambda m: f"{name}: {m}")


@pytest.mark.e2e
def test_grouped_expert_parallel_matches_single_process():
    """Two gloo ranks: the counts exchanged, rows sent with variable splits (one expert receiving none), the
    grouped experts, the rows returned: the single process's outputs and gradients, and the bytes counted are what
    each rank sent."""
    multirank.spawn(_grouped_ep_body, WORLD, axes=("ep",), timeout=120)


def test_shared_ffn_none_keeps_the_moe_layer():
    """`shared_ffn = none` is the default, no shared expert: the moe layers stay, the parameters are those of the
    same model with the argument left out (it once dropped every moe layer without a word)."""
    from compiler.check import check_text
    from compiler.pipeline import compile_spec
    text = MOE_TEXT.format(ep=1, second=DENSE)
    written = text.replace("dropped = residual)", "dropped = residual, shared_ffn = none)")
    assert written != text
    plain, none = (compile_spec(check_text(t, f"{n}.scale")) for n, t in (("plain", text), ("none", written)))
    assert none.costs.params_n == plain.costs.params_n
    moes = [x for x in SPEC.walk(none.spec.model.layers) if isinstance(x, SPEC.MoE)]
    assert len(moes) == 1 and moes[0].shared_ffn is None
    import dataclasses
    (same,) = [x for x in SPEC.walk(plain.spec.model.layers) if isinstance(x, SPEC.MoE)]
    assert dataclasses.replace(moes[0], span=same.span) == same


@pytest.mark.parametrize("router", [{}, dict(scoring="sigmoid", groups=2, topk_groups=1, renormalize=True)])
def test_route_shares_under_context_parallelism_make_the_whole_sequence(router):
    """Context parallelism (dropless): each of cp ranks routes its head-tail chunks of every sequence with the whole
    sequences' choice counts (`choice_counts`, summed over the ranks). The shares' aux losses sum to the sequence's;
    with the gradients averaged over cp, as the batch group does, the logits' gradients (through the gates and the
    aux loss) are the single rank's; the logged statistics are its too."""
    torch.manual_seed(3)
    cp, s, k, weight = 2, 8, 2, 0.5
    logits = torch.randn(B, s, E, dtype=torch.float32)
    w = torch.randn(B, s, k)

    def stats_of(run):
        moe.stats_reset()
        run()
        return moe.stats_read(torch.device("cpu"))

    whole = logits.clone().requires_grad_()

    def single():
        slot, gate = moe.route(whole, k, s, weight, **router)
        (gate * w).sum().backward()
    one = stats_of(single)

    c = s // (2 * cp)
    held = [list(range(r * c, (r + 1) * c)) + list(range((2 * cp - 1 - r) * c, (2 * cp - r) * c)) for r in range(cp)]
    kw = {k_: v for k_, v in router.items() if k_ != "renormalize"}
    total = sum(moe.choice_counts(logits[:, idx], k, **kw) for idx in held)
    shares = logits.clone().requires_grad_()

    def split():
        for idx in held:
            slot, gate = moe.route(shares[:, idx], k, s // cp, weight, counts=total, tokens=s, **router)
            # each rank's loss weighs its own tokens cp times (a mean over 1/cp of them)
            (cp * (gate * w[:, idx]).sum()).backward()
    got = stats_of(split)
    # the batch group averages the ranks' gradients
    torch.testing.assert_close(shares.grad / cp, whole.grad, rtol=1e-5, atol=1e-7)
    assert got["routed"] == one["routed"] and got["dropped"] == one["dropped"] == 0
    assert got["aux_loss"] == pytest.approx(one["aux_loss"], rel=1e-6)
    assert got["max_load"] == pytest.approx(one["max_load"], rel=1e-6)
    # the shares' aux gradient is needed: without the whole counts the gradient differs
    alone = logits.clone().requires_grad_()
    for idx in held:
        moe.route(alone[:, idx], k, s // cp, weight, **router)[1].mul(cp * w[:, idx]).sum().backward()
    assert not torch.allclose(alone.grad / cp, whole.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dispatch", ["padded", "grouped"])
def test_context_parallel_moe_routes_its_share_and_ledgers_the_counts(dispatch):
    """cp 2 × ep 2 over a dropless moe: the generated program routes each rank's S/cp tokens (capacity, buffers
    and sorting at S/cp), with the sequences' choice counts all-reduced over cp first; the ledger holds that
    all-reduce (B·E int64 per layer and micro-batch), the dense gradients' all-reduce over cp × ep and the experts'
    over cp; the all-to-alls move S/cp tokens' slots. A moe with a capacity is refused under cp (E0312)."""
    from compiler.check import check_text
    from compiler.diagnostics import ScaleError
    from compiler.pipeline import compile_spec
    from compiler import codegen
    from tests.e2e.runner import with_plan
    text = (ROOT / "samples" / "moe_gpt.scale").read_text()
    with pytest.raises(ScaleError) as refused:
        check_text(with_plan(text, "cap.scale", axes=(("cp", 2), ("ep", 2)), devices_per_node=4), "cap.scale")
    assert [d.code for d in refused.value.diagnostics] == ["E0312"]
    text = text.replace("capacity_factor = 1.25", "capacity_factor = none").replace(
        "dropped = residual)", "dropped = residual)" if dispatch == "padded" else "dispatch = grouped)")
    spec = check_text(with_plan(text, "cp.scale", axes=(("cp", 2), ("ep", 2)), devices_per_node=4), "cp.scale")
    compiled = compile_spec(spec)
    program = codegen.program(compiled.spec, compiled.traced, compiled.costs, compiled.plan)
    seq, experts, hidden, b, calls = 32, 8, 64, 4, 4  # b: 16 sequences over ep 2, 2 micro-batches; calls: 2
    # layers × 2 micro-batches
    entries = compiled.costs.ledger.entries
    counts = [e for e in entries if e.op == "all_reduce" and e.axis == "cp" and "choices per expert" in e.reason]
    assert [(e.direction, e.dtype_bytes, e.times, e.bytes) for e in counts] == [("forward", 8, calls,
                                                                               calls * b * experts * 8)]
    grads = {e.axis: e.bytes for e in entries if "gradients" in e.reason}
    assert set(grads) == {"dp×cp×ep", "cp"} and grads["cp"] == compiled.costs.expert_params_rank * 4
    rows = b * seq // 2 * (2 if dispatch == "grouped" else experts)  # S/cp tokens: top-2 rows, or E slots each
    a2a = [e.bytes for e in entries if e.op == "all_to_all" and e.dtype_bytes == 4]
    assert len(a2a) == 4 and set(a2a) == {calls * rows * hidden * 4}
    assert f"tokens = {seq})" in program and "moe.choice_counts(" in program
    assert f"moe.route(moe_router, 2, {seq // 2}, 0.01, counts = " in program
