"""`positional(positions, hidden)`: learned absolute positions, added to the token embedding."""
from __future__ import annotations

from compiler import spec as S
from compiler.binder import Param, to_size

SPEC = S.Positional
SCHEMA = {"positional": {"positions": Param(to_size, doc="number of learned positions"),
                         "hidden": Param(to_size, doc="model width")}}
TP_ROLES: dict = {}  # replicated; split along the sequence under sequence parallelism


def resolve(c, st, a: dict, kind: str):
    return S.Positional(positions=a["positions"], hidden=a["hidden"], span=st.span)
