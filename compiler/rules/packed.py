"""What packed documents (`data = tokens(..., document_separator = ID)`, runtime/packed.py) require of a plan: the
document ids travel with each micro-batch to the attention layers of a whole model (with dp, every data_parallel,
cp all_gather and recomputation); through pipeline stages, tensor and expert parallelism, cp's ring and
all_to_all and torch.compile that is not built yet, and such a plan is refused here, at the setting that asks for it.

Torch-free: `scalec check` runs these on the plan as written, the search on every candidate.
"""
from __future__ import annotations

from compiler import spec as S
from compiler.diagnostics import plan_error


def requires(spec: S.Spec, plan) -> list:
    out: list = []
    if spec.train.data.document_separator is None:
        return out
    for axis, what in (("pp", "pipeline parallelism"), ("tp", "tensor parallelism"), ("ep", "expert parallelism")):
        if plan.size(axis) > 1:
            out.append(plan_error(plan, f"axis {axis}", "E0318", f"packed documents with {what} (`axis {axis}`) "
                                  "are not built yet", label=f"{axis} = {plan.size(axis)}",
                                  help=f"remove the axis (give its ranks to dp or cp), or `document_separator`"))
    if plan.size("cp") > 1 and plan.context_parallel != "all_gather":
        # packed attention gathers the keys (its mask: the queries' documents against the keys'); ring and Ulysses
        # would silently become all_gather for it
        out.append(plan_error(plan, "context_parallel", "E0318", f"packed documents with `context_parallel = "
                              f"{plan.context_parallel}` are not built yet", label="only all_gather takes them",
                              help="set `context_parallel = all_gather`"))
    if plan.compile:
        out.append(plan_error(plan, "compile", "E0318",
                              "compiling a program with packed documents is not built yet", label="compile = true",
                              help="set `compile = false`"))
    return out
