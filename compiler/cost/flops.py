"""FLOPs: the forward comes from the trace (trace.FLOPS on every node, matmuls only, 2·m·n·k); the backward from a
rule per node, never a blanket 3×.

The rule: a node's backward computes the gradient of each of its operands that needs one, and each such gradient
is a matmul of the forward's size (for y = x·W: dx = dy·Wᵀ and dW = xᵀ·dy). So backward FLOPs = forward FLOPs × the
number of the node's operands that need a gradient: a weight always does; an activation does when it depends on a
parameter or on a block's input (the token ids and targets do not). A `repeat` node's backward is its block's,
times the count.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import sympy

from compiler import ops as O
from compiler import trace as T

if TYPE_CHECKING:
    from torch import fx

# Graph inputs that need no gradient: the token ids and targets of the top level (a block's `x` and a pipeline
# piece's `x` or `logits` carry the residual stream, which does).
NO_GRAD_INPUTS = frozenset({"tokens", "targets"})


def needs_grad(gm: fx.GraphModule) -> dict:
    """node -> whether its value depends on a parameter or a gradient-carrying input. Public: the trace and the
    step-time model (step_time.py) count a matmul's gradient matmuls by the same rule as the backward FLOPs."""
    out: dict = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            out[node] = node.target not in NO_GRAD_INPUTS
        elif node.op == "get_attr":
            out[node] = True
        else:
            deps = [a for a in node.all_input_nodes]
            has_params = node.op == "call_module" and any(True for _ in gm.get_submodule(node.target).parameters())
            out[node] = has_params or any(out.get(a, False) for a in deps)
    return out


def node_backward(node: fx.Node, gm: fx.GraphModule, needs: dict, repeats: dict | None = None) -> sympy.Expr:
    """Backward FLOPs of one node (see the module's rule; an op's own rule is its record's `backward`)."""
    from torch import fx
    fwd = node.meta.get(T.FLOPS, 0)
    if fwd == 0:
        return sympy.Integer(0)
    if node.op == "call_module" and repeats is not None and node.target in repeats:
        count, block = repeats[node.target]
        return count * graph_backward(block)
    op = O.find(node, gm)
    if op is not None and op.backward is not None:
        return op.backward(node, gm, needs, fwd)
    # a matmul of two operands (F.linear's input and weight, or two activations): one gradient matmul per operand
    # that needs one
    operands = [a for a in node.args[:2] if isinstance(a, fx.Node)]
    return fwd * sum(1 for a in operands if needs.get(a, False))


def graph_backward(gm: fx.GraphModule, repeats: dict | None = None) -> sympy.Expr:
    """Backward FLOPs of one micro-batch through `gm` (of its forward's FLOPs, by node)."""
    needs = needs_grad(gm)
    return sympy.expand(sum((node_backward(n, gm, needs, repeats) for n in gm.graph.nodes), sympy.Integer(0)))


def model_flops(traced) -> tuple:
    """(forward, backward, padding) FLOPs of one micro-batch through the whole model, from its unsharded trace.

    Model FLOPs count what the model computes, as MFU is defined (PaLM, Chowdhery et al. 2022): top_k experts per
    token. The program computes every slot of the experts' buffers, padded to capacity (E·C per sequence, C = seq
    when dropless): the difference (forward and backward) is hardware FLOPs only, which step times are costed with.
    compiler/lower.py `trace` records the three on the Traced, before any pass shards the graphs."""
    seq = traced.spec.train.seq_len
    padding_fwd = padding_bwd = sympy.Integer(0)
    for count, gm in [(1, traced.top)] + [(count, gm) for count, gm in traced.repeats().values()]:
        needs = None
        for node in gm.graph.nodes:
            op = O.find(node, gm) if node.op == "call_module" else None
            empty = op.padding(node, seq) if op is not None and op.padding is not None else None
            if empty is not None:
                if needs is None:
                    needs = needs_grad(gm)
                padding_fwd += count * node.meta[T.FLOPS] * empty
                padding_bwd += count * node_backward(node, gm, needs) * empty
    return (sympy.expand(graph_forward(traced.top) - padding_fwd),
            sympy.expand(graph_backward(traced.top, traced.repeats()) - padding_bwd),
            sympy.expand(padding_fwd + padding_bwd))


def graph_forward(gm: fx.GraphModule) -> sympy.Expr:
    return T.graph_flops(gm)


def recomputed_forward(gm: fx.GraphModule, mode: str) -> sympy.Expr:
    """FLOPs a block's recomputation adds to one micro-batch: `full` re-runs its whole forward; `selective` the
    ops whose outputs it does not keep that do matmuls (the attention core: norms and elementwise ops count 0 by
    the convention); `none` nothing."""
    if mode == "full":
        return graph_forward(gm)
    if mode == "selective":
        return sympy.expand(sum((n.meta.get(T.FLOPS, 0) for n in gm.graph.nodes
                                 if (op := O.find(n, gm)) is not None and not op.selective), sympy.Integer(0)))
    return sympy.Integer(0)
