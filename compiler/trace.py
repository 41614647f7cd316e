"""Trace the model's segments to torch.fx graphs and annotate every node.

node.meta keys (defined here, used everywhere):
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

Shapes are propagated by rules, one per operation our layer vocabulary emits; an operation without a rule is an
error, so a new layer cannot silently drop out of the cost model.
"""
from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass

import sympy
import torch
import torch.nn.functional as F
from torch import fx, nn

from compiler import layers as L
from compiler import model as M
from compiler.symbols import MICRO_BATCH, size
from runtime import collectives as C
from runtime import moe, rotary
from runtime.layers import Bias, Repeat

SPAN, LAYER, SHAPE, FLOPS, DTYPE = "span", "layer", "shape", "flops", "dtype"
TP_ROLE = "tp_role"  # a leaf's tensor-parallel role as its layer kind declares it: column, row, vocab, replicated

# GraphModule.meta keys: each traced segment carries what passes and codegen need, so it stands on its own.
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

# node.meta key of a call inserted by a pass that moves data: a passes.tensor_parallel.Collective.
COLLECTIVE = "collective"


class _Tracer(fx.Tracer):
    def __init__(self):
        # MoE routing, dispatch and combine stay calls: their insides depend on the data, not on shapes. The rotary
        # embedding stays one call too: the program reads `rotary.rotate(q, k, theta, scaling)`.
        super().__init__(autowrap_functions=(moe.route, moe.dispatch, moe.combine, rotary.rotate))

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, (Repeat, Bias, moe.Experts)) or super().is_leaf_module(m, qualname)

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
        if node.op == "call_function" and node.target is F.cross_entropy:
            node.kwargs = {}  # every keyword the tracer recorded is the default (reduction="mean", ...)
        if node.op == "call_function" and node.target is moe.route:  # name the pair route() returns
            for user in list(node.users):
                if user.target is operator.getitem:
                    user._rename(("slot", "gate")[user.args[1]])
        if node.op == "call_function" and node.target is rotary.rotate:  # and the turned queries and keys
            for user in list(node.users):
                if user.target is operator.getitem:
                    user._rename(("q_turned", "k_turned")[user.args[1]])
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
    padding_flops: sympy.Expr = sympy.Integer(0)  # forward + backward of the experts' empty slots (see trace_model)

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
    from compiler.cost.flops import graph_backward
    # Model FLOPs count what the model computes, as MFU is defined (PaLM, Chowdhery et al. 2022): top_k experts per
    # token. The program computes every slot of the experts' buffers, padded to capacity (E·C per sequence, C = seq
    # when dropless): the difference is hardware FLOPs only (padding_flops), which step times are costed with.
    padding_fwd = padding_bwd = sympy.Integer(0)
    for count, gm in [(1, top)] + [(rep.count, blocks[name]) for name, rep in model.repeats]:
        needs = None
        for node in gm.graph.nodes:
            layer = node.meta.get(LAYER)
            if node.op == "call_module" and isinstance(gm.get_submodule(node.target), moe.Experts) \
                    and layer is not None and hasattr(layer, "top_k"):
                if needs is None:
                    from compiler.cost.flops import _needs_grad, node_backward
                    needs = _needs_grad(gm)
                empty = 1 - sympy.Integer(layer.top_k) * seq / (layer.experts * layer.capacity)
                padding_fwd += count * node.meta[FLOPS] * empty
                padding_bwd += count * node_backward(node, gm, needs) * empty
    traced.model_flops_fwd = sympy.expand(graph_flops(top) - padding_fwd)
    traced.model_flops_bwd = sympy.expand(graph_backward(top, traced.repeats()) - padding_bwd)
    traced.padding_flops = sympy.expand(padding_fwd + padding_bwd)
    return traced


# ---------------------------------------------------------------------------------------------------------------
# Symbolic shape propagation


def _numel(shape) -> sympy.Expr:
    return sympy.Mul(*shape)


def _dim(shape, d: int) -> int:
    return d % len(shape)


