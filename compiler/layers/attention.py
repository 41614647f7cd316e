"""`attention(hidden, heads, kv_heads, bias, ..., head_dim, qk_norm, window)`: causal multi-head self-attention
(grouped-query when kv_heads < heads), over every earlier token or, with `window = W`, over the token itself and
the W - 1 before it (Mistral 7B's sliding window; runtime/attention.py). Each head is D = `head_dim` wide (default hidden / heads; Qwen 3 and
Mistral-Nemo choose their own, so q is heads·D wide and o maps heads·D back to hidden). `qk_norm = rmsnorm`
normalises each head's query and key over D before the rotation (Qwen 3), with one scale of D shared by every head
(`zero_centered_rmsnorm`: scaled by 1 + weight, Gemma 3). `softcap = C` caps each score to (-C, C) as C·tanh(s / C)
before the mask and softmax (Gemma 2); `query_scale = Q` divides the scores by √Q instead of √D (Gemma's
query_pre_attn_scalar).
Under tp its heads are split: q, k and v are column-parallel (heads/tp · D each), o is row-parallel; the q/k norms'
scales are replicated, each rank's gradient covering only its heads (summed over tp)."""
from __future__ import annotations

from dataclasses import dataclass, field

from compiler.binder import Param, arg_span, to_bool, call_of, one_of, divisors_near, to_float, to_size
from compiler.diagnostics import Span
from compiler.symbols import Size


@dataclass(frozen=True, kw_only=True)
class Attention:
    """Causal multi-head self-attention; `kv_heads` < `heads` gives grouped-query attention."""
    hidden: Size
    heads: Size
    kv_heads: Size
    bias: bool
    span: Span
    qkv_bias: bool | None = None
    """Biases on q, k and v (Qwen 2: true with `bias = false`); None: as `bias`."""
    rope_theta: float = 0.0
    """Rotary position embeddings' base (runtime/rotary.py); 0: none."""
    rope_scaling: tuple | None = None
    """Llama 3's frequency scaling: (factor, low_freq_factor, high_freq_factor, original_seq); linear scaling (every
    frequency divided by factor, Gemma 3's global layers): (factor,); YaRN's: ("yarn", factor, original_seq,
    beta_fast, beta_slow, mscale, mscale_all_dim, attention_factor, truncate); or None."""
    head_dim: Size | None = None
    """Each head's width D (Qwen 3, Mistral-Nemo, Gemma: not hidden / heads); None: hidden / heads."""
    qk_norm: str = "none"
    """"rmsnorm": each head's query and key normalised over D before the rotation (Qwen 3, OLMo 2), one scale of D
    shared by every head; "zero_centered_rmsnorm": the same scaled by (1 + weight) (Gemma 3); "none"."""
    qk_norm_eps: float = 1e-6
    """The q/k norm's epsilon (Qwen 3: its rms_norm_eps)."""
    window: Size | None = None
    """Sliding-window attention (Mistral 7B, Qwen 2's upper layers): each query sees itself and the window - 1
    keys before it; None: every earlier key (full causal)."""
    window_span: Span | None = field(default=None, compare=False, repr=False)
    """Where `window` is written (a warning that it has no effect points there)."""
    softcap: float | None = None
    """Attention scores soft-capped to (-C, C) before the softmax, C·tanh(s / C) (Gemma 2's
    attn_logit_softcapping); None: not capped."""
    query_scale: Size | None = None
    """Scores are q·k / √query_scale instead of / √D (Gemma's query_pre_attn_scalar); None: D."""

    @property
    def head_width(self):
        """D: `head_dim` when written, else hidden / heads (the expression every model before head_dim had, so
        their formulas and generated programs are unchanged)."""
        return self.hidden / self.heads if self.head_dim is None else self.head_dim


