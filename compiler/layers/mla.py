"""`mla(hidden, heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, ...)`: multi-head
latent attention, DeepSeek-V2/V3's (transformers' DeepseekV3Attention, its leaves named after Hugging Face's):

  q        = q_b(rmsnorm(q_a(x)))            or q(x) without `q_lora_rank` (DeepSeek-V2-Lite)
  latent   = kv_a(x)                         kv_lora_rank + qk_rope_head_dim wide
  k_rope   = rotary(latent[kv_lora_rank:])   one key part of qk_rope_head_dim shared by every head
  k, v     = kv_b(rmsnorm(latent[:kv_lora_rank]))   per head qk_nope_head_dim and v_head_dim
  y        = o(causal attention of (q_nope, rotary(q_rope)) over (k_nope, k_rope), v), scores / √(nope + rope)

The rotary pairs are interleaved (dimensions 2i, 2i + 1) as DeepSeek's checkpoints have them (transformers'
rope_interleave, its default); `rope_interleave = false` turns the halves. `rope_scaling = yarn(...)` scales them
as DeepSeek-V2/V3's releases do (runtime/rotary.py): YaRN's frequencies and cos/sin factor, and the softmax scale
multiplied by mscale(factor, mscale_all_dim)² (transformers' yarn_apply_mscale).
Under tp its heads are split: q (or q_b) and kv_b are column-parallel, o row-parallel; q_a, kv_a and the latents'
norms are replicated, the shared rotary key entering each rank's heads whole (its gradient summed over tp)."""
from __future__ import annotations

from dataclasses import dataclass

from compiler.binder import Param, arg_span, to_bool, call_of, to_float, to_size
from compiler.diagnostics import Span
from compiler.layers.attention import ROPE_SCALINGS, scaling_tuple
from compiler.symbols import Size


@dataclass(frozen=True, kw_only=True)
class MLA:
    """Multi-head latent attention (DeepSeek-V2/V3): queries through a low-rank bottleneck (q_a, its norm, q_b; or
    one q projection without `q_lora_rank`), keys and values from a shared latent (kv_a to kv_lora_rank plus one
    rotary key of qk_rope_head_dim shared by every head, the latent normed, then kv_b to heads × (qk_nope_head_dim +
    v_head_dim)), causal attention scaled by 1/√(qk_nope_head_dim + qk_rope_head_dim), o from heads × v_head_dim."""
    hidden: Size
    heads: Size
    kv_lora_rank: Size
    qk_nope_head_dim: Size
    qk_rope_head_dim: Size
    v_head_dim: Size
    span: Span
    q_lora_rank: Size | None = None
    """The queries' bottleneck (DeepSeek-V3: 1536); None: q projected from hidden directly (DeepSeek-V2-Lite)."""
    rope_theta: float = 10000.0
    """The rotary base of the shared key and each query's rotary part."""
    rope_interleave: bool = True
    """Rotary pairs are adjacent dimensions (2i, 2i + 1), as DeepSeek's weights lay them out (transformers'
    rope_interleave); false: the halves (i, i + R/2)."""
    norm_eps: float = 1e-6
    """The epsilon of the q and kv latents' RMS norms."""
    rope_scaling: tuple | None = None
    """YaRN's scaling of the rotation, ("yarn", factor, original_seq, beta_fast, beta_slow, mscale, mscale_all_dim,
    attention_factor, truncate) (runtime/rotary.py); None: unscaled."""


SPEC = MLA
LEAF = "attn"  # an attention: its leaves are numbered with `attention`'s (attn_qa, attn_kvb, ...)
SCHEMA = {"mla": {"hidden": Param(to_size, doc="model width"), "heads": Param(to_size, doc="attention heads"),
                  "q_lora_rank": Param(to_size, None, "the queries' low-rank bottleneck (default: q projected from "
                                                    "hidden directly, DeepSeek-V2-Lite)"),
                  "kv_lora_rank": Param(to_size, doc="the compressed key/value latent's width"),
                  "qk_nope_head_dim": Param(to_size, doc="each head's query/key width without rotary embeddings"),
                  "qk_rope_head_dim": Param(to_size, doc="each head's rotary query/key width (the key part shared by "
                                                       "every head)"),
                  "v_head_dim": Param(to_size, doc="each head's value width"),
                  "rope_theta": Param(to_float, 10000.0, "the rotary base"),
                  "rope_interleave": Param(to_bool, True, "rotary pairs are adjacent dimensions (DeepSeek's layout); "
                                                        "false: the two halves"),
                  "norm_eps": Param(to_float, 1e-6, "the latents' RMS norms' epsilon"),
                  "rope_scaling": Param(call_of({"yarn": ROPE_SCALINGS["yarn"]}, "rope scaling",
                                                 none_is_absent=True), None,
                                        "YaRN scaling of the rotary embeddings, yarn(...) (DeepSeek-V2/V3's long "
                                        "context); none: unscaled")}}
