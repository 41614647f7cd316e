"""`mlp(hidden, ffn, act, bias)`: GELU (`up`, `down`), or gated (`gate`, `up`, `down`): SwiGLU, silu(gate) · up
(Llama), or GeGLU, gelu(gate) · up with gelu's tanh approximation (Gemma's gelu_pytorch_tanh)."""
from __future__ import annotations

from compiler import spec as S
from compiler.binder import Param, to_bool, one_of, to_size

SPEC = S.MLP
SCHEMA = {"mlp": {"hidden": Param(to_size, doc="model width"), "ffn": Param(to_size, doc="inner width"),
                  "act": Param(one_of("gelu", "swiglu", "geglu"), "gelu", "activation"),
                  "bias": Param(to_bool, True, "biases on the projections")}}
TP_ROLES = {"up": "column", "gate": "column", "down": "row"}


def resolve(c, st, a: dict, kind: str):
    return S.MLP(hidden=a["hidden"], ffn=a["ffn"], act=a["act"], bias=a["bias"], span=st.span)
