"""The records of runtime.moe's routing calls: route, dispatch and combine (padded), sort_tokens and unsort_combine
(grouped), the expert-parallel all-to-alls and the counts they exchange."""
from __future__ import annotations

from compiler import graph_meta as K
from compiler.graph_meta import INT_BYTES
from compiler.ops.record import Op, ZERO, dtype_act, promote
from compiler.symbols import size
from runtime import moe, moe_nodes, rebalance


def _route_shape(node, args, kwargs, gm):
    b, s, _ = args[0]
    return ((b, s, args[1]), (b, s, args[1])), ZERO


def _route_saved(g, node, args):
    logits = args[0]
    b, s, e = logits.meta[K.SHAPE]
    k = args[1]
    g.new(node, "probs", (b, s, e), 4)             # softmax's (or sigmoid's) output (fp32)
    g.new(node, "topk", (b, s, k), INT_BYTES)      # topk's (or gather's) indices
    if node.kwargs.get("scoring", "softmax") == "sigmoid":  # the scores normalised for the aux loss: their sum
        g.new(node, "score_sum", (b, s, 1), 4)
    if node.kwargs.get("renormalize", k > 1):     # runtime.moe.route's default: renormalised when top_k > 1
        g.new(node, "norm", (b, s, k), 4)          # the division's operands: gates and their sum
        g.new(node, "sum", (b, s, 1), 4)
    g.new(node, "aux", (b, e), 4)                  # the aux loss's product: the mean probabilities


def _dispatch_shape(node, args, kwargs, gm):
    layer = node.meta[K.LAYER]  # the symbolic sizes; the call's arguments are their numbers
    b, s, h = args[0]
    # dropless: a slot for every token the rank routes (the sequence, or its S/cp under context parallelism)
    c = s if layer.capacity_factor == "none" else layer.capacity
    return (layer.experts, b * c, h), ZERO


def _dispatch_saved(g, node, args):
    b, s, k = args[1].meta[K.SHAPE]
    g.new(node, "index", (b, s * k), INT_BYTES)  # scatter_add's index: a copy of the (strided) slots


def _combine_shape(node, args, kwargs, gm):
    b, s, _ = args[1]
    return (b, s, args[0][2]), ZERO


def _combine_dtype(node, gm, args):  # the experts' outputs, plus the token itself for dropped = identity
    return promote(args[0], *(args[3:4]))


def _combine_saved(g, node, args):
    y, slot, gate = args[:3]
    e, n, h = y.meta[K.SHAPE]
    b, s, k = slot.meta[K.SHAPE]
    g.new(node, "index", (b, s * k), INT_BYTES)     # gather's index: a copy of the (strided) slots
    g.new(node, "outputs", (b, e * n / b + 1, h), g.act)  # gather's input: the outputs + a zero slot
    g.new(node, "picked", (b, s, k, h), g.act)      # the product's operands: the picked outputs,
    g.new(node, "weights", (b, s, k), g.act)        # and the gates in the compute dtype
    if len(args) > 3 and args[3] is not None:       # dropped = identity: Σ gate × dropped, times the token
        g.new(node, "dropped", (b, s, k), g.act)
        g.new(node, "gate_sum", (b, s, 1), g.act)
        g.keep(args[3])


# dropless without padding (`moe(..., dispatch = grouped)`): the rows of every choice sorted by expert, T = B·S·K of
# them on each rank; under ep a rank's experts receive R rows, T on average under balanced routing (the shape the
# trace carries: the rows are data-dependent, their count is not known before the router runs).


def _sort_shape(node, args, kwargs, gm):
    layer = node.meta[K.LAYER]
    b, s, h = args[0]
    k = args[1][2]
    return ((b * s * k, h), (layer.experts,)), ZERO


def _sort_saved(g, node, args):
    b, s, k = args[1].meta[K.SHAPE]
    g.new(node, "index", (b * s * k,), INT_BYTES)   # an indexing's backward keeps its index: one int64 per row


