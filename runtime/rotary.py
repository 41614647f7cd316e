"""Rotary position embeddings (RoPE; Su et al. 2021), as Llama, Mistral, Qwen and Mixtral apply them.

`rotate(q_BHSD, k_BKSD, theta, scaling)` turns each query and key vector at position p by the angles p·ω_i, one per
pair of dimensions (i, i + D/2): the "rotate half" layout of Hugging Face's implementations, so their weights load
as they are. ω_i = theta^(-2i/D); with `scaling = (factor, low_freq_factor, high_freq_factor, original_seq)` the
frequencies are Llama 3's: long wavelengths (beyond original_seq / low_freq_factor) divided by `factor`, short ones
(below original_seq / high_freq_factor) kept, those between interpolated smoothly; with `scaling = (factor,)` every
frequency is divided by `factor` (linear scaling, Gemma 3's global layers).

Positions are 0..S-1 of the sequence the attention sees: under tensor parallelism heads are split and each rank
turns its heads by the same angles; under sequence parallelism the attention's input is gathered whole first, so the
positions are the whole sequence's. The angles are computed in fp32 from the positions on every call (nothing is
stored, so checkpoints and layouts are unaffected) and cast to the queries' dtype, as Hugging Face does. Autograd
keeps the cosines and sines (2·S·D values per call) for the backward, a rotation by the opposite angles.
"""
from __future__ import annotations

import math

import torch


def frequencies(head_dim: int, theta: float, scaling=None, device=None) -> torch.Tensor:
    """ω_i for i < head_dim / 2, fp32: Llama 3's scaled frequencies when `scaling` is (factor, low_freq_factor,
    high_freq_factor, original_seq), every one divided by factor when it is (factor,) (linear: Gemma 3)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
    if scaling is None:
        return inv
    if len(scaling) == 1:
        return inv / scaling[0]
    factor, low, high, original = scaling
    wavelen = 2 * math.pi / inv
    low_wavelen, high_wavelen = original / low, original / high
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (original / wavelen - low) / (high - low)
    between = (1 - smooth) * scaled / factor + smooth * scaled
    middle = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
    return torch.where(middle, between, scaled)


def _half_turn(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dim."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _interleaved(x: torch.Tensor, cos_SD2: torch.Tensor, sin_SD2: torch.Tensor) -> torch.Tensor:
    """x's pairs (2i, 2i + 1) turned by angle i, written out as the halves (x_2i', x_2i+1'): transformers'
    apply_rotary_pos_emb_interleave (DeepSeek), bit for bit. Queries and keys come out in the same order, so their
    products are those of the pairs turned in place."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat((x1 * cos_SD2 - x2 * sin_SD2, x2 * cos_SD2 + x1 * sin_SD2), dim=-1)


def rotate(q_BHSD: torch.Tensor, k_BKSD: torch.Tensor, theta: float, scaling=None, interleaved: bool = False,
           positions: torch.Tensor | None = None):
    """The queries and keys turned by their positions' angles (module docstring); shapes and dtypes unchanged.
    `interleaved`: the pairs are adjacent dimensions (2i, 2i + 1), DeepSeek's layout (`_interleaved`); autograd then
    keeps the half-width cosines and sines (S·D values). `positions`: the tokens' positions (int64, S of them, or (B, 1, S): each row its own);
    None: 0..S-1 (context parallelism passes its rank's true positions: runtime.context_parallel.rotate)."""
    s, d = q_BHSD.shape[2], q_BHSD.shape[3]
    inv = frequencies(d, theta, scaling, q_BHSD.device)
    if positions is None:
        positions = torch.arange(s, device=q_BHSD.device, dtype=torch.int64)
    with torch.autocast(q_BHSD.device.type, enabled=False):
        # positions (S,), or per row of the batch (B, 1, S) (packed documents: runtime.packed.rotate)
        angles_SD2 = (torch.outer(positions.float(), inv) if positions.dim() == 1
                      else positions.float()[..., None] * inv)
        angles_SD = torch.cat((angles_SD2, angles_SD2), dim=-1)
    if interleaved:
        cos_SD2, sin_SD2 = angles_SD2.cos().to(q_BHSD.dtype), angles_SD2.sin().to(q_BHSD.dtype)
        return (_interleaved(q_BHSD, cos_SD2, sin_SD2),
                _interleaved(k_BKSD, cos_SD2.to(k_BKSD.dtype), sin_SD2.to(k_BKSD.dtype)))
    cos_SD, sin_SD = angles_SD.cos().to(q_BHSD.dtype), angles_SD.sin().to(q_BHSD.dtype)
    q = q_BHSD * cos_SD + _half_turn(q_BHSD) * sin_SD
    k = k_BKSD * cos_SD.to(k_BKSD.dtype) + _half_turn(k_BKSD) * sin_SD.to(k_BKSD.dtype)
    return q, k