TP_ROLES = {"q": "column", "qb": "column", "kvb": "column", "o": "row"}  # qa, kva, their norms: replicated


def resolve(c, st, a: dict, kind: str):
    ok = True
    rope = c.number(a["qk_rope_head_dim"])
    if rope % 2:
        c.error("E0206", f"rotary embeddings turn pairs of a head's dimensions, but qk_rope_head_dim is {rope} (odd)",
                arg_span(st, 5, "qk_rope_head_dim"), label=f"rotary width {rope}",
                help="choose an even rotary width (DeepSeek-V2/V3: 64)")
        ok = False
    if a["rope_theta"] <= 0:
        c.error("E0120", "mla's rope_theta must be positive", arg_span(st, 7, "rope_theta"),
                label="the rotary base", help="DeepSeek-V3 uses `rope_theta = 10000`")
        ok = False
    if a["norm_eps"] <= 0:
        c.error("E0120", "norm_eps must be positive", arg_span(st, 9, "norm_eps"),
                label="divides by the root of the mean square plus eps",
                help="the usual value is `norm_eps = 1e-6` (DeepSeek's rms_norm_eps)")
        ok = False
    scaling = None if a["rope_scaling"] is None else scaling_tuple(c, st, 10, a["rope_scaling"])
    if not ok or (a["rope_scaling"] is not None and scaling is None):
        return None
    return MLA(hidden=a["hidden"], heads=a["heads"], q_lora_rank=a["q_lora_rank"], kv_lora_rank=a["kv_lora_rank"],
               qk_nope_head_dim=a["qk_nope_head_dim"], qk_rope_head_dim=a["qk_rope_head_dim"],
               v_head_dim=a["v_head_dim"], rope_theta=a["rope_theta"], rope_interleave=a["rope_interleave"],
               norm_eps=a["norm_eps"], rope_scaling=scaling, span=st.span)


def build(seg, a: MLA, p: str):
    """The single-device layer (compiler/model.py's Segment `seg` holds its leaves): leaves `{p}_qa`, `{p}_qa_norm`,
    `{p}_qb` (or `{p}_q`), `{p}_kva`, `{p}_kva_norm`, `{p}_kvb`, `{p}_o`, Hugging Face's q_a_proj, q_a_layernorm,
    q_b_proj (q_proj), kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj; the heads' attention one traced call
    (runtime.attention.latent). Returns its run(segment, x) -> x; torch is imported here (the checker reads this
    module)."""
    from torch import nn

    from compiler.layers.calls import kept_whole
    from runtime import attention as RA

    latent = kept_whole(RA.latent)
    nope, rope, vd = a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim
    q_width, kv_width = seg.number(nope + rope), seg.number(nope + vd)
    if a.q_lora_rank is None:
        q = seg.linear(f"{p}_q", a.hidden, a.heads * (nope + rope), False, a.span)
        qa = qn = None
    else:
        qa = seg.linear(f"{p}_qa", a.hidden, a.q_lora_rank, False, a.span)
        qn = seg.leaf(f"{p}_qa_norm", nn.RMSNorm(seg.number(a.q_lora_rank), eps=a.norm_eps),
                      {"weight": (a.q_lora_rank,)}, a.span)
        q = seg.linear(f"{p}_qb", a.q_lora_rank, a.heads * (nope + rope), False, a.span)
    kva = seg.linear(f"{p}_kva", a.hidden, a.kv_lora_rank + rope, False, a.span)
    kvn = seg.leaf(f"{p}_kva_norm", nn.RMSNorm(seg.number(a.kv_lora_rank), eps=a.norm_eps),
                   {"weight": (a.kv_lora_rank,)}, a.span)
    kvb = seg.linear(f"{p}_kvb", a.kv_lora_rank, a.heads * (nope + vd), False, a.span)
    o = seg.linear(f"{p}_o", a.heads * vd, a.hidden, False, a.span)
    seg.residual_out.append(o)
    n_nope, n_rope, rank = seg.number(nope), seg.number(rope), seg.number(a.kv_lora_rank)
    theta, interleaved = a.rope_theta, a.rope_interleave
    kw = ({} if interleaved else {"interleaved": False}) | ({} if a.rope_scaling is None else
                                                            {"scaling": a.rope_scaling})

    def run(seg, x_BSH):
        h_BSX = x_BSH if qa is None else getattr(seg, qn)(getattr(seg, qa)(x_BSH))
        q_BHSQ = getattr(seg, q)(h_BSX).unflatten(-1, (-1, q_width)).transpose(1, 2)
        c_BSL, kr_BSR = getattr(seg, kva)(x_BSH).split([rank, n_rope], dim=-1)
        kv_BHSW = getattr(seg, kvb)(getattr(seg, kvn)(c_BSL)).unflatten(-1, (-1, kv_width)).transpose(1, 2)
        y_BHSV = latent(q_BHSQ, kv_BHSW, kr_BSR, n_nope, theta, **kw)
        return getattr(seg, o)(y_BHSV.transpose(1, 2).flatten(2))
    return run
