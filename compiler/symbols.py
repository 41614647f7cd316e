"""Every sympy symbol the compiler uses is made here, so that two modules never disagree about assumptions.

Sizes a user names in the .scale file become symbols of the same name (`hidden`, `layers`, ...); sizes the compiler
introduces have fixed names below.
"""
from __future__ import annotations

import functools
import math

import sympy

Size = sympy.Expr  # a size: a sympy expression of the user's named sizes (compiler/spec.py, compiler/layers/)


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


def integer_polynomial(expr, args: tuple):
    """`expr` as a Python function of `args` (positional), when it is a polynomial in them with integer
    coefficients: exact integer arithmetic, built from the terms directly (a search compiles hundreds of cost
    formulas, and sympy.lambdify's printer took ~1 ms each). None for anything else (a Max, a fraction), which the
    caller compiles otherwise. The generated source holds only integers and the parameters' positional names, never
    a name of the user's."""
    terms = []
    for term in sympy.Add.make_args(sympy.expand(expr)):
        coeff, rest = term.as_coeff_Mul()
        powers = rest.as_powers_dict() if rest != 1 else {}
        if not coeff.is_Integer or any(b not in args or not k.is_Integer or k < 0 for b, k in powers.items()):
            return None
        factors = [str(int(coeff))] + [f"a{i}" if powers[a] == 1 else f"a{i}**{int(powers[a])}"
                                       for i, a in enumerate(args) if a in powers]
        terms.append("*".join(factors))
    params = ", ".join(f"a{i}" for i in range(len(args)))
    return eval(f"lambda {params}: {' + '.join(terms) or '0'}", {"__builtins__": {}})  # noqa: S307 - see above
