"""What `scalec import` knows of a Hugging Face config.json's keys (compiler/importer.py reads the file with them):
the importable architectures and those not yet, transformers' defaults for the keys that shape the model, the keys
each architecture's output uses, and the keys irrelevant to training the architecture, with the reason."""
from __future__ import annotations

# architectures[0] -> model_type, the model's name in the output
ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
                 "Qwen3ForCausalLM": "qwen3", "Phi3ForCausalLM": "phi3", "MixtralForCausalLM": "mixtral", "Qwen2MoeForCausalLM": "qwen2_moe",
                 "Qwen3MoeForCausalLM": "qwen3_moe", "Gemma2ForCausalLM": "gemma2",
                 "Gemma3ForCausalLM": "gemma3_text", "DeepseekV2ForCausalLM": "deepseek_v2",
                 "DeepseekV3ForCausalLM": "deepseek_v3"}

# Architectures people fine-tune that `scalec import` cannot write yet, with what the language lacks for each (read
# from transformers' modeling files of each family): a refusal names the real blocker, not only "unknown".
NOT_YET = {
    "GemmaForCausalLM": ("gemma", "the importer's map of the first Gemma's layout (its pieces are in the language: "
                         "`rmsnorm(..., zero_centered = true)`, `embedding(..., scaled = true)`, `act = geglu`, "
                         "`head_dim`; write the model section by hand, or import a Gemma 2 or Gemma 3 config)"),
    "Gemma3ForConditionalGeneration": ("gemma3", "a vision tower (SigLIP) and its projector beside the language "
                                       "model (its language model alone imports as Gemma3ForCausalLM: "
                                       "text_config, model_type gemma3_text)"),
}

# transformers' defaults for the keys that shape the model (its LlamaConfig(), MistralConfig(), Qwen2Config(),
# Qwen3Config(), Phi3Config(), MixtralConfig(), Qwen2MoeConfig(), Qwen3MoeConfig(), transformers 4.3x-5.x); None for
# num_key_value_heads means "= num_attention_heads", for head_dim "= hidden_size / num_attention_heads".
_COMMON_DEFAULTS = dict(hidden_act="silu", num_key_value_heads=None, head_dim=None, attention_dropout=0.0,
                        tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None)
