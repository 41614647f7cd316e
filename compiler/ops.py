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

A new op is one record in this file: trace, the FLOP, activation and time models and the tp policy read it, and an
op no record covers is an error at the node that uses it, never a silent zero.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Callable

import sympy
import torch
import torch.nn.functional as F
from torch import nn

from compiler import graph_meta as K
from compiler.graph_meta import INT_BYTES
from compiler.symbols import size
from runtime import collectives as C
from runtime import attention, moe, rotary
from runtime import context_parallel as CP
from runtime import packed as P
from runtime.layers import Bias, ZeroCenteredRMSNorm


ZERO = sympy.Integer(0)


def _numel(shape) -> sympy.Expr:
    return sympy.Mul(*shape) if shape else sympy.Integer(1)


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


def promote(*kinds) -> str | None:
    """torch's promotion of a binary op's result: fp32 over the residual stream (fp32 or the compute precision)
    over the compute precision."""
    floats = [k for k in kinds if k in ("act", "res", "fp32")]
    if not floats:
        return next((k for k in kinds if k is not None), None)
    return next(k for k in ("fp32", "res", "act") if k in floats)


# -- the rules records share --------------------------------------------------------------------------------------


def _same_shape(node, args, kwargs, gm):
    return args[0], ZERO


def _same_dtype(node, gm, args):
    """Shape ops, activations, collectives: the input's kind."""
    return args[0] if args and isinstance(args[0], (str, tuple)) else None


def _act(node, gm, args):
    return "act"


def _fp32(node, gm, args):
    return "fp32"


def _keeps_nothing(g, node, args):
    pass


def _keeps_input(g, node, args):
    g.keep(args[0])


def _keeps_output(g, node, args):
    g.keep(node)


def _aliases_input(g, node, args):
    if isinstance(args[0], type(node)):
        g.views[node] = args[0]


def _keeps_matmul_input(g, node, args):
    g.keep_matmul_input(args[0], node)


def _linear_dims(node, gm):
    x, w = node.args[0].meta[K.SHAPE], node.args[1].meta[K.SHAPE]
    return 1, _numel(x[:-1]), w[0], w[1], w[0] * w[1]


def _output_grad(node, gm, widths):
    """A linear module's split backward keeps its output's gradient, in the compute precision."""
    return _numel(node.meta[K.SHAPE]) * widths["act"]


@dataclass(frozen=True)
class Op:
    """One operation (see the module docstring for each field)."""

    name: str
    shape: Callable = _same_shape
    dtype: Callable = _same_dtype
    saved: Callable = _keeps_nothing
    backward: Callable | None = None
    selective: bool = False
    passes_grad: bool = False
    free: bool = False
    dims: Callable | None = None
    shard: bool = False
    loss: Callable | None = None
    wgrad: Callable | None = None
    render: Callable | None = None
    computes: bool = True      # a collective that also computes (costed as memory traffic besides its transfer)
    outputs: tuple = ()        # names given to the getitem nodes of a tuple result, in order
    wrapped: bool = False      # traced as one call (torch.fx autowrap), not through its body
    copy: bool = False         # its backward holds a copy of its gradient (a tensor-parallel all-reduce's)
    defaults: bool = False     # every keyword the tracer records for it is the default: dropped from the program
    freed_when_sent: bool = False  # a stage output it makes is freed once sent (runtime.pipeline.FREEABLE: its
                                   # backward node saves nothing)
    padding: Callable | None = None  # (node, seq) -> the fraction of its FLOPs spent on empty slots, or None
    attention: bool = False    # the fused attention kernel: timed at the device's attention efficiency
    kept: Callable | None = None     # (node, gm, needed, act) -> what selective recomputation keeps of it, when not
                                     # its output (where `needed`: the backward reads it)
    side: tuple = ()           # positions of arguments a head shard's call takes whole (replicated) under tp:
                               # not traced back to a column linear; the tp pass makes their gradient a sum over tp


# -- modules ------------------------------------------------------------------------------------------------------


def _linear_shape(node, args, kwargs, gm):
    w = gm.meta[K.PARAM_SHAPES][f"{node.target}.weight"]
    x = args[0]
    return tuple(x[:-1]) + (w[0],), 2 * _numel(x[:-1]) * w[0] * w[1]


def _module_backward(node, gm, needs, fwd):
    """A module with weights: one gradient matmul for the weights, one per input that needs a gradient."""
    weights = 1 if any(True for _ in gm.get_submodule(node.target).parameters()) else 0
    inputs = sum(1 for a in node.all_input_nodes if needs.get(a, False))
    return fwd * (weights + inputs)


def _module_linear_dims(node, gm):
    out, inp = gm.meta[K.PARAM_SHAPES][f"{node.target}.weight"]
    x = node.args[0].meta[K.SHAPE]
    return 1, _numel(x[:-1]), out, inp, out * inp


def _render_linear(mod):
    return f"nn.Linear({mod.in_features}, {mod.out_features}{'' if mod.bias is not None else ', bias=False'})"


