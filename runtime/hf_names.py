"""Hugging Face's names of our parameters (the Llama, Mistral, Qwen 2, Qwen 3, Phi-3, Mixtral, Qwen2-MoE and
Qwen3-MoE layouts): the one map the runtime reads a checkpoint by (runtime/hf.py), `scalec export` writes one by
(compiler/export.py) and `scalec check` holds an `init = from(...)` checkpoint's headers against
(compiler/hf_header.py), so that what is checked is what the program reads. No torch: `scalec check` imports it.

Ours are the single-device model's names (`blocks.7.attn_q.weight`), Hugging Face's `model.layers.7.self_attn.
q_proj.weight`, for the block layout `.scale` files of these families write (`norm_1`, `attn_*`, `norm_2`, then
`mlp_*` or `moe_*`; Qwen 3's per-head q/k norms are `attn_q_norm`, `attn_k_norm`). Mixtral's experts are separate
matrices per expert (`block_sparse_moe.experts.j.w1|w2|w3`); ours are stacked over experts, so a stacked name needs
the expert.

Two layouts name a `moe`: Mixtral's (`block_sparse_moe.gate`, `.experts.j.w1|w2|w3`) and Qwen-MoE's (`mlp.gate`,
`mlp.experts.j.gate_proj|up_proj|down_proj`, and Qwen2-MoE's shared expert `mlp.shared_expert.*_proj` with its
sigmoid gate `mlp.shared_expert_gate`; Qwen3-MoE's has no shared expert). A checkpoint says which it is by its names
(`moe_layout`); an export by the architecture it writes.

Phi-3's checkpoints fuse what ours keep apart: `self_attn.qkv_proj` holds q's rows, then k's, then v's (heads · D,
kv_heads · D, kv_heads · D), and `mlp.gate_up_proj` the gate's rows, then the up projection's. Our `attn_q` is then
rows [0, q) of qkv_proj, `attn_k` rows [q, q + k), and so on (`fused_rows`): the runtime reads only the rows of its
part (a tp shard of q is a row range inside q's), `check` holds the fused tensor's shape against the sum of its
parts, export concatenates them back (`fused`). A checkpoint says it is fused by its names (`layout`: PHI3 where
any layer has a qkv_proj or gate_up_proj); an export by the architecture it writes. Nothing else of Phi-3's layout
differs from Llama's.

Where a block holds several of Hugging Face's layers (Gemma 2's pairs of a windowed and a full layer, Gemma 3's five
to one), or a model has several repeats (Gemma-3-1B's 26 layers: four blocks of six, then two of one), a `stack`
says how the layers lie in our repeats: one (repeat, its first layer, layers per block, norms per layer) per repeat.
The j-th layer of block i of a repeat starting at layer f, L layers a block, is Hugging Face's layer f + i·L + j - 1,
its leaves numbered `attn_j_*`, `mlp_j_*` and its norms `norm_{(j - 1)·N + 1..j·N}` (N norms per layer: Llama's two,
input_layernorm and post_attention_layernorm; Gemma 2/3's four, pre- and post-attention, pre- and post-feedforward).
Without one, every block of `blocks` is one layer of two norms: every family before Gemma.
"""
from __future__ import annotations

import re

_TOP = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
        "lm_head.weight": "lm_head.weight"}
_LEAF = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
         "attn_o": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
         "mlp_gate": "mlp.gate_proj", "mlp_up": "mlp.up_proj",
         "mlp_down": "mlp.down_proj",
         # DeepSeek's multi-head latent attention (`mla`; its direct q, V2-Lite's, is attn_q: q_proj)
         "attn_qa": "self_attn.q_a_proj", "attn_qa_norm": "self_attn.q_a_layernorm", "attn_qb": "self_attn.q_b_proj",
         "attn_kva": "self_attn.kv_a_proj_with_mqa", "attn_kva_norm": "self_attn.kv_a_layernorm",
         "attn_kvb": "self_attn.kv_b_proj"}

# a layer's norms by their number within it, for N norms per layer
_NORMS = {2: ("input_layernorm", "post_attention_layernorm"),
          4: ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
              "post_feedforward_layernorm")}