def _rows_index_saved(g, node, args):
    """The grouped all-to-alls reorder the received rows by an index, which their backward keeps (R = T rows)."""
    g.new(node, "index", (args[0].meta[K.SHAPE][0],), INT_BYTES)


def _unsort_shape(node, args, kwargs, gm):
    b, s, _ = args[1]
    return (b, s, args[0][1]), ZERO


def _unsort_saved(g, node, args):
    b, s, k = args[1].meta[K.SHAPE]
    g.new(node, "index", (b * s * k,), INT_BYTES)   # the rows back in (token, choice) order: the index
    g.new(node, "picked", (b, s, k, args[0].meta[K.SHAPE][1]), g.act)   # the product's operands: the rows
    g.new(node, "weights", (b, s, k), g.act)                            # and the gates in the compute dtype


def _counts_shape(node, args, kwargs, gm):
    layer = node.meta[K.LAYER]
    n = size(args[1])
    return (n, _slots(layer) / n), ZERO


def _slots(layer):
    """The experts' slots over ep: the experts, plus `rebalance`'s replicas (runtime/rebalance.py)."""
    return layer.experts + (layer.rebalance[1] if getattr(layer, "rebalance", None) else 0)


def _to_slots_shape(node, args, kwargs, gm):
    return (args[0], (_slots(node.meta[K.LAYER]),)), ZERO


def _slots_saved(g, node, args):
    """The rows reordered by an index, which the backward keeps: one int64 per row."""
    g.new(node, "index", (args[0].meta[K.SHAPE][0],), INT_BYTES)


def _a2a_shape(scale):
    def shape(node, args, kwargs, gm):
        e, n, h = args[0]
        k = size(args[1])
        return ((e / k, n * k, h) if scale else (e * k, n / k, h)), ZERO
    return shape

# the node dispatch (runtime/moe_nodes.py; compiler/passes/expert_parallel.py `_by_node`): shapes as the trace carries
# them, expectations under balanced routing. T = b·S tokens, K choices; a rank's experts receive R = T·K rows on
# average, T·ν rows cross the rail each way (ν: expected distinct nodes of a token, from the pass's notes).


def _layer_shape(node):
    """(tokens T, choices K, the rows that cross the rail T·ν) of a node-dispatch call, from its routes' slots and
    the rail notes the pass gave its routes call."""
    routes = node if node.target is moe_nodes.node_routes else node.args[2]
    b, s, k = routes.args[0].meta[K.SHAPE]
    crossing = routes.meta[K.COLLECTIVE][1].elements / k  # the routing note: T·ν·K int64
    return b * s, k, crossing


def _routes_shape(node, args, kwargs, gm):
    layer = node.meta[K.LAYER]
    n = size("ep")
    return (n, layer.experts / n), ZERO  # what the trace sees of it: its layout's shape (as exchange_counts')


def _node_dispatch_shape(node, args, kwargs, gm):
    tokens, k, crossing = _layer_shape(node)
    h = args[0][2]
    n = size("ep")
    return ((tokens * k, h), (crossing, k), (n, node.meta[K.LAYER].experts / n)), ZERO


def _node_dispatch_saved(g, node, args):
    """What its backward holds of the routes: the token of each crossing row and which of its choices it carries
    (int64, bool), each forwarded choice's row and choice, each received row's place (int64)."""
    tokens, k, crossing = _layer_shape(node)
    g.new(node, "token", (crossing,), INT_BYTES)
    g.new(node, "mine", (crossing, k), 1)
    g.new(node, "row_choice", (2 * tokens * k,), INT_BYTES)
    g.new(node, "index", (tokens * k,), INT_BYTES)


