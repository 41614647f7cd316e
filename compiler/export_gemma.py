"""`scalec export` of a model in Gemma 2's or Gemma 3's layout (compiler/importer_gemma.py writes them): its
config.json. The weights are named as for every family (runtime/hf_names.py), the layers laid out in the repeats by
the model's stack (compiler/hf_header.stack).

The model is Gemma's when its norms are zero-centred; it is then held to the layout layer by layer: every layer
`residual { rmsnorm  attention  rmsnorm }  residual { rmsnorm  mlp(act = geglu)  rmsnorm }` with zero-centred norms of
one eps, the embedding scaled by √hidden, the attentions of two kinds (within one `window`, or over the whole
sequence) and otherwise alike. Gemma 3 when the attentions normalise q and k (zero-centred), Gemma 2 when they do
not. What has no counterpart in either is refused, naming it.
"""
from __future__ import annotations

from compiler import spec as S

SLIDING, FULL = "sliding_attention", "full_attention"


class GemmaExportError(Exception):
    """Why a zero-centred model is not Gemma 2's or Gemma 3's (one line; compiler.export raises it as its own)."""


def is_gemma(spec: S.Spec) -> bool:
    """The model uses Gemma's zero-centred norms: exported as Gemma 2 or Gemma 3, or refused."""
    return any(isinstance(x, S.Norm) and x.zero_centered for x in S.walk(spec.model.layers))


def _layers(spec: S.Spec) -> list[tuple]:
    """Each of the model's decoder layers, the repeats unrolled: (pre-attention norm, attention, post-attention
    norm, pre-MLP norm, MLP, post-MLP norm)."""
    out = []
    for rep in spec.model.blocks:
        body = list(rep.body)
        if len(body) % 2 or not all(isinstance(r, S.Residual) for r in body):
            raise GemmaExportError("each Gemma layer is two `residual`s, `{ rmsnorm  attention  rmsnorm }` then "
                                   "`{ rmsnorm  mlp  rmsnorm }`")
        block = []
        for att, ffn in zip(body[::2], body[1::2]):
            kinds = [type(x).__name__ for x in att.body] + [type(x).__name__ for x in ffn.body]
            if kinds != ["Norm", "Attention", "Norm", "Norm", "MLP", "Norm"]:
                raise GemmaExportError("each Gemma layer is `residual { rmsnorm  attention  rmsnorm }  residual { "
                                       f"rmsnorm  mlp  rmsnorm }}`, not {' / '.join(kinds)}")
            block.append((*att.body, *ffn.body))
        out += block * int(spec.value(rep.count))
    return out


