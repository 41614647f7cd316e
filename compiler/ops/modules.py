"""The records of the leaf modules the layers are built from: linear, embedding, the norms, the bias, the experts
and DeepSeek-V3's expert bias (keyed by the module's type; `render` writes its constructor into the program)."""
from __future__ import annotations

import sympy
from torch import nn

from compiler import graph_meta as K
from compiler.ops.record import Op, ZERO, dtype_act, keeps_input, keeps_matmul_input, numel, output_grad, promote
from runtime import moe, rebalance
from runtime.layers import Bias, ZeroCenteredRMSNorm


def _linear_shape(node, args, kwargs, gm):
    w = gm.meta[K.PARAM_SHAPES][f"{node.target}.weight"]
    x = args[0]
    return tuple(x[:-1]) + (w[0],), 2 * numel(x[:-1]) * w[0] * w[1]


def _module_backward(node, gm, needs, fwd):
    """A module with weights: one gradient matmul for the weights, one per input that needs a gradient."""
    weights = 1 if any(True for _ in gm.get_submodule(node.target).parameters()) else 0
    inputs = sum(1 for a in node.all_input_nodes if needs.get(a, False))
    return fwd * (weights + inputs)


def _module_linear_dims(node, gm):
    out, inp = gm.meta[K.PARAM_SHAPES][f"{node.target}.weight"]
    x = node.args[0].meta[K.SHAPE]
    return 1, numel(x[:-1]), out, inp, out * inp


def _render_linear(mod):
    return f"nn.Linear({mod.in_features}, {mod.out_features}{'' if mod.bias is not None else ', bias=False'})"


def _layernorm_saved(g, node, args):
    x = args[0]
    g.norm_input(x, node)
    rows = numel(x.meta[K.SHAPE][:-1])
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
    g.new(node, "stats", (numel(x.meta[K.SHAPE][:-1]),), 4)
    g.new(node, "normed", x.meta[K.SHAPE], 4)


def _rmsnorm_saved(g, node, args):
    x = args[0]
    if g.device == "cuda":  # fused: its input and the reciprocal RMS per row
        g.norm_input(x, node)
        g.new(node, "stats", (numel(x.meta[K.SHAPE][:-1]),), 4)
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
    return x, (3 if mod.act == "swiglu" else 2) * 2 * numel(x[:-1]) * h * f


def _experts_backward(node, gm, needs, fwd):
    """The weights' gradient matmul, and the input's where it needs one (the grouped call's counts are integers:
    no gradient)."""
    return fwd * (1 + (1 if needs.get(node.args[0], False) else 0))


def _experts_saved(g, node, args):
    mod = g.gm.get_submodule(node.target)
    x = args[0]
    f = g.params[f"{node.target}.w_up"][2]
    g.keep_matmul_input(x, node)
    hidden = numel(x.meta[K.SHAPE][:-1]) * f * g.act
    # GELU: its input, and its output (the down matmul's input); SwiGLU: the gate (silu's input), silu's output,
    # the up projection (the product's operands) and their product (the down matmul's input).
    g.saved[("experts", node)] = hidden * (4 if mod.act == "swiglu" else 2)


def _experts_dims(node, gm):
    mod = gm.get_submodule(node.target)
    ps = gm.meta[K.PARAM_SHAPES]
    x = node.args[0].meta[K.SHAPE]
    e, h, f = ps[f"{node.target}.w_up"]  # every expert's buffer, (experts, capacity, hidden)
    if len(x) == 2:  # grouped: T rows over the rank's e experts, balanced (T/e each) as the step-time model assumes
        return e, x[0] / e, f, h, numel(ps[f"{node.target}.w_up"]) * (3 if mod.act == "swiglu" else 2)
    return x[0], x[1], f, h, numel(ps[f"{node.target}.w_up"]) * (3 if mod.act == "swiglu" else 2)


def _experts_wgrad(node, gm, widths):
    mod = gm.get_submodule(node.target)
    *rows, h = node.meta[K.SHAPE]
    f = gm.meta[K.PARAM_SHAPES][f"{node.target}.w_up"][2]
    return numel(rows) * (f * (2 if mod.act == "swiglu" else 1) + h) * widths["act"]


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
    rows = numel(rows)
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


def _slots_shape(node, args, kwargs, gm):
    """The expert of each of the P slots, the load of each of the E experts, the rows of each slot."""
    m = gm.get_submodule(node.target)
    return ((m.total,), (m.experts,), (m.total,)), ZERO


MODULES = {
    nn.Linear: Op("linear", _linear_shape, dtype_act, keeps_matmul_input, _module_backward, selective=True,
                  dims=_module_linear_dims, wgrad=output_grad, render=_render_linear),
    nn.Embedding: Op("embedding", _embedding_shape, dtype_act, keeps_input,
                     render=lambda m: f"nn.Embedding({m.num_embeddings}, {m.embedding_dim})"),
    nn.LayerNorm: Op("layernorm", dtype=dtype_act, saved=_layernorm_saved,
                     render=lambda m: f"nn.LayerNorm({m.normalized_shape[0]}, eps={m.eps!r})"),
    nn.RMSNorm: Op("rmsnorm", dtype=dtype_act, saved=_rmsnorm_saved,
                   render=lambda m: f"nn.RMSNorm({m.normalized_shape[0]}, eps={m.eps!r})"),
    ZeroCenteredRMSNorm: Op("zero_centered_rmsnorm", dtype=dtype_act, saved=_zero_centered_saved,
                            render=lambda m: f"ZeroCenteredRMSNorm({m.normalized_shape[0]}, eps={m.eps!r})"),
    Bias: Op("bias", dtype=_bias_dtype, passes_grad=True, render=lambda m: f"Bias({m.bias.shape[0]})"),
    # DeepSeek-V3's expert bias: its buffers handed to the router (fp32 model state; nothing computed or saved)
    moe.ExpertBias: Op("expert_bias", _expert_bias_shape, lambda node, gm, args: ("fp32", "fp32"), free=True,
                       outputs=("bias", "load"),
                       render=lambda m: f"moe.ExpertBias({m.bias.shape[0]}, rate={m.rate!r})"),
    # re-placed experts' placement and measured load (runtime/rebalance.py): buffers handed to to_slots
    rebalance.Slots: Op("slots", _slots_shape, lambda node, gm, args: ("int", "fp32", "fp32"), free=True,
                        outputs=("slot_expert", "load", "slot_load"),
                        render=lambda m: f"rebalance.Slots({m.experts}, {m.total}, every={m.every})"),
    moe.Experts: Op("experts", _experts_shape, dtype_act, _experts_saved, _experts_backward, selective=True,
                    dims=_experts_dims, wgrad=_experts_wgrad, render=_render_experts, padding=_experts_padding,
                    kept=_experts_kept),
}
