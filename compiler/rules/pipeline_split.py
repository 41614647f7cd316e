"""What a pipeline requires (the rules of compiler/passes/pipeline_split.py's plans): consecutive `repeat`s (their
blocks, concatenated, are what stages hold: global block i is the i-th of them all), enough blocks, enough
micro-batches, a valid interleaving and layout, a schedule small enough to prove.

Torch-free: `scalec check` runs these on the plan as written, the search on every candidate.
"""
from __future__ import annotations

from compiler import spec as S
from compiler.diagnostics import plan_error
from runtime.choices import SPLIT_BACKWARD, V_SHAPED

AXIS = "pp"
# The rules (Diagnostic.rule) whose verdict reads no micro-batch count, only pp, the schedule, the virtual stages and
# the model's blocks: a refusal by one holds for every micro-batch count of a family (the search refuses them all at
# once, compiler/search/prune.py). A rule that starts reading `micro_batches`, recomputation or compile leaves.
PER_SHAPE = frozenset({"pipeline_split.virtual_stages", "pipeline_split.repeats", "pipeline_split.blocks",
                       "pipeline_split.interleaving"})

# The schedule's actions per step, over all ranks, that `compile` builds and proves (compiler/schedule.py `verify`,
# linear in them: about a second per million on a laptop) and that each rank of the program builds at start-up.
# Korthikanti et al.'s 1T configuration interleaved (p 64 × v 2, 512 micro-batches) has 391,168; this bound is
# ten times that, and refuses only absurd counts (E0615; it replaced E0608's cap of 16,384 stage × micro-batch
# slots).
MAX_SCHEDULE_ACTIONS = 4_194_304


def schedule_actions(schedule: str, pp: int, v: int, m: int) -> int:
    """How many actions `runtime.schedule.actions` makes, without making them: per stage and micro-batch a forward
    and a backward (zero-bubble: its input and weight halves), and per stage boundary and micro-batch the four
    sends and receives (stage s lives on rank s mod pp, so with pp > 1 neighbouring stages are on different ranks)."""
    stages = pp * v
    if schedule == "dualpipev":
        # a forward and a backward (B or I) per stage and micro-batch, a W for each I: rank r splits 2pp-1-r
        # backwards (runtime/schedule.py `_dualpipev`: phases 3, 6 and 7), (3pp²-pp)/2 in all; sends and receives
        # at the 2pp-2 boundaries between ranks (stages pp-1 and pp, the V's bottom, are both on rank pp-1).
        # An overlapped pair counts as its two computations.
        return m * (2 * stages + 4 * (stages - 2)) + (3 * pp * pp - pp) // 2
    per = 3 if schedule == "zero-bubble" else 2
    return m * (stages * per + (4 * (stages - 1) if pp > 1 else 0))


