"""`scalec export FILE CHECKPOINT -o DIR`: a checkpoint of FILE's model as a Hugging Face checkpoint.

The checkpoint (runtime/checkpoint.py) holds the single-device model's tensors whatever plan wrote it; they are
read whole on this one process (torch.distributed.checkpoint's `dcp_to_torch_save`, no process group), renamed to
Hugging Face's layout (runtime/hf.py: Mixtral's stacked experts split per expert and transposed back), and written
with `safetensors` in files of at most `shard_bytes` (with `model.safetensors.index.json` when there are several),
beside a `config.json` of the architecture FILE's model is: LlamaForCausalLM, Qwen2ForCausalLM (biases on q, k, v
only) or MixtralForCausalLM (a `moe` in each block). What `init = from(DIR)` then reads back is bit for bit the
checkpoint's (tests/test_export.py), and transformers loads it (the same test).

A model these families cannot express (learned positions, LayerNorm, GELU, biases on every projection, several
`repeat`s, blocks of another shape) is refused with the reason, before anything is read.
"""
from __future__ import annotations

import json
import os
import tempfile

from compiler import spec as S

SHARD_BYTES = 5 * 10**9  # what transformers' save_pretrained writes per file by default


class ExportError(Exception):
    """Why a model or checkpoint cannot be exported (one line)."""


def hf_config(spec: S.Spec) -> dict:
    """config.json of `spec`'s model, or ExportError naming what has no Hugging Face counterpart here."""
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
    if att.bias:
        raise ExportError("biases on the attention's output projection (`bias = true`) have no counterpart here")
    if att.rope_theta <= 0:
        raise ExportError("attention without rotary embeddings (`rope_theta`) has no counterpart here")
    qkv_bias = bool(att.qkv_bias)
    hidden, heads = int(v(att.hidden)), int(v(att.heads))
    config = {
        "vocab_size": int(v(m.embedding.vocab)), "hidden_size": hidden, "num_hidden_layers": int(v(repeats[0].count)),
        "num_attention_heads": heads, "num_key_value_heads": int(v(att.kv_heads)),
        "head_dim": hidden // heads, "rms_norm_eps": float(n1.eps), "hidden_act": "silu",
        "max_position_embeddings": int(v(spec.train.seq_len)), "rope_theta": float(att.rope_theta),
        "tie_word_embeddings": bool(m.head.tied), "torch_dtype": "float32", "initializer_range": 0.02,
        "attention_dropout": 0.0,
    }
    if att.rope_scaling is not None:
        factor, low, high, original = att.rope_scaling
        config["rope_scaling"] = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                                  "high_freq_factor": high, "original_max_position_embeddings": int(original)}
    if isinstance(ffn, S.MoE):
        if ffn.act != "swiglu" or ffn.capacity_factor != "none":
            raise ExportError("Mixtral's experts are SwiGLU and route without dropping: `moe(..., act = swiglu, "
                              "capacity_factor = none)`")
        if qkv_bias:
            raise ExportError("Mixtral has no q, k, v biases")
        config.update(architectures=["MixtralForCausalLM"], model_type="mixtral",
                      intermediate_size=int(v(ffn.ffn)), num_local_experts=int(v(ffn.experts)),
                      num_experts_per_tok=int(ffn.top_k), router_aux_loss_coef=float(ffn.aux_loss),
                      output_router_logits=False, router_jitter_noise=0.0)
        return config
    if ffn.act != "swiglu" or ffn.bias:
        raise ExportError("these families' MLPs are SwiGLU without biases: `mlp(..., act = swiglu, bias = false)`")
    config["intermediate_size"] = int(v(ffn.ffn))
    if qkv_bias:
        config.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2", use_sliding_window=False)
    else:
        config.update(architectures=["LlamaForCausalLM"], model_type="llama", attention_bias=False, mlp_bias=False)
    return config


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


def hf_tensors(tensors: dict) -> dict:
    """Our tensors under Hugging Face's names (experts split and transposed back)."""
    from runtime import hf
    out = {}
    for name, t in tensors.items():
        if ".moe_experts." in name:
            for e in range(t.shape[0]):
                out[hf.hf_name(name, e)] = t[e].t().contiguous()
        else:
            out[hf.hf_name(name)] = t.contiguous()
    return out


def export(spec: S.Spec, checkpoint: str, out_dir: str, shard_bytes: int = SHARD_BYTES) -> list[str]:
    """Write `out_dir`/config.json and the safetensors files; returns the files written."""
    from safetensors.torch import save_file
    config = hf_config(spec)
    tensors = hf_tensors(read_checkpoint(checkpoint))
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
    return written
