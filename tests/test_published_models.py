"""Released architectures written in the language: `scalec plan` prints their published parameter counts exactly
(Llama 2 7B: Touvron et al. 2023; Llama 3 8B and 70B: Meta 2024; Mixtral 8x7B: Jiang et al. 2024; Mistral 7B
imported from its config.json with its sliding window: Jiang et al. 2023; imported Qwen 3, Mistral-Nemo,
Qwen3-MoE, Gemma 2, Gemma 3, Qwen 2.5, Llama 3.2, TinyLlama and Mistral v0.3 configs: transformers' own count), and
each
sample's plan fits its cluster (the compiler refuses one that does not)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from compiler import spec as S
from compiler.check import check_text
from compiler.report.plan import plan_text
from compiler.fit import budget
from compiler.pipeline import compile_spec

ROOT = Path(__file__).resolve().parents[1]

# llama3_405b: transformers' count of meta-llama/Llama-3.1-405B's config.json (its safetensors index: 405.85B)
PUBLISHED = {"llama3_8b": 8_030_261_248, "llama3_70b": 70_553_706_496, "mixtral_8x7b": 46_702_792_704,
             "llama3_405b": 405_853_388_800}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_sample_prints_the_published_parameter_count(name):
    path = ROOT / "samples" / f"{name}.scale"
    compiled = compile_spec(check_text(path.read_text(), str(path)))
    assert compiled.costs.params_n == PUBLISHED[name]
    assert f"parameters  {PUBLISHED[name]:,} " in plan_text(compiled)
    assert budget(compiled) == []  # fits, with no warning of being within 10% of the device


def test_llama2_7b_has_its_published_parameter_count():
    text = (ROOT / "samples" / "llama3_8b.scale").read_text()
    for old, new in (("vocab   = 128256", "vocab   = 32000"), ("kv      = 8", "kv      = 32"),
                     ("ffn     = 14336", "ffn     = 11008"), ("seq     = 8192", "seq     = 4096"),
                     ("rope_theta = 500000", "rope_theta = 10000")):
        assert old in text
        text = text.replace(old, new)
    compiled = compile_spec(check_text(text, "llama2_7b.scale"))
    assert compiled.costs.params_n == 6_738_415_616


# Released configs with heads of their own width, typed in as published on the Hugging Face Hub: Qwen3-0.6B and
# Qwen3-8B (Qwen team, 2025: q/k RMSNorm, head_dim 128 where hidden_size / heads is 64 in the 0.6B) and
# Mistral-Nemo-Base-2407 (Mistral AI and NVIDIA, 2024: head_dim 128 where 5120 / 32 is 160).
QWEN3_0_6B = """{
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}
"""
QWEN3_8B = """{
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 12288,
  "max_position_embeddings": 40960,
  "max_window_layers": 36,
  "model_type": "qwen3",
  "num_attention_heads": 32,
  "num_hidden_layers": 36,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}
