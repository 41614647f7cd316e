"""`scalec import config.json` (compiler/importer.py): Hugging Face configs of the importable classes, made
in-process with transformers (no download), import to a model section that checks and has exactly the parameters
of the transformers model; the published configs of Llama-2-7B, Llama-3-8B, Mixtral-8x7B, Qwen1.5-MoE-A2.7B, DeepSeek-V3 and DeepSeek-V2-Lite
(typed in) give their published parameter counts; a key or value that does not map is a located diagnostic at the
JSON key. Phi-3 (Phi-3-mini-4k-instruct typed in) imports as Llama's block with its sliding window; its LongRoPE,
partial rotary factor and dropouts are refused at their keys."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from compiler import spec as S
from compiler.check import check_text
from compiler.diagnostics import ScaleError
from compiler.importer import DEFAULTS, IRRELEVANT, USED, complete, import_config
from compiler.pipeline import compile_spec

ROOT = Path(__file__).resolve().parents[1]
transformers = pytest.importorskip("transformers")  # the test-only extra (pyproject `dev`)

TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=80, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=32)
CASES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(rms_norm_eps=1e-5)),
    "llama3_biases": ("LlamaConfig", "LlamaForCausalLM",
                      dict(attention_bias=True, mlp_bias=True, rope_parameters=dict(
                          rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=16))),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=None)),
    "qwen2_tied": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    # heads of their own width: 24 where hidden_size / heads is 16 (Qwen 3 with its q/k norms, Mistral-Nemo)
    "qwen3_head_dim": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=24)),
    "qwen3_biases": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16, attention_bias=True)),
    "mistral_head_dim": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=None, head_dim=24)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2,
                                                            router_aux_loss_coef=0.02)),
    # sliding windows shorter than the 32 positions: Mistral 7B's, and Qwen 2's over every layer
    "mistral_window": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=8)),
    "qwen2_window": ("Qwen2Config", "Qwen2ForCausalLM", dict(use_sliding_window=True, sliding_window=8,
                                                             max_window_layers=0)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(num_experts=4, num_experts_per_tok=2,
                                                                moe_intermediate_size=24,
                                                                shared_expert_intermediate_size=40)),
    "qwen2_moe_renormalised": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                               dict(num_experts=6, num_experts_per_tok=3, moe_intermediate_size=16,
                                    shared_expert_intermediate_size=48, norm_topk_prob=True, qkv_bias=False)),
    # Qwen3-MoE: Qwen 3's attention (q/k norms, here heads of their own width), experts of their own width, no shared
    # expert; gates renormalised or not
    "qwen3_moe_head_dim": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                           dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, head_dim=24,
                                norm_topk_prob=True)),
    "qwen3_moe_biases": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                         dict(num_experts=6, num_experts_per_tok=3, moe_intermediate_size=16, attention_bias=True)),
    # Phi-3: Llama's block (its checkpoints fuse q/k/v and gate/up, which the model section does not see), with or
    # without a sliding window; Phi3Config's pad_token_id (32000) is past this vocabulary, where nn.Embedding refuses it
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(pad_token_id=0)),
    "phi3_window": ("Phi3Config", "Phi3ForCausalLM", dict(pad_token_id=0, sliding_window=8)),
    # Gemma 2: 3 layers of (sliding, full): a repeat of one pair, then one of the sliding layer left; scores over
    # √16, not √24. Gemma 3: its layers' kinds listed, a linearly scaled base on the full layers, another on the
    # sliding ones
    "gemma2_window": ("Gemma2Config", "Gemma2ForCausalLM", dict(head_dim=24, sliding_window=8,
                                                                query_pre_attn_scalar=16)),
    "gemma3_window": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        head_dim=24, sliding_window=8, layer_types=["full_attention", "sliding_attention", "sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})),
}


def _params(text: str, name: str = "imported.scale") -> int:
    return compile_spec(check_text(complete(text), name)).costs.params_n


@pytest.mark.parametrize("case", sorted(CASES))
def test_tiny_config_imports_with_transformers_parameter_count(tmp_path, case):
    cfg_cls, model_cls, extra = CASES[case]
    config = getattr(transformers, cfg_cls)(**TINY, **extra)
    path = tmp_path / "config.json"
    config.to_json_file(path)
    text = path.read_text()
    out = import_config(text, str(path))
    want = sum(p.numel() for p in getattr(transformers, model_cls)(config).parameters())
    assert _params(out) == want
    spec = check_text(complete(out), "imported.scale")
    assert spec.model.name == json.loads(text)["model_type"]
    # every key of the file is named: in the comment of a line that uses it, or among the irrelevant ones
    for key in json.loads(text):
        assert key in out, key
    if case == "qwen2_tied":
        assert "qkv_bias = true" in out and "tied = true" in out
    if case == "llama3_biases":
        assert "rope_scaling = llama3(factor = 8.0," in out and "original_seq = 16))" in out
    if case == "mixtral":
        assert "capacity_factor = none" in out and "aux_loss = 0.02" in out
    if case.endswith("head_dim"):
        assert "head_dim = 24 " in out and "head_dim = head_dim," in out
    if case == "qwen3_biases":  # head_dim = hidden / heads: not written; biases on q, k, v and o
        assert "head_dim = head_dim" not in out and "bias = true," in out
    assert ("qk_norm = rmsnorm" in out) == case.startswith("qwen3")
    assert ("window   = 8 " in out and "window = window," in out) == case.endswith("_window")
    if case == "qwen2_moe":
        assert "renormalize = false" in out and "shared_ffn = shared, shared_gate = sigmoid" in out
        assert "ffn      = 24" in out and "shared   = 40" in out and "qkv_bias = true" in out
    if case == "qwen2_moe_renormalised":
        assert "renormalize = true" in out and "qkv_bias = true" not in out
    if case.startswith("qwen3_moe"):
        assert "shared_ffn" not in out and "ffn      = " + str(extra["moe_intermediate_size"]) + " " in out
        assert f"renormalize = {'true' if extra.get('norm_topk_prob') else 'false'}," in out
        assert f"experts  = {extra['num_experts']} " in out and "qkv_bias" not in out
    if case == "qwen3_moe_biases":
        assert "bias = true," in out and "head_dim = head_dim" not in out
    if case.startswith("gemma"):
        assert "embedding(vocab, hidden, scaled = true)" in out and "act = geglu" in out
        assert out.count("zero_centered = true") == 4 * 3 + 1 and "head_dim = head_dim," in out
    if case == "gemma2_window":
        assert "repeat 1 {" in out and out.count("softcap = 50.0") == 3 and "softcap = 30.0)" in out
        assert "query_scale = 16," in out and out.count("window = window,") == 2
    if case == "gemma3_window":
        assert "rope_scaling = linear(factor = 4.0))" in out and "rope_theta = 10000.0)" in out
        assert "qk_norm = zero_centered_rmsnorm" in out and "softcap =" not in out
    if case.startswith("phi3"):
        assert "model phi3 {" in out and "bias = false," in out and "act = swiglu, bias = false" in out
        assert "qkv_proj: q rows, then k, then v" in out and "gate_up_proj: gate rows, then up rows" in out


def test_defaults_are_transformers_defaults():
    """A key the file omits is read as transformers reads it: the importer's table equals each config class's
    own defaults."""
    classes = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config",
               "phi3": "Phi3Config", "mixtral": "MixtralConfig", "qwen2_moe": "Qwen2MoeConfig",
               "qwen3_moe": "Qwen3MoeConfig", "gemma2": "Gemma2Config", "gemma3_text": "Gemma3TextConfig",
               "deepseek_v3": "DeepseekV3Config", "deepseek_v2": "DeepseekV2Config"}
    for model_type, cls in classes.items():
        hf = getattr(transformers, cls)()
        for key, ours in DEFAULTS[model_type].items():
            if model_type == "gemma3_text" and key in ("rope_theta", "rope_scaling", "rope_local_base_freq"):
                rope = hf.rope_parameters["sliding_attention" if key == "rope_local_base_freq" else "full_attention"]
                got = rope["rope_theta"] if key != "rope_scaling" else (
                    None if rope.get("rope_type", "default") == "default" else rope)
            elif key in ("rope_theta", "rope_scaling"):
                rope = hf.rope_parameters
                got = rope["rope_theta"] if key == "rope_theta" else (
                    None if rope.get("rope_type", "default") == "default" else rope)
            elif key == "num_key_value_heads" and ours is None:
                assert hf.num_key_value_heads == hf.num_attention_heads, model_type
                continue
            elif key == "head_dim" and ours is None:
                assert getattr(hf, "head_dim", None) in (None, hf.hidden_size // hf.num_attention_heads), model_type
                continue
            elif key == "use_sliding_window":
                got = hf.use_sliding_window
            elif key == "sliding_window" and model_type in ("qwen2", "qwen3"):  # null unless use_sliding_window
                got = getattr(transformers, cls)(use_sliding_window=True).sliding_window
            else:
                got = getattr(hf, key)
            assert got == ours, (model_type, key, got, ours)


def test_every_key_transformers_writes_is_known():
    for cls, model_type in (("LlamaConfig", "llama"), ("MistralConfig", "mistral"), ("Qwen2Config", "qwen2"),
                            ("Qwen3Config", "qwen3"), ("Phi3Config", "phi3"), ("MixtralConfig", "mixtral"),
                            ("Qwen2MoeConfig", "qwen2_moe"), ("Qwen3MoeConfig", "qwen3_moe"),
                            ("Gemma2Config", "gemma2"), ("Gemma3TextConfig", "gemma3_text"),
                            ("DeepseekV3Config", "deepseek_v3"), ("DeepseekV2Config", "deepseek_v2")):
        written = json.loads(getattr(transformers, cls)().to_json_string(use_diff=False))
        unknown = set(written) - set(USED[model_type]) - set(IRRELEVANT)
        assert not unknown, (model_type, unknown)


# The published config.json files, typed in as released.
LLAMA2_7B = """{
  "_name_or_path": "meta-llama/Llama-2-7b-hf",
  "architectures": ["LlamaForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 11008,
  "max_position_embeddings": 4096,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 32,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "tie_word_embeddings": false,
  "torch_dtype": "float16",
  "transformers_version": "4.31.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
}
"""
LLAMA3_8B = """{
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 8192,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
}
"""
MIXTRAL_8X7B = """{
  "architectures": ["MixtralForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mixtral",
  "num_attention_heads": 32,
  "num_experts_per_tok": 2,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "num_local_experts": 8,
  "output_router_logits": false,
  "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.02,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.36.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
}
"""

QWEN15_MOE_A27B = """{
  "architectures": [
    "Qwen2MoeForCausalLM"
  ],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 5632,
  "max_position_embeddings": 8192,
  "max_window_layers": 21,
  "model_type": "qwen2_moe",
  "num_attention_heads": 16,
  "num_hidden_layers": 24,
  "num_key_value_heads": 16,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.39.0.dev0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936,
  "decoder_sparse_step": 1,
  "moe_intermediate_size": 1408,
  "shared_expert_intermediate_size": 5632,
  "num_experts_per_tok": 4,
  "num_experts": 60,
  "norm_topk_prob": false,
  "output_router_logits": false,
  "router_aux_loss_coef": 0.001
}
"""

# microsoft/Phi-3-mini-4k-instruct's config.json
PHI3_MINI_4K = """{
  "_name_or_path": "Phi-3-mini-4k-instruct",
  "architectures": [
    "Phi3ForCausalLM"
  ],
  "attention_dropout": 0.0,
  "auto_map": {
    "AutoConfig": "configuration_phi3.Phi3Config",
    "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM"
  },
  "bos_token_id": 1,
  "embd_pdrop": 0.0,
  "eos_token_id": 32000,
  "hidden_act": "silu",
  "hidden_size": 3072,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 4096,
  "model_type": "phi3",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 32,
  "original_max_position_embeddings": 4096,
  "pad_token_id": 32000,
  "resid_pdrop": 0.0,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 10000.0,
  "sliding_window": 2047,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.2",
  "use_cache": true,
  "attention_bias": false,
  "vocab_size": 32064
}
"""


def test_phi3_mini_count_is_transformers_count():
    """Phi-3-mini's 3.8B: transformers' own count of the released config, built on the meta device (with its
    2047-token window in force)."""
    import torch
    cfg = {k: v for k, v in json.loads(PHI3_MINI_4K).items()
           if k not in ("architectures", "model_type", "transformers_version", "torch_dtype", "auto_map",
                        "_name_or_path")}
    config = transformers.Phi3Config(**cfg)
    assert config.sliding_window == 2047 and config.rope_parameters["rope_type"] == "default"
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == 3_821_079_552


def test_phi3_mini_imports_with_its_window():
    """Each line of Phi-3-mini's section names its keys; its sliding_window is every layer's window as written
    (transformers' mask keeps q_idx - kv_idx < 2047), which the checked spec carries."""
    out = import_config(PHI3_MINI_4K, "phi3/config.json")
    for key in json.loads(PHI3_MINI_4K):
        assert key in out, key
    assert "window   = 2047 " in out and "window = window," in out and "no dropout on the residual branch" in out
    spec = check_text(complete(out), "phi3.scale")
    assert {spec.value(x.window) for x in S.walk(spec.model.layers) if isinstance(x, S.Attention)} == {2047}


# Phi-3-mini-128k's LongRoPE (its factors cut to two of its 48 per list), and "su", the older files' name of it
_LONGROPE = '{"long_factor": [1.08, 1.11], "short_factor": [1.0, 1.02], "type": "longrope"}'


@pytest.mark.parametrize("edit,key,says", [
    (('"rope_scaling": null', f'"rope_scaling": {_LONGROPE}'), '"type"',
     'rope type "longrope" is not expressible (Phi-3\'s LongRoPE'),
    (('"rope_scaling": null', '"rope_scaling": {"type": "su", "long_factor": [1.0], "short_factor": [1.0]}'),
     '"type"', 'rope type "su" is not expressible (Phi-3\'s LongRoPE'),
    (('"rope_scaling": null', '"rope_scaling": null, "partial_rotary_factor": 0.75'), '"partial_rotary_factor"',
     "partial_rotary_factor 0.75 (rotary embeddings on part of each head) is not expressible"),
    (('"rope_scaling": null', '"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, '
                              '"partial_rotary_factor": 0.5}'), '"partial_rotary_factor"',
     "partial_rotary_factor 0.5 (rotary embeddings on part of each head) is not expressible"),
    (('"resid_pdrop": 0.0', '"resid_pdrop": 0.1'), '"resid_pdrop"',
     "the residual dropout of each block's attention and MLP output (resid_pdrop 0.1) is not expressible"),
    (('"embd_pdrop": 0.0', '"embd_pdrop": 0.1'), '"embd_pdrop"',
     "the dropout of the embeddings (embd_pdrop 0.1) is not expressible"),
    (('"attention_dropout": 0.0', '"attention_dropout": 0.1'), '"attention_dropout"',
     "attention dropout 0.1 is not expressible"),
    (('"attention_bias": false', '"attention_bias": true'), '"attention_bias"',
     "attention_bias true is not Phi-3's"),
])
def test_phi3_refusals_are_located(edit, key, says):
    """What Phi-3's family has and .scale does not: Phi-3-mini-128k's LongRoPE (`longrope`, or `su` as older files
    name it), the partial rotary embeddings of Phi-3.5 / Phi-4-mini (at the top level or in rope_parameters), any
    dropout; each refused at its key with the feature named, and only that."""
    text = PHI3_MINI_4K.replace(*edit)
    assert text != PHI3_MINI_4K
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if key + ":" in ln)
    col = text.splitlines()[line - 1].index(key + ":") + 1
    with pytest.raises(ScaleError) as info:
        import_config(text, "p.json")
    out = info.value.render()
    assert [d.code for d in info.value.diagnostics] == ["E0954"], out
    assert f"--> p.json:{line}:{col}\n" in out and says in out, out

DEEPSEEK_V3 = """{
  "architectures": [
    "DeepseekV3ForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "auto_map": {
    "AutoConfig": "configuration_deepseek.DeepseekV3Config",
    "AutoModel": "modeling_deepseek.DeepseekV3Model",
    "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"
  },
  "aux_loss_alpha": 0.001,
  "bos_token_id": 0,
  "eos_token_id": 1,
  "ep_size": 1,
  "first_k_dense_replace": 3,
  "hidden_act": "silu",
  "hidden_size": 7168,
  "initializer_range": 0.02,
  "intermediate_size": 18432,
  "kv_lora_rank": 512,
  "max_position_embeddings": 163840,
  "model_type": "deepseek_v3",
  "moe_intermediate_size": 2048,
  "moe_layer_freq": 1,
  "n_group": 8,
  "n_routed_experts": 256,
  "n_shared_experts": 1,
  "norm_topk_prob": true,
  "num_attention_heads": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 61,
  "num_key_value_heads": 128,
  "num_nextn_predict_layers": 1,
  "q_lora_rank": 1536,
  "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "quantization_config": {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [
      128,
      128
    ]
  },
  "rms_norm_eps": 1e-06,
  "rope_scaling": {
    "beta_fast": 32,
    "beta_slow": 1,
    "factor": 40,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 4096,
    "type": "yarn"
  },
  "rope_theta": 10000,
  "routed_scaling_factor": 2.5,
  "scoring_func": "sigmoid",
  "tie_word_embeddings": false,
  "topk_group": 4,
  "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16",
  "transformers_version": "4.46.3",
  "use_cache": true,
  "v_head_dim": 128,
  "vocab_size": 129280
}
"""

DEEPSEEK_V2_LITE = """{
  "architectures": [
    "DeepseekV2ForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "auto_map": {
    "AutoConfig": "configuration_deepseek.DeepseekV2Config",
    "AutoModel": "modeling_deepseek.DeepseekV2Model",
    "AutoModelForCausalLM": "modeling_deepseek.DeepseekV2ForCausalLM"
  },
  "aux_loss_alpha": 0.001,
  "bos_token_id": 100000,
  "eos_token_id": 100001,
  "first_k_dense_replace": 1,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 10944,
  "kv_lora_rank": 512,
  "max_position_embeddings": 163840,
  "model_type": "deepseek_v2",
  "moe_intermediate_size": 1408,
  "moe_layer_freq": 1,
  "n_group": 1,
  "n_routed_experts": 64,
  "n_shared_experts": 2,
  "norm_topk_prob": false,
  "num_attention_heads": 16,
  "num_experts_per_tok": 6,
  "num_hidden_layers": 27,
  "num_key_value_heads": 16,
  "pretraining_tp": 1,
  "q_lora_rank": null,
  "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "rms_norm_eps": 1e-06,
  "rope_scaling": {
    "beta_fast": 32,
    "beta_slow": 1,
    "factor": 40,
    "mscale": 0.707,
    "mscale_all_dim": 0.707,
    "original_max_position_embeddings": 4096,
    "type": "yarn"
  },
  "rope_theta": 10000,
  "routed_scaling_factor": 1.0,
  "scoring_func": "softmax",
  "seq_aux": true,
  "tie_word_embeddings": false,
  "topk_group": 1,
  "topk_method": "greedy",
  "torch_dtype": "bfloat16",
  "transformers_version": "4.33.1",
  "use_cache": true,
  "v_head_dim": 128,
  "vocab_size": 102400
}
"""


def test_qwen15_moe_count_is_transformers_count():
    """The published figure (14.3B) is transformers' own count of the config, built on the meta device."""
    import torch
    cfg = {k: v for k, v in json.loads(QWEN15_MOE_A27B).items()
           if k not in ("architectures", "model_type", "transformers_version", "torch_dtype")}
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.Qwen2MoeConfig(**cfg))
    assert sum(p.numel() for p in model.parameters()) == 14_315_784_192


@pytest.mark.parametrize("text,cls,count", [(DEEPSEEK_V3, "DeepseekV3Config", 671_026_404_352),
                                            (DEEPSEEK_V2_LITE, "DeepseekV2Config", 15_706_484_224)])
def test_deepseek_counts_are_transformers_counts(text, cls, count):
    """DeepSeek-V3's 671B (without its multi-token-prediction layer, which transformers does not build either) and
    V2-Lite's 15.7B: transformers' own counts of the released configs, built on the meta device."""
    import torch
    cfg = {k: v for k, v in json.loads(text).items() if k not in (
        "architectures", "model_type", "transformers_version", "torch_dtype", "auto_map", "quantization_config")}
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, cls)(**cfg))
    assert sum(p.numel() for p in model.parameters()) == count