def requires(spec: S.Spec, plan) -> list:
    """A pipeline that can be cut and scheduled: enough blocks, enough micro-batches, a valid interleaving and
    layout. Reads the settings from `plan` (a compiler.plan.Plan: the file's, or a generated candidate)."""
    out: list = []
    pp, v, m = plan.size(AXIS), plan.virtual_stages, plan.micro_batches
    if plan.schedule in V_SHAPED and v != 2:  # a file's plan is refused earlier, where it is read
        out.append(plan_error(plan, "virtual_stages", "E0616", f"dualpipev runs two stages per pp rank, not "
                              f"virtual_stages = {v}", help="virtual_stages = 2 (leave it out), or another schedule",
                              axis=AXIS, rule="pipeline_split.virtual_stages"))
    elif v > 1 and plan.schedule not in ("interleaved-1f1b",) + V_SHAPED:  # likewise
        out.append(plan_error(plan, "virtual_stages", "E0604", f"virtual_stages = {v} needs the interleaved-1f1b "
                              "schedule", help='set `schedule = "interleaved-1f1b"`, or `virtual_stages = 1`',
                              axis=AXIS, rule="pipeline_split.virtual_stages"))
    if pp == 1:
        return out
    if plan.recompute == "selective" and plan.schedule in SPLIT_BACKWARD:
        out.append(plan_error(plan, "recompute", "E0610", "selective recomputation cannot run under the "
                              f"{plan.schedule} schedule", label="its backward passes each block twice",
                              help='use `recompute = full` (it recomputes the block for each pass), or another '
                                   'schedule', axis=AXIS, rule="pipeline_split.zero_bubble_recompute"))
    if plan.compile and plan.schedule in SPLIT_BACKWARD and plan.span("compile") is not None:
        out.append(plan_error(plan, "compile", "E0611", f"a compiled program cannot run the {plan.schedule} schedule",
                              label="each block's backward would run twice",
                              help=f'use `compile = false` (the default under {plan.schedule}), or another schedule',
                              axis=AXIS, rule="pipeline_split.zero_bubble_compile"))
    at = "axis pp"
    repeats, between, blocks = _model_shape(spec)
    if not repeats:
        out.append(plan_error(plan, at, "E0605", "a pipeline cuts the blocks of `repeat`s into stages; this model "
                              "has none", help="write the model's transformer layers as a `repeat`",
                              axis=AXIS, rule="pipeline_split.repeats"))
        return out
    if between is not None:
        layer, before, after = between
        kind = getattr(layer, "kind", None) or type(layer).__name__.lower()  # layernorm, rmsnorm, residual, mlp
        out.append(plan_error(plan, at, "E0605", f"a layer ({kind}, line {layer.span.line}) stands between the "
                              f"`repeat`s of lines {before.span.line} and {after.span.line}: a pipeline cuts the "
                              f"blocks of consecutive `repeat`s into stages", label="refused while pp > 1",
                              help="move the layer into a `repeat` (or a `repeat 1` of its own), or before the first "
                                   "`repeat` or after the last", axis=AXIS, rule="pipeline_split.repeats"))
        return out
    stages = pp * v
    if stages > blocks:
        where = (f"the `repeat` at {repeats[0].span} has {blocks} blocks" if len(repeats) == 1 else
                 f"its {len(repeats)} `repeat`s have {blocks} blocks")
        out.append(plan_error(plan, at, "E0601", f"{stages} pipeline stages but only {blocks} blocks: a stage would "
                              "be empty", label=f"pp = {pp}" + (f" × virtual_stages = {v}" if v > 1 else ""),
                              help=f"use at most {blocks} stages ({where})", axis=AXIS, rule="pipeline_split.blocks"))
    elif plan.schedule == "interleaved-1f1b" and blocks % stages and plan.span("schedule") is None:
        # A written plan may interleave stages of unequal block counts (the cost-balanced cut, or its `layout`), as
        # Megatron-LM's --decoder-first/last-pipeline-num-layers and --pipeline-model-parallel-layout do; the search
        # proposes only equal ones (Megatron's default), so that its space and rankings stay those of equal stages.
        out.append(plan_error(plan, at, "E0605", f"interleaving needs the {blocks} blocks to divide into {stages} "
                              "equal stages", help=f"choose pp × virtual_stages dividing {blocks}",
                              axis=AXIS, rule="pipeline_split.interleaving"))
    if plan.schedule in V_SHAPED and m < 2 * pp:
        out.append(plan_error(plan, "micro_batches" if plan.span("micro_batches") else at, "E0616",
                              f"{m} micro-batch{'es' if m != 1 else ''} cannot fill a {pp}-rank dualpipev pipeline: "
                              f"its warm-up runs 2·pp = {2 * pp} before the first backward",
                              help=f"set `micro_batches` to at least {2 * pp}", axis=AXIS,
                              rule="pipeline_split.micro_batches"))
    elif plan.schedule != "gpipe" and m < pp:
        out.append(plan_error(plan, at, "E0602", f"{m} micro-batch{'es' if m != 1 else ''} cannot fill a "
                              f"{pp}-stage {plan.schedule} pipeline", help=f"set `micro_batches` to at least {pp} "
                              f"(more shrinks the bubble: (pp-1)/(micro_batches+pp-1))",
                              axis=AXIS, rule="pipeline_split.micro_batches"))
    n_actions = schedule_actions(plan.schedule, pp, v, m)
    if n_actions > MAX_SCHEDULE_ACTIONS:
        out.append(plan_error(plan, at, "E0615", f"the {plan.schedule} schedule of {stages} stages × {m} "
                              f"micro-batches has {n_actions:,} actions per step, more than scalec proves and a "
                              "program builds", label=f"pp = {pp}" + (f" × virtual_stages = {v}" if v > 1 else "")
                              + f" × micro_batches = {m}",
                              help=f"at most {MAX_SCHEDULE_ACTIONS:,} actions (each rank's list is built at start-up "
                                   "and every action is checked); use fewer micro-batches, each of more sequences",
                                   axis=AXIS, rule="pipeline_split.schedule_size"))
    if plan.layout:
        out += _layout_requires(plan, blocks, stages)
    if plan.schedule == "interleaved-1f1b" and m % pp:
        out.append(plan_error(plan, at, "E0603", f"interleaved-1f1b runs micro-batches in groups of pp = {pp}; {m} "
                              "is not a multiple", help=f"use a multiple of {pp} micro-batches",
                              axis=AXIS, rule="pipeline_split.interleaved_groups"))
    return out


