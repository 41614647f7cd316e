"""Trace the model's segments to torch.fx graphs and annotate every node.

node.meta and GraphModule.meta keys: compiler/graph_meta.py (re-exported here: `T.SHAPE`).

Shapes, FLOPs and dtypes are propagated by the rules of compiler/ops/, one record per operation our layer
vocabulary emits; an operation without a record is an error, so a new layer cannot silently drop out of the cost
model.
"""
from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass

import sympy
from torch import fx, nn

from compiler import layers as L
from compiler import model as M
from compiler import ops
from compiler.graph_meta import (COLLECTIVE, DTYPE, EP_SHARDS, EPILOGUE, FLOPS, INPUTS, LAYER,  # noqa: F401
                                 LOSS, PARAM_SHAPES, PROLOGUE, REPEAT, SHAPE, SPAN, SPANS, TP_PARTIAL_GRADS, TP_ROLE,
                                 TP_SHARDS)
from compiler.symbols import MICRO_BATCH
from runtime.layers import Repeat


class _Tracer(fx.Tracer):
    def __init__(self):
        # MoE routing, dispatch and combine stay calls: their insides depend on the data, not on shapes. The rotary
        # embedding stays one call too: the program reads `rotary.rotate(q, k, theta, scaling)` (compiler/ops/:
        # the records marked `wrapped`). Autowrap covers compiler/model.py's globals; the layer kinds' builders
        # keep theirs whole with compiler/layers/calls.py `kept_whole`.
        super().__init__(autowrap_functions=ops.wrapped())

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, Repeat) or type(m) in ops.MODULES or super().is_leaf_module(m, qualname)

    def create_node(self, *args, **kwargs):
        node = super().create_node(*args, **kwargs)
        layer = M.CURRENT_LAYER.get()
        if layer is not None:
            node.meta[LAYER] = layer
            node.meta[SPAN] = layer.span
            if node.op == "call_module":  # the layer kind's declared role (compiler/layers), checked by the tp pass
                node.meta[TP_ROLE] = L.tp_role(layer, node.target)
        return node


def trace(module: M.Segment, name: str, inputs: dict) -> fx.GraphModule:
    graph = _Tracer().trace(module)
    for node in graph.nodes:  # annotations would make the emitted code name FX-internal globals
        if node.op in ("placeholder", "output"):
            node.type = None
    for node in graph.nodes:
        op = ops.find(node) if node.op == "call_function" else None
        if op is not None and op.defaults:
            node.kwargs = {}  # every keyword the tracer recorded is the default (reduction="mean", ...)
        if op is not None and op.outputs:  # name the parts of a tuple result (route's slot and gate, ...)
            for user in list(node.users):
                if user.target is operator.getitem:
                    user._rename(op.outputs[user.args[1]])
    gm = fx.GraphModule(module, graph, name)
    gm.meta[PARAM_SHAPES] = dict(module.param_shapes)
    gm.meta[SPANS] = dict(module.spans)
    gm.meta[INPUTS] = dict(inputs)
    return gm


@dataclass
class Traced:
    """The traced segments of a model: the top level and one block per `repeat` (by its module name)."""

    model: M.ScaleModel   # the single-device model the graphs were traced from
    top: fx.GraphModule
    blocks: dict          # repeat name (`blocks`, `blocks_2`, ...) -> the block's GraphModule
    model_flops_fwd: sympy.Expr = sympy.Integer(0)  # forward FLOPs of one micro-batch, before any pass
    model_flops_bwd: sympy.Expr = sympy.Integer(0)  # its backward, by compiler/cost/flops.py's per-node rules
    padding_flops: sympy.Expr = sympy.Integer(0)  # forward + backward of the experts' empty slots
    # (the three set by compiler/lower.py `trace`, from compiler/cost/flops.py `model_flops`, on the unsharded graphs)

    @property
    def spec(self):
        """The resolved specification the model was built from."""
        return self.model._spec

    def copy(self) -> "Traced":
        """An independent copy of the graphs and their annotations (the model, never mutated, is shared): passes
        work on a copy, so the unsharded trace stays what every candidate plan is decided and costed from."""
        import copy
        # The repeats' own modules are never changed by a pass (each block's graph holds its own copy of the layers
        # it shards): shared, not copied, so a 96-block model copies in milliseconds.
        memo = {id(self.model): self.model}
        memo.update({id(m): m for m in self.top.modules() if isinstance(m, Repeat)})
        return dataclasses.replace(self, top=copy.deepcopy(self.top, memo),
                                   blocks={k: copy.deepcopy(v, memo) for k, v in self.blocks.items()})

    def segments(self):
        """(class name in the emitted program, GraphModule), blocks first: the top level refers to them."""
        for name, gm in self.blocks.items():
            yield class_name(name), gm
        yield "Model", self.top

    def shard_patterns(self, key: str) -> tuple:
        """The parameters a pass sharded, by the meta key it recorded them under (TP_SHARDS, EP_SHARDS): (name
        pattern, dim, full size of that dim), a block's parameters as `repeat.*.name` (every block alike). What the
        runtime shards by (runtime/config.py's tp_shards, ep_shards) and what `reshard` places."""
        return tuple((prefix + pname, dim, full)
                     for prefix, gm in [("", self.top)] + [(f"{name}.*.", gm) for name, gm in self.blocks.items()]
                     for pname, (dim, full) in gm.meta.get(key, {}).items())

    def partial_grads(self) -> tuple:
        """The parameters whose gradients tp leaves partial (sequence parallelism), as name patterns."""
        return tuple(prefix + p for prefix, gm in [("", self.top)] + [(f"{name}.*.", gm)
                                                                      for name, gm in self.blocks.items()]
                     for p in gm.meta.get(TP_PARTIAL_GRADS, ()))

    def repeats(self) -> dict:
        """repeat name -> (count, block GraphModule), for propagation over the top level."""
        return {name: (gm.meta[REPEAT].count, gm) for name, gm in self.blocks.items()}

    def annotate(self) -> None:
        """(Re)compute SHAPE and FLOPS on every node, after tracing and after each pass."""
        for gm in self.blocks.values():
            propagate(gm)
        propagate(self.top, self.repeats())