def test_deepseek_imports_as_two_repeats_with_yarn():
    """The dense first layers and the mixture layers are two repeats; V3's router is sigmoid, group-limited, scaled,
    with the expert bias; V2-Lite's softmax, greedy, not renormalised, its q projected directly. Their YaRN is
    written as mla's `rope_scaling = yarn(...)`, no approximation stated."""
    v3 = import_config(DEEPSEEK_V3, "v3/config.json")
    assert "repeat dense {" in v3 and "repeat sparse {" in v3 and "dense    = 3 " in v3 and "sparse   = 58 " in v3
    assert "scoring = sigmoid, groups = 8, topk_groups = 4, routed_scale = 2.5, bias_update = 0.001)" in v3
    assert "q_lora_rank = 1536," in v3 and "shared_ffn = 1 * moe_ffn," in v3 and "renormalize = true," in v3
    assert "rope_scaling = yarn(factor = 40, original_seq = 4096," in v3 and "APPROXIMATION" not in v3
    assert "mscale = 1.0, mscale_all_dim = 1.0))" in v3
    v2 = import_config(DEEPSEEK_V2_LITE, "v2/config.json")
    assert "dense    = 1 " in v2 and "q_lora_rank" not in v2.split("model deepseek_v2")[1].split("#")[0]
    assert "scoring = softmax, routed_scale = 1.0)" in v2 and "renormalize = false," in v2
    assert "shared_ffn = 2 * moe_ffn," in v2 and "groups =" not in v2
    for key in json.loads(DEEPSEEK_V3):
        assert key in v3, key
    for key in json.loads(DEEPSEEK_V2_LITE):
        assert key in v2, key


