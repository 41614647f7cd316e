"""Expert parallelism across nodes, deduplicated by node (`plan { ep_dispatch = "nodes" }`): each token crosses to a
node at most once, then fans out inside it (DeepSeek-V3's technical report, section 3.2.2: node-limited routing,
each token sent over InfiniBand once per destination node to the GPU of the same local index there, which forwards
it over NVLink to the GPUs holding its experts; the combine runs in reverse).

The ep group of n = nodes × L ranks (L of them on each node, ep rank = node · L + local index) has two sub-groups,
built by runtime/mesh.py from the compiler's list (compiler/layout/groups.py `ep_node_groups`):
    RAIL   the ep ranks of this rank's local index, one per node (crosses nodes)
    NODE   the ep ranks of this rank's node (inside one node)
Node d holds experts [d·En, (d+1)·En), En = E / nodes; ep rank r holds [r·El, (r+1)·El), El = E / n, as
compiler/passes/expert_parallel.py places them.

  node_routes(slot_BSK, capacity, experts)      forward only: which (token, node) pairs cross, the routing they
                                                carry (each choice's expert within the node), the counts exchanged
  node_dispatch(x_BSH, gate_BSK, routes)        -> rows_RH in this rank's expert order, gate_UK (the gates of the
                                                U rows this rank received over RAIL), layout (L, El)
  Experts(rows_RH, layout)
  node_combine(y_RH, gate_UK, routes)           -> out_BSH: on the node, Σ gate × output per received row (one
                                                row per token and node), that row back over RAIL, summed per token

Stage 1 (RAIL) moves P rows each way, P = Σ_t (distinct nodes of token t's experts) ≤ T·min(K, nodes); stage 2
(NODE) moves one row per choice that lands on the node. Each rank's own node and own rank are among the
destinations (rows to itself are counted, as runtime.moe counts an all-to-all's whole tensor). Autograd: the
backward of the dispatch is the combine's pattern (gradients back over NODE, summed per row, back over RAIL,
summed per token) and the other way round. Nothing here tests the backend: the same calls run on gloo and NCCL.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime import choices, collectives
from runtime.moe import by_expert, exchange_counts, exchange_rows

RAIL, NODE = choices.EP_NODE_GROUPS

FP8_BLOCK = 128
"""Elements of a row that share one fp32 scale when the dispatch sends FP8 (DeepSeek-V3's 1 × 128 activation tiles,
technical report §3.3.1); a row's last block may be shorter."""
_FP8 = False
E4M3_MAX = 448.0  # the largest finite float8_e4m3fn


def set_fp8(on: bool) -> None:
    """Under `precision = fp8` (runtime/parallelize.py): the dispatch's rows cross the rail and the node in float8
    e4m3 with an fp32 scale per FP8_BLOCK elements, as DeepSeek-V3 dispatches (report §3.3; its combine stays
    bf16, and so do the gradients here)."""
    global _FP8
    _FP8 = on


