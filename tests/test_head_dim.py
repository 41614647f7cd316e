"""`attention(..., head_dim = D, qk_norm = rmsnorm)`: heads of their own width (Qwen 3, Mistral-Nemo) and a per-head
RMSNorm of q and k. Every figure that read hidden / heads follows D: the weights' shapes, the parameter count, the
FLOPs, the tensor-parallel shards ((heads / tp) · D rows of q), and the q/k norms' scales, replicated over tp with
their gradients summed (each rank normalises only its heads)."""
from __future__ import annotations

from pathlib import Path

import pytest
import sympy
import torch

from compiler import model as M
from compiler import trace as T
from compiler.check import check_text
from compiler.pipeline import compile_spec
from compiler.symbols import MICRO_BATCH
from tests.e2e.runner import with_plan

ROOT = Path(__file__).resolve().parents[1]
ATTENTION = ("attention(hidden, heads, kv_heads = 2, bias = false, head_dim = 24, qk_norm = rmsnorm, "
             "rope_theta = 10000)")

ONE = dict(axes=(("tp", 1),), devices_per_node=1)


def _text(attention: str = ATTENTION, **plan) -> str:
    text = (ROOT / "samples" / "gpt_tp.scale").read_text()
    for old, new in (("attention(hidden, heads)", attention), ("layernorm(hidden)", "rmsnorm(hidden)"),
                     ("act = gelu", "act = swiglu"), ("  positional(seq, hidden)\n", "")):
        assert old in text
        text = text.replace(old, new)
    return with_plan(text, **plan) if plan else text


def test_weights_are_heads_times_head_dim_wide():
    spec = check_text(_text(), "q.scale")
    model = M.build(spec, device="cpu")
    block = model.blocks[0]
    hidden, heads, kv, d = 64, 4, 2, 24
    assert tuple(block.attn_q.weight.shape) == (heads * d, hidden)
    assert tuple(block.attn_k.weight.shape) == tuple(block.attn_v.weight.shape) == (kv * d, hidden)
    assert tuple(block.attn_o.weight.shape) == (hidden, heads * d)
    assert tuple(block.attn_q_norm.weight.shape) == tuple(block.attn_k_norm.weight.shape) == (d,)
    assert block.attn_q_norm.eps == 1e-6
    counted = sum(p.numel() for p in model.parameters())
    compiled = compile_spec(spec)
    assert compiled.costs.params_n == counted
    assert spec.value(M.symbolic_param_count(model)) == counted


def test_forward_flops_count_head_dim_not_hidden_over_heads():
    compiled = compile_spec(check_text(_text(**ONE), "q.scale"))
    b, s, h, heads, kv, d, f = MICRO_BATCH, 32, 64, 4, 2, 24, 256
    # q and o: 2·bs·h·heads·D each; k and v: 2·bs·h·kv·D each; scores and values: 2 × 2·b·heads·s²·D;
    # SwiGLU: 3 × 2·bs·h·ffn. Norms count no FLOPs (matmuls only, as every norm here).
    want = (2 * 2 * b * s * h * heads * d + 2 * 2 * b * s * h * kv * d + 2 * 2 * b * heads * s * s * d
            + 3 * 2 * b * s * h * f)
    got = T.graph_flops(compiled.traced.blocks["blocks"]).xreplace(
        {k: sympy.Integer(v) for k, v in compiled.spec.values.items()})  # the sizes' values, µb kept
    assert sympy.expand(got - want) == 0, got


def test_default_head_dim_is_hidden_over_heads():
    """Without head_dim the model is the one before it existed (its formulas read hidden / heads); written equal to
    hidden / heads, the same weights."""
    plain = compile_spec(check_text(_text("attention(hidden, heads, bias = false)", **ONE), "a.scale"))
    written = compile_spec(check_text(_text("attention(hidden, heads, bias = false, head_dim = 16)", **ONE),
                                      "b.scale"))
    assert plain.costs.params_n == written.costs.params_n
    q_rows = plain.traced.blocks["blocks"].meta[T.PARAM_SHAPES]["attn_q.weight"][0]
    assert {str(x) for x in q_rows.free_symbols} == {"hidden"}  # heads · hidden / heads: the formula as before
    assert written.spec.value(written.traced.blocks["blocks"].meta[T.PARAM_SHAPES]["attn_q.weight"][0]) == 64

@pytest.mark.parametrize("sp", [False, True])
def test_tp_shards_whole_heads_of_head_dim_and_sums_the_qk_norm_gradients(sp):
    compiled = compile_spec(check_text(_text(sequence_parallel=sp), "q.scale"))
    block = compiled.traced.blocks["blocks"]
    assert block.get_submodule("attn_q").out_features == 2 * 24      # heads / tp = 2 heads of 24
    assert block.get_submodule("attn_k").out_features == 1 * 24      # kv_heads / tp = 1
    assert block.get_submodule("attn_o").in_features == 2 * 24
    assert block.get_submodule("attn_q_norm").normalized_shape == (24,)  # whole on every rank
    shards = dict((p, (d, f)) for p, d, f in compiled.traced.shard_patterns(T.TP_SHARDS))
    assert shards["blocks.*.attn_q.weight"] == (0, 96) and "blocks.*.attn_q_norm.weight" not in shards
    partial = compiled.traced.partial_grads()
    assert "blocks.*.attn_q_norm.weight" in partial and "blocks.*.attn_k_norm.weight" in partial
    assert len(partial) == len(set(partial))  # listed once under sequence parallelism too
    assert ("blocks.*.norm_1.weight" in partial) == sp
    step = [c for c in compiled.costs.ledger.entries if c.direction == "step" and c.axis == "tp"]
    assert len(step) == 1 and "q/k norm" in step[0].reason
    layers = 2
    # q/k norms; under SP also the block norms, the final norm and the MLP's down bias (mlp has biases)
    norms = 2 * 24 * layers + (0 if not sp else 2 * 64 * layers + 64 + 64 * layers)
    assert step[0].bytes == norms * 4


def test_a_norm_over_the_whole_width_still_stops_tp():
    """The allow-list admits a norm over each head's features only: one over hidden mixes the heads a shard
    splits (what `_per_head_norm` refuses); here the q/k norm is over (B, S, H, D)'s last dim, the case it admits."""
    from compiler.passes.tensor_parallel import _per_head_norm
    spec = check_text(_text(), "q.scale")
    traced = T.trace_model(M.build(spec))
    gm = traced.blocks["blocks"]
    norms = {n.target: _per_head_norm(gm, n) for n in gm.graph.nodes
             if n.op == "call_module" and isinstance(gm.get_submodule(n.target), torch.nn.RMSNorm)}
    assert norms == {"norm_1": False, "attn_q_norm": True, "attn_k_norm": True, "norm_2": False}
