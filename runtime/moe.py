"""Mixture-of-Experts: the router, capacity and token dropping, the experts, and the all-to-all dispatch and
combine over the `ep` axis (GShard, Lepikhin et al. 2020; Switch Transformer, Fedus et al. 2021).

Shapes: B sequences, S tokens per sequence, H model width, E experts, K choices per token (top-k), C capacity.

Capacity groups are sequences. Each sequence offers every expert C slots, C = min(S, ceil(factor · K · S / E)),
filled first by the tokens' first choices in position order, then by their second choices, and so on (GShard's
priority). A choice that finds its expert full is dropped: its slot index is the trash slot E·C. Because a group is
one sequence, which tokens are dropped does not depend on how the batch is split over ranks: every layout computes
exactly what the single-device model computes.

The buffers have static shapes (E × B·C × H, padded to capacity), so the FX trace needs no data-dependent branch and
every all-to-all moves a size the compiler knows: E·B·C·H elements each way.

  route(logits, top_k, capacity, aux_weight)  -> slot_BSK, gate_BSK   (and the auxiliary load-balancing loss)
  dispatch(x_BSH, slot_BSK, experts, capacity) -> x_ENH, N = B·C        (tokens into expert-major slots)
  all_to_all_dispatch(x_ENH, axis)             -> (E/ep) × (ep·N) × H    (each rank receives its experts' slots)
  Experts(x)                                    batched expert MLPs on this rank's experts
  all_to_all_combine(y, axis)                  -> E × N × H              (the outputs go back to their tokens)
  combine(y_ENH, slot_BSK, gate_BSK[, x_BSH])  -> y_BSH                  (gate-weighted sum over the choices)
"""
from __future__ import annotations

import contextlib
import math
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from runtime import collectives, faults, recompute

# -- the auxiliary loss ------------------------------------------------------------------------------------------

_AUX_GRAD_SCALE = 1.0


def set_aux_loss_scale(scale: float) -> None:
    """The factor the training loop applies to each micro-batch's loss before backward (1/micro-batches without a
    pipeline; 1 under pipelining, which scales the gradients afterwards): the auxiliary loss gets the same."""
    global _AUX_GRAD_SCALE
    _AUX_GRAD_SCALE = scale


class _AddAuxLoss(torch.autograd.Function):
    """Forward: the identity on `x`. Backward: also d(weight · aux)/d(aux) = weight · scale into `aux`, as if
    `weight · aux` had been added to the loss. The auxiliary loss thus trains the router wherever its layer runs,
    also on a pipeline stage that never sees the final loss (Megatron-LM's MoEAuxLossAutoScaler does the same)."""

    @staticmethod
    def forward(ctx, x, aux, weight: float):
        ctx.weight = weight
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, torch.full((), ctx.weight * _AUX_GRAD_SCALE, dtype=torch.float32, device=grad.device), None


# -- statistics for the training log ------------------------------------------------------------------------------

# [dropped choices, routed choices, sum of auxiliary losses, router calls] since the last reset, and the largest
# expert load relative to a perfectly balanced one (K·S/E per sequence).
_SUMS: torch.Tensor | None = None
_MAX_LOAD: torch.Tensor | None = None
_RECORDING = True


@contextlib.contextmanager
def not_recording():
    """Forwards that are not training (pipelining's shape inference, on uninitialised tensors) leave the
    statistics alone."""
    global _RECORDING
    before, _RECORDING = _RECORDING, False
    try:
        yield
    finally:
        _RECORDING = before


def recording() -> bool:
    """Whether this forward trains (counted in the statistics and the loads), outside `not_recording`."""
    return _RECORDING


def stats_reset() -> None:
    global _SUMS, _MAX_LOAD
    _SUMS = _MAX_LOAD = None


