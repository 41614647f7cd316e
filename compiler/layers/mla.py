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

from compiler import spec as S
from compiler.binder import Param, arg_span, to_bool, call_of, to_float, to_size
from compiler.layers.attention import ROPE_SCALINGS, scaling_tuple

SPEC = S.MLA
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
    return S.MLA(hidden=a["hidden"], heads=a["heads"], q_lora_rank=a["q_lora_rank"], kv_lora_rank=a["kv_lora_rank"],
                 qk_nope_head_dim=a["qk_nope_head_dim"], qk_rope_head_dim=a["qk_rope_head_dim"],
                 v_head_dim=a["v_head_dim"], rope_theta=a["rope_theta"], rope_interleave=a["rope_interleave"],
                 norm_eps=a["norm_eps"], rope_scaling=scaling, span=st.span)
