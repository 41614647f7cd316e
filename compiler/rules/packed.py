"""What packed documents (`data = tokens(..., document_separator = ID)`, runtime/packed.py) require of a plan: the
document ids travel with each micro-batch to the attention layers of a whole model (with dp, every data_parallel,
tp with or without sequence parallelism, cp all_gather and all_to_all, and recomputation); through pipeline stages,
expert parallelism, cp's ring and torch.compile that is not built yet, and such a plan is refused here, at the
setting that asks for it.

Torch-free: `scalec check` runs these on the plan as written, the search on every candidate.
"""
from __future__ import annotations

from compiler import spec as S
from compiler.diagnostics import plan_error

BUILT = "packed documents compose with dp, tp (+ sp), cp (all_gather, all_to_all) and recomputation"


def requires(spec: S.Spec, plan) -> list:
    out: list = []
    if spec.train.data.document_separator is None:
        return out
    for axis, what in (("pp", "pipeline parallelism"), ("ep", "expert parallelism")):
        if plan.size(axis) > 1:
            out.append(plan_error(plan, f"axis {axis}", "E0318", f"packed documents with {what} (`axis {axis}`) "
                                  "are not built yet", label=f"{axis} = {plan.size(axis)}",
                                  help=f"remove the axis (give its ranks to dp, tp or cp), or `document_separator`; "
                                  f"{BUILT}"))
    if plan.size("cp") > 1 and plan.context_parallel == "ring":
        # the ring's blocks are masked by true position only (runtime/context_parallel.py ring_attention); a packed
        # ring would mask each block by document too, and it would silently become all_gather here
        out.append(plan_error(plan, "context_parallel", "E0318", "packed documents with `context_parallel = ring` "
                              "are not built yet", label="all_gather and all_to_all take them",
                              help="set `context_parallel = all_gather` (or `all_to_all`)"))
    if plan.compile:
        out.append(plan_error(plan, "compile", "E0318",
                              "compiling a program with packed documents is not built yet", label="compile = true",
                              help="set `compile = false`"))
    return out
