"""`scalec import config.json`: a Hugging Face config.json of a Llama, Mistral (Mistral 7B's sliding window and
Mistral-Nemo's head_dim included), Qwen 2, Qwen 3 (dense), Phi-3 (its sliding window; its checkpoints' fused
qkv_proj and gate_up_proj are runtime/hf_names.py's business, not the model's), Mixtral, Qwen2-MoE or Qwen3-MoE
causal LM, as the equivalent `.scale` model section.

`import_config(text, path)` is pure: JSON text in, `.scale` text out, or a ScaleError whose diagnostics are located
at the JSON keys (file:line:col, the line, a caret). Every key of the file is either mapped (the output line that
uses it names it in a comment), or listed below as irrelevant to training the architecture, with the reason; any
other key, or a known key whose value the language cannot express, is an error: nothing is silently ignored.

A key the file omits is read as transformers' default for its architecture (`DEFAULTS`, checked against
transformers' own config classes by tests/test_import.py), as transformers itself reads it; the output says so.
"""
from __future__ import annotations

import difflib
import json
import math
import re
import textwrap
from dataclasses import dataclass, field

from compiler.diagnostics import Diagnostic, ScaleError, Span
from compiler.importer_deepseek import DEEPSEEK_TYPES, DeepseekLayout
from compiler.importer_gemma import GEMMA_TYPES, GemmaLayout
from compiler.importer_moe import DISPATCH, DISPATCH_NOTE

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

# values a key must have to be expressible (the key is then used: it appears in a comment)
_LLAMA3_FIELDS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


@dataclass
class _Json:
    """A parsed JSON document with the offsets of every key: path -> (key start, key end, value start, value end)."""

    text: str
    value: object = None
    where: dict = field(default_factory=dict)
    duplicates: list = field(default_factory=list)

    def span(self, path: tuple, value: bool = False) -> Span | None:
        """The key at `path` (with `value`, the key through its value when both are on one line)."""
        if path not in self.where:
            return None
        ks, ke, vs, ve = self.where[path]
        end = ve if value and "\n" not in self.text[ks:ve] else ke
        return Span(self.path, *self._pos(ks), *self._pos(end))

    def start(self) -> Span:
        """The document's first character (its opening brace): where a diagnostic about an absent key points."""
        line, col = self._pos(_WS.match(self.text).end())
        return Span(self.path, line, col, line, col + 1)

    def _pos(self, offset: int) -> tuple[int, int]:
        line = self.text.count("\n", 0, offset) + 1
        return line, offset - (self.text.rfind("\n", 0, offset) + 1) + 1

    path: str = ""


class _BadJson(Exception):
    def __init__(self, offset: int, message: str):
        super().__init__(message)
        self.offset, self.message = offset, message


_WS = re.compile(r"[ \t\n\r]*")


def _parse(text: str, path: str) -> _Json:
    """JSON as `json.loads` reads it, and where each object key (and array element) is: json's hooks give no
    positions, so objects and arrays are walked here and scalars left to json's own scanner."""
    doc = _Json(text=text, path=path)
    decoder = json.JSONDecoder()

    def ws(i: int) -> int:
        return _WS.match(text, i).end()

    def value(i: int, at: tuple):
        if i >= len(text):
            raise _BadJson(i, "the text ends where a value was expected")
        if text[i] == "{":
            obj: dict = {}
            i = ws(i + 1)
            if text.startswith("}", i):
                return obj, i + 1
            while True:
                if not text.startswith('"', i):
                    raise _BadJson(i, "expected a key in double quotes")
                try:
                    key, kend = json.decoder.scanstring(text, i + 1)
                except json.JSONDecodeError as e:
                    raise _BadJson(e.pos, e.msg) from None
                kstart, i = i, ws(kend)
                if not text.startswith(":", i):
                    raise _BadJson(i, "expected `:` after the key")
                vstart = ws(i + 1)
                v, vend = value(vstart, at + (key,))
                if key in obj:
                    doc.duplicates.append((at + (key,), (kstart, kend, vstart, vend)))
                else:
                    doc.where[at + (key,)] = (kstart, kend, vstart, vend)
                obj[key] = v
                i = ws(vend)
                if text.startswith(",", i):
                    i = ws(i + 1)
                    continue
                if text.startswith("}", i):
                    return obj, i + 1
                raise _BadJson(i, "expected `,` or `}`")
        if text[i] == "[":
            arr: list = []
            i = ws(i + 1)
            if text.startswith("]", i):
                return arr, i + 1
            while True:
                vstart = i
                v, i = value(i, at + (len(arr),))
                doc.where[at + (len(arr),)] = (vstart, i, vstart, i)
                arr.append(v)
                i = ws(i)
                if text.startswith(",", i):
                    i = ws(i + 1)
                    continue
                if text.startswith("]", i):
                    return arr, i + 1
                raise _BadJson(i, "expected `,` or `]`")
        try:
            return decoder.raw_decode(text, i)
        except json.JSONDecodeError as e:
            raise _BadJson(e.pos, e.msg) from None

    try:
        doc.value, end = value(ws(0), ())
    except RecursionError:
        raise _BadJson(0, "nested too deeply") from None
    end = ws(end)
    if end != len(text):
        raise _BadJson(end, "extra text after the JSON value")
    return doc


def _fmt(x) -> str:
    """A number as the .scale grammar reads it back exactly (repr of a float round-trips)."""
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, int):
        return str(x)
    return repr(float(x))


