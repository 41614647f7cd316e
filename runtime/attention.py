"""Attention the fused causal kernel does not cover: a sliding window (`attention(..., window = W)`) and soft-capped
scores (`attention(..., softcap = C)`, Gemma 2).

Sliding-window causal attention: each query sees itself and the W - 1 keys before
it, as Mistral 7B and Qwen 2's windowed layers do. The rule is transformers' (masking_utils: a causal mask with the
sliding-window overlay `kv_idx > q_idx - sliding_window`), so a key is kept when 0 <= q_idx - kv_idx < W.

One call, traced whole (compiler/ops.py), so the program reads `attention.sliding_window(q, k, v, W, gqa)`:
  - on CUDA, FlexAttention (torch.nn.attention.flex_attention) with a block mask made once per (sequence, window,
    device): blocks wholly outside the window are never computed, so the work grows as seq · W, not seq²;
  - elsewhere (CPU), scaled_dot_product_attention with an explicit boolean mask, made once per (sequence, window,
    device) and shared by every layer and step: the same numbers, computed densely.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from runtime import rotary


def _mask(seq_q: int, seq_k: int, window: int, device: torch.device) -> torch.Tensor:
    i = torch.arange(seq_k - seq_q, seq_k, device=device)[:, None]
    j = torch.arange(seq_k, device=device)[None, :]
    return (j <= i) & (i - j < window)


@functools.lru_cache(maxsize=16)
def window_mask(seq_q: int, seq_k: int, window: int, device: torch.device) -> torch.Tensor:
    """(seq_q, seq_k) booleans, True where query i may read key j: j <= i and i - j < window. Queries are the
    last seq_q positions of the keys' (equal lengths in training)."""
    return _mask(seq_q, seq_k, window, device)


def _make_block_mask(seq_q: int, seq_k: int, window: int | None, device: torch.device):
    """FlexAttention's block mask of the causal rule, within `window` positions unless it is None."""
    from torch.nn.attention.flex_attention import create_block_mask
    offset = seq_k - seq_q

    def keep(b, h, q_idx, kv_idx):
        q_pos = q_idx + offset
        if window is None:
            return kv_idx <= q_pos
        return (kv_idx <= q_pos) & (q_pos - kv_idx < window)
    return create_block_mask(keep, B=None, H=None, Q_LEN=seq_q, KV_LEN=seq_k, device=device)


_block_mask = functools.lru_cache(maxsize=16)(_make_block_mask)


@functools.cache
def _flex():
    """FlexAttention compiled once: uncompiled it materialises the scores and gains nothing over the dense mask."""
    from torch.nn.attention.flex_attention import flex_attention
    return torch.compile(flex_attention, dynamic=False)


def sliding_window(q_BHSD: torch.Tensor, k_BKSD: torch.Tensor, v_BKSD: torch.Tensor, window: int,
                   gqa: bool, scale: float | None = None) -> torch.Tensor:
    """Causal attention of q over k, v within `window` positions; `gqa`: k and v have fewer heads, each shared by
    a group of query heads. (B, H, S, D) in, (B, H, S, Dv) out, the scores scaled by `scale` (None: 1/sqrt(D), as
    scaled_dot_product_attention).
    """
    if window < 1:
        raise ValueError(f"a sliding window must hold at least the query itself, not {window}")
    seq_q, seq_k = q_BHSD.shape[-2], k_BKSD.shape[-2]
    # Inside a compiled region (plan { compile = true }) the masks are traced into the graph, made once per
    # compilation: the caches are for eager programs (dynamo would trace through them and warn).
    compiling = torch.compiler.is_compiling()
    if q_BHSD.is_cuda:
        from torch.nn.attention.flex_attention import flex_attention
        block_mask = (_make_block_mask if compiling else _block_mask)(seq_q, seq_k, window, q_BHSD.device)
        return (flex_attention if compiling else _flex())(q_BHSD, k_BKSD, v_BKSD, block_mask=block_mask,
                                                          enable_gqa=gqa, scale=scale)
    mask = (_mask if compiling else window_mask)(seq_q, seq_k, window, q_BHSD.device)
    return F.scaled_dot_product_attention(q_BHSD, k_BKSD, v_BKSD, attn_mask=mask, enable_gqa=gqa, scale=scale)


