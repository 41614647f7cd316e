"""The placement in the contract: codegen writes its generator (runtime.config.Parallel.placement: per axis, factors
of the coordinate and their strides; compiler/layout/rank_order.py `generator`), never every rank, and the runtime's
pure `placed_ranks` expands it to the compiler's rank list, coordinate by coordinate."""
from __future__ import annotations

import itertools

import pytest

from compiler.layout import placement as P
from compiler.layout import rank_order as RO
from compiler.layout.topology import FatTree
from runtime.config import Parallel, placed_ranks

MESHES = [(("dp", 4), ("pp", 2), ("tp", 4)), (("dp", 2), ("pp", 2), ("cp", 2), ("ep", 3), ("tp", 2)),
          (("dp", 6), ("tp", 1), ("pp", 4))]


@pytest.mark.parametrize("axes", MESHES)
def test_every_axis_order_expands_to_its_ranks(axes):
    for names in itertools.permutations([a for a, _ in axes]):
        rank_map = P.order(axes, names)
        gen = RO.generator(rank_map)
        assert all(len(factors) == 1 for _, factors in gen)  # one stride per axis
        assert placed_ranks(axes, gen) == rank_map.ranks
        assert Parallel(axes=axes, placement=gen).ranks == rank_map.ranks


def test_auto_s_grids_of_boxes_expand_to_their_ranks():
    """auto's choices on fat-trees, factored axes among them, are written as generators the runtime expands."""
    factored = 0
    for axes, per_node, nodes, pod, traffic in [
            ((("dp", 4), ("pp", 2), ("tp", 8)), 8, 8, 4, {"dp": 100, "pp": 10, "tp": 1000}),
            ((("dp", 8), ("pp", 4), ("tp", 2)), 2, 32, 8, {"dp": 50, "pp": 40, "tp": 1000}),
            ((("dp", 16), ("pp", 4), ("tp", 4)), 4, 64, 16, {"dp": 30, "pp": 20, "tp": 1000})]:
        topology = FatTree(nodes_per_leaf=2, nodes_per_pod=pod, oversubscription=7)
        choice = P.auto(axes, traffic, topology, nodes, per_node, keep=RO.buildable)
        gen = RO.generator(choice.rank_map)
        assert gen is not None and placed_ranks(axes, gen) == choice.rank_map.ranks
        factored += any(len(factors) > 1 for _, factors in gen)
    assert factored  # a placement no axis order makes


def test_a_rank_map_of_no_strides_has_no_generator():
    axes = (("dp", 2), ("tp", 4))
    assert RO.generator(P.snake_order(axes, ("tp", "dp"))) is None
    odd = P.RankMap(axes, (0, 1, 3, 5, 2, 4, 6, 7))  # in increasing order along each axis, yet no sum of strides
    assert RO.in_order(odd) and RO.generator(odd) is None and not RO.buildable(odd)


def test_the_contract_does_not_grow_with_the_world():
    """Llama 3 405B's mesh in the order Meta gives ([TP, CP, PP, DP], innermost first): 3 pairs for 16,384 ranks."""
    axes = (("dp", 128), ("pp", 16), ("tp", 8))
    gen = RO.generator(P.order(axes, ("tp", "pp", "dp")))
    assert gen == (("dp", ((128, 128),)), ("pp", ((16, 8),)), ("tp", ((8, 1),)))
    assert len(repr(gen)) < 80
    ranks = placed_ranks(axes, gen)
    assert ranks[:3] == (0, 1, 2) and ranks[8] == 8 and ranks[8 * 16] == 128 and sorted(ranks) == list(range(16384))