DEFAULTS = {
    "llama": dict(_COMMON_DEFAULTS, vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                  num_hidden_layers=32, num_attention_heads=32, max_position_embeddings=2048,
                  attention_bias=False, mlp_bias=False),
    "mistral": dict(_COMMON_DEFAULTS, vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                    max_position_embeddings=131072, sliding_window=4096),
    "qwen2": dict(_COMMON_DEFAULTS, vocab_size=151936, hidden_size=4096, intermediate_size=22016,
                  num_hidden_layers=32, num_attention_heads=32, max_position_embeddings=32768,
                  use_sliding_window=False, sliding_window=4096, max_window_layers=28),
    "qwen3": dict(_COMMON_DEFAULTS, vocab_size=151936, hidden_size=4096, intermediate_size=22016,
                  num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32, head_dim=128,
                  max_position_embeddings=32768, attention_bias=False, use_sliding_window=False,
                  sliding_window=4096, max_window_layers=28),
    # Phi3Config: no window unless the file has one (Phi-3-mini-4k's is 2047); partial_rotary_factor is 1 (every
    # dimension turned) unless given, at the top level or in rope_parameters
    "phi3": dict(_COMMON_DEFAULTS, vocab_size=32064, hidden_size=3072, intermediate_size=8192,
                 num_hidden_layers=32, num_attention_heads=32, max_position_embeddings=4096,
                 original_max_position_embeddings=4096, rms_norm_eps=1e-5, sliding_window=None, resid_pdrop=0.0,
                 embd_pdrop=0.0),
    "mixtral": dict(_COMMON_DEFAULTS, vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                    max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=1e6, sliding_window=None,
                    num_local_experts=8, num_experts_per_tok=2, router_aux_loss_coef=0.001,
                    router_jitter_noise=0.0, output_router_logits=False),
    "qwen2_moe": dict(_COMMON_DEFAULTS, vocab_size=151936, hidden_size=2048, intermediate_size=5632,
                      num_hidden_layers=24, num_attention_heads=16, max_position_embeddings=32768,
                      use_sliding_window=False, qkv_bias=True, decoder_sparse_step=1, mlp_only_layers=[],
                      moe_intermediate_size=1408, shared_expert_intermediate_size=5632, num_experts=60,
                      num_experts_per_tok=4, norm_topk_prob=False, router_aux_loss_coef=0.001,
                      output_router_logits=False),
    # Qwen3MoeConfig has no head_dim of its own: its attention reads hidden_size / heads when the file has none
    "qwen3_moe": dict(_COMMON_DEFAULTS, vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                      num_hidden_layers=24, num_attention_heads=32, num_key_value_heads=4,
                      max_position_embeddings=32768, attention_bias=False, use_sliding_window=False,
                      decoder_sparse_step=1, mlp_only_layers=[], moe_intermediate_size=768, num_experts=128,
                      num_experts_per_tok=8, norm_topk_prob=False, router_aux_loss_coef=0.001,
                      output_router_logits=False),
    # Gemma 2 and Gemma 3 (text): compiler/importer_gemma.py; rope_theta: Gemma 3's full layers' base
    "gemma2": dict(vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                   num_attention_heads=8, num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh",
                   max_position_embeddings=8192, rms_norm_eps=1e-6, tie_word_embeddings=True, rope_theta=10000.0,
                   rope_scaling=None, attention_bias=False, attention_dropout=0.0, query_pre_attn_scalar=256,
                   sliding_window=4096, final_logit_softcapping=30.0, attn_logit_softcapping=50.0),
    "gemma3_text": dict(vocab_size=262208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                        num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                        hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131072, rms_norm_eps=1e-6,
                        tie_word_embeddings=True, rope_theta=1e6, rope_scaling=None, rope_local_base_freq=10000.0,
                        attention_bias=False, attention_dropout=0.0, query_pre_attn_scalar=256, sliding_window=4096,
                        final_logit_softcapping=None, attn_logit_softcapping=None,
                        use_bidirectional_attention=False),
    # DeepSeek: compiler/importer_deepseek.py (head_dim is qk_rope_head_dim there, checked, not defaulted)
    "deepseek_v3": dict(vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                        num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1,
                        n_routed_experts=256, routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=1536,
                        qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, n_group=8, topk_group=4,
                        num_experts_per_tok=8, first_k_dense_replace=3, norm_topk_prob=True, hidden_act="silu",
                        max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
                        rope_theta=10000.0, rope_scaling=None, rope_interleave=True, attention_bias=False,
                        attention_dropout=0.0, output_router_logits=False),
    "deepseek_v2": dict(vocab_size=102400, hidden_size=4096, intermediate_size=11008, moe_intermediate_size=1407,
                        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=None, n_shared_experts=2,
                        n_routed_experts=64, routed_scaling_factor=1.0, kv_lora_rank=512, q_lora_rank=1536,
                        qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, n_group=None, topk_group=None,
                        num_experts_per_tok=None, first_k_dense_replace=0, norm_topk_prob=False,
                        topk_method="greedy", hidden_act="silu", max_position_embeddings=2048, rms_norm_eps=1e-6,
                        tie_word_embeddings=False, rope_theta=10000.0, rope_scaling=None, attention_bias=False,
                        attention_dropout=0.0, mlp_bias=False, output_router_logits=False),
}

# Keys the output uses (or checks), per architecture. Each appears in a comment of the line that uses it.
_COMMON_USED = ("architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size",
                "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
                "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings", "attention_dropout",
                "rope_theta", "rope_scaling", "rope_parameters")
USED = {"llama": _COMMON_USED + ("attention_bias", "mlp_bias"),
        "mistral": _COMMON_USED + ("sliding_window",),
        "qwen2": _COMMON_USED + ("use_sliding_window", "sliding_window", "max_window_layers", "layer_types"),
        "qwen3": _COMMON_USED + ("attention_bias", "use_sliding_window", "sliding_window", "max_window_layers",
                                 "layer_types"),
        # attention_bias: transformers' Phi3Config has none (its attention never has biases), the released files
        # say false; original_max_position_embeddings is read by longrope scaling only
        "phi3": _COMMON_USED + ("attention_bias", "sliding_window", "original_max_position_embeddings",
                                "partial_rotary_factor", "resid_pdrop", "embd_pdrop"),
        "mixtral": _COMMON_USED + ("sliding_window", "num_local_experts", "num_experts_per_tok",
                                   "router_aux_loss_coef", "router_jitter_noise", "output_router_logits"),
        "qwen2_moe": _COMMON_USED + ("use_sliding_window", "sliding_window", "max_window_layers", "layer_types",
                                     "qkv_bias", "decoder_sparse_step", "mlp_only_layers", "moe_intermediate_size",
                                     "shared_expert_intermediate_size", "num_experts", "num_experts_per_tok",
                                     "norm_topk_prob", "router_aux_loss_coef", "output_router_logits"),
        # the released configs say num_experts; transformers 5's Qwen3MoeConfig writes it as num_local_experts
        "qwen3_moe": _COMMON_USED + ("attention_bias", "use_sliding_window", "sliding_window", "max_window_layers",
                                     "decoder_sparse_step", "mlp_only_layers", "moe_intermediate_size",
                                     "num_experts", "num_local_experts", "num_experts_per_tok", "norm_topk_prob",
                                     "router_aux_loss_coef", "output_router_logits")}