@pytest.mark.parametrize("cfg_cls,model_cls,extra", [
    ("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(first_k_dense_replace=1, n_group=2, topk_group=1)),
    ("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(first_k_dense_replace=0, n_group=1, topk_group=1,
                                                       n_shared_experts=0, rope_interleave=False)),
    ("DeepseekV2Config", "DeepseekV2ForCausalLM", dict(first_k_dense_replace=1, q_lora_rank=None)),
    ("DeepseekV2Config", "DeepseekV2ForCausalLM", dict(first_k_dense_replace=3, q_lora_rank=12)),
])
def test_tiny_deepseek_imports_with_transformers_parameter_count(tmp_path, cfg_cls, model_cls, extra):
    """Tiny configs as transformers writes them (rope_parameters, head_dim = qk_rope_head_dim, qk_head_dim): dense
    first layers or none or all, q through a bottleneck or not, shared experts or none."""
    config = getattr(transformers, cfg_cls)(**{**dict(
        vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4,
        v_head_dim=8, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, max_position_embeddings=32,
        q_lora_rank=16), **extra})
    path = tmp_path / "config.json"
    config.to_json_file(path)
    text = path.read_text()
    out = import_config(text, str(path))
    assert _params(out) == sum(p.numel() for p in getattr(transformers, model_cls)(config).parameters())
    for key in json.loads(text):
        assert key in out, key
    assert ("repeat dense {" in out) == (extra["first_k_dense_replace"] > 0)
    assert ("repeat sparse {" in out) == (extra["first_k_dense_replace"] < 3)