def _layernorm_saved(g, node, args):
    x = args[0]
    g.norm_input(x, node)
    rows = _numel(x.meta[K.SHAPE][:-1])
    # mean and reciprocal std: fp32 on CUDA; on CPU in the input's dtype
    stat = 4 if g.device == "cuda" else g.widths.get(x.meta.get(K.DTYPE), 4)
    g.new(node, "stats", (rows,), 2 * stat)


def _rms_composite(g, node, x) -> None:
    """torch's composite RMSNorm: its input upcast to fp32 (a copy when it is not fp32 already), the reciprocal RMS
    per row and the normalised fp32 rows."""
    if g.widths.get(x.meta.get(K.DTYPE), 4) < 4:
        g.new(node, "upcast", x.meta[K.SHAPE], 4)
    else:
        g.norm_input(x, node)
    g.new(node, "stats", (_numel(x.meta[K.SHAPE][:-1]),), 4)
    g.new(node, "normed", x.meta[K.SHAPE], 4)


def _rmsnorm_saved(g, node, args):
    x = args[0]
    if g.device == "cuda":  # fused: its input and the reciprocal RMS per row
        g.norm_input(x, node)
        g.new(node, "stats", (_numel(x.meta[K.SHAPE][:-1]),), 4)
    else:  # composite: the upcast input, the reciprocal RMS and x·rstd
        _rms_composite(g, node, x)


def _zero_centered_saved(g, node, args):
    """runtime.layers.ZeroCenteredRMSNorm on every device: rms_norm without a weight over its fp32 input (the
    upcast input and the reciprocal RMS, fused or not), then the product's operands: the normalised fp32 rows and
    (1 + weight)."""
    x = args[0]
    _rms_composite(g, node, x)
    g.new(node, "one_plus_weight", x.meta[K.SHAPE][-1:], 4)


def _embedding_shape(node, args, kwargs, gm):
    return tuple(args[0]) + (gm.meta[K.PARAM_SHAPES][f"{node.target}.weight"][1],), ZERO


def _bias_dtype(node, gm, args):
    return promote(args[0], "act")  # adds a parameter


def _experts_shape(node, args, kwargs, gm):
    mod = gm.get_submodule(node.target)
    e, h, f = gm.meta[K.PARAM_SHAPES][f"{node.target}.w_up"]
    x = args[0]
    # Padded (E × N × H): every slot is computed, empty or not (the buffers are padded to capacity); grouped
    # (T × H, `dispatch = grouped`): each row once, by its expert. 2 or 3 matmuls.
    return x, (3 if mod.act == "swiglu" else 2) * 2 * _numel(x[:-1]) * h * f


def _experts_backward(node, gm, needs, fwd):
    """The weights' gradient matmul, and the input's where it needs one (the grouped call's counts are integers:
    no gradient)."""
    return fwd * (1 + (1 if needs.get(node.args[0], False) else 0))


def _experts_saved(g, node, args):
    mod = g.gm.get_submodule(node.target)
    x = args[0]
    f = g.params[f"{node.target}.w_up"][2]
    g.keep_matmul_input(x, node)
    hidden = _numel(x.meta[K.SHAPE][:-1]) * f * g.act
    # GELU: its input, and its output (the down matmul's input); SwiGLU: the gate (silu's input), silu's output,
    # the up projection (the product's operands) and their product (the down matmul's input).
    g.saved[("experts", node)] = hidden * (4 if mod.act == "swiglu" else 2)


def _experts_dims(node, gm):
    mod = gm.get_submodule(node.target)
    ps = gm.meta[K.PARAM_SHAPES]
    x = node.args[0].meta[K.SHAPE]
    e, h, f = ps[f"{node.target}.w_up"]  # every expert's buffer, (experts, capacity, hidden)
    if len(x) == 2:  # grouped: T rows over the rank's e experts, balanced (T/e each) as the step-time model assumes
        return e, x[0] / e, f, h, _numel(ps[f"{node.target}.w_up"]) * (3 if mod.act == "swiglu" else 2)
    return x[0], x[1], f, h, _numel(ps[f"{node.target}.w_up"]) * (3 if mod.act == "swiglu" else 2)


def _experts_wgrad(node, gm, widths):
    mod = gm.get_submodule(node.target)
    *rows, h = node.meta[K.SHAPE]
    f = gm.meta[K.PARAM_SHAPES][f"{node.target}.w_up"][2]
    return _numel(rows) * (f * (2 if mod.act == "swiglu" else 1) + h) * widths["act"]


def _experts_padding(node, seq):
    """Model FLOPs count top_k experts per token (MFU as PaLM defines it); the program computes every slot of the
    experts' buffers, padded to capacity (E·C per sequence, C = seq when dropless)."""
    layer = node.meta.get(K.LAYER)
    if layer is None or not hasattr(layer, "top_k") or getattr(layer, "dispatch", "padded") == "grouped":
        return None  # grouped: no empty slot (torch's grouped GEMM pads each group to runtime.moe.GROUP_ALIGN rows)
    c = seq if layer.capacity_factor == "none" else layer.capacity  # dropless: a slot for every token (_dispatch_shape)
    return 1 - sympy.Integer(layer.top_k) * seq / (layer.experts * c)


