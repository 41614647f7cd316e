"""The node-deduplicated expert dispatch (runtime/moe_nodes.py, `plan { ep_dispatch = "nodes" }`): on 4 gloo ranks
simulating 2 nodes of 2, each token crosses to a node once, fans out there, and the layer computes what one process
computes with every expert (outputs and gradients, float64); the bytes counted over the rail and the node are the
rows the routes say."""
from __future__ import annotations

import math
from fractions import Fraction
from itertools import combinations
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from compiler.check import check_text
from compiler.cost.ledger_parts import expected_nodes
from compiler.pipeline import compile_spec
from runtime import moe, moe_nodes
from tests import multirank

F64 = torch.float64
E, H, FFN, B, S, K, GROUPS, TOPK_GROUPS = 8, 6, 5, 2, 5, 3, 4, 2
WORLD, LOCAL = 4, 2  # 2 nodes of 2 ranks: ep rank = node · 2 + local index


def _weights():
    g = torch.Generator().manual_seed(3)
    return {"router": torch.randn(H, E, generator=g, dtype=F64),
            "w_up": torch.randn(E, H, FFN, generator=g, dtype=F64) * 0.5,
            "w_gate": torch.randn(E, H, FFN, generator=g, dtype=F64) * 0.5,
            "w_down": torch.randn(E, FFN, H, generator=g, dtype=F64) * 0.5}


def _experts(w, lo, hi):
    mod = moe.Experts(hi - lo, H, FFN, "swiglu").to(F64)
    with torch.no_grad():
        for name, p in mod.named_parameters():
            p.copy_(w[name][lo:hi])
    return mod


def _route(x, router):
    """DeepSeek-V3's router at toy size: sigmoid scores, top 3 within the best 2 of 4 groups, gates × 2.5."""
    return moe.route(x @ router, K, S, 0.01, scoring="sigmoid", groups=GROUPS, topk_groups=TOPK_GROUPS, scale=2.5)


