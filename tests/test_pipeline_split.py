"""The stage-split policy on its own: exact, complete, uneven where the head is heavy."""
from __future__ import annotations

import itertools
import random

import pytest

from compiler.passes.pipeline_split import balance_stages, stage_costs


def _best(costs, p, first, last) -> int:
    n = len(costs)
    best = None
    for cuts in itertools.combinations(range(1, n), p - 1):
        edges = (0,) + cuts + (n,)
        layout = tuple(zip(edges, edges[1:]))
        worst = max(stage_costs(layout, costs, first, last))
        best = worst if best is None else min(best, worst)
    return best


def test_uniform_blocks_split_evenly():
    assert balance_stages([5] * 8, 4) == ((0, 2), (2, 4), (4, 6), (6, 8))


def test_a_heavy_head_leaves_the_last_stage_fewer_blocks():
    layout = balance_stages([10] * 12, 4, first_extra=2, last_extra=25)
    sizes = [b - a for a, b in layout]
    assert sizes[-1] < sizes[0]
    assert max(stage_costs(layout, [10] * 12, 2, 25)) == _best([10] * 12, 4, 2, 25)


@pytest.mark.parametrize("seed", range(30))
def test_optimal_and_complete_against_exhaustive_search(seed):
    rng = random.Random(seed)
    n = rng.randint(2, 9)
    p = rng.randint(1, n)
    costs = [rng.randint(1, 20) for _ in range(n)]
    first, last = rng.randint(0, 30), rng.randint(0, 30)
    layout = balance_stages(costs, p, first, last)
    assert len(layout) == p and all(b > a for a, b in layout)
    assert [i for a, b in layout for i in range(a, b)] == list(range(n))  # every block exactly once, in order
    assert max(stage_costs(layout, costs, first, last)) == _best(costs, p, first, last)


def test_more_stages_than_blocks_is_refused():
    with pytest.raises(ValueError, match="cannot cut 3 blocks into 4"):
        balance_stages([1, 1, 1], 4)