class _Importer:
    def __init__(self, doc: _Json, arch: str, model_type: str):
        self.doc, self.cfg, self.arch, self.type = doc, doc.value, arch, model_type
        self.defaults = DEFAULTS[model_type]
        self.diags: list[Diagnostic] = []

    # -- reading keys ---------------------------------------------------------------------------------------------

    def error(self, path: tuple, message: str, label: str = "", help: str = "", code: str = "E0954") -> None:
        span = self.doc.span(path, value=True) or self.doc.span(path[:1], value=True) or self.doc.start()
        self.diags.append(Diagnostic(code, message, span, label=label, help=help))

    def src(self, key: str) -> str:
        """How a comment names a key: itself, or `key (absent: default)`."""
        return key if key in self.cfg else f"{key} (absent: transformers' default)"

    def get(self, key: str):
        return self.cfg[key] if key in self.cfg else self.defaults.get(key)

    def pos_int(self, key: str, path: tuple | None = None, value=None) -> int | None:
        v = self.get(key) if path is None else value
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            self.error(path or (key,), f"`{key}` must be a positive integer, not {json.dumps(v)}",
                       label="not a positive integer")
            return None
        return v

    def number(self, key: str, path: tuple | None = None, value=None, positive: bool = True) -> float | None:
        v = self.get(key) if path is None else value
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or (positive and v <= 0):
            self.error(path or (key,), f"`{key}` must be a {'positive ' if positive else ''}number, not "
                       f"{json.dumps(v)}", label="not a number we can use")
            return None
        return v

    def boolean(self, key: str) -> bool | None:
        v = self.get(key)
        if not isinstance(v, bool):
            self.error((key,), f"`{key}` must be true or false, not {json.dumps(v)}", label="not a boolean")
            return None
        return v

    def must_be(self, key: str, ok, message: str, help: str) -> None:
        """A known key only some values of which the language can express (an absent key: transformers'
        default, which is located at the file's first brace)."""
        v = self.get(key)
        if not ok(v):
            absent = "" if key in self.cfg else f" (`{key}` absent: transformers' default for {self.arch})"
            self.error((key,), message.format(json.dumps(v)) + absent, label="not expressible in .scale",
                       help=help)

    # -- the mapping ----------------------------------------------------------------------------------------------

    fmt = staticmethod(_fmt)

    def unknown_keys(self) -> None:
        """E0953 at each key neither used for this architecture nor irrelevant to training it; E0102 at each key
        written twice."""
        known = set(USED[self.type]) | set(IRRELEVANT)
        for key in self.cfg:
            if key not in known:
                close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
                self.error((key,), f"unknown key `{key}` in a {self.arch} config", code="E0953",
                           label="not known to `scalec import`",
                           help=(f"did you mean `{close[0]}`? " if close else "") +
                           "a key the importer does not know might change the architecture, so it is not ignored; "
                           "remove it if it does not (known keys: compiler/importer.py USED and IRRELEVANT)")
        for path, where in self.doc.duplicates:
            ks, ke, vs, ve = where
            line, col = self.doc._pos(ks)
            self.diags.append(Diagnostic("E0102", f"key `{path[-1]}` is written twice", Span(
                self.doc.path, line, col, *self.doc._pos(ke)), label="written again here",
                help="JSON readers keep the last one silently; keep one"))

    def header(self) -> list[str]:
        """The comment lines above the model section: where it came from, and the keys not mapped."""
        return [f"# {self.arch} from {self.doc.path}, by `scalec import`: each line names the config.json keys it "
                "came from;",
                "# \"(absent: transformers' default)\" marks a key the file omits, read as transformers reads it.",
                *textwrap.wrap("Irrelevant to training the architecture, so not mapped: " +
                               (", ".join(k for k in self.cfg if k in IRRELEVANT) or "none") +
                               " (compiler/importer.py says why).", 114, initial_indent="# ",
                               subsequent_indent="#   ")]

    def run(self) -> str | None:
        self.unknown_keys()
        sizes = {k: self.pos_int(k) for k in ("vocab_size", "hidden_size", "intermediate_size",
                                              "num_hidden_layers", "num_attention_heads",
                                              "max_position_embeddings")}
        kv = self.get("num_key_value_heads")
        kv = sizes["num_attention_heads"] if kv is None else self.pos_int("num_key_value_heads")
        eps = self.number("rms_norm_eps")
        tied = self.boolean("tie_word_embeddings")
        self.must_be("hidden_act", lambda v: v == "silu", "hidden_act {} is not expressible",
                     "the MLPs of .scale are gelu or swiglu (silu-gated, as `silu` here); only `silu` maps")
        self.must_be("attention_dropout", lambda v: v in (0, 0.0) and not isinstance(v, bool),
                     "attention dropout {} is not expressible",
                     "attention in .scale has no dropout; set it to 0.0 to train without it")
        h, n = sizes["hidden_size"], sizes["num_attention_heads"]
        head_dim = None if self.get("head_dim") is None else self.pos_int("head_dim")
        if h and n and h % n and self.get("head_dim") is None:
            self.error(("num_attention_heads",), f"{n} heads do not divide hidden_size {h}",
                       label=f"{h} % {n} == {h % n}", help="each head is hidden_size / num_attention_heads wide "
                       "when head_dim is absent or null; give head_dim")
        if head_dim is not None and head_dim % 2:  # every family imported here turns q and k by rotary embeddings
            self.error(("head_dim",), f"head_dim {head_dim} is odd", label="rotary embeddings turn pairs",
                       help="rotary embeddings turn pairs of each head's dimensions: head_dim must be even")
        if n and kv and n % kv:
            self.error(("num_key_value_heads",), f"{kv} key/value heads do not divide {n} heads",
                       label=f"{n} % {kv} == {n % kv}", help="grouped-query attention shares each key/value head "
                       "among num_attention_heads / num_key_value_heads query heads")
        rope = self.rope()
        attn_bias = mlp_bias = False
        if self.type == "llama":
            attn_bias, mlp_bias = self.boolean("attention_bias"), self.boolean("mlp_bias")
        if self.type in ("qwen3", "qwen3_moe"):
            attn_bias = self.boolean("attention_bias")
        if self.type == "phi3":
            self.phi3()
        window = self.window(sizes["num_hidden_layers"])
        moe = None
        if self.type == "mixtral":
            experts, top_k = self.pos_int("num_local_experts"), self.pos_int("num_experts_per_tok")
            if experts and top_k and top_k > experts:
                self.error(("num_experts_per_tok",), f"{top_k} experts per token out of {experts}",
                           label="more than num_local_experts", help="each token picks distinct experts")
            aux = self.number("router_aux_loss_coef", positive=False)
            if aux is not None and aux < 0:
                self.error(("router_aux_loss_coef",), "router_aux_loss_coef must not be negative",
                           label="negative")
            self.must_be("router_jitter_noise", lambda v: v in (0, 0.0) and not isinstance(v, bool),
                         "router jitter noise {} is not expressible",
                         "the router of .scale's moe adds no noise; set it to 0.0 to train without it")
            self.must_be("output_router_logits", lambda v: isinstance(v, bool),
                         "output_router_logits must be true or false, not {}", "true or false")
            moe = (experts, top_k, aux)
        if self.type in ("qwen2_moe", "qwen3_moe"):
            moe = self.qwen_moe()
        if self.diags or None in sizes.values() or None in (kv, eps, tied, attn_bias, mlp_bias) or rope is None \
                or (moe is not None and None in moe):
            return None
        return self.emit(sizes, kv, eps, tied, rope, attn_bias, mlp_bias, moe, head_dim, window)

    def phi3(self) -> None:
        """Phi-3's keys beyond Llama's: checked, as none changes the model when it has the one value .scale can
        write. Its residual dropout (`resid_pdrop`, on each block's attention and MLP output) and embedding dropout
        (`embd_pdrop`) must be 0 as attention_dropout must; a partial rotary factor (Phi-3.5-MoE, Phi-4-mini: only
        the first part of each head turned) is not expressible; `attention_bias` true claims biases transformers'
        Phi-3 never builds; `original_max_position_embeddings` is read by longrope scaling only."""
        for key, where in (("resid_pdrop", "the residual dropout of each block's attention and MLP output"),
                           ("embd_pdrop", "the dropout of the embeddings")):
            self.must_be(key, lambda v: v in (0, 0.0) and not isinstance(v, bool), f"{where} ({key} {{}}) is not "
                         "expressible", f".scale has no dropout; set {key} to 0.0 to train without it")
        self.must_be("partial_rotary_factor", lambda v: v is None or (v in (1, 1.0) and not isinstance(v, bool)),
                     "partial_rotary_factor {} (rotary embeddings on part of each head) is not expressible",
                     "rotary embeddings in .scale turn every dimension of each head: only 1.0 maps (Phi-3; "
                     "Phi-3.5 and Phi-4-mini turn a part)")
        self.must_be("attention_bias", lambda v: v in (None, False),
                     "attention_bias {} is not Phi-3's: transformers' Phi-3 attention has no biases",
                     "Phi3ForCausalLM builds qkv_proj and o_proj without biases whatever the file says: set it "
                     "to false (a checkpoint with biases is of another architecture)")
        self.pos_int("original_max_position_embeddings")

    def window(self, layers: int | None) -> int | None:
        """The sliding window of every layer's attention (transformers' sliding_window: a key is kept when
        q_idx - kv_idx < window), or None for attention over the whole sequence. Mistral, Mixtral and Phi-3 window
        every layer by `sliding_window` (null: none; Phi-3-mini-4k's 2047 is written as it is: transformers' mask,
        and its flash-attention window of sliding_window - 1 tokens before each query, keep 2047 keys). Qwen 2 and 3 window the layers transformers marks
        "sliding_attention": with use_sliding_window, those from max_window_layers on (or as `layer_types` lists
        them); a stack of both kinds is refused, since a `repeat` holds identical blocks."""
        if self.type in ("mistral", "mixtral", "phi3"):  # Phi-3: its every layer, create_sliding_window_causal_mask
            return None if self.get("sliding_window") is None else self.pos_int("sliding_window")
        if self.type in ("qwen2_moe", "qwen3_moe"):  # windows on alternate layers: none is expressible
            self.must_be("use_sliding_window", lambda v: v is False, "use_sliding_window = {} is not expressible",
                         "Qwen-MoE windows alternate layers, which one `repeat` of identical blocks cannot write: "
                         "set it to false")
            types = self.cfg.get("layer_types")
            if types is not None:
                if not isinstance(types, list):
                    self.error(("layer_types",), "`layer_types` must be a list", label="not a list")
                else:
                    for i, t in enumerate(types):
                        if t != "full_attention":
                            self.error(("layer_types", i), f"layer {i} is {json.dumps(t)}, not expressible",
                                       label="not expressible in .scale",
                                       help="Qwen-MoE's attention maps when it is over the whole sequence "
                                            "(\"full_attention\")")
                    if layers and len(types) != layers:
                        self.error(("layer_types",), f"`layer_types` names {len(types)} layers, not "
                                   f"num_hidden_layers = {layers}", label="wrong length")
            return None
        if self.type not in ("qwen2", "qwen3"):
            return None  # Llama has no sliding window
        use = self.boolean("use_sliding_window")
        if use is None:
            return None
        types = self.cfg.get("layer_types")
        if types is not None:
            if not isinstance(types, list):
                self.error(("layer_types",), "`layer_types` must be a list", label="not a list")
                return None
            for i, t in enumerate(types):
                if t not in ("full_attention", "sliding_attention"):
                    self.error(("layer_types", i), f"layer {i} is {json.dumps(t)}, not expressible",
                               label="not expressible in .scale",
                               help="attention in .scale is causal over the whole sequence (\"full_attention\") "
                                    "or within a window (\"sliding_attention\")")
                    return None
            if layers and len(types) != layers:
                self.error(("layer_types",), f"`layer_types` names {len(types)} layers, not "
                           f"num_hidden_layers = {layers}", label="wrong length")
                return None
        elif use and layers:
            first = self.get("max_window_layers")
            if isinstance(first, bool) or not isinstance(first, int) or first < 0:
                self.error(("max_window_layers",), f"`max_window_layers` must be an integer ≥ 0, not "
                           f"{json.dumps(first)}", label="not a layer count")
                return None
            types = ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
        else:
            types = []
        kinds = set(types)
        if "sliding_attention" not in kinds:
            return None
        if not use:  # transformers sets sliding_window to null without use_sliding_window: no window to apply
            self.error(("layer_types",), "`layer_types` lists sliding_attention layers, but use_sliding_window is "
                       "false", label="no window", help="transformers gives these layers no window without "
                       "use_sliding_window; set it true, or list them as full_attention")
            return None
        if kinds != {"sliding_attention"}:
            where = ("layer_types",) if "layer_types" in self.cfg else ("max_window_layers",)
            n = types.count("sliding_attention")
            self.error(where, f"{n} of {len(types)} layers use sliding-window attention and the others full "
                       "attention: per-layer attention kinds are not expressible", label="not expressible in .scale",
                       help="a `repeat` holds identical blocks, so every layer's attention has the same window; "
                            "set max_window_layers to 0 (every layer windowed) or use_sliding_window to false")
            return None
        return self.pos_int("sliding_window")

    def experts_key(self) -> str:
        """The key naming a Qwen-MoE's expert count: `num_experts` (Qwen2-MoE, and the released Qwen3-MoE configs),
        or `num_local_experts` where a Qwen3-MoE file has only that (transformers 5's Qwen3MoeConfig writes it)."""
        if self.type == "qwen3_moe" and "num_local_experts" in self.cfg and "num_experts" not in self.cfg:
            return "num_local_experts"
        return "num_experts"

    def qwen_moe(self):
        """Qwen2-MoE's or Qwen3-MoE's mixture: (experts, top_k, aux_loss, expert width, shared expert width (0:
        none, Qwen3-MoE), norm_topk_prob, qkv_bias (false for Qwen3-MoE, whose biases are attention_bias)), None
        entries after an error. Every decoder layer must be sparse: the language's one `repeat` cannot write the
        dense layers `decoder_sparse_step` > 1 or `mlp_only_layers` would interleave."""
        key = self.experts_key()
        experts, top_k = self.pos_int(key), self.pos_int("num_experts_per_tok")
        if self.type == "qwen3_moe" and "num_experts" in self.cfg and "num_local_experts" in self.cfg \
                and self.cfg["num_experts"] != self.cfg["num_local_experts"]:
            self.error(("num_local_experts",), f"num_local_experts {json.dumps(self.cfg['num_local_experts'])} "
                       f"differs from num_experts {json.dumps(self.cfg['num_experts'])}", label="two different values",
                       help="both name the expert count (num_local_experts is transformers 5's name): keep one")
        if experts and top_k and top_k > experts:
            self.error(("num_experts_per_tok",), f"{top_k} experts per token out of {experts}",
                       label=f"more than {key}", help="each token picks distinct experts")
        ffn = self.pos_int("moe_intermediate_size")
        shared = self.pos_int("shared_expert_intermediate_size") if self.type == "qwen2_moe" else 0
        aux = self.number("router_aux_loss_coef", positive=False)
        if aux is not None and aux < 0:
            self.error(("router_aux_loss_coef",), "router_aux_loss_coef must not be negative", label="negative")
        self.must_be("decoder_sparse_step", lambda v: v == 1 and not isinstance(v, bool),
                     "decoder_sparse_step {} makes only every so many layers sparse, which is not expressible",
                     "every block of .scale's one `repeat` is the same: a mixture in every layer "
                     "(decoder_sparse_step 1) maps; dense MLP layers between sparse ones do not")
        self.must_be("mlp_only_layers", lambda v: v == [],
                     "mlp_only_layers {} gives some layers a dense MLP, which is not expressible",
                     "every block of .scale's one `repeat` is the same: only an empty list maps (a mixture in "
                     "every layer)")
        self.must_be("output_router_logits", lambda v: isinstance(v, bool),
                     "output_router_logits must be true or false, not {}", "true or false")
        norm = self.boolean("norm_topk_prob")
        qkv = self.boolean("qkv_bias") if self.type == "qwen2_moe" else False
        return experts, top_k, aux, ffn, shared, norm, qkv

    def theta_in(self, d: dict, where: str, theta, theta_src):
        """(rotary base, where it was read): `where`'s own rope_theta (transformers 5 writes it in
        rope_parameters), which must agree with a top-level one, else the top-level `theta`; None after an error."""
        if "rope_theta" not in d:
            return None if self.number("rope_theta") is None else (theta, theta_src)
        if "rope_theta" in self.cfg and self.cfg["rope_theta"] != d["rope_theta"]:
            self.error(("rope_theta",), f"rope_theta {json.dumps(self.cfg['rope_theta'])} differs from "
                       f"{where}.rope_theta {json.dumps(d['rope_theta'])}", label="two different values",
                       help="keep one")
            return None
        if self.number("rope_theta", (where, "rope_theta"), d["rope_theta"]) is None:
            return None
        return d["rope_theta"], f"{where}.rope_theta"

    def rope(self):
        """(theta, llama3 tuple or None, theta's source, scaling's source) from rope_theta / rope_scaling
        (transformers 4) or rope_parameters (transformers 5); None after an error."""
        params = self.cfg.get("rope_parameters")
        scaling = self.cfg.get("rope_scaling")
        if params is not None and scaling is not None:
            self.error(("rope_scaling",), "both rope_scaling and rope_parameters are given",
                       label="written twice", help="transformers 5 reads rope_parameters; keep one")
            return None
        d, where = (params, "rope_parameters") if params is not None else (scaling, "rope_scaling")
        theta, theta_src = self.get("rope_theta"), self.src("rope_theta")
        if d is None:
            ok = self.number("rope_theta")
            return (theta, None, theta_src, None) if ok else None
        if not isinstance(d, dict):
            self.error((where,), f"`{where}` must be an object or null", label="not an object")
            return None
        kind_key = "rope_type" if "rope_type" in d else "type"
        kind = d.get(kind_key, "default")
        if kind not in ("default", "llama3"):  # its own keys are not ours to list: the type itself is the blocker
            phi = kind in ("longrope", "su", "yarn") and self.type == "phi3"  # transformers reads su, yarn as longrope
            self.error((where, kind_key), f"rope type {json.dumps(kind)} is not expressible" +
                       (" (Phi-3's LongRoPE: rotary frequencies rescaled by long_factor and short_factor, as "
                        "Phi-3-mini-128k has)" if phi else ""),
                       label="not expressible in .scale",
                       help="rotary embeddings in .scale are unscaled (default) or Llama 3's llama3(...)" +
                       ("; the 4k-context Phi-3 models have rope_scaling null" if phi else ""))
            return None
        known = {"rope_type", "type", "rope_theta", *_LLAMA3_FIELDS}
        if self.type == "phi3":  # transformers 5's Phi3Config writes it into rope_parameters
            known.add("partial_rotary_factor")
            rotary = d.get("partial_rotary_factor", 1.0)
            if not (rotary in (1, 1.0) and not isinstance(rotary, bool)):
                self.error((where, "partial_rotary_factor"), f"partial_rotary_factor {json.dumps(rotary)} (rotary "
                           "embeddings on part of each head) is not expressible", label="not expressible in .scale",
                           help="rotary embeddings in .scale turn every dimension of each head: only 1.0 maps")
        for k in d:
            if k not in known:
                self.error((where, k), f"unknown key `{k}` in `{where}`", code="E0953",
                           label="not known to `scalec import`",
                           help="rope types that map: default, and llama3 with " + ", ".join(_LLAMA3_FIELDS))
        read = self.theta_in(d, where, theta, theta_src)
        if read is None:
            return None
        theta, theta_src = read
        if kind == "default":
            extra = [k for k in _LLAMA3_FIELDS if k in d]
            if extra:
                self.error((where, extra[0]), f"`{extra[0]}` is given for rope_type default",
                           label="not read by the default rope type", help="remove it, or set rope_type llama3")
            return None if self.diags else (theta, None, theta_src, None)
        missing = [k for k in _LLAMA3_FIELDS if k not in d]
        if missing:
            self.error((where, kind_key), "rope type llama3 without " + ", ".join(f"`{k}`" for k in missing),
                       label="incomplete", help="llama3 scaling needs " + ", ".join(_LLAMA3_FIELDS))
            return None
        vals = [self.number(k, (where, k), d[k]) for k in _LLAMA3_FIELDS[:3]]
        orig = self.pos_int("original_max_position_embeddings", (where, _LLAMA3_FIELDS[3]), d[_LLAMA3_FIELDS[3]])
        if None in vals or orig is None:
            return None
        return theta, (*vals, orig), theta_src, where

    # -- the text -------------------------------------------------------------------------------------------------

    def emit(self, sizes, kv, eps, tied, rope, attn_bias, mlp_bias, moe, head_dim=None, window=None) -> str:
        s = self.src
        h, n = sizes["hidden_size"], sizes["num_attention_heads"]
        # a head dimension of its own is written only where it is not hidden / heads (Mistral-Nemo, Qwen3-0.6B)
        own = head_dim is not None and (h % n or head_dim != h // n)
        rows: list[tuple[str, str]] = []  # (code, comment)
        qmoe = self.type in ("qwen2_moe", "qwen3_moe")  # experts of their own width (Qwen2-MoE's: a shared one)
        phi = self.type == "phi3"  # Phi-3: Llama's block, the checkpoint's q/k/v and gate/up fused
        rows += [(f"vocab    = {sizes['vocab_size']}", s("vocab_size")),
                 (f"hidden   = {sizes['hidden_size']}", s("hidden_size")),
                 (f"ffn      = {moe[3] if qmoe else sizes['intermediate_size']}",
                  s("moe_intermediate_size" if qmoe else "intermediate_size") + (" (each expert's)" if moe else ""))]
        if self.type == "qwen2_moe":
            rows += [(f"shared   = {moe[4]}", s("shared_expert_intermediate_size") + " (the shared expert's)")]
        rows += [
                 (f"heads    = {sizes['num_attention_heads']}",
                  s("num_attention_heads") + ("" if own else
                                              f"; head_dim = hidden / heads = {h // n}"
                                              + (" (head_dim)" if "head_dim" in self.cfg else ""))),
                 *([(f"head_dim = {head_dim}", s("head_dim") + f"; not hidden / heads = {h} / {n}")]
                   if own else []),
                 (f"kv_heads = {kv}", s("num_key_value_heads") if self.cfg.get("num_key_value_heads") is not None
                  else "num_key_value_heads absent or null: = num_attention_heads"),
                 (f"layers   = {sizes['num_hidden_layers']}", s("num_hidden_layers")),
                 (f"seq      = {sizes['max_position_embeddings']}",
                  s("max_position_embeddings") + " (train's seq_len may be shorter)" +
                  (f"; {s('original_max_position_embeddings')}: read by longrope scaling only, which this model "
                   "has not" if phi else ""))]
        if window is not None:
            rows += [(f"window   = {window}", s("sliding_window") + ": each query sees itself and the window - 1 "
                      "tokens before it")]
        if moe:
            rows += [(f"experts  = {moe[0]}", s(self.experts_key() if qmoe else "num_local_experts"))]
        rows += [("", "")]
        rows += [("embedding(vocab, hidden)", "model.embed_tokens" + (f"; {s('embd_pdrop')} 0: no dropout" if phi
                                                                       else ""))]
        rows += [("repeat layers {", "model.layers: num_hidden_layers decoder layers")]
        resid = (f"{s('resid_pdrop')} 0: no dropout on the residual branch" if phi else "")
        rows += [("  residual {", resid)]
        rows += [(f"    rmsnorm(hidden, eps = {_fmt(eps)})", "input_layernorm: " + s("rms_norm_eps"))]
        theta, llama3, theta_src, scaling_src = rope
        bias_src = {"llama": s("attention_bias") + " (q, k, v, o)",
                    "qwen3": s("attention_bias") + " (q, k, v, o)",
                    "qwen3_moe": s("attention_bias") + " (q, k, v, o)",
                    "qwen2": "Qwen 2: biases on q, k, v, none on o",
                    "mistral": "Mistral: no biases", "mixtral": "Mixtral: no biases",
                    "phi3": "Phi-3: no biases" + ("; attention_bias false" if "attention_bias" in self.cfg else ""),
                    "qwen2_moe": s("qkv_bias") + (": biases on q, k, v, none on o" if qmoe and moe[6] else
                                                  ": no biases")}[self.type]
        bias = ("bias = false, qkv_bias = true" if self.type == "qwen2" or (qmoe and moe[6])
                else f"bias = {_fmt(attn_bias)}")
        attn = [("    attention(hidden, heads, kv_heads = kv_heads,",
                 "self_attn" + (" (the checkpoint's qkv_proj: q rows, then k, then v)" if phi else "") +
                 ": causal, grouped-query"),
                (f"              {bias},", bias_src)]
        if own:
            attn += [("              head_dim = head_dim,", "q, k, v: heads · head_dim wide; o back to hidden")]
        if window is not None:
            attn += [("              window = window,", "sliding-window attention, transformers' mask: "
                      "0 <= q_idx - kv_idx < window")]
        if self.type in ("qwen3", "qwen3_moe"):
            attn += [(f"              qk_norm = rmsnorm, qk_norm_eps = {_fmt(eps)},",
                      "self_attn.q_norm, k_norm: RMSNorm over each head's head_dim; " + s("rms_norm_eps"))]
        attn += [(f"              rope_theta = {_fmt(theta)}" + ("," if llama3 else ")"),
                  theta_src + "; rotary, Hugging Face's rotate-half layout" + self.rotary_src())]
        rope_row = len(attn) - 1
        if llama3:
            f, lo, hi, orig = llama3
            pad = " " * len("              rope_scaling = llama3(")
            attn += [(f"              rope_scaling = llama3(factor = {_fmt(f)},",
                      f"{scaling_src}.factor; rope_type llama3"),
                     (f"{pad}low_freq_factor = {_fmt(lo)},", f"{scaling_src}.low_freq_factor"),
                     (f"{pad}high_freq_factor = {_fmt(hi)},", f"{scaling_src}.high_freq_factor"),
                     (f"{pad}original_seq = {orig}))", f"{scaling_src}.original_max_position_embeddings")]
        attn[0] = (attn[0][0], "; ".join(x for x in (attn[0][1] + (" within the window" if window is not None
                                                                       else " over the whole sequence"),
                                                          self.window_src(window), self.dropout_src()) if x))
        if "rope_scaling" in self.cfg and self.cfg["rope_scaling"] is None:
            attn[rope_row] = (attn[rope_row][0], attn[rope_row][1] + "; rope_scaling null")
        rows += attn
        rows += [("  }", "")]
        rows += [("  residual {", resid)]
        rows += [(f"    rmsnorm(hidden, eps = {_fmt(eps)})", "post_attention_layernorm: " + s("rms_norm_eps"))]
        if qmoe:  # Qwen-MoE: Qwen2-MoE's has a sigmoid-gated shared expert, Qwen3-MoE's none
            experts, top_k, aux, _, _, norm, _ = moe
            shared = self.type == "qwen2_moe"
            rows += [(f"    moe(hidden, ffn, experts, top_k = {top_k}, capacity_factor = none, act = swiglu,",
                      f"mlp: {s('num_experts_per_tok')}; dropless, as transformers routes; "
                      f"{s('hidden_act')} gating = swiglu; {s('decoder_sparse_step')} 1 and "
                      f"{s('mlp_only_layers')} empty: a mixture in every layer" + ("" if shared else
                                                                                   ", no shared expert")),
                     DISPATCH_ROW,
                     (f"        renormalize = {_fmt(norm)}, aux_loss = {_fmt(aux)}" + ("," if shared else ")"),
                      f"mlp.gate: {s('norm_topk_prob')}; {s('router_aux_loss_coef')} (see the note above the "
                      "model)")]
            if shared:
                rows += [("        shared_ffn = shared, shared_gate = sigmoid)",
                          "mlp.shared_expert (silu-gated) and mlp.shared_expert_gate: sigmoid(x · w) per token")]
        elif moe:
            experts, top_k, aux = moe
            rows += [(f"    moe(hidden, ffn, experts, top_k = {top_k}, capacity_factor = none, act = swiglu,",
                      f"block_sparse_moe: {s('num_experts_per_tok')}; dropless, as transformers routes; "
                      f"{s('hidden_act')} gating = swiglu"),
                     DISPATCH_ROW,
                     (f"        aux_loss = {_fmt(aux)})",
                      f"{s('router_aux_loss_coef')} (see the note above the model); "
                      f"{s('router_jitter_noise')} = 0")]
        else:
            mb = _fmt(mlp_bias) if self.type == "llama" else "false"
            rows += [(f"    mlp(hidden, ffn, act = swiglu, bias = {mb})",
                      f"mlp: {s('hidden_act')} gating = swiglu" +
                      (f"; {s('mlp_bias')}" if self.type == "llama" else "; no biases") +
                      ("; the checkpoint's gate_up_proj: gate rows, then up rows" if phi else ""))]
        rows += [("  }", ""), ("}", "")]
        rows += [(f"rmsnorm(hidden, eps = {_fmt(eps)})", "model.norm: " + s("rms_norm_eps"))]
        rows += [(f"lm_head(vocab, hidden, tied = {_fmt(tied)})", "lm_head: " + s("tie_word_embeddings"))]
        rows += [("cross_entropy", "the causal LM's loss: next-token cross entropy")]
        width = max(len(c) for c, _ in rows) + 2
        body = [("  " + (c.ljust(width) + f"# {m}" if m else c)).rstrip() for c, m in rows]
        head = self.header()
        if qmoe:
            family = "Qwen2-MoE" if self.type == "qwen2_moe" else "Qwen3-MoE"
            head += textwrap.wrap(f"{self.src('intermediate_size')} is the width of {family}'s dense MLP layers, "
                                  "of which this model has none.", 114, initial_indent="# ", subsequent_indent="# ")
        if self.type in ("mixtral", "qwen2_moe", "qwen3_moe"):
            note = ("The router: softmax over the experts, top-k, gates renormalised over the k choices, as in "
                    "transformers. " if not qmoe else "The router: softmax over the experts, top-k, the gates "
                    "renormalised over the k choices or not (renormalize), as in transformers. ") + (
                    "The load-balancing loss differs: transformers adds router_aux_loss_coef × one "
                    "loss only when output_router_logits is true (here "
                    f"{json.dumps(self.get('output_router_logits'))}), pooling every layer's and sequence's tokens, "
                    "its expert fractions summing to k; .scale adds aux_loss × each moe layer's own loss, per "
                    "sequence, fractions summing to 1, summed over the layers.")
            head += textwrap.wrap(note, 114, initial_indent="# ", subsequent_indent="# ")
        named = " and ".join(k for k in ("architectures", "model_type") if k in self.cfg)
        return "\n".join(head + [f"model {self.type} {{  # {named}"] + body + ["}"]) + "\n"

    def window_src(self, window=None) -> str:
        """The keys that say attention is over the whole sequence, or within the window."""
        if self.type in ("mistral", "mixtral", "phi3"):
            return f"{self.src('sliding_window')} null" if window is None else ""
        if self.type in ("qwen2", "qwen3") and window is not None:
            if "layer_types" in self.cfg:  # transformers reads the list, not max_window_layers
                return "; ".join([f"{self.src('use_sliding_window')} true", "layer_types all sliding_attention"] +
                                 (["max_window_layers unused"] if "max_window_layers" in self.cfg else []))
            return f"{self.src('use_sliding_window')} true; {self.src('max_window_layers')} 0: every layer windowed"
        if self.type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
            unused = [k for k in ("sliding_window", "max_window_layers") if k in self.cfg]
            return "; ".join([f"{self.src('use_sliding_window')} false"] +
                             ([", ".join(unused) + " unused"] if unused else []) +
                             (["layer_types all full_attention"] if "layer_types" in self.cfg else []))
        return ""

    def rotary_src(self) -> str:
        """Phi-3's partial_rotary_factor, where the file gives it (1: every dimension of each head turned)."""
        given = [k for k, d in (("partial_rotary_factor", self.cfg),
                                ("rope_parameters.partial_rotary_factor", self.cfg.get("rope_parameters")))
                 if isinstance(d, dict) and k.split(".")[-1] in d]
        return "".join(f"; {k} 1.0: every dimension" for k in given) if self.type == "phi3" else ""

    def dropout_src(self) -> str:
        return (f"attention_dropout = {json.dumps(self.cfg['attention_dropout'])}" if "attention_dropout" in self.cfg
                else "attention_dropout (absent: 0.0)")


def _not_yet(arch: str, at: Span) -> Diagnostic:
    """The refusal of an architecture the language cannot write yet, naming what it lacks."""
    return Diagnostic("E0952", f"{arch} is not importable yet: the language cannot write {NOT_YET[arch][1]}", at,
                      label="not importable yet",
                      help=f"`scalec import` writes {', '.join(ARCHITECTURES)}; for this model, write the model "
                           "section by hand without what .scale lacks (it will not train equal to the checkpoint), "
                           "or wait for those layers")


def _architecture(doc: _Json) -> tuple[str, str] | Diagnostic:
    cfg = doc.value
    names = ", ".join(ARCHITECTURES)
    archs = cfg.get("architectures")
    mtype = cfg.get("model_type")
    if archs is not None:
        if isinstance(archs, list) and len(archs) == 1 and archs[0] in NOT_YET:
            return _not_yet(archs[0], doc.span(("architectures",), value=True))
        if not (isinstance(archs, list) and len(archs) == 1 and archs[0] in ARCHITECTURES):
            return Diagnostic("E0952", f"architecture {json.dumps(archs)} is not importable",
                              doc.span(("architectures",), value=True), label="not importable",
                              help=f"`scalec import` writes {names}, one architecture a config")
        arch = archs[0]
        if mtype is not None and mtype != ARCHITECTURES[arch]:
            return Diagnostic("E0952", f"model_type {json.dumps(mtype)} does not match {arch}",
                              doc.span(("model_type",), value=True), label=f"{arch} is `{ARCHITECTURES[arch]}`",
                              help="a config of one architecture says `model_type` of that architecture")
        return arch, ARCHITECTURES[arch]
    by_type = {v: k for k, v in ARCHITECTURES.items()}
    if mtype in by_type:
        return by_type[mtype], mtype
    later = {t: a for a, (t, _) in NOT_YET.items()}
    if mtype in later:
        return _not_yet(later[mtype], doc.span(("model_type",), value=True))
    return Diagnostic("E0952", "the config names no importable architecture" if mtype is None else
                      f"model_type {json.dumps(mtype)} is not importable",
                      doc.span(("model_type",), value=True) or Span(doc.path, 1, 1, 1, 2),
                      label="not importable",
                      help=f"`scalec import` knows {names} (by `architectures`, else `model_type`: "
                           + ", ".join(ARCHITECTURES.values()) + ")")


class _GemmaImporter(GemmaLayout, _Importer):
    """Gemma 2 and Gemma 3 (text): their own model section (compiler/importer_gemma.py), this reading of keys."""


class _DeepseekImporter(DeepseekLayout, _Importer):
    """DeepSeek-V2 and V3: their own model section (compiler/importer_deepseek.py), this reading of keys."""


def import_config(text: str, path: str) -> str:
    """The `.scale` model section equivalent to the config.json `text` (read from `path`, which diagnostics
    name); raises ScaleError with every problem found, each located at its JSON key."""
    try:
        doc = _parse(text, path)
    except _BadJson as e:
        probe = _Json(text=text, path=path)
        line, col = probe._pos(min(e.offset, len(text)))
        raise ScaleError([Diagnostic("E0951", f"not valid JSON: {e.message}", Span(path, line, col, line, col + 1),
                                     label="the reader stopped here",
                                     help="a Hugging Face config.json is one JSON object")], {path: text}) from None
    if not isinstance(doc.value, dict):
        raise ScaleError([Diagnostic("E0951", "the top level is not a JSON object", Span(path, 1, 1, 1, 2),
                                     help="a Hugging Face config.json is one JSON object of settings")],
                         {path: text})
    found = _architecture(doc)
    if isinstance(found, Diagnostic):
        raise ScaleError([found], {path: text})
    imp = (_GemmaImporter if found[1] in GEMMA_TYPES else _DeepseekImporter if found[1] in DEEPSEEK_TYPES
           else _Importer)(doc, *found)
    out = imp.run()
    if out is None:
        raise ScaleError(sorted(imp.diags, key=lambda d: (d.span.line, d.span.col) if d.span else (0, 0)),
                         {path: text})
    return out


# Every imported mixture is dropless (transformers routes every choice): sorted by expert, not padded to a slot per
# token (issue 37: padded, each expert computes every token's slot, and `search` avoids ep for it).
DISPATCH_ROW = (f"        {DISPATCH},", DISPATCH_NOTE)

PLACEHOLDER = """
# Placeholder cluster and training settings, to replace with yours (`scalec search` finds a plan for a cluster).
mesh {
  axis dp = 1
  devices_per_node = 1
}

train {
  global_batch = 8
  seq_len      = seq
  steps        = 100
  optimizer    = adamw(lr = 3e-4, betas = (0.9, 0.95), weight_decay = 0.1)
}
"""


def complete(model_section: str) -> str:
    """A whole .scale file: the imported model section and placeholder mesh and train sections."""
    return model_section + PLACEHOLDER
