"""`scalec export FILE CHECKPOINT -o DIR`: a checkpoint of FILE's model as a Hugging Face checkpoint.

The checkpoint (runtime/checkpoint.py) holds the single-device model's tensors whatever plan wrote it; they are
read whole on this one process (torch.distributed.checkpoint's `dcp_to_torch_save`, no process group), renamed to
Hugging Face's layout (runtime/hf.py: Mixtral's stacked experts split per expert and transposed back), and written
with `safetensors` in files of at most `shard_bytes` (with `model.safetensors.index.json` when there are several),
beside a `config.json` of the architecture FILE's model is: LlamaForCausalLM (MistralForCausalLM with a sliding
window; Phi3ForCausalLM where the model came from a Phi-3 config, its q, k, v rows concatenated into `qkv_proj` and
its gate and up rows into `gate_up_proj`), Qwen2ForCausalLM (biases on q, k, v only), Qwen3ForCausalLM
(`qk_norm = rmsnorm`: its q_norm and k_norm), MixtralForCausalLM (a `moe` in each block) or Qwen2MoeForCausalLM (a
`moe` with a sigmoid-gated shared expert in each block) or Qwen3MoeForCausalLM (q/k norms and a `moe` without a
shared expert in each block: the Qwen-MoE expert layout); a head_dim other than hidden /
heads is written as `head_dim` (Mistral-Nemo, Qwen 3). What `init = from(DIR)` then reads back is bit for bit
the checkpoint's (tests/test_export.py), and transformers loads it (the same test; a checkpoint written under ep 2
and pp 2 × ep 2, every expert of every stage: tests/e2e/test_hf_init.py).

The config round-trips `scalec import`: `max_position_embeddings` is the model's `seq` size (what the importer
wrote from it), not the train section's seq_len. When the model came from a Hugging Face checkpoint (the train
section's `init = from(DIR)`, or `--config`), config.json is that checkpoint's with the keys the importer reads
rewritten from the model (equal values keep the file's spelling), the others (token ids, initializer_range, ...)
kept, and its generation_config.json and tokenizer files are copied beside the weights. Whatever is written must
import back to the model exported (`_reads_back`).

A model these families cannot express (learned positions, LayerNorm, GELU, biases on every projection, several
`repeat`s, blocks of another shape) is refused with the reason, before anything is read.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile

from compiler import spec as S
from compiler.hf_header import stack as hf_stack
from compiler.diagnostics import Diagnostic, ScaleError

SHARD_BYTES = 5 * 10**9  # what transformers' save_pretrained writes per file by default


class ExportError(Exception):
    """Why a model or checkpoint cannot be exported (one line)."""


# What a Hugging Face checkpoint directory holds beside its weights and config.json, copied from the one the model
# came from: the generation defaults (token ids, sampling) and the tokenizer, which the weights need to be used.
COMPANIONS = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json")

# The family of each architecture (importer's model_type) and its class.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "phi3": "Phi3ForCausalLM", "mixtral": "MixtralForCausalLM",
                 "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                 "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}


def source_config(spec: S.Spec, explicit: str | None = None) -> tuple[str | None, dict | None]:
    """The Hugging Face checkpoint the model came from: (its directory, its config.json), or (None, None).

    `explicit` (`scalec export --config`) names a config.json or the directory holding one; otherwise the train
    section's `init = from(DIR or FILE.safetensors)` does, relative to the .scale file's directory as the program
    reads it, when a config.json lies there (a run from `init = normal` has no source)."""
    if explicit:
        path = os.path.join(explicit, "config.json") if os.path.isdir(explicit) else explicit
        if not os.path.isfile(path):
            raise ExportError(f"--config {explicit}: no such config.json")
    elif spec.train.init_from:
        where = os.path.join(os.path.dirname(spec.path), spec.train.init_from)
        path = os.path.join(where if os.path.isdir(where) else os.path.dirname(where), "config.json")
        if not os.path.isfile(path):
            return None, None
    else:
        return None, None
    try:
        with open(path, encoding="utf-8-sig") as f:
            config = json.load(f)
    except (OSError, ValueError) as err:
        raise ExportError(f"cannot read {path}: {err}") from None
    if not isinstance(config, dict):
        raise ExportError(f"{path} is not a JSON object")
    return os.path.dirname(path), config


def _family(shape: str, original: dict | None, window: int | None = None) -> str:
    """The importer's model_type for a model of `shape` (llama, qwen2 or mixtral by its layers): Phi-3 where the model
    came from a Phi-3 config (Llama's function, the checkpoint's q/k/v and gate/up fused: a layout chosen by the
    source, never guessed), Mistral where it came from a Mistral config (the same function as Llama without biases:
    sliding_window null), or where its attention has a sliding window (Llama has none; Mistral's `sliding_window`)."""
    source = original.get("model_type") if original is not None else None
    if shape == "llama" and source == "phi3":
        return "phi3"
    if shape == "llama" and (source == "mistral" or window is not None):
        return "mistral"
    return shape


def hf_config(spec: S.Spec, original: dict | None = None) -> dict:
    """config.json of `spec`'s model, or ExportError naming what has no Hugging Face counterpart here.

    With `original` (the config.json the model was imported from, `source_config`), the result is that file with
    the keys the importer reads rewritten from the model: what the model kept reads back the same (in the file's own
    form: `rope_parameters` or `rope_theta`/`rope_scaling`, 10000 or 10000.0), what it changed is the model's, and
    what the importer does not read (token ids, `initializer_range`, `transformers_version`, ...) is kept. Keys of
    another family (a Qwen 2 config of a model that lost its q, k, v biases) are dropped. `torch_dtype` is set by
    `export` from the tensors written."""
    from compiler.importer import IRRELEVANT, USED
    from compiler.export_gemma import GemmaExportError, gemma_config, is_gemma
    if is_gemma(spec):  # zero-centred norms: Gemma 2's or Gemma 3's layout, or refused
        try:
            config = gemma_config(spec)
        except GemmaExportError as err:
            raise ExportError(str(err)) from None
        if original is not None and original.get("model_type") == config["model_type"] and \
                _gemma_reads_back(spec, original):
            return dict(original)  # the model is the file's: every key as the file writes it
        kept = {k: x for k, x in (original or {}).items() if k in IRRELEVANT}
        config = {**kept, **config}
        if not _gemma_reads_back(spec, config):
            raise ExportError("the config.json written imports back to another model; a bug in scalec export, "
                              "please report it")
        return config
    if any(isinstance(x, S.MLA) for x in S.walk(spec.model.layers)):  # DeepSeek-V2/V3 (importer_deepseek.py)
        from compiler.importer_deepseek import DEEPSEEK_TYPES
        if original is not None and original.get("model_type") in DEEPSEEK_TYPES and \
                _gemma_reads_back(spec, original):
            return dict(original)  # the model is the file's: every key as the file writes it
        raise ExportError("a model with `mla` is exported as DeepSeek-V2 or V3 from the config.json of the checkpoint "
                          "it started from (`init = from(...)`, or --config-from), which must import to this "
                          "model: writing DeepSeek's config from the model alone is not done yet")
    deepseek = [x for x in S.walk(spec.model.layers) if isinstance(x, S.MoE) and (
        x.scoring != "softmax" or x.groups > 1 or x.routed_scale != 1.0 or x.bias_update)]
    if deepseek:  # Mixtral and Qwen-MoE route by a softmax: a config of theirs would route otherwise
        raise ExportError("DeepSeek-V3's router (`scoring = sigmoid`, `groups`, `routed_scale`, `bias_update`) has "
                          "no counterpart in Mixtral's or Qwen-MoE's config, and DeepSeek-V3's layout is not "
                          "exported yet")
    shape, config = _model_config(spec)
    window = config.pop("sliding_window") if shape == "llama" else None
    family = _family(shape, original, window)
    if family in ("mistral", "phi3"):
        for key in ("attention_bias", "mlp_bias"):
            del config[key]
        config["sliding_window"] = window
    if family == "phi3":  # no dropout; the longrope base length, which the model does not read, as the file had it
        config.update(resid_pdrop=0.0, embd_pdrop=0.0, original_max_position_embeddings=original.get(
            "original_max_position_embeddings", config["max_position_embeddings"]))
    config.update(architectures=[ARCHITECTURES[family]], model_type=family)
    if original is None:
        return _reads_back(spec, config)
    config.update(_rope_keys(original, config.pop("rope_theta"), config.pop("rope_scaling")))
    merged = {k: v for k, v in original.items() if (k in IRRELEVANT or k in USED[family])
              and k not in ("rope_theta", "rope_scaling", "rope_parameters")}
    for key, value in config.items():
        if key in IRRELEVANT and key in merged:
            continue  # the file's (initializer_range, ...): the model does not say
        same = key in original and original[key] == value and isinstance(original[key], bool) == isinstance(value,
                                                                                                              bool)
        derived = key in ("head_dim", "num_key_value_heads") and key in original and original[key] is None and \
            value == {"head_dim": config["hidden_size"] // config["num_attention_heads"],
                      "num_key_value_heads": config["num_attention_heads"]}[key]  # null: the importer derives it
        merged[key] = original[key] if same or derived else value  # the file's spelling of an equal value (10000)
    if family in ("qwen2_moe", "qwen3_moe") and "intermediate_size" in original:  # its dense layers' width: this
        merged["intermediate_size"] = original["intermediate_size"]  # model has none
    if family == "qwen3_moe" and "num_local_experts" in original:  # transformers 5's name of the expert count: the
        merged["num_local_experts"] = merged["num_experts"]  # file's spelling (both where it has both)
        if "num_experts" not in original:
            del merged["num_experts"]
    if isinstance(merged.get("layer_types"), list):  # Qwen 2's per-layer attention kinds: one per layer, all alike
        kind = "sliding_attention" if config.get("use_sliding_window") else "full_attention"
        merged["layer_types"] = [kind] * config["num_hidden_layers"]
    return _reads_back(spec, merged)


def _gemma_reads_back(spec: S.Spec, config: dict) -> bool:
    """Whether `config` imports to `spec`'s model: the same tensors under Hugging Face's names, of the same shapes
    (whatever the repeats' layout), and the same figures layer by layer (compiler/hf_header.figures)."""
    from compiler import hf_header as H
    from compiler.check import imported_model
    again = imported_model(config)
    if isinstance(again, str):  # does not import
        return False

    def shapes(model, number):
        return {k: tuple(int(number(d)) for d in shape) for k, (shape, _) in H.expected(model, number)[0].items()}
    return (H.figures(*again) == H.figures(spec.model, spec.value)
            and shapes(*again) == shapes(spec.model, spec.value))


def _reads_back(spec: S.Spec, config: dict) -> dict:
    """`config`, once `scalec import` has read it back to the model of `spec` (the same keys from both); an
    ExportError naming what differs otherwise: what is written must import to the model exported."""
    from compiler.check import check_text
    from compiler.diagnostics import ScaleError
    from compiler.importer import complete, import_config
    text = json.dumps(config, indent=2)
    try:
        again = check_text(complete(import_config(text, "config.json")), "exported.scale")
    except ScaleError as err:
        raise ExportError(f"the config.json written would not import back ({err.diagnostics[0].code}: "
                          f"{err.diagnostics[0].message}); a bug in scalec export, please report it") from None
    want, got = _model_config(spec)[1], _model_config(again)[1]
    if want != got:
        keys = ", ".join(k for k in want if want[k] != got.get(k))
        raise ExportError(f"the config.json written imports back to another model ({keys} differ); a bug in "
                          "scalec export, please report it")
    return config


def _rope_keys(original: dict, theta: float, scaling: dict | None) -> dict:
    """The rotary embedding's keys in `original`'s form: transformers 5's `rope_parameters` (theta inside), or
    `rope_theta` and `rope_scaling` (its `type` or `rope_type` key as the file names it). Phi-3's
    `partial_rotary_factor` inside them is kept where the file had it (1.0, the one value the importer takes)."""
    form = original.get("rope_parameters", original.get("rope_scaling"))
    kind_key = "type" if isinstance(form, dict) and "type" in form and "rope_type" not in form else "rope_type"
    params = dict(scaling or {"rope_type": "default"})
    params = {(kind_key if k == "rope_type" else k): v for k, v in params.items()}
    if isinstance(form, dict) and "partial_rotary_factor" in form:
        params["partial_rotary_factor"] = form["partial_rotary_factor"]
    out = {}
    if isinstance(original.get("rope_parameters"), dict):
        out["rope_parameters"] = {**params, "rope_theta": theta}
        if "rope_theta" in original:
            out["rope_theta"] = theta
        return out
    out["rope_theta"] = theta
    if scaling is not None or "rope_scaling" in original:
        out["rope_scaling"] = params if scaling is not None else None
    return out


def _model_config(spec: S.Spec) -> tuple[str, dict]:
    """(llama, qwen2, qwen3, mixtral, qwen2_moe or qwen3_moe: the model's shape, the config.json keys it gives)."""
    m = spec.model
    v = spec.value
    repeats = m.blocks
    if len(repeats) != 1:
        raise ExportError(f"the model has {len(repeats)} `repeat`s; these families have one stack of blocks")
    if any(isinstance(x, S.Positional) for x in m.layers):
        raise ExportError("learned positions (`positional`) have no counterpart in Llama, Qwen 2 or Mixtral "
                          "(they use rotary embeddings)")
    body = [x for r in repeats[0].body for x in (r.body if isinstance(r, S.Residual) else (r,))]
    kinds = [type(x).__name__ for x in body]
    if kinds not in (["Norm", "Attention", "Norm", "MLP"], ["Norm", "Attention", "Norm", "MoE"]):
        raise ExportError(f"each block must be `residual {{ rmsnorm  attention }}  residual {{ rmsnorm  mlp | moe }}`"
                          f", not {' / '.join(kinds)}")
    n1, att, n2, ffn = body
    final = [x for x in m.layers if isinstance(x, S.Norm)]
    for norm in (n1, n2, *final):
        if norm.kind != "rmsnorm":
            raise ExportError("LayerNorm has no counterpart in these families (they use RMSNorm)")
    qk_norm = att.qk_norm == "rmsnorm"
    if att.bias and not qk_norm:
        raise ExportError("biases on the attention's output projection (`bias = true`) have no counterpart here")
    if att.rope_theta <= 0:
        raise ExportError("attention without rotary embeddings (`rope_theta`) has no counterpart here")
    qkv_bias = bool(att.qkv_bias)
    hidden, heads = int(v(att.hidden)), int(v(att.heads))
    # The positions the model is built for: the `seq` size `scalec import` writes from max_position_embeddings (the
    # train section's seq_len may be shorter); a model without one was built for the sequences it trains on.
    positions = int(v(m.sizes["seq"])) if "seq" in m.sizes else int(v(spec.train.seq_len))
    config = {
        "vocab_size": int(v(m.embedding.vocab)), "hidden_size": hidden, "num_hidden_layers": int(v(repeats[0].count)),
        "num_attention_heads": heads, "num_key_value_heads": int(v(att.kv_heads)),
        "head_dim": int(v(att.head_width)), "rms_norm_eps": float(n1.eps), "hidden_act": "silu",
        "max_position_embeddings": positions, "rope_theta": float(att.rope_theta), "rope_scaling": None,
        "tie_word_embeddings": bool(m.head.tied), "initializer_range": 0.02, "attention_dropout": 0.0,
    }
    window = None if att.window is None else int(v(att.window))
    # Qwen 2 and 3 window the layers from max_window_layers on: 0 windows every one, as the model's one `repeat`
    qwen_window = dict(use_sliding_window=False) if window is None else dict(
        use_sliding_window=True, sliding_window=window, max_window_layers=0)
    if att.rope_scaling is not None and att.rope_scaling[0] == "yarn":
        raise ExportError("an attention's YaRN scaling (`rope_scaling = yarn(...)`) is not exported yet: `scalec "
                          "import` of Llama and Qwen configs does not read it back")
    if att.rope_scaling is not None and len(att.rope_scaling) == 1:  # linear: every frequency / factor
        config["rope_scaling"] = {"rope_type": "linear", "factor": att.rope_scaling[0]}
    elif att.rope_scaling is not None:
        factor, low, high, original = att.rope_scaling
        config["rope_scaling"] = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                                  "high_freq_factor": high, "original_max_position_embeddings": int(original)}
    if qk_norm:  # Qwen 3: q_norm and k_norm, with the model's one rms_norm_eps; biases on all four or none
        if isinstance(ffn, S.MoE) and ffn.shared_ffn is not None:
            raise ExportError("a `moe` with a shared expert beside q/k norms: Qwen2-MoE has no q/k norms and "
                              "Qwen3-MoE no shared expert")
        if att.qkv_bias is not None and att.qkv_bias != att.bias:
            raise ExportError("Qwen 3's attention_bias puts biases on q, k, v and o alike: not `qkv_bias` apart")
        if att.qk_norm_eps != n1.eps:
            raise ExportError(f"Qwen 3's q/k norms use the model's rms_norm_eps ({n1.eps:g}), not "
                              f"qk_norm_eps = {att.qk_norm_eps:g}")
    if isinstance(ffn, S.MoE) and qk_norm:
        return "qwen3_moe", _qwen3_moe_config(config, ffn, bool(att.bias), v)
    if isinstance(ffn, S.MoE) and ffn.shared_ffn is not None:
        if window is not None:
            raise ExportError("Qwen2-MoE's sliding window covers alternate layers only: a window on every layer "
                              "has no Qwen2-MoE form")
        return "qwen2_moe", _qwen2_moe_config(config, ffn, qkv_bias, v)
    if isinstance(ffn, S.MoE):
        if ffn.renormalize is False and ffn.top_k > 1:
            raise ExportError("Mixtral renormalises the gates of a token's top_k experts: remove "
                              "`renormalize = false` (or give the moe a shared expert: Qwen2-MoE's layout)")
        if ffn.act != "swiglu" or ffn.capacity_factor != "none":
            raise ExportError("Mixtral's experts are SwiGLU and route without dropping: `moe(..., act = swiglu, "
                              "capacity_factor = none)`")
        if qkv_bias:
            raise ExportError("Mixtral has no q, k, v biases")
        config.update(sliding_window=window, intermediate_size=int(v(ffn.ffn)),
                      num_local_experts=int(v(ffn.experts)),
                      num_experts_per_tok=int(ffn.top_k), router_aux_loss_coef=float(ffn.aux_loss),
                      output_router_logits=False, router_jitter_noise=0.0)
        return "mixtral", config
    if ffn.act != "swiglu" or ffn.bias:
        raise ExportError("these families' MLPs are SwiGLU without biases: `mlp(..., act = swiglu, bias = false)`")
    config["intermediate_size"] = int(v(ffn.ffn))
    if qk_norm:
        config.update(attention_bias=bool(att.bias), **qwen_window)
        return "qwen3", config
    if qkv_bias:
        config.update(qwen_window)
        return "qwen2", config
    config.update(attention_bias=False, mlp_bias=False, sliding_window=window)  # Mistral's, with a window
    return "llama", config