def _record(keep_BSK, counts_BE, aux, top_k: int, share: float = 1.0) -> None:
    """`counts_BE`: the whole sequences' choices per expert; `share`: the part of each sequence this rank routes
    (1/cp under context parallelism, whose ranks each add their share of the aux loss and of a call)."""
    global _SUMS, _MAX_LOAD
    if not _RECORDING or keep_BSK.device.type == "meta" or recompute.recomputing():  # once per forward
        return
    with torch.no_grad():
        s, e = keep_BSK.shape[1] / share, counts_BE.shape[1]
        sums = torch.stack([(~keep_BSK).sum().double(), torch.tensor(keep_BSK.numel(), dtype=torch.float64,
                                                                     device=keep_BSK.device),
                            aux.detach().double(), torch.full((), share, dtype=torch.float64,
                                                              device=keep_BSK.device)])
        load = counts_BE.max().double() / (top_k * s / e)
        _SUMS = sums if _SUMS is None else _SUMS + sums
        _MAX_LOAD = load if _MAX_LOAD is None else torch.maximum(_MAX_LOAD, load)


def stats_read(device, group=None, duplicates: int = 1) -> dict:
    """Totals over every rank of `group` (all ranks: one collective each, so every rank must call it), each
    layer counted once (`duplicates`: how many ranks compute the same tokens, e.g. tp)."""
    sums = _SUMS.clone() if _SUMS is not None else torch.zeros(4, dtype=torch.float64, device=device)
    load = _MAX_LOAD.clone().reshape(()) if _MAX_LOAD is not None else torch.zeros((), dtype=torch.float64,
                                                                                     device=device)
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(sums, group=group)
        dist.all_reduce(load, op=dist.ReduceOp.MAX, group=group)
    sums /= duplicates
    dropped, routed, aux, calls = sums.tolist()
    return {"dropped": int(round(dropped)), "routed": int(round(routed)),
            "aux_loss": aux / calls if calls else 0.0, "max_load": float(load)}


# -- routing, dispatch, combine -----------------------------------------------------------------------------------

# Test-only hook, read once when set (as runtime.faults' SCALEC_TEST_* hooks): SCALEC_TEST_SKEW=X adds X·(1 - e/(E-1))
# to every router's logit of expert e, so that the low experts take most choices (expert re-placement's tests).
_TEST_SKEW = float(os.environ.get("SCALEC_TEST_SKEW", "0") or 0)


def capacity(seq: int, experts: int, top_k: int, factor) -> int:
    """Slots per expert per sequence: the factor times a balanced share of the K·S choices, rounded up (a product
    that is a whole number up to float rounding is not rounded up), at least 1, at most S (an expert receives each
    token at most once). `factor = "none"` (dropless): S, the worst case, so no choice is ever dropped."""
    if factor == "none":
        return seq
    return max(1, min(seq, math.ceil(factor * top_k * seq / experts - 1e-9)))


