"""`embedding(vocab, hidden, scaled)`: the token embedding, first layer of every model; `scaled = true` multiplies
what it looks up by √hidden (Gemma)."""
from __future__ import annotations

from dataclasses import dataclass

from compiler.binder import Param, to_bool, to_size
from compiler.diagnostics import Span
from compiler.symbols import Size


@dataclass(frozen=True, kw_only=True)
class Embedding:
    """Token embedding: `vocab` rows of width `hidden`."""
    vocab: Size
    hidden: Size
    span: Span
    scaled: bool = False
    """The looked-up rows are multiplied by √hidden, in the activations' dtype (Gemma's normalizer); the weight a
    tied head reads is not."""


SPEC = Embedding
SCHEMA = {"embedding": {"vocab": Param(to_size, doc="vocabulary size"), "hidden": Param(to_size, doc="model width"),
                            "scaled": Param(to_bool, False, "multiply the looked-up rows by √hidden (Gemma)")}}
TP_ROLES = {"embed": "vocab"}


def resolve(c, st, a: dict, kind: str):
    return Embedding(vocab=a["vocab"], hidden=a["hidden"], span=st.span, scaled=a["scaled"])
