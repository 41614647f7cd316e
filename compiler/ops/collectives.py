"""The records of the collectives the passes insert: runtime.collectives' tensor-parallel pairs (forward and
backward named), the vocabulary-parallel lookup, and context parallelism's Ulysses all-to-alls."""
from __future__ import annotations

from compiler import graph_meta as K
from compiler.graph_meta import INT_BYTES
from compiler.ops.record import Op, ZERO, aliases_input, dim_index, dtype_act
from compiler.symbols import size
from runtime import collectives as C
from runtime import context_parallel as CP


def _vocab_lookup_saved(g, node, args):
    tokens = args[0]
    g.new(node, "ids", tokens.meta[K.SHAPE], INT_BYTES)   # the shifted, masked ids
    g.new(node, "outside", tokens.meta[K.SHAPE], 1)       # the mask of foreign ids


def _gather_shape(node, args, kwargs, gm):
    x, axis, d = args
    return tuple(s * size(axis) if i == dim_index(x, d) else s for i, s in enumerate(x)), ZERO


def _scatter_shape(node, args, kwargs, gm):
    x, axis, d = args
    return tuple(s / size(axis) if i == dim_index(x, d) else s for i, s in enumerate(x)), ZERO


def _heads_to_sequence_shape(forward):
    """Ulysses' all-to-alls over cp: (B, H, S/cp, D) -> (B, H/cp, S, D), and back."""
    def shape(node, args, kwargs, gm):
        b, h, s, d = args[0]
        n = size(args[1])
        return ((b, h / n, s * n, d) if forward else (b, h * n, s / n, d)), ZERO
    return shape


_GATHER = Op("all_gather_fwd_reduce_scatter_bwd", _gather_shape, passes_grad=True, computes=False)
_SCATTER = Op("reduce_scatter_fwd_all_gather_bwd", _scatter_shape, passes_grad=True, selective=True,
              computes=False)

FUNCTIONS = {
    C.vocab_parallel_lookup: Op("vocab_parallel_lookup",
                                lambda node, args, kwargs, gm: (tuple(args[0]) + (args[1][1],), ZERO), dtype_act,
                                _vocab_lookup_saved),
    C.identity_fwd_all_reduce_bwd: Op("identity_fwd_all_reduce_bwd", saved=aliases_input, passes_grad=True,
                                      computes=False, copy=True),
    C.all_reduce_fwd_identity_bwd: Op("all_reduce_fwd_identity_bwd", passes_grad=True, selective=True,
                                      computes=False),
    C.all_gather_fwd_reduce_scatter_bwd: _GATHER,
    C.reduce_scatter_fwd_all_gather_bwd: _SCATTER,
    C.split_fwd_all_gather_bwd: Op("split_fwd_all_gather_bwd", _scatter_shape, passes_grad=True, computes=False),
    C.all_gather_fwd_split_bwd: Op("all_gather_fwd_split_bwd", _gather_shape, passes_grad=True, computes=False),
    # selective: their all_to_all_single outputs are what runtime.recompute saves (as moe's all-to-alls)
    CP.heads_to_sequence: Op("cp_heads_to_sequence", _heads_to_sequence_shape(True), passes_grad=True,
                             computes=False, selective=True),
    CP.sequence_to_heads: Op("cp_sequence_to_heads", _heads_to_sequence_shape(False), passes_grad=True,
                             computes=False, selective=True),
}
