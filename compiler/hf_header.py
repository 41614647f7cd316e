"""What `check` reads of the checkpoint of `init = from(...)` before any process starts: the safetensors headers
(names, shapes, dtypes; never tensor data) and config.json, against the tensors the program will ask for.

A safetensors file is an 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets},
"__metadata__": ...}, then the data; a checkpoint directory holds model.safetensors, or shards listed by
model.safetensors.index.json. Plain struct and json read them: `scalec check` imports no torch.

The tensors the program asks for are the single-device model's parameters (compiler/model.py names them) under
Hugging Face's names (runtime/hf_names.py: the map the program reads by, torch-free). The parameters are restated
here without torch; tests/test_hf_header.py holds them equal to compiler.model's on the Llama, Qwen 2, Qwen 3,
Phi-3 (fused q/k/v and gate/up) and Mixtral layouts.
"""
from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import dataclass

import sympy

from compiler import spec as S
from runtime.hf_names import MIXTRAL, ONE_LAYER_PER_BLOCK, fused, hf_name, layout as layout_of

HEADER_LIMIT = 100 << 20  # the safetensors library refuses a larger header too
ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
            "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}
FAMILIES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Phi3ForCausalLM",
            "MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "Gemma2ForCausalLM",
            "Gemma3ForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
# layers of two kinds (Gemma's attentions, DeepSeek's dense and mixture layers): held to the imported model layer by
# layer
GEMMA = ("Gemma2ForCausalLM", "Gemma3ForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
SHOWN = 3  # names shown of a list


class HeaderError(Exception):
    """A checkpoint file that is not readable safetensors (one line)."""


@dataclass(frozen=True)
class Tensor:
    dtype: str
    shape: tuple[int, ...]
    file: str


# -- reading ------------------------------------------------------------------------------------------------------


def read_header(file: str) -> dict[str, Tensor]:
    """The tensors a .safetensors file declares, checked for consistency with the file's size."""
    name = os.path.basename(file)
    try:
        size = os.path.getsize(file)
        with open(file, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise HeaderError(f"{name} is {size} bytes, too short for a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > HEADER_LIMIT or 8 + n > size:
                raise HeaderError(f"{name} announces a header of {n} bytes in a file of {size}: it is cut short, or "
                                  "not safetensors")
            raw = f.read(n)
    except OSError as exc:
        raise HeaderError(f"{name}: {exc.strerror or exc}") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HeaderError(f"the header of {name} is not JSON ({exc}): the file is damaged, or not safetensors") \
            from None
    if not isinstance(doc, dict):
        raise HeaderError(f"the header of {name} is not a JSON object")
    data = size - 8 - n
    out = {}
    for key, entry in doc.items():
        if key == "__metadata__":
            continue
        dtype, shape, offsets = ((entry.get("dtype"), entry.get("shape"), entry.get("data_offsets"))
                                 if isinstance(entry, dict) else (None, None, None))
        if (not isinstance(dtype, str) or not isinstance(shape, list)
                or not all(isinstance(d, int) and d >= 0 for d in shape) or not isinstance(offsets, list)
                or len(offsets) != 2 or not all(isinstance(o, int) for o in offsets)):
            raise HeaderError(f"the header of {name} describes `{key}` without a dtype, shape and data_offsets")
        lo, hi = offsets
        if not 0 <= lo <= hi <= data:
            raise HeaderError(f"`{key}` lies at bytes {lo}..{hi} of {name}'s data, which holds {data}: the file is "
                              "cut short")
        if dtype in ITEMSIZE and hi - lo != math.prod(shape) * ITEMSIZE[dtype]:
            raise HeaderError(f"`{key}` of {name} is {_dims(shape)} {dtype} ({math.prod(shape) * ITEMSIZE[dtype]} "
                              f"bytes) but spans {hi - lo}")
        out[key] = Tensor(dtype, tuple(shape), file)
    return out


def checkpoint_tensors(path: str) -> dict[str, Tensor]:
    """Every tensor of a checkpoint, where the program looks (runtime.hf.Files): a directory's index, else its
    .safetensors files, or the one file."""
    if not os.path.isdir(path):
        return read_header(path)
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        try:
            with open(index, encoding="utf-8") as f:
                where = json.load(f)["weight_map"]
            if not isinstance(where, dict) or not all(isinstance(v, str) for v in where.values()):
                raise TypeError("weight_map is not {name: file}")
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            raise HeaderError(f"model.safetensors.index.json is not a readable index ({exc})") from None
        headers = {}
        for file in sorted(set(where.values())):
            full = os.path.join(path, file)
            if not os.path.isfile(full):
                raise HeaderError(f"model.safetensors.index.json names {file}, which is not there")
            headers[file] = read_header(full)
        out = {}
        for name, file in where.items():
            if name not in headers[file]:
                raise HeaderError(f"model.safetensors.index.json puts `{name}` in {file}, whose header lacks it")
            out[name] = headers[file][name]
        return out
    out = {}
    for file in sorted(f for f in os.listdir(path) if f.endswith(".safetensors")):
        out.update(read_header(os.path.join(path, file)))
    return out


def read_config(path: str) -> dict | None:
    """config.json of a checkpoint directory; None when there is none."""
    file = os.path.join(path, "config.json")
    if not os.path.isdir(path) or not os.path.isfile(file):
        return None
    try:
        with open(file, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HeaderError(f"config.json is not readable JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise HeaderError("config.json is not a JSON object")
    return doc


# -- what the program asks for ------------------------------------------------------------------------------------

def parameters(model: S.Model, number) -> dict[str, tuple[tuple, object]]:
    """The single-device model's parameters as compiler/model.py names them: name -> (shape as sympy expressions of
    the sizes, the layer it belongs to). `number(expr)` gives a size's value (a repeat's count)."""
    out: dict[str, tuple[tuple, object]] = {}

    def segment(prefix: str, layers) -> None:
        totals = {"norm": 0, "attn": 0, "mlp": 0, "moe": 0}
        flat = [x for x in S.walk(layers)]
        for x in flat:
            key = {S.Norm: "norm", S.Attention: "attn", S.MLA: "attn", S.MLP: "mlp", S.MoE: "moe"}.get(type(x))
            if key:
                totals[key] += 1
        seen = dict.fromkeys(totals, 0)
        for x in flat:
            key = {S.Norm: "norm", S.Attention: "attn", S.MLA: "attn", S.MLP: "mlp", S.MoE: "moe"}.get(type(x))
            if key is None:
                continue
            seen[key] += 1
            leaf = key if totals[key] == 1 else f"{key}_{seen[key]}"
            for pname, shape in _leaf_params(x):
                out[f"{prefix}{leaf}{pname}"] = (shape, x)

    emb, pos, head = model.embedding, model.positional, model.head
    out["embed.weight"] = ((emb.vocab, emb.hidden), emb)
    if pos is not None:
        out["pos.weight"] = ((pos.positions, pos.hidden), pos)
    segment("", [x for x in model.body if not isinstance(x, S.Repeat)])
    for k, rep in enumerate(model.blocks):
        name = "blocks" if k == 0 else f"blocks_{k + 1}"
        for i in range(int(number(rep.count))):
            segment(f"{name}.{i}.", rep.body)
    if not head.tied:
        out["lm_head.weight"] = ((head.vocab, head.hidden), head)
        if head.bias:
            out["lm_head.bias"] = ((head.vocab,), head)
    elif head.bias:
        out["lm_head_bias.bias"] = ((head.vocab,), head)
    return {k: (tuple(sympy.sympify(d) for d in shape), layer) for k, (shape, layer) in out.items()}


def _leaf_params(x) -> list[tuple[str, tuple]]:
    """(suffix, shape) of a leaf layer's parameters, as compiler/model.py builds them."""
    if isinstance(x, S.Norm):
        return [(".weight", (x.hidden,))] + ([(".bias", (x.hidden,))] if x.kind == "layernorm" else [])
    if isinstance(x, S.Attention):
        hd = x.head_width
        qkv = x.bias if x.qkv_bias is None else x.qkv_bias
        out = []
        for leaf, rows, bias in (("_q", x.heads * hd, qkv), ("_k", x.kv_heads * hd, qkv),
                                 ("_v", x.kv_heads * hd, qkv)):
            out += [(f"{leaf}.weight", (rows, x.hidden))] + ([(f"{leaf}.bias", (rows,))] if bias else [])
        out += [("_o.weight", (x.hidden, x.heads * hd))] + ([("_o.bias", (x.hidden,))] if x.bias else [])
        return out + ([(f"_{w}_norm.weight", (hd,)) for w in ("q", "k")] if x.qk_norm != "none" else [])
    if isinstance(x, S.MLA):  # compiler/model.py _mla: linears without biases, the latents' RMS norms
        nope, rope, vd = x.qk_nope_head_dim, x.qk_rope_head_dim, x.v_head_dim
        out = ([("_q.weight", (x.heads * (nope + rope), x.hidden))] if x.q_lora_rank is None else
               [("_qa.weight", (x.q_lora_rank, x.hidden)), ("_qa_norm.weight", (x.q_lora_rank,)),
                ("_qb.weight", (x.heads * (nope + rope), x.q_lora_rank))])
        return out + [("_kva.weight", (x.kv_lora_rank + rope, x.hidden)), ("_kva_norm.weight", (x.kv_lora_rank,)),
                      ("_kvb.weight", (x.heads * (nope + vd), x.kv_lora_rank)), ("_o.weight", (x.hidden, x.heads * vd))]
    if isinstance(x, S.MLP):
        out = [("_up.weight", (x.ffn, x.hidden))] + ([("_up.bias", (x.ffn,))] if x.bias else [])
        if x.act in ("swiglu", "geglu"):
            out += [("_gate.weight", (x.ffn, x.hidden))] + ([("_gate.bias", (x.ffn,))] if x.bias else [])
        return out + [("_down.weight", (x.hidden, x.ffn))] + ([("_down.bias", (x.hidden,))] if x.bias else [])
    if isinstance(x, S.MoE):
        out = [("_router.weight", (x.experts, x.hidden)), ("_experts.w_up", (x.experts, x.hidden, x.ffn))]
        if x.act == "swiglu":
            out.append(("_experts.w_gate", (x.experts, x.hidden, x.ffn)))
        out.append(("_experts.w_down", (x.experts, x.ffn, x.hidden)))
        if x.shared_ffn is not None:  # the shared expert (compiler/model.py _shared_expert): linears, no biases
            f = x.shared_ffn
            out += [("_shared_up.weight", (f, x.hidden))] + (
                [("_shared_gate.weight", (f, x.hidden))] if x.act == "swiglu" else []) + [
                ("_shared_down.weight", (x.hidden, f))] + (
                [("_shared_sigmoid.weight", (1, x.hidden))] if x.shared_gate == "sigmoid" else [])
        if x.bias_update:  # DeepSeek-V3's expert bias: a buffer (runtime.moe.ExpertBias), read as a parameter is
            out.append(("_bias.bias", (x.experts,)))
        return out
    return []


def stack(model: S.Model, number) -> tuple:
    """How Hugging Face's decoder layers lie in the model's repeats (runtime/hf_names.py): one (repeat, its first
    layer, layers per block, norms per layer) per repeat, a block holding as many layers as attentions and each layer
    its share of the block's norms; () where that is ONE_LAYER_PER_BLOCK (one repeat of one layer with two norms:
    every family before Gemma), so that their programs and checks are unchanged."""
    out = _layout(model, number)
    return () if out in ((), ONE_LAYER_PER_BLOCK) else out


def _layout(model: S.Model, number) -> tuple:
    """`stack`'s entries for every repeat, the one-layer default included."""
    out, first = [], 0
    for k, rep in enumerate(model.blocks):
        flat = list(S.walk(rep.body))
        per_block = max(1, sum(isinstance(x, (S.Attention, S.MLA)) for x in flat))
        norms = sum(isinstance(x, S.Norm) for x in flat)
        out.append(("blocks" if k == 0 else f"blocks_{k + 1}", first, per_block,
                    norms // per_block if norms % per_block == 0 else norms))
        first += int(number(rep.count)) * per_block
    return tuple(out)


def expected(model: S.Model, number, layout: str = MIXTRAL) -> tuple[dict[str, tuple[tuple, object]],
                                                                     list[tuple[str, object]]]:
    """Hugging Face name -> (shape expressions, layer) of every tensor the program reads, and the parameters
    (ours, with their layer) that have no Hugging Face name. A stacked expert weight is one tensor per expert,
    transposed (runtime/hf.py); a `moe`'s names are those of `layout` (runtime/hf_names.py), and in Phi-3's a fused
    tensor (qkv_proj, gate_up_proj) is its parts' rows stacked: the sum of their dim 0, their other dims; the
    layers lie in the repeats as `stack` says."""
    out: dict[str, tuple[tuple, object]] = {}
    orphans = []
    params = parameters(model, number)
    layers = stack(model, number)
    for name, (shape, layer) in params.items():
        try:
            if ".moe_experts." in name:
                for e in range(int(number(shape[0]))):
                    out[hf_name(name, e, layout, layers)] = ((shape[2], shape[1]), layer)
                continue
            hf = hf_name(name, layout=layout, stack=layers)
        except KeyError:
            orphans.append((name, layer))
            continue
        members = fused(name, layout)
        if members is None:
            out[hf] = (shape, layer)
        elif name == members[0]:  # the fused tensor once, at its first part: every part is in the same block
            rows = sum((params[m][0][0] for m in members if m in params), sympy.Integer(0))
            out[hf] = ((rows, *shape[1:]), layer)
    return out, orphans


# -- comparing ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    code: str
    message: str
    label: str
    help: str


def compare(model: S.Model, number, shown: str, tensors: dict[str, Tensor], config: dict | None,
            imported=None) -> list[Problem]:
    """What keeps the checkpoint from being this model's: the model's parameters with no Hugging Face name (E0810),
    tensors missing or left over (E0807), shapes (E0808), then, when the tensors fit, config.json's figures that
    shapes cannot show (E0809)."""
    want, orphans = expected(model, number, layout_of(tensors))  # as runtime/hf.py reads it
    if orphans:
        kinds = " and ".join(sorted({_kind(layer) for _, layer in orphans}))
        return [Problem("E0810", f"the model's {_few([n for n, _ in orphans])} ({kinds}) "
                        f"ha{'s' if len(orphans) == 1 else 've'} no counterpart in a Hugging Face checkpoint of "
                        "Llama, Mistral, Qwen 2, Qwen 3, Phi-3, Gemma 2, Gemma 3, Mixtral or Qwen-MoE",
                        "reads these families' layout",
                        "`init = from(...)` needs the model in their layout: `repeat`s of `residual { rmsnorm  "
                        "attention }  residual { rmsnorm  mlp | moe }` (Gemma's with a norm after each too), rotary "
                        "positions, then `rmsnorm` and `lm_head`; `scalec import CONFIG.json` writes it from the "
                        "checkpoint's config.json")]
    archs = config.get("architectures") if config else None
    said = f" (its config.json says {', '.join(map(str, archs))})" if isinstance(archs, list) and archs else ""
    missing = [n for n in want if n not in tensors]
    extra = sorted((n for n in tensors if n not in want and not n.endswith(".rotary_emb.inv_freq")), key=_natural)
    if missing:
        if len(missing) == len(want):
            why = (f"none of the model's tensors is there; it holds {_few(extra)}: it looks like another "
                   f"architecture{said}. `init = from(...)` reads Llama, Mistral, Qwen 2, Qwen 3, Phi-3, Gemma 2, "
                   "Gemma 3, Mixtral and Qwen-MoE checkpoints")
        elif missing == ["lm_head.weight"]:
            why = ("the checkpoint ties its head to the embedding (no `lm_head.weight`): write "
                   "`lm_head(vocab, hidden, tied = true)`")
        elif all(n.endswith(".bias") for n in missing) and any("layernorm" in n for n in missing):
            why = ("LayerNorm's bias has no counterpart in these families, whose norms are RMSNorm: write "
                   "`rmsnorm(hidden, eps = ...)`")
        elif all(n.endswith(".bias") for n in missing):
            why = ("the model has biases the checkpoint lacks (Qwen 2 has q, k and v biases, Llama none): "
                   "`attention(..., bias = false, qkv_bias = ...)` as the checkpoint's family has them")
        else:
            why = (f"it is of another layout or depth{said}" + (f"; it holds {_few(extra)} instead" if extra else "")
                   + ": compare its config.json with the model (`scalec import` writes the model section from it)")
        return [Problem("E0807", f"checkpoint {shown} lacks {len(missing)} of the {len(want)} tensors the model "
                        f"reads: {_few(missing)}", f"{len(missing)} tensors missing", why)]
    if extra:
        layers = {int(m.group(1)) for n in extra if (m := re.match(r"model\.layers\.(\d+)\.", n))}
        depth = [len({int(m.group(1)) for n in tensors if (m := re.match(r"model\.layers\.(\d+)\.", n))}),
                 len({int(m.group(1)) for n in want if (m := re.match(r"model\.layers\.(\d+)\.", n))})]
        if extra == ["lm_head.weight"] and model.head.tied:
            why = ("the model ties its head to the embedding (`tied = true`), but the checkpoint has its own head, "
                   "which the run would ignore: write `lm_head(vocab, hidden, tied = false)`")
        elif layers and depth[0] > depth[1]:
            why = (f"the checkpoint has {depth[0]} layers, the model {depth[1]}: the run would drop the rest; make "
                   "the `repeat` count the checkpoint's")
        else:
            why = ("the run would ignore them, and the model would not compute what the checkpoint's does: compare "
                   f"its config.json{said} with the model")
        return [Problem("E0807", f"checkpoint {shown} holds {len(extra)} tensors the model has no place for: "
                        f"{_few(extra)}", f"{len(extra)} tensors left over", why)]
    wrong = [(n, want[n][0], tensors[n].shape) for n in want if _numbers(want[n][0], number) != tensors[n].shape]
    if wrong:
        name, shape, found = wrong[0]
        ours = _numbers(shape, number)
        more = f" ({len(wrong) - 1} more tensors differ)" if len(wrong) > 1 else ""
        sizes = _config_differences(model, number, config) if config else []
        said = f" (its config.json: {'; '.join(sizes)})" if sizes else ""
        return [Problem("E0808", f"`{name}` is {_dims(found)} in checkpoint {shown}, {_dims(ours)} in the model"
                        + more, _implied(shape, ours, found, number),
                        f"the checkpoint is of another size{said}: make the model's sizes the checkpoint's "
                        "(`scalec import` writes the model section from its config.json)")]
    return _config_problems(model, number, shown, config, imported) if config else []


def _config_problems(model: S.Model, number, shown: str, config: dict, imported=None) -> list[Problem]:
    """config.json's figures against the model's, where the tensors' shapes agree (heads, rotary base, ...);
    `imported(config)` gives a Gemma config's own model and its sizes' `number` (what `scalec import` writes, by
    compiler/check.py, which holds the checker)."""
    archs = config.get("architectures")
    if isinstance(archs, list) and archs and not set(archs) & set(FAMILIES):
        return [Problem("E0809", f"config.json of checkpoint {shown} names {', '.join(map(str, archs))}, not a "
                        "family `init = from(...)` reads", "another architecture",
                        f"these are {', '.join(FAMILIES)}")]
    gemma = isinstance(archs, list) and bool(set(archs) & set(GEMMA))
    differ = (_gemma_differences(model, number, config, imported) if gemma and imported is not None
              else _config_differences(model, number, config))
    if not differ:
        return []
    return [Problem("E0809", f"config.json of checkpoint {shown} disagrees with the model: {'; '.join(differ)}",
                    f"{len(differ)} figure{'s' if len(differ) > 1 else ''} differ",
                    "the tensors' shapes fit, but the model would not compute what the checkpoint's does: write "
                    "the model section from the config (`scalec import`)")]


def _config_differences(model: S.Model, number, config: dict) -> list[str]:
    """`num_attention_heads 4 there, heads 8 here; ...` for each figure of config.json the model disagrees with."""
    block = [x for r in model.blocks[:1] for x in S.walk(r.body)]
    att = next((x for x in block if isinstance(x, S.Attention)), None)
    ffn = next((x for x in block if isinstance(x, (S.MLP, S.MoE))), None)
    norm = next((x for x in block if isinstance(x, S.Norm)), None)
    rp = config.get("rope_parameters")  # transformers 5 moved rope_theta in here
    rope = config["rope_theta"] if "rope_theta" in config else rp.get("rope_theta") if isinstance(rp, dict) else None
    pairs = [("vocab_size", config.get("vocab_size"), number(model.embedding.vocab), "vocab"),
             ("hidden_size", config.get("hidden_size"), number(model.embedding.hidden), "hidden"),
             ("num_hidden_layers", config.get("num_hidden_layers"),
              number(model.blocks[0].count) if model.blocks else None, "the repeat count"),
             ("tie_word_embeddings", config.get("tie_word_embeddings"), model.head.tied, "`tied`")]
    if att is not None:
        pairs += [("num_attention_heads", config.get("num_attention_heads"), number(att.heads), "heads"),
                  ("num_key_value_heads", config.get("num_key_value_heads", config.get("num_attention_heads")),
                   number(att.kv_heads), "kv_heads"),
                  ("rope_theta", rope, att.rope_theta, "rope_theta"),
                  ("head_dim", config.get("head_dim"), number(att.head_width), "the head dimension")]
    qwen_moe = isinstance(ffn, S.MoE) and "moe_intermediate_size" in config  # Qwen-MoE: experts of their own width
    if ffn is not None:
        pairs.append(("moe_intermediate_size" if qwen_moe else "intermediate_size",
                      config.get("moe_intermediate_size" if qwen_moe else "intermediate_size"), number(ffn.ffn),
                      "the ffn width"))
    if isinstance(ffn, S.MoE):
        # Qwen-MoE's count is num_experts, which transformers 5's Qwen3MoeConfig writes as num_local_experts
        experts = "num_experts" if qwen_moe and "num_experts" in config else "num_local_experts"
        pairs += [(experts, config.get(experts), number(ffn.experts), "experts"),
                  ("num_experts_per_tok", config.get("num_experts_per_tok"), ffn.top_k, "top_k")]
        if qwen_moe and "norm_topk_prob" in config:
            pairs.append(("norm_topk_prob", config["norm_topk_prob"], ffn.renormalize, "renormalize"))
    if norm is not None:
        pairs.append(("rms_norm_eps", config.get("rms_norm_eps"), norm.eps, "the norms' eps"))
    differ = [(k, theirs, ours, what) for k, theirs, ours, what in pairs
              if theirs is not None and ours is not None and not _same(theirs, ours)]
    out = [f"{k} {_value(t)} there, {what} {_value(o)} here" for k, t, o, what in differ]
    if att is not None and "sliding_window" in config:  # none on either side is a figure too: full attention
        theirs = _config_window(config)
        ours = None if att.window is None else int(number(att.window))
        if theirs != ours:
            out.append(f"sliding_window {'null' if theirs is None else theirs} there, window "
                       f"{'none' if ours is None else ours} here")
    return out


def figures(model: S.Model, number) -> list[tuple[str, str]]:
    """(where, what) of every figure of the model that tensor shapes cannot show, layer by layer with the repeats
    unrolled: norms' kind and eps, each attention's window, soft cap, score scale, rotary base and scaling and q/k
    norm, each MLP's activation, the embedding's scale and the logits' cap."""
    def attention(x: S.Attention) -> str:
        scale = None if x.query_scale is None else number(x.query_scale)
        return (f"window {'none' if x.window is None else number(x.window)}, softcap {x.softcap}, scores over "
                f"√{number(x.head_width) if scale is None else scale}, rope_theta {_value(x.rope_theta)}"
                + (f" scaled {x.rope_scaling}" if x.rope_scaling else "")
                + (f", {x.qk_norm} q/k norm (eps {x.qk_norm_eps:g})" if x.qk_norm != "none" else ""))

    def leaf(x) -> str | None:
        if isinstance(x, S.Norm):
            return f"{'zero-centred ' if x.zero_centered else ''}{x.kind} (eps {x.eps:g})"
        if isinstance(x, S.Attention):
            return attention(x)
        if isinstance(x, S.MLP):
            return f"{x.act} MLP"
        if isinstance(x, S.MLA):
            return (f"rope_theta {_value(x.rope_theta)}, rotary pairs {'interleaved' if x.rope_interleave else 'halves'}"
                    f", latent norms' eps {x.norm_eps:g}")
        if isinstance(x, S.MoE):
            return (f"{x.act} experts, top_k {x.top_k}, {x.scoring} scores, {x.groups} groups (best "
                    f"{x.topk_groups}), renormalize {_value(x.renormalize)}, gates × {_value(x.routed_scale)}, "
                    f"expert bias {'yes' if x.bias_update else 'no'}")
        return None

    out = [("the embedding", "scaled by √hidden" if model.embedding.scaled else "unscaled")]
    for rep, (_, first, per_block, per_layer) in zip(model.blocks, _layout(model, number)):
        body = [x for x in S.walk(rep.body) if leaf(x) is not None]
        for i in range(int(number(rep.count))):
            seen = {S.Norm: 0, S.Attention: 0, S.MLP: 0, S.MLA: 0, S.MoE: 0}
            for x in body:
                k = seen[type(x)]
                seen[type(x)] += 1
                j = k // max(1, per_layer) if isinstance(x, S.Norm) else k
                out.append((f"layer {first + i * per_block + j}'s {type(x).__name__.lower()}", leaf(x)))
    final = [x for x in model.body if isinstance(x, S.Norm)]
    out += [("the final norm", leaf(final[-1]) if final else "none"), ("the logits", f"softcap {model.head.softcap}")]
    return out


def _gemma_differences(model: S.Model, number, config: dict, imported) -> list[str]:
    """A Gemma config's model (`imported(config)`: what `scalec import` writes from it, and its sizes' `number`)
    against this one, figure by figure where the shapes agree: the first few that differ, `layer 3's attention:
    window 8 there, window none here`."""
    found = imported(config)
    if isinstance(found, str):
        return [f"its config.json does not import ({found})"]
    theirs = figures(*found)
    ours = figures(model, number)
    if len(theirs) != len(ours):
        return [f"{len(theirs)} figures there, {len(ours)} here: another layout"]
    return [f"{w}: {t} there, {o} here" for (w, t), (_, o) in zip(theirs, ours) if t != o][:SHOWN]


def _config_window(config: dict):
    """The sliding window transformers applies to the first layer of a config: Mistral's and Mixtral's
    `sliding_window`; Qwen's only with use_sliding_window, and only from layer max_window_layers on."""
    window = config.get("sliding_window")
    if "use_sliding_window" in config or "max_window_layers" in config:
        first = config.get("max_window_layers", 28)
        if not config.get("use_sliding_window", False) or (isinstance(first, int) and first > 0):
            return None
    return window if isinstance(window, int) and not isinstance(window, bool) else None


def _same(theirs, ours) -> bool:
    if isinstance(ours, bool) or isinstance(theirs, bool):
        return bool(theirs) == bool(ours)
    try:
        return math.isclose(float(theirs), float(ours), rel_tol=1e-9)
    except (TypeError, ValueError):
        return False


def _value(v) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else f"{v:g}" if isinstance(v, float) else str(v)


def _numbers(shape: tuple, number) -> tuple[int, ...]:
    return tuple(int(number(d)) for d in shape)


def _implied(shape: tuple, ours: tuple, found: tuple, number) -> str:
    """What a shape difference says of the sizes: `hidden` is 128 in the checkpoint, 64 in the model."""
    if len(ours) != len(found):
        return f"{len(found)} dims in the checkpoint, {len(ours)} in the model"
    i = next(i for i, (a, b) in enumerate(zip(ours, found)) if a != b)
    expr, theirs = shape[i], found[i]
    syms = sorted(expr.free_symbols, key=str)
    if len(syms) == 1:
        sol = sympy.solve(sympy.Eq(expr, theirs), syms[0])
        if len(sol) == 1 and sol[0].is_integer and sol[0] > 0:
            return f"{syms[0]} {sol[0]} in the checkpoint, {int(number(syms[0]))} in the model"
    return f"{expr} is {theirs} in the checkpoint, {ours[i]} in the model"


def _dims(shape) -> str:
    return " × ".join(map(str, shape)) if len(shape) else "a scalar"


def _few(names: list[str]) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def _natural(name: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _kind(layer) -> str:
    return {S.Embedding: "`embedding`", S.Positional: "`positional`", S.LMHead: "`lm_head`", S.Norm: "norms",
            S.Attention: "`attention`", S.MLP: "`mlp`", S.MoE: "`moe`"}.get(type(layer), "layers")
