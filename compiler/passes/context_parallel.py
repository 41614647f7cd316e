"""Context parallelism over the `cp` mesh axis: each rank holds 1/cp of every sequence (runtime/context_parallel.py).

No policy to decide: every token-wise layer runs on the rank's tokens as it is, and only what mixes positions changes.
Mechanism, `context_parallel_pass`:
  - the sequence dim of every segment's input is S/cp (the runtime gives each rank chunks i and 2·cp − 1 − i of each
    sequence, tokens and targets alike);
  - the learned positions' `arange` becomes `context_parallel.positions`: the rank's true positions;
  - the rotary embedding becomes `context_parallel.rotate`: turned by those positions;
  - causal attention: the keys and values are all-gathered over cp along the sequence before it (backward: their
    gradients reduce-scattered), and `context_parallel.attention` masks each local query against the gathered keys by
    their true positions (`all_gather`, Llama 3's); or `context_parallel.ring_attention` on the local q, k, v
    (`ring`: the keys and values passed around cp, its note counting the sends); or q, k and v all-to-all'd to
    heads / cp over the whole sequence before the attention, which stays as it is, and its output back
    (`all_to_all`, Ulysses);
  - a dropless `moe`: its capacity the rank's S/cp tokens, and each sequence's choice counts summed over cp for its
    aux loss (`_route`);
  - packed documents (runtime/packed.py): `packed.positions` and `packed.rotate` take the cp axis (the rank's true
    positions); under all_gather `packed.attention` takes it too, after the same gathers, its mask the documents of
    the local queries against the gathered keys'; under all_to_all it runs between the same all-to-alls as it is
    (whole sequences in natural order: the single device's mask). ring is refused (compiler/rules/packed.py).
Each gather carries `node.meta[COLLECTIVE]` for the ledger and the comment on the generated call. The loss needs no
change: every rank holds as many tokens, and the gradients and the logged loss are averaged over dp × cp
(runtime.mesh's batch group; tp is not in it). Under tp (+ sp) the pass runs after the tp pass's rewrite: the
keys and values it gathers are each tp rank's heads, and the sequence-parallel gathers and scatters work on the
rank's S/cp chunk. Under pp it rewrites every stage's segment alike. What is not built (windows, soft caps, MLA,
a moe with a capacity, compile) is refused by compiler/rules/context_parallel.py before this pass runs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import fx

from compiler import spec as S
from compiler import trace as T
from compiler.passes.tensor_parallel import Collective
from compiler.symbols import size
from runtime import collectives as C
from runtime import context_parallel as CP
from runtime import moe
from runtime import packed as P
from runtime import rotary

AXIS = "cp"


def _copy_meta(new: fx.Node, origin: fx.Node) -> None:
    for key in (T.SPAN, T.LAYER):
        if key in origin.meta:
            new.meta[key] = origin.meta[key]


def _gather(gm: fx.GraphModule, value: fx.Node, origin: fx.Node, what: str) -> fx.Node:
    note = Collective("all_gather", "reduce_scatter", AXIS,
                      f"context parallelism (all_gather): the {what} of attention gathered over cp along the sequence;"
                      f" their gradients reduce-scattered back", payload="output")
    with gm.graph.inserting_before(origin):
        n = gm.graph.create_node("call_function", C.all_gather_fwd_reduce_scatter_bwd, (value, AXIS, 2), {},
                                 name=f"{value.name}_gathered")
    _copy_meta(n, origin)
    n.meta[T.COLLECTIVE] = note
    return n


def _replace(gm: fx.GraphModule, node: fx.Node, fn, args: tuple, kwargs: dict) -> fx.Node:
    with gm.graph.inserting_before(node):
        new = gm.graph.create_node("call_function", fn, args, kwargs, name=f"{node.name}_cp")
    _copy_meta(new, node)
    node.replace_all_uses_with(new)
    gm.graph.erase_node(node)
    return new


def _route(gm: fx.GraphModule, node: fx.Node, cp: int, seq: int) -> None:
    """A dropless `moe` (the rules refuse a capacity under cp): each token's route is its own, but the aux loss's
    load f_e is the whole sequence's. Each rank counts its tokens' choices per sequence and expert
    (`moe.choice_counts`, as route chooses them), the counts are all-reduced over cp (int64, forward only), and
    route takes them with the sequence's length (runtime.moe.route: each rank adds its share of the aux loss). Its
    capacity, the slots per expert and sequence, becomes the rank's S/cp tokens, as do dispatch's and the sorted
    path's (`_capacity`)."""
    logits, top_k, capacity, aux = node.args[:4]
    chosen = {k: v for k, v in node.kwargs.items() if k in ("scoring", "groups", "topk_groups", "bias")}
    with gm.graph.inserting_before(node):
        counts = gm.graph.create_node("call_function", moe.choice_counts, (logits, top_k), chosen,
                                      name=f"{node.name}_counts")
        whole = gm.graph.create_node("call_function", C.all_reduce_fwd_identity_bwd, (counts, AXIS), {},
                                     name=f"{node.name}_counts_summed")
    for n in (counts, whole):
        _copy_meta(n, node)
    whole.meta[T.COLLECTIVE] = Collective("all_reduce", None, AXIS, "context parallelism (moe): each sequence's "
                                          "choices per expert summed over cp, for the aux loss's load (int64)",
                                          payload="output", dtype="int64")
    node.args = (logits, top_k, capacity // cp, aux, *node.args[4:])
    node.kwargs = {**node.kwargs, "counts": whole, "tokens": seq}


def _capacity(node: fx.Node, cp: int) -> None:
    """A dropless moe's buffers and sorting: its capacity argument (the fourth) the rank's S/cp tokens."""
    node.args = (*node.args[:3], node.args[3] // cp, *node.args[4:])


def _rewrite(gm: fx.GraphModule, variant: str, cp: int, seq: int) -> None:
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is moe.route:
            _route(gm, node, cp, seq)
        elif node.target in (moe.dispatch, moe.sort_tokens, moe.unsort_combine):
            _capacity(node, cp)
        if node.target is torch.arange and isinstance(node.meta.get(T.LAYER), S.Positional):
            _replace(gm, node, CP.positions, tuple(node.args), {**node.kwargs, "axis": AXIS})
        elif node.target is rotary.rotate:
            _replace(gm, node, CP.rotate, tuple(node.args), {**node.kwargs, "axis": AXIS})
        elif node.target in (P.positions, P.rotate):  # packed documents: positions within the documents at the
            # rank's true positions (runtime/packed.py reads the whole sequences' document ids)
            _replace(gm, node, node.target, tuple(node.args), {**node.kwargs, "axis": AXIS})
        elif node.target is P.attention and variant == "all_to_all":  # packed documents under Ulysses: after the
            # heads-to-sequence all-to-alls each rank holds its heads over whole sequences in natural order, so the
            # attention is the single device's (axis None: the whole sequences' document ids, positions 0..S-1)
            _all_to_all(gm, node, cp)
        elif node.target is P.attention:  # packed documents: the local queries' documents against the gathered keys'
            q, k, v, gqa = node.args[:4]
            k_all, v_all = _gather(gm, k, node, "keys"), _gather(gm, v, node, "values")
            _replace(gm, node, P.attention, (q, k_all, v_all, gqa), {**node.kwargs, "axis": AXIS})
        elif node.target is F.scaled_dot_product_attention:
            if not node.kwargs.get("is_causal", False):
                raise NotImplementedError(f"context parallelism: {node.name} is not causal attention")
            {"all_gather": _all_gather, "ring": _ring, "all_to_all": _all_to_all}[variant](gm, node, cp)


def _all_gather(gm: fx.GraphModule, node: fx.Node, cp: int) -> None:
    q, k, v = node.args[:3]
    kw = {"scale": node.kwargs["scale"]} if node.kwargs.get("scale") is not None else {}
    k_all, v_all = _gather(gm, k, node, "keys"), _gather(gm, v, node, "values")
    _replace(gm, node, CP.attention, (q, k_all, v_all, bool(node.kwargs.get("enable_gqa", False)), AXIS), kw)


def _ring(gm: fx.GraphModule, node: fx.Node, cp: int) -> None:
    """One call, `context_parallel.ring_attention`, whose note counts the ring's sends: the keys and values
    (cp − 1 steps) forward; backward again, with their gradients, which take one more step home."""
    q, k, v = node.args[:3]
    kw = {"scale": node.kwargs["scale"]} if node.kwargs.get("scale") is not None else {}
    new = _replace(gm, node, CP.ring_attention, (q, k, v, bool(node.kwargs.get("enable_gqa", False)), AXIS), kw)
    new.meta[T.COLLECTIVE] = Collective(
        "send_recv", "send_recv", AXIS, "context parallelism (ring): the keys and values passed around cp, "
        "cp − 1 steps, each overlapping the compute of the block held; backward again, with their gradients (cp "
        "steps)", payload="keys",
        count=2 * (size(AXIS) - 1), counts=(("backward", 4 * size(AXIS) - 2),))  # symbolic: the ledger's formula


def _all_to_all(gm: fx.GraphModule, node: fx.Node, cp: int) -> None:
    """Ulysses: q, k and v all-to-all'd to (B, H/cp, S, D) before the attention, which runs as it is (causal over
    the whole sequence in natural order), and its output back to (B, H, S/cp, Dv)."""
    def a2a(value, fn, what, before=None, after=None):
        where = gm.graph.inserting_before(before) if before is not None else gm.graph.inserting_after(after)
        with where:
            n = gm.graph.create_node("call_function", fn, (value, AXIS), {}, name=f"{value.name}_{fn.__name__}")
        _copy_meta(n, node)
        n.meta[T.COLLECTIVE] = Collective("all_to_all", "all_to_all", AXIS,
                                          f"context parallelism (all_to_all): {what}")
        return n
    q, k, v = node.args[:3]
    swapped = [a2a(x, CP.heads_to_sequence, f"the {name} of attention: heads scattered over cp, the sequence "
                   "gathered", before=node) for x, name in ((q, "queries"), (k, "keys"), (v, "values"))]
    node.args = (*swapped, *node.args[3:])
    users = list(node.users)
    back = a2a(node, CP.sequence_to_heads, "the output of attention: the sequence scattered back, heads gathered",
               after=node)
    for u in users:
        u.replace_input_with(node, back)


def context_parallel_pass(traced: T.Traced, plan) -> T.Traced:
    """Carry out `axis cp` with `plan.context_parallel` (all_gather, ring or all_to_all)."""
    cp = plan.size(AXIS)
    if cp == 1:
        return traced
    for cls, gm in traced.segments():
        _rewrite(gm, plan.context_parallel, cp, plan.seq_len)
        gm.meta[T.INPUTS] = {k: (v[0], v[1] / size(AXIS), *v[2:]) for k, v in gm.meta[T.INPUTS].items()}
        gm.graph.lint()
        gm.recompile()
    traced.annotate()
    return traced
