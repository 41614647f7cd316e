"""The records of torch's tensor functions and methods the layers call: views and reshapes, casts, activations,
elementwise arithmetic, indexing, the functional linear, and the token positions (context parallelism's, packed
documents')."""
from __future__ import annotations

import operator

import sympy
import torch
import torch.nn.functional as F

from compiler import graph_meta as K
from compiler.ops.attention import latent_fused
from compiler.ops.record import (Op, ZERO, aliases_input, broadcast, dim_index, dtype_act, dtype_fp32, keeps_input,
                                 keeps_matmul_input, keeps_output, linear_dims, numel, promote)
from runtime import attention
from runtime import context_parallel as CP
from runtime import packed as P


def _unflatten_shape(node, args, kwargs, gm):
    x, d, sizes = args
    d = dim_index(x, d)
    sizes = list(sizes)
    if -1 in sizes:
        known = sympy.Mul(*[s for s in sizes if s != -1])
        sizes[sizes.index(-1)] = sympy.cancel(x[d] / known)
    return tuple(x[:d]) + tuple(sizes) + tuple(x[d + 1:]), ZERO


def _transpose_shape(node, args, kwargs, gm):
    x, a, b = args
    s = list(x)
    a, b = dim_index(x, a), dim_index(x, b)
    s[a], s[b] = s[b], s[a]
    return tuple(s), ZERO


def _flatten_shape(node, args, kwargs, gm):
    x = args[0]
    start = dim_index(x, args[1] if len(args) > 1 else kwargs.get("start_dim", 0))
    end = dim_index(x, args[2] if len(args) > 2 else kwargs.get("end_dim", -1))
    return tuple(x[:start]) + (numel(x[start:end + 1]),) + tuple(x[end + 1:]), ZERO


def _flatten_saved(g, node, args):
    src = args[0]
    # A flatten of a transposed tensor copies, except scaled_dot_product_attention's output, which the flash kernels
    # lay out as (batch, seq, heads, dim): transposing it back is contiguous.
    if src.target == "transpose" and src.args[0].target not in (F.scaled_dot_product_attention, CP.attention,
                                                                 P.attention, attention.sliding_window,
                                                                 attention.latent):
        return
    if src.target == "transpose" and src.args[0].target is attention.latent and not latent_fused(g, src.args[0]):
        return  # the math path's output is (B, H, S, V) contiguous: its transpose flattened is a copy
    g.views[node] = src


def _cast_saved(g, node, args):
    """`.float()` / `.to()`: the same storage when the dtype does not change."""
    if node.meta.get(K.DTYPE) == args[0].meta.get(K.DTYPE):
        g.views[node] = args[0]


def _binary_shape(node, args, kwargs, gm):
    return broadcast(args[0] if isinstance(args[0], tuple) else None,
                      args[1] if isinstance(args[1], tuple) else None), ZERO


def _binary_dtype(node, gm, args):
    return promote(*[a for a in args if isinstance(a, str)])


def _mul_saved(g, node, args):
    """A product of two tensors keeps each (the other's gradient reads it); a tensor times a Python number keeps
    nothing (its gradient is the number times the output's)."""
    tensors = [a for a in args[:2] if hasattr(a, "meta") and a.meta.get(K.SHAPE) is not None]
    if len(tensors) == 2:
        for a in tensors:
            g.keep(a)


def _getattr_shape(node, args, kwargs, gm):
    return (args[0] if args[1] == "shape" else None), ZERO  # .shape; .device, .dtype have none


def _getitem_shape(node, args, kwargs, gm):
    return args[0][args[1]], ZERO


def _getitem_dtype(node, gm, args):
    return args[0][args[1]] if isinstance(args[0], tuple) else args[0]


def _linear_fn_shape(node, args, kwargs, gm):
    x, w = args[0], args[1]
    return tuple(x[:-1]) + (w[0],), 2 * numel(x[:-1]) * w[0] * w[1]