@pytest.mark.parametrize("text,edit,where,says", [
    ("v3", ('"topk_method": "noaux_tc"', '"topk_method": "greedy"'), "d.json:62:3", "topk_method \"greedy\""),
    ("v3", ('"scoring_func": "sigmoid"', '"scoring_func": "softmax"'), "d.json:59:3", "scoring_func \"softmax\""),
    ("v3", ('"moe_layer_freq": 1', '"moe_layer_freq": 2'), "d.json:25:3", "moe_layer_freq 2"),
    ("v3", ('"num_key_value_heads": 128', '"num_key_value_heads": 8'), "d.json:33:3", "num_key_value_heads 8"),
    ("v3", ('"n_group": 8', '"n_group": 7'), "d.json:26:3", "7 groups do not divide 256 experts"),
    ("v3", ('"attention_bias": false', '"attention_bias": true'), "d.json:5:3", "attention_bias true"),
    ("v2", ('"topk_method": "greedy"', '"topk_method": "group_limited_greedy"'), "d.json:53:3",
     "group_limited_greedy"),
    ("v2", ('"norm_topk_prob": false', '"norm_topk_prob": true'), "d.json:28:3", "norm_topk_prob true"),
    ("v2", ('"type": "yarn"', '"type": "longrope"'), "d.json:45:5", "rope type \"longrope\""),
])
def test_deepseek_refusals_are_located(text, edit, where, says):
    base = DEEPSEEK_V3 if text == "v3" else DEEPSEEK_V2_LITE
    changed = base.replace(*edit)
    assert changed != base
    out = _diagnose(changed, "d.json")
    assert "error[E0954]" in out and f"--> {where}\n" in out and says in out, out


