"""The keys the compiler's graphs carry in `node.meta` and `GraphModule.meta`, and what each holds.

compiler/trace.py sets them (and re-exports them: `T.SHAPE`), the passes add theirs, and the op records
(compiler/ops/), the cost model and codegen read them. Plain strings in a module that imports nothing, so that
ops.py and cost/ can name a key without importing the tracer (which imports ops.py: that would be a circle).

node.meta keys:
  SPAN   the Span of the .scale layer the node computes
  LAYER  the spec layer object itself
  SHAPE  the output shape, a tuple of sympy expressions of the spec's sizes (None for non-tensors)
  FLOPS  forward floating-point operations of the node, sympy (matmuls only, 2·m·n·k: the Megatron convention)
  DTYPE  "act" (the compute precision), "res" (the residual stream: the compute precision, or fp32 under the
         plan's fp32_residual) or "fp32" for a float tensor, "int" for ids, a tuple for a tuple, None otherwise.
         The policy is runtime/precision.py's (Megatron's): weights and every activation in the compute precision,
         fp32 only where the program casts (the loss's `.float()`, a router's softmax); a block's input, a
         repeat's output and what adds to them are the residual stream. The ledger counts each collective's bytes
         and the activation model each kept tensor's by it

"""
from __future__ import annotations

SPAN, LAYER, SHAPE, FLOPS, DTYPE = "span", "layer", "shape", "flops", "dtype"
TP_ROLE = "tp_role"  # a leaf's tensor-parallel role as its layer kind declares it: column, row, vocab, replicated

# GraphModule.meta keys: each traced segment carries what passes and codegen need, so it stands on its own. What
# the graphs hold is the pass structure's, never a number the Plan decides (the axis sizes stay symbols: the cp degree
# is the Plan's, bound by the cost model, compiler.cost.structure).
PARAM_SHAPES = "param_shapes"  # parameter name -> symbolic shape (as held on one rank, once passes have run)
SPANS = "spans"                # leaf module name -> Span of the .scale layer that made it
INPUTS = "inputs"              # placeholder name -> symbolic shape
REPEAT = "repeat"              # for a block: the spec's Repeat it is the body of
TP_SHARDS = "tp_shards"        # parameter name -> (dim sharded over tp, full size of that dim before padding)
TP_PARTIAL_GRADS = "tp_partial_grads"  # parameters whose gradients are partial over tp (sequence parallelism)
EP_SHARDS = "ep_shards"        # parameter name -> (dim sharded over ep, full size of that dim): the experts
# Of the top level once passes.pipeline_split has cut it (absent without pp): its three pieces, each a GraphModule.
# Which blocks each stage holds is not here: the Plan carries the stage layout (plan.stages).
PROLOGUE, EPILOGUE, LOSS = "pp_prologue", "pp_epilogue", "pp_loss"

# node.meta key of a call inserted by a pass that moves data: a passes.tensor_parallel.Collective, or a tuple of them
# where one call moves several things (the node dispatch: runtime/moe_nodes.py).
COLLECTIVE = "collective"

INT_BYTES = 8
"""Bytes of an "int" DTYPE tensor: token ids, targets, positions and slots are int64."""
