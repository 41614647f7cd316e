"""Pipeline parallelism over the `pp` axis: which blocks each stage holds (the policy; the graph surgery follows).

`balance_stages` cuts the sequence of blocks into contiguous stages so that the busiest pp rank (the sum of its
stages: v of them when interleaved) is as cheap as possible. The first stage also runs the embedding and the last
the LM head and loss, so their costs are added to the ranks that hold them: stages come out uneven on purpose (fewer
blocks where the head is heavy). The answer is exact: a binary search over the bottleneck on integer costs.
`stage_policy` is the one policy, called through compiler/lower.py (`stages_of`) by compile and by the search's
candidates alike; the layout it returns is carried by the Plan, where the cost model and codegen read it.
"""
from __future__ import annotations

import functools
import heapq

import sympy
from torch import fx

from compiler import spec as S
from compiler import trace as T
from compiler.symbols import MICRO_BATCH
from runtime.schedule import Layout


@functools.lru_cache(maxsize=4096)  # a pure function of integers: a search asks for a few hundred, each ~4 times
def balance_stages(blocks: int, per_block: int, p: int, v: int = 1, first_extra: int = 0,
                   last_extra: int = 0, style: str = "loop") -> tuple[tuple[int, int], ...]:
    """[(first block, end block), ...] for p × v contiguous stages of `blocks` equal blocks (the blocks of the model's
    `repeat`s, concatenated: global indices),
    each stage on the pp rank the stage layout of `style` gives (runtime.schedule.Layout: "loop", stage k on rank
    k mod p; "v", dualpipev's), each stage at least one block; minimising the slowest rank's compute: the sum over
    its v stages, the first stage (rank 0) also paying `first_extra` (the embedding) and the last (rank p - 1
    looped, rank 0 in a V) also `last_extra` (the head and loss). Costs are integers (FLOPs of one sequence).

    A rank's compute depends only on how many blocks it holds (B_r ≥ v), so the optimum is exact: the smallest bound
    T with B_r ≤ (T - extra_r) / per_block holding the n blocks (a binary search), then, among layouts meeting it,
    the rank loads levelled (a block at a time off the heaviest rank) and each rank's blocks split over its v stages
    as evenly as their own extras allow (the schedule flows stage by stage). Cutting stages by their own cost instead
    (as before) left interleaved ranks seconds apart (Llama-3-70B, p 4 × v 5: stages of 4, 1, 4, 1, 4, 1, 5, 5 ...)."""
    stages = p * v
    if p < 1 or v < 1 or stages > blocks:
        raise ValueError(f"cannot cut {blocks} blocks into {stages} non-empty stages")
    lay = Layout(p, v, 1, style)
    extra = [0] * p
    extra[0] += first_extra
    extra[lay.rank_of(stages - 1)] += last_extra
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
        mine = lay.stages_of(r)
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


def rank_costs(layout, per_block: int, p: int, first_extra: int = 0, last_extra: int = 0,
               style: str = "loop") -> list[int]:
    """Each pp rank's compute under `layout`: the sum over its stages (placed by the stage layout of `style`)."""
    lay = Layout(p, len(layout) // p, 1, style)
    out = [0] * p
    for k, cost in enumerate(stage_costs(layout, [per_block] * layout[-1][1], first_extra, last_extra)):
        out[lay.rank_of(k)] += cost
    return out


def stage_costs(layout, block_costs: list[int], first_extra: int = 0, last_extra: int = 0) -> list[int]:
    out = [sum(block_costs[a:b]) for a, b in layout]
    out[0] += first_extra
    out[-1] += last_extra
    return out


# -- mechanism ----------------------------------------------------------------------------------------------------

def _subgraph(gm: fx.GraphModule, name: str, inputs: dict, output: fx.Node) -> fx.GraphModule:
    """The nodes of `gm` that `output` depends on, with `inputs` (node -> placeholder name) cut off as inputs."""

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
    """The top level's calls of the blocks, one per `repeat` in order (consecutive: each feeds the next, as the rules
    require), and its loss node."""
    top = traced.top
    names = set(traced.blocks)
    calls = [n for n in top.graph.nodes if n.op == "call_module" and n.target in names]
    for before, after in zip(calls, calls[1:]):
        assert after.args[0] is before, f"a layer stands between `{before.target}` and `{after.target}`"
    loss_node = next(n for n in top.graph.nodes if n.meta.get(T.LAYER) is not None
                     and isinstance(n.meta[T.LAYER], S.CrossEntropy) and n.op == "call_function"
                     and n.target not in ("flatten", "float"))
    return calls, loss_node


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
    """Forward FLOPs of one sequence (b = 1) through each repeat's block (a tuple, in the repeats' order), through
    the prologue (tokens to the residual stream) and through the epilogue and loss, as sympy expressions of the
    sizes (tp and ep included once their passes have run): what `stage_policy` balances."""
    top = traced.top
    calls, loss_node = _pieces(traced)
    logits = loss_node.args[0]
    targets = next(n for n in top.graph.nodes if n.op == "placeholder" and n.name == "targets")
    ones = {MICRO_BATCH: sympy.Integer(1)}

    def flops(nodes):
        return sympy.expand(sympy.sympify(sum((n.meta.get(T.FLOPS, 0) for n in nodes), sympy.Integer(0)))
                            .xreplace(ones))
    first = flops(_upstream(calls[0].args[0], set()))
    last = flops(_upstream(logits, {calls[-1]})) + flops(_upstream(loss_node, {logits, targets}))
    return tuple(flops(gm.graph.nodes) for gm in traced.blocks.values()), first, last


def stage_policy(plan, blocks: int, per_block: int, first: int, last: int) -> tuple:
    """The stage layout: the user's, or the cost-balanced cut of `blocks` blocks into pp × virtual_stages stages,
    each block counted at `per_block` (with several `repeat`s, their mean: the blocks are counted equally), the
    first also paying `first` and the last `last` (FLOPs of one sequence)."""
    if plan.size("pp") == 1:
        return ()
    if plan.layout:  # the user's, checked complete and disjoint by the rules
        return tuple(plan.layout)
    return balance_stages(blocks, per_block, plan.size("pp"), plan.virtual_stages, first, last,
                          plan.stage_layout.style)


def pipeline_split_pass(traced: T.Traced, plan) -> T.Traced:
    """Cut the top level at its blocks (those of every `repeat`, consecutive) into prologue (tokens → residual
    stream), epilogue (→ logits) and loss
    (trace.PROLOGUE, EPILOGUE, LOSS of the top's meta). The cut is the same for every stage layout: which blocks
    each stage holds is the Plan's (`plan.stages`), read from there by the cost model and codegen."""
    if plan.size("pp") == 1:
        return traced
    top = traced.top
    calls, loss_node = _pieces(traced)
    logits = loss_node.args[0]
    tokens = next(n for n in top.graph.nodes if n.op == "placeholder" and n.name == "tokens")
    targets = next(n for n in top.graph.nodes if n.op == "placeholder" and n.name == "targets")
    top.meta[T.PROLOGUE] = _subgraph(top, "prologue", {tokens: "tokens"}, calls[0].args[0])
    top.meta[T.EPILOGUE] = _subgraph(top, "epilogue", {calls[-1]: "x"}, logits)
    top.meta[T.LOSS] = _subgraph(top, "loss_fn", {logits: "logits", targets: "targets"}, loss_node)
    return traced