def _broadcast(a, b):
    if a is None:
        return b
    if b is None:
        return a
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    return tuple(y if x == 1 else x for x, y in zip(a, b))


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
        elif node.op == "call_module":
            mod = gm.get_submodule(node.target)
            x = args[0]
            if isinstance(mod, nn.Linear):
                w = params[f"{node.target}.weight"]
                out = tuple(x[:-1]) + (w[0],)
                flops = 2 * _numel(x[:-1]) * w[0] * w[1]
            elif isinstance(mod, nn.Embedding):
                out = tuple(x) + (params[f"{node.target}.weight"][1],)
            elif isinstance(mod, (nn.LayerNorm, nn.RMSNorm, Bias)):
                out = x
            elif isinstance(mod, moe.Experts):
                e, h, f = params[f"{node.target}.w_up"]
                out = x
                # Every slot is computed, empty or not (the buffers are padded to capacity): 2 or 3 matmuls.
                flops = (3 if mod.act == "swiglu" else 2) * 2 * x[0] * x[1] * h * f
            elif isinstance(mod, Repeat):
                count, block_gm = repeats[node.target]
                out = x
                flops = count * graph_flops(block_gm)
            else:
                raise NotImplementedError(f"no shape rule for module {type(mod).__name__} ({node.target})")
        elif node.op in ("call_function", "call_method"):
            out, flops = _function_rule(node, args, kwargs)
        elif node.op == "output":
            out = args[0]
        else:
            raise NotImplementedError(node.op)
        env[node] = out
        node.meta[SHAPE] = out if isinstance(out, tuple) else None
        node.meta[FLOPS] = sympy.expand(flops)
        node.meta[DTYPE] = _dtype_rule(node, gm, dtypes(node.args))


def _function_rule(node: fx.Node, args, kwargs):
    t = node.target
    zero = sympy.Integer(0)
    if t in ("unflatten",) or t is torch.unflatten:
        x, d, sizes = args
        d = _dim(x, d)
        sizes = list(sizes)
        if -1 in sizes:
            known = sympy.Mul(*[s for s in sizes if s != -1])
            sizes[sizes.index(-1)] = sympy.simplify(x[d] / known)
        return tuple(x[:d]) + tuple(sizes) + tuple(x[d + 1:]), zero
    if t == "transpose" or t is torch.transpose:
        x, a, b = args
        s = list(x)
        a, b = _dim(x, a), _dim(x, b)
        s[a], s[b] = s[b], s[a]
        return tuple(s), zero
    if t == "flatten" or t is torch.flatten:
        x = args[0]
        start = _dim(x, args[1] if len(args) > 1 else kwargs.get("start_dim", 0))
        end = _dim(x, args[2] if len(args) > 2 else kwargs.get("end_dim", -1))
        return tuple(x[:start]) + (_numel(x[start:end + 1]),) + tuple(x[end + 1:]), zero
    if t in ("float", "contiguous", "to") or t in (F.gelu, F.silu, F.relu, torch.tanh):
        return args[0], zero
    if t in (operator.add, operator.mul, operator.sub, torch.add, torch.mul):
        return _broadcast(args[0] if isinstance(args[0], tuple) else None,
                          args[1] if isinstance(args[1], tuple) else None), zero
    if t is getattr:
        if args[1] == "shape":
            return args[0], zero
        return None, zero  # .device, .dtype
    if t is operator.getitem:
        return args[0][args[1]], zero
    if t is torch.arange:
        return (args[0],), zero
    if t is F.linear:
        x, w = args[0], args[1]
        return tuple(x[:-1]) + (w[0],), 2 * _numel(x[:-1]) * w[0] * w[1]
    if t is F.scaled_dot_product_attention:
        q, k, v = args[:3]
        # Q·Kᵀ and (softmax)·V, each 2·B·H·Sq·Sk·D; the causal mask is not discounted (Megatron's convention).
        b, h, sq, d = q
        sk, dv = k[2], v[3]
        return (b, h, sq, dv), 2 * b * h * sq * sk * d + 2 * b * h * sq * sk * dv
    if t is F.cross_entropy or t is C.vocab_parallel_cross_entropy:
        return (), zero
    if t in (C.identity_fwd_all_reduce_bwd, C.all_reduce_fwd_identity_bwd):
        return args[0], zero
    if t is C.all_gather_fwd_reduce_scatter_bwd:
        x, axis, d = args
        return tuple(s * size(axis) if i == _dim(x, d) else s for i, s in enumerate(x)), zero
    if t in (C.reduce_scatter_fwd_all_gather_bwd, C.split_fwd_all_gather_bwd):
        x, axis, d = args
        return tuple(s / size(axis) if i == _dim(x, d) else s for i, s in enumerate(x)), zero
    if t is moe.route:
        b, s, _ = args[0]
        return ((b, s, args[1]), (b, s, args[1])), zero
    if t is rotary.rotate:  # elementwise: no matmul FLOPs (the model FLOPs count matmuls only)
        return (tuple(args[0]), tuple(args[1])), zero
    if t is moe.dispatch:
        layer = node.meta[LAYER]  # the symbolic sizes; the call's arguments are their numbers
        b, s, h = args[0]
        return (layer.experts, b * layer.capacity, h), zero
    if t is moe.combine:
        b, s, _ = args[1]
        return (b, s, args[0][2]), zero
    if t is moe.all_to_all_dispatch:
        e, n, h = args[0]
        return (e / size(args[1]), n * size(args[1]), h), zero
    if t is moe.all_to_all_combine:
        e, n, h = args[0]
        return (e * size(args[1]), n / size(args[1]), h), zero
    if t is C.vocab_parallel_lookup:
        return tuple(args[0]) + (args[1][1],), zero
    raise NotImplementedError(f"no shape rule for {getattr(t, '__name__', t)} at node {node.name}")


