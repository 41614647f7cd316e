"""`cross_entropy`: mean next-token cross-entropy; vocabulary-parallel under tp (the logits are never gathered)."""
from __future__ import annotations

from compiler import spec as S

SPEC = S.CrossEntropy
SCHEMA: dict = {"cross_entropy": {}}
TP_ROLES: dict = {}


def resolve(c, st, a: dict, kind: str):
    return S.CrossEntropy(span=st.span)