_GEMMA_USED = ("architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_activation", "hidden_act",
               "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings", "rope_theta", "rope_scaling",
               "rope_parameters", "attention_bias", "attention_dropout", "query_pre_attn_scalar", "sliding_window",
               "layer_types", "final_logit_softcapping", "attn_logit_softcapping", "use_bidirectional_attention")
# DeepSeek: transformers' keys, and those of DeepSeek's own code its released files carry (moe_layer_freq,
# scoring_func, topk_method for V3, aux_loss_alpha, seq_aux)
_DEEPSEEK_USED = ("architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size",
                  "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "qk_head_dim",
                  "hidden_act", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings", "attention_dropout",
                  "attention_bias", "rope_theta", "rope_scaling", "rope_parameters", "q_lora_rank", "kv_lora_rank",
                  "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "first_k_dense_replace", "moe_layer_freq",
                  "n_routed_experts", "n_shared_experts", "moe_intermediate_size", "num_experts_per_tok", "n_group",
                  "topk_group", "routed_scaling_factor", "norm_topk_prob", "scoring_func", "topk_method",
                  "aux_loss_alpha", "seq_aux", "output_router_logits")
USED.update(deepseek_v3=_DEEPSEEK_USED + ("rope_interleave", "num_nextn_predict_layers", "quantization_config"),
            deepseek_v2=_DEEPSEEK_USED + ("mlp_bias",))
# transformers 5 writes Gemma 3's period as `_sliding_window_pattern` beside the layer_types it made from it
USED.update(gemma2=_GEMMA_USED, gemma3_text=_GEMMA_USED + ("rope_local_base_freq", "sliding_window_pattern",
                                                          "_sliding_window_pattern"))

# Keys that do not change the architecture being trained, with the reason.
IRRELEVANT = {
    "_name_or_path": "where transformers loaded the file from",
    "transformers_version": "the version of transformers that wrote the file",
    "torch_dtype": "the dtype the weights were saved in; the train section's `precision` sets the training dtype",
    "dtype": "the dtype the weights were saved in (transformers 5's name for torch_dtype); see `precision`",
    "bos_token_id": "a token id of the tokenizer, used when generating text",
    "eos_token_id": "a token id of the tokenizer, used when generating text",
    "pad_token_id": "a token id of the tokenizer, used when batching text for generation",
    "use_cache": "the key/value cache of generation (inference only)",
    "cache_implementation": "how generation caches keys and values (Gemma's hybrid cache: the sliding layers' cut "
                            "at the window); inference only",
    "initializer_range": "the standard deviation of transformers' random initialization; scalec initializes with "
                         "its own scheme (or loads the checkpoint's weights)",
    "pretraining_tp": "Llama's forward splits its matmuls in this many pieces to reproduce the pretraining's "
                      "rounding; the same function (its parallelism is the plan's `tp`)",
    "output_attentions": "returns the attention weights from the forward (inspection only)",
    "output_hidden_states": "returns every layer's output from the forward (inspection only)",
    "return_dict": "the Python type of the forward's outputs",
    "id2label": "labels of a classification head, which a causal LM does not have",
    "label2id": "labels of a classification head, which a causal LM does not have",
    "problem_type": "the loss of a classification head, which a causal LM does not have",
    "chunk_size_feed_forward": "0 for these models: transformers does not chunk their MLP",
    "is_encoder_decoder": "false for these decoder-only models",
    "tokenizer_class": "the tokenizer, not the model",
    "ep_size": "the expert-parallel degree of DeepSeek's own inference code; the plan's `ep` sets ours",
    "auto_map": "the repository's own modeling code, which transformers runs only with trust_remote_code; the "
                "architecture imported is transformers' built-in class `architectures` names",
}