_SHAPES: dict = {}
"""id of a spec -> (the spec, `_model_shape`'s value): the search checks tens of thousands of candidates of one."""


def _model_shape(spec: S.Spec) -> tuple:
    """(the model's `repeat`s, `_between`'s layer or None, their blocks in all), read once per spec."""
    got = _SHAPES.get(id(spec))
    if got is None or got[0] is not spec:
        if len(_SHAPES) > 64:  # a process checking many files (the tests): keep the recent ones
            _SHAPES.clear()
        repeats = list(spec.model.blocks)
        got = _SHAPES[id(spec)] = (spec, (repeats, _between(spec) if repeats else None,
                                          sum(int(spec.value(r.count)) for r in repeats)))
    return got[1]


def _between(spec: S.Spec):
    """(layer, repeat before it, repeat after it) for the first layer of the body standing between two `repeat`s,
    or None: a pipeline cuts the concatenated blocks of consecutive repeats, and a stage holds only blocks."""
    body = spec.model.body
    idx = [i for i, x in enumerate(body) if isinstance(x, S.Repeat)]
    for a, b in zip(idx, idx[1:]):
        if b > a + 1:
            return body[a + 1], body[a], body[b]
    return None


def _layout_requires(plan, blocks: int, stages: int) -> list:
    """A manual layout names every block exactly once, in order, and leaves no stage empty."""
    layout = plan.layout
    first, last = "layout 0", f"layout {len(layout) - 1}"
    if len(layout) != stages:
        return [plan_error(plan, first, "E0607", f"the layout has {len(layout)} stages but the mesh and plan make "
                           f"{stages}", help="give one (first, end) pair per pipeline stage",
                           axis=AXIS, rule="pipeline_split.layout")]
    out: list = []
    covered: dict[int, int] = {}
    for k, (a, b) in enumerate(layout):
        here = f"layout {k}"
        if b <= a:
            out.append(plan_error(plan, here, "E0607", f"stage ({a}, {b}) holds no block", label="empty stage",
                                  help="every stage needs at least one block: end > first",
                                  axis=AXIS, rule="pipeline_split.layout"))
        for i in range(a, b):
            if i >= blocks:
                out.append(plan_error(plan, here, "E0607", f"block {i} does not exist: the model has {blocks} "
                                      f"blocks (0..{blocks - 1})", axis=AXIS, rule="pipeline_split.layout"))
                break
            if i in covered:
                where = plan.span(f"layout {covered[i]}")
                out.append(plan_error(plan, here, "E0607", f"block {i} is placed twice",
                                      label=f"also at {where}" if where else f"also in stage {covered[i]}",
                                      help="stages hold disjoint ranges of blocks",
                                      axis=AXIS, rule="pipeline_split.layout"))
                break
            covered[i] = k
    missing = [i for i in range(blocks) if i not in covered]
    if missing and not out:
        out.append(plan_error(plan, last, "E0607", f"block{'s' if len(missing) > 1 else ''} "
                              f"{', '.join(map(str, missing[:5]))} {'are' if len(missing) > 1 else 'is'} in no stage",
                              help=f"the stages must cover blocks 0..{blocks - 1}",
                              axis=AXIS, rule="pipeline_split.layout"))
    if [a for a, _ in layout] != sorted(a for a, _ in layout):
        out.append(plan_error(plan, first, "E0607", "stages must hold the blocks in order",
                              help="a pipeline runs stage 0's blocks first: list the ranges in increasing order",
                              axis=AXIS, rule="pipeline_split.layout"))
    return out
