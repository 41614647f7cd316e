"""`layernorm(hidden)` (with bias) and `rmsnorm(hidden)` (scale only) over the last dim; `rmsnorm(hidden,
zero_centered = true)` scales by (1 + weight), the weight starting at zero, in fp32 (Gemma's RMSNorm)."""
from __future__ import annotations

from dataclasses import dataclass

from compiler.binder import Param, arg_span, to_bool, to_float, to_size
from compiler.diagnostics import Span
from compiler.symbols import Size


@dataclass(frozen=True, kw_only=True)
class Norm:
    """LayerNorm (with bias) or RMSNorm (scale only) over the last dim."""
    kind: str  # "layernorm" | "rmsnorm"
    hidden: Size
    eps: float
    span: Span
    zero_centered: bool = False
    """RMSNorm scaled by (1 + weight), the weight starting at zero, computed in fp32 (Gemma's RMSNorm;
    Megatron-Core's zero-centred gamma)."""


SPEC = Norm
LEAF = "norm"  # its leaf's name: norm (norm_1, norm_2, ... where a segment holds several)
SCHEMA = {"layernorm": {"hidden": Param(to_size, doc="model width"), "eps": Param(to_float, 1e-5, "epsilon")},
          "rmsnorm": {"hidden": Param(to_size, doc="model width"), "eps": Param(to_float, 1e-6, "epsilon"),
                      "zero_centered": Param(to_bool, False, "scale by (1 + weight), the weight starting at zero "
                                                           "(Gemma)")}}
TP_ROLES: dict = {}  # replicated; its gradients are partial over tp under sequence parallelism


def resolve(c, st, a: dict, kind: str):
    if a["eps"] is not None and a["eps"] <= 0:  # a row of zeros (padding, a dead unit) would divide by zero
        c.error("E0120", f"{kind}'s eps must be positive", arg_span(st, 1, "eps"), label="divides by the root of "
                "the variance plus eps", help=f"the usual value is `eps = {SCHEMA[kind]['eps'].default:g}`")
    return Norm(kind=kind, hidden=a["hidden"], eps=a["eps"], span=st.span, zero_centered=a.get("zero_centered", False))


def build(seg, x: Norm, name: str):
    """The single-device layer, one leaf `name` of compiler/model.py's Segment `seg`: returns its run(segment, x) ->
    x; torch is imported here (the checker reads this module)."""
    from torch import nn

    from runtime.layers import ZeroCenteredRMSNorm

    n = seg.number(x.hidden)
    mod = (nn.LayerNorm(n, eps=x.eps) if x.kind == "layernorm" else
           ZeroCenteredRMSNorm(n, eps=x.eps) if x.zero_centered else nn.RMSNorm(n, eps=x.eps))
    name = seg.leaf(name, mod, {"weight": (x.hidden,), "bias": (x.hidden,)}, x.span)
    return lambda seg, t: getattr(seg, name)(t)
