"""`mla(...)`, DeepSeek's multi-head latent attention, against transformers' DeepseekV3 (a tiny random dense decoder
layer, weights copied): the same block output and the same gradients of every weight and of the input, fp32 to
1e-5, with q through a bottleneck (V3) or projected directly (V2-Lite), rotary pairs interleaved (DeepSeek's
checkpoints) or not. And what check, tp and the op table say of it."""
from __future__ import annotations

import pytest
import torch

from compiler.check import check_text
from compiler.model import build
from runtime.layers import init_parameters

H, HEADS, NOPE, ROPE, V, KV_RANK, FFN = 64, 4, 8, 8, 12, 16, 96
TEXT = """model m {{
  vocab = 64  hidden = {h}  heads = {heads}  layers = 1  seq = 16
  embedding(vocab, hidden)
  repeat layers {{
    residual {{ rmsnorm(hidden, eps = 1e-6)
               mla(hidden, heads, {q}kv_lora_rank = {kv}, qk_nope_head_dim = {nope}, qk_rope_head_dim = {rope},
                   v_head_dim = {v}{extra}) }}
    residual {{ rmsnorm(hidden, eps = 1e-6)  mlp(hidden, {ffn}, act = swiglu, bias = false) }}
  }}
  rmsnorm(hidden, eps = 1e-6)
  lm_head(vocab, hidden, tied = false)
  cross_entropy
}}
mesh {{ axis dp = 1  devices_per_node = 1 }}
train {{ global_batch = 2  seq_len = seq  steps = 1  optimizer = adamw(lr = 1e-3) }}
"""

# our leaf -> Hugging Face's module in DeepseekV3DecoderLayer
NAMES = {"norm_1": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_qa": "self_attn.q_a_proj",
         "attn_qa_norm": "self_attn.q_a_layernorm", "attn_qb": "self_attn.q_b_proj",
         "attn_kva": "self_attn.kv_a_proj_with_mqa", "attn_kva_norm": "self_attn.kv_a_layernorm",
         "attn_kvb": "self_attn.kv_b_proj", "attn_o": "self_attn.o_proj", "norm_2": "post_attention_layernorm",
         "mlp_gate": "mlp.gate_proj", "mlp_up": "mlp.up_proj", "mlp_down": "mlp.down_proj"}


# YaRN as DeepSeek's releases configure it, over a context short enough (original 8 of the 16 positions, rotary
# width 8) that its ramp keeps one frequency and divides the others, with mscale ≠ mscale_all_dim so that both the
# cos/sin factor and the softmax scale's mscale² differ from 1.
YARN = {"factor": 4.0, "original_max_position_embeddings": 8, "beta_fast": 32, "beta_slow": 1, "mscale": 0.707,
        "mscale_all_dim": 1.0}
YARN_TEXT = ("rope_scaling = yarn(factor = 4, original_seq = 8, beta_fast = 32, beta_slow = 1, mscale = 0.707, "
             "mscale_all_dim = 1.0)")


def text(q_lora_rank=None, interleave=True, heads=HEADS, yarn=False) -> str:
    return TEXT.format(h=H, heads=heads, q="" if q_lora_rank is None else f"q_lora_rank = {q_lora_rank}, ",
                       kv=KV_RANK, nope=NOPE, rope=ROPE, v=V, ffn=FFN,
                       extra=("" if interleave else ", rope_interleave = false") + (f", {YARN_TEXT}" if yarn else ""))


@pytest.mark.parametrize("q_lora_rank, interleave, yarn", [(32, True, False), (None, True, False), (32, False, False),
                                                           (32, True, True), (None, False, True)])
