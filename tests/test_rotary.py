"""Rotary position embeddings (runtime/rotary.py) against Hugging Face's own implementation: a tiny random
LlamaForCausalLM and Qwen2ForCausalLM built in-process (no download), their weights copied into the generated
Model by name, the same loss and gradients (fp32, 1e-5); Llama 3's scaled frequencies equal transformers'."""
from __future__ import annotations

import sys

import pytest
import torch

from tests.test_memory import _program

transformers = pytest.importorskip("transformers")  # the test-only extra (pyproject `dev`)

SCALE = """
model tiny {{
  vocab = 128  hidden = 64  heads = 4  layers = 2  seq = 32
  embedding(vocab, hidden)
  repeat layers {{
    residual {{ rmsnorm(hidden, eps = 1e-6)  attention(hidden, heads, kv_heads = 2, bias = false{qkv}, rope_theta = {theta}{scaling}) }}
    residual {{ rmsnorm(hidden, eps = 1e-6)  mlp(hidden, 4 * hidden, act = swiglu, bias = false) }}
  }}
  rmsnorm(hidden, eps = 1e-6)
  lm_head(vocab, hidden, tied = false)
  cross_entropy
}}
mesh {{ axis dp = 1  devices_per_node = 1 }}
train {{ global_batch = 4  seq_len = seq  steps = 1  optimizer = adamw(lr = 1e-3) }}
"""


def _hf_name(ours: str) -> str:
    """Our parameter name -> Hugging Face's (Llama / Qwen 2 layout)."""
    fixed = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
             "lm_head.weight": "lm_head.weight"}
    if ours in fixed:
        return fixed[ours]
    _, i, leaf, what = ours.split(".")
    part = {"norm_1": "input_layernorm", "norm_2": "post_attention_layernorm",
            "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
            "attn_o": "self_attn.o_proj", "mlp_gate": "mlp.gate_proj", "mlp_up": "mlp.up_proj",
            "mlp_down": "mlp.down_proj"}[leaf]
    return f"model.layers.{i}.{part}.{what}"


CASES = {
    "llama": dict(cls="LlamaForCausalLM", cfg="LlamaConfig", qkv="", theta=10000.0, scaling=None),
    "llama3_scaled": dict(cls="LlamaForCausalLM", cfg="LlamaConfig", qkv="", theta=500000.0,
                          scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                       original_max_position_embeddings=16)),
    "qwen2": dict(cls="Qwen2ForCausalLM", cfg="Qwen2Config", qkv=", qkv_bias = true", theta=1000000.0, scaling=None),
    # Qwen 2.5's long context: YaRN over 8 of the 32 positions, its cos/sin factor 0.1·ln(4) + 1
    "qwen2_yarn": dict(cls="Qwen2ForCausalLM", cfg="Qwen2Config", qkv=", qkv_bias = true", theta=1000000.0,
                       scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=8)),
}


def _scaling_text(s: dict | None) -> str:
    if s is None:
        return ""
    if s["rope_type"] == "yarn":
        return f", rope_scaling = yarn(factor = {s['factor']}, original_seq = {s['original_max_position_embeddings']})"
    return (f", rope_scaling = llama3(factor = {s['factor']}, low_freq_factor = {s['low_freq_factor']}, "
            f"high_freq_factor = {s['high_freq_factor']}, original_seq = {s['original_max_position_embeddings']})")


@pytest.mark.parametrize("case", sorted(CASES))
def test_generated_model_matches_transformers(tmp_path, case):
    c = CASES[case]
    text = SCALE.format(qkv=c["qkv"], theta=c["theta"], scaling=_scaling_text(c["scaling"]))
    compiled, prog = _program(tmp_path, text)
    sys.modules[prog.__name__] = prog
    kw = dict(vocab_size=128, hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=32, rms_norm_eps=1e-6, tie_word_embeddings=False,
              attn_implementation="eager")
    rope = {"rope_type": "default", "rope_theta": c["theta"]} if c["scaling"] is None else \
        dict(c["scaling"], rope_theta=c["theta"])
    config = getattr(transformers, c["cfg"])(**kw, rope_parameters=rope)
    torch.manual_seed(0)
    hf = getattr(transformers, c["cls"])(config).float()
    ours = prog.Model()
    ours.to_empty(device="cpu")
    hf_params = dict(hf.named_parameters())
    with torch.no_grad():
        for name, p in ours.named_parameters():
            p.copy_(hf_params[_hf_name(name)])
    assert {_hf_name(n) for n, _ in ours.named_parameters()} == set(hf_params)
    tokens = torch.randint(0, 128, (4, 32), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(0, 128, (4, 32), generator=torch.Generator().manual_seed(2))
    loss = ours(tokens, targets)
    logits = hf(input_ids=tokens).logits
    ref = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=0)
    loss.backward()
    ref.backward()
    for name, p in ours.named_parameters():
        want = hf_params[_hf_name(name)].grad
        err = (p.grad - want).norm() / want.norm()
        assert err <= 1e-5, f"{name}: gradient off by {err:.2e}"


def test_llama3_frequencies_equal_transformers():
    from runtime import rotary
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    config = transformers.LlamaConfig(hidden_size=128, num_attention_heads=2, max_position_embeddings=131072,
                                      rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                                                           low_freq_factor=1.0, high_freq_factor=4.0,
                                                           original_max_position_embeddings=8192))
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    got = rotary.frequencies(64, 500000.0, (8.0, 1.0, 4.0, 8192.0))
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("rope", [
    dict(factor=40.0, original_max_position_embeddings=4096, beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=1.0),
    dict(factor=40.0, original_max_position_embeddings=4096, beta_fast=32, beta_slow=1, mscale=0.707,
         mscale_all_dim=0.707),
    dict(factor=4.0, original_max_position_embeddings=32768),
    dict(factor=4.0, original_max_position_embeddings=64, beta_fast=16, beta_slow=2, mscale=0.707, mscale_all_dim=1.0,
         truncate=False),
    dict(factor=2.0, original_max_position_embeddings=64, attention_factor=1.3)])
def test_yarn_frequencies_and_factors_equal_transformers(rope):
    """YaRN's frequencies (to the bit) and cos/sin factor are transformers' `_compute_yarn_parameters`; the softmax
    factor is DeepSeek's yarn_apply_mscale."""
    from runtime import rotary
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_apply_mscale
    params = dict(rope_type="yarn", rope_theta=10000.0, **rope)
    config = transformers.DeepseekV3Config(qk_rope_head_dim=64, rope_parameters=params,
                                           max_position_embeddings=int(rope["factor"] * rope[
                                               "original_max_position_embeddings"]))
    want, factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    scaling = ("yarn", rope["factor"], float(rope["original_max_position_embeddings"]), rope.get("beta_fast", 32.0),
               rope.get("beta_slow", 1.0), rope.get("mscale", 0.0), rope.get("mscale_all_dim", 0.0),
               rope.get("attention_factor"), rope.get("truncate", True))
    torch.testing.assert_close(rotary.frequencies(64, 10000.0, scaling), want, rtol=0, atol=0)
    assert rotary.yarn_attention_factor(scaling) == pytest.approx(factor, rel=1e-12)
    assert rotary.yarn_softmax_factor(scaling) == pytest.approx(yarn_apply_mscale(params, 1.0), rel=1e-12)
