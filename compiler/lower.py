"""Lowering: a decided Plan applied to the unsharded trace, the one pass sequence and the policies that decide it.

    trace             spec              -> the unsharded trace, with the model's FLOPs
    decide_parallel   (unsharded, plan) -> plan with its tp regions and expert placements (the policies)
    lower             (unsharded, plan) -> a copy of the trace after tensor_parallel, context_parallel,
                                           expert_parallel and pipeline_split, in that order
    decide_stages     (lowered, plan)   -> plan with its stage layout: pipeline_split's policy, balanced on the
                                           FLOPs of the graphs as tp and ep leave them

`compile` (compiler/pipeline.py) and the search's candidates (compiler/candidates.py) both go through these, so a
candidate ranked by the search is lowered exactly as the program that would be emitted. This module sits below
both (it imports neither, nor compiler/fit.py), which keeps pipeline -> fit -> candidates free of a cycle.

`verify` runs between passes when asked (`check_between=True`, in tests), as torch.fx's PassManager does: a graph
broken by a pass is reported with that pass's name. `show` receives every segment's graph after each pass
(`scalec compile --show-graphs`).
"""
from __future__ import annotations

from dataclasses import replace

from compiler import plan as P
from compiler.diagnostics import ScaleError


def trace(spec):
    """The unsharded trace of the spec's model (built on the meta device), with its model FLOPs
    (compiler/cost/flops.py `model_flops`): what compile and the search's candidates decide and lower every plan
    from."""
    from compiler import model as M
    from compiler import trace as T
    from compiler.cost import flops as F
    traced = T.trace_model(M.build(spec, device="meta"))
    traced.model_flops_fwd, traced.model_flops_bwd, traced.padding_flops = F.model_flops(traced)
    return traced


def passes() -> tuple:
    """The passes, in order. Data parallelism needs no graph surgery (DDP/FSDP2 carry it out at run time; the
    ledger records its traffic)."""
    from compiler.passes.context_parallel import context_parallel_pass
    from compiler.passes.expert_parallel import expert_parallel_pass
    from compiler.passes.pipeline_split import pipeline_split_pass
    from compiler.passes.tensor_parallel import tensor_parallel_pass
    return (tensor_parallel_pass, context_parallel_pass, expert_parallel_pass, pipeline_split_pass)


def verify(traced, after: str) -> None:
    """Structural checks between passes: each graph lints and every node carries a shape and FLOP count."""
    from compiler import trace as T
    for cls, gm in traced.segments():
        try:
            gm.graph.lint()
        except Exception as exc:  # noqa: BLE001 - re-raised with the pass named
            raise AssertionError(f"graph {cls} is malformed after {after}: {exc}") from exc
        for node in gm.graph.nodes:
            if T.FLOPS not in node.meta:
                raise AssertionError(f"node {node.name} of {cls} lost its cost annotations after {after}")


def lower(unsharded, plan: P.Plan, *, check_between: bool = False, show=None):
    """A copy of `unsharded` (left as it is: candidates keep deciding from it) after every pass, in order, under
    `plan` (its tp and ep decisions made: `decide_parallel`). No pass reads the stage layout: pipeline_split cuts
    the top level at its blocks whatever the layout, so the layout is decided after lowering, from the lowered
    graphs (`decide_stages`), and carried by the Plan alone."""
    traced = unsharded.copy()
    for p in passes():
        traced = p(traced, plan)
        if check_between:
            verify(traced, p.__name__)
        if show is not None:
            for cls, gm in traced.segments():
                show(p.__name__, cls, gm)
    return traced


def decide_parallel(traced, plan: P.Plan) -> P.Plan:
    """The tensor- and expert-parallel policies over every segment of the unsharded trace. A layer the plan asks tp
    to shard that the policy cannot shard is refused (E0407): tp fails closed."""
    from compiler.passes.expert_parallel import ep_policy
    from compiler.passes.tensor_parallel import tp_policy, unsharded
    tp, problems = [], []
    if plan.size("tp") > 1:
        for cls, gm in traced.segments():
            decision = tp_policy(gm, plan)
            problems += unsharded(gm, plan, decision)
            tp.append((cls, decision))
    if problems:
        spec = traced.spec
        raise ScaleError(problems, {spec.path: spec.source})
    ep = tuple((cls, ep_policy(gm, plan.size("ep"))) for cls, gm in traced.segments()) if plan.size("ep") > 1 else ()
    return replace(plan, tp=tuple(tp), ep=ep)


def split_costs(lowered) -> tuple:
    """What the stage policy balances, as sympy expressions of the sizes: forward FLOPs of one sequence through a
    block, the prologue, and the epilogue with the loss (pipeline_split.split_costs), of the graphs as tp and ep
    leave them. With several `repeat`s the block's is their mean over every block (the policy counts blocks
    equally); the cost model costs each stage by the blocks it actually holds."""
    from compiler import trace as T
    from compiler.passes import pipeline_split as PS
    per, first, last = PS.split_costs(lowered)
    if len(per) == 1:
        return per[0], first, last
    counts = [gm.meta[T.REPEAT].count for gm in lowered.blocks.values()]
    return sum(c * f for c, f in zip(counts, per)) / sum(counts), first, last


def blocks_of(lowered, value) -> int:
    """How many blocks the pipeline cuts: the counts of the model's `repeat`s summed, a number under `value`."""
    from compiler import trace as T
    return sum(int(value(gm.meta[T.REPEAT].count)) for gm in lowered.blocks.values())


def stages_of(plan: P.Plan, blocks: int, per_block: int, first: int, last: int) -> tuple:
    """The stage layout of `plan` (the user's, or pipeline_split's cost-balanced one) from the split costs as
    numbers for its sizes: the one call of the stage policy, for compile and for every candidate."""
    from compiler.passes import pipeline_split as PS
    return PS.stage_policy(plan, blocks, per_block, first, last)


def decide_stages(spec, lowered, plan: P.Plan) -> P.Plan:
    """`plan` with its stage layout, balanced on the FLOPs of `lowered` (the graphs as tp and ep leave them) with
    `spec`'s sizes."""
    if plan.size("pp") == 1:
        return replace(plan, stages=())
    per_block, first, last = (int(spec.value(x, plan)) for x in split_costs(lowered))
    return replace(plan, stages=stages_of(plan, blocks_of(lowered, spec.value), per_block, first, last))