def _experts_kept(node, gm, needed, act):
    """Under selective recomputation: up (and gate), which the experts' own backward recomputes their activation
    from whatever reads the output, and the down matmul's output only where the backward needs it."""
    mod = gm.get_submodule(node.target)
    *rows, h = node.meta[K.SHAPE]
    rows = _numel(rows)
    f = gm.meta[K.PARAM_SHAPES][f"{node.target}.w_up"][2]
    return (rows * f * (2 if mod.act == "swiglu" else 1) + (rows * h if needed else 0)) * act


def _expert_bias_shape(node, args, kwargs, gm):
    e = gm.get_submodule(node.target).bias.shape[0]
    layer = node.meta.get(K.LAYER)
    e = layer.experts if layer is not None and hasattr(layer, "experts") else e
    return ((e,), (e,)), ZERO


def _render_experts(mod):
    e, h, f = mod.w_up.shape
    return f"moe.Experts({e}, {h}, {f}, act={mod.act!r})"


MODULES = {
    nn.Linear: Op("linear", _linear_shape, _act, _keeps_matmul_input, _module_backward, selective=True,
                  dims=_module_linear_dims, wgrad=_output_grad, render=_render_linear),
    nn.Embedding: Op("embedding", _embedding_shape, _act, _keeps_input,
                     render=lambda m: f"nn.Embedding({m.num_embeddings}, {m.embedding_dim})"),
    nn.LayerNorm: Op("layernorm", dtype=_act, saved=_layernorm_saved,
                     render=lambda m: f"nn.LayerNorm({m.normalized_shape[0]}, eps={m.eps!r})"),
    nn.RMSNorm: Op("rmsnorm", dtype=_act, saved=_rmsnorm_saved,
                   render=lambda m: f"nn.RMSNorm({m.normalized_shape[0]}, eps={m.eps!r})"),
    ZeroCenteredRMSNorm: Op("zero_centered_rmsnorm", dtype=_act, saved=_zero_centered_saved,
                            render=lambda m: f"ZeroCenteredRMSNorm({m.normalized_shape[0]}, eps={m.eps!r})"),
    Bias: Op("bias", dtype=_bias_dtype, passes_grad=True, render=lambda m: f"Bias({m.bias.shape[0]})"),
    # DeepSeek-V3's expert bias: its buffers handed to the router (fp32 model state; nothing computed or saved)
    moe.ExpertBias: Op("expert_bias", _expert_bias_shape, lambda node, gm, args: ("fp32", "fp32"), free=True,
                       outputs=("bias", "load"),
                       render=lambda m: f"moe.ExpertBias({m.bias.shape[0]}, rate={m.rate!r})"),
    moe.Experts: Op("experts", _experts_shape, _act, _experts_saved, _experts_backward, selective=True,
                    dims=_experts_dims, wgrad=_experts_wgrad, render=_render_experts, padding=_experts_padding,
                    kept=_experts_kept),
}


# -- functions and methods ----------------------------------------------------------------------------------------


def _unflatten_shape(node, args, kwargs, gm):
    x, d, sizes = args
    d = _dim(x, d)
    sizes = list(sizes)
    if -1 in sizes:
        known = sympy.Mul(*[s for s in sizes if s != -1])
        sizes[sizes.index(-1)] = sympy.cancel(x[d] / known)
    return tuple(x[:d]) + tuple(sizes) + tuple(x[d + 1:]), ZERO


def _transpose_shape(node, args, kwargs, gm):
    x, a, b = args
    s = list(x)
    a, b = _dim(x, a), _dim(x, b)
    s[a], s[b] = s[b], s[a]
    return tuple(s), ZERO


def _flatten_shape(node, args, kwargs, gm):
    x = args[0]
    start = _dim(x, args[1] if len(args) > 1 else kwargs.get("start_dim", 0))
    end = _dim(x, args[2] if len(args) > 2 else kwargs.get("end_dim", -1))
    return tuple(x[:start]) + (_numel(x[start:end + 1]),) + tuple(x[end + 1:]), ZERO


def _flatten_saved(g, node, args):
    src = args[0]
    # A flatten of a transposed tensor copies, except scaled_dot_product_attention's output, which the flash kernels
    # lay out as (batch, seq, heads, dim): transposing it back is contiguous.
    if src.target == "transpose" and src.args[0].target not in (F.scaled_dot_product_attention, CP.attention,
                                                                 P.attention, attention.sliding_window,
                                                                 attention.latent):
        return
    if src.target == "transpose" and src.args[0].target is attention.latent and not _latent_fused(g, src.args[0]):
        return  # the math path's output is (B, H, S, V) contiguous: its transpose flattened is a copy
    g.views[node] = src


