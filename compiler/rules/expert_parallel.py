"""What expert parallelism requires (the rules of compiler/passes/expert_parallel.py's plans): experts that divide
over ep, and a model with `moe` layers to shard.

Torch-free: `scalec check` runs these on the plan as written, the search on every candidate.
"""
from __future__ import annotations

from compiler import spec as S
from compiler.diagnostics import divisors, plan_error

AXIS = "ep"


def requires(spec: S.Spec, plan) -> list:
    """Experts that divide over ep, and `moe` layers for ep to shard. (Each `moe` layer's
    capacity is bound when the model is resolved, in compiler/lints.py.)"""
    out: list = []
    moes = [x for x in S.walk(spec.model.layers) if isinstance(x, S.MoE)]
    ep = plan.size(AXIS)
    if ep == 1:
        return out
    at = "axis ep"
    if not moes:
        out.append(plan_error(plan, at, "E0704", f"ep = {ep} but the model has no `moe` layer to shard over it",
                              label="nothing to shard", help="add `moe(...)` layers (e.g. in place of an `mlp`), or "
                              "remove the axis and give its ranks to dp", axis=AXIS, rule="expert_parallel.no_moe"))
    for m in moes:
        n = int(spec.value(m.experts))
        if n % ep:
            ok = [d for d in divisors(n) if d <= max(4 * ep, 8)]
            out.append(plan_error(plan, at, "E0701", f"expert-parallel degree {ep} does not divide the {n} experts",
                                  label=f"{n} % {ep} == {n % ep}",
                                  help=f"each ep rank holds a whole number of experts (the `moe` at {m.span}); ep "
                                       "sizes that divide " + f"{n}: " + ", ".join(map(str, ok[-6:])),
                                  axis=AXIS, rule="expert_parallel.experts"))
        if m.rebalance is not None:
            out += _rebalance(plan, m, n, ep, spec.train)
    return out


def _rebalance(plan, m: S.MoE, n: int, ep: int, train: S.Train) -> list:
    """`rebalance = replicate(every, extra)` on this plan: the E + extra copies fill whole slots on each ep rank,
    no expert has more copies than there are ranks, and the plan is one the runtime re-places (runtime/rebalance.py:
    fp32 under ddp, each expert's gradient and AdamW state whole on its rank)."""
    out: list = []
    _, extra = m.rebalance
    if (n + extra) % ep or extra > n * (ep - 1):
        fits = [r for r in range(0, n * (ep - 1) + 1) if (n + r) % ep == 0][:4]
        why = (f"{n} experts + {extra} replicas do not fill the {ep} ep ranks evenly" if (n + extra) % ep else
               f"{extra} replicas are more than the {n * (ep - 1)} that give each expert a copy on every ep rank")
        out.append(plan_error(plan, "axis ep", "E0722", f"rebalance: {why}", label=f"ep = {ep}",
                              help=f"each ep rank holds (experts + extra) / ep slots (the `moe` at {m.span}); extra "
                                   f"values that fit: {', '.join(map(str, fits))}, ...", axis=AXIS,
                              rule="expert_parallel.rebalance_slots"))
    unserved = [why for cond, why in (
        (plan.size("pp") > 1, "pipeline stages (pp > 1)"), (plan.size("cp") > 1, "context parallelism (cp > 1)"),
        (plan.data_parallel != "ddp", f"data_parallel = {plan.data_parallel} (only ddp keeps each expert's "
                                      "gradient and optimizer state whole on its rank)"),
        (plan.offload != "none", "optimizer offload"),
        (train.precision != "fp32", f"precision = {train.precision} (its main gradients and fp32 masters are not "
                                    "moved yet)"),
        (bool(train.init_from), "`init = from(...)` (its reader fills E/ep experts per rank, not the slots)"))
        if cond]
    if unserved:
        out.append(plan_error(plan, "axis ep", "E0723", "rebalance is not yet served with " + "; ".join(unserved),
                              label="experts cannot be moved on this plan",
                              help="re-placement moves each expert's weights and AdamW state whole between ep "
                                   "ranks; run it under ddp without pipeline or context parallelism, or remove "
                                   f"`rebalance` (the `moe` at {m.span})", axis=AXIS,
                              rule="expert_parallel.rebalance_plan"))
    return out