def _qwen2_moe_config(config: dict, ffn: S.MoE, qkv_bias: bool, v) -> dict:
    """Qwen2-MoE's keys for a `moe` with a shared expert: dropless SwiGLU experts and a sigmoid-gated SwiGLU shared
    expert in every layer. `intermediate_size` (the width of its dense MLP layers, which such a model has none of) is
    written as the shared expert's width, as Qwen1.5-MoE's config has it."""
    if ffn.act != "swiglu" or ffn.capacity_factor != "none" or ffn.shared_gate != "sigmoid":
        raise ExportError("Qwen2-MoE's experts and shared expert are SwiGLU, route without dropping and gate the "
                          "shared expert by a sigmoid: `moe(..., act = swiglu, capacity_factor = none, shared_ffn = "
                          "F, shared_gate = sigmoid)`")
    shared = int(v(ffn.shared_ffn))
    config.update(intermediate_size=shared, moe_intermediate_size=int(v(ffn.ffn)),
                  shared_expert_intermediate_size=shared, num_experts=int(v(ffn.experts)),
                  num_experts_per_tok=int(ffn.top_k), norm_topk_prob=bool(ffn.renormalize),
                  router_aux_loss_coef=float(ffn.aux_loss), output_router_logits=False, decoder_sparse_step=1,
                  mlp_only_layers=[], qkv_bias=qkv_bias, use_sliding_window=False)
    return config


