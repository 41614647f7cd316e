"""The compiler, top to bottom.

    parse and check   compiler/check.py         .scale text -> Spec (what the user wrote, resolved)
    plan as written   compiler/plan.py          Spec -> Plan (the mesh and the plan's settings)
    rules             compiler/rules.py         Plan -> diagnostics (each pass module's `requires`, mesh rules)
    build, trace      compiler/model.py, trace  Spec -> the unsharded traced graphs, kept unchanged
    decide            `decide` below            (Spec, traced) -> Plan with every decision: tp regions, expert
                                                placements, stage layout (the policies, beside their passes)
    verify            compiler/schedule.py      the schedule the program will run, proved deadlock-free
    passes            compiler/passes/          (graphs, Plan) -> new graphs, on a copy of the trace
    cost              compiler/cost/            what the plan costs
    emit              compiler/codegen/         (called by the CLI)

`verify` (graph lint and annotations) runs between passes in tests (`check_between=True`), so a broken pass is
named by the error; `show` receives every segment's graph after each pass (`scalec compile --show-graphs`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from compiler import cost as C
from compiler import plan as P
from compiler import spec as S
from compiler.check import check_path
from compiler.diagnostics import Diagnostic, ScaleError


@dataclass
class Compiled:
    spec: S.Spec
    traced: object       # trace.Traced after the passes: what the program runs
    costs: object        # cost.Estimate
    plan: P.Plan | None = None
    unsharded: object = None  # trace.Traced before any pass: what candidate plans are decided from
    model: object = None      # cost.CostModel of `traced`: what `costs` and the step-time model read


def _passes():
    from compiler.passes.expert_parallel import expert_parallel_pass
    from compiler.passes.pipeline_split import pipeline_split_pass
    from compiler.passes.tensor_parallel import tensor_parallel_pass
    # In order. Data parallelism needs no graph surgery (DDP/FSDP2 carry it out at run time; the ledger records its
    # traffic).
    return (tensor_parallel_pass, expert_parallel_pass, pipeline_split_pass)


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


def decide_stages(spec: S.Spec, sharded, plan: P.Plan) -> P.Plan:
    """The stage layout, balanced on the FLOPs of the graphs as tp and ep leave them."""
    from compiler.passes import pipeline_split as PS
    if plan.size("pp") == 1:
        return replace(plan, stages=())
    (gm,) = sharded.blocks.values()
    per_block, first, last = (int(spec.value(x)) for x in PS.split_costs(sharded))
    return replace(plan, stages=PS.stage_policy(plan, int(spec.value(gm.meta["repeat"].count)), per_block, first,
                                                last))


def schedule_problems(plan: P.Plan) -> list[Diagnostic]:
    """The pipeline schedule the program will execute (runtime.schedule.actions, the same lists), proved to run:
    every send received, no rank waiting forever, each (stage, micro-batch) computed once (E0609 otherwise)."""
    from compiler import schedule as SCH
    p, v, m = plan.size("pp"), plan.virtual_stages, plan.micro_batches
    if p == 1:
        return []
    try:
        SCH.verify(SCH.actions(plan.schedule, p, m, v), SCH.Layout(p, v, m))
    except SCH.ScheduleError as exc:
        return [Diagnostic("E0609", "the pipeline schedule fails verification" + ("" if plan.span("axis pp") else
                           f" for {plan.describe()}"), plan.span("axis pp"),
                           label=f"{plan.schedule}, pp = {p}, {v} stage{'s' if v > 1 else ''} per rank, "
                           f"{m} micro-batches", help=f"{exc}; this is a defect of scalec's schedule builder, not "
                           "of the file: another schedule or micro-batch count avoids it")]
    return []


def compile_spec(spec: S.Spec, check_between: bool = False, show=None, plan: P.Plan | None = None,
                 unsharded=None) -> Compiled:
    """Compile the file's plan, or a candidate `plan` of the same model (from the same unsharded trace if given)."""
    from compiler import model as M
    from compiler import trace as T
    if plan is not None:
        spec = P.respec(spec, plan)
    plan = P.from_spec(spec) if plan is None else replace(plan, stages=(), tp=(), ep=())
    unsharded = unsharded or T.trace_model(M.build(spec, device="meta"))
    if check_between:
        verify(unsharded, "trace")
    plan = decide_parallel(unsharded, plan)
    traced = unsharded.copy()
    tp_pass, ep_pass, pp_pass = _passes()
    for p in (tp_pass, ep_pass):
        traced = p(traced, plan)
        _after(traced, p.__name__, check_between, show)
    plan = decide_stages(spec, traced, plan)
    problems = schedule_problems(plan)
    if problems:
        raise ScaleError(problems, {spec.path: spec.source})
    traced = pp_pass(traced, plan)
    _after(traced, pp_pass.__name__, check_between, show)
    model = C.CostModel(spec, traced)
    return Compiled(spec, traced, model.estimate(plan), plan, unsharded, model)


def _after(traced, name: str, check_between: bool, show) -> None:
    if check_between:
        verify(traced, name)
    if show is not None:
        for cls, gm in traced.segments():
            show(name, cls, gm)


def budget(compiled: Compiled) -> list[Diagnostic]:
    """What the memory model says of the plan: E0501 (an error) when the fullest rank's predicted peak exceeds
    one device, with what would make it fit; W0502 (a warning) when it fits with less than 10% to spare."""
    from compiler import fit
    from compiler.cost import memory as MEM
    spec, est = compiled.spec, compiled.costs
    limit = spec.mesh.device.memory_gb * 1e9
    return MEM.over_memory(spec, est.memory, lambda: fit.fixes(compiled, limit))


def compile_checked(path: str, memory: bool = True, show=None) -> Compiled:
    """compile the file (which proves its pipeline schedule: every command that compiles), then, with `memory`
    (compile, run without --force), refuse a plan whose predicted peak does not fit."""
    compiled = compile_spec(check_path(path), show=show)
    problems = []
    if memory:
        problems += [d for d in budget(compiled) if d.severity == "error"]
    if problems:
        raise ScaleError(problems, {compiled.spec.path: compiled.spec.source})
    return compiled


def compile_path(path: str, check_between: bool = False) -> Compiled:
    return compile_spec(check_path(path), check_between)