def class_name(repeat_name: str) -> str:
    return "Block" if repeat_name == "blocks" else "Block" + repeat_name.split("_")[-1]


def trace_model(model: M.ScaleModel) -> Traced:
    seq = model._spec.train.seq_len
    blocks = {}
    for name, rep in model.repeats:
        gm = trace(getattr(model, name)[0], class_name(name), {"x": (MICRO_BATCH, seq, model._emb.hidden)})
        gm.meta[REPEAT] = rep
        blocks[name] = gm
    top = trace(model, "Model", {"tokens": (MICRO_BATCH, seq), "targets": (MICRO_BATCH, seq)})
    traced = Traced(model, top, blocks)
    traced.annotate()
    return traced


# ---------------------------------------------------------------------------------------------------------------
# Symbolic shape propagation


def _numel(shape) -> sympy.Expr:
    return sympy.Mul(*shape)


def propagate(gm: fx.GraphModule, repeats: dict | None = None) -> None:
    """Set SHAPE and FLOPS on every node of `gm`, from its inputs' and parameters' symbolic shapes (gm.meta)."""
    params, inputs = gm.meta[PARAM_SHAPES], gm.meta[INPUTS]
    env: dict[fx.Node, object] = {}

    def val(a):
        return fx.node.map_arg(a, lambda n: env[n])

    def dtypes(a):
        return fx.node.map_arg(a, lambda n: n.meta.get(DTYPE))

    for node in gm.graph.nodes:
        flops = sympy.Integer(0)
        args, kwargs = val(node.args), val(node.kwargs)
        if node.op == "placeholder":
            out = tuple(inputs[node.target])
        elif node.op == "get_attr":
            out = params[node.target]
        elif node.op == "call_module" and isinstance(gm.get_submodule(node.target), Repeat):
            count, block_gm = repeats[node.target]
            out = args[0]
            flops = count * graph_flops(block_gm)
        elif node.op in ("call_module", "call_function", "call_method"):
            out, flops = ops.of(node, gm).shape(node, args, kwargs, gm)
        elif node.op == "output":
            out = args[0]
        else:
            raise NotImplementedError(node.op)
        env[node] = out
        node.meta[SHAPE] = out if isinstance(out, tuple) else None
        node.meta[FLOPS] = sympy.expand(flops)
        node.meta[DTYPE] = _dtype_rule(node, gm, dtypes(node.args))


def _dtype_rule(node: fx.Node, gm: fx.GraphModule, args: tuple):
    """The DTYPE of a node's output from its inputs' (see the module docstring)."""
    if node.op == "placeholder":
        return "int" if node.target in ("tokens", "targets") else "res"  # a block's input: the residual stream
    if node.op == "get_attr":
        return "act"  # a weight (the tied head's)
    if node.op == "output":
        return args[0] if args else None
    if node.op == "call_module" and isinstance(gm.get_submodule(node.target), Repeat):
        return "res"  # the stream it carries (cast to fp32 on entry under fp32_residual)
    return ops.of(node, gm).dtype(node, gm, args)


def graph_flops(gm: fx.GraphModule) -> sympy.Expr:
    return sympy.expand(sum((n.meta.get(FLOPS, 0) for n in gm.graph.nodes), sympy.Integer(0)))


# -- the repeats' blocks numbered across the repeats (what a pipeline cuts: compiler/passes/pipeline_split.py) --


def repeat_edges(traced: "Traced", value) -> tuple:
    """(repeat name, first global block, end global block) of each `repeat` in order, its count a number under
    `value`: a pipeline's global block i is the i-th of the repeats' blocks concatenated."""
    out, first = [], 0
    for name, gm in traced.blocks.items():
        n = int(value(gm.meta[REPEAT].count))
        out.append((name, first, first + n))
        first += n
    return tuple(out)


def held(edges: tuple, lo: int, hi: int) -> tuple:
    """(index of the repeat in `edges`, its first local block, its end local block) of each repeat with blocks in the
    global range [lo, hi): what a stage holding blocks lo..hi-1 builds of each repeat."""
    return tuple((i, max(lo, a) - a, min(hi, b) - a) for i, (_, a, b) in enumerate(edges) if max(lo, a) < min(hi, b))
