"""The stage-split policy on its own: exact against exhaustive search (the slowest rank, interleaved or not),
complete, uneven where the head is heavy."""
from __future__ import annotations

import itertools
import random

import pytest

from compiler.passes.pipeline_split import balance_stages, rank_costs, stage_costs


def _compositions(n: int, k: int):
    """Every way to cut n blocks into k non-empty contiguous stages, as layouts."""
    for cuts in itertools.combinations(range(1, n), k - 1):
        edges = (0,) + cuts + (n,)
        yield tuple(zip(edges, edges[1:]))


def _best(n, c, p, v, first, last) -> int:
    """The exhaustive optimum: the least slowest-rank compute over every layout of p × v stages."""
    return min(max(rank_costs(layout, c, p, first, last)) for layout in _compositions(n, p * v))


def test_uniform_blocks_split_evenly():
    assert balance_stages(8, 5, 4) == ((0, 2), (2, 4), (4, 6), (6, 8))
    assert balance_stages(16, 5, 4, 2) == tuple((2 * k, 2 * k + 2) for k in range(8))


def test_a_heavy_head_leaves_the_last_stage_fewer_blocks():
    layout = balance_stages(12, 10, 4, first_extra=2, last_extra=25)
    sizes = [b - a for a, b in layout]
    assert sizes[-1] < sizes[0]
    assert max(rank_costs(layout, 10, 4, 2, 25)) == _best(12, 10, 4, 1, 2, 25)


def test_interleaved_llama3_70b_ranks_are_balanced():
    """Llama-3-70B on pp 4 × v 5 (80 blocks; a block ~1/80 of the model, the head ~1.3 blocks, the embedding
    nothing): the old cut by stage cost gave stages of 4, 1, 4, 1, 4, 1, 5, 5, ... blocks, whole stages apart per
    rank; by rank, the head's rank holds one block fewer, no rank is a block's cost from another, stages within a
    block's cost of each other."""
    per_block, first, last = 1_000, 0, 1_300
    layout = balance_stages(80, per_block, 4, 5, first, last)
    loads = rank_costs(layout, per_block, 4, first, last)
    held = [sum(b - a for a, b in layout[r::4]) for r in range(4)]
    assert sorted(held) == [19, 20, 20, 21] and held[3] == 19
    assert max(loads) - min(loads) <= per_block
    assert max(loads) == 21 * per_block
    stage = stage_costs(layout, [per_block] * 80, first, last)
    assert max(stage) - min(stage) <= per_block


@pytest.mark.parametrize("seed", range(40))
def test_optimal_and_complete_against_exhaustive_search(seed):
    rng = random.Random(seed)
    p = rng.randint(1, 3)
    v = rng.randint(1, 3)
    n = rng.randint(p * v, min(p * v + 5, 10))
    c = rng.randint(1, 20)
    first, last = rng.randint(0, 60), rng.randint(0, 60)
    layout = balance_stages(n, c, p, v, first, last)
    assert len(layout) == p * v and all(b > a for a, b in layout)
    assert [i for a, b in layout for i in range(a, b)] == list(range(n))  # every block exactly once, in order
    assert max(rank_costs(layout, c, p, first, last)) == _best(n, c, p, v, first, last)


def test_more_stages_than_blocks_is_refused():
    with pytest.raises(ValueError, match="cannot cut 3 blocks into 4"):
        balance_stages(3, 1, 4)