@pytest.mark.parametrize("edit,where,says", [
    (('"decoder_sparse_step": 1', '"decoder_sparse_step": 2'), "q.json:27:3", "decoder_sparse_step 2"),
    (('"decoder_sparse_step": 1,', '"decoder_sparse_step": 1, "mlp_only_layers": [0, 23],'), "q.json:27:29",
     "mlp_only_layers [0, 23]"),
    (('"num_experts_per_tok": 4', '"num_experts_per_tok": 61'), "q.json:30:3", "61 experts per token out of 60"),
    (('"moe_intermediate_size": 1408', '"moe_intermediate_size": 0'), "q.json:28:3", "moe_intermediate_size"),
])
def test_qwen2_moe_refusals_are_located(edit, where, says):
    """Dense layers between sparse ones (decoder_sparse_step > 1, mlp_only_layers) cannot be written with one
    `repeat`: refused at the key, as are impossible figures."""
    text = QWEN15_MOE_A27B.replace(*edit)
    assert text != QWEN15_MOE_A27B
    out = _diagnose(text, "q.json")
    assert "error[E0954]" in out and f"--> {where}\n" in out and says in out, out


@pytest.mark.parametrize("name,text,count", [("llama2_7b", LLAMA2_7B, 6_738_415_616),
                                              ("llama3_8b", LLAMA3_8B, 8_030_261_248),
                                              ("mixtral_8x7b", MIXTRAL_8X7B, 46_702_792_704),
                                              # 14.3B: transformers' own count of this config on the meta device
                                              ("qwen1.5_moe_a2.7b", QWEN15_MOE_A27B, 14_315_784_192),
                                              # 3.8B: transformers' own count (test_phi3_mini_count_is_...)
                                              ("phi3_mini_4k", PHI3_MINI_4K, 3_821_079_552),
                                              # transformers' counts (test_deepseek_counts_are_transformers_counts)
                                              ("deepseek_v3", DEEPSEEK_V3, 671_026_404_352),
                                              ("deepseek_v2_lite", DEEPSEEK_V2_LITE, 15_706_484_224)])