def _cast_saved(g, node, args):
    """`.float()` / `.to()`: the same storage when the dtype does not change."""
    if node.meta.get(K.DTYPE) == args[0].meta.get(K.DTYPE):
        g.views[node] = args[0]


def _binary_shape(node, args, kwargs, gm):
    return _broadcast(args[0] if isinstance(args[0], tuple) else None,
                      args[1] if isinstance(args[1], tuple) else None), ZERO


def _binary_dtype(node, gm, args):
    return promote(*[a for a in args if isinstance(a, str)])


def _mul_saved(g, node, args):
    """A product of two tensors keeps each (the other's gradient reads it); a tensor times a Python number keeps
    nothing (its gradient is the number times the output's)."""
    tensors = [a for a in args[:2] if hasattr(a, "meta") and a.meta.get(K.SHAPE) is not None]
    if len(tensors) == 2:
        for a in tensors:
            g.keep(a)


def _getattr_shape(node, args, kwargs, gm):
    return (args[0] if args[1] == "shape" else None), ZERO  # .shape; .device, .dtype have none


def _getitem_shape(node, args, kwargs, gm):
    return args[0][args[1]], ZERO


def _getitem_dtype(node, gm, args):
    return args[0][args[1]] if isinstance(args[0], tuple) else args[0]


def _linear_fn_shape(node, args, kwargs, gm):
    x, w = args[0], args[1]
    return tuple(x[:-1]) + (w[0],), 2 * _numel(x[:-1]) * w[0] * w[1]


def _linear_fn_wgrad(node, gm, widths):
    """F.linear's split backward keeps its output's gradient, in the output's dtype."""
    return _numel(node.meta[K.SHAPE]) * widths.get(node.meta.get(K.DTYPE), 4)


def _sdpa_saved(g, node, args):
    # the flash kernels (CUDA and CPU) keep q, k, v, the output and a log-sum-exp per row and head (fp32), never
    # the s×s scores
    for a in args[:3]:
        g.keep_matmul_input(a, node)
    b, h, s, _ = node.meta[K.SHAPE]
    g.saved[("t", node)] = _numel(node.meta[K.SHAPE]) * g.act  # the output
    g.new(node, "lse", (b, h, s), 4)


def _window_keys(node, sk):
    """Keys each query reads under `attention.sliding_window`: min(W, Sk), W the layer's window as the .scale file
    sizes it (symbolic when written with a named size), else the call's number."""
    layer = node.meta.get(K.LAYER)
    w = getattr(layer, "window", None)
    return sympy.Min(sympy.sympify(node.args[3] if w is None else w), sk)


def _over_keys(keys):
    """(shape, backward, dims) of an attention whose queries each read `keys(node, Sk)` keys: the FLOPs convention
    of scaled_dot_product_attention, Q·Kᵀ and P·V each 2·B·H·Sq·keys·D, the mask's triangle not discounted (each
    query is counted over its keys, though the first ones have fewer), so a window (min(W, Sk)) only ever lowers the
    count, by min(W, Sk) / Sk; backward one matmul of each forward matmul's size per operand that needs a gradient
    (scaled_dot_product_attention's rule)."""
    def shape(node, args, kwargs, gm):
        q, k, v = args[:3]
        b, h, sq, d = q
        n, dv = keys(node, k[2]), v[3]
        return (b, h, sq, dv), 2 * b * h * sq * n * d + 2 * b * h * sq * n * dv

    def backward(node, gm, needs, fwd):
        q, k, v = node.args[:3]
        b, h, sq, d = q.meta[K.SHAPE]
        n, dv = keys(node, k.meta[K.SHAPE][2]), v.meta[K.SHAPE][3]
        qk, pv = 2 * b * h * sq * n * d, 2 * b * h * sq * n * dv
        p_needs = needs.get(q, False) or needs.get(k, False)
        return sympy.expand(qk * (needs.get(q, False) + needs.get(k, False)) + pv * (p_needs + needs.get(v, False)))

    def dims(node, gm):
        b, h, sq, d = node.args[0].meta[K.SHAPE]
        return b * h, sq, keys(node, node.args[1].meta[K.SHAPE][2]), d, None
    return shape, backward, dims


# scaled_dot_product_attention (causal): every key; attention.sliding_window: min(W, Sk) keys a query
_sdpa_shape, _sdpa_backward, _sdpa_dims = _over_keys(lambda node, sk: sk)
_window_shape, _window_backward, _window_dims = _over_keys(_window_keys)
# context_parallel.ring_attention: each rank's queries read its own block of S/cp keys (the causal diagonal, the
# triangle not discounted, as above) and, of each other rank's block, half (runtime.context_parallel._block: the
# head-tail layout leaves the rest wholly masked, never computed): S/cp · (cp + 1) / 2 keys a query
_ring_shape, _ring_backward, _ring_dims = _over_keys(lambda node, sk: sk * (size(node.args[4]) + 1) / 2)


