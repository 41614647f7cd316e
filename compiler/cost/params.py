"""Parameters: the model's (a formula of the spec's sizes) and what each traced segment holds once the passes have
run (tp shards at their local size, ep's experts at their share)."""
from __future__ import annotations

import sympy

from compiler import model as M
from compiler import trace as T


def model_params(traced: T.Traced) -> sympy.Expr:
    return M.symbolic_param_count(traced.model)


def segment_params(gm) -> sympy.Expr:
    """Parameters one rank holds of one traced segment (a block, or a pipeline piece), after the passes."""
    return sympy.expand(sum((sympy.Mul(*s) for s in gm.meta[T.PARAM_SHAPES].values()), sympy.Integer(0)))


def segment_expert_params(gm, mine=None) -> sympy.Expr:
    """Expert weights (sharded over ep) one rank holds of `gm`; with `mine`, only those of top-level modules `mine`
    has (a pipeline piece)."""
    shapes = gm.meta[T.PARAM_SHAPES]
    return sympy.expand(sum((sympy.Mul(*shapes[p]) for p in gm.meta.get(T.EP_SHARDS, {})
                             if mine is None or hasattr(mine, p.split(".")[0])), sympy.Integer(0)))