def test_published_configs_give_published_parameter_counts(name, text, count):
    out = import_config(text, f"{name}/config.json")
    assert _params(out, f"{name}.scale") == count


@pytest.mark.parametrize("edit,where,says", [
    (('"decoder_sparse_step": 1', '"decoder_sparse_step": 2'), "q.json:8:3", "decoder_sparse_step 2"),
    (('"mlp_only_layers": []', '"mlp_only_layers": [0, 47]'), "q.json:17:3", "mlp_only_layers [0, 47]"),
    (('"num_experts_per_tok": 8', '"num_experts_per_tok": 129'), "q.json:23:3", "129 experts per token out of 128"),
    (('"num_experts": 128,', '"num_experts": 128, "num_local_experts": 64,'), "q.json:22:23",
     "num_local_experts 64 differs from num_experts 128"),
    (('"use_sliding_window": false', '"use_sliding_window": true'), "q.json:36:3", "use_sliding_window = true"),
])
def test_qwen3_moe_refusals_are_located(edit, where, says):
    """Qwen3-MoE as Qwen2-MoE: dense layers between sparse ones are refused at their key, as are impossible
    figures and the two names of the expert count (the released `num_experts`, transformers 5's
    `num_local_experts`) disagreeing."""
    from tests.test_published_models import QWEN3_30B_A3B
    text = QWEN3_30B_A3B.replace(*edit)
    assert text != QWEN3_30B_A3B
    out = _diagnose(text, "q.json")
    assert "error[E0954]" in out and f"--> {where}\n" in out and says in out, out


def _diagnose(text: str, path: str = "config.json") -> str:
    with pytest.raises(ScaleError) as info:
        import_config(text, path)
    return info.value.render()


def test_unknown_key_is_located_at_the_key():
    text = LLAMA2_7B.replace('  "use_cache": true,\n', '  "use_cache": true,\n  "quantization_config": {"bits": 4},\n')
    assert _diagnose(text) == (
        "error[E0953]: unknown key `quantization_config` in a LlamaForCausalLM config\n"
        "  --> config.json:22:3\n"
        "   |\n"
        '22 |   "quantization_config": {"bits": 4},\n'
        "   |   ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^ not known to `scalec import`\n"
        "   = help: a key the importer does not know might change the architecture, so it is not ignored; remove "
        "it if it does not (known keys: compiler/importer.py USED and IRRELEVANT)\n\n"
        "error: aborting due to 1 previous error\n")


def test_unsupported_value_is_located_at_the_key():
    text = MIXTRAL_8X7B.replace('"output_router_logits": false', '"output_router_logits": "no"')
    assert _diagnose(text, "mixtral/config.json") == (
        'error[E0954]: output_router_logits must be true or false, not "no"\n'
        "  --> mixtral/config.json:17:3\n"
        "   |\n"
        '17 |   "output_router_logits": "no",\n'
        "   |   ^^^^^^^^^^^^^^^^^^^^^^^^^^^^ not expressible in .scale\n"
        "   = help: true or false\n\n"
        "error: aborting due to 1 previous error\n")


def test_sliding_window_is_written():
    """Mistral 7B's and Mixtral's `sliding_window` is every layer's window; Qwen 2's with use_sliding_window and
    max_window_layers 0 (every layer from the first on) too."""
    out = import_config(MIXTRAL_8X7B.replace('"sliding_window": null', '"sliding_window": 4096'), "m.json")
    assert "window   = 4096 " in out and "window = window," in out and "within the window" in out
    spec = check_text(complete(out), "m.scale")
    assert {spec.value(x.window) for x in S.walk(spec.model.layers) if isinstance(x, S.Attention)} == {4096}
    qwen = json.dumps({"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True, "sliding_window": 512,
                       "max_window_layers": 0, "num_hidden_layers": 4}, indent=2)
    out = import_config(qwen, "q.json")
    assert "window   = 512 " in out and "use_sliding_window true; max_window_layers 0: every layer windowed" in out
    listed = json.dumps({"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True, "sliding_window": 512,
                         "num_hidden_layers": 2, "layer_types": ["sliding_attention"] * 2}, indent=2)
    assert "window   = 512 " in import_config(listed, "q.json")
    # windows configured for no layer: attention over the whole sequence, as before
    for off in (dict(use_sliding_window=False, max_window_layers=0), dict(use_sliding_window=True,
                                                                           max_window_layers=4)):
        text = json.dumps({"architectures": ["Qwen2ForCausalLM"], "sliding_window": 512, "num_hidden_layers": 4,
                           **off}, indent=2)
        assert "window" not in import_config(text, "q.json").split("model qwen2")[1].split("#")[0]
        assert "window =" not in import_config(text, "q.json")


