"""`scalec search` varies placement where the mesh describes its network (compiler/search/prune.py, rule 9): each
variant simulated exactly is simulated under the mesh's own order and under `placement = auto`, the faster kept,
and each winner says which it takes, where its axes' traffic runs and the other's step time (issue 40)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from compiler import plan as P
from compiler.check import check_text
from compiler.search import prune as PR
from compiler.search.space import placement_key

ROOT = Path(__file__).resolve().parents[1]


def _text(topology: bool) -> str:
    """gpt_3d on 16 H100s, 4 nodes of 4 in 2 pods under a 1:8 top tier (or the two tiers alone)."""
    mesh = ("mesh {\n  axis dp = 16\n  nodes = 4\n  devices_per_node = 4\n  device = h100\n"
            + ("  topology = fat_tree(nodes_per_leaf = 1, nodes_per_pod = 2, oversubscription = 8)\n" if topology
               else "") + "}\n")
    text = re.sub(r"mesh \{.*?\n\}\n", mesh, (ROOT / "samples" / "gpt_3d.scale").read_text(), flags=re.S)
    return re.sub(r"global_batch = \d+", "global_batch = 128", text)


@pytest.fixture(scope="module")
def run():
    search = PR.Search(check_text(_text(True), "placed.scale"), 3, {})
    return search, search.run()


def test_each_winner_takes_the_faster_placement_and_says_so(run):
    search, result = run
    assert search.vary_placement and result.winners
    # on this cluster auto moves pp's ring off the 1:8 tier for the pipelined winner: both placements win somewhere
    assert {w.plan.placement for w in result.winners} == {None, "auto"}
    for w in result.winners:
        other, t = search.placed[placement_key(w.plan)]
        assert other != w.plan.placement and t >= w.prediction.step_time_s
        # the other placement's time is the step-time model's for it
        alt = P.evolve(w.plan, placement=other)
        cm = search.cands.cost_model(alt)
        assert search.sim.predict(cm, alt, w.estimate).step_time_s == pytest.approx(t, rel=1e-12)
        said = [r for r in w.reasons if r.startswith("placement ")]
        assert len(said) == 1 and f"{t / w.prediction.step_time_s:.2f}× its step time" in said[0]
        assert all(f"{a} {n} on " in said[0] for a, n in w.plan.axes if n > 1)


def test_no_placement_is_varied_without_a_described_network():
    search = PR.Search(check_text(_text(False), "plain.scale"), 3, {})
    result = search.run()
    assert not search.vary_placement and not search.placed
    assert all(w.plan.placement is None and not any(r.startswith("placement ") for r in w.reasons)
               for w in result.winners)
