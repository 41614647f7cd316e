"""`embedding(vocab, hidden, scaled)`: the token embedding, first layer of every model; `scaled = true` multiplies
what it looks up by √hidden (Gemma)."""
from __future__ import annotations

from compiler import spec as S
from compiler.binder import Param, to_bool, to_size

SPEC = S.Embedding
SCHEMA = {"embedding": {"vocab": Param(to_size, doc="vocabulary size"), "hidden": Param(to_size, doc="model width"),
                            "scaled": Param(to_bool, False, "multiply the looked-up rows by √hidden (Gemma)")}}
TP_ROLES = {"embed": "vocab"}


def resolve(c, st, a: dict, kind: str):
    return S.Embedding(vocab=a["vocab"], hidden=a["hidden"], span=st.span, scaled=a["scaled"])
