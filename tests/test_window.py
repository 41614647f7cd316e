"""`attention(..., window = W)`: sliding-window causal attention (Mistral 7B). The mask is transformers' own rule
(a key is kept when 0 <= q_idx - kv_idx < W), held here against transformers' mask functions; the FLOPs count
min(W, seq) keys per query instead of seq, so `plan` prints fewer; a window covering the sequence is the causal
attention (and says so, W0207)."""
from __future__ import annotations

import io
import re
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import sympy
import torch
import torch.nn.functional as F

from compiler import model as M
from compiler import trace as T
from compiler.check import check_text
from compiler.cli import main
from compiler.pipeline import compile_spec
from compiler.symbols import MICRO_BATCH
from runtime.attention import sliding_window, window_mask
from tests.e2e.runner import with_plan

ROOT = Path(__file__).resolve().parents[1]
ONE = dict(axes=(("tp", 1),), devices_per_node=1)


def _text(attention: str, **plan) -> str:
    text = (ROOT / "samples" / "gpt_tp.scale").read_text()  # seq 32, 4 heads of 16
    assert "attention(hidden, heads)" in text
    text = text.replace("attention(hidden, heads)", attention)
    return with_plan(text, **plan) if plan else text


@pytest.mark.parametrize("window", [1, 3, 8])
def test_mask_is_transformers_sliding_window_mask(window):
    """transformers' mask of a sliding-window layer: the causal mask and the sliding-window overlay, element for
    element."""
    mu = pytest.importorskip("transformers.masking_utils")
    keep = mu.and_masks(mu.causal_mask_function, mu.sliding_window_overlay(window))
    s = 12
    i = torch.arange(s)
    theirs = torch.tensor([[bool(keep(0, 0, q, k)) for k in i] for q in i])
    assert torch.equal(window_mask(s, s, window, torch.device("cpu")), theirs)
    assert window_mask(s, s, window, torch.device("cpu")).sum(-1).tolist() == [min(q + 1, window) for q in range(s)]


