"""The structure of a plan, as a CostModel keys it (compiler/cost/__init__.py): which of its decisions the lowered
graphs and the compiled formulas bind, so that one model costs every plan that shares them."""
from __future__ import annotations

from compiler import spec as S


def structure_of(axes, sp: bool, tp_layers) -> tuple:
    """What decides the shape of the sharded graphs and these formulas (not their sizes): which axes the mesh has
    and which are above 1, sequence parallelism, the layer kinds tp shards. Not dp: no pass reads it (its ZeRO
    stage, gradient reduction and batch split are the cost model's, from the plan's numbers), so plans with and
    without dp share their graphs (a search lowers and compiles each structure once: issue 37)."""
    return (tuple((a, n > 1) for a, n in axes if a != "dp"), bool(sp), tuple(tp_layers))


def binds_cp(spec: S.Spec) -> bool:
    """Whether the lowered graphs bind the cp degree as a number: a `moe` layer's capacity is divided by it
    (compiler/passes/context_parallel.py `_capacity`); every other shape keeps it as the symbol `cp`, an argument
    of the formulas (formulas.env_of)."""
    return any(isinstance(x, S.MoE) for x in S.walk(spec.model.layers))


def structure(plan, cp_bound: bool = False) -> tuple:
    """Every decision of `plan` that a CostModel binds when it is built, so the key under which one model costs
    many plans (compiler/candidates.py keys its lowered graphs by it too): the pass structure (`structure_of`, three
    fields), then under cp its attention variant (the context-parallel pass rewrites the graphs per variant),
    whether the residual stream is fp32 (the widths of the activation formulas, activations.precision_key), and
    the cp degree where the graphs bind it (`cp_bound`: `binds_cp` of the spec), else None: the formulas take
    it as an argument, so the plans of every cp degree share one model; last the ep split by node (Plan.ep_nodes:
    the expert-parallel pass dispatches by node, and the rows that cross are a number of those nodes)."""
    cp = plan.size("cp")
    return structure_of(plan.axes, plan.sequence_parallel, plan.tp_layers) + (
        plan.context_parallel if cp > 1 else None, bool(plan.fp32_residual), cp if cp_bound else None,
        plan.ep_nodes)


def other_structure(plan, built: tuple) -> str:
    """Why a CostModel built for the structure `built` refuses `plan`: which of its decisions differs."""
    if structure_of(plan.axes, plan.sequence_parallel, plan.tp_layers) != built[:3]:
        return (f"plan {plan.describe()} has another pass structure than the traced one (axes > 1, sequence "
                "parallelism, tp layers): trace and run the passes for it")
    if bool(plan.fp32_residual) != built[4]:
        return (f"plan {plan.describe()} keeps the residual stream in another precision than the one this cost "
                "model's activation formulas were derived for: build a CostModel for it")
    if tuple(plan.ep_nodes) != built[6]:
        return (f"plan {plan.describe()} dispatches its experts over another split by node than this cost model's "
                "graphs: build a CostModel for it")
    return (f"plan {plan.describe()} has another cp degree or attention variant than the one this cost model's "
            "graphs were built for (a `moe` layer's capacity binds the cp degree): build a CostModel for it")
