"""`mlp(hidden, ffn, act, bias)`: GELU (`up`, `down`), or gated (`gate`, `up`, `down`): SwiGLU, silu(gate) · up
(Llama), or GeGLU, gelu(gate) · up with gelu's tanh approximation (Gemma's gelu_pytorch_tanh)."""
from __future__ import annotations

from compiler import spec as S
from compiler.binder import Param, _bool, _choice, _size

SPEC = S.MLP
SCHEMA = {"mlp": {"hidden": Param(_size, doc="model width"), "ffn": Param(_size, doc="inner width"),
                  "act": Param(_choice("gelu", "swiglu", "geglu"), "gelu", "activation"),
                  "bias": Param(_bool, True, "biases on the projections")}}
TP_ROLES = {"up": "column", "gate": "column", "down": "row"}


def resolve(c, st, a: dict, kind: str):
    return S.MLP(hidden=a["hidden"], ffn=a["ffn"], act=a["act"], bias=a["bias"], span=st.span)
