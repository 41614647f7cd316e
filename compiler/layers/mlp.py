"""`mlp(hidden, ffn, act, bias)`: GELU (`up`, `down`), or gated (`gate`, `up`, `down`): SwiGLU, silu(gate) · up
(Llama), or GeGLU, gelu(gate) · up with gelu's tanh approximation (Gemma's gelu_pytorch_tanh)."""
from __future__ import annotations

from dataclasses import dataclass

from compiler.binder import Param, to_bool, one_of, to_size
from compiler.diagnostics import Span
from compiler.symbols import Size


@dataclass(frozen=True, kw_only=True)
class MLP:
    """Two-layer MLP: GELU (`up`, `down`), or gated, SwiGLU or GeGLU (`gate`, `up`, `down`)."""
    hidden: Size
    ffn: Size
    act: str  # "gelu" | "swiglu" | "geglu" (gelu with tanh approximation of the gate, times up: Gemma)
    bias: bool
    span: Span


SPEC = MLP
LEAF = "mlp"  # its leaves' prefix: mlp_up, mlp_gate, mlp_down
SCHEMA = {"mlp": {"hidden": Param(to_size, doc="model width"), "ffn": Param(to_size, doc="inner width"),
                  "act": Param(one_of("gelu", "swiglu", "geglu"), "gelu", "activation"),
                  "bias": Param(to_bool, True, "biases on the projections")}}
TP_ROLES = {"up": "column", "gate": "column", "down": "row"}


def resolve(c, st, a: dict, kind: str):
    return MLP(hidden=a["hidden"], ffn=a["ffn"], act=a["act"], bias=a["bias"], span=st.span)


def build(seg, m: MLP, p: str):
    """The single-device layer (compiler/model.py's Segment `seg` holds its leaves `{p}_up`, `{p}_gate`, `{p}_down`):
    returns its run(segment, x) -> x; torch is imported here (the checker reads this module)."""
    import torch.nn.functional as F

    up = seg.linear(f"{p}_up", m.hidden, m.ffn, m.bias, m.span)
    if m.act in ("swiglu", "geglu"):
        gate = seg.linear(f"{p}_gate", m.hidden, m.ffn, m.bias, m.span)
    down = seg.linear(f"{p}_down", m.ffn, m.hidden, m.bias, m.span)
    seg.residual_out.append(down)

    if m.act == "gelu":
        def run(seg, x_BSH):
            return getattr(seg, down)(F.gelu(getattr(seg, up)(x_BSH)))
    elif m.act == "geglu":  # gelu's tanh approximation, as Gemma's gelu_pytorch_tanh
        def run(seg, x_BSH):
            return getattr(seg, down)(F.gelu(getattr(seg, gate)(x_BSH), approximate="tanh")
                                      * getattr(seg, up)(x_BSH))
    else:
        def run(seg, x_BSH):
            return getattr(seg, down)(F.silu(getattr(seg, gate)(x_BSH)) * getattr(seg, up)(x_BSH))
    return run