def _ring_kept(node, gm, needed, act):
    """Under selective recomputation the ring's forward is one operator whose outputs are saved, as a collective's
    (runtime.recompute `keep`: making them again would send the keys and values round again): the output and the
    log-sum-exp per row and head (fp32), which its own backward reads; its q, k and v are recomputed from the
    projections' saved outputs. Nothing of its steps (scores, partial products) is kept."""
    b, h, s, _ = node.meta[K.SHAPE]
    return _numel(node.meta[K.SHAPE]) * act + b * h * s * 4


def _capped_keys(node, sk):
    """Keys each query reads under `attention.softcapped`: min(W, Sk) with the layer's window, else Sk (the cap's
    tanh is elementwise: no FLOPs by the matmul convention)."""
    w = getattr(node.meta.get(K.LAYER), "window", None)
    return sk if w is None else sympy.Min(sympy.sympify(w), sk)


_capped_shape, _capped_backward, _capped_dims = _over_keys(_capped_keys)


def _capped_saved(g, node, args):
    """On CUDA FlexAttention keeps what the fused kernels keep (q, k, v, the output, a log-sum-exp). Elsewhere the
    scores are written out (runtime/attention.softcapped): q and kᵀ (each key/value head repeated over its group
    under GQA: a copy), the capped scores (tanh's output), the fp32 probabilities and, when the compute dtype is
    narrower, their cast (P·V's operand), and v (repeated likewise)."""
    if g.device == "cuda":
        _sdpa_saved(g, node, args)
        return
    q, k, v = args[:3]
    b, h, sq, d = q.meta[K.SHAPE]
    sk, dv = k.meta[K.SHAPE][2], v.meta[K.SHAPE][3]
    g.keep_matmul_input(q, node)
    if k.meta[K.SHAPE][1] == h:
        g.keep_matmul_input(k, node)
        g.keep_matmul_input(v, node)
    else:
        g.new(node, "k_repeated", (b, h, sk, d), g.act)
        g.new(node, "v_repeated", (b, h, sk, dv), g.act)
    g.new(node, "capped", (b, h, sq, sk), g.act)
    g.new(node, "probs", (b, h, sq, sk), 4)
    if g.act < 4:
        g.new(node, "probs_cast", (b, h, sq, sk), g.act)


def _split_shape(node, args, kwargs, gm):
    x, sizes = args[0], args[1]
    d = _dim(x, args[2] if len(args) > 2 else kwargs.get("dim", 0))
    return tuple(tuple(x[:d]) + (sympy.sympify(n),) + tuple(x[d + 1:]) for n in sizes), ZERO


def _split_saved(g, node, args):
    """Each piece is a view of its input: a getitem of it shares the input's storage."""
    if isinstance(args[0], type(node)):
        g.views[node] = args[0]
        for user in node.users:
            if user.target is operator.getitem:
                g.views[user] = args[0]


def _latent_widths(node):
    """(nope + rope, v): an MLA head's query/key and value widths, from the layer's sizes."""
    layer = node.meta[K.LAYER]
    return layer.qk_nope_head_dim + layer.qk_rope_head_dim, layer.v_head_dim


def _latent_shape(node, args, kwargs, gm):
    """Q·Kᵀ over the whole query/key width (nope + rope) and P·V over v, as scaled_dot_product_attention counts
    them; the rotation and the concatenations cost no FLOPs by the matmul convention."""
    b, h, s, _ = args[0]
    d, dv = _latent_widths(node)
    return (b, h, s, dv), 2 * b * h * s * s * d + 2 * b * h * s * s * dv


def _latent_backward(node, gm, needs, fwd):
    """scaled_dot_product_attention's rule on the concatenated queries and keys (each needs a gradient when q, or
    kv / the shared key, does) and the values (kv)."""
    q, kv, kr = node.args[:3]
    b, h, s, _ = q.meta[K.SHAPE]
    d, dv = _latent_widths(node)
    qk, pv = 2 * b * h * s * s * d, 2 * b * h * s * s * dv
    nq, nk, nv = needs.get(q, False), needs.get(kv, False) or needs.get(kr, False), needs.get(kv, False)
    return sympy.expand(qk * (nq + nk) + pv * ((nq or nk) + nv))


def _latent_dims(node, gm):
    b, h, s, _ = node.args[0].meta[K.SHAPE]
    return b * h, s, s, _latent_widths(node)[0], None


def _latent_fused(g, node) -> bool:
    """Whether scaled_dot_product_attention runs a fused kernel for MLA's heads: on CUDA (FlashAttention, or the
    memory-efficient kernel where the value width differs), on CPU only where the query/key and value widths are
    equal (its flash kernel's condition); else its math path."""
    d, dv = _latent_widths(node)
    return g.device == "cuda" or sympy.simplify(d - dv) == 0