def _additive(seq_q: int, seq_k: int, window: int | None, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(seq_q, seq_k): 0 where query i may read key j (j <= i, and i - j < window when there is one), -inf elsewhere.
    Added to the scores, it keeps nothing for backward (a boolean mask filled in would be saved)."""
    keep = _mask(seq_q, seq_k, seq_k if window is None else window, device)
    return torch.zeros((seq_q, seq_k), device=device, dtype=dtype).masked_fill(~keep, float("-inf"))


_additive_cached = functools.lru_cache(maxsize=16)(_additive)


def softcapped(q_BHSD: torch.Tensor, k_BKSD: torch.Tensor, v_BKSD: torch.Tensor, softcap: float,
               window: int | None, gqa: bool, scale: float | None = None) -> torch.Tensor:
    """Causal attention (within `window` positions unless None) whose scores s = q·k · scale are capped to
    (-softcap, softcap) as softcap · tanh(s / softcap) before the mask and the softmax: Gemma 2's
    attn_logit_softcapping, in transformers' order. `scale` None is 1/sqrt(D). (B, H, S, D) in, (B, H, S, Dv) out.
      - on CUDA, FlexAttention with the cap as its score_mod and the (window's) causal block mask: the scores are
        never materialised and masked blocks are skipped;
      - elsewhere, the scores written out: q·kᵀ, the cap, an additive mask, a softmax in fp32 (as transformers'
        eager attention), ·v. Its backward keeps the capped scores and the probabilities (S × S per head each).
    """
    if softcap <= 0:
        raise ValueError(f"a soft cap must be positive, not {softcap}")
    seq_q, seq_k = q_BHSD.shape[-2], k_BKSD.shape[-2]
    scale = q_BHSD.shape[-1] ** -0.5 if scale is None else scale
    compiling = torch.compiler.is_compiling()
    if q_BHSD.is_cuda:
        from torch.nn.attention.flex_attention import flex_attention

        def cap(score, b, h, q_idx, kv_idx):
            return softcap * torch.tanh(score / softcap)
        block_mask = (_make_block_mask if compiling else _block_mask)(seq_q, seq_k, window, q_BHSD.device)
        return (flex_attention if compiling else _flex())(q_BHSD, k_BKSD, v_BKSD, score_mod=cap,
                                                          block_mask=block_mask, enable_gqa=gqa, scale=scale)
    if gqa:  # each key/value head serves a group of query heads
        group = q_BHSD.shape[1] // k_BKSD.shape[1]
        k_BKSD, v_BKSD = k_BKSD.repeat_interleave(group, dim=1), v_BKSD.repeat_interleave(group, dim=1)
    s_BHSS = torch.matmul(q_BHSD, k_BKSD.transpose(-2, -1)) * scale
    s_BHSS = torch.tanh(s_BHSS / softcap) * softcap
    mask = (_additive if compiling else _additive_cached)(seq_q, seq_k, window, q_BHSD.device, s_BHSS.dtype)
    p_BHSS = F.softmax(s_BHSS + mask, dim=-1, dtype=torch.float32).to(q_BHSD.dtype)
    return torch.matmul(p_BHSS, v_BKSD)


def latent(q_BHSQ: torch.Tensor, kv_BHSW: torch.Tensor, kr_BSR: torch.Tensor, nope: int, theta: float,
           interleaved: bool = True, scaling=None) -> torch.Tensor:
    """Multi-head latent attention's heads (DeepSeek-V2/V3, transformers' DeepseekV3Attention): each query
    (nope + rope wide) split into its plain and rotary parts, each head's kv_b output into its key's plain part (nope)
    and its value (the rest), the shared rotary key `kr_BSR` (B, S, rope) turned with the queries' rotary parts
    (`interleaved`: DeepSeek's adjacent pairs) and given to every head, then causal attention scaled by
    1/√(nope + rope). (B, H, S, V) out. `scaling`: the rotation's YaRN scaling (runtime.rotary), which also multiplies
    the softmax scale by mscale(factor, mscale_all_dim)² (transformers' DeepseekV3Attention, yarn_apply_mscale).

    One call, traced whole (compiler/ops.py): under tensor parallelism q and kv hold this rank's heads and the shared
    key enters whole. Autograd keeps the concatenated queries and keys, the values (a view of kv), the output and a
    log-sum-exp (the fused kernel's), and the rotation's cosines and sines."""
    q_nope, q_rope = q_BHSQ.split([nope, q_BHSQ.shape[-1] - nope], dim=-1)
    k_nope, v_BHSV = kv_BHSW.split([nope, kv_BHSW.shape[-1] - nope], dim=-1)
    q_rope, k_rope = rotary.rotate(q_rope, kr_BSR.unsqueeze(1), theta, scaling, interleaved=interleaved)
    q_BHSQ = torch.cat((q_nope, q_rope), dim=-1)
    k_BHSQ = torch.cat((k_nope, k_rope.expand(-1, k_nope.shape[1], -1, -1)), dim=-1)
    m = rotary.yarn_softmax_factor(scaling)
    scale = {} if m == 1.0 else {"scale": q_BHSQ.shape[-1] ** -0.5 * m}
    return F.scaled_dot_product_attention(q_BHSQ, k_BHSQ, v_BHSV, is_causal=True, **scale)
