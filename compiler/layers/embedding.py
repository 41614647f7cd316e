"""`embedding(vocab, hidden)`: the token embedding, first layer of every model."""
from __future__ import annotations

from compiler import spec as S
from compiler.binder import Param, _size

SPEC = S.Embedding
SCHEMA = {"embedding": {"vocab": Param(_size, doc="vocabulary size"), "hidden": Param(_size, doc="model width")}}
TP_ROLES = {"embed": "vocab"}


def resolve(c, st, a: dict, kind: str):
    return S.Embedding(vocab=a["vocab"], hidden=a["hidden"], span=st.span)