def _latent_saved(g, node, args):
    """runtime.attention.latent: the rotation's cosines and sines (S × rope/2 each interleaved, S × rope rotating
    halves), and
      - fused: the kernel's q and k (the concatenations, new tensors), v (a view of kv: its storage), the output and
        a log-sum-exp;
      - CPU's math path (value width ≠ query width, as DeepSeek's), in fp32 whatever the compute dtype: q and kᵀ
        each scaled by the root of the scale (new tensors, Q·Kᵀ's operands), the probabilities (S × S per head) and
        v made contiguous (P·V's operands);
        the output is not kept, and o's input is a copy (its transpose is not a view of a contiguous tensor)."""
    kv = args[1]
    b, h, s, _ = node.meta[K.SHAPE]
    d, dv = _latent_widths(node)
    layer = node.meta[K.LAYER]
    g.new(node, "angles", (2, s, layer.qk_rope_head_dim / 2 if layer.rope_interleave else layer.qk_rope_head_dim),
          g.act)
    if _latent_fused(g, node):
        g.new(node, "q", (b, h, s, d), g.act)
        g.new(node, "k", (b, h, s, d), g.act)
        g.keep(kv)
        g.saved[("t", node)] = _numel(node.meta[K.SHAPE]) * g.act  # the output
        g.new(node, "lse", (b, h, s), 4)
    else:  # the math path computes in fp32 on CPU (bf16 operands upcast first)
        for key, shape in (("q", (b, h, s, d)), ("k", (b, h, s, d)), ("probs", (b, h, s, s)), ("v", (b, h, s, dv))):
            g.new(node, key, shape, 4)


def _loss_shape(node, args, kwargs, gm):
    return (), ZERO


def _cross_entropy_saved(g, node, args):
    logits, targets = args[:2]
    g.new(node, "log_softmax", logits.meta[K.SHAPE], 4)
    g.keep(targets)


def _vocab_cross_entropy_saved(g, node, args):
    logits = args[0]
    n = logits.meta[K.SHAPE][0]
    g.new(node, "softmax", logits.meta[K.SHAPE], 4)
    g.new(node, "mine", (n,), 1)
    g.new(node, "local", (n,), INT_BYTES)


def _vocab_lookup_saved(g, node, args):
    tokens = args[0]
    g.new(node, "ids", tokens.meta[K.SHAPE], INT_BYTES)   # the shifted, masked ids
    g.new(node, "outside", tokens.meta[K.SHAPE], 1)       # the mask of foreign ids


def _gather_shape(node, args, kwargs, gm):
    x, axis, d = args
    return tuple(s * size(axis) if i == _dim(x, d) else s for i, s in enumerate(x)), ZERO


def _scatter_shape(node, args, kwargs, gm):
    x, axis, d = args
    return tuple(s / size(axis) if i == _dim(x, d) else s for i, s in enumerate(x)), ZERO


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


def _rotate_saved(g, node, args):  # its cosines and sines, (S, D) each in the queries' dtype
    b, h, s, d = args[0].meta[K.SHAPE]
    g.new(node, "angles", (2, s, d), g.act)


def _packed_rotate_saved(g, node, args):  # packed documents: each row of the batch its own angles, (B, S, D) each
    b, h, s, d = args[0].meta[K.SHAPE]
    g.new(node, "angles", (2, b, s, d), g.act)


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
    return (n, layer.experts / n), ZERO


def _a2a_shape(scale):
    def shape(node, args, kwargs, gm):
        e, n, h = args[0]
        k = size(args[1])
        return ((e / k, n * k, h) if scale else (e * k, n / k, h)), ZERO
    return shape


def _heads_to_sequence_shape(forward):
    """Ulysses' all-to-alls over cp: (B, H, S/cp, D) -> (B, H/cp, S, D), and back."""
    def shape(node, args, kwargs, gm):
        b, h, s, d = args[0]
        n = size(args[1])
        return ((b, h / n, s * n, d) if forward else (b, h * n, s / n, d)), ZERO
    return shape


def _loss_moments(kind):
    """The loss's working set: its forward holds the logits, their fp32 copy (bf16 only) and, vocabulary-
    parallel, the shifted logits and their exponentials; its backward the fp32 gradient of the log-softmax and its
    input's gradient (8 bytes per logit). One formula per moment."""
    def moments(n, copy):
        return [(copy + 2 * 4) * n if kind == "vocab" else copy * n, 8 * n]
    return moments


_UNFLATTEN = Op("unflatten", _unflatten_shape, saved=_aliases_input, passes_grad=True, free=True, shard=True)
_TRANSPOSE = Op("transpose", _transpose_shape, saved=_aliases_input, passes_grad=True, free=True, shard=True)
_FLATTEN = Op("flatten", _flatten_shape, saved=_flatten_saved, passes_grad=True, free=True, shard=True)
_ADD = Op("add", _binary_shape, _binary_dtype, passes_grad=True, freed_when_sent=True)
_SUB = Op("sub", _binary_shape, _binary_dtype, passes_grad=True)
_MUL = Op("mul", _binary_shape, _binary_dtype, _mul_saved, shard=True)
_GATHER = Op("all_gather_fwd_reduce_scatter_bwd", _gather_shape, passes_grad=True, computes=False)
_SCATTER = Op("reduce_scatter_fwd_all_gather_bwd", _scatter_shape, passes_grad=True, selective=True,
              computes=False)