def _choose(scores_BSE: torch.Tensor, top_k: int, groups: int, topk_groups: int) -> torch.Tensor:
    """The top_k experts of each token by `scores_BSE`, within its `topk_groups` best groups of experts when the
    experts are cut into `groups` (DeepSeek-V3's group-limited routing: a group's score is the sum of its two best
    experts' scores; the experts of the other groups cannot be chosen). (B, S, K) expert indices."""
    if groups > 1:
        b, s, e = scores_BSE.shape
        by_group_BSGX = scores_BSE.unflatten(-1, (groups, e // groups))
        group_BSG = by_group_BSGX.topk(min(2, e // groups), dim=-1)[0].sum(-1)
        best_BST = group_BSG.topk(topk_groups, dim=-1)[1]
        allowed_BSG = torch.zeros_like(group_BSG, dtype=torch.bool).scatter(-1, best_BST, True)
        scores_BSE = by_group_BSGX.masked_fill(~allowed_BSG.unsqueeze(-1), float("-inf")).flatten(-2)
    return torch.topk(scores_BSE, top_k, dim=-1)[1]


class ExpertBias(nn.Module):
    """DeepSeek-V3's auxiliary-loss-free balancing (`moe(..., bias_update = γ)`): a per-expert bias added to the
    scores by which a token chooses its experts (never to its gates), and after each optimizer step raised by γ for
    each expert that took fewer than the mean load of that step, lowered by γ for each that took more
    (`update_expert_bias`). `bias` is model state, kept in checkpoints (Hugging Face's e_score_correction_bias);
    `load` counts the choices of the step's micro-batches on this rank. Called with no input, it hands both to
    `route` (a call the traced graph and the generated program show)."""

    def __init__(self, experts: int, rate: float):
        super().__init__()
        self.rate = rate
        self.register_buffer("bias", torch.zeros(experts, dtype=torch.float32))
        self.register_buffer("load", torch.zeros(experts, dtype=torch.float32), persistent=False)

    def forward(self):
        return self.bias, self.load


@torch.no_grad()
def reset_expert_bias(module) -> None:
    """Every ExpertBias of `module` at zero bias and load: how a run starts (a resumed run then loads its biases
    from the checkpoint); a model materialised from the meta device holds garbage in its buffers until then."""
    for m in module.modules():
        if isinstance(m, ExpertBias):
            m.bias.zero_()
            m.load.zero_()


@torch.no_grad()
def update_expert_bias(biases, group=None) -> None:
    """After the optimizer step: each ExpertBias's load summed over the ranks the batch is split over (`group`: dp
    × ep; tp and pp ranks route other layers or the same tokens), then bias += rate · sign(mean load - load), and the
    load reset. Every rank of the group computes the same update from the same sums."""
    for m in biases:
        if group is not None and dist.is_initialized() and dist.get_world_size(group) > 1:
            dist.all_reduce(m.load, group=group)
        m.bias.add_(m.rate * torch.sign(m.load.mean() - m.load))
        m.load.zero_()


def _scores(logits_BSE: torch.Tensor, top_k: int, scoring: str, groups: int, topk_groups: int, bias):
    """(scores_BSE, probs_BSE, expert_BSK, gate_BSK): each expert's score (softmax over the experts, or its own
    sigmoid), the scores normalised to sum to 1 per token (the aux loss's), the K experts each token chooses (by
    the scores, plus the expert bias where there is one, within its best groups where there are groups) and their
    scores."""
    if scoring == "sigmoid":
        scores_BSE = torch.sigmoid(logits_BSE.float())
        probs_BSE = scores_BSE / scores_BSE.sum(-1, keepdim=True)
    else:
        scores_BSE = probs_BSE = torch.softmax(logits_BSE.float(), dim=-1)
    if scoring == "softmax" and groups == 1 and bias is None:
        gate_BSK, expert_BSK = torch.topk(scores_BSE, top_k, dim=-1)
    else:
        choice_BSE = scores_BSE.detach() if bias is None else scores_BSE.detach() + bias[0]
        expert_BSK = _choose(choice_BSE, top_k, groups, topk_groups)
        gate_BSK = scores_BSE.gather(-1, expert_BSK)
    return scores_BSE, probs_BSE, expert_BSK, gate_BSK


def choice_counts(logits_BSE: torch.Tensor, top_k: int, scoring: str = "softmax", groups: int = 1,
                  topk_groups: int = 1, bias=None) -> torch.Tensor:
    """(B, E) int64: how many of each sequence's choices go to each expert, as `route` chooses them (its arguments
    alike). Under context parallelism each rank counts its own tokens and the counts are summed over cp, so that
    route's auxiliary loss sees the whole sequence's load (`route(..., counts=, tokens=)`)."""
    with torch.no_grad():
        expert_BSK = _scores(logits_BSE, top_k, scoring, groups, topk_groups, bias)[2]
        return F.one_hot(expert_BSK, logits_BSE.shape[-1]).sum((1, 2))


def route(logits_BSE: torch.Tensor, top_k: int, capacity: int, aux_weight: float, renormalize: bool | None = None,
          scoring: str = "softmax", groups: int = 1, topk_groups: int = 1, scale: float = 1.0, bias=None,
          counts=None, tokens: int | None = None):
    """Top-k routing with capacity. Returns (slot_BSK, gate_BSK): for each token and choice the slot index
    expert·C + position (E·C for a dropped choice), and the gate weight: the expert's score, divided by the sum of
    the K chosen ones' when `renormalize` (GShard, Mixtral, Qwen3-MoE's norm_topk_prob, DeepSeek-V3) or as it is
    when not (Switch, Qwen2-MoE); None: renormalised when K > 1; then times `scale` (DeepSeek-V3's
    routed_scaling_factor). A score is the softmax probability over all the experts, or with `scoring = "sigmoid"`
    each expert's own sigmoid (DeepSeek-V3). With `groups` > 1 a token chooses only among the experts of its
    `topk_groups` best groups (`_choose`). The auxiliary load-balancing loss
    E · Σ_e f_e · P_e per sequence (f_e: fraction of the K·S choices sent to e, P_e: mean score of e, sigmoid scores
    normalised to sum to 1 per token as DeepSeek-V3's sequence-wise loss; 1 when balanced), averaged over the
    sequences, trains the router with weight `aux_weight`. `bias`: an ExpertBias's (bias, load): the bias added to
    the scores a token chooses by, and this forward's choices counted into the load (not while recomputing, nor in
    a forward that does not train).

    Under context parallelism (dropless only: no capacity binds, so each token's route is its own) the logits are
    this rank's `S/cp` tokens of each sequence, `counts` the whole sequences' choice counts ((B, E), summed over cp:
    `choice_counts`) and `tokens` the whole sequence's length. f_e is then the whole sequence's, and this rank's
    share of P_e its own tokens' scores over `tokens`: the shares' aux losses sum to the sequence's, and each
    rank's gradient of its share is exact for its tokens. Its weight is multiplied by tokens / S (= cp), since
    the gradients are averaged over cp."""
    b, s, e = logits_BSE.shape
    if _TEST_SKEW:  # test-only: every layout routes alike, towards the low experts (runtime/rebalance.py's tests)
        logits_BSE = logits_BSE + _TEST_SKEW * torch.linspace(1.0, 0.0, e, device=logits_BSE.device)
    scores_BSE, probs_BSE, expert_BSK, gate_BSK = _scores(logits_BSE, top_k, scoring, groups, topk_groups, bias)
    if top_k > 1 if renormalize is None else renormalize:
        gate_BSK = gate_BSK / (gate_BSK.sum(-1, keepdim=True) + (1e-20 if scoring == "sigmoid" else 0.0))
    if scale != 1.0:
        gate_BSK = gate_BSK * scale
    choice_BSKE = F.one_hot(expert_BSK, e)
    # Position of each choice in its expert's queue: all first choices (in token order) before second choices.
    queue_BQE = choice_BSKE.transpose(1, 2).reshape(b, top_k * s, e)
    pos_BQ = ((queue_BQE.cumsum(1) - 1) * queue_BQE).sum(-1)
    pos_BSK = pos_BQ.reshape(b, top_k, s).transpose(1, 2)
    keep_BSK = pos_BSK < capacity
    slot_BSK = torch.where(keep_BSK, expert_BSK * capacity + pos_BSK, torch.full_like(pos_BSK, e * capacity))
    counts_BE = choice_BSKE.sum((1, 2))
    if bias is not None and _RECORDING and not recompute.recomputing() and torch.is_grad_enabled():
        with torch.no_grad():
            bias[1].add_(counts_BE.sum(0).to(bias[1].dtype))
    whole, n = (counts_BE, s) if counts is None else (counts, tokens)
    mean_BE = probs_BSE.mean(1) if counts is None else probs_BSE.sum(1) / n  # this rank's share of P_e
    aux = e * ((whole.float() / (top_k * n)) * mean_BE).sum(-1).mean()
    if aux_weight > 0 and torch.is_grad_enabled():
        gate_BSK = _AddAuxLoss.apply(gate_BSK, aux, aux_weight if counts is None else aux_weight * n / s)
    _record(keep_BSK, whole, aux, top_k, share=s / n)
    return slot_BSK, gate_BSK


def dispatch(x_BSH: torch.Tensor, slot_BSK: torch.Tensor, experts: int, capacity: int) -> torch.Tensor:
    """Copy each kept (token, choice) into its expert's slot: an expert-major buffer E × (B·C) × H, zero where a
    slot is empty, in the tokens' dtype (bf16 under bf16: runtime.precision), or under autocast its dtype.
    Dropped choices land in a trash slot that is cut off."""
    if torch.is_autocast_enabled(x_BSH.device.type):  # the experts compute in it: send the tokens in it too
        x_BSH = x_BSH.to(torch.get_autocast_dtype(x_BSH.device.type))
    b, s, h = x_BSH.shape
    k = slot_BSK.shape[2]
    src = x_BSH.unsqueeze(2).expand(b, s, k, h).reshape(b, s * k, h)
    index = slot_BSK.reshape(b, s * k, 1).expand(b, s * k, h)
    buf = x_BSH.new_zeros(b, experts * capacity + 1, h).scatter_add(1, index, src)
    return buf[:, :experts * capacity].reshape(b, experts, capacity, h).transpose(0, 1).reshape(
        experts, b * capacity, h)


def combine(y_ENH: torch.Tensor, slot_BSK: torch.Tensor, gate_BSK: torch.Tensor,
            x_BSH: torch.Tensor | None = None) -> torch.Tensor:
    """Each token's output: Σ over its choices of gate × the expert's output in its slot. A dropped choice adds
    nothing (the token goes on through the enclosing residual), or with `x_BSH` (dropped = identity) adds
    gate × the token itself."""
    e, n, h = y_ENH.shape
    b, s, k = slot_BSK.shape
    c = n // b
    y = y_ENH.reshape(e, b, c, h).transpose(0, 1).reshape(b, e * c, h)
    y = torch.cat([y, y.new_zeros(b, 1, h)], dim=1)  # the trash slot reads as zero
    picked_BSKH = y.gather(1, slot_BSK.reshape(b, s * k, 1).expand(b, s * k, h)).reshape(b, s, k, h)
    w_BSK = gate_BSK.to(y.dtype)
    out_BSH = (picked_BSKH * w_BSK.unsqueeze(-1)).sum(2)
    if x_BSH is not None:
        dropped_BSK = (slot_BSK == e * c).to(y.dtype)
        out_BSH = out_BSH + (w_BSK * dropped_BSK).sum(-1, keepdim=True) * x_BSH
    return out_BSH


# -- dropless without padding: tokens sorted by expert, grouped matmuls (`moe(..., dispatch = grouped)`) ----------

# torch's grouped GEMM takes groups of rows whose starts are aligned: each expert's rows are padded to a multiple of
# GROUP_ALIGN (torchtitan pads to 8 for bf16, 16 for fp8), so at most E·(GROUP_ALIGN - 1) rows per call compute
# nothing: the hardware FLOPs equal the model's up to that.
GROUP_ALIGN = 16


def _grouped_kernel(x_TH: torch.Tensor, w_EHF: torch.Tensor) -> bool:
    """Whether torch's grouped GEMM runs the experts: on CUDA (SM 8.0 and later), bf16 tokens and weights, both
    matmul widths multiples of 8 (16-byte rows); otherwise the exact loop over the experts."""
    mm = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
    return (mm is not None and x_TH.is_cuda and x_TH.dtype == torch.bfloat16 and w_EHF.dtype == torch.bfloat16
            and w_EHF.shape[1] % 8 == 0 and w_EHF.shape[2] % 8 == 0
            and torch.cuda.get_device_capability(x_TH.device) >= (8, 0))


def _grouped_mm_mlp(x_TH, counts_E, w_up, w_gate, w_down):
    """The experts' MLPs by torch's grouped GEMM: rows copied into groups padded to GROUP_ALIGN, int32 end
    offsets, the padding rows dropped again after the down projection."""
    mm = getattr(F, "grouped_mm", None) or torch._grouped_mm
    e = counts_E.shape[0]
    padded_E = (counts_E + GROUP_ALIGN - 1) // GROUP_ALIGN * GROUP_ALIGN
    ends_E = padded_E.cumsum(0)
    starts_E = ends_E - padded_E
    t = x_TH.shape[0]
    # row i of expert k goes to starts_E[k] + i: its rank among the rows of its expert
    expert_T = torch.repeat_interleave(torch.arange(e, device=x_TH.device), counts_E, output_size=t)
    first_E = counts_E.cumsum(0) - counts_E
    where_T = starts_E[expert_T] + torch.arange(t, device=x_TH.device) - first_E[expert_T]
    rows = t + e * GROUP_ALIGN  # a static bound on the padded rows
    x_PH = x_TH.new_zeros(rows, x_TH.shape[1]).index_copy(0, where_T, x_TH)
    offs = ends_E.to(torch.int32)
    h_PF = mm(x_PH, w_up, offs=offs)
    h_PF = F.silu(mm(x_PH, w_gate, offs=offs)) * h_PF if w_gate is not None else F.gelu(h_PF)
    return mm(h_PF, w_down, offs=offs)[where_T]


def _order(slot_BSK: torch.Tensor, capacity: int) -> torch.Tensor:
    """The (token, choice) pairs in expert order: for each expert its choices in (sequence, position, choice)
    order. Indices into the flattened B·S·K choices."""
    return torch.argsort((slot_BSK // capacity).reshape(-1), stable=True)


def sort_tokens(x_BSH: torch.Tensor, slot_BSK: torch.Tensor, experts: int, capacity: int):
    """Dropless dispatch without padding: every choice's token as one row, in expert order, (B·S·K) × H, and the
    rows of each expert (E,), int64. `slot_BSK` is route's with capacity = S (dropless: no slot is the trash
    slot), so a choice's expert is slot // S. In the tokens' dtype, or under autocast its dtype (as `dispatch`)."""
    if torch.is_autocast_enabled(x_BSH.device.type):
        x_BSH = x_BSH.to(torch.get_autocast_dtype(x_BSH.device.type))
    b, s, h = x_BSH.shape
    k = slot_BSK.shape[2]
    order_T = _order(slot_BSK, capacity)
    counts_E = torch.bincount((slot_BSK // capacity).reshape(-1), minlength=experts)
    return x_BSH.reshape(b * s, h)[order_T // k], counts_E


def unsort_combine(y_TH: torch.Tensor, slot_BSK: torch.Tensor, gate_BSK: torch.Tensor, capacity: int):
    """Each token's output from the expert-ordered rows: Σ over its choices of gate × its row (as `combine`)."""
    b, s, k = slot_BSK.shape
    order_T = _order(slot_BSK, capacity)
    back_T = torch.empty_like(order_T).scatter_(0, order_T, torch.arange(order_T.numel(), device=order_T.device))
    picked_BSKH = y_TH[back_T].reshape(b, s, k, y_TH.shape[-1])
    return (picked_BSKH * gate_BSK.to(y_TH.dtype).unsqueeze(-1)).sum(2)


class Experts(nn.Module):
    """`experts` MLPs (GELU, or SwiGLU with a gate) without biases, applied batched: E × N × H -> E × N × H.
    Under expert parallelism each rank holds E/ep of them (the first dim of every weight)."""

    init_per_expert = True         # runtime.layers.init_parameters draws each expert from its own generator
    residual_out = ("w_down",)     # writes into the residual stream: initialised with the scaled std

    def __init__(self, experts: int, hidden: int, ffn: int, act: str = "gelu"):
        super().__init__()
        self.act = act
        self.w_up = nn.Parameter(torch.empty(experts, hidden, ffn))
        if act == "swiglu":
            self.w_gate = nn.Parameter(torch.empty(experts, hidden, ffn))
        self.w_down = nn.Parameter(torch.empty(experts, ffn, hidden))

    def forward(self, x: torch.Tensor, counts: torch.Tensor | None = None) -> torch.Tensor:
        """Padded (`counts` None): E × N × H -> E × N × H, one batched matmul per weight. Grouped (`moe(...,
        dispatch = grouped)`): rows T × H sorted by expert, `counts` the rows of each (E,), or under ep the
        (ep, E/ep) rows each source rank sent to each local expert (summed over the sources) -> T × H."""
        if counts is not None:
            return self._grouped(x, counts.reshape(-1, self.w_up.shape[0]).sum(0))
        h_ENF = torch.bmm(x, self.w_up)
        h_ENF = F.silu(torch.bmm(x, self.w_gate)) * h_ENF if self.act == "swiglu" else F.gelu(h_ENF)
        return torch.bmm(h_ENF, self.w_down)

    def _grouped(self, x_TH: torch.Tensor, counts_E: torch.Tensor) -> torch.Tensor:
        """Each expert's MLP on its own rows only: torch's grouped GEMM where it has one (`_grouped_kernel`), else an
        exact loop over the experts (CPU, fp32, shapes the kernel refuses). Either way the FLOPs are the model's:
        no empty slot is computed (the kernel's groups are padded to GROUP_ALIGN rows at most)."""
        weights = (self.w_up, self.w_gate, self.w_down) if self.act == "swiglu" else (self.w_up, None, self.w_down)
        if _grouped_kernel(x_TH, self.w_up):
            return _grouped_mm_mlp(x_TH, counts_E, *weights)
        outs = []
        for e, x_NH in enumerate(torch.split(x_TH, counts_E.tolist())):
            h_NF = x_NH @ self.w_up[e]
            h_NF = F.silu(x_NH @ self.w_gate[e]) * h_NF if self.act == "swiglu" else F.gelu(h_NF)
            outs.append(h_NF @ self.w_down[e])
        return torch.cat(outs) if outs else x_TH.new_zeros(x_TH.shape)

    def extra_repr(self) -> str:
        e, h, f = self.w_up.shape
        return f"{e}, {h}, {f}, act={self.act!r}"


# -- expert parallelism over `ep` ---------------------------------------------------------------------------------


def _exchange(x: torch.Tensor, axis: str) -> torch.Tensor:
    """all_to_all_single with equal splits along dim 0: chunk j goes to rank j of `axis`; chunk j of the result
    came from rank j."""
    x = x.contiguous()
    splits = [x.shape[0] // collectives.axis_size(axis)] * collectives.axis_size(axis)
    collectives._count("all_to_all", axis, x)
    # torch's functional collective (out of place): selective recomputation saves its output (runtime.recompute).
    with faults.op(f"all_to_all over {axis} (MoE dispatch or combine)", faults.axis_site(faults.caller_site(), axis)):
        return collectives._F.wait_tensor(collectives._F.all_to_all_single(x, splits, splits,
                                                                           collectives._name(axis)))


def _to_experts(x_ENH: torch.Tensor, axis: str) -> torch.Tensor:
    n = collectives.axis_size(axis)
    e, t, h = x_ENH.shape
    if e % n:
        raise ValueError(f"{e} experts do not divide over {axis} = {n}")
    got = _exchange(x_ENH, axis)  # (source rank, my experts, its slots)
    return got.reshape(n, e // n, t, h).transpose(0, 1).reshape(e // n, n * t, h)


def _from_experts(y_LMH: torch.Tensor, axis: str) -> torch.Tensor:
    n = collectives.axis_size(axis)
    el, m, h = y_LMH.shape
    out = y_LMH.reshape(el, n, m // n, h).transpose(0, 1).reshape(n * el, m // n, h)  # (owner rank, ...)
    return _exchange(out, axis)


class _Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, axis):
        ctx.axis = axis
        return _to_experts(x, axis)

    @staticmethod
    def backward(ctx, grad):
        return _from_experts(grad, ctx.axis), None


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, axis):
        ctx.axis = axis
        return _from_experts(y, axis)

    @staticmethod
    def backward(ctx, grad):
        return _to_experts(grad, ctx.axis), None


def all_to_all_dispatch(x_ENH: torch.Tensor, axis: str) -> torch.Tensor:
    """Forward: all-to-all over `axis`, E × N × H -> (E/ep) × (ep·N) × H: every rank sends each expert's slots to
    the rank holding that expert. Backward: the reverse all-to-all of the gradients."""
    if collectives.axis_size(axis) == 1:
        return x_ENH
    return _Dispatch.apply(x_ENH, axis)


def all_to_all_combine(y: torch.Tensor, axis: str) -> torch.Tensor:
    """Forward: all-to-all over `axis`, (E/ep) × (ep·N) × H -> E × N × H: expert outputs return to the ranks
    whose tokens they are. Backward: the reverse all-to-all of the gradients."""
    if collectives.axis_size(axis) == 1:
        return y
    return _Combine.apply(y, axis)


# -- expert parallelism of the grouped path: variable splits ------------------------------------------------------


def exchange_counts(counts_E: torch.Tensor, axis: str) -> torch.Tensor:
    """Forward only (counts carry no gradient): all-to-all over `axis` of the rows each rank will send to each
    expert, E int64 each way. (E,) -> (ep, E/ep): row j, what rank j sends to each of this rank's experts."""
    n = collectives.axis_size(axis)
    if n == 1:
        return counts_E.reshape(1, -1)
    if counts_E.shape[0] % n:
        raise ValueError(f"{counts_E.shape[0]} experts do not divide over {axis} = {n}")
    send = counts_E.reshape(n, -1).contiguous()
    collectives._count("all_to_all", axis, send)
    with faults.op(f"all_to_all over {axis} (MoE counts)", faults.axis_site(faults.caller_site(), axis)):
        return collectives._F.wait_tensor(collectives._F.all_to_all_single(send, [1] * n, [1] * n,
                                                                           collectives._name(axis)))


def exchange_rows(x: torch.Tensor, send: list, recv: list, axis: str) -> torch.Tensor:
    """all_to_all_single with variable splits along dim 0: `send[j]` rows to rank j, `recv[j]` rows from it. The
    bytes counted are the whole tensor this rank sends (its own rows included, as `_exchange` counts)."""
    x = x.contiguous()
    collectives._count("all_to_all", axis, x)
    with faults.op(f"all_to_all over {axis} (MoE dispatch or combine, variable splits)",
                   faults.axis_site(faults.caller_site(), axis)):
        return collectives._F.wait_tensor(collectives._F.all_to_all_single(x, recv, send, collectives._name(axis)))


class _ExchangeV(torch.autograd.Function):
    """Forward: all-to-all with splits (send, recv). Backward: the reverse, with the splits swapped."""

    @staticmethod
    def forward(ctx, x, send, recv, axis):
        ctx.splits, ctx.axis = (send, recv), axis
        return exchange_rows(x, send, recv, axis)

    @staticmethod
    def backward(ctx, grad):
        send, recv = ctx.splits
        return exchange_rows(grad, recv, send, ctx.axis), None, None, None


def by_expert(layout_NL: torch.Tensor) -> torch.Tensor:
    """The received rows (source-major: for each source rank its rows of each local expert) reordered
    expert-major (for each local expert its rows from each source): indices into the received rows."""
    n, el = layout_NL.shape
    start_NL = (layout_NL.reshape(-1).cumsum(0) - layout_NL.reshape(-1)).reshape(n, el)
    counts_Q, starts_Q = layout_NL.t().reshape(-1), start_NL.t().reshape(-1)
    total = int(layout_NL.sum())
    first_Q = counts_Q.cumsum(0) - counts_Q
    group_T = torch.repeat_interleave(torch.arange(counts_Q.numel(), device=layout_NL.device), counts_Q,
                                      output_size=total)
    return starts_Q[group_T] + torch.arange(total, device=layout_NL.device) - first_Q[group_T]


def all_to_all_dispatch_grouped(x_TH: torch.Tensor, counts_E: torch.Tensor, layout_NL: torch.Tensor,
                                axis: str) -> torch.Tensor:
    """Forward: all-to-all over `axis` with variable splits, T × H rows in expert order -> R × H rows of this
    rank's experts in expert order (R = layout_NL.sum(), T on average under balanced routing), each rank's rows to
    the rank holding their expert. Backward: the reverse all-to-all of the gradients."""
    n = collectives.axis_size(axis)
    if n == 1:
        return x_TH
    send = counts_E.reshape(n, -1).sum(1).tolist()
    recv = layout_NL.sum(1).tolist()
    return _ExchangeV.apply(x_TH, send, recv, axis)[by_expert(layout_NL)]


def all_to_all_combine_grouped(y_RH: torch.Tensor, counts_E: torch.Tensor, layout_NL: torch.Tensor,
                               axis: str) -> torch.Tensor:
    """Forward: the reverse of all_to_all_dispatch_grouped: the experts' output rows return to their tokens'
    ranks, in the expert order those ranks sent them. Backward: the reverse all-to-all of the gradients."""
    n = collectives.axis_size(axis)
    if n == 1:
        return y_RH
    at = by_expert(layout_NL)
    back = torch.empty_like(at).scatter_(0, at, torch.arange(at.numel(), device=at.device))
    send = layout_NL.sum(1).tolist()
    recv = counts_E.reshape(n, -1).sum(1).tolist()
    return _ExchangeV.apply(y_RH[back], send, recv, axis)


def sync_expert_grads(named_params, is_expert, group, divide: int) -> None:
    """Gradients of experts sharded over ep: each rank's already sums the contributions of all its ep peers'
    tokens (through the all-to-all backward). Sum over the ranks that hold the same experts (`group`: dp, or dp × cp
    under context parallelism), then divide by the number of batch shards (dp · ep · cp), as data parallelism
    averages the dense gradients."""
    for name, p in named_params:
        if p.grad is None or not is_expert(name):
            continue
        if group is not None and dist.get_world_size(group) > 1:
            dist.all_reduce(p.grad, group=group)
        p.grad.div_(divide)