def _quantize(x_PH: torch.Tensor):
    """(the rows in float8 e4m3, as bytes: uint8, since gloo has no float8 dtype; the fp32 scale of each block of
    FP8_BLOCK elements), each block scaled so its largest magnitude is E4M3_MAX."""
    p, h = x_PH.shape
    n = -(-h // FP8_BLOCK)
    blocks = torch.nn.functional.pad(x_PH.float(), (0, n * FP8_BLOCK - h)).reshape(p, n, FP8_BLOCK)
    scale_PN = blocks.abs().amax(-1).clamp_min(1e-12) / E4M3_MAX
    q = (blocks / scale_PN.unsqueeze(-1)).to(torch.float8_e4m3fn).reshape(p, n * FP8_BLOCK)[:, :h]
    return q.contiguous().view(torch.uint8), scale_PN


def _dequantize(q_PH: torch.Tensor, scale_PN: torch.Tensor, dtype) -> torch.Tensor:
    p, h = q_PH.shape
    n = scale_PN.shape[1]
    x = torch.nn.functional.pad(q_PH.view(torch.float8_e4m3fn).float(), (0, n * FP8_BLOCK - h))
    return (x.reshape(p, n, FP8_BLOCK) * scale_PN.unsqueeze(-1)).reshape(p, n * FP8_BLOCK)[:, :h].to(dtype)


def _exchange_v(x: torch.Tensor, send: list, recv: list, axis: str) -> torch.Tensor:
    """runtime.moe's variable all-to-all over `axis`; over a group of one rank (one ep rank per node: no NODE
    group is built) the rows stay."""
    if collectives.axis_size(axis) == 1:
        return x
    return exchange_rows(x, send, recv, axis)


@dataclass(frozen=True)
class Routes:
    """What node_routes computed for one micro-batch's layer, read by its dispatch and combine (forward and
    backward). Suffixes: T tokens, K choices, P rows this rank sends over RAIL (token, node), U rows it receives
    there, Q choices those rows hold on this node (in the order sent over NODE), R rows this rank's experts get."""

    token_P: torch.Tensor     # the token of each row sent over RAIL (node-major, then token order)
    mine_PK: torch.Tensor     # which of the token's choices that row carries (its expert is on that node)
    send1: list               # rows to each node over RAIL
    recv1: list               # rows from each node
    row_Q: torch.Tensor       # the received row of each choice sent over NODE
    choice_Q: torch.Tensor    # and which of its K choices
    send2: list               # choices to each rank of the node
    recv2: list               # rows from each rank of the node
    at_R: torch.Tensor        # the received rows (source-major) in expert-major order: runtime.moe.by_expert
    layout: torch.Tensor      # (L, El) rows each rank of the node sent to each of this rank's experts
    batch: tuple              # (B, S)
    choices: int

    @property
    def tokens(self) -> int:
        return self.batch[0] * self.batch[1]

    @property
    def back_R(self) -> torch.Tensor:
        """The inverse of at_R: expert-major rows back to the order they arrived in."""
        at = self.at_R
        return torch.empty_like(at).scatter_(0, at, torch.arange(at.numel(), device=at.device))


def spans_nodes() -> bool:
    """Whether this program's ep group has its node sub-groups (runtime/mesh.py registers them where the plan asks
    for the node dispatch)."""
    return collectives.registered(RAIL)


def _counts(send: torch.Tensor, axis: str) -> torch.Tensor:
    """Forward only: all-to-all of equal int64 chunks, one per rank of `axis`: runtime.moe.exchange_counts."""
    return exchange_counts(send.reshape(-1), axis)


@torch.no_grad()
def node_routes(slot_BSK: torch.Tensor, capacity: int, experts: int) -> Routes:
    """The routes of one layer's tokens (forward only: indices and counts carry no gradient). `slot_BSK` is route's
    with capacity = S (dropless: a choice's expert is slot // capacity). Exchanges the row counts over RAIL, each
    row's choices within its node over RAIL (int64, K per row), and the rows per expert over NODE."""
    nodes, local = collectives.axis_size(RAIL), collectives.axis_size(NODE)
    if experts % (nodes * local):
        raise ValueError(f"{experts} experts do not divide over ep = {nodes} nodes × {local}")
    per_node, per_rank = experts // nodes, experts // (nodes * local)
    b, s, k = slot_BSK.shape
    expert_TK = (slot_BSK // capacity).reshape(b * s, k)
    node_TK = expert_TK // per_node
    hit_TD = torch.zeros(b * s, nodes, dtype=torch.bool, device=slot_BSK.device).scatter_(1, node_TK, True)
    node_P, token_P = hit_TD.t().nonzero(as_tuple=True)  # (node, token) pairs, node-major
    mine_PK = node_TK[token_P] == node_P.unsqueeze(1)
    within_PK = torch.where(mine_PK, expert_TK[token_P] - node_P.unsqueeze(1) * per_node, -1)
    sent_D = hit_TD.sum(0)
    recv_D = _counts(sent_D, RAIL).reshape(-1)
    send1, recv1 = sent_D.tolist(), recv_D.tolist()
    within_UK = _exchange_v(within_PK, send1, recv1, RAIL)
    row_Q, choice_Q = (within_UK >= 0).nonzero(as_tuple=True)
    within_Q = within_UK[row_Q, choice_Q]
    order = torch.argsort(within_Q, stable=True)  # by expert within the node: by destination rank, then expert
    row_Q, choice_Q = row_Q[order], choice_Q[order]
    per_expert = torch.bincount(within_Q, minlength=per_node)
    layout = _counts(per_expert, NODE).reshape(local, per_rank)
    return Routes(token_P=token_P, mine_PK=mine_PK, send1=send1, recv1=recv1, row_Q=row_Q, choice_Q=choice_Q,
                  send2=per_expert.reshape(local, per_rank).sum(1).tolist(), recv2=layout.sum(1).tolist(),
                  at_R=by_expert(layout), layout=layout, batch=(b, s), choices=k)


class _NodeDispatch(torch.autograd.Function):
    """Forward: each (token, node) row and its gates over RAIL, then each choice's row over NODE to its expert's
    rank (in FP8 under `set_fp8`). Backward: the rows' gradients back over NODE, summed per received row, back over
    RAIL with the gates' gradients, summed per token (in the compute dtype: the FP8 rounding is passed through, as
    a quantised linear's input is)."""

    @staticmethod
    def forward(ctx, x_BSH, gate_BSK, routes: Routes):
        ctx.routes, ctx.shape = routes, x_BSH.shape
        r = routes
        x_TH = x_BSH.reshape(r.tokens, -1)
        gate_PK = torch.where(r.mine_PK, gate_BSK.reshape(r.tokens, r.choices)[r.token_P], 0.0)
        if _FP8 and x_TH.is_floating_point():  # the rows in FP8 with their scales, over both stages
            q_PH, scale_PN = _quantize(x_TH[r.token_P])
            q_UH, scale_UN = (_exchange_v(t, r.send1, r.recv1, RAIL) for t in (q_PH, scale_PN))
            gate_UK = _exchange_v(gate_PK, r.send1, r.recv1, RAIL)
            q_RH, scale_RN = (_exchange_v(t[r.row_Q], r.send2, r.recv2, NODE)[r.at_R] for t in (q_UH, scale_UN))
            rows_RH = _dequantize(q_RH, scale_RN, x_TH.dtype)
        else:
            rows_UH = _exchange_v(x_TH[r.token_P], r.send1, r.recv1, RAIL)
            gate_UK = _exchange_v(gate_PK, r.send1, r.recv1, RAIL)
            rows_RH = _exchange_v(rows_UH[r.row_Q], r.send2, r.recv2, NODE)[r.at_R]
        ctx.mark_non_differentiable(r.layout)
        return rows_RH, gate_UK, r.layout

    @staticmethod
    def backward(ctx, grad_RH, grad_UK, _layout):
        r = ctx.routes
        h = grad_RH.shape[-1]
        grad_QH = _exchange_v(grad_RH[r.back_R], r.recv2, r.send2, NODE)
        grad_UH = grad_QH.new_zeros(sum(r.recv1), h).index_add_(0, r.row_Q, grad_QH)
        grad_PH = _exchange_v(grad_UH, r.recv1, r.send1, RAIL)
        grad_x = grad_PH.new_zeros(r.tokens, h).index_add_(0, r.token_P, grad_PH).reshape(ctx.shape)
        grad_gate = None
        if ctx.needs_input_grad[1]:
            grad_PK = _exchange_v(grad_UK.contiguous(), r.recv1, r.send1, RAIL) * r.mine_PK
            grad_gate = grad_PK.new_zeros(r.tokens, r.choices).index_add_(0, r.token_P, grad_PK)
            grad_gate = grad_gate.reshape(*ctx.shape[:-1], r.choices)
        return grad_x, grad_gate, None


class _NodeCombine(torch.autograd.Function):
    """Forward: the experts' output rows back over NODE, weighted by their gates and summed per received row, that
    row back over RAIL, summed per token. Backward: each token's gradient over RAIL to the nodes it visited, the
    gates' gradients there, the rows' gradients over NODE to the experts' ranks."""

    @staticmethod
    def forward(ctx, y_RH, gate_UK, routes: Routes):
        r = routes
        y_QH = _exchange_v(y_RH[r.back_R], r.recv2, r.send2, NODE)
        w_Q = gate_UK[r.row_Q, r.choice_Q].to(y_QH.dtype)
        z_UH = y_QH.new_zeros(sum(r.recv1), y_QH.shape[-1]).index_add_(0, r.row_Q, y_QH * w_Q.unsqueeze(1))
        z_PH = _exchange_v(z_UH, r.recv1, r.send1, RAIL)
        ctx.routes, ctx.gate_dtype = routes, gate_UK.dtype
        ctx.save_for_backward(y_QH, w_Q)
        return z_PH.new_zeros(r.tokens, z_PH.shape[-1]).index_add_(0, r.token_P, z_PH)

    @staticmethod
    def backward(ctx, grad_TH):
        r = ctx.routes
        y_QH, w_Q = ctx.saved_tensors
        grad_UH = _exchange_v(grad_TH.reshape(r.tokens, -1)[r.token_P], r.send1, r.recv1, RAIL)
        grad_QH = grad_UH[r.row_Q]
        grad_gate = None
        if ctx.needs_input_grad[1]:
            grad_w = (y_QH * grad_QH).sum(-1).to(ctx.gate_dtype)
            grad_gate = grad_w.new_zeros(sum(r.recv1), r.choices).index_put_((r.row_Q, r.choice_Q), grad_w)
        grad_y = _exchange_v(grad_QH * w_Q.unsqueeze(1), r.send2, r.recv2, NODE)[r.at_R]
        return grad_y, grad_gate, None


def node_dispatch(x_BSH: torch.Tensor, gate_BSK: torch.Tensor, routes: Routes):
    """Forward: the tokens to this rank's experts, each crossing to a node once (RAIL) and fanned out there (NODE):
    (rows_RH in expert order, gate_UK, the layout: the rows each rank of the node sent to each of this rank's
    experts, which runtime.moe.Experts reads as its counts). Under autocast the rows travel in its dtype, as
    runtime.moe.sort_tokens sends them. Backward: the reverse (see _NodeDispatch)."""
    if torch.is_autocast_enabled(x_BSH.device.type):
        x_BSH = x_BSH.to(torch.get_autocast_dtype(x_BSH.device.type))
    return _NodeDispatch.apply(x_BSH, gate_BSK, routes)


def node_combine(y_RH: torch.Tensor, gate_UK: torch.Tensor, routes: Routes) -> torch.Tensor:
    """Forward: each token's output, Σ over its choices of gate × its expert's output (runtime.moe.unsort_combine's
    sum), taken per node first: (B, S, H) as the tokens came. Backward: the reverse (see _NodeCombine)."""
    return _NodeCombine.apply(y_RH, gate_UK, routes).reshape(*routes.batch, y_RH.shape[-1])