def _qwen3_moe_config(config: dict, ffn: S.MoE, bias: bool, v) -> dict:
    """Qwen3-MoE's keys for a `moe` beside q/k norms: dropless SwiGLU experts in every layer, no shared expert, the
    gates renormalised or not (norm_topk_prob). `intermediate_size` (the width of its dense MLP layers, which such a
    model has none of) is written as top_k × the experts' width, as the released configs have it (Qwen3-30B-A3B:
    6144 = 8 × 768; Qwen3-235B-A22B: 12288 = 8 × 1536)."""
    if ffn.act != "swiglu" or ffn.capacity_factor != "none":
        raise ExportError("Qwen3-MoE's experts are SwiGLU and route without dropping: `moe(..., act = swiglu, "
                          "capacity_factor = none)`")
    width = int(v(ffn.ffn))
    config.update(intermediate_size=int(ffn.top_k) * width, moe_intermediate_size=width,
                  num_experts=int(v(ffn.experts)), num_experts_per_tok=int(ffn.top_k),
                  norm_topk_prob=bool(ffn.renormalize), router_aux_loss_coef=float(ffn.aux_loss),
                  output_router_logits=False, decoder_sparse_step=1, mlp_only_layers=[], attention_bias=bias,
                  use_sliding_window=False)
    return config