def test_block_matches_transformers_deepseek_v3(q_lora_rank, interleave, yarn):
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf_mod
    model = build(check_text(text(q_lora_rank, interleave, yarn=yarn), "m.scale"), device="cpu")
    init_parameters(model, seed=0, std=0.2, residual_out=(), layers=1)
    # norm scales away from one, so a misplaced norm shows
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.copy_(1 + 0.3 * torch.randn_like(p))
    block = model.blocks[0]
    config = transformers.DeepseekV3Config(
        hidden_size=H, num_attention_heads=HEADS, num_key_value_heads=HEADS, q_lora_rank=q_lora_rank,
        kv_lora_rank=KV_RANK, qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE, v_head_dim=V, intermediate_size=FFN,
        first_k_dense_replace=1, num_hidden_layers=1, rms_norm_eps=1e-6, rope_interleave=interleave,
        attention_bias=False, vocab_size=64, max_position_embeddings=32 if yarn else 64,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, **YARN} if yarn else
        {"rope_type": "default", "rope_theta": 10000.0})
    config._attn_implementation = "eager"
    hf = hf_mod.DeepseekV3DecoderLayer(config, layer_idx=0).float()
    rotary = hf_mod.DeepseekV3RotaryEmbedding(config)
    if yarn:  # what YaRN changes is there to compare: the cos/sin factor and the softmax scale
        assert rotary.attention_scaling != 1.0 and hf.self_attn.scaling != (NOPE + ROPE) ** -0.5
    ours = dict(block.named_parameters())
    theirs = dict(hf.named_parameters())
    assert len(ours) == len(theirs), (sorted(ours), sorted(theirs))
    with torch.no_grad():
        for name, p in ours.items():
            leaf, pname = name.rsplit(".", 1)
            theirs[f"{NAMES[leaf]}.{pname}"].copy_(p)
    torch.manual_seed(1)
    b, s = 2, 16
    x = torch.randn(b, s, H)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y = block(x1)
    pos = torch.arange(s)[None].expand(b, -1)
    mask = torch.full((s, s), float("-inf")).triu(1)[None, None].expand(b, 1, s, s)
    want = hf(x2, attention_mask=mask, position_ids=pos, position_embeddings=rotary(x2, pos))
    want = want[0] if isinstance(want, tuple) else want
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(y)
    y.backward(g)
    want.backward(g)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-5, atol=1e-5)
    for name, p in ours.items():
        leaf, pname = name.rsplit(".", 1)
        ref = theirs[f"{NAMES[leaf]}.{pname}"].grad
        # 1e-5 of the gradient's scale: the weights' gradients reach ~100 here (std 0.2, norms away from one), where
        # fp32's own rounding of two summation orders is ~1e-5 absolute
        torch.testing.assert_close(p.grad, ref, rtol=1e-5, atol=1e-5 * max(1.0, ref.abs().max().item()),
                                   msg=lambda m, name=name: f"{name}: {m}")


def _tp(t: str, tp: int) -> str:
    return t.replace("axis dp = 1  devices_per_node = 1", f"axis tp = {tp}  devices_per_node = {tp}")


def test_tp_must_divide_the_heads():
    from compiler.diagnostics import ScaleError
    with pytest.raises(ScaleError) as e:
        check_text(_tp(text(32, heads=6), 4), "m.scale")
    codes = [d.code for d in e.value.diagnostics]
    assert "E0401" in codes and "tensor-parallel degree 4 does not divide the attention heads (6)" in str(e.value)


@pytest.mark.parametrize("q_lora_rank", [32, None])
def test_tp_shards_q_b_and_kv_b_by_heads_and_o_by_rows(q_lora_rank):
    """q_b (or q) and kv_b column-parallel (whole heads), o row-parallel, q_a, kv_a and the latents' norms whole; the
    heads' call takes the shared rotary key through an identity-forward / all-reduce-backward (its gradient is
    partial)."""
    from compiler.pipeline import compile_spec
    compiled = compile_spec(check_text(_tp(text(q_lora_rank), 2), "m.scale"))
    shards = {k: d for _, g in compiled.traced.segments() for k, (d, _) in g.meta["tp_shards"].items()}
    q = "attn_q.weight" if q_lora_rank is None else "attn_qb.weight"
    assert {k: d for k, d in shards.items() if k.startswith("attn")} == {q: 0, "attn_kvb.weight": 0,
                                                                         "attn_o.weight": 1}
    code = compiled.traced.blocks[next(iter(compiled.traced.blocks))].code
    # the inputs of q_b (or q: the block's) and kv_b, the shared rotary key into the heads' call, the MLP's input
    assert code.count("identity_fwd_all_reduce_bwd(") == 4 and "attention_latent(" in code.replace(".", "_")


def test_flops_of_the_heads():
    """Q·Kᵀ over nope + rope and P·V over v, 2·B·H·S² each: scaled_dot_product_attention's convention."""
    from compiler.pipeline import compile_spec
    compiled = compile_spec(check_text(text(32), "m.scale"))
    from compiler import graph_meta as K
    node = next(n for _, g in compiled.traced.segments() for n in g.graph.nodes
                if getattr(n.target, "__name__", "") == "latent")
    b, s = 2, 16
    flops = node.meta[K.FLOPS]
    assert int(flops.subs(compiled.spec.values).subs({x: b for x in flops.free_symbols if x.name == "µb"})) == 2 * b * HEADS * s * s * (NOPE + ROPE) + 2 * b * HEADS * s * s * V