@pytest.mark.parametrize("extra,where", [
    (dict(max_window_layers=2), '"max_window_layers": 2'),
    (dict(layer_types=["full_attention", "sliding_attention", "full_attention", "sliding_attention"]),
     '"layer_types": ['),
])
def test_per_layer_windows_are_refused_at_their_key(extra, where):
    """Qwen 2 windows only the layers from max_window_layers on (or those `layer_types` lists): a stack of two
    attention kinds, which one `repeat` of identical blocks cannot write."""
    text = json.dumps({"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True, "sliding_window": 512,
                       "num_hidden_layers": 4, **extra}, indent=2)
    out = _diagnose(text, "q.json")
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if where in ln)
    assert out.startswith("error[E0954]: 2 of 4 layers use sliding-window attention and the others full attention: "
                          f"per-layer attention kinds are not expressible\n --> q.json:{line}:"), out
    assert "a `repeat` holds identical blocks" in out


@pytest.mark.parametrize("edit,code,where", [
    (('"hidden_act": "silu"', '"hidden_act": "gelu"'), "E0954", "config.json:7:3"),
    (('"rope_scaling": null', '"rope_scaling": {"rope_type": "yarn", "factor": 4.0}'), "E0954", "config.json:18:20"),
    (('"rope_scaling": null', '"rope_scaling": {"rope_type": "llama3", "factr": 4.0}'), "E0953", "config.json:18:43"),
    (('"attention_dropout": 0.0', '"attention_dropout": 0.1'), "E0954", "config.json:4:3"),
    (('"num_key_value_heads": 8', '"num_key_value_heads": 5'), "E0954", "config.json:15:3"),
    (('"vocab_size": 128256', '"vocab_size": "big"'), "E0954", "config.json:24:3"),
    (('"LlamaForCausalLM"', '"GPT2LMHeadModel"'), "E0952", "config.json:2:3"),
    (('"model_type": "llama"', '"model_type": "mistral"'), "E0952", "config.json:12:3"),
    (('"use_cache": true,', '"use_cache": true, "use_cache": false,'), "E0102", "config.json:23:22"),
    (('"hidden_size": 4096,', '"hidden_size": 4096'), "E0951", "config.json:9:3"),
])
def test_each_refusal_is_located(edit, code, where):
    out = _diagnose(LLAMA3_8B.replace(*edit))
    assert f"error[{code}]" in out and f"--> {where}\n" in out and "^" in out, out


def test_an_absent_key_is_read_as_transformers_default():
    """transformers' MistralConfig defaults to a 4096-token sliding window: a file that omits the key gets it, and
    the output says so; Llama's defaults map, and the output says which were absent."""
    text = json.dumps({"architectures": ["MistralForCausalLM"], "model_type": "mistral"}, indent=2)
    out = import_config(text, "c.json")
    assert "window   = 4096 " in out and "# sliding_window (absent: transformers' default): each query" in out
    out = import_config(json.dumps({"architectures": ["LlamaForCausalLM"]}), "c.json")
    assert "vocab    = 32000" in out and "# vocab_size (absent: transformers' default)" in out
    assert _params(out) == 6_738_415_616  # LlamaConfig()'s defaults are Llama-2-7B's shapes


