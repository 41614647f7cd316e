"""`residual { ... }`: x + body(x). A container: its body is resolved by the checker, layer by layer."""
from __future__ import annotations

from compiler import spec as S

SPEC = S.Residual
CONTAINER = True
SCHEMA: dict = {"residual": {}}
TP_ROLES: dict = {}