SPEC = Attention
LEAF = "attn"  # its leaves' prefix: attn_q, attn_k, ... (numbered attn_1_q, ... where a segment holds several)
ROPE_SCALINGS = {"llama3": {"factor": Param(to_float, 8.0, "how much longer the context is than trained"),
                            "low_freq_factor": Param(to_float, 1.0, "wavelengths beyond original_seq / this are scaled"),
                            "high_freq_factor": Param(to_float, 4.0, "wavelengths below original_seq / this are kept"),
                            "original_seq": Param(to_size, 8192, "the context length trained before scaling")},
                 "linear": {"factor": Param(to_float, 8.0, "every frequency divided by it (positions interpolated): "
                                                        "Gemma 3's global layers")},
                 # YaRN (Peng et al. 2023) as transformers computes it (runtime/rotary.py): Qwen 2.5/3's long
                 # context, DeepSeek-V2/V3's `mla`
                 "yarn": {"factor": Param(to_float, doc="how much longer the context is than trained"),
                          "original_seq": Param(to_size, doc="the context length trained before scaling"),
                          "beta_fast": Param(to_float, 32.0, "frequencies turning more than this many times over "
                                                           "original_seq are kept"),
                          "beta_slow": Param(to_float, 1.0, "frequencies turning fewer than this many times over "
                                                          "original_seq are divided by factor"),
                          "mscale": Param(to_float, 0.0, "the cos/sin factor's numerator mscale(factor, mscale) "
                                                       "(DeepSeek's; 0: none)"),
                          "mscale_all_dim": Param(to_float, 0.0, "its denominator mscale(factor, mscale_all_dim); "
                                                               "`mla` also multiplies its softmax scale by its "
                                                               "square (DeepSeek's; 0: none)"),
                          "attention_factor": Param(to_float, None, "the cos/sin factor itself (default: from factor, "
                                                                  "mscale and mscale_all_dim)"),
                          "truncate": Param(to_bool, True, "the ramp's ends rounded to whole dimensions")}}


def scaling_tuple(c, st, index: int, call) -> tuple | None:
    """The spec's rope_scaling of a bound `rope_scaling = kind(...)` (runtime/rotary.py reads it), or None after
    reporting an argument no rotation can use (E0120)."""
    kind_of, s = call
    if kind_of == "linear":
        return (s["factor"],)
    if kind_of == "llama3":
        return (s["factor"], s["low_freq_factor"], s["high_freq_factor"], float(c.number(s["original_seq"])))
    ok = True
    for key, why in (("factor", "every low frequency is divided by it"), ("beta_fast", "a number of turns"),
                     ("beta_slow", "a number of turns"), ("attention_factor", "multiplies the cosines and sines")):
        if s[key] is not None and s[key] <= 0:
            c.error("E0120", f"yarn's {key} must be positive", arg_span(st, index, "rope_scaling"), label=why,
                    help="DeepSeek-V3: `yarn(factor = 40, original_seq = 4096, beta_fast = 32, beta_slow = 1, "
                         "mscale = 1, mscale_all_dim = 1)`")
            ok = False
    if not ok:
        return None
    return ("yarn", s["factor"], float(c.number(s["original_seq"])), s["beta_fast"], s["beta_slow"], s["mscale"],
            s["mscale_all_dim"], s["attention_factor"], s["truncate"])
SCHEMA = {"attention": {"hidden": Param(to_size, doc="model width"), "heads": Param(to_size, doc="attention heads"),
                        "kv_heads": Param(to_size, lambda a: a["heads"], "key/value heads (grouped-query attention)"),
                        "bias": Param(to_bool, True, "biases on the projections"),
                        "qkv_bias": Param(to_bool, lambda a: a["bias"], "biases on q, k and v only (Qwen 2)"),
                        "rope_theta": Param(to_float, 0.0, "rotary position embeddings' base (0: none)"),
                        "rope_scaling": Param(call_of(ROPE_SCALINGS, "rope scaling", none_is_absent=True), None,
                                              "frequency scaling of the rotary embeddings: llama3(...), linear(factor) "
                                              "or yarn(...); none: unscaled"),
                        "head_dim": Param(to_size, None, "each head's width D (default hidden / heads)"),
                        "qk_norm": Param(one_of("none", "rmsnorm", "zero_centered_rmsnorm"), "none",
                                         "rmsnorm: each head's q and k normalised over D before the rotation (Qwen 3);"
                                         " zero_centered_rmsnorm: scaled by 1 + weight (Gemma 3)"),
                        "qk_norm_eps": Param(to_float, 1e-6, "the q/k norm's epsilon"),
                        "window": Param(to_size, None, "sliding window: each query sees itself and the window - 1 "
                                                     "keys before it (default: every earlier key)"),
                        "softcap": Param(to_float, None, "scores capped to (-C, C) as C·tanh(s / C) before the softmax "
                                                       "(Gemma 2)"),
                        "query_scale": Param(to_size, None, "scores divided by √query_scale instead of √head_dim "
                                                          "(Gemma's query_pre_attn_scalar)")}}
TP_ROLES = {"q": "column", "k": "column", "v": "column", "o": "row"}  # q_norm, k_norm (suffix `norm`): replicated


