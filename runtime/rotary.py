"""Rotary position embeddings (RoPE; Su et al. 2021), as Llama, Mistral, Qwen and Mixtral apply them.

`rotate(q_BHSD, k_BKSD, theta, scaling)` turns each query and key vector at position p by the angles p·ω_i, one per
pair of dimensions (i, i + D/2): the "rotate half" layout of Hugging Face's implementations, so their weights load
as they are. ω_i = theta^(-2i/D); with `scaling = (factor, low_freq_factor, high_freq_factor, original_seq)` the
frequencies are Llama 3's: long wavelengths (beyond original_seq / low_freq_factor) divided by `factor`, short ones
(below original_seq / high_freq_factor) kept, those between interpolated smoothly; with `scaling = (factor,)` every
frequency is divided by `factor` (linear scaling, Gemma 3's global layers); with `scaling = ("yarn", factor,
original_seq, beta_fast, beta_slow, mscale, mscale_all_dim, attention_factor, truncate)` they are YaRN's (Peng et al.
2023, as transformers' `_compute_yarn_parameters` computes them): the frequencies that turn fewer than beta_slow times
over original_seq positions divided by `factor`, those that turn more than beta_fast times kept, a linear ramp
between, and the cosines and sines multiplied by the attention factor (`yarn_attention_factor`). DeepSeek's `mla`
also multiplies its softmax scale by mscale(factor, mscale_all_dim)² (`yarn_softmax_factor`).

Positions are 0..S-1 of the sequence the attention sees: under tensor parallelism heads are split and each rank
turns its heads by the same angles; under sequence parallelism the attention's input is gathered whole first, so the
positions are the whole sequence's. The angles are computed in fp32 from the positions on every call (nothing is
stored, so checkpoints and layouts are unaffected) and cast to the queries' dtype, as Hugging Face does. Autograd
keeps the cosines and sines (2·S·D values per call) for the backward, a rotation by the opposite angles.
"""
from __future__ import annotations

import math

import torch


YARN = "yarn"


def _mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature 0.1·mscale·ln(factor) + 1 (1 for factor ≤ 1): transformers' get_mscale and
    DeepSeek's yarn_get_mscale."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_attention_factor(scaling) -> float:
    """The factor on the cosines and sines: 1 unless `scaling` is YaRN's; then `attention_factor` when given, else
    mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are non-zero, else mscale(factor)."""
    if scaling is None or scaling[0] != YARN:
        return 1.0
    _, factor, _, _, _, mscale, mscale_all_dim, attention_factor, _ = scaling
    if attention_factor is not None:
        return float(attention_factor)
    if mscale and mscale_all_dim:
        return float(_mscale(factor, mscale) / _mscale(factor, mscale_all_dim))
    return _mscale(factor)


def yarn_softmax_factor(scaling) -> float:
    """DeepSeek's yarn_apply_mscale: the softmax scale multiplied by mscale(factor, mscale_all_dim)² when a YaRN
    scaling has a non-zero mscale_all_dim; 1 otherwise."""
    if scaling is None or scaling[0] != YARN or not scaling[6]:
        return 1.0
    m = _mscale(scaling[1], scaling[6])
    return m * m


def _yarn(head_dim: int, theta: float, scaling, device) -> torch.Tensor:
    """YaRN's frequencies, step for step as transformers' _compute_yarn_parameters (so they agree to the bit)."""
    _, factor, original, beta_fast, beta_slow, _, _, _, truncate = scaling

    def correction_dim(rotations):  # the dimension whose frequency turns `rotations` times over `original` positions
        return (head_dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    pos_freqs = theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    ramp = torch.clamp((torch.arange(head_dim // 2, dtype=torch.float32, device=device) - low) / (high - low), 0, 1)
    kept = 1 - ramp  # 1: the frequency kept (extrapolated), 0: divided by factor (interpolated)
    return interpolation * (1 - kept) + extrapolation * kept


def frequencies(head_dim: int, theta: float, scaling=None, device=None) -> torch.Tensor:
    """ω_i for i < head_dim / 2, fp32: Llama 3's scaled frequencies when `scaling` is (factor, low_freq_factor,
    high_freq_factor, original_seq), every one divided by factor when it is (factor,) (linear: Gemma 3), YaRN's when
    it starts with "yarn" (module docstring)."""
    if scaling is not None and scaling[0] == YARN:
        return _yarn(head_dim, theta, scaling, device)
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
    m = yarn_attention_factor(scaling)
    with torch.autocast(q_BHSD.device.type, enabled=False):
        # positions (S,), or per row of the batch (B, 1, S) (packed documents: runtime.packed.rotate)
        angles_SD2 = (torch.outer(positions.float(), inv) if positions.dim() == 1
                      else positions.float()[..., None] * inv)
        angles_SD = torch.cat((angles_SD2, angles_SD2), dim=-1)
    if interleaved:
        cos_SD2, sin_SD2 = angles_SD2.cos(), angles_SD2.sin()
        if m != 1.0:  # YaRN's attention factor, in fp32 before the cast (transformers' attention_scaling)
            cos_SD2, sin_SD2 = cos_SD2 * m, sin_SD2 * m
        cos_SD2, sin_SD2 = cos_SD2.to(q_BHSD.dtype), sin_SD2.to(q_BHSD.dtype)
        return (_interleaved(q_BHSD, cos_SD2, sin_SD2),
                _interleaved(k_BKSD, cos_SD2.to(k_BKSD.dtype), sin_SD2.to(k_BKSD.dtype)))
    cos_SD, sin_SD = angles_SD.cos(), angles_SD.sin()
    if m != 1.0:
        cos_SD, sin_SD = cos_SD * m, sin_SD * m
    cos_SD, sin_SD = cos_SD.to(q_BHSD.dtype), sin_SD.to(q_BHSD.dtype)
    q = q_BHSD * cos_SD + _half_turn(q_BHSD) * sin_SD
    k = k_BKSD * cos_SD.to(k_BKSD.dtype) + _half_turn(k_BKSD) * sin_SD.to(k_BKSD.dtype)
    return q, k
