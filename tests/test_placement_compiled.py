"""`placement = auto` through the compiler (issue 40, "Done when"): small clusters written as `.scale` text, checked
and compiled as `scalec plan` does (check_text, compile_spec, the placement cost/links.py `resolved` gives codegen
and the plan output from the ledger's bytes per group), each held to a brute-force minimum of the bytes over the
top tier.

The cases: 58 clusters of 12 to 64 ranks in 2 to 4 pods under a 1:1 to 1:8 top tier, over eleven meshes of dp, pp,
tp, cp and ep (a small GPT and a small MoE GPT, each traced once, each mesh compiled once: its ledger reads the mesh,
not the network); the clusters vary the nodes' size, the pods, the leaves and the oversubscription, seeded.

The brute force, independent of auto's code (numpy over enumerated labelings, as tests/test_placement.py's):
a ring step crosses the top tier exactly when its two coordinates sit in different pods, so the top tier's bytes
depend only on the coordinate -> pod labeling.
  - where they number at most LABELINGS_LIMIT (12 or 16 ranks: 30 cases): every balanced labeling of the
    coordinates (pods interchangeable), which is every placement's: auto must reach that minimum;
  - above (16 ranks in 4 pods, 24 to 64 ranks: 28 cases): every order of the axes (laid out plainly) times every
    assignment of its nodes to pods, the placements whose nodes each hold consecutive ranks of an axis order, in any
    node order (rank permutations within a node or a pod, and pods' order, move no byte over the top): auto must
    reach that minimum or beat it.
The placement held is the one the program is built on: every axis's ranks in increasing order and written as a sum
of strides (rank_order.buildable), so auto reaches these minima within what torch's process groups can hold.
"""
from __future__ import annotations

import functools
import itertools
import math
import random
import re
from pathlib import Path

import numpy as np
import pytest

from compiler.check import check_text
from compiler.cost import links as LK
from compiler.layout import placement as P
from compiler.layout import rank_order as RO
from compiler.lower import trace
from compiler.pipeline import compile_spec

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"gpt": ROOT / "samples" / "gpt_3d.scale", "moe": ROOT / "samples" / "moe_gpt.scale"}
MESHES = (  # (model, ((axis, size), ...) outermost first)
    ("gpt", (("dp", 8), ("pp", 2))),
    ("gpt", (("dp", 3), ("pp", 2), ("tp", 2))),
    ("gpt", (("dp", 6), ("tp", 4))),
    ("gpt", (("dp", 2), ("pp", 4), ("tp", 2))),
    ("gpt", (("dp", 2), ("cp", 2), ("tp", 4))),
    ("gpt", (("dp", 4), ("pp", 2), ("tp", 4))),
    ("gpt", (("dp", 2), ("pp", 2), ("cp", 2), ("tp", 4))),
    ("gpt", (("dp", 4), ("pp", 4), ("tp", 4))),
    ("moe", (("dp", 2), ("pp", 2), ("ep", 2), ("tp", 2))),
    ("moe", (("dp", 2), ("ep", 4), ("tp", 4))),
    ("moe", (("dp", 3), ("ep", 2), ("tp", 2))),
)
LABELINGS_LIMIT = 7000
"""The brute force enumerates at most this many node -> pod labelings per axis order."""


def _clusters(world: int, rng: random.Random) -> list:
    """(devices per node, pods, nodes per leaf, oversubscription) the brute force can enumerate on `world` ranks."""
    out = []
    for per_node in (1, 2, 4, 8):
        nodes = world // per_node
        if world % per_node or nodes < 2:
            continue
        for pods in (2, 3, 4):
            if nodes % pods or nodes == pods and pods > 2:
                continue
            if _count(world if _every(world, pods) else nodes, pods) > LABELINGS_LIMIT:
                continue
            per_pod = nodes // pods
            leaf = rng.choice([d for d in range(1, per_pod + 1) if per_pod % d == 0])
            out.append((per_node, pods, leaf, rng.randint(1, 8)))
    # a second leaf and oversubscription on the largest nodes
    per_node, pods, _, _ = max(out)
    per_pod = world // per_node // pods
    return out + [(per_node, pods, rng.choice([d for d in range(1, per_pod + 1) if per_pod % d == 0]),
                   rng.randint(1, 8))]


def _every(world: int, pods: int) -> bool:
    """Whether the brute force enumerates every labeling of the coordinates (else axis orders × node labelings)."""
    return _count(world, pods) <= LABELINGS_LIMIT


def _count(items: int, parts: int) -> int:
    size, n, count = items // parts, items, 1
    for _ in range(parts):
        count *= math.comb(n, size)
        n -= size
    return count // math.factorial(parts)


def _text(model: str, axes: tuple, cluster: tuple) -> str:
    per_node, pods, leaf, over = cluster
    world = math.prod(n for _, n in axes)
    nodes = world // per_node
    mesh = "mesh {\n" + "".join(f"  axis {a} = {n}\n" for a, n in axes) + (
        f"  nodes = {nodes}\n  devices_per_node = {per_node}\n  device = h100\n"
        f"  topology = fat_tree(nodes_per_leaf = {leaf}, nodes_per_pod = {nodes // pods}, "
        f"oversubscription = {over})\n  placement = auto\n}}\n")
    text = re.sub(r"mesh \{.*?\n\}\n", mesh, MODELS[model].read_text(), flags=re.S)
    text = re.sub(r"global_batch = \d+", "global_batch = 96", text)
    return re.sub(r"micro_batches = \d+", "micro_batches = 4", text)


def _cases() -> list:
    rng = random.Random(40)
    out = []
    for model, axes in MESHES:
        world = math.prod(n for _, n in axes)
        for cluster in _clusters(world, rng):
            out.append((model, axes, cluster))
    return out


CASES = _cases()


_TRACED: dict = {}
_LEDGERS: dict = {}


def _ledger(model: str, spec):
    """The ledger of the spec's mesh (it reads the mesh, not the network): compiled once per mesh from one trace per
    model, shared by the mesh's clusters."""
    key = (model, tuple(spec.plan.axes))
    if key not in _LEDGERS:
        if model not in _TRACED:
            _TRACED[model] = trace(spec)
        _LEDGERS[key] = compile_spec(spec, unsharded=_TRACED[model]).costs.ledger
    return _LEDGERS[key]


@functools.cache
def _labelings(items: int, parts: int) -> np.ndarray:
    """Every balanced labeling of `items` into `parts` parts, parts interchangeable."""
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
                    break

    go(0)
    return np.array(out, dtype=np.int8)


def _cut(labels: np.ndarray, steps: list) -> float:
    cost = np.zeros(len(labels))
    for u, v, w in steps:
        cost += w * (labels[:, u] != labels[:, v])
    return float(cost.min())


def _brute(axes: tuple, traffic: dict, per_node: int, pods: int) -> float:
    world = math.prod(n for _, n in axes)
    ident = P.RankMap.identity(axes)
    if _every(world, pods):
        return _cut(_labelings(world, pods), [(u, v, w) for g, w in traffic.items()
                                              for u, v in P.ring_edges(ident.rows(g))])
    labels, best = _labelings(world // per_node, pods), math.inf
    for names in itertools.permutations([a for a, _ in axes]):
        p = P.order(axes, names)
        steps = [(u // per_node, v // per_node, w) for g, w in traffic.items() for u, v in P.ring_edges(p.rows(g))]
        best = min(best, _cut(labels, steps))
    return best


def test_the_cases_cover_the_issue_s_clusters():
    assert len(CASES) >= 50
    assert {pods for _, _, (_, pods, _, _) in CASES} == {2, 3, 4}
    assert {over for _, _, (_, _, _, over) in CASES} >= {1, 8}
    assert max(math.prod(n for _, n in axes) for _, axes, _ in CASES) == 64
    assert {a for _, axes, _ in CASES for a, _ in axes} == {"dp", "pp", "tp", "cp", "ep"}


@pytest.mark.parametrize("case", CASES, ids=[f"{m}-" + "".join(f"{a}{n}" for a, n in axes) +
                                            "-x{}-pods{}-leaf{}-o{}".format(*c) for m, axes, c in CASES])
def test_auto_reaches_the_brute_force_minimum_over_the_top_tier(case):
    model, axes, (per_node, pods, leaf, over) = case
    spec = check_text(_text(model, axes, (per_node, pods, leaf, over)), "case.scale")
    assert spec.plan.placement == "auto" and tuple(spec.plan.axes) == axes
    ledger = _ledger(model, spec)
    placed = LK.resolved(spec.plan, spec.cluster, ledger)
    traffic = {k: v for k, v in LK.traffic(spec.plan, ledger).items() if v}
    assert RO.in_order(placed.rank_map)
    top = P.tier_bytes(placed.rank_map, spec.cluster.topology, per_node, traffic).total[-1]
    assert top <= _brute(axes, traffic, per_node, pods) + 1e-6, placed.describe()


@pytest.mark.parametrize("case", CASES[::10], ids=lambda c: c[0] + "".join(f"-{a}{n}" for a, n in c[1]))
def test_ties_over_the_top_go_to_the_faster_collectives(case):
    """Among placements with the least bytes over the top tier, auto takes the one whose collectives the step-time
    model prices fastest: no axis order tied with it over the top is priced faster (every axis order is one of its
    candidates)."""
    model, axes, cluster = case
    spec = check_text(_text(model, axes, cluster), "case.scale")
    ledger = _ledger(model, spec)
    placed = LK.resolved(spec.plan, spec.cluster, ledger)
    traffic = {k: v for k, v in LK.traffic(spec.plan, ledger).items() if v}
    calls = tuple(sorted((c.op, c.axis, c.times, c.bytes) for c in ledger.entries if c.bytes))
    per_node, topology = cluster[0], spec.cluster.topology
    top = P.tier_bytes(placed.rank_map, topology, per_node, traffic).total[-1]
    mine = LK.collectives_s(axes, spec.cluster, placed.rank_map, calls)
    for names in itertools.permutations([a for a, _ in axes]):
        other = P.order(axes, names)
        if P.tier_bytes(other, topology, per_node, traffic).total[-1] == top:
            assert mine <= LK.collectives_s(axes, spec.cluster, other, calls) * (1 + 1e-12), names


def test_the_tie_break_reads_the_given_time():
    """placement.auto's `seconds`: among candidates tied over the top, the least time wins, whatever it measures."""
    from compiler.layout.topology import FatTree
    axes, traffic = (("dp", 2), ("pp", 2), ("tp", 4)), {"dp": 4.0, "pp": 4.0, "tp": 4.0}
    t = FatTree(nodes_per_leaf=1, nodes_per_pod=2, oversubscription=4)

    def odd(rank_map):  # any deterministic measure: here, how late coordinate 1 comes
        return rank_map.ranks[1]

    plain = P.auto(axes, traffic, t, 4, 4, keep=RO.in_order)
    timed = P.auto(axes, traffic, t, 4, 4, keep=RO.in_order, seconds=odd)
    assert timed.bytes.total[-1] == plain.bytes.total[-1] and timed.seconds == odd(timed.rank_map)
    tied = [P.order(axes, n) for n in itertools.permutations(["tp", "pp", "dp"])]
    tied = [m for m in tied if P.tier_bytes(m, t, 4, traffic).total[-1] == plain.bytes.total[-1]]
    assert len(tied) > 1 and timed.seconds <= min(odd(m) for m in [plain.rank_map, *tied])
    assert timed.seconds < odd(plain.rank_map)  # the time moved the choice
