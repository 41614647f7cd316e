"""What expert re-placement (`moe(..., rebalance = replicate(every = N, extra = R))`, runtime/rebalance.py) costs
and what it can gain, torch-free.

Costs, per rebalanced layer the rank holds (the ledger's rows, `ledger_rows`):
  - the replicas' gradients: one all-reduce over ep per expert weight, of R experts' rows (the replicated experts'
    gradients, zero where a rank holds no copy), every step: R · P_e elements in fp32 (P_e: one expert's weights,
    hidden · ffn · 3 with a gate, · 2 without). Counted by the runtime (runtime.collectives), as the ledger says.
  - the moves: every N steps, at most each of the rank's S = (E + R) / ep slots takes another expert, its weights
    and AdamW's two moments with it: S · P_e · 3 elements received, amortised over the N steps (the worst case: a
    slot whose expert stays moves nothing). Not counted per step (they happen after the step the counts cover); the
    run logs the bytes each re-placement moved into each rank.
  - the load: every N steps, an all-reduce over the batch ranks (dp × ep) of 2E + R float64 counts, amortised.
The memory of the replicas (their weights, gradients and AdamW state) is the traced parameters' own: the pass gives
each rank S slots (compiler/passes/expert_parallel.py), which every memory row reads.

Gain (`gain`): the grouped experts and their all-to-alls take as long as the most loaded ep rank's rows. With a load
skew s (max / mean over the ep ranks, as the run logs it), re-placement brings the experts' share of the step down
by (s - s') / s, where s' is the skew EPLB's placement leaves (`balanced_skew`).
"""
from __future__ import annotations

import sympy

from compiler import spec as S
from compiler.cost.ledger import Collective
from runtime import eplb

FP32 = 4


def rebalanced(spec: S.Spec) -> list[tuple[S.MoE, int]]:
    """Each `moe` layer with `rebalance`, with how many times the model holds it (repeats multiply)."""
    out: list = []

    def walk(layers, times: int) -> None:
        for x in layers:
            if isinstance(x, S.Repeat):
                walk(x.body, times * int(spec.value(x.count)))
            elif isinstance(x, S.Residual):
                walk(x.body, times)
            elif isinstance(x, S.MoE) and x.rebalance is not None:
                out.append((x, times))
    walk(spec.model.layers, 1)
    return out


def expert_params(m: S.MoE) -> sympy.Expr:
    """One expert's weights: up (and gate, under swiglu) hidden × ffn, down ffn × hidden."""
    return m.hidden * m.ffn * (3 if m.act == "swiglu" else 2)


def ledger_rows(spec: S.Spec, plan) -> list[Collective]:
    """The ledger's rows of re-placement on a rank (none without ep): see the module docstring."""
    ep = plan.size("ep")
    if ep == 1:
        return []
    rows = []
    for m, times in rebalanced(spec):
        every, extra = m.rebalance
        per_expert = expert_params(m)
        slots = (m.experts + extra) / sympy.Integer(ep)
        n_expert = int(spec.value(per_expert))
        n_slots = int(spec.value(m.experts)) + extra
        if extra:
            rows.append(Collective(op="all_reduce", axis="ep", dtype_bytes=FP32, span=m.rebalance_span,
                                   reason=f"sum the gradients of the {extra} replicas' experts over their copies "
                                          "(rebalance), every copy then the same", times=times,
                                   bytes=extra * n_expert * FP32 * times,
                                   element_formula=lambda e=extra, p=per_expert: e * p))
        moved = n_slots // ep * n_expert * 3
        rows.append(Collective(op="all_to_all", axis="ep", dtype_bytes=FP32, span=m.rebalance_span,
                               reason=f"move the experts re-placed every {every} steps, weights and AdamW's two "
                                      f"moments (received: at most every slot; per step amortised over {every})",
                               times=times, bytes=int(moved * FP32 * times / every), measured=False,
                               element_formula=lambda s=slots, p=per_expert, n=every: s * p * 3 / n))
        batch = "dp×ep" if plan.size("dp") > 1 else "ep"
        counts = 2 * int(spec.value(m.experts)) + extra
        rows.append(Collective(op="all_reduce", axis=batch, dtype_bytes=8, span=m.rebalance_span,
                               reason=f"sum the experts' measured load over the batch ranks every {every} steps "
                                      "(float64 counts, per step amortised)", times=times,
                               bytes=int(counts * 8 * times / every), measured=False,
                               element_formula=lambda c=counts, n=every: sympy.Integer(c) / n))
    return rows


def balanced_skew(skew: float, experts: int, ranks: int, extra: int) -> float:
    """The per-rank load max / mean that runtime/eplb.py's placement leaves for a load of skew `skew`: modelled as
    the hottest rank's E/ep experts sharing skew × the mean rank's load evenly, the other experts the rest evenly
    (a model of the skew, not a measurement: `plan` says so)."""
    own = experts // ranks
    hot = min(skew, ranks) / ranks  # the hottest rank's share of the whole load
    rest = (1 - hot) / max(1, experts - own)
    load = [hot / own] * own + [rest] * (experts - own)
    placement = eplb.place(load, ranks, (experts + extra) // ranks)
    return eplb.spread(eplb.rank_loads(eplb.predicted_slot_load(load, placement), ranks))


def expert_flops_step(spec: S.Spec) -> int:
    """Model FLOPs of the rebalanced layers' experts per step, forward and backward (2 per multiply-add, × 3 for
    the backward's two matmuls per forward one): 6 · P_e · top_k per token and layer."""
    tokens = int(spec.value(spec.train.global_batch)) * int(spec.value(spec.train.seq_len))
    return sum(6 * int(spec.value(expert_params(m))) * m.top_k * tokens * times for m, times in rebalanced(spec))


def step_at_skew(costs, spec: S.Spec, plan, skew: float) -> tuple[float, float, float]:
    """(step time without re-placement, with it, the skew it leaves) in seconds, at a per-rank expert load skew
    `skew` (max / mean). The plan's predicted step is at balanced load; the experts' part of it, their FLOP share
    of the slowest rank's compute plus the exposed ep all-to-alls, grows with the most loaded rank's rows: × skew
    without re-placement, × the skew EPLB leaves with it (`balanced_skew`, with the first rebalanced layer's
    replicas), the rest unchanged. Both include the re-placement's own traffic, which the predicted step holds."""
    step = costs.step
    rank = max(step.ranks, key=lambda r: r.end_s)
    share = expert_flops_step(spec) / max(1, costs.flops_step_n)
    experts_s = share * rank.compute_s + step.exposed_comm_s.get("ep", 0.0)
    others = step.step_time_s - experts_s
    m = rebalanced(spec)[0][0]
    left = balanced_skew(skew, int(spec.value(m.experts)), plan.size("ep"), m.rebalance[1])
    return others + skew * experts_s, others + left * experts_s, left
