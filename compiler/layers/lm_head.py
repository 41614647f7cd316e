"""`lm_head(vocab, hidden, tied, bias)`: projection to the vocabulary; `tied` reuses the embedding's weight."""
from __future__ import annotations

from compiler import spec as S
from compiler.binder import Param, _bool, _size

SPEC = S.LMHead
SCHEMA = {"lm_head": {"vocab": Param(_size, doc="vocabulary size"), "hidden": Param(_size, doc="model width"),
                      "tied": Param(_bool, False, "reuse the token embedding's weight"),
                      "bias": Param(_bool, False, "bias on the projection")}}
TP_ROLES = {"head": "vocab", "bias": "vocab"}


def resolve(c, st, a: dict, kind: str):
    return S.LMHead(vocab=a["vocab"], hidden=a["hidden"], tied=a["tied"], bias=a["bias"], span=st.span)