ONE_LAYER_PER_BLOCK = (("blocks", 0, 1, 2),)
"""The stack of every family before Gemma: one repeat, `blocks`, each block one layer of two norms."""

MIXTRAL, QWEN_MOE, PHI3, DEEPSEEK = "mixtral", "qwen_moe", "phi3", "deepseek"
# per layout: the moe's leaves, and where its experts are with the name of each of our stacked weights
_MOE_LEAF = {MIXTRAL: {"moe_router": "block_sparse_moe.gate"},
             QWEN_MOE: {"moe_router": "mlp.gate", "moe_shared_gate": "mlp.shared_expert.gate_proj",
                        "moe_shared_up": "mlp.shared_expert.up_proj", "moe_shared_down": "mlp.shared_expert.down_proj",
                        "moe_shared_sigmoid": "mlp.shared_expert_gate"},
             # DeepSeek-V2/V3: shared experts as one MLP (plural name), V3's expert bias a buffer of the router
             DEEPSEEK: {"moe_router": "mlp.gate", "moe_shared_gate": "mlp.shared_experts.gate_proj",
                        "moe_shared_up": "mlp.shared_experts.up_proj", "moe_shared_down": "mlp.shared_experts.down_proj",
                        "moe_bias": "mlp.gate"}}
_EXPERTS = {MIXTRAL: ("block_sparse_moe.experts", {"w_gate": "w1", "w_down": "w2", "w_up": "w3"}),
            QWEN_MOE: ("mlp.experts", {"w_gate": "gate_proj", "w_down": "down_proj", "w_up": "up_proj"})}
_EXPERTS[DEEPSEEK] = _EXPERTS[QWEN_MOE]
# our ExpertBias's buffer (`moe_bias.bias`) is Hugging Face's `mlp.gate.e_score_correction_bias`
_BUFFER_NAMES = {("moe_bias", "bias"): "e_score_correction_bias"}


# Phi-3's fused tensors: our leaf -> (the Hugging Face module holding it, the leaves it holds, in row order)
_QKV = ("attn_q", "attn_k", "attn_v")
_GATE_UP = ("mlp_gate", "mlp_up")
_FUSED = {**{leaf: ("self_attn.qkv_proj", _QKV) for leaf in _QKV},
          **{leaf: ("mlp.gate_up_proj", _GATE_UP) for leaf in _GATE_UP}}


def layout(names) -> str:
    """The layout of a checkpoint, from its tensor names: PHI3 where any layer holds a fused `qkv_proj` or
    `gate_up_proj`, else its `moe` layout (`moe_layout`)."""
    if any(n.endswith((".self_attn.qkv_proj.weight", ".mlp.gate_up_proj.weight")) for n in names):
        return PHI3
    return moe_layout(names)


def moe_layout(names) -> str:
    """The layout of a checkpoint's `moe` layers, from its tensor names: DeepSeek's where any layer has multi-head
    latent attention (`kv_a_proj_with_mqa`) or shared experts (`mlp.shared_experts.`), Qwen-MoE's where any is under
    `mlp.experts.` or is `mlp.gate.weight`, else Mixtral's (a model without experts reads the same either way)."""
    if any(".self_attn.kv_a_proj_with_mqa." in n or ".mlp.shared_experts." in n for n in names):
        return DEEPSEEK
    return QWEN_MOE if any(".mlp.experts." in n or n.endswith(".mlp.gate.weight") for n in names) else MIXTRAL


