"""Expert parallelism over the `ep` mesh axis (GShard, Lepikhin et al. 2020).

Policy, `ep_policy`: the experts of each MoE layer in a segment (its `runtime.moe.Experts` leaf) are split evenly
over the ep ranks, in order: rank r holds experts [r·E/ep, (r+1)·E/ep). The router stays replicated, like every
dense weight.
Mechanism, `expert_parallel_pass`: swaps each Experts leaf for its local E/ep experts and wraps it in the two
explicit all-to-alls of runtime/moe.py:
  - dispatch, on the experts' input: forward all-to-all of the capacity slots to the ranks holding their experts,
    backward the reverse all-to-all of their gradients;
  - combine, on the experts' output: forward all-to-all of the results back to the tokens' ranks, backward the
    reverse.
Each moves E·(b·C)·d elements per micro-batch and direction (b sequences, C slots per expert per sequence).
Expert weights are recorded in gm.meta[EP_SHARDS]; their gradients are synchronised over dp only (the ranks that
hold the same experts), by the runtime.
Where the plan dispatches by node (Plan.ep_nodes: its ep groups span nodes, `ep_dispatch = nodes`), a grouped layer
without `rebalance` runs runtime/moe_nodes.py instead (`_by_node`): each token crosses to a node once over the rail
(ep_rail) and fans out over the node (ep_node); the combine sums on the node first.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import sympy

import torch
from torch import fx

from compiler import spec as S
from compiler import trace as T
from compiler.passes.tensor_parallel import Collective, insert_call
from compiler.symbols import size
from compiler.cost.ledger_parts import expected_nodes
from runtime import moe, moe_nodes, rebalance

AXIS = "ep"


@dataclass(frozen=True)
class Placement:
    experts: str      # call_module node of the Experts leaf
    count: int        # experts of the layer
    per_rank: int     # experts each ep rank holds (slots, with `rebalance`: (experts + extra) / ep)


def ep_policy(gm: fx.GraphModule, ep: int) -> tuple:
    out = []
    for node in gm.graph.nodes:
        if node.op == "call_module" and isinstance(gm.get_submodule(node.target), moe.Experts):
            n = gm.get_submodule(node.target).w_up.shape[0]
            if n % ep:  # the checker reports this (E0701) before any pass runs
                raise AssertionError(f"{n} experts of {node.target} do not divide over ep = {ep}")
            layer = node.meta.get(T.LAYER)
            extra = layer.rebalance[1] if isinstance(layer, S.MoE) and layer.rebalance is not None else 0
            out.append(Placement(node.name, n, (n + extra) // ep))
    return tuple(out)


def _shard(gm: fx.GraphModule, p: Placement, meta: dict, ep_nodes: tuple = ()) -> None:

    node = next(n for n in gm.graph.nodes if n.name == p.experts)
    old = gm.get_submodule(node.target)
    _, hidden, ffn = old.w_up.shape
    layer = node.meta.get(T.LAYER)
    placed = isinstance(layer, S.MoE) and layer.rebalance is not None
    extra = layer.rebalance[1] if placed else 0  # replicas' slots (runtime/rebalance.py)
    with torch.device("meta"):  # built there: on the CPU first, a large MoE would allocate every expert
        setattr(gm, node.target, moe.Experts(p.per_rank, hidden, ffn, old.act))
        if placed:  # its placement and measured load, beside it (runtime/rebalance.py)
            setattr(gm, f"{node.target}_slots", rebalance.Slots(p.count, p.count + extra, layer.rebalance[0]))
    shapes = gm.meta[T.PARAM_SHAPES]
    for pname, _ in old.named_parameters():
        key = f"{node.target}.{pname}"
        shapes[key] = ((shapes[key][0] + extra) / size(AXIS),) + tuple(shapes[key][1:])
        meta[key] = (0, p.count)
    what = f"`moe` with {p.count} experts, {p.per_rank} per ep rank"
    if isinstance(layer, S.MoE):
        what += f", top-{layer.top_k}, `{layer.capacity}` slots per expert per sequence"
        if layer.capacity_factor == "none":
            what += " (dropless: buffers sized for the worst case, every token of a sequence to one expert)"
    if node.args and len(node.args) == 2:  # dispatch = grouped: the rows sorted by expert, and their counts
        if ep_nodes and not placed:
            _by_node(gm, node, p, layer, ep_nodes)
        else:
            _grouped(gm, node, p, layer)
        return
    to = Collective("all_to_all", "all_to_all", AXIS, f"dispatch of {what}: each rank sends every expert's slots to "
                    "the rank holding that expert")
    back = Collective("all_to_all", "all_to_all", AXIS, f"combine of {what}: the experts' outputs return to their "
                      "tokens' ranks")
    (x,) = node.args
    sent = insert_call(gm, x, moe.all_to_all_dispatch, (x, AXIS), node, to, f"{node.name}_in")
    node.args = (sent,)
    users = list(node.users)
    got = insert_call(gm, node, moe.all_to_all_combine, (node, AXIS), node, back, f"{node.name}_out")
    for u in users:
        u.replace_input_with(node, got)


def _grouped(gm: fx.GraphModule, node: fx.Node, p: Placement, layer) -> None:
    """`dispatch = grouped`: the counts of rows per expert exchanged first (forward only), then the rows sent
    with variable splits to their experts' ranks, the grouped experts on the rows they received, and the outputs
    returned with the splits swapped. Each rank sends its T = b·S·K rows (the dispatch forward and the combine
    backward) and returns the R rows it received (the combine forward and the dispatch backward): the trace
    carries R's expectation under balanced routing, T; runtime.moe bounds it."""
    what = f"`moe` with {p.count} experts, {p.per_rank} per ep rank, dropless, grouped"
    if isinstance(layer, S.MoE):
        what = f"`moe` with {p.count} experts, {p.per_rank} per ep rank, top-{layer.top_k}, dropless, grouped"
    counts_note = Collective("all_to_all", None, AXIS, f"counts of {what}: the rows each rank sends to each "
                             "expert (int64), before the rows", dtype="int64")
    # A rank sends its T rows (dispatch forward, combine backward) and returns the R rows its experts received
    # (combine forward, dispatch backward): R is T on average under balanced routing, at most every choice of the
    # ep ranks' b·S tokens each of its E/ep experts can take, ep·b·S·min(K, E/ep) = T · ep·min(K, E/ep)/K.
    k = layer.top_k if isinstance(layer, S.MoE) else 1
    most = size(AXIS) * sympy.Min(k, sympy.Integer(p.per_rank)) / k
    to = Collective("all_to_all", "all_to_all", AXIS, f"dispatch of {what}: each rank's rows sorted by expert to "
                    "the ranks holding their experts, variable splits (backward: expected under balanced routing)",
                    worst=(("backward", most),))
    back = Collective("all_to_all", "all_to_all", AXIS, f"combine of {what}: the experts' output rows back to "
                      "their tokens' ranks, variable splits (forward: expected under balanced routing)",
                      payload="output", worst=(("forward", most),))
    rows, counts = node.args
    logical = counts
    placed = isinstance(layer, S.MoE) and layer.rebalance is not None
    if placed:  # re-placed experts: the rows to their slots first, back to expert order after (runtime/rebalance.py)
        with gm.graph.inserting_after(counts):
            held = gm.graph.create_node("call_module", f"{node.target}_slots", (), {}, name=f"{node.name}_slots")
        attrs, at = [], held
        for i, what in enumerate(("slot_expert", "load", "slot_load")):
            with gm.graph.inserting_after(at):
                at = gm.graph.create_node("call_function", operator.getitem, (held, i), {}, name=f"{node.name}_{what}")
            attrs.append(at)
        for n in (held, *attrs):
            n.meta.update({k: node.meta[k] for k in (T.SPAN, T.LAYER) if k in node.meta})
        slotted = insert_call(gm, at, rebalance.to_slots, (rows, counts, *attrs), node, None, f"{node.name}_placed")
        with gm.graph.inserting_after(slotted):
            rows = gm.graph.create_node("call_function", operator.getitem, (slotted, 0), {}, name=f"{node.name}_rows")
        with gm.graph.inserting_after(rows):
            counts = gm.graph.create_node("call_function", operator.getitem, (slotted, 1), {},
                                          name=f"{node.name}_slot_rows")
        for n in (rows, counts):
            n.meta.update({k: node.meta[k] for k in (T.SPAN, T.LAYER) if k in node.meta})
    layout = insert_call(gm, counts, moe.exchange_counts, (counts, AXIS), node, counts_note, f"{node.name}_counts")
    sent = insert_call(gm, layout, moe.all_to_all_dispatch_grouped, (rows, counts, layout, AXIS), node, to,
                   f"{node.name}_in")
    node.args = (sent, layout)
    users = list(node.users)
    got = insert_call(gm, node, moe.all_to_all_combine_grouped, (node, counts, layout, AXIS), node, back,
                  f"{node.name}_out")
    if placed:
        got = insert_call(gm, got, rebalance.from_slots, (got, logical, attrs[0]), node, None, f"{node.name}_unslot")
    for u in users:
        u.replace_input_with(node, got)