def checkpoint_path(path: str) -> tuple[str, list[str]]:
    """The checkpoint `path` names: a `step_N` directory itself, or, for a run's checkpoint_dir, its newest intact
    `step_N` (as a resumed run would pick it); with why each newer one was passed over."""
    if os.path.exists(os.path.join(path, ".metadata")):
        return path, []
    from runtime.checkpoint import newest_intact
    found, skipped = newest_intact(path) if os.path.isdir(path) else (None, [])
    if found is None:
        why = f" (passed over: {'; '.join(skipped)})" if skipped else ""
        raise ExportError(f"{path} is not a checkpoint (no .metadata) nor a checkpoint_dir holding an intact "
                          f"`step_N`{why}: name a `step_N` directory or the run's checkpoint_dir")
    return found, skipped


def stored_model(step: str) -> tuple[dict, str | None]:
    """The model a checkpoint (`step_N`) holds, name -> whole shape, and its fingerprint, without reading a tensor:
    its manifest (runtime.checkpoint writes the parameters and their sha256), or for a checkpoint written before
    manifests, the `model.` entries of DCP's `.metadata` (no fingerprint)."""
    from runtime.checkpoint import MANIFEST
    manifest = os.path.join(step, MANIFEST)
    if os.path.exists(manifest):
        try:
            with open(manifest, encoding="utf-8") as f:
                model = json.load(f)["model"]
            return ({str(n): tuple(int(d) for d in shape) for n, shape in model["parameters"]},
                    str(model["sha256"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ExportError(f"{manifest} is unreadable ({type(exc).__name__}): the checkpoint cannot say which "
                              "model it holds") from None
    import torch.distributed.checkpoint as dcp
    metadata = dcp.FileSystemReader(step).read_metadata().state_dict_metadata
    return {k.removeprefix("model."): tuple(v.size) for k, v in metadata.items()
            if k.startswith("model.") and hasattr(v, "size")}, None


def check_same_model(compiled, step: str) -> None:
    """Refuse a checkpoint of another model before anything is read or written (E0901, located in the .scale file,
    in the words the program uses when it would resume from one): exported, its weights would sit beside a
    config.json of this model, which transformers then refuses or, worse, loads. The manifest's fingerprint
    (runtime.checkpoint.fingerprint: sha256 of the sorted names and whole shapes) decides; the first difference
    says why."""
    from compiler import reshard
    from runtime.checkpoint import fingerprint
    ours = reshard.model_state(compiled.traced.model)
    stored, sha = stored_model(step)
    if sha is not None and sha == fingerprint({n: list(s) for n, s in ours.items()}):
        return
    diag = reshard.model_difference(compiled, ours, stored, step,
                                    help="export a checkpoint with the .scale file of the run that saved it")
    if diag is None and sha is not None:  # the same names and shapes under another fingerprint: a manifest
        diag = Diagnostic("E0901", f"the models differ: {step} records the fingerprint {sha[:12]}…, this model's "
                          "is another", compiled.spec.model.span, help="the checkpoint's scalec.json was changed, "
                          "or written by another version of scalec")
    if diag is not None:
        raise ScaleError([diag], {compiled.spec.path: compiled.spec.source})


def read_checkpoint(path: str) -> dict:
    """The model's tensors of a checkpoint directory (`step_N`), whole, by our names."""
    if not os.path.exists(os.path.join(path, ".metadata")):
        raise ExportError(f"{path} is not a checkpoint (no .metadata): name a `step_N` directory of checkpoint_dir")
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    with tempfile.TemporaryDirectory() as tmp:
        flat = os.path.join(tmp, "all.pt")
        dcp_to_torch_save(path, flat)
        state = torch.load(flat, map_location="cpu", weights_only=False)
    model = state.get("model", state)
    if isinstance(model, dict) and all(not k.startswith("model.") for k in model):
        return {k: t for k, t in model.items() if hasattr(t, "shape")}
    return {k.removeprefix("model."): t for k, t in state.items() if k.startswith("model.")}


def hf_tensors(tensors: dict, layout: str = "mixtral", stack=()) -> dict:
    """Our tensors under Hugging Face's names (experts split and transposed back), a `moe`'s in `layout`
    (runtime/hf_names.py: MIXTRAL or QWEN_MOE), or in PHI3's with q, k, v and gate, up concatenated in their fused
    tensors' row order (the rows runtime/hf.py reads each back from); the layers as `stack` lays them out in the
    repeats (compiler/hf_header.stack; () for one layer a block)."""
    import torch

    from runtime import hf
    from runtime.hf_names import fused
    out = {}
    for name, t in tensors.items():
        if name.endswith("_bias.load"):  # an ExpertBias's load of the step: not model state (not persistent)
            continue
        if ".moe_experts." in name:
            for e in range(t.shape[0]):
                out[hf.hf_name(name, e, layout, stack)] = t[e].t().contiguous()
            continue
        members = fused(name, layout)
        if members is None:
            out[hf.hf_name(name, layout=layout, stack=stack)] = t.contiguous()
        elif name == members[0]:
            out[hf.hf_name(name, layout=layout, stack=stack)] = torch.cat([tensors[m] for m in members])
    return out


def export(spec: S.Spec, checkpoint: str, out_dir: str, shard_bytes: int = SHARD_BYTES,
           config_from: str | None = None, chosen=None, guard=None) -> list[str]:
    """Write `out_dir`/config.json and the safetensors files, and copy the source checkpoint's generation config and
    tokenizer (`COMPANIONS`; the source: `source_config`, `config_from` naming it explicitly); returns the files
    written. `checkpoint` is a `step_N` or a checkpoint_dir (`checkpoint_path`); `chosen(path, skipped)` hears which
    one is read; `guard(path)` may refuse it (raising) before any tensor is read or file written."""
    from safetensors.torch import save_file
    source, original = source_config(spec, config_from)
    config = hf_config(spec, original)
    from runtime.hf_names import DEEPSEEK, MIXTRAL, PHI3, QWEN_MOE
    layout = (PHI3 if config["model_type"] == "phi3" else  # fused qkv_proj, gate_up_proj
              DEEPSEEK if config["model_type"] in ("deepseek_v2", "deepseek_v3") else  # mlp.shared_experts.*
              QWEN_MOE if config["model_type"] in ("qwen2_moe", "qwen3_moe") else MIXTRAL)  # mlp.experts.j.*_proj
    checkpoint, skipped = checkpoint_path(checkpoint)  # after the model and config: what cannot be written is
    if chosen is not None:                               # refused before any weight is looked for
        chosen(checkpoint, skipped)
    if guard is not None:  # a checkpoint of another model: refused before anything is read or written
        guard(checkpoint)
    tensors = hf_tensors(read_checkpoint(checkpoint), layout, hf_stack(spec.model, spec.value))
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in tensors.values()})
    dtype = dtypes[0] if len(dtypes) == 1 else "float32"  # what the files hold (transformers 5 names it `dtype`)
    for key in ("torch_dtype", "dtype"):
        if key in config or (key == "torch_dtype" and "dtype" not in config):
            config[key] = dtype
    os.makedirs(out_dir, exist_ok=True)
    shards, size = [[]], 0
    for name in sorted(tensors):
        n = tensors[name].numel() * tensors[name].element_size()
        if shards[-1] and size + n > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    written = []
    weight_map = {}
    for i, names in enumerate(shards):
        file = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: tensors[k] for k in names}, os.path.join(out_dir, file), metadata={"format": "pt"})
        weight_map.update({k: file for k in names})
        written.append(file)
    if len(shards) > 1:
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
        written.append("model.safetensors.index.json")
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    written.append("config.json")
    for name in COMPANIONS if source else ():
        src, dst = os.path.join(source, name), os.path.join(out_dir, name)
        if os.path.isfile(src) and not (os.path.exists(dst) and os.path.samefile(src, dst)):
            shutil.copyfile(src, dst)
            written.append(name)
    tok = data_tokenizer(spec)
    if tok and "tokenizer.json" not in written:
        dst = os.path.join(out_dir, "tokenizer.json")
        if not (os.path.exists(dst) and os.path.samefile(tok, dst)):
            shutil.copyfile(tok, dst)
        written.append("tokenizer.json")
    return written


def data_tokenizer(spec: S.Spec) -> str | None:
    """The tokenizer.json the model's token file was made with (`scalec data` records it in the file's sidecar),
    when it is still there: a model trained from text is exported with the tokenizer that reads its ids."""
    data = spec.train.data
    if getattr(data, "kind", None) != "tokens" or not data.path:
        return None
    from compiler import files
    try:
        side = files.read_sidecar(os.path.join(os.path.dirname(spec.path), data.path))
    except files.SidecarError:
        return None
    if side is None or not side.tokenizer:
        return None
    tok = side.tokenizer if os.path.isabs(side.tokenizer) else os.path.join(os.path.dirname(side.path),
                                                                           side.tokenizer)
    return tok if os.path.isfile(tok) and tok.endswith(".json") else None
