"""Pipeline parallelism over the `pp` axis: which blocks each stage holds (the policy; the graph surgery follows).

`balance_stages` cuts the sequence of blocks into contiguous stages so that the busiest pp rank (the sum of its
stages: v of them when interleaved) is as cheap as possible. The first stage also runs the embedding and the last
the LM head and loss, so their costs are added to the ranks that hold them: stages come out uneven on purpose (fewer
blocks where the head is heavy). The answer is exact: a binary search over the bottleneck on integer costs.
`stage_policy` is the one policy, called through compiler/lower.py (`stages_of`) by compile and by the search's
candidates alike; the layout it returns is carried by the Plan, where the cost model and codegen read it.
"""
from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

import sympy

from compiler import spec as S
from compiler.symbols import MICRO_BATCH

if TYPE_CHECKING:  # torch and the tracer load where a graph is cut, so `requires` (scalec check) needs neither
    from torch import fx

    from compiler import trace as T


def balance_stages(blocks: int, per_block: int, p: int, v: int = 1, first_extra: int = 0,
                   last_extra: int = 0) -> tuple[tuple[int, int], ...]:
    """[(first block, end block), ...] for p × v contiguous stages of `blocks` equal blocks (the model's one `repeat`),
    stage k on pp rank k mod p, each stage at least one block; minimising the slowest rank's compute: the sum over
    its v stages, the first stage (rank 0) also paying `first_extra` (the embedding) and the last (rank p - 1) also
    `last_extra` (the head and loss). Costs are integers (FLOPs of one sequence).

    A rank's compute depends only on how many blocks it holds (B_r ≥ v), so the optimum is exact: the smallest bound
    T with B_r ≤ (T - extra_r) / per_block holding the n blocks (a binary search), then, among layouts meeting it,
    the rank loads levelled (a block at a time off the heaviest rank) and each rank's blocks split over its v stages
    as evenly as their own extras allow (the schedule flows stage by stage). Cutting stages by their own cost instead
    (as before) left interleaved ranks seconds apart (Llama-3-70B, p 4 × v 5: stages of 4, 1, 4, 1, 4, 1, 5, 5 ...)."""
    stages = p * v
    if p < 1 or v < 1 or stages > blocks:
        raise ValueError(f"cannot cut {blocks} blocks into {stages} non-empty stages")
    extra = [0] * p
    extra[0] += first_extra
    extra[(stages - 1) % p] += last_extra
    c = max(per_block, 0)
    if c == 0:  # blocks cost nothing: only the counts matter, spread them evenly
        held = [blocks // p + (r < blocks % p) for r in range(p)]
    else:
        def caps(bound: int) -> list[int]:
            return [(bound - e) // c for e in extra]
        lo = max(c * v + e for e in extra)
        hi = c * blocks + max(extra)
        while lo < hi:  # the smallest bound the ranks can meet holding every block
            mid = (lo + hi) // 2
            if sum(caps(mid)) >= blocks:
                hi = mid
            else:
                lo = mid + 1
        held = [min(x, blocks - v * (p - 1)) for x in caps(lo)]
        heavy = [(-(c * held[r] + extra[r]), -r) for r in range(p) if held[r] > v]
        heapq.heapify(heavy)
        for _ in range(sum(held) - blocks):  # level: take a block off the heaviest rank that can spare one
            _, r = heapq.heappop(heavy)
            held[-r] -= 1
            if held[-r] > v:
                heapq.heappush(heavy, (-(c * held[-r] + extra[-r]), r))
    sizes = [0] * stages
    for r in range(p):
        mine = list(range(r, stages, p))
        own = {k: (first_extra if k == 0 else 0) + (last_extra if k == stages - 1 else 0) for k in mine}
        for k in mine:
            sizes[k] = 1
        for _ in range(held[r] - v):  # a block at a time to the rank's cheapest stage (the later on a tie)
            k = min(mine, key=lambda k: (c * sizes[k] + own[k], -k))
            sizes[k] += 1
    edges = [0]
    for size in sizes:
        edges.append(edges[-1] + size)
    layout = tuple(zip(edges, edges[1:]))
    assert edges[-1] == blocks and all(b > a for a, b in layout), "a block is missing or a stage empty"
    return layout


def rank_costs(layout, per_block: int, p: int, first_extra: int = 0, last_extra: int = 0) -> list[int]:
    """Each pp rank's compute under `layout`: the sum over its stages (stage k on rank k mod p)."""
    out = [0] * p
    for k, cost in enumerate(stage_costs(layout, [per_block] * layout[-1][1], first_extra, last_extra)):
        out[k % p] += cost
    return out


def stage_costs(layout, block_costs: list[int], first_extra: int = 0, last_extra: int = 0) -> list[int]:
    out = [sum(block_costs[a:b]) for a, b in layout]
    out[0] += first_extra
    out[-1] += last_extra
    return out


# -- mechanism ----------------------------------------------------------------------------------------------------

def _subgraph(gm: fx.GraphModule, name: str, inputs: dict, output: fx.Node) -> fx.GraphModule:
    """The nodes of `gm` that `output` depends on, with `inputs` (node -> placeholder name) cut off as inputs."""
    from torch import fx

    from compiler import trace as T
    g = fx.Graph()
    env: dict = {}
    def value_of(src, dst):  # a cut-off input keeps its shape and dtype (the memory model reads them)
        dst.meta.update({k: src.meta[k] for k in (T.SHAPE, T.DTYPE) if k in src.meta})
        return dst

    for node, pname in inputs.items():
        env[node] = value_of(node, g.placeholder(pname))
    needed = _upstream(output, set(inputs))
    for n in gm.graph.nodes:
        if n in needed:
            env[n] = value_of(n, g.placeholder(n.name)) if n.op == "placeholder" else g.node_copy(n, lambda x: env[x])
            if n.op != "placeholder":
                env[n].meta = dict(n.meta)
    g.output(env[output])
    sub = fx.GraphModule(gm, g, name)
    for child, _ in list(sub.named_children()):  # get_attr leaves a bare holder: keep the real leaf module
        setattr(sub, child, gm.get_submodule(child))
    sub.meta[T.SPANS] = {k: v for k, v in gm.meta[T.SPANS].items() if hasattr(sub, k)}
    sub.meta[T.PARAM_SHAPES] = {k: v for k, v in gm.meta[T.PARAM_SHAPES].items() if hasattr(sub, k.split(".")[0])}
    return sub


def _pieces(traced: T.Traced):
    """The top level's call of the blocks, and its loss node."""
    from compiler import trace as T
    top = traced.top
    (name,) = traced.blocks
    blocks_node = next(n for n in top.graph.nodes if n.op == "call_module" and n.target == name)
    loss_node = next(n for n in top.graph.nodes if n.meta.get(T.LAYER) is not None
                     and isinstance(n.meta[T.LAYER], S.CrossEntropy) and n.op == "call_function"
                     and n.target not in ("flatten", "float"))
    return blocks_node, loss_node


def _upstream(output: fx.Node, stop: set) -> set:
    """The nodes `output` depends on (itself included), not looking past `stop`: what `_subgraph` would copy."""
    seen, stack = set(), [output]
    while stack:
        n = stack.pop()
        if n in stop or n in seen:
            continue
        seen.add(n)
        stack.extend(n.all_input_nodes)
    return seen


def split_costs(traced: T.Traced) -> tuple:
    """Forward FLOPs of one sequence (b = 1) through one block, through the prologue (tokens to the residual
    stream) and through the epilogue and loss, as sympy expressions of the sizes (tp and ep included once their
    passes have run): what `stage_policy` balances."""
    from compiler import trace as T
    top = traced.top
    (block_gm,) = traced.blocks.values()
    blocks_node, loss_node = _pieces(traced)
    logits = loss_node.args[0]
    targets = next(n for n in top.graph.nodes if n.op == "placeholder" and n.name == "targets")
    ones = {MICRO_BATCH: sympy.Integer(1)}

    def flops(nodes):
        return sympy.expand(sympy.sympify(sum((n.meta.get(T.FLOPS, 0) for n in nodes), sympy.Integer(0)))
                            .xreplace(ones))
    first = flops(_upstream(blocks_node.args[0], set()))
    last = flops(_upstream(logits, {blocks_node})) + flops(_upstream(loss_node, {logits, targets}))
    return flops(block_gm.graph.nodes), first, last


def stage_policy(plan, blocks: int, per_block: int, first: int, last: int) -> tuple:
    """The stage layout: the user's, or the cost-balanced cut of `blocks` equal blocks into pp × virtual_stages
    stages, the first also paying `first` and the last `last` (FLOPs of one sequence)."""
    if plan.size("pp") == 1:
        return ()
    if plan.layout:  # the user's, checked complete and disjoint by the rules
        return tuple(plan.layout)
    return balance_stages(blocks, per_block, plan.size("pp"), plan.virtual_stages, first, last)


def pipeline_split_pass(traced: T.Traced, plan) -> T.Traced:
    """Cut the top level at its blocks into prologue (tokens → residual stream), epilogue (→ logits) and loss
    (trace.PROLOGUE, EPILOGUE, LOSS of the top's meta). The cut is the same for every stage layout: which blocks
    each stage holds is the Plan's (`plan.stages`), read from there by the cost model and codegen."""
    from compiler import trace as T
    if plan.size("pp") == 1:
        return traced
    top = traced.top
    blocks_node, loss_node = _pieces(traced)
    logits = loss_node.args[0]
    tokens = next(n for n in top.graph.nodes if n.op == "placeholder" and n.name == "tokens")
    targets = next(n for n in top.graph.nodes if n.op == "placeholder" and n.name == "targets")
    top.meta[T.PROLOGUE] = _subgraph(top, "prologue", {tokens: "tokens"}, blocks_node.args[0])
    top.meta[T.EPILOGUE] = _subgraph(top, "epilogue", {blocks_node: "x"}, logits)
    top.meta[T.LOSS] = _subgraph(top, "loss_fn", {logits: "logits", targets: "targets"}, loss_node)
    return traced


# -- what a pipeline requires ---------------------------------------------------------------------------------------

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
    per = 3 if schedule == "zero-bubble" else 2
    return m * (stages * per + (4 * (stages - 1) if pp > 1 else 0))


def requires(spec: S.Spec, plan) -> list:
    """A pipeline that can be cut and scheduled: enough blocks, enough micro-batches, a valid interleaving and
    layout. Reads the settings from `plan` (a compiler.plan.Plan: the file's, or a generated candidate)."""
    from compiler.diagnostics import plan_error
    out: list = []
    pp, v, m = plan.size("pp"), plan.virtual_stages, plan.micro_batches
    if v > 1 and plan.schedule != "interleaved-1f1b":  # a file's plan is refused earlier, where it is read
        out.append(plan_error(plan, "virtual_stages", "E0604", f"virtual_stages = {v} needs the interleaved-1f1b "
                              "schedule", help='set `schedule = "interleaved-1f1b"`, or `virtual_stages = 1`'))
    if pp == 1:
        return out
    if plan.recompute == "selective" and plan.schedule == "zero-bubble":
        out.append(plan_error(plan, "recompute", "E0610", "selective recomputation cannot run under the zero-bubble "
                              "schedule", label="its backward passes each block twice",
                              help='use `recompute = full` (it recomputes the block for each pass), or another '
                                   'schedule'))
    if plan.compile and plan.schedule == "zero-bubble" and plan.span("compile") is not None:
        out.append(plan_error(plan, "compile", "E0611", "a compiled program cannot run the zero-bubble schedule",
                              label="each block's backward would run twice",
                              help='use `compile = false` (the default under zero-bubble), or another schedule'))
    at = "axis pp"
    repeats = [x for x in spec.model.layers if isinstance(x, S.Repeat)]
    if len(repeats) != 1:
        out.append(plan_error(plan, at, "E0605", f"a pipeline cuts one `repeat` into stages; this model has "
                              f"{len(repeats)}", help="write the model's blocks as a single `repeat`"))
        return out
    blocks = int(spec.value(repeats[0].count))
    stages = pp * v
    if stages > blocks:
        out.append(plan_error(plan, at, "E0601", f"{stages} pipeline stages but only {blocks} blocks: a stage would "
                              "be empty", label=f"pp = {pp}" + (f" × virtual_stages = {v}" if v > 1 else ""),
                              help=f"use at most {blocks} stages (the `repeat` at {repeats[0].span} has {blocks} "
                                   "blocks)"))
    elif plan.schedule == "interleaved-1f1b" and blocks % stages:
        out.append(plan_error(plan, at, "E0605", f"interleaving needs the {blocks} blocks to divide into {stages} "
                              "equal stages", help=f"choose pp × virtual_stages dividing {blocks}"))
    if plan.schedule != "gpipe" and m < pp:
        out.append(plan_error(plan, at, "E0602", f"{m} micro-batch{'es' if m != 1 else ''} cannot fill a "
                              f"{pp}-stage {plan.schedule} pipeline", help=f"set `micro_batches` to at least {pp} "
                              f"(more shrinks the bubble: (pp-1)/(micro_batches+pp-1))"))
    n_actions = schedule_actions(plan.schedule, pp, v, m)
    if n_actions > MAX_SCHEDULE_ACTIONS:
        out.append(plan_error(plan, at, "E0615", f"the {plan.schedule} schedule of {stages} stages × {m} "
                              f"micro-batches has {n_actions:,} actions per step, more than scalec proves and a "
                              "program builds", label=f"pp = {pp}" + (f" × virtual_stages = {v}" if v > 1 else "")
                              + f" × micro_batches = {m}",
                              help=f"at most {MAX_SCHEDULE_ACTIONS:,} actions (each rank's list is built at start-up "
                                   "and every action is checked); use fewer micro-batches, each of more sequences"))
    if plan.layout:
        out += _layout_requires(plan, blocks, stages)
    if plan.schedule == "interleaved-1f1b" and m % pp:
        out.append(plan_error(plan, at, "E0603", f"interleaved-1f1b runs micro-batches in groups of pp = {pp}; {m} "
                              "is not a multiple", help=f"use a multiple of {pp} micro-batches"))
    return out


def _layout_requires(plan, blocks: int, stages: int) -> list:
    """A manual layout names every block exactly once, in order, and leaves no stage empty."""
    from compiler.diagnostics import plan_error
    layout = plan.layout
    first, last = "layout 0", f"layout {len(layout) - 1}"
    if len(layout) != stages:
        return [plan_error(plan, first, "E0607", f"the layout has {len(layout)} stages but the mesh and plan make "
                           f"{stages}", help="give one (first, end) pair per pipeline stage")]
    out: list = []
    covered: dict[int, int] = {}
    for k, (a, b) in enumerate(layout):
        here = f"layout {k}"
        if b <= a:
            out.append(plan_error(plan, here, "E0607", f"stage ({a}, {b}) holds no block", label="empty stage",
                                  help="every stage needs at least one block: end > first"))
        for i in range(a, b):
            if i >= blocks:
                out.append(plan_error(plan, here, "E0607", f"block {i} does not exist: the model has {blocks} "
                                      f"blocks (0..{blocks - 1})"))
                break
            if i in covered:
                where = plan.span(f"layout {covered[i]}")
                out.append(plan_error(plan, here, "E0607", f"block {i} is placed twice",
                                      label=f"also at {where}" if where else f"also in stage {covered[i]}",
                                      help="stages hold disjoint ranges of blocks"))
                break
            covered[i] = k
    missing = [i for i in range(blocks) if i not in covered]
    if missing and not out:
        out.append(plan_error(plan, last, "E0607", f"block{'s' if len(missing) > 1 else ''} "
                              f"{', '.join(map(str, missing[:5]))} {'are' if len(missing) > 1 else 'is'} in no stage",
                              help=f"the stages must cover blocks 0..{blocks - 1}"))
    if [a for a, _ in layout] != sorted(a for a, _ in layout):
        out.append(plan_error(plan, first, "E0607", "stages must hold the blocks in order",
                              help="a pipeline runs stage 0's blocks first: list the ranges in increasing order"))
    return out