def _linear_fn_wgrad(node, gm, widths):
    """F.linear's split backward keeps its output's gradient, in the output's dtype."""
    return numel(node.meta[K.SHAPE]) * widths.get(node.meta.get(K.DTYPE), 4)


def _split_shape(node, args, kwargs, gm):
    x, sizes = args[0], args[1]
    d = dim_index(x, args[2] if len(args) > 2 else kwargs.get("dim", 0))
    return tuple(tuple(x[:d]) + (sympy.sympify(n),) + tuple(x[d + 1:]) for n in sizes), ZERO


def _split_saved(g, node, args):
    """Each piece is a view of its input: a getitem of it shares the input's storage."""
    if isinstance(args[0], type(node)):
        g.views[node] = args[0]
        for user in node.users:
            if user.target is operator.getitem:
                g.views[user] = args[0]


_UNFLATTEN = Op("unflatten", _unflatten_shape, saved=aliases_input, passes_grad=True, free=True, shard=True)
_TRANSPOSE = Op("transpose", _transpose_shape, saved=aliases_input, passes_grad=True, free=True, shard=True)
_FLATTEN = Op("flatten", _flatten_shape, saved=_flatten_saved, passes_grad=True, free=True, shard=True)
_ADD = Op("add", _binary_shape, _binary_dtype, passes_grad=True, freed_when_sent=True)
_SUB = Op("sub", _binary_shape, _binary_dtype, passes_grad=True)
_MUL = Op("mul", _binary_shape, _binary_dtype, _mul_saved, shard=True)

FUNCTIONS = {
    "unflatten": _UNFLATTEN, torch.unflatten: _UNFLATTEN,
    "transpose": _TRANSPOSE, torch.transpose: _TRANSPOSE,
    "flatten": _FLATTEN, torch.flatten: _FLATTEN,
    "contiguous": Op("contiguous", passes_grad=True, shard=True),
    "float": Op("float", dtype=dtype_fp32, saved=_cast_saved, passes_grad=True),
    "to": Op("to", saved=_cast_saved, passes_grad=True),
    F.gelu: Op("gelu", saved=keeps_input, shard=True),
    F.silu: Op("silu", saved=keeps_input, shard=True),
    F.relu: Op("relu", saved=keeps_output, shard=True),
    torch.tanh: Op("tanh", saved=keeps_output, shard=True),
    torch.sigmoid: Op("sigmoid", saved=keeps_output),
    operator.add: _ADD, torch.add: _ADD, "add": _ADD,
    operator.sub: _SUB, torch.sub: _SUB, "sub": _SUB,
    operator.mul: _MUL, torch.mul: _MUL, "mul": _MUL,
    getattr: Op("getattr", _getattr_shape, lambda node, gm, args: None, aliases_input, passes_grad=True, free=True),
    operator.getitem: Op("getitem", _getitem_shape, _getitem_dtype, passes_grad=True, free=True, shard=True),
    torch.arange: Op("arange", lambda node, args, kwargs, gm: ((args[0],), ZERO), lambda node, gm, args: "int",
                     free=True),
    F.linear: Op("linear", _linear_fn_shape, dtype_act, keeps_matmul_input, selective=True, dims=linear_dims,
                 wgrad=_linear_fn_wgrad),
    "split": Op("split", _split_shape, lambda node, gm, args: tuple(args[0] for _ in node.args[1]), _split_saved,
                passes_grad=True, free=True),
    # The positions of context parallelism's rank (compiler/passes/context_parallel.py) and of packed documents
    # (runtime/packed.py): each token's position within its document
    CP.positions: Op("cp_positions", lambda node, args, kwargs, gm: ((args[0],), ZERO), lambda node, gm, args: "int",
                     free=True),
    P.positions: Op("packed_positions", lambda node, args, kwargs, gm: (tuple(args[0]), ZERO),
                    lambda node, gm, args: "int", free=True, wrapped=True),
}
