"""The operations our layers emit, one record each: everything the compiler knows about an op lives here.

A record says, for one call target (a function, a method name) or one module type:
  shape      its output's symbolic shape and forward FLOPs from its inputs' (compiler/trace.py propagates them; matmuls
             only count FLOPs, 2·m·n·k, the Megatron convention)
  dtype      its output's DTYPE kind ("act", "res", "fp32", "int"; trace.py's module docstring) from its inputs'
  backward   its backward FLOPs (compiler/cost/flops.py's rule: one gradient matmul of the forward's size per
             operand that needs a gradient), when it is not that default
  saved      what its backward keeps (compiler/cost/activations.py: the tensors torch's derivative formula, or our
             autograd Function, saves, and in which dtype; whether its output shares its input's storage)
  selective  whether selective recomputation keeps its output (runtime/recompute.py's policy: matmuls and the
             collectives whose outputs cost communication)
  passes_grad  whether its backward reads none of its inputs' values (sums, views, casts, collectives, rotary
             embeddings: their backward turns back by the angles they keep)
  free       no kernel: the step-time model (compiler/cost/step_time.py) costs it nothing
  dims       a matmul's (batch, M, N, K, weight elements or None), for the step-time model's tile quantisation
  shard      whether a head or inner-width shard flows through it unchanged (the tensor-parallel policy's allow-list,
             compiler/passes/tensor_parallel.py)
  loss       the loss's working set (its logits' moment) and its second read of the logits
  wgrad      what a split backward (zero-bubble) keeps of its weight's output gradient between its halves
  render     (modules) the constructor the generated program writes

A new op is one record in this package, in the module of its family: trace, the FLOP, activation and time models and
the tp policy read it, and an op no record covers is an error at the node that uses it, never a silent zero.

  record.py       the Op record and the rules records share
  modules.py      leaf modules (linear, embedding, norms, bias, experts)
  tensors.py      torch's tensor functions and methods (views, casts, activations, arithmetic, positions)
  attention.py    attention kernels and rotary embeddings
  loss.py         the losses
  collectives.py  the collectives the passes insert
  moe.py          MoE routing and its all-to-alls
"""
from __future__ import annotations

from compiler.ops import attention, collectives, loss, moe, tensors
from compiler.ops.modules import MODULES
from compiler.ops.record import Op, promote

__all__ = ("FUNCTIONS", "MODULES", "Op", "find", "of", "promote", "shard_preserving", "wrapped")

# call target (a function, a method name) -> its record
FUNCTIONS = {**tensors.FUNCTIONS, **attention.FUNCTIONS, **loss.FUNCTIONS, **collectives.FUNCTIONS, **moe.FUNCTIONS}


def find(node, gm=None) -> Op | None:
    """The record of `node`'s operation (a call_module needs its GraphModule `gm`), or None: a placeholder, an
    attribute, the output, a structural module (a repeat), or an op without a record."""
    if node.op == "call_module":
        return MODULES.get(type(gm.get_submodule(node.target)))
    if node.op in ("call_function", "call_method"):
        try:
            return FUNCTIONS.get(node.target)
        except TypeError:  # an unhashable target
            return None
    return None


def of(node, gm=None) -> Op:
    """`find`, where a missing record is an error naming the node: a new op cannot silently drop out of a model."""
    op = find(node, gm)
    if op is None:
        what = type(gm.get_submodule(node.target)).__name__ if node.op == "call_module" else \
            getattr(node.target, "__name__", node.target)
        raise NotImplementedError(f"no record for {what} at node {node.name}: add one in compiler/ops/")
    return op


def wrapped() -> tuple:
    """The functions the tracer keeps as one call each (their insides depend on the data, not on shapes)."""
    return tuple(t for t, op in FUNCTIONS.items() if op.wrapped)


def shard_preserving() -> dict:
    """Call targets through which a head or inner-width shard flows unchanged, by the name a diagnostic gives."""
    return {t: op.name for t, op in FUNCTIONS.items() if op.shard}
