"""`residual { ... }`: x + body(x). A container: its body is resolved by the checker, layer by layer."""
from __future__ import annotations

from dataclasses import dataclass

from compiler.diagnostics import Span


@dataclass(frozen=True, kw_only=True)
class Residual:
    """x + body(x)."""
    body: tuple
    span: Span


SPEC = Residual
CONTAINER = True
SCHEMA: dict = {"residual": {}}
TP_ROLES: dict = {}