def test_cli_prints_the_section_and_writes_a_checked_file(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(LLAMA3_8B)
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", "compiler.cli", "import", str(cfg)], capture_output=True, text=True,
                       cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == import_config(LLAMA3_8B, str(cfg)) and "model llama {" in r.stdout
    out = tmp_path / "llama.scale"
    r = subprocess.run([sys.executable, "-m", "compiler.cli", "import", str(cfg), "-o", str(out)],
                       capture_output=True, text=True, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr
    assert out.read_text() == complete(import_config(LLAMA3_8B, str(cfg)))
    cfg.write_text(LLAMA3_8B.replace('"rms_norm_eps": 1e-05', '"rms_norm_eps": 1e-05, "foo": 1'))
    r = subprocess.run([sys.executable, "-m", "compiler.cli", "import", str(cfg)], capture_output=True, text=True,
                       cwd=ROOT, env=env)
    assert r.returncode == 1 and "Traceback" not in r.stderr and r.stdout == ""
    assert f"--> {cfg}:17:26" in r.stderr and "error[E0953]" in r.stderr


def test_any_damage_is_a_located_diagnostic_never_a_crash():
    """A config cut short anywhere, or with any key's value replaced by a value of another type, is imported or
    refused with located diagnostics: never a Python exception."""
    for text in (LLAMA3_8B, MIXTRAL_8X7B):
        for cut in range(0, len(text), 7):
            with pytest.raises(ScaleError) as info:
                import_config(text[:cut], "c.json")
            assert all(d.span is not None for d in info.value.diagnostics)
            info.value.render()
        for key in json.loads(text):
            for bad in (None, "x", [], {}, -1, 0, 1.5, True, 1e400):
                cfg = json.loads(text)
                cfg[key] = bad
                try:
                    import_config(json.dumps(cfg, indent=2), "c.json")
                except ScaleError as e:
                    assert all(d.span is not None for d in e.diagnostics), (key, bad)
                    e.render()


def test_docs_show_what_import_prints():
    page = (ROOT / "docs" / "released_models.md").read_text()
    block = page.split("## Import: `scalec import`", 1)[1].split("```", 2)[1].split("\n", 1)[1]  # less its info string
    out = import_config(LLAMA3_8B, "config.json")
    lines = [ln for ln in block.strip().splitlines() if "..." not in ln]
    assert len(lines) >= 8
    for ln in lines:
        assert ln in out.splitlines(), ln


def test_cli_takes_a_checkpoint_directory(tmp_path, capsys):
    """`scalec import DIR`: the directory save_pretrained wrote, read through its config.json; a directory without
    one says so (not "not a .scale file")."""
    from compiler.cli import main
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(LLAMA3_8B)
    assert main(["import", str(tmp_path / "ckpt")]) == 0
    assert capsys.readouterr().out == import_config(LLAMA3_8B, str(tmp_path / "ckpt" / "config.json"))
    assert main(["import", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path} is a directory without a config.json" in err and ".scale" not in err


@pytest.mark.parametrize("arch,model_type,lacks", [
    ("GemmaForCausalLM", "gemma", "the first Gemma's layout"),
    ("Gemma3ForConditionalGeneration", "gemma3", "a vision tower"),
])
def test_a_family_not_importable_yet_is_refused_with_what_the_language_lacks(arch, model_type, lacks):
    """Not "unknown": the refusal names the real blocker, at `architectures` (or at `model_type` without it)."""
    for text, where in ((json.dumps({"architectures": [arch], "model_type": model_type}, indent=2), "c.json:2:3"),
                        (json.dumps({"model_type": model_type}, indent=2), "c.json:2:3")):
        out = _diagnose(text, "c.json")
        assert "error[E0952]" in out and f"{arch} is not importable yet" in out and lacks in out, out
        assert f"--> {where}\n" in out, out


def test_a_head_dim_of_its_own_is_written_as_head_dim():
    """Mistral-Nemo: head_dim 128 where hidden_size / num_attention_heads is 160; heads that do not divide the width
    are no error when head_dim is given, and an odd head_dim under rotary embeddings is one, at the key."""
    cfg = json.loads(LLAMA3_8B)
    cfg.update(architectures=["MistralForCausalLM"], model_type="mistral", hidden_size=5120, head_dim=128,
               num_attention_heads=32, sliding_window=None)
    cfg = {k: v for k, v in cfg.items() if k not in ("attention_bias", "mlp_bias", "pretraining_tp", "rope_scaling")}
    out = import_config(json.dumps(cfg, indent=2), "nemo.json")
    assert "head_dim = 128 " in out and "# head_dim; not hidden / heads = 5120 / 32" in out
    assert "head_dim = head_dim," in out and "qk_norm" not in out
    cfg.update(num_attention_heads=48)  # 5120 % 48 != 0: each head is head_dim wide all the same
    assert "heads    = 48 " in import_config(json.dumps(cfg, indent=2), "nemo.json")
    cfg.update(head_dim=127)
    out = _diagnose(json.dumps(cfg, indent=2), "nemo.json")
    assert "error[E0954]: head_dim 127 is odd" in out, out
    del cfg["head_dim"]
    out = _diagnose(json.dumps(cfg, indent=2), "nemo.json")
    assert "error[E0954]: 48 heads do not divide hidden_size 5120" in out and "give head_dim" in out, out

MOE_CONFIGS = ("mixtral_8x7b", "qwen1.5_moe_a2.7b", "qwen3_30b_a3b", "qwen3_235b_a22b", "deepseek_v2_lite",
               "deepseek_v3")  # every released mixture of tests/reference/hf (copies of the configs typed in above)


@pytest.mark.parametrize("name", MOE_CONFIGS)
def test_imported_mixtures_are_dispatched_grouped(tmp_path, capsys, name):
    """Issue 37: every released mixture routes dropless, so `scalec import` writes `dispatch = grouped` (the rows
    sorted by expert) where the default `padded` would compute a slot per token for every expert (and `search`
    would avoid ep for it): each `moe` layer of the file written is grouped, with the line saying why."""
    from compiler.cli import main
    out = tmp_path / f"{name}.scale"
    assert main(["import", str(ROOT / "tests" / "reference" / "hf" / f"{name}.json"), "-o", str(out)]) == 0
    text = out.read_text()
    spec = check_text(text, str(out))
    moes = [x for x in S.walk(spec.model.layers) if isinstance(x, S.MoE)]
    assert moes and all(m.dispatch == "grouped" and m.capacity_factor == "none" for m in moes), name
    assert "dispatch = grouped," in text and "no padded slot per token" in text