def gemma_config(spec: S.Spec) -> dict:
    """config.json of a Gemma 2 or Gemma 3 (text) model, or GemmaExportError naming what does not fit."""
    m, v = spec.model, spec.value
    if any(isinstance(x, S.Positional) for x in m.layers):
        raise GemmaExportError("learned positions (`positional`) have no counterpart in Gemma (rotary embeddings)")
    if not m.embedding.scaled:
        raise GemmaExportError("Gemma scales its embeddings by √hidden: `embedding(vocab, hidden, scaled = true)`")
    layers = _layers(spec)
    if not layers:
        raise GemmaExportError("the model has no `repeat` of decoder layers")
    final = [x for x in m.body if isinstance(x, S.Norm)]
    norms = [x for layer in layers for x in layer if isinstance(x, S.Norm)] + final
    if any(n.kind != "rmsnorm" or not n.zero_centered for n in norms) or len({n.eps for n in norms}) != 1:
        raise GemmaExportError("Gemma's norms are all `rmsnorm(hidden, eps = E, zero_centered = true)`, one eps")
    atts = [layer[1] for layer in layers]
    mlps = [layer[4] for layer in layers]
    if any(x.act != "geglu" or x.bias for x in mlps) or len({v(x.ffn) for x in mlps}) != 1:
        raise GemmaExportError("Gemma's MLPs are `mlp(hidden, ffn, act = geglu, bias = false)`, one width")
    qk = {a.qk_norm for a in atts}
    gemma3 = qk == {"zero_centered_rmsnorm"}
    if qk not in ({"none"}, {"zero_centered_rmsnorm"}):
        raise GemmaExportError("Gemma 2's attentions have no q/k norms, Gemma 3's all `qk_norm = "
                               "zero_centered_rmsnorm`: not a mix, nor plain rmsnorm")

    def alike(figure, what: str):
        values = {figure(a) for a in atts}
        if len(values) != 1:
            raise GemmaExportError(f"Gemma's attentions share {what}; here they differ: {sorted(map(str, values))}")
        return values.pop()

    heads, kv, head_dim = (alike(lambda a, k=k: int(v(getattr(a, k))), k) for k in ("heads", "kv_heads",
                                                                                       "head_width"))
    bias = alike(lambda a: (a.bias, a.bias if a.qkv_bias is None else a.qkv_bias), "their biases")
    if bias[0] != bias[1]:
        raise GemmaExportError("Gemma's attention has biases on q, k, v and o alike (attention_bias)")
    scale = alike(lambda a: head_dim if a.query_scale is None else int(v(a.query_scale)), "query_scale")
    cap = alike(lambda a: a.softcap, "softcap")
    if gemma3 and cap is not None:
        raise GemmaExportError("Gemma 3 does not soft-cap its scores (attn_logit_softcapping null); q/k norms with "
                               "soft caps are neither Gemma 2 nor Gemma 3")
    kinds = [FULL if a.window is None else SLIDING for a in atts]
    windows = {int(v(a.window)) for a in atts if a.window is not None}
    if len(windows) > 1:
        raise GemmaExportError(f"Gemma's sliding layers share one window; here {sorted(windows)}")
    by_kind = {}
    for kind in (SLIDING, FULL):
        ropes = {(a.rope_theta, a.rope_scaling) for a, k in zip(atts, kinds) if k == kind}
        if len(ropes) > 1:
            raise GemmaExportError(f"Gemma's {kind} layers share one rotary base; here {sorted(map(str, ropes))}")
        by_kind[kind] = ropes.pop() if ropes else None
    for kind, rope in by_kind.items():
        if rope is not None and rope[0] <= 0:
            raise GemmaExportError("Gemma's attentions turn q and k by rotary embeddings (`rope_theta`)")
        if rope is not None and rope[1] is not None and (not gemma3 or kind == SLIDING or len(rope[1]) != 1):
            raise GemmaExportError("only Gemma 3's full layers scale their rotary frequencies, and linearly "
                                   "(`rope_scaling = linear(factor)`)")
    if not gemma3 and None not in by_kind.values() and by_kind[SLIDING] != by_kind[FULL]:
        raise GemmaExportError("Gemma 2's layers share one rotary base (rope_theta)")
    positions = int(v(m.sizes["seq"])) if "seq" in m.sizes else int(v(spec.train.seq_len))
    config = {
        "architectures": ["Gemma3ForCausalLM" if gemma3 else "Gemma2ForCausalLM"],
        "model_type": "gemma3_text" if gemma3 else "gemma2",
        "vocab_size": int(v(m.embedding.vocab)), "hidden_size": int(v(m.embedding.hidden)),
        "intermediate_size": int(v(mlps[0].ffn)), "num_hidden_layers": len(layers),
        "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim,
        "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": positions,
        "rms_norm_eps": norms[0].eps, "tie_word_embeddings": bool(m.head.tied), "attention_bias": bool(bias[0]),
        "attention_dropout": 0.0, "query_pre_attn_scalar": scale,
        "sliding_window": windows.pop() if windows else None, "layer_types": kinds,
        "attn_logit_softcapping": cap, "final_logit_softcapping": m.head.softcap, "initializer_range": 0.02,
    }
    if m.head.bias:
        raise GemmaExportError("a bias on the head (`lm_head(..., bias = true)`) has no counterpart in Gemma")
    full = by_kind[FULL] or by_kind[SLIDING]
    local = by_kind[SLIDING] or by_kind[FULL]
    if gemma3:
        config.update(rope_theta=float(full[0]), rope_local_base_freq=float(local[0]),
                      rope_scaling=None if full[1] is None else {"rope_type": "linear", "factor": full[1][0]})
    else:
        config.update(rope_theta=float(full[0]))
    return config