# DeepSeek's released configs (config.json), written in the language: first_k_dense_replace dense blocks, then MoE
# blocks (two repeats); the MoE blocks' router as each model's (V3: sigmoid, 8 groups, the best 4, gates × 2.5, the
# expert bias; V2-Lite: softmax, not renormalised), shared experts as one MLP of n_shared × moe_intermediate_size.
DEEPSEEK = """model {name} {{
  vocab = {vocab}  hidden = {hidden}  heads = {heads}  dense = {dense}  sparse = {sparse}  ffn = {ffn}
  moe_ffn = {moe_ffn}  experts = {experts}  seq = 4096
  embedding(vocab, hidden)
  repeat dense {{
    residual {{ rmsnorm(hidden, eps = 1e-6)  {mla} }}
    residual {{ rmsnorm(hidden, eps = 1e-6)  mlp(hidden, ffn, act = swiglu, bias = false) }}
  }}
  repeat sparse {{
    residual {{ rmsnorm(hidden, eps = 1e-6)  {mla} }}
    residual {{ rmsnorm(hidden, eps = 1e-6)  moe(hidden, moe_ffn, experts, top_k = {top_k}, capacity_factor = none,
                                                act = swiglu, aux_loss = 0, shared_ffn = {shared} * moe_ffn{router}) }}
  }}
  rmsnorm(hidden, eps = 1e-6)
  lm_head(vocab, hidden, tied = false)
  cross_entropy
}}
mesh {{ axis dp = 1  devices_per_node = 1  device = h100 }}
train {{ global_batch = 1  seq_len = seq  steps = 1  optimizer = adamw(lr = 1e-4) }}
"""
_DEEPSEEK_MLA = ("mla(hidden, heads, {q}kv_lora_rank = 512, qk_nope_head_dim = 128, qk_rope_head_dim = 64, "
                 "v_head_dim = 128)")
# name -> (sizes, total parameters (transformers' count of the same config, without V3's multi-token-prediction
# module, as DeepSeek's report counts), the published total and activated figures in billions)
DEEPSEEK_MODELS = {
    "deepseek_v3": (dict(vocab=129280, hidden=7168, heads=128, dense=3, sparse=58, ffn=18432, moe_ffn=2048,
                         experts=256, top_k=8, shared=1, mla=_DEEPSEEK_MLA.format(q="q_lora_rank = 1536, "),
                         router=", scoring = sigmoid, groups = 8,\n topk_groups = 4, routed_scale = 2.5, "
                                "bias_update = 0.001"),
                    671_026_404_352, 671, 37),
    "deepseek_v2_lite": (dict(vocab=102400, hidden=2048, heads=16, dense=1, sparse=26, ffn=10944, moe_ffn=1408,
                              experts=64, top_k=6, shared=2, mla=_DEEPSEEK_MLA.format(q=""),
                              router=", renormalize = false"),
                         15_706_484_224, 15.7, 2.4),
}


@pytest.mark.parametrize("name", sorted(DEEPSEEK_MODELS))
def test_deepseek_models_have_their_published_parameter_counts(name):
    """`plan`'s parameter count is transformers' count of the released config (DeepseekV3ForCausalLM's for V3,
    without the multi-token-prediction module that DeepSeek's 671B leaves out too; DeepseekV2ForCausalLM's for
    V2-Lite: 15,706,484,224), and rounds to the published total. Activated, counted here as every parameter but the
    input embedding (a lookup) and the routed experts a token does not choose: V3 36,625,603,584 (published "37B"),
    V2-Lite 2,451,435,008 (published "2.4B"); the published figures' own convention is not stated, so these are held
    within 2.5% of them."""
    from compiler.pipeline import compile_spec
    sizes, count, total, activated = DEEPSEEK_MODELS[name]
    compiled = compile_spec(check_text(DEEPSEEK.format(name=name, **sizes), f"{name}.scale"))
    assert compiled.costs.params_n == count
    assert round(count / 1e9, 1) == pytest.approx(total, abs=0.05)
    unchosen = sizes["sparse"] * (sizes["experts"] - sizes["top_k"]) * 3 * sizes["hidden"] * sizes["moe_ffn"]
    active = count - unchosen - sizes["vocab"] * sizes["hidden"]
    assert active == {"deepseek_v3": 36_625_603_584, "deepseek_v2_lite": 2_451_435_008}[name]
    assert active / 1e9 == pytest.approx(activated, rel=0.025)


def test_learned_positions_beside_mla_warn():
    """mla always turns its rotary parts: learned positions beside it encode positions twice (W0138)."""
    spec = check_text(text(32).replace("embedding(vocab, hidden)", "embedding(vocab, hidden)\n  positional(seq, hidden)"),
                      "m.scale")
    assert [d.code for d in spec.warnings] == ["W0138"]
