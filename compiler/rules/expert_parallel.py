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
    return out
