"""`lm_head(vocab, hidden, tied, bias, softcap)`: projection to the vocabulary; `tied` reuses the embedding's weight;
`softcap = C` caps the logits to (-C, C) as C·tanh(logits / C) (Gemma 2's final_logit_softcapping)."""
from __future__ import annotations

from dataclasses import dataclass

from compiler.binder import Param, arg_span, to_bool, to_float, to_size
from compiler.diagnostics import Span
from compiler.symbols import Size


@dataclass(frozen=True, kw_only=True)
class LMHead:
    """Projection to the vocabulary; `tied` reuses the token embedding's weight."""
    vocab: Size
    hidden: Size
    tied: bool
    bias: bool
    span: Span
    softcap: float | None = None
    """Logits soft-capped to (-C, C), C·tanh(logits / C) (Gemma 2's final_logit_softcapping); None: not capped."""


SPEC = LMHead
SCHEMA = {"lm_head": {"vocab": Param(to_size, doc="vocabulary size"), "hidden": Param(to_size, doc="model width"),
                      "tied": Param(to_bool, False, "reuse the token embedding's weight"),
                      "bias": Param(to_bool, False, "bias on the projection"),
                      "softcap": Param(to_float, None, "cap the logits to (-C, C): C·tanh(logits / C)")}}
TP_ROLES = {"head": "vocab", "bias": "vocab"}


def resolve(c, st, a: dict, kind: str):
    if a["softcap"] is not None and a["softcap"] <= 0:
        c.error("E0120", "lm_head's softcap must be positive", arg_span(st, 4, "softcap"),
                label="logits are capped to (-softcap, softcap)",
                help="Gemma 2 caps its logits at `softcap = 30`; remove it for uncapped logits")
        return None
    return LMHead(vocab=a["vocab"], hidden=a["hidden"], tied=a["tied"], bias=a["bias"], span=st.span,
                  softcap=a["softcap"])