"""
MISTRAL_NEMO_12B = """{
  "architectures": ["MistralForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 5120,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 1024000,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 40,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 131072
}
"""
# Mistral-7B-v0.1 (Mistral AI, 2023): grouped-query attention within a 4096-token sliding window.
MISTRAL_7B_V0_1 = """{
  "architectures": [
    "MistralForCausalLM"
  ],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "sliding_window": 4096,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
}
"""
WINDOW_CONFIGS = {"mistral_7b_v0_1": (MISTRAL_7B_V0_1, 7_241_732_096, 7.2e9)}
# name -> (config.json, parameters, the published figure it rounds to: the model cards' "0.6B" (0.44B without the
# embedding), "8.2B" (6.95B without), and Mistral-Nemo's "12B")
HEAD_DIM_CONFIGS = {"qwen3_0_6b": (QWEN3_0_6B, 596_049_920, 0.6e9), "qwen3_8b": (QWEN3_8B, 8_190_735_360, 8.2e9),
                    "mistral_nemo_12b": (MISTRAL_NEMO_12B, 12_247_782_400, 12e9)}


# Qwen3-30B-A3B and Qwen3-235B-A22B (Qwen team, 2025): Qwen 3's attention (q/k RMSNorm, head_dim 128 where
# hidden_size / heads is 64) with 128 fine-grained experts of their own width (moe_intermediate_size), eight per
# token, their gates renormalised (norm_topk_prob), no shared expert; typed in as published on the Hugging Face Hub.
QWEN3_30B_A3B = """{
  "architectures": [
    "Qwen3MoeForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "decoder_sparse_step": 1,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 6144,
  "max_position_embeddings": 40960,
  "max_window_layers": 48,
  "mlp_only_layers": [],
  "model_type": "qwen3_moe",
  "moe_intermediate_size": 768,
  "norm_topk_prob": true,
  "num_attention_heads": 32,
  "num_experts": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 48,
  "num_key_value_heads": 4,
  "output_router_logits": false,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}
"""
QWEN3_235B_A22B = """{
  "architectures": [
    "Qwen3MoeForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "decoder_sparse_step": 1,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 12288,
  "max_position_embeddings": 40960,
  "max_window_layers": 94,
  "mlp_only_layers": [],
  "model_type": "qwen3_moe",
  "moe_intermediate_size": 1536,
  "norm_topk_prob": true,
  "num_attention_heads": 64,
  "num_experts": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 94,
  "num_key_value_heads": 4,
  "output_router_logits": false,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}
"""
# name -> (config.json, parameters, the model card's total it rounds to, to how many decimals of a billion: "30.5B"
# (3.3B activated) and "235B" (22B activated))
QWEN3_MOE_CONFIGS = {"qwen3_30b_a3b": (QWEN3_30B_A3B, 30_532_122_624, 30.5, 1),
                     "qwen3_235b_a22b": (QWEN3_235B_A22B, 235_093_634_560, 235, 0)}


def _imported_count_is_transformers(name: str, text: str, count: int) -> None:
    """Imported, planned on the meta device: the parameters are exactly transformers' own model of the same
    config.json (built on the meta device, nothing allocated)."""
    import json

    from compiler.importer import complete, import_config
    transformers = pytest.importorskip("transformers")  # the test-only extra (pyproject `dev`)
    import torch
    imported = import_config(text, f"{name}/config.json")
    compiled = compile_spec(check_text(complete(imported), f"{name}.scale"))
    if name in WINDOW_CONFIGS:  # the window is written, and the program attends within it
        assert "window   = 4096 " in imported and "window = window," in imported
        assert any(isinstance(x, S.Attention) and compiled.spec.value(x.window) == 4096
                   for x in S.walk(compiled.spec.model.layers))
    assert compiled.costs.params_n == count
    assert f"parameters  {count:,} " in plan_text(compiled)
    cfg = json.loads(text)
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == count


@pytest.mark.parametrize("name", sorted(HEAD_DIM_CONFIGS) + sorted(WINDOW_CONFIGS))
def test_head_dim_models_have_transformers_parameter_count(name):
    """The parameters are transformers' own count, and round to the published figure."""
    text, count, published = {**HEAD_DIM_CONFIGS, **WINDOW_CONFIGS}[name]
    _imported_count_is_transformers(name, text, count)
    assert round(count / 10 ** 9, 1 if count < 10 ** 10 else 0) == round(published / 10 ** 9, 1)


@pytest.mark.parametrize("name", sorted(QWEN3_MOE_CONFIGS))
def test_qwen3_moe_models_have_transformers_parameter_count(name):
    """Qwen3-MoE: q/k norms, heads of their own width and experts of their own width, counted exactly as
    transformers builds them; the totals round to the model cards'."""
    text, count, published, digits = QWEN3_MOE_CONFIGS[name]
    _imported_count_is_transformers(name, text, count)
    assert round(count / 10 ** 9, digits) == published


def _gemma2(hidden: int, ffn: int, heads: int, kv: int, layers: int, head_dim: int, scalar: int) -> str:
    """A released Gemma 2 config.json (google/gemma-2-2b, -9b, -27b), typed in: they differ in these figures."""
    return f"""{{
  "architectures": ["Gemma2ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "attn_logit_softcapping": 50.0,
  "bos_token_id": 2,
  "cache_implementation": "hybrid",
  "eos_token_id": [1, 107],
  "final_logit_softcapping": 30.0,
  "head_dim": {head_dim},
  "hidden_act": "gelu_pytorch_tanh",
  "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": {hidden},
  "initializer_range": 0.02,
  "intermediate_size": {ffn},
  "max_position_embeddings": 8192,
  "model_type": "gemma2",
  "num_attention_heads": {heads},
  "num_hidden_layers": {layers},
  "num_key_value_heads": {kv},
  "pad_token_id": 0,
  "query_pre_attn_scalar": {scalar},
  "rms_norm_eps": 1e-06,
  "rope_theta": 10000.0,
  "sliding_window": 4096,
  "torch_dtype": "float32",
  "transformers_version": "4.42.4",
  "use_cache": true,
  "vocab_size": 256000
}}"""


def _gemma3(hidden: int, ffn: int, heads: int, kv: int, layers: int, window: int, vocab: int, positions: int,
            scaling: str) -> str:
    """A released Gemma 3 language model's config.json (google/gemma-3-1b-pt; the 4B's `text_config` as a
    Gemma3ForCausalLM), typed in."""
    return f"""{{
  "architectures": ["Gemma3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "attn_logit_softcapping": null,
  "bos_token_id": 2,
  "cache_implementation": "hybrid",
  "eos_token_id": 1,
  "final_logit_softcapping": null,
  "head_dim": 256,
  "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": {hidden},
  "initializer_range": 0.02,
  "intermediate_size": {ffn},
  "max_position_embeddings": {positions},
  "model_type": "gemma3_text",
  "num_attention_heads": {heads},
  "num_hidden_layers": {layers},
  "num_key_value_heads": {kv},
  "pad_token_id": 0,
  "query_pre_attn_scalar": 256,
  "rms_norm_eps": 1e-06,
  "rope_local_base_freq": 10000,
  "rope_scaling": {scaling},
  "rope_theta": 1000000,
  "sliding_window": {window},
  "sliding_window_pattern": 6,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.50.0.dev0",
  "use_cache": true,
  "vocab_size": {vocab}
}}"""


# name -> (config.json, transformers' count, the model card's figure in billions; the 4B's counts its language
# model only, the card's 4.3B adds the vision tower)
GEMMA_CONFIGS = {
    "gemma2_2b": (_gemma2(2304, 9216, 8, 4, 26, 256, 256), 2_614_341_888, 2.6),
    "gemma2_9b": (_gemma2(3584, 14336, 16, 8, 42, 256, 256), 9_241_705_984, 9.2),
    "gemma2_27b": (_gemma2(4608, 36864, 32, 16, 46, 128, 144), 27_227_128_320, 27.2),
    "gemma3_1b": (_gemma3(1152, 6912, 4, 1, 26, 512, 262144, 32768, "null"), 999_885_952, 1.0),
    "gemma3_4b_text": (_gemma3(2560, 10240, 8, 4, 34, 1024, 262208, 131072,
                               '{"factor": 8.0, "rope_type": "linear"}'), 3_880_263_168, 3.9),
}


@pytest.mark.parametrize("name", sorted(GEMMA_CONFIGS))
def test_gemma_models_have_transformers_parameter_count(name):
    """Gemma 2 and Gemma 3: four zero-centred norms a layer, GeGLU, heads of their own width, layers of two kinds
    written a period a block (Gemma-3-1B's 26 = 4 × 6 + 2 as two repeats), counted exactly as transformers builds
    them; the totals round to the model cards'."""
    text, count, published = GEMMA_CONFIGS[name]
    _imported_count_is_transformers(name, text, count)
    assert round(count / 10 ** 9, 1) == published


def _config(arch: str, model_type: str, **keys) -> str:
    """A released config.json, typed in: the keys that shape the model, and the token ids and dtype it ships."""
    return json.dumps({"architectures": [arch], "model_type": model_type, "attention_dropout": 0.0,
                       "hidden_act": "silu", "initializer_range": 0.02, "torch_dtype": "bfloat16",
                       "use_cache": True, **keys}, indent=2)


# The dense configs a new user imported first (issue 26), each as released; name -> (config.json, transformers'
# count, the model card's figure in billions)
DENSE_CONFIGS = {
    "qwen2.5_7b": (_config("Qwen2ForCausalLM", "qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                           num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                           max_position_embeddings=131072, rope_theta=1000000.0, rms_norm_eps=1e-06,
                           tie_word_embeddings=False, use_sliding_window=False, sliding_window=131072,
                           max_window_layers=28, bos_token_id=151643, eos_token_id=151643),
                   7_615_616_512, 7.6),
    "qwen2.5_0.5b": (_config("Qwen2ForCausalLM", "qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                             num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                             max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-06,
                             tie_word_embeddings=True, use_sliding_window=False, sliding_window=32768,
                             max_window_layers=24, bos_token_id=151643, eos_token_id=151643),
                     494_032_768, 0.5),
    "llama3.2_1b": (_config("LlamaForCausalLM", "llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                            num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                            max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-05,
                            rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                          "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                            tie_word_embeddings=True, attention_bias=False, mlp_bias=False, pretraining_tp=1,
                            bos_token_id=128000, eos_token_id=128001),
                    1_235_814_400, 1.2),
    "tinyllama_1.1b": (_config("LlamaForCausalLM", "llama", vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                               num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                               max_position_embeddings=2048, rope_theta=10000.0, rms_norm_eps=1e-05,
                               rope_scaling=None, tie_word_embeddings=False, attention_bias=False,
                               pretraining_tp=1, bos_token_id=1, eos_token_id=2),
                       1_100_048_384, 1.1),
    "mistral_7b_v0.3": (_config("MistralForCausalLM", "mistral", vocab_size=32768, hidden_size=4096,
                                intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                                num_key_value_heads=8, max_position_embeddings=32768, rope_theta=1000000.0,
                                rms_norm_eps=1e-05, sliding_window=None, tie_word_embeddings=False,
                                bos_token_id=1, eos_token_id=2),
                        7_248_023_552, 7.2),
}


@pytest.mark.parametrize("name", sorted(DENSE_CONFIGS))
def test_dense_models_have_transformers_parameter_count(name):
    """Qwen 2.5, Llama 3.2, TinyLlama and Mistral v0.3 as released: transformers' own count, rounding to the model
    cards'."""
    text, count, published = DENSE_CONFIGS[name]
    _imported_count_is_transformers(name, text, count)
    assert round(count / 10 ** 9, 1) == published