def _body(rank, C):
    node, local = divmod(rank, LOCAL)
    rails = [dist.new_group([i, i + LOCAL]) for i in range(LOCAL)]      # every rank creates every group, in order
    nodes = [dist.new_group([2 * n, 2 * n + 1]) for n in range(WORLD // LOCAL)]
    C.register(moe_nodes.RAIL, rails[local])
    C.register(moe_nodes.NODE, nodes[node])
    w = _weights()
    g = torch.Generator().manual_seed(100 + rank)
    x0, probe = torch.randn(B, S, H, generator=g, dtype=F64), torch.randn(B, S, H, generator=g, dtype=F64)
    # the reference: this rank's tokens through every expert in one process (sort_tokens, unsort_combine)
    x1, r1 = x0.clone().requires_grad_(), w["router"].clone().requires_grad_()
    full = _experts(w, 0, E)
    slot, gate = _route(x1, r1)
    rows, counts = moe.sort_tokens(x1, slot, E, S)
    out1 = moe.unsort_combine(full(rows, counts), slot, gate, S)
    (out1 * probe).sum().backward()
    # the node dispatch: this rank's 2 experts
    per = E // WORLD
    x2, r2 = x0.clone().requires_grad_(), w["router"].clone().requires_grad_()
    mine = _experts(w, rank * per, (rank + 1) * per)
    C.count_bytes(True)
    slot2, gate2 = _route(x2, r2)
    routes = moe_nodes.node_routes(slot2, S, E)
    sent, got, layout = moe_nodes.node_dispatch(x2, gate2, routes)
    out2 = moe_nodes.node_combine(mine(sent, layout), got, routes)
    forward = dict(C.BYTES)
    (out2 * probe).sum().backward()
    backward = {k: v - forward.get(k, 0) for k, v in C.BYTES.items()}
    C.count_bytes(False)
    close = dict(rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out2, out1, **close)
    torch.testing.assert_close(x2.grad, x1.grad, **close)
    torch.testing.assert_close(r2.grad, r1.grad, **close)
    for name, p in mine.named_parameters():
        total = dict(full.named_parameters())[name].grad.clone()
        dist.all_reduce(total)
        torch.testing.assert_close(p.grad, total[rank * per:(rank + 1) * per], **close, msg=lambda m: f"{name}: {m}")
    # rows over the rail: one per (token, node it visits), with its choices within the node (int64) and gates
    # (fp32), K each; the counts: one int64 per node over the rail, one per expert of the node over the node
    expert_TK = (slot // S).reshape(B * S, K)
    p = sum(len(set((expert_TK[t] // (E // 2)).tolist())) for t in range(B * S))
    assert p < B * S * K  # a token with two choices on one node: fewer rows cross than there are choices
    assert len(routes.token_P) == p
    u, q, r = sum(routes.recv1), len(routes.row_Q), int(routes.layout.sum())
    assert forward[("all_to_all", moe_nodes.RAIL)] == 2 * 8 + p * K * 8 + p * H * 8 + p * K * 4 + u * H * 8
    assert forward[("all_to_all", moe_nodes.NODE)] == 4 * 8 + (q + r) * H * 8
    assert backward[("all_to_all", moe_nodes.RAIL)] == p * H * 8 + u * H * 8 + u * K * 4
    assert backward[("all_to_all", moe_nodes.NODE)] == (q + r) * H * 8
    assert ("all_to_all", "ep") not in C.BYTES
    _fp8_body(rank, C, w, x0, probe, mine, per)


def _fp8_body(rank, C, w, x0, probe, mine, per):
    """Under precision = fp8 (set_fp8): the rows cross both stages as float8 bytes with a scale per 128 elements;
    the layer equals one process's on the rows rounded so (each token's row is rounded alike wherever it goes),
    the gradients passed through the rounding; the rail and the node move 1 byte per element and 4 per scale."""
    x1, r1 = x0.clone().requires_grad_(), w["router"].clone().requires_grad_()
    full = _experts(w, 0, E)
    slot, gate = _route(x1, r1)
    q, scale = moe_nodes._quantize(x1.detach().reshape(B * S, H))
    rounded = moe_nodes._dequantize(q, scale, F64).reshape(B, S, H)
    x1q = x1 + (rounded - x1).detach()  # the rounding, its gradient passed through
    rows, counts = moe.sort_tokens(x1q, slot, E, S)
    out1 = moe.unsort_combine(full(rows, counts), slot, gate, S)
    (out1 * probe).sum().backward()
    x2, r2 = x0.clone().requires_grad_(), w["router"].clone().requires_grad_()
    for p in mine.parameters():
        p.grad = None
    moe_nodes.set_fp8(True)
    try:
        C.count_bytes(True)
        slot2, gate2 = _route(x2, r2)
        routes = moe_nodes.node_routes(slot2, S, E)
        sent, got, layout = moe_nodes.node_dispatch(x2, gate2, routes)
        out2 = moe_nodes.node_combine(mine(sent, layout), got, routes)
        forward = dict(C.BYTES)
        (out2 * probe).sum().backward()
        C.count_bytes(False)
    finally:
        moe_nodes.set_fp8(False)
    assert not torch.equal(rounded, x0)  # the rounding changes the rows
    close = dict(rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out2, out1, **close)
    torch.testing.assert_close(x2.grad, x1.grad, **close)
    torch.testing.assert_close(r2.grad, r1.grad, **close)
    for name, p in mine.named_parameters():
        total = dict(full.named_parameters())[name].grad.clone()
        dist.all_reduce(total)
        torch.testing.assert_close(p.grad, total[rank * per:(rank + 1) * per], **close, msg=lambda m: f"{name}: {m}")
    p_, u = len(routes.token_P), sum(routes.recv1)
    q_, r_ = len(routes.row_Q), int(routes.layout.sum())
    blocks = -(-H // moe_nodes.FP8_BLOCK)
    assert forward[("all_to_all", moe_nodes.RAIL)] == 2 * 8 + p_ * K * 8 + p_ * (H + 4 * blocks) + p_ * K * 4 + \
        u * H * 8
    assert forward[("all_to_all", moe_nodes.NODE)] == 4 * 8 + q_ * (H + 4 * blocks) + r_ * H * 8


def test_fp8_rows_round_trip_within_e4m3s_precision():
    """The FP8 dispatch's rounding: blocks of 128 elements (the last shorter) scaled to e4m3's largest value, each
    element back within its 3-bit mantissa's half step (2^-4 relative) or the block's subnormal floor, zeros kept;
    bytes: one per element, one fp32 scale per block."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 300, generator=g) * torch.logspace(-3, 3, 300)
    x[2] = 0.0
    q, scale = moe_nodes._quantize(x)
    assert q.dtype == torch.uint8 and q.shape == (5, 300) and scale.shape == (5, 3) and scale.dtype == torch.float32
    back = moe_nodes._dequantize(q, scale, torch.float32)
    floor = scale.repeat_interleave(moe_nodes.FP8_BLOCK, dim=1)[:, :300] * 2.0 ** -9  # e4m3's least subnormal step
    assert ((back - x).abs() <= x.abs() * 2.0 ** -4 + floor).all()
    assert (back[2] == 0).all()


@pytest.mark.e2e
@pytest.mark.slow
def test_node_dispatch_matches_single_process():
    """Four gloo ranks as 2 nodes of 2: the node dispatch and combine equal one process's grouped layer, outputs
    and every gradient (router, tokens, experts), and move the rows the routes say. Slow tier (13-25 s to spawn four
    ranks): CI trains the same dispatch against the single device in the e2e case `deepseek_ep4_nodes`, its bytes
    within the ledger's bounds."""
    multirank.spawn(_body, WORLD, axes=("ep",), timeout=120)


def _brute_nodes(experts, top_k, groups, topk_groups, nodes) -> Fraction:
    """Every set of `topk_groups` groups, then every set of `top_k` of their experts, equally likely: the mean count
    of distinct nodes (E/nodes consecutive experts each) the chosen experts lie on."""
    per_group, per_node = experts // groups, experts // nodes
    total, count = Fraction(0), 0
    for chosen in combinations(range(groups), topk_groups):
        pool = [e for g in chosen for e in range(g * per_group, (g + 1) * per_group)]
        for picks in combinations(pool, top_k):
            total += len({e // per_node for e in picks})
            count += 1
    return total / count


@pytest.mark.parametrize("shape", [(8, 3, 4, 2, 2), (16, 4, 8, 4, 4), (16, 4, 4, 2, 8), (12, 3, 3, 2, 4),
                                   (12, 4, 1, 1, 3), (16, 2, 2, 1, 4), (8, 8, 1, 1, 8)])
def test_expected_nodes_is_the_brute_force_count(shape):
    """The ledger's rows per token across nodes (groups aligned with nodes, several groups a node, several nodes a
    group, groups straddling nodes (12 experts, 3 groups, 4 nodes), no groups) equal the exhaustive mean."""
    got = expected_nodes(*shape)
    want = _brute_nodes(*shape)
    assert (got.p, got.q) == (want.numerator, want.denominator), (shape, got, want)


def test_expected_nodes_deepseek_v3():
    """DeepSeek-V3 (256 experts, 8 groups, top 8 within the best 4, ep 64 over 8 nodes): at most 4 nodes, 3.63 on
    average, where the direct dispatch sends all 8 choices."""
    got = float(expected_nodes(256, 8, 8, 4, 8))
    assert 3.6 < got < 4 and got == pytest.approx(4 * (1 - math.comb(96, 8) / math.comb(128, 8)))


def _ledger(precision: str):
    """samples/tiny_deepseek.scale with ep 2 over two nodes of one h100 (dispatched by node, rail only)."""
    text = (Path(__file__).resolve().parents[1] / "samples" / "tiny_deepseek.scale").read_text()
    text = text.replace("  nodes = 1\n  devices_per_node = 2\n  device = cpu", "  nodes = 2\n  devices_per_node = 1\n"
                        "  device = h100").replace("precision    = fp32", f"precision    = {precision}")
    return compile_spec(check_text(text, "tiny_deepseek.scale")).costs.ledger.entries


def test_the_ledger_sends_fp8_rows_and_their_scales_under_fp8():
    """Under precision = fp8 the dispatch's rows over the rail are 1 byte an element, with an fp32 scale per 128
    (ceil(64 / 128) = 1 a row), where bf16 sends 2 bytes and no scale; its backward and the combine stay bf16."""
    got = {p: [c for c in _ledger(p) if c.axis == "ep_rail"] for p in ("bf16", "fp8")}
    rows = {p: [c for c in cs if "each token once to each node" in c.reason] for p, cs in got.items()}
    assert rows["bf16"] and all(c.dtype_bytes == 2 for c in rows["bf16"])
    assert [c.bytes * 2 for c in rows["fp8"]] == [c.bytes for c in rows["bf16"]]
    assert all(c.dtype_bytes == 1 and c.direction == "forward" for c in rows["fp8"])
    assert not [c for c in got["bf16"] if "scales" in c.reason]
    scales = [c for c in got["fp8"] if "scales" in c.reason]
    hidden = 64  # tiny_deepseek's
    assert scales and [c.bytes * hidden for c in scales] == [r.bytes * 4 for r in rows["fp8"]]
    back = [c for c in got["fp8"] if "backward: the rows' gradients" in c.reason]
    assert back and all(c.dtype_bytes == 2 for c in back)
