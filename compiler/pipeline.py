"""The compiler, top to bottom: check → build → trace → passes → cost → emit.

Passes run in the order listed in PASSES; each is `(GraphModule, Spec) -> GraphModule` over every traced segment,
and `verify` runs between them in tests (`check_between=True`), so a broken pass is named by the error.
"""
from __future__ import annotations

from dataclasses import dataclass

from compiler import cost as C
from compiler import model as M
from compiler import spec as S
from compiler import trace as T
from compiler.check import check_path
from compiler.diagnostics import Diagnostic, ScaleError

from compiler.passes.expert_parallel import expert_parallel_pass
from compiler.passes.pipeline_split import pipeline_split_pass
from compiler.passes.tensor_parallel import tensor_parallel_pass

# The passes, in order. Data parallelism needs no graph surgery (DDP/FSDP2 carry it out at run time; the ledger
# records its traffic).
PASSES: tuple = (tensor_parallel_pass, expert_parallel_pass, pipeline_split_pass)


@dataclass
class Compiled:
    spec: S.Spec
    traced: T.Traced
    costs: C.Estimate


def verify(traced: T.Traced, after: str) -> None:
    """Structural checks between passes: each graph lints and every node carries a shape and FLOP count."""
    for cls, gm in traced.segments():
        try:
            gm.graph.lint()
        except Exception as exc:  # noqa: BLE001 - re-raised with the pass named
            raise AssertionError(f"graph {cls} is malformed after {after}: {exc}") from exc
        for node in gm.graph.nodes:
            if T.FLOPS not in node.meta:
                raise AssertionError(f"node {node.name} of {cls} lost its cost annotations after {after}")


def compile_spec(spec: S.Spec, check_between: bool = False) -> Compiled:
    model = M.build(spec, device="meta")
    traced = T.trace_model(model)
    if check_between:
        verify(traced, "trace")
    for p in PASSES:
        traced = p(traced, spec)
        if check_between:
            verify(traced, p.__name__)
    return Compiled(spec, traced, C.costs(spec, traced))


def budget(compiled: Compiled) -> list[Diagnostic]:
    """What the memory estimate says of the plan: E0501 (an error) when the model state per rank (weights,
    gradients, optimizer) cannot fit one device; W0502 (a warning) when a pipeline stage's model state plus its
    activations in flight exceed it."""
    from compiler.cost import memory as MEM
    spec, est = compiled.spec, compiled.costs
    return (MEM.does_not_fit(spec, est.model_state, spec.plan.data_parallel, spec.mesh.size("dp"))
            + MEM.stage_over_memory(spec, est.stages))


def verify_schedule(spec: S.Spec) -> list[Diagnostic]:
    """The pipeline schedule the program will execute (runtime.schedule.actions, the same lists), proved to run:
    every send received, no rank waiting forever, each (stage, micro-batch) computed once (E0609 otherwise)."""
    from compiler import schedule as SCH
    p = spec.mesh.size("pp")
    if p == 1:
        return []
    v, m = spec.plan.virtual_stages, spec.plan.micro_batches
    try:
        SCH.verify(SCH.actions(spec.plan.schedule, p, m, v), SCH.Layout(p, v, m))
    except SCH.ScheduleError as exc:
        return [Diagnostic("E0609", "the pipeline schedule fails verification", spec.mesh.axis_spans.get("pp"),
                           label=f"{spec.plan.schedule}, pp = {p}, {v} stage{'s' if v > 1 else ''} per rank, "
                           f"{m} micro-batches", help=f"{exc}; this is a defect of scalec's schedule builder, not "
                           "of the file: another schedule or micro-batch count avoids it")]
    return []


def compile_checked(path: str, memory: bool = True) -> Compiled:
    """compile_path, then refuse a plan whose pipeline schedule fails verification (every command that compiles)
    and, with `memory` (compile, run), one whose model state cannot fit."""
    compiled = compile_path(path)
    problems = verify_schedule(compiled.spec)
    if memory:
        problems += [d for d in budget(compiled) if d.severity == "error"]
    if problems:
        raise ScaleError(problems, {compiled.spec.path: compiled.spec.source})
    return compiled


def compile_path(path: str, check_between: bool = False) -> Compiled:
    return compile_spec(check_path(path), check_between)
