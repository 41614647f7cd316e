"""An op record (compiler/ops/__init__.py's docstring says what each field means) and the rules records share:
shapes and dtypes passed through, what a backward keeps, a matmul's dims."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import sympy

from compiler import graph_meta as K


ZERO = sympy.Integer(0)


def numel(shape) -> sympy.Expr:
    return sympy.Mul(*shape) if shape else sympy.Integer(1)


def dim_index(shape, d: int) -> int:
    return d % len(shape)


def broadcast(a, b):
    if a is None:
        return b
    if b is None:
        return a
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    return tuple(y if x == 1 else x for x, y in zip(a, b))


def promote(*kinds) -> str | None:
    """torch's promotion of a binary op's result: fp32 over the residual stream (fp32 or the compute precision)
    over the compute precision."""
    floats = [k for k in kinds if k in ("act", "res", "fp32")]
    if not floats:
        return next((k for k in kinds if k is not None), None)
    return next(k for k in ("fp32", "res", "act") if k in floats)


# -- the rules records share --------------------------------------------------------------------------------------


def _same_shape(node, args, kwargs, gm):
    return args[0], ZERO


def _same_dtype(node, gm, args):
    """Shape ops, activations, collectives: the input's kind."""
    return args[0] if args and isinstance(args[0], (str, tuple)) else None


def dtype_act(node, gm, args):
    return "act"


def dtype_fp32(node, gm, args):
    return "fp32"


def _keeps_nothing(g, node, args):
    pass


def keeps_input(g, node, args):
    g.keep(args[0])


def keeps_output(g, node, args):
    g.keep(node)


def aliases_input(g, node, args):
    if isinstance(args[0], type(node)):
        g.views[node] = args[0]


def keeps_matmul_input(g, node, args):
    g.keep_matmul_input(args[0], node)


def linear_dims(node, gm):
    x, w = node.args[0].meta[K.SHAPE], node.args[1].meta[K.SHAPE]
    return 1, numel(x[:-1]), w[0], w[1], w[0] * w[1]


def output_grad(node, gm, widths):
    """A linear module's split backward keeps its output's gradient, in the compute precision."""
    return numel(node.meta[K.SHAPE]) * widths["act"]


@dataclass(frozen=True)
class Op:
    """One operation (see the module docstring for each field)."""

    name: str
    shape: Callable = _same_shape
    dtype: Callable = _same_dtype
    saved: Callable = _keeps_nothing
    backward: Callable | None = None
    selective: bool = False
    passes_grad: bool = False
    free: bool = False
    dims: Callable | None = None
    shard: bool = False
    loss: Callable | None = None
    wgrad: Callable | None = None
    render: Callable | None = None
    computes: bool = True      # a collective that also computes (costed as memory traffic besides its transfer)
    outputs: tuple = ()        # names given to the getitem nodes of a tuple result, in order
    wrapped: bool = False      # traced as one call (torch.fx autowrap), not through its body
    copy: bool = False         # its backward holds a copy of its gradient (a tensor-parallel all-reduce's)
    defaults: bool = False     # every keyword the tracer records for it is the default: dropped from the program
    freed_when_sent: bool = False  # a stage output it makes is freed once sent (runtime.pipeline.FREEABLE: its
                                   # backward node saves nothing)
    padding: Callable | None = None  # (node, seq) -> the fraction of its FLOPs spent on empty slots, or None
    attention: bool = False    # the fused attention kernel: timed at the device's attention efficiency
    kept: Callable | None = None     # (node, gm, needed, act) -> what selective recomputation keeps of it, when not
                                     # its output (where `needed`: the backward reads it)
    side: tuple = ()           # positions of arguments a head shard's call takes whole (replicated) under tp:
