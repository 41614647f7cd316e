"""compiler/layout/placement.py: placements as rank permutations, the bytes over each tier, and `auto` against
brute force.

Two brute forces, both independent of auto's code (numpy over enumerated labelings):
  A. every placement, on meshes of at most 16 ranks: a placement maps each coordinate to a rank and so to a pod;
     a ring step crosses the top tier exactly when its two coordinates are in different pods, so the top tier's
     bytes depend only on the coordinate -> pod labeling, and every balanced labeling is some placement's (fill
     each pod's ranks in any order). Enumerating every balanced labeling (pods interchangeable) therefore covers
     all W! placements: at most 6,435 labelings per case.
  B. up to 64 ranks (W! is not enumerable): every order of the axes (laid out plainly, `order`) times every
     assignment of the resulting nodes to pods. Ranks within a node are interchangeable for the top tier, so this
     covers every placement whose nodes each hold a block of consecutive ranks of some axis order, whatever order
     the scheduler lists the nodes in. auto must reach that minimum or beat it (its staircases can).
auto runs with exhaustive=0 (its heuristics alone) and with its default (exact searches where small).
"""
from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from compiler.layout.groups import expand
from compiler.layout.placement import (RankMap, auto, group_crossing, order, order_problems, ring_edges,
                                       snake_order, tier_bytes)
from compiler.layout.topology import Dragonfly, FatTree, RailOptimized, Torus

AXES = (("dp", 2), ("pp", 3), ("tp", 4))


def test_order_is_innermost_first():
    assert order(AXES, ("tp", "pp", "dp")) == RankMap.identity(AXES)
    p = order(AXES, ("dp", "tp", "pp"))  # dp fastest, then tp, pp slowest
    for d, q, t in itertools.product(range(2), range(3), range(4)):
        assert p.rank((d, q, t)) == d + 2 * t + 8 * q
        assert p.coord(p.rank((d, q, t))) == (d, q, t)
    assert p.mesh()[1][2][3] == p.rank((1, 2, 3))
    assert sorted(p.ranks) == list(range(24))


def test_order_problems():
    fields = order_problems(AXES, ("tp", "tp", "ep"))
    assert [p.message for p in fields] == ["axis tp is named 2 times", "the mesh has no axis ep",
                                           "order(...) leaves out dp, pp"]
    assert order_problems(AXES, ("dp", "pp", "tp")) == ()
    with pytest.raises(ValueError):
        order(AXES, ("tp", "pp"))


@pytest.mark.parametrize("names", [("tp",), ("pp",), ("dp", "tp"), ("dp", "pp", "tp")])
def test_rows_are_groups_rows_under_the_placement(names):
    """RankMap.rows is groups.py's stride pattern expanded, then renumbered by the placement."""
    strides = {"dp": 12, "pp": 4, "tp": 1}
    pattern = tuple((strides[a], dict(AXES)[a]) for a, _ in AXES if a in names)
    p = order(AXES, ("pp", "dp", "tp"))
    assert p.rows(names) == p.apply(expand(pattern, 24))
    assert RankMap.identity(AXES).rows(names) == expand(pattern, 24)


@pytest.mark.parametrize("axes", [AXES, (("a", 6), ("b", 2)), (("a", 2), ("b", 2), ("c", 2), ("d", 3))])
def test_snake_steps_by_one_along_one_axis(axes):
    for names in itertools.permutations([a for a, _ in axes]):
        p = snake_order(axes, names)
        coords = sorted((p.rank(c), c) for c in itertools.product(*(range(n) for _, n in axes)))
        assert [r for r, _ in coords] == list(range(p.world))
        for (_, a), (_, b) in zip(coords, coords[1:]):
            assert sorted(abs(x - y) for x, y in zip(a, b))[-2:] == [0, 1]


def test_tier_bytes_by_hand():
    """dp 2 × tp 4 on 2 nodes of 4, one leaf each: tp's rings stay in the nodes, dp's pairs cross the top."""
    axes, t = (("dp", 2), ("tp", 4)), FatTree(nodes_per_leaf=1, oversubscription=4)
    traffic = {"dp": 10, "tp": 100}
    plain = tier_bytes(RankMap.identity(axes), t, 4, traffic)
    assert plain.levels == ("scale_up", "leaf", "top")
    assert plain.total == (8 * 100, 0, 4 * 2 * 10)  # 2 rings of 4 steps; 4 rings of 2 steps, both ways
    assert plain.slowest("tp") == "scale_up" and plain.slowest("dp") == "top"
    swapped = tier_bytes(order(axes, ("dp", "tp")), t, 4, traffic)  # dp innermost: tp's rings cross
    # each tp ring (0, 2, 4, 6) steps inside a node at 0 -> 2 and 4 -> 6, between the nodes at 2 -> 4 and 6 -> 0
    assert swapped.total == (4 * 2 * 10 + 2 * 2 * 100, 0, 2 * 2 * 100)
    assert list(ring_edges(((0, 2, 4, 6),))) == [(0, 2), (2, 4), (4, 6), (6, 0)]