def _reference(q, k, v, window):
    """Attention written out: scores, the mask as -inf, softmax, values (k and v repeated for grouped queries)."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    s = q.shape[2]
    i = torch.arange(s)
    allowed = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < window)
    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ v


@pytest.mark.parametrize("gqa", [False, True])
def test_sliding_window_equals_attention_written_out(gqa):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 10, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2 if gqa else 4, 10, 8, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2 if gqa else 4, 10, 8, generator=g, dtype=torch.float64, requires_grad=True)
    y = sliding_window(q, k, v, 3, gqa)
    want = _reference(q, k, v, 3)
    torch.testing.assert_close(y, want)
    grads = torch.autograd.grad(y.square().sum(), (q, k, v))
    for got, exp in zip(grads, torch.autograd.grad(want.square().sum(), (q, k, v))):
        torch.testing.assert_close(got, exp)
    # a window as long as the sequence is the causal attention
    torch.testing.assert_close(sliding_window(q, k, v, 10, gqa),
                               F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa))


def test_window_of_zero_is_refused_at_run_time():
    x = torch.zeros(1, 1, 4, 2)
    with pytest.raises(ValueError, match="at least the query itself"):
        sliding_window(x, x, x, 0, False)


def test_forward_flops_count_min_of_window_and_seq_keys():
    compiled = compile_spec(check_text(_text("attention(hidden, heads, window = 8)", **ONE), "w.scale"))
    b, s, h, heads, d, f, w = MICRO_BATCH, 32, 64, 4, 16, 256, 8
    # q, k, v, o: 4 × 2·bs·h·h; scores and values: 2 × 2·b·heads·s·min(W, s)·D; the gelu MLP: 2 × 2·bs·h·ffn
    want = 4 * 2 * b * s * h * h + 2 * 2 * b * heads * s * w * d + 2 * 2 * b * s * h * f
    got = T.graph_flops(compiled.traced.blocks["blocks"]).xreplace(
        {k: sympy.Integer(v) for k, v in compiled.spec.values.items()})
    assert sympy.expand(got - want) == 0, got
    node = next(n for n in compiled.traced.blocks["blocks"].graph.nodes if n.target is sliding_window)
    # backward: dQ, dK (over Q·Kᵀ) and dP, dV (over P·V), each of a forward matmul's size: twice the forward
    from compiler.cost.flops import needs_grad, node_backward
    gm = compiled.traced.blocks["blocks"]
    bwd = node_backward(node, gm, needs_grad(gm)).xreplace({k: sympy.Integer(v) for k, v in
                                                           compiled.spec.values.items()})
    assert sympy.expand(bwd - 2 * (2 * 2 * b * heads * s * w * d)) == 0


def _plan_flops(text: str, tmp_path) -> float:
    path = tmp_path / "m.scale"
    path.write_text(text)
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["plan", str(path)]) == 0
    found = re.search(r"^compute\s+([0-9.e+]+) FLOP per step", out.getvalue(), re.MULTILINE)
    assert found, out.getvalue()
    return float(found.group(1))


def test_plan_prints_fewer_flops_with_a_window(tmp_path):
    full = _plan_flops(_text("attention(hidden, heads)"), tmp_path)
    window = _plan_flops(_text("attention(hidden, heads, window = 8)"), tmp_path)
    covering = _plan_flops(_text("attention(hidden, heads, window = 32)"), tmp_path)
    assert window < full
    assert covering == full  # W >= seq: the causal attention, the same count
    # the difference is the attention core's: per layer and sequence 3 × 2 × 2·heads·s·(s - W)·D, fwd + bwd
    layers, batch, heads, s, d = 2, 16, 4, 32, 16
    assert full - window == pytest.approx(layers * batch * 3 * 2 * 2 * heads * s * (s - 8) * d, abs=1e4)  # printed to 5 digits


def test_a_window_covering_the_sequence_is_the_causal_program():
    """W0207: the warning is true; the model is the one without `window` (the causal kernel)."""
    spec = check_text(_text("attention(hidden, heads, window = 32)"), "w.scale")
    assert [w.code for w in spec.warnings] == ["W0207"]
    traced = T.trace_model(M.build(spec))
    targets = {n.target for n in traced.blocks["blocks"].graph.nodes}
    assert F.scaled_dot_product_attention in targets and sliding_window not in targets


@pytest.mark.parametrize("sp", [False, True])
def test_tp_shards_heads_through_the_window_and_the_program_calls_it(sp, tmp_path):
    compiled = compile_spec(check_text(_text("attention(hidden, heads, window = 8)", sequence_parallel=sp),
                                       "w.scale"))
    block = compiled.traced.blocks["blocks"]
    assert block.get_submodule("attn_q").out_features == 2 * 16  # 2 of the 4 heads on each rank
    node = next(n for n in block.graph.nodes if n.target is sliding_window)
    assert node.args[3] == 8
    assert node.meta[T.SHAPE][2] == compiled.spec.train.seq_len  # the whole sequence, gathered under sp
    from compiler import codegen
    program = codegen.program(compiled.spec, compiled.traced, compiled.costs, compiled.plan)
    assert "from runtime import attention, collectives, train" in program
    assert re.search(r"= attention\.sliding_window\(\w+, \w+, \w+, 8, False\)", program)


def test_single_device_model_runs_the_window():
    """The built model's attention output equals the written-out reference with the window."""
    spec = check_text(_text("attention(hidden, heads, window = 5)", **ONE), "w.scale")
    model = M.build(spec, device="cpu")
    torch.manual_seed(0)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.1)
    block = model.blocks[0]
    x = torch.randn(2, 32, 64)
    # the block: x + attention(norm(x)), then + mlp(norm(.)), each with the block's own modules
    attn_in = block.norm_1(x)
    q = block.attn_q(attn_in).unflatten(-1, (4, 16)).transpose(1, 2)
    k = block.attn_k(attn_in).unflatten(-1, (4, 16)).transpose(1, 2)
    v = block.attn_v(attn_in).unflatten(-1, (4, 16)).transpose(1, 2)
    h = x + block.attn_o(_reference(q, k, v, 5).transpose(1, 2).flatten(2))
    want = h + block.mlp_down(F.gelu(block.mlp_up(block.norm_2(h))))
    torch.testing.assert_close(block(x), want, rtol=1e-5, atol=1e-5)


def test_the_cuda_block_mask_is_the_same_window_and_skips_blocks():
    """The CUDA path's block mask (FlexAttention), run here by FlexAttention's eager CPU fallback: the same
    attention as the dense mask, and the blocks wholly outside the window are not computed (a 40-token window over
    512 tokens in 128-token blocks: the causal triangle's 10 blocks less the 3 no query reaches)."""
    import warnings
    from runtime import attention as A
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 512, 16, generator=g)
    k, v = torch.randn(2, 2, 512, 16, generator=g), torch.randn(2, 2, 512, 16, generator=g)
    block_mask = A._make_block_mask(512, 512, 40, torch.device("cpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager FlexAttention says it is slow
        y = flex.flex_attention(q, k, v, block_mask=block_mask, enable_gqa=True)
    torch.testing.assert_close(y, sliding_window(q, k, v, 40, True), rtol=1e-5, atol=1e-5)
    def computed(m):  # blocks partly masked, and blocks wholly kept
        return int(m.kv_num_blocks.sum()) + (0 if m.full_kv_num_blocks is None else int(m.full_kv_num_blocks.sum()))
    assert computed(block_mask) == 7  # 4 on the diagonal, 3 just below it
    assert computed(A._make_block_mask(512, 512, 512, torch.device("cpu"))) == 10
