"""Pipeline parallelism over the `pp` axis: which blocks each stage holds (the policy; the graph surgery follows).

`balance_stages` cuts the sequence of blocks into contiguous stages so that the most expensive stage is as cheap
as possible. The first stage also runs the embedding and the last the LM head and loss, so their costs are added
to the first and last block: stages come out uneven on purpose (fewer blocks where the head is heavy). The answer
is exact: a binary search over the bottleneck with a greedy feasibility test, on integer costs.
"""
from __future__ import annotations


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