def test_the_crossing_that_sets_a_group_s_pace():
    axes, t = (("dp", 2), ("tp", 4)), FatTree(nodes_per_leaf=1, oversubscription=4)
    plain, swapped = RankMap.identity(axes), order(axes, ("dp", "tp"))
    assert group_crossing(plain, "tp", t, 4).name == "scale_up"
    assert (group_crossing(swapped, "tp", t, 4).name, group_crossing(swapped, "tp", t, 4).share) == ("top", 0.25)
    assert group_crossing(plain, ("dp", "tp"), t, 4).name == "top"
    assert group_crossing(RankMap.identity((("dp", 1), ("tp", 4))), "dp", t, 4) is None


def test_a_rank_map_is_a_permutation():
    with pytest.raises(ValueError):
        RankMap((("dp", 2), ("tp", 2)), (0, 1, 1, 3))
    with pytest.raises(ValueError):
        RankMap((("dp", 2), ("tp", 2)), (0, 1, 2))
    with pytest.raises(ValueError):
        RankMap.identity(AXES).rows("ep")


def test_relocate_moves_whole_nodes():
    p = RankMap.identity((("dp", 4), ("tp", 2))).relocate((2, 0, 3, 1), 2)
    assert p.ranks == (4, 5, 0, 1, 6, 7, 2, 3)


def _labelings(items: int, parts: int) -> np.ndarray:
    """Every balanced labeling of `items` into `parts` parts, parts interchangeable (an empty part opened in order)."""
    size, out, lab, fill = items // parts, [], [0] * items, [0] * parts

    def go(i):
        if i == items:
            out.append(tuple(lab))
            return
        for j in range(parts):
            if fill[j] < size:
                lab[i], fill[j] = j, fill[j] + 1
                go(i + 1)
                fill[j] -= 1
                if fill[j] == 0:
                    break  # the other empty parts are the same as this one

    go(0)
    return np.array(out, dtype=np.int8)


def _cut(labels: np.ndarray, steps: list) -> np.ndarray:
    cost = np.zeros(len(labels))
    for u, v, w in steps:
        cost += w * (labels[:, u] != labels[:, v])
    return cost


def _brute_every_placement(axes, traffic, pods) -> float:
    ident = RankMap.identity(axes)
    steps = [(u, v, w) for g, w in traffic.items() for u, v in ring_edges(ident.rows(g))]
    return _cut(_labelings(ident.world, pods), steps).min()


def _brute_orders_and_nodes(axes, traffic, per_node, pods) -> float:
    nodes = math.prod(n for _, n in axes) // per_node
    labels, best = _labelings(nodes, pods), math.inf
    for names in itertools.permutations([a for a, _ in axes]):
        p = order(axes, names)
        steps = [(u // per_node, v // per_node, w) for g, w in traffic.items() for u, v in ring_edges(p.rows(g))]
        best = min(best, _cut(labels, steps).min())
    return best


def _factorizations(world: int, k: int) -> list:
    if k == 1:
        return [(world,)] if world > 1 else []
    return [(d, *rest) for d in range(2, world) if world % d == 0 for rest in _factorizations(world // d, k - 1)]


def _cases(shapes, count: int, seed: int) -> list:
    """(axes, traffic, per_node, pods, topology) drawn from every mesh of 2-3 axes of each (world, per_node, pods)
    shape, with seeded traffic (some axes silent), leaves and a 1:1 to 1:8 top tier."""
    rng = random.Random(seed)
    meshes = [(w, n, p, s) for w, n, p in shapes for k in (2, 3) for s in _factorizations(w, k)]
    out = []
    for world, per_node, pods, sizes in rng.sample(meshes, count):
        axes = tuple(zip(("dp", "pp", "tp"), sizes))
        traffic = {a: rng.choice([0, 1, 2, 3, 5, 8, 13, 40]) for a, _ in axes}
        per_pod = world // per_node // pods
        leaf = rng.choice([d for d in range(1, per_pod + 1) if per_pod % d == 0])
        t = FatTree(nodes_per_leaf=leaf, nodes_per_pod=per_pod, oversubscription=rng.randint(1, 8))
        out.append((axes, traffic, per_node, pods, t))
    return out


SMALL = _cases([(8, 1, 2), (8, 2, 2), (8, 1, 4), (8, 2, 4), (12, 1, 2), (12, 2, 2), (12, 1, 3), (12, 2, 3),
                (12, 4, 3), (16, 1, 2), (16, 2, 2), (16, 4, 2)], 54, seed=40)
LARGE = _cases([(64, 8, 2), (64, 8, 4), (64, 4, 2), (32, 2, 2), (32, 4, 4), (48, 4, 3), (48, 8, 3), (48, 4, 2)],
               24, seed=41)


def _id(case) -> str:
    axes, traffic, per_node, pods, t = case
    return "-".join(f"{a}{n}:{traffic[a]}" for a, n in axes) + f"-x{per_node}-pods{pods}-leaf{t.nodes_per_leaf}"


@pytest.mark.parametrize("case", SMALL, ids=[_id(c) for c in SMALL])
def test_auto_reaches_the_minimum_over_every_placement(case):
    axes, traffic, per_node, pods, t = case
    world = math.prod(n for _, n in axes)
    best = _brute_every_placement(axes, traffic, pods)
    for exhaustive in (0, 20000):
        chosen = auto(axes, traffic, t, world // per_node, per_node, exhaustive=exhaustive)
        assert sorted(chosen.rank_map.ranks) == list(range(world))
        assert chosen.bytes == tier_bytes(chosen.rank_map, t, per_node, traffic)
        assert chosen.bytes["top"] == best, (exhaustive, chosen.order)


@pytest.mark.parametrize("case", LARGE, ids=[_id(c) for c in LARGE])
def test_auto_reaches_the_minimum_over_orders_and_node_assignments(case):
    axes, traffic, per_node, pods, t = case
    world = math.prod(n for _, n in axes)
    chosen = auto(axes, traffic, t, world // per_node, per_node, exhaustive=0)
    assert sorted(chosen.rank_map.ranks) == list(range(world))
    assert chosen.bytes["top"] <= _brute_orders_and_nodes(axes, traffic, per_node, pods)


def test_auto_keeps_the_heaviest_axis_on_the_fastest_tier():
    """A 64-GPU Llama-like mesh on 1:7 pods of 4 nodes: tp inside the nodes, dp's crossings of the top tier fewer
    than the mesh's own order gives, none of tp's bytes on the network."""
    axes, t = (("dp", 4), ("pp", 2), ("tp", 8)), FatTree(nodes_per_leaf=2, nodes_per_pod=4, oversubscription=7)
    traffic = {"dp": 100, "pp": 10, "tp": 1000}
    chosen = auto(axes, traffic, t, 8, 8)
    plain = tier_bytes(RankMap.identity(axes), t, 8, traffic)
    assert chosen.bytes.slowest("tp") == "scale_up"
    assert chosen.bytes.key() < plain.key() and chosen.bytes["top"] < plain["top"]


def _ring_orbit(ring: tuple, relabelings) -> set:
    """A ring's device order up to relabelings of the devices, rotation and reflection."""
    out = set()
    for f in relabelings:
        seq = [f[d] for d in ring]
        for k in range(len(seq)):
            rotated = seq[k:] + seq[:k]
            out |= {tuple(rotated), tuple(reversed(rotated))}
    return out


def _torus_symmetries(dims: tuple) -> list:
    """Node relabelings of a torus of 2s: permute the dimensions, flip any of them."""
    out = []
    for perm in itertools.permutations(range(len(dims))):
        for flips in itertools.product((0, 1), repeat=len(dims)):
            def f(n, perm=perm, flips=flips):
                c = [(n >> d) & 1 for d in range(len(dims))]
                return sum(((c[perm[d]] ^ flips[d]) << d) for d in range(len(dims)))
            out.append([f(n) for n in range(2 ** len(dims))])
    return out


def test_tpu_v3_tray_ring_is_jax_s():
    """A TPU v3 tray: 2 × 2 chips on the torus, 2 cores per chip (device = 2·chip + core, chip = x + 2y), is
    8 = 2×2×2 cores. jax/_src/mesh_utils.py: `_TRAY_RING_ORDER = (0, 1, 2, 3, 6, 7, 4, 5)`, "physical ordering
    of core IDs in a tray that creates a ring" (create_device_mesh on a single-tray TPU v2/v3). auto's ring over
    one axis of 8 is that order up to the tray's symmetries (the chips' square, the cores of a chip, the ring's
    rotation and reflection)."""
    jax = (0, 1, 2, 3, 6, 7, 4, 5)
    relabel = [[2 * square[d // 2] + ((d % 2) ^ ((mask >> (d // 2)) & 1)) for d in range(8)]
               for square in _torus_symmetries((2, 2)) for mask in range(16)]
    orbit = _ring_orbit(jax, relabel)
    t = Torus(2, 2, 1)
    for exhaustive in (0, 20000):
        chosen = auto((("ring", 8),), {"ring": 1}, t, 4, 2, exhaustive=exhaustive)
        assert chosen.rank_map.ranks in orbit
        assert chosen.bytes.total == (4, 4, 0)  # four steps inside a chip, four of one hop, none of two
    assert tuple(range(8)) not in orbit  # the row-major order takes a two-hop diagonal
    # read as a torus of eight single-core nodes the same order takes two-hop steps (1 -> 2 changes core and x):
    # the third 2 of the tray is the two cores of a chip, not a torus dimension
    assert tier_bytes(RankMap((("ring", 8),), jax), Torus(2, 2, 2), 1, {"ring": 1})["2 hops"] == 4


def test_tpu_v5p_cube_ring_is_jax_s():
    """A 2×2×2 torus of single-device nodes: jax/_src/mesh_utils.py `_V5P_2x2x2_ORDER = (0, 1, 3, 2, 6, 7, 5, 4)`,
    a ring of single hops; auto's is the same up to the cube's symmetries."""
    orbit = _ring_orbit((0, 1, 3, 2, 6, 7, 5, 4), _torus_symmetries((2, 2, 2)))
    chosen = auto((("ring", 8),), {"ring": 1}, Torus(2, 2, 2), 8, 1)
    assert chosen.rank_map.ranks in orbit
    assert chosen.bytes["1 hop"] == 8


@pytest.mark.parametrize("axes,traffic", [((("a", 2), ("b", 8)), {"a": 1, "b": 1}),
                                          ((("a", 2), ("b", 8)), {"a": 1, "b": 5}),
                                          ((("a", 16),), {"a": 1})])
def test_auto_on_a_torus_keeps_every_ring_step_to_one_hop(axes, traffic):
    """A 4 × 4 torus of single-device nodes (16! node orders: the swap search from the snakes): the mesh's own
    order takes two-hop steps (b's ring of 8 over two rows of x); auto finds an embedding of single hops."""
    t = Torus(4, 4, 1)
    assert tier_bytes(RankMap.identity(axes), t, 1, traffic)["2 hops"] > 0
    chosen = auto(axes, traffic, t, 16, 1)
    assert chosen.bytes["1 hop"] == sum(traffic.values()) * 16 and chosen.bytes.total[2:] == (0, 0, 0)


def test_auto_on_other_trees():
    """Rails without PXN (a search over node orders: the level depends on the local device) and a dragonfly (a
    tree of groups), tp listed outermost so that the mesh's own order spreads it over the nodes: auto puts tp
    inside the nodes and crosses the top level only on dp's two steps per ring."""
    axes, traffic = (("tp", 4), ("dp", 4)), {"dp": 1, "tp": 4}
    for t, top in ((RailOptimized(nodes_per_group=2, pxn=False), "spine"),
                   (Dragonfly(groups=2, nodes_per_group=2), "global")):
        assert tier_bytes(RankMap.identity(axes), t, 4, traffic).slowest("tp") == top
        chosen = auto(axes, traffic, t, 4, 4)
        assert chosen.bytes.slowest("tp") == "scale_up"
        assert chosen.bytes[top] == 4 * 2  # 4 dp rings over 2 groups of 2 nodes: 2 steps each cross


@pytest.mark.parametrize("t,nodes,per_node,axes", [
    (FatTree(nodes_per_leaf=2, nodes_per_pod=4, oversubscription=7), 8, 3, (("dp", 8), ("tp", 3))),
    (Torus(2, 2, 2), 8, 3, (("dp", 8), ("tp", 3))),
    (Torus(4, 4, 1), 16, 2, (("dp", 4), ("tp", 8)))])
def test_without_traffic_auto_keeps_the_mesh_s_own_order(t, nodes, per_node, axes):
    """Ties keep the first candidate, the mesh's own order on the nodes in order: no traffic, no change."""
    chosen = auto(axes, {"dp": 0, "tp": 0}, t, nodes, per_node)
    assert chosen.rank_map == RankMap.identity(axes)
