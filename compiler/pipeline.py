"""The compiler, top to bottom.

    parse and check   compiler/check.py         .scale text -> Spec (what the user wrote, resolved)
    plan as written   compiler/check.py         Spec.plan (compiler/plan.py's Plan: the mesh and the plan's
                                                settings as written; the one carrier of decisions from here on)
    rules             compiler/rules/           Plan -> diagnostics (each pass's `requires`, the mesh's)
    build, trace      compiler/model.py, trace  Spec -> the unsharded traced graphs, kept unchanged
    decide            compiler/lower.py         (unsharded, Plan) -> Plan with its tp regions and expert placements
                                                (the policies, beside their passes)
    verify            compiler/schedule.py      the schedule the program will run, proved deadlock-free
    lower             compiler/lower.py         (unsharded, Plan) -> a copy after the passes (compiler/passes/), in
                                                order; the same function lowers the search's candidates
    decide stages     compiler/lower.py         the stage layout, balanced on the lowered graphs, into the Plan
    cost              compiler/cost/            what the plan costs (the stage layout read from the Plan)
    fit               compiler/fit.py           `budget`: whether the predicted peak fits, and what would make it fit
    emit              compiler/codegen/         (called by the CLI)

`verify` (graph lint and annotations) runs between passes in tests (`check_between=True`), so a broken pass is
named by the error; `show` receives every segment's graph after each pass (`scalec compile --show-graphs`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from compiler import cost as C
from compiler import fit, fp8_checks
from compiler import plan as P
from compiler import spec as S
from compiler.check import check_path
from compiler.cost import links as LK
from compiler.cost import step_time as ST
from compiler.diagnostics import Diagnostic, ScaleError
from compiler.lower import decide_parallel, decide_stages, lower, trace, verify


@dataclass
class Compiled:
    """A compiled plan and everything known of it, each made once: every report, codegen and the memory budget read
    these, none lowers or costs again."""
    spec: S.Spec
    traced: object       # trace.Traced after the passes: what the program runs
    costs: object        # cost.Estimate: memory, ledger, and the step time (`costs.step`, made on first read)
    plan: P.Plan | None = None
    unsharded: object = None  # trace.Traced before any pass: what candidate plans are decided from
    model: object = None      # cost.CostModel of `traced`: what `costs` and the step-time model read
    advice: tuple | None = None  # fit.advice: what would make the plan fit one device (made on first ask)


def schedule_problems(plan: P.Plan) -> list[Diagnostic]:
    """The pipeline schedule the program will execute (runtime.schedule.actions, the same lists), proved to run:
    every send received, no rank waiting forever, each (stage, micro-batch) computed once (E0609 otherwise)."""
    from compiler import schedule as SCH
    p, v, m = plan.size("pp"), plan.virtual_stages, plan.micro_batches
    if p == 1:
        return []
    try:
        SCH.verify(SCH.actions(plan.schedule, p, m, v), plan.stage_layout)
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
    plan = spec.plan if plan is None else replace(plan, stages=(), tp=(), ep=())
    plan = P.with_ep_nodes(plan, spec, S.node_dispatched(spec))  # the expert-parallel pass reads the ep split by node
    unsharded = unsharded or trace(spec)
    if check_between:
        verify(unsharded, "trace")
    plan = decide_parallel(unsharded, plan)
    problems = schedule_problems(plan)  # pp, virtual stages, micro-batches, schedule: proved before any pass runs
    if problems:
        raise ScaleError(problems, {spec.path: spec.source})
    traced = lower(unsharded, plan, check_between=check_between, show=show)
    plan = decide_stages(spec, traced, plan)
    model = C.CostModel(spec, traced, plan)
    # the estimate, with its step time (made on first read): what every report, codegen and the budget read
    costs = replace(model.estimate(plan), step_of=ST.step_of(model, plan))
    return Compiled(spec, traced, costs, plan, unsharded, model)


def compile_checked(path: str, memory: bool = True, show=None) -> Compiled:
    """compile the file (which proves its pipeline schedule: every command that compiles), then, with `memory`
    (compile, run without --force), refuse a plan whose predicted peak does not fit, and add W0502 (a peak within
    the margin of the device) to the spec's warnings, which those commands print as `plan` prints it."""
    compiled = compile_spec(check_path(path), show=show)
    problems, fp8_warnings = fp8_checks.compiled_checks(compiled)  # precision = fp8: the kernel, the filter
    slower = placement_slower(compiled) + tuple(fp8_warnings)
    if slower:
        compiled.spec = replace(compiled.spec, warnings=compiled.spec.warnings + slower)
    if memory:
        found = fit.budget(compiled)
        problems += [d for d in found if d.severity == "error"]
        near = tuple(d for d in found if d.severity == "warning")
        if near and not problems:
            compiled.spec = replace(compiled.spec, warnings=compiled.spec.warnings + near)
    if problems:
        raise ScaleError(problems, {compiled.spec.path: compiled.spec.source})
    return compiled


def placement_slower(compiled: Compiled) -> tuple:
    """W0323: `placement = auto` on a described network whose step the mesh's own order is predicted to run faster
    (auto minimises the bytes over the most oversubscribed level first, then the time of the collectives; the
    step-time model prices each ring at its slowest link, which a byte count does not weigh), with both times."""
    plan = compiled.plan
    if plan is None or plan.placement != "auto" or not LK.described(compiled.spec.cluster):
        return ()
    auto = compiled.costs.step
    naive = ST.unplaced(compiled)
    if auto is None or naive is None or naive.step_time_s >= auto.step_time_s:
        return ()
    said = LK.resolved(plan, compiled.spec.cluster, compiled.costs.ledger).named()
    mesh = ", ".join(a for a, _ in reversed(plan.axes))
    return (Diagnostic("W0323", f"placement = auto is predicted slower than the mesh's own order: "
                                f"{_seconds(auto.step_time_s)} against {_seconds(naive.step_time_s)} per step",
                       plan.span("placement"), severity="warning",
                       label=f"auto: {said}, the least bytes over the most oversubscribed level",
                       help=f"auto minimises those bytes first, then the collectives' time; the step-time model "
                            f"prices each ring at its slowest link, which a byte count does not weigh. Write "
                            f"`placement = order({mesh})` (or no placement) for the faster prediction"),)


def _seconds(t: float) -> str:
    return f"{t:.1f} s" if t >= 1 else f"{t * 1e3:.3g} ms"


def compile_path(path: str, check_between: bool = False) -> Compiled:
    return compile_spec(check_path(path), check_between)
