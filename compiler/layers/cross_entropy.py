"""`cross_entropy`: mean next-token cross-entropy; vocabulary-parallel under tp (the logits are never gathered)."""
from __future__ import annotations

from dataclasses import dataclass

from compiler.diagnostics import Span


@dataclass(frozen=True, kw_only=True)
class CrossEntropy:
    """Mean next-token cross-entropy over all tokens of the batch."""
    span: Span


SPEC = CrossEntropy
SCHEMA: dict = {"cross_entropy": {}}
TP_ROLES: dict = {}


def resolve(c, st, a: dict, kind: str):
    return CrossEntropy(span=st.span)