def _by_node(gm: fx.GraphModule, node: fx.Node, p: Placement, layer, ep_nodes: tuple) -> None:
    """`dispatch = grouped` by node (runtime/moe_nodes.py): sort_tokens, the experts and unsort_combine become
    node_routes (the counts and each crossing row's choices within its node, forward only), node_dispatch (each
    (token, node) row and its gates over the rail, each choice's row over the node), the experts on their rows, and
    node_combine (back over the node, weighted and summed per row, back over the rail, summed per token).

    Rows per micro-batch on a rank of T = b·S tokens, ν the expected distinct nodes of a token's K choices
    (ledger_parts.expected_nodes: balanced routing within the router's groups): T·ν over the rail each way (its
    routing, K int64 each, and gates, K fp32 each, with it), T·K over the node each way. The worst cases bound
    the measured bytes: a rank sends at most T·min(K, nodes) rows over the rail and receives at most T from each
    node; over the node an intermediate forwards at most min(K, E/nodes) choices of each row it received, an expert
    rank receives at most min(K, E/ep) of each row of its node's."""
    nodes, local = ep_nodes
    rows, _ = node.args
    sort = rows.args[0]
    x, slot, _, capacity = sort.args
    unsort = next(u for u in node.users if u.target is moe.unsort_combine)
    gate = unsort.args[2]
    e, k = p.count, layer.top_k
    b, s, h = x.meta[T.SHAPE]
    nu = expected_nodes(e, k, layer.groups, layer.topk_groups, nodes)
    tokens, rails = b * s, size(AXIS) / local  # T, and the nodes (ep / local: the ranks of one index)
    crossing = sympy.ceiling(tokens * nu)  # the rows expected over the rail, a whole number (the ledger's bytes)
    what = f"`moe` with {e} experts, {p.per_rank} per ep rank, top-{k}, dropless, grouped, by node ({nodes} nodes " \
           f"of {local} ep ranks; {float(nu):.2f} nodes per token expected)"
    rail, own = moe_nodes.RAIL, moe_nodes.NODE
    sent_most, got_most = sympy.Min(k, rails) / nu, rails / nu                    # rows over the rail, /expected
    fwd_most = rails * sympy.Min(k, sympy.Integer(e // nodes)) / k                # an intermediate's choices
    exp_most = size(AXIS) * sympy.Min(k, sympy.Integer(p.per_rank)) / k           # an expert rank's rows

    def note(axis, why, elements, dtype="act", worst=(), backward="all_to_all", forward="all_to_all", fp8=""):
        return Collective(forward, backward, axis, f"{why} of {what}", dtype=dtype, elements=elements, worst=worst,
                          fp8=fp8)
    blocks = sympy.ceiling(h / moe_nodes.FP8_BLOCK)  # the scales of a row sent in FP8
    routed = [note(rail, "counts (int64, one per node), before the rows,", sympy.Integer(nodes), "int64",
                   backward=None),
              note(rail, "each crossing row's choices within its node (int64, K per row)", crossing * k, "int64",
                   (("forward", sent_most),), backward=None)]
    if local > 1:
        routed.append(note(own, "counts (int64, one per expert of the node), before the rows,",
                           sympy.Integer(e // nodes), "int64", backward=None))
    moved = [note(rail, "dispatch: each token once to each node its choices lie on, to the rank of its local index "
                  "(float8 under precision = fp8)", crossing * h, worst=(("forward", sent_most),), backward=None,
                  fp8="rows"),
             note(rail, "dispatch's backward: the rows' gradients back, summed per token", crossing * h,
                  worst=(("backward", got_most),), forward=None),
             note(rail, "dispatch: the crossing rows' fp32 scales, one per 128 elements (precision = fp8)",
                  crossing * blocks, "fp32", (("forward", sent_most),), backward=None, fp8="scales"),
             note(rail, "dispatch: the crossing rows' gates (fp32, K per row; backward: their gradients)",
                  crossing * k, "fp32", (("forward", sent_most), ("backward", got_most)))]
    back = [note(rail, "combine: each node's sum of gate × output per row back to its token's rank (backward: "
                 "the tokens' gradients to the nodes they visited)", crossing * h,
                 worst=(("forward", got_most), ("backward", sent_most)))]
    if local > 1:
        moved += [note(own, "dispatch: each choice's row from the rank it reached to its expert's rank on the node "
                       "(float8 under precision = fp8)", tokens * k * h, worst=(("forward", fwd_most),),
                       backward=None, fp8="rows"),
                  note(own, "dispatch's backward: the rows' gradients back to the ranks they came through",
                       tokens * k * h, worst=(("backward", exp_most),), forward=None),
                  note(own, "dispatch: the rows' fp32 scales, one per 128 elements (precision = fp8)",
                       tokens * k * blocks, "fp32", (("forward", fwd_most),), backward=None, fp8="scales")]
        back.insert(0, note(own, "combine: the experts' output rows back to the ranks their rows reached",
                            tokens * k * h, worst=(("forward", exp_most), ("backward", fwd_most))))
    routes = insert_call(gm, sort, moe_nodes.node_routes, (slot, capacity, e), node, None, f"{node.name}_routes")
    routes.meta[T.COLLECTIVE] = tuple(routed)
    sent = insert_call(gm, routes, moe_nodes.node_dispatch, (x, gate, routes), node, None, f"{node.name}_in")
    sent.meta[T.COLLECTIVE] = tuple(moved)
    parts = []
    at = sent
    for i, name in enumerate(("rows", "gates", "layout")):
        with gm.graph.inserting_after(at):
            at = gm.graph.create_node("call_function", operator.getitem, (sent, i), {}, name=f"{node.name}_{name}")
        at.meta.update({key: node.meta[key] for key in (T.SPAN, T.LAYER) if key in node.meta})
        parts.append(at)
    node.args = (parts[0], parts[2])
    got = insert_call(gm, node, moe_nodes.node_combine, (node, parts[1], routes), node, None, f"{node.name}_out")
    got.meta[T.COLLECTIVE] = tuple(back)
    unsort.replace_all_uses_with(got)
    gm.graph.erase_node(unsort)
    for n in list(sort.users):
        if not n.users:
            gm.graph.erase_node(n)
    if not sort.users:
        gm.graph.erase_node(sort)


def expert_parallel_pass(traced: T.Traced, plan) -> T.Traced:
    """Carry out `plan.ep`, the policy's placement of each segment's experts (compiler/pipeline.decide)."""
    if plan.size(AXIS) == 1:
        return traced
    for cls, gm in traced.segments():
        meta: dict = {}
        for placement in plan.decision("ep", cls):
            _shard(gm, placement, meta, plan.ep_nodes)
        gm.meta[T.EP_SHARDS] = meta
        gm.graph.lint()
        gm.recompile()
    traced.annotate()
    return traced