def _place(repeat: str, block: int, leaf: str, stack) -> tuple[int, str]:
    """(Hugging Face's layer, the leaf's name within one layer) of leaf `leaf` of block `block` of `repeat`, as
    `stack` lays the layers out (module docstring): `attn_2_q` of a two-layer block is the second layer's `attn_q`,
    `norm_5` of four norms a layer its `norm_1`. KeyError for a repeat the stack has not, or a leaf past its layers."""
    entry = next((e for e in stack if e[0] == repeat), None)
    if entry is None:
        raise KeyError(f"{repeat} is not among the repeats holding Hugging Face's layers")
    _, first, per_block, norms = entry
    j = 0
    numbered = re.fullmatch(r"(attn|mlp|moe)_(\d+)_(.+)", leaf)
    norm = re.fullmatch(r"norm_(\d+)", leaf)
    if numbered:
        j, leaf = int(numbered[2]) - 1, f"{numbered[1]}_{numbered[3]}"
    elif norm:
        k = int(norm[1]) - 1
        j, leaf = k // norms, f"norm_{k % norms + 1}"
    if j >= per_block:
        raise KeyError(f"{repeat}.{block}.{leaf}: past the {per_block} layer(s) of a block")
    return first + block * per_block + j, leaf


def hf_name(name: str, expert: int | None = None, layout: str = MIXTRAL, stack=None) -> str:
    """Hugging Face's name of the tensor holding our parameter `name` (of expert `expert` for a weight stacked over
    experts, which needs one and only such a weight takes), in `layout` (MIXTRAL or QWEN_MOE: a `moe`'s names; PHI3:
    q, k, v in `qkv_proj` and gate, up in `gate_up_proj`, of which `fused_rows` gives the part), its layers laid out
    in our repeats as `stack` says (None: ONE_LAYER_PER_BLOCK); KeyError for a parameter these families do not have."""
    if name in _TOP:
        return _TOP[name]
    parts = name.split(".")
    if len(parts) != 4 or not re.fullmatch(r"blocks(_\d+)?", parts[0]) or not parts[1].isdigit():
        raise KeyError(name)
    repeat, block, leaf, what = parts
    i, leaf = _place(repeat, int(block), leaf, stack or ONE_LAYER_PER_BLOCK)
    norms = next(e[3] for e in (stack or ONE_LAYER_PER_BLOCK) if e[0] == repeat)
    if (leaf == "moe_experts") != (expert is not None):
        raise KeyError(f"{name} is stacked over experts: name one" if expert is None else
                       f"{name} is not an expert's weight")
    if leaf == "moe_experts":
        where, names = _EXPERTS[layout]
        return f"model.layers.{i}.{where}.{expert}.{names[what]}.weight"
    if layout == PHI3 and leaf in _FUSED:
        return f"model.layers.{i}.{_FUSED[leaf][0]}.{what}"
    if leaf.startswith("norm_"):
        if norms not in _NORMS:
            raise KeyError(f"{name}: {norms} norms a layer is no family's layout (two or four)")
        return f"model.layers.{i}.{_NORMS[norms][int(leaf[5:]) - 1]}.{what}"
    moe = _MOE_LEAF[layout if layout in _MOE_LEAF else MIXTRAL]  # Phi-3 has no moe: a model with one reads Mixtral's
    what = _BUFFER_NAMES.get((leaf, what), what)
    return f"model.layers.{i}.{_LEAF[leaf] if leaf in _LEAF else moe[leaf]}.{what}"


def fused(name: str, layout: str) -> tuple[str, ...] | None:
    """Our parameters that Hugging Face's tensor holding `name` fuses, in row order (`name` among them), or None when
    it holds `name` alone: in PHI3's layout `blocks.3.attn_k.weight` is in qkv_proj with blocks.3.attn_q.weight and
    blocks.3.attn_v.weight."""
    parts = name.split(".")
    if layout != PHI3 or len(parts) != 4 or parts[0] != "blocks" or parts[2] not in _FUSED:
        return None
    _, i, leaf, what = parts
    return tuple(f"blocks.{i}.{other}.{what}" for other in _FUSED[leaf][1])


def fused_rows(name: str, rows, layout: str) -> tuple[int, int, int] | None:
    """(lo, hi, total): our parameter `name` is rows [lo, hi) of dim 0 of the fused tensor `hf_name` names, whose
    rows are `total` in all; None where that tensor is `name`'s alone. `rows(ours)` gives the whole (unsharded) row
    count of each of our parameters fused with it."""
    members = fused(name, layout)
    if members is None:
        return None
    sizes = [rows(m) for m in members]
    k = members.index(name)
    lo = sum(sizes[:k])
    return lo, lo + sizes[k], sum(sizes)
