"""Context parallelism over the `cp` mesh axis: each rank holds 1/cp of every sequence (runtime/context_parallel.py).

No policy to decide: every token-wise layer runs on the rank's tokens as it is, and only what mixes positions changes.
Mechanism, `context_parallel_pass` (`context_parallel = all_gather`, Llama 3's):
  - the sequence dim of every segment's input is S/cp (the runtime gives each rank chunks i and 2·cp − 1 − i of each
    sequence, tokens and targets alike);
  - the learned positions' `arange` becomes `context_parallel.positions`: the rank's true positions;
  - the rotary embedding becomes `context_parallel.rotate`: turned by those positions;
  - causal attention: the keys and values are all-gathered over cp along the sequence before it (backward: their
    gradients reduce-scattered), and `context_parallel.attention` masks each local query against the gathered keys by
    their true positions;
  - packed documents (runtime/packed.py): `packed.positions`, `packed.rotate` and `packed.attention` take the cp axis,
    the attention after the same gathers, its mask the documents of the local queries against the gathered keys'.
Each gather carries `node.meta[COLLECTIVE]` for the ledger and the comment on the generated call. The loss needs no
change: every rank holds as many tokens, and the gradients and the logged loss are averaged over dp × cp
(runtime.mesh's batch group). What is not built (ring, all_to_all, windows, soft caps, MLA, pp, ep, FSDP, compile)
is refused by compiler/rules/context_parallel.py before this pass runs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import fx

from compiler import graph_meta as K
from compiler import spec as S
from compiler import trace as T
from compiler.passes.tensor_parallel import Collective
from compiler.symbols import size
from runtime import collectives as C
from runtime import context_parallel as CP
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


def _rewrite(gm: fx.GraphModule) -> None:
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is torch.arange and isinstance(node.meta.get(T.LAYER), S.Positional):
            _replace(gm, node, CP.positions, tuple(node.args), {**node.kwargs, "axis": AXIS})
        elif node.target is rotary.rotate:
            _replace(gm, node, CP.rotate, tuple(node.args), {**node.kwargs, "axis": AXIS})
        elif node.target in (P.positions, P.rotate):  # packed documents: positions within the documents at the
            # rank's true positions (runtime/packed.py reads the whole sequences' document ids)
            _replace(gm, node, node.target, tuple(node.args), {**node.kwargs, "axis": AXIS})
        elif node.target is P.attention:  # packed documents: the local queries' documents against the gathered keys'
            q, k, v, gqa = node.args[:4]
            k_all, v_all = _gather(gm, k, node, "keys"), _gather(gm, v, node, "values")
            _replace(gm, node, P.attention, (q, k_all, v_all, gqa), {**node.kwargs, "axis": AXIS})
        elif node.target is F.scaled_dot_product_attention:
            q, k, v = node.args[:3]
            if not node.kwargs.get("is_causal", False):
                raise NotImplementedError(f"context parallelism: {node.name} is not causal attention")
            kw = {"scale": node.kwargs["scale"]} if node.kwargs.get("scale") is not None else {}
            k_all, v_all = _gather(gm, k, node, "keys"), _gather(gm, v, node, "values")
            _replace(gm, node, CP.attention, (q, k_all, v_all, bool(node.kwargs.get("enable_gqa", False)), AXIS), kw)


def context_parallel_pass(traced: T.Traced, plan) -> T.Traced:
    """Carry out `axis cp` with `plan.context_parallel` (all_gather: the one variant built; the rules refuse the
    others)."""
    cp = plan.size(AXIS)
    if cp == 1:
        return traced
    if plan.context_parallel != "all_gather":
        raise NotImplementedError(f"context_parallel = {plan.context_parallel} is not built (the rules refuse it)")
    for cls, gm in traced.segments():
        _rewrite(gm)
        gm.meta[T.INPUTS] = {k: (v[0], v[1] / size(AXIS), *v[2:]) for k, v in gm.meta[T.INPUTS].items()}
        gm.graph.lint()
        gm.recompile()
    traced.top.meta[K.CP_SIZE] = cp
    traced.annotate()
    return traced
