"""Every sympy symbol the compiler uses is made here, so that two modules never disagree about assumptions.

Sizes a user names in the .scale file become symbols of the same name (`hidden`, `layers`, ...); sizes the compiler
introduces have fixed names below.
"""
from __future__ import annotations

import functools
import math

import sympy


@functools.cache
def size(name: str) -> sympy.Symbol:
    """The symbol of a named size: a positive integer."""
    return sympy.Symbol(name, integer=True, positive=True)


# Sizes the compiler introduces, named so that no .scale name can collide with them (names there are ASCII).
MICRO_BATCH = size("µb")         # sequences in one micro-batch on one rank


def evaluate(expr, values: dict) -> int | float:
    """The number an expression takes once every symbol has its value."""
    if isinstance(expr, int):  # the common cases, without building a substitution (rules run per candidate)
        return expr
    if isinstance(expr, sympy.Integer):
        return int(expr)
    if isinstance(expr, sympy.Symbol) and expr in values:
        return values[expr]
    v = sympy.sympify(expr).xreplace({k: sympy.Integer(n) for k, n in values.items()})
    if v.free_symbols:
        raise ValueError(f"unbound symbols in {expr}: {sorted(map(str, v.free_symbols))}")
    return int(v) if v.is_integer else float(v)


def capacity(seq: int, experts: int, top_k: int, factor) -> int:
    """Slots per expert per sequence of a `moe` layer: the factor times a balanced share of the K·S choices, rounded
    up (a product that is a whole number up to float rounding is not rounded up), at least 1, at most S; S for
    `factor = "none"` (dropless). The compiler's own copy of runtime.moe.capacity (the compiler does not import the
    runtime to resolve a model); tests/test_moe.py checks the two agree."""
    if factor == "none":
        return seq
    return max(1, min(seq, math.ceil(factor * top_k * seq / experts - 1e-9)))