# Ops whose output is in the compute precision (they read bf16 weights), and ops whose output is fp32 whatever
# their input.
_ACT_OPS = (F.linear, F.scaled_dot_product_attention, moe.dispatch, C.vocab_parallel_lookup)
_FP32_OPS = ("float", F.cross_entropy, C.vocab_parallel_cross_entropy)


def _promote(*kinds) -> str | None:
    """torch's promotion of a binary op's result: fp32 over the residual stream (fp32 or the compute precision)
    over the compute precision."""
    floats = [k for k in kinds if k in ("act", "res", "fp32")]
    if not floats:
        return next((k for k in kinds if k is not None), None)
    return next(k for k in ("fp32", "res", "act") if k in floats)


def _dtype_rule(node: fx.Node, gm: fx.GraphModule, args: tuple):
    """The DTYPE of a node's output from its inputs' (see the module docstring)."""
    if node.op == "placeholder":
        return "int" if node.target in ("tokens", "targets") else "res"  # a block's input: the residual stream
    if node.op == "get_attr":
        return "act"  # a weight (the tied head's)
    if node.op == "output":
        return args[0] if args else None
    t = node.target
    if node.op == "call_module":
        mod = gm.get_submodule(t)
        if isinstance(mod, (nn.Linear, moe.Experts, nn.Embedding, nn.LayerNorm, nn.RMSNorm)):
            return "act"  # norms compute in fp32 inside and return the compute precision (runtime.precision)
        if isinstance(mod, Repeat):
            return "res"  # the stream it carries (cast to fp32 on entry under fp32_residual)
        return _promote(args[0], "act")  # Bias adds a parameter
    if t in _ACT_OPS:
        return "act"
    if t in _FP32_OPS:
        return "fp32"
    if t is torch.arange:
        return "int"
    if t is getattr:
        return None
    if t is moe.route:
        return ("int", "fp32")  # slots, gates
    if t is rotary.rotate:
        return (args[0], args[1])
    if t is operator.getitem:
        return args[0][args[1]] if isinstance(args[0], tuple) else args[0]
    if t is moe.combine:  # the experts' outputs, plus the token itself for dropped = identity
        return _promote(args[0], *(args[3:4]))
    if t in (operator.add, operator.mul, operator.sub, torch.add, torch.mul):
        return _promote(*[a for a in args if isinstance(a, str)])
    return args[0] if args and isinstance(args[0], (str, tuple)) else None  # shape ops, activations, collectives


def graph_flops(gm: fx.GraphModule) -> sympy.Expr:
    return sympy.expand(sum((n.meta.get(FLOPS, 0) for n in gm.graph.nodes), sympy.Integer(0)))