def resolve(c, st, a: dict, kind: str):
    h, n, kv = (c.number(a[k]) for k in ("hidden", "heads", "kv_heads"))
    d = None if a["head_dim"] is None else c.number(a["head_dim"])
    ok = True
    if d is None and h % n:
        c.error("E0201", f"{n} heads do not divide hidden size {h}", arg_span(st, 1, "heads"),
                label=f"{h} % {n} == {h % n}",
                help="heads must divide hidden; divisors near it: " + divisors_near(int(h), int(n)))
        ok = False
    if n % kv:
        c.error("E0202", f"{kv} key/value heads do not divide {n} heads", arg_span(st, 2, "kv_heads"),
                label=f"{n} % {kv} == {n % kv}",
                help="each key/value head serves a whole group of query heads; choose one of: "
                     + divisors_near(int(n), int(kv)))
        ok = False
    if a["rope_scaling"] is not None and not a["rope_theta"]:
        c.error("E0132", "rope_scaling scales rotary embeddings, but this attention has none (rope_theta = 0)",
                arg_span(st, 6, "rope_scaling"), label="nothing to scale",
                help="add the rotary base, e.g. `rope_theta = 500000` (Llama 3), or remove `rope_scaling`")
        ok = False
    width = d if d is not None else (h // n if not h % n else None)
    if a["rope_theta"] and width is not None and width % 2:
        where = arg_span(st, 7, "head_dim") if d is not None else arg_span(st, 1, "heads")
        c.error("E0206", f"rotary embeddings turn pairs of a head's dimensions, but a head is {width} wide (odd)",
                where, label=f"head dimension {width}" + ("" if d is not None else f" = {h} / {n}"),
                help="choose an even head dimension (64 and 128 are usual), or remove `rope_theta`")
        ok = False
    if a["qk_norm_eps"] is not None and a["qk_norm_eps"] <= 0:
        c.error("E0120", "qk_norm_eps must be positive", arg_span(st, 9, "qk_norm_eps"),
                label="divides by the root of the mean square plus eps",
                help="the usual value is `qk_norm_eps = 1e-6` (Qwen 3's rms_norm_eps)")
        ok = False
    written = {arg.name.id for arg in st.args if arg.name is not None} | {k for k, arg in zip(SCHEMA[kind], st.args)
                                                                          if arg.name is None}
    if "qkv_bias" in written and a["qkv_bias"] == a["bias"]:
        c.warn("W0137", f"qkv_bias = {str(a['qkv_bias']).lower()} is what `bias = {str(a['bias']).lower()}` gives "
               "q, k and v already", arg_span(st, 4, "qkv_bias"), label="has no effect",
               help="qkv_bias differs from bias only for q, k and v (Qwen 2: `bias = false, qkv_bias = true`); "
                    "remove it")
    if "qk_norm_eps" in written and a["qk_norm"] == "none":
        c.warn("W0143", "qk_norm_eps is the epsilon of a q/k norm, but this attention has none (qk_norm = none)",
               arg_span(st, 9, "qk_norm_eps"), label="has no effect",
               help="add `qk_norm = rmsnorm` (Qwen 3), or remove `qk_norm_eps`")
    if a["softcap"] is not None and a["softcap"] <= 0:
        c.error("E0120", "attention's softcap must be positive", arg_span(st, 11, "softcap"),
                label="scores are capped to (-softcap, softcap)",
                help="Gemma 2 caps its attention scores at `softcap = 50`; remove it for uncapped scores")
        ok = False
    if a["query_scale"] is not None and width is not None and c.number(a["query_scale"]) == width:
        c.warn("W0208", f"query_scale = {width} is the head width: scores are divided by √{width} already",
               arg_span(st, 12, "query_scale"), label="has no effect",
               help="query_scale differs from the head width only in Gemma 2 27B (query_pre_attn_scalar 144, "
                    "head_dim 128); remove it")
    scaling = None if a["rope_scaling"] is None else scaling_tuple(c, st, 6, a["rope_scaling"])
    if not ok or (a["rope_scaling"] is not None and scaling is None):
        return None
    return Attention(hidden=a["hidden"], heads=a["heads"], kv_heads=a["kv_heads"], bias=a["bias"], span=st.span,
                     qkv_bias=a["qkv_bias"], rope_theta=a["rope_theta"], rope_scaling=scaling,
                     head_dim=a["head_dim"], qk_norm=a["qk_norm"], qk_norm_eps=a["qk_norm_eps"],
                     window=a["window"], window_span=None if a["window"] is None else arg_span(st, 10, "window"),
                     softcap=a["softcap"], query_scale=a["query_scale"])


def build(seg, a: Attention, p: str):
    """The single-device layer (compiler/model.py's Segment `seg` holds its leaves): leaves `{p}_q`, `{p}_k`, `{p}_v`,
    `{p}_o` (and `{p}_q_norm`, `{p}_k_norm`); returns its run(segment, x) -> x. torch is imported here, not at the
    top: the checker reads this module."""
    import torch.nn.functional as F
    from torch import nn

    from compiler.layers.calls import kept_whole
    from runtime import attention as RA, packed as RP, rotary
    from runtime.layers import ZeroCenteredRMSNorm

    # Traced as one call each (runtime/attention.py's kernels, the rotation; packed documents' runtime/packed.py)
    sliding_window, softcapped = kept_whole(RA.sliding_window), kept_whole(RA.softcapped)
    packed_attention, packed_rotate, rotate = kept_whole(RP.attention), kept_whole(RP.rotate), kept_whole(rotary.rotate)

    hd = a.head_width  # D: hidden / heads unless the attention gives its heads their own width
    head_dim = seg.number(hd)
    qkv_bias = a.bias if a.qkv_bias is None else a.qkv_bias
    q = seg.linear(f"{p}_q", a.hidden, a.heads * hd, qkv_bias, a.span)
    k = seg.linear(f"{p}_k", a.hidden, a.kv_heads * hd, qkv_bias, a.span)
    v = seg.linear(f"{p}_v", a.hidden, a.kv_heads * hd, qkv_bias, a.span)
    o = seg.linear(f"{p}_o", a.heads * hd, a.hidden, a.bias, a.span)
    seg.residual_out.append(o)
    qn = kn = None
    if a.qk_norm != "none":  # one scale of D, shared by every head (Qwen 3's q_norm, k_norm; Gemma 3's (1 + w))
        norm = ZeroCenteredRMSNorm if a.qk_norm == "zero_centered_rmsnorm" else nn.RMSNorm
        qn, kn = (seg.leaf(f"{p}_{w}_norm", norm(head_dim, eps=a.qk_norm_eps), {"weight": (hd,)}, a.span)
                  for w in ("q", "k"))
    gqa = seg.number(a.kv_heads) != seg.number(a.heads)
    theta, scaling = a.rope_theta, a.rope_scaling
    # A window at least as long as the sequences masks nothing the causal mask keeps (check's W0207): the plain
    # causal kernel, so the program is the one without it.
    window = None if a.window is None or seg.number(a.window) >= seg.number(seg.spec.train.seq_len) \
        else seg.number(a.window)
    # Scores over √query_scale instead of √D (Gemma): written into the call only where it differs from D.
    scale = {} if a.query_scale is None or seg.number(a.query_scale) == head_dim else \
        {"scale": seg.number(a.query_scale) ** -0.5}
    softcap = a.softcap
    # Packed documents (runtime/packed.py): block-diagonal causal attention, rotary positions restarting at each
    # document; windows and soft caps are refused with them (compiler/rules/packed.py).
    packed = seg.spec.train.data.document_separator is not None

    def heads(seg, x_BSH, linear, norm):
        # Heads are split off the last dim: (B, S, H*D) -> (B, S, H, D), normalised per head, -> (B, H, S, D).
        t_BSHD = getattr(seg, linear)(x_BSH).unflatten(-1, (-1, head_dim))
        if norm is not None:
            t_BSHD = getattr(seg, norm)(t_BSHD)
        return t_BSHD.transpose(1, 2)

    def run(seg, x_BSH):
        q_BHSD, k_BKSD, v_BKSD = heads(seg, x_BSH, q, qn), heads(seg, x_BSH, k, kn), heads(seg, x_BSH, v, None)
        if theta:
            q_BHSD, k_BKSD = (packed_rotate if packed else rotate)(q_BHSD, k_BKSD, theta, scaling)
        if packed:
            y_BHSD = packed_attention(q_BHSD, k_BKSD, v_BKSD, gqa, **scale)
        elif softcap is not None:  # scores capped before the mask and softmax (one traced call: runtime/attention.py)
            y_BHSD = softcapped(q_BHSD, k_BKSD, v_BKSD, softcap, window, gqa, **scale)
        elif window is None:
            y_BHSD = F.scaled_dot_product_attention(q_BHSD, k_BKSD, v_BKSD, is_causal=True, enable_gqa=gqa,
                                                    **scale)
        else:  # the token itself and the window - 1 before it (one traced call: runtime/attention.py)
            y_BHSD = sliding_window(q_BHSD, k_BKSD, v_BKSD, window, gqa, **scale)
        return getattr(seg, o)(y_BHSD.transpose(1, 2).flatten(2))
    return run