FUNCTIONS = {
    "unflatten": _UNFLATTEN, torch.unflatten: _UNFLATTEN,
    "transpose": _TRANSPOSE, torch.transpose: _TRANSPOSE,
    "flatten": _FLATTEN, torch.flatten: _FLATTEN,
    "contiguous": Op("contiguous", passes_grad=True, shard=True),
    "float": Op("float", dtype=_fp32, saved=_cast_saved, passes_grad=True),
    "to": Op("to", saved=_cast_saved, passes_grad=True),
    F.gelu: Op("gelu", saved=_keeps_input, shard=True),
    F.silu: Op("silu", saved=_keeps_input, shard=True),
    F.relu: Op("relu", saved=_keeps_output, shard=True),
    torch.tanh: Op("tanh", saved=_keeps_output, shard=True),
    torch.sigmoid: Op("sigmoid", saved=_keeps_output),
    operator.add: _ADD, torch.add: _ADD, "add": _ADD,
    operator.sub: _SUB, torch.sub: _SUB, "sub": _SUB,
    operator.mul: _MUL, torch.mul: _MUL, "mul": _MUL,
    getattr: Op("getattr", _getattr_shape, lambda node, gm, args: None, _aliases_input, passes_grad=True, free=True),
    operator.getitem: Op("getitem", _getitem_shape, _getitem_dtype, passes_grad=True, free=True, shard=True),
    torch.arange: Op("arange", lambda node, args, kwargs, gm: ((args[0],), ZERO), lambda node, gm, args: "int",
                     free=True),
    F.linear: Op("linear", _linear_fn_shape, _act, _keeps_matmul_input, selective=True, dims=_linear_dims,
                 wgrad=_linear_fn_wgrad),
    F.scaled_dot_product_attention: Op("scaled_dot_product_attention", _sdpa_shape, _act, _sdpa_saved,
                                       _sdpa_backward, dims=_sdpa_dims, shard=True, attention=True),
    # The saved tensors are the fused kernel's (q, k, v, the output, a log-sum-exp): the boolean mask (CPU) or block
    # mask (CUDA) is made once per sequence length and window and shared by every layer, not saved per call.
    attention.sliding_window: Op("sliding_window", _window_shape, _act, _sdpa_saved, _window_backward,
                                 dims=_window_dims, shard=True, attention=True, wrapped=True),
    # Soft-capped scores (Gemma 2): FlexAttention with a score_mod on CUDA, the scores written out elsewhere.
    attention.softcapped: Op("softcapped", _capped_shape, _act, _capped_saved, _capped_backward, dims=_capped_dims,
                             shard=True, attention=True, wrapped=True),
    # Multi-head latent attention's heads (DeepSeek): its shared rotary key (argument 2) enters every head whole.
    attention.latent: Op("latent", _latent_shape, _act, _latent_saved, _latent_backward, dims=_latent_dims,
                         shard=True, attention=True, wrapped=True, side=(2,)),
    "split": Op("split", _split_shape, lambda node, gm, args: tuple(args[0] for _ in node.args[1]), _split_saved,
                passes_grad=True, free=True),
    F.cross_entropy: Op("cross_entropy", _loss_shape, _fp32, _cross_entropy_saved, loss=_loss_moments("whole"),
                        defaults=True),
    C.vocab_parallel_cross_entropy: Op("vocab_parallel_cross_entropy", _loss_shape, _fp32,
                                       _vocab_cross_entropy_saved, loss=_loss_moments("vocab")),
    C.vocab_parallel_lookup: Op("vocab_parallel_lookup",
                                lambda node, args, kwargs, gm: (tuple(args[0]) + (args[1][1],), ZERO), _act,
                                _vocab_lookup_saved),
    C.identity_fwd_all_reduce_bwd: Op("identity_fwd_all_reduce_bwd", saved=_aliases_input, passes_grad=True,
                                      computes=False, copy=True),
    C.all_reduce_fwd_identity_bwd: Op("all_reduce_fwd_identity_bwd", passes_grad=True, selective=True,
                                      computes=False),
    C.all_gather_fwd_reduce_scatter_bwd: _GATHER,
    C.reduce_scatter_fwd_all_gather_bwd: _SCATTER,
    C.split_fwd_all_gather_bwd: Op("split_fwd_all_gather_bwd", _scatter_shape, passes_grad=True, computes=False),
    C.all_gather_fwd_split_bwd: Op("all_gather_fwd_split_bwd", _gather_shape, passes_grad=True, computes=False),
    # Context parallelism's MoE (compiler/passes/context_parallel.py): each sequence's choice counts, summed over
    # cp before the router's aux loss (int64, no gradient)
    moe.choice_counts: Op("choice_counts", lambda node, args, kwargs, gm: ((args[0][0], args[0][2]), ZERO),
                          lambda node, gm, args: "int", free=True),
    moe.route: Op("route", _route_shape, lambda node, gm, args: ("int", "fp32"), _route_saved,
                  outputs=("slot", "gate"), wrapped=True),
    moe.dispatch: Op("dispatch", _dispatch_shape, _act, _dispatch_saved, wrapped=True),
    moe.combine: Op("combine", _combine_shape, _combine_dtype, _combine_saved, wrapped=True),
    moe.all_to_all_dispatch: Op("all_to_all_dispatch", _a2a_shape(True), selective=True, computes=False),
    moe.all_to_all_combine: Op("all_to_all_combine", _a2a_shape(False), selective=True, computes=False),
    moe.sort_tokens: Op("sort_tokens", _sort_shape, lambda node, gm, args: ("act", "int"), _sort_saved,
                        outputs=("rows", "counts"), wrapped=True),
    moe.unsort_combine: Op("unsort_combine", _unsort_shape, _act, _unsort_saved, wrapped=True),
    moe.exchange_counts: Op("exchange_counts", _counts_shape, lambda node, gm, args: "int", free=True,
                            computes=False),
    moe.all_to_all_dispatch_grouped: Op("all_to_all_dispatch_grouped", saved=_rows_index_saved, selective=True,
                                        computes=False),
    moe.all_to_all_combine_grouped: Op("all_to_all_combine_grouped", saved=_rows_index_saved, selective=True,
                                       computes=False),
    # Context parallelism (compiler/passes/context_parallel.py): the rank's true positions, rotary embeddings at
    # them, and causal attention of its queries over the keys gathered over cp (its additive mask made once per
    # length and rank and shared by every layer, not saved per call: what the fused kernel keeps, as above)
    CP.positions: Op("cp_positions", lambda node, args, kwargs, gm: ((args[0],), ZERO), lambda node, gm, args: "int",
                     free=True),
    CP.rotate: Op("cp_rotate", lambda node, args, kwargs, gm: ((tuple(args[0]), tuple(args[1])), ZERO),
                  lambda node, gm, args: (args[0], args[1]), _rotate_saved, outputs=("q_turned", "k_turned"),
                  passes_grad=True, shard=True),
    CP.attention: Op("cp_attention", _sdpa_shape, _act, _sdpa_saved, _sdpa_backward, dims=_sdpa_dims, shard=True,
                     attention=True),
    CP.ring_attention: Op("cp_ring_attention", _ring_shape, _act, _sdpa_saved, _ring_backward, dims=_ring_dims,
                          shard=True, attention=True, selective=True, kept=_ring_kept),
    # selective: their all_to_all_single outputs are what runtime.recompute saves (as moe's all-to-alls)
    CP.heads_to_sequence: Op("cp_heads_to_sequence", _heads_to_sequence_shape(True), passes_grad=True,
                             computes=False, selective=True),
    CP.sequence_to_heads: Op("cp_sequence_to_heads", _heads_to_sequence_shape(False), passes_grad=True,
                             computes=False, selective=True),
    # Packed documents (runtime/packed.py): each token's position within its document, rotary embeddings at those
    # positions, block-diagonal causal attention (its mask made once per micro-batch and shared by every layer: what
    # the fused kernel keeps, as above), and the loss whose targets after a separator count zero.
    P.positions: Op("packed_positions", lambda node, args, kwargs, gm: (tuple(args[0]), ZERO),
                    lambda node, gm, args: "int", free=True, wrapped=True),
    P.rotate: Op("packed_rotate", lambda node, args, kwargs, gm: ((tuple(args[0]), tuple(args[1])), ZERO),
                 lambda node, gm, args: (args[0], args[1]), _packed_rotate_saved, outputs=("q_turned", "k_turned"),
                 passes_grad=True, wrapped=True, shard=True),
    P.attention: Op("packed_attention", _sdpa_shape, _act, _sdpa_saved, _sdpa_backward, dims=_sdpa_dims, shard=True,
                    attention=True, wrapped=True),
    P.cross_entropy: Op("packed_cross_entropy", _loss_shape, _fp32, _cross_entropy_saved,
                        loss=_loss_moments("whole"), wrapped=True),
    rotary.rotate: Op("rotate", lambda node, args, kwargs, gm: ((tuple(args[0]), tuple(args[1])), ZERO),
                      lambda node, gm, args: (args[0], args[1]), _rotate_saved, outputs=("q_turned", "k_turned"),
                      passes_grad=True, wrapped=True, shard=True),
}


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
        raise NotImplementedError(f"no record for {what} at node {node.name}: add one in compiler/ops.py")
    return op


def wrapped() -> tuple:
    """The functions the tracer keeps as one call each (their insides depend on the data, not on shapes)."""
    return tuple(t for t, op in FUNCTIONS.items() if op.wrapped)


def shard_preserving() -> dict:
    """Call targets through which a head or inner-width shard flows unchanged, by the name a diagnostic gives."""
    return {t: op.name for t, op in FUNCTIONS.items() if op.shard}
