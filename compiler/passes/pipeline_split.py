"""Pipeline parallelism over the `pp` axis: which blocks each stage holds (the policy; the graph surgery follows).

`balance_stages` cuts the sequence of blocks into contiguous stages so that the most expensive stage is as cheap
as possible. The first stage also runs the embedding and the last the LM head and loss, so their costs are added
to the first and last block: stages come out uneven on purpose (fewer blocks where the head is heavy). The answer
is exact: a binary search over the bottleneck with a greedy feasibility test, on integer costs.
"""
from __future__ import annotations

import sympy
from torch import fx

from compiler import spec as S
from compiler import trace as T
from compiler.symbols import MICRO_BATCH


def _stages_needed(costs: list[int], bound: int) -> int | None:
    """Fewest contiguous groups with every group's sum ≤ bound (None if one item alone exceeds it)."""
    groups, load = 1, 0
    for c in costs:
        if c > bound:
            return None
        if load + c > bound:
            groups, load = groups + 1, c
        else:
            load += c
    return groups


def balance_stages(block_costs: list[int], stages: int, first_extra: int = 0,
                   last_extra: int = 0) -> tuple[tuple[int, int], ...]:
    """[(first block, end block), ...] per stage: every block in exactly one stage, each stage at least one block,
    minimising the largest stage cost. Costs are integers (FLOPs)."""
    n = len(block_costs)
    if stages < 1 or stages > n:
        raise ValueError(f"cannot cut {n} blocks into {stages} non-empty stages")
    costs = list(block_costs)
    costs[0] += first_extra
    costs[-1] += last_extra
    lo, hi = max(costs), sum(costs)
    while lo < hi:  # the smallest bound that `stages` groups can meet
        mid = (lo + hi) // 2
        need = _stages_needed(costs, mid)
        if need is not None and need <= stages:
            hi = mid
        else:
            lo = mid + 1
    # Greedy groups under the bound, then split the largest groups until there are exactly `stages` of them
    # (splitting never raises the bottleneck).
    bounds, start, load = [], 0, 0
    for i, c in enumerate(costs):
        if load + c > lo:
            bounds.append((start, i))
            start, load = i, 0
        load += c
    bounds.append((start, n))
    while len(bounds) < stages:
        j = max(range(len(bounds)), key=lambda j: (bounds[j][1] - bounds[j][0] > 1,
                                                    sum(costs[bounds[j][0]:bounds[j][1]])))
        a, b = bounds[j]
        bounds[j:j + 1] = [(a, b - 1), (b - 1, b)]
    layout = tuple(bounds)
    assert [i for a, b in layout for i in range(a, b)] == list(range(n)), "a block is missing or repeated"
    return layout


def stage_costs(layout, block_costs: list[int], first_extra: int = 0, last_extra: int = 0) -> list[int]:
    out = [sum(block_costs[a:b]) for a, b in layout]
    out[0] += first_extra
    out[-1] += last_extra
    return out


# -- mechanism ----------------------------------------------------------------------------------------------------

# GraphModule.meta keys of the top level once cut: the three pieces and the stage layout.
PROLOGUE, EPILOGUE, LOSS, STAGES = "pp_prologue", "pp_epilogue", "pp_loss", "pp_stages"


def _subgraph(gm: fx.GraphModule, name: str, inputs: dict, output: fx.Node) -> fx.GraphModule:
    """The nodes of `gm` that `output` depends on, with `inputs` (node -> placeholder name) cut off as inputs."""
    g = fx.Graph()
    env: dict = {}
    for node, pname in inputs.items():
        env[node] = g.placeholder(pname)
    needed, stack = set(), [output]
    while stack:
        n = stack.pop()
        if n in env or n in needed:
            continue
        needed.add(n)
        stack.extend(n.all_input_nodes)
    for n in gm.graph.nodes:
        if n in needed:
            env[n] = g.placeholder(n.name) if n.op == "placeholder" else g.node_copy(n, lambda x: env[x])
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
    return balance_stages([per_block] * blocks, plan.pipeline_stages, first, last)


def pipeline_split_pass(traced: T.Traced, plan) -> T.Traced:
    """Cut the top level at its blocks into prologue (tokens → residual stream), epilogue (→ logits) and loss;
    record the stage layout the plan decided."""
    if plan.size("pp") == 1:
        return traced
    top = traced.top
    blocks_node, loss_node = _pieces(traced)
    logits = loss_node.args[0]
    tokens = next(n for n in top.graph.nodes if n.op == "placeholder" and n.name == "tokens")
    targets = next(n for n in top.graph.nodes if n.op == "placeholder" and n.name == "targets")
    top.meta[PROLOGUE] = _subgraph(top, "prologue", {tokens: "tokens"}, blocks_node.args[0])
    top.meta[EPILOGUE] = _subgraph(top, "epilogue", {blocks_node: "x"}, logits)
    top.meta[LOSS] = _subgraph(top, "loss_fn", {logits: "logits", targets: "targets"}, loss_node)
    top.meta[STAGES] = plan.stages
    return traced