def _node_dispatch_kept(node, gm, needed, act):
    """Under selective recomputation the outputs of its collectives are kept (runtime.recompute reads them back):
    the rows and gates that crossed the rail, the rows that crossed the node."""
    tokens, k, crossing = _layer_shape(node)
    h = node.args[0].meta[K.SHAPE][2]
    return crossing * h * act + crossing * k * 4 + tokens * k * h * act


def _node_combine_kept(node, gm, needed, act):
    """Likewise: the rows back over the node, and the rows back over the rail."""
    tokens, k, crossing = _layer_shape(node)
    h = node.meta[K.SHAPE][2]
    return tokens * k * h * act + crossing * h * act


def _node_combine_shape(node, args, kwargs, gm):
    b, s, _ = node.args[2].args[0].meta[K.SHAPE]
    return (b, s, args[0][1]), ZERO


def _node_combine_saved(g, node, args):
    """The experts' outputs as they came back to the rows' ranks, and their gates in the compute dtype."""
    tokens, k, _ = _layer_shape(node)
    h = args[0].meta[K.SHAPE][1]
    g.new(node, "outputs", (tokens * k, h), g.act)
    g.new(node, "weights", (tokens * k,), g.act)


FUNCTIONS = {
    # Context parallelism's MoE (compiler/passes/context_parallel.py): each sequence's choice counts, summed over
    # cp before the router's aux loss (int64, no gradient)
    moe.choice_counts: Op("choice_counts", lambda node, args, kwargs, gm: ((args[0][0], args[0][2]), ZERO),
                          lambda node, gm, args: "int", free=True),
    moe.route: Op("route", _route_shape, lambda node, gm, args: ("int", "fp32"), _route_saved,
                  outputs=("slot", "gate"), wrapped=True),
    moe.dispatch: Op("dispatch", _dispatch_shape, dtype_act, _dispatch_saved, wrapped=True),
    moe.combine: Op("combine", _combine_shape, _combine_dtype, _combine_saved, wrapped=True),
    moe.all_to_all_dispatch: Op("all_to_all_dispatch", _a2a_shape(True), selective=True, computes=False),
    moe.all_to_all_combine: Op("all_to_all_combine", _a2a_shape(False), selective=True, computes=False),
    moe.sort_tokens: Op("sort_tokens", _sort_shape, lambda node, gm, args: ("act", "int"), _sort_saved,
                        outputs=("rows", "counts"), wrapped=True),
    moe.unsort_combine: Op("unsort_combine", _unsort_shape, dtype_act, _unsort_saved, wrapped=True),
    moe.exchange_counts: Op("exchange_counts", _counts_shape, lambda node, gm, args: "int", free=True,
                            computes=False),
    moe.all_to_all_dispatch_grouped: Op("all_to_all_dispatch_grouped", saved=_rows_index_saved, selective=True,
                                        computes=False),
    # re-placed experts (`rebalance`): the rows to their slots and back, an index each way
    rebalance.to_slots: Op("to_slots", _to_slots_shape, lambda node, gm, args: ("act", "int"), _slots_saved,
                           outputs=("rows", "counts"), wrapped=True),
    rebalance.from_slots: Op("from_slots", dtype=dtype_act, saved=_slots_saved, wrapped=True),
    moe.all_to_all_combine_grouped: Op("all_to_all_combine_grouped", saved=_rows_index_saved, selective=True,
                                       computes=False),
    moe_nodes.node_routes: Op("node_routes", _routes_shape, lambda node, gm, args: "int", free=True, computes=False),
    moe_nodes.node_dispatch: Op("node_dispatch", _node_dispatch_shape, lambda node, gm, args: ("act", "fp32", "int"),
                                _node_dispatch_saved, outputs=("rows", "gates", "layout"), selective=True,
                                computes=False, kept=_node_dispatch_kept),
    moe_nodes.node_combine: Op("node_combine", _node_combine_shape, dtype_act, _node_combine_saved, selective=True,
                               computes=False, kept=_node_combine_kept),
}
