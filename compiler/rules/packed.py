"""What packed documents (`data = tokens(..., document_separator = ID)`, runtime/packed.py) require of a plan: the
document ids travel with each micro-batch to the attention layers of the model or of every pipeline stage (with
dp, every data_parallel, tp with or without sequence parallelism, pp, cp all_gather and all_to_all, and
recomputation); through expert parallelism, cp's ring and torch.compile that is not built yet, and such a plan is
refused here, at the setting that asks for it.

Torch-free: `scalec check` runs these on the plan as written, the search on every candidate.
"""
from __future__ import annotations

from compiler import spec as S
from compiler.diagnostics import plan_error

# The axis the search charges these refusals to (Diagnostic.axis): packed documents are checked beside context
# parallelism, the other rule about how a sequence is cut, and their refusals (ep, cp's ring, compile) are counted
# with cp's, each holding for every micro-batch count of a mesh shape (compiler/search/prune.py).
AXIS = "cp"
BUILT = "packed documents compose with dp, tp (+ sp), pp, cp (all_gather, all_to_all) and recomputation"


def requires(spec: S.Spec, plan) -> list:
    out: list = []
    if spec.train.data.document_separator is None:
        return out
    if plan.size("ep") > 1:
        out.append(plan_error(plan, "axis ep", "E0318", "packed documents with expert parallelism (`axis ep`) are not "
                              "built yet", label=f"ep = {plan.size('ep')}",
                              help=f"remove the axis (give its ranks to dp, tp, pp or cp), or `document_separator`; "
                              f"{BUILT}", axis=AXIS, rule="packed.expert_parallel"))
    if plan.size("cp") > 1 and plan.context_parallel == "ring":
        # the ring's blocks are masked by true position only (runtime/context_parallel.py ring_attention); a packed
        # ring would mask each block by document too, and it would silently become all_gather here
        out.append(plan_error(plan, "context_parallel", "E0318", "packed documents with `context_parallel = ring` "
                              "are not built yet", label="all_gather and all_to_all take them",
                              help="set `context_parallel = all_gather` (or `all_to_all`)", axis=AXIS,
                              rule="packed.ring"))
    if plan.compile:
        out.append(plan_error(plan, "compile", "E0318",
                              "compiling a program with packed documents is not built yet", label="compile = true",
                              help="set `compile = false`", axis=AXIS, rule="packed.compile"))
    return out
