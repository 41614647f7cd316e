"""`positional(positions, hidden)`: learned absolute positions, added to the token embedding."""
from __future__ import annotations

from dataclasses import dataclass

from compiler.binder import Param, to_size
from compiler.diagnostics import Span
from compiler.symbols import Size


@dataclass(frozen=True, kw_only=True)
class Positional:
    """Learned absolute position embedding, added to the token embedding."""
    positions: Size
    hidden: Size
    span: Span


SPEC = Positional
SCHEMA = {"positional": {"positions": Param(to_size, doc="number of learned positions"),
                         "hidden": Param(to_size, doc="model width")}}
TP_ROLES: dict = {}  # replicated; split along the sequence under sequence parallelism


def resolve(c, st, a: dict, kind: str):
    return Positional(positions=a["positions"], hidden=a["hidden"], span=st.span)
