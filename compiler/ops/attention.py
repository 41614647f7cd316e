"""The records of attention and rotary embeddings: torch's scaled_dot_product_attention, runtime.attention's sliding
window, soft cap and latent (MLA) heads, context parallelism's and packed documents' attention and rotations, and
runtime.rotary's rotation. Their FLOPs follow scaled_dot_product_attention's convention (`_over_keys`)."""
from __future__ import annotations

import sympy
import torch.nn.functional as F

from compiler import graph_meta as K
from compiler.ops.record import Op, ZERO, dtype_act, numel
from compiler.symbols import size
from runtime import attention, rotary
from runtime import context_parallel as CP
from runtime import packed as P


def _sdpa_saved(g, node, args):
    # the flash kernels (CUDA and CPU) keep q, k, v, the output and a log-sum-exp per row and head (fp32), never
    # the s×s scores
    for a in args[:3]:
        g.keep_matmul_input(a, node)
    b, h, s, _ = node.meta[K.SHAPE]
    g.saved[("t", node)] = numel(node.meta[K.SHAPE]) * g.act  # the output
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
    return numel(node.meta[K.SHAPE]) * act + b * h * s * 4


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


def latent_fused(g, node) -> bool:
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
    if latent_fused(g, node):
        g.new(node, "q", (b, h, s, d), g.act)
        g.new(node, "k", (b, h, s, d), g.act)
        g.keep(kv)
        g.saved[("t", node)] = numel(node.meta[K.SHAPE]) * g.act  # the output
        g.new(node, "lse", (b, h, s), 4)
    else:  # the math path computes in fp32 on CPU (bf16 operands upcast first)
        for key, shape in (("q", (b, h, s, d)), ("k", (b, h, s, d)), ("probs", (b, h, s, s)), ("v", (b, h, s, dv))):
            g.new(node, key, shape, 4)


def _rotate_saved(g, node, args):  # its cosines and sines, (S, D) each in the queries' dtype
    b, h, s, d = args[0].meta[K.SHAPE]
    g.new(node, "angles", (2, s, d), g.act)


def _packed_rotate_saved(g, node, args):  # packed documents: each row of the batch its own angles, (B, S, D) each
    b, h, s, d = args[0].meta[K.SHAPE]
    g.new(node, "angles", (2, b, s, d), g.act)

FUNCTIONS = {
    F.scaled_dot_product_attention: Op("scaled_dot_product_attention", _sdpa_shape, dtype_act, _sdpa_saved,
                                       _sdpa_backward, dims=_sdpa_dims, shard=True, attention=True),
    # The saved tensors are the fused kernel's (q, k, v, the output, a log-sum-exp): the boolean mask (CPU) or block
    # mask (CUDA) is made once per sequence length and window and shared by every layer, not saved per call.
    attention.sliding_window: Op("sliding_window", _window_shape, dtype_act, _sdpa_saved, _window_backward,
                                 dims=_window_dims, shard=True, attention=True, wrapped=True),
    # Soft-capped scores (Gemma 2): FlexAttention with a score_mod on CUDA, the scores written out elsewhere.
    attention.softcapped: Op("softcapped", _capped_shape, dtype_act, _capped_saved, _capped_backward, dims=_capped_dims,
                             shard=True, attention=True, wrapped=True),
    # Multi-head latent attention's heads (DeepSeek): its shared rotary key (argument 2) enters every head whole.
    attention.latent: Op("latent", _latent_shape, dtype_act, _latent_saved, _latent_backward, dims=_latent_dims,
                         shard=True, attention=True, wrapped=True, side=(2,)),
    # Context parallelism (compiler/passes/context_parallel.py): rotary embeddings at the rank's true positions,
    # and causal attention of its queries over the keys gathered over cp (its additive mask made once per length
    # and rank and shared by every layer, not saved per call: what the fused kernel keeps, as above)
    CP.rotate: Op("cp_rotate", lambda node, args, kwargs, gm: ((tuple(args[0]), tuple(args[1])), ZERO),
                  lambda node, gm, args: (args[0], args[1]), _rotate_saved, outputs=("q_turned", "k_turned"),
                  passes_grad=True, shard=True),
    CP.attention: Op("cp_attention", _sdpa_shape, dtype_act, _sdpa_saved, _sdpa_backward, dims=_sdpa_dims, shard=True,
                     attention=True),
    CP.ring_attention: Op("cp_ring_attention", _ring_shape, dtype_act, _sdpa_saved, _ring_backward, dims=_ring_dims,
                          shard=True, attention=True, selective=True, kept=_ring_kept),
    # Packed documents (runtime/packed.py): rotary embeddings at each token's position within its document,
    # block-diagonal causal attention (its mask made once per micro-batch and shared by every layer: what the
    # fused kernel keeps, as above)
    P.rotate: Op("packed_rotate", lambda node, args, kwargs, gm: ((tuple(args[0]), tuple(args[1])), ZERO),
                 lambda node, gm, args: (args[0], args[1]), _packed_rotate_saved, outputs=("q_turned", "k_turned"),
                 passes_grad=True, wrapped=True, shard=True),
    P.attention: Op("packed_attention", _sdpa_shape, dtype_act, _sdpa_saved, _sdpa_backward, dims=_sdpa_dims,
                    shard=True, attention=True, wrapped=True),
    rotary.rotate: Op("rotate", lambda node, args, kwargs, gm: ((tuple(args[0]), tuple(args[1])), ZERO),
                      lambda node, gm, args: (args[0], args[1]), _rotate_saved, outputs=("q_turned", "k_turned"),
                      passes_grad=True, wrapped=True, shard=True),
}
