"""`layernorm(hidden)` (with bias) and `rmsnorm(hidden)` (scale only) over the last dim; `rmsnorm(hidden,
zero_centered = true)` scales by (1 + weight), the weight starting at zero, in fp32 (Gemma's RMSNorm)."""
from __future__ import annotations

from compiler import spec as S
from compiler.binder import Param, arg_span, to_bool, to_float, to_size

SPEC = S.Norm
SCHEMA = {"layernorm": {"hidden": Param(to_size, doc="model width"), "eps": Param(to_float, 1e-5, "epsilon")},
          "rmsnorm": {"hidden": Param(to_size, doc="model width"), "eps": Param(to_float, 1e-6, "epsilon"),
                      "zero_centered": Param(to_bool, False, "scale by (1 + weight), the weight starting at zero "
                                                           "(Gemma)")}}
TP_ROLES: dict = {}  # replicated; its gradients are partial over tp under sequence parallelism


def resolve(c, st, a: dict, kind: str):
    if a["eps"] is not None and a["eps"] <= 0:  # a row of zeros (padding, a dead unit) would divide by zero
        c.error("E0120", f"{kind}'s eps must be positive", arg_span(st, 1, "eps"), label="divides by the root of "
                "the variance plus eps", help=f"the usual value is `eps = {SCHEMA[kind]['eps'].default:g}`")
    return S.Norm(kind=kind, hidden=a["hidden"], eps=a["eps"], span=st.span, zero_centered=a.get("zero_centered", False))
