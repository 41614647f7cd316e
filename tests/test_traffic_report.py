"""Where `plan` says each collective goes (compiler/report/traffic.py): the seconds it prints per collective are the
step-time model's, the bytes per tier add up to the ledger's, and the naive placement is the plan on the mesh's own
order, costed by the same cost model."""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

from compiler.check import check_text
from compiler.cost import links as LK
from compiler.pipeline import compile_spec
from compiler.report import traffic as TR
from compiler.report.plan import _seconds, plan_json, plan_text

ROOT = Path(__file__).resolve().parents[1]
LLAMA = (ROOT / "samples" / "llama3_70b.scale").read_text()  # pp 4 × dp 2 × tp 8 on 8 nodes of 8 H100
TREE = "  topology = fat_tree(nodes_per_leaf = 2, oversubscription = 7)\n"  # 1:7 above the leaves of 2 nodes
GPT_TP = (ROOT / "samples" / "gpt_tp.scale").read_text()  # no pp: tp's collectives all on the critical path


@functools.lru_cache(maxsize=None)  # compiled once per mesh for the module's tests (nothing here changes one)
def _compiled(extra: str, text: str = LLAMA):
    assert text.count("  device = h100\n") == 1 or extra == ""
    return compile_spec(check_text(text.replace("  device = h100\n", f"  device = h100\n{extra}"), "x.scale"))


def _printed_rows(text: str) -> list:
    """The words of each row of `plan`'s collectives table."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:3] == ["op", "axis", "pass"]) + 1
    rows = []
    for line in lines[start:]:
        if line.startswith("  ("):
            return rows
        rows.append(line.split())
    raise AssertionError("no end to the collectives table")


@pytest.mark.parametrize("extra", ["", TREE + "  placement = order(tp, pp, dp)\n"], ids=["two_tiers", "fat_tree"])
def test_each_collectives_seconds_are_the_step_time_models(extra):
    """Under pp the step-time model puts every tp collective on pp rank 0's critical path and every once-a-step
    collective after the pipeline (step_time.py's pieces and step_tail.py's data_parallel_exposed, both through
    links.collective_s): the seconds `plan` prints per collective, summed per group, are what it charges that
    rank. Each row of the text prints the tier, algorithm and seconds of its --json entry."""
    c = _compiled(extra)
    data = plan_json(c)
    rank0 = c.costs.step.ranks[0]
    for axis in ("tp", "dp"):
        printed = sum(row["seconds"] for row in data["ledger"] if row["axis"] == axis)
        assert printed == pytest.approx(rank0.exposed_comm_s[axis], rel=1e-9)
    rows = _printed_rows(plan_text(c))
    assert len(rows) == len(data["ledger"])
    for words, row in zip(rows, data["ledger"]):
        assert words[:2] == [row["op"], row["axis"]]
        assert words[4:6] == [row["tier"], row["algorithm"]]
        assert " ".join(words[6:8]) == _seconds(row["seconds"])
        assert float(words[8]) == pytest.approx(row["busbw_gbps"], rel=1e-3)
    tiers = {row["axis"]: row["tier"] for row in data["ledger"]}
    assert tiers["tp"] == "intra_node"
    assert (tiers["dp"], tiers["pp"]) == (("inter_node", "inter_node") if not extra else ("top", "top"))


def test_without_pp_every_tp_collective_is_charged_as_printed():
    c = compile_spec(check_text(GPT_TP, "gpt_tp.scale"))
    printed = sum(row["seconds"] for row in plan_json(c)["ledger"] if row["axis"] == "tp")
    assert printed > 0
    assert printed == pytest.approx(c.costs.step.ranks[0].exposed_comm_s["tp"], rel=1e-9)


def test_one_collectives_busbw_is_its_bytes_over_its_time_on_the_described_network():
    """nccl-tests' definition (network.bus_factor), on a ring over the 1:7 top level: a reduce-scatter's bus
    bandwidth is the NIC's reached share, and its time the bytes over it plus the ring's latencies."""
    c = _compiled(TREE + "  placement = order(tp, pp, dp)\n")
    link = LK.links(c.plan, c.spec.cluster)["dp"]
    rs = next(x for x in c.costs.ledger.entries if x.op == "reduce_scatter" and x.axis == "dp")
    p = LK.priced(rs, link)
    assert (p.tier, p.algorithm) == ("top", "ring")
    n = link.size
    nic = c.spec.cluster.device.inter_node_gbps * 0.94 / 7  # ib's reached fraction, the top level's 1:7
    latency = (n - 1) * c.spec.cluster.device.inter_node_latency_us * 1e-6
    assert p.seconds == pytest.approx((n - 1) / n * rs.bytes / (nic * 1e9) + latency, rel=1e-9)
    assert p.busbw_gbps == pytest.approx((n - 1) / n * rs.bytes / p.seconds / 1e9, rel=1e-12)


@pytest.mark.parametrize("extra", ["", TREE, TREE + "  placement = order(tp, pp, dp)\n"])
def test_the_bytes_per_tier_sum_to_the_ledgers(extra):
    c = _compiled(extra)
    tiers = TR.by_tier(c)
    assert sum(t.bytes for t in tiers) == c.costs.ledger.bytes()
    data = plan_json(c)
    assert sum(t["bytes"] for t in data["traffic"]) == sum(row["bytes"] for row in data["ledger"])
    for t in tiers:
        assert t.bytes == sum(row["bytes"] for row in data["ledger"] if row["tier"] == t.tier)
    # every exposed second of the rank is on some tier
    assert sum(t.exposed_s for t in tiers) == pytest.approx(sum(c.costs.step.ranks[0].exposed_comm_s.values()))


def test_the_naive_placement_of_the_mesh_order_is_the_plan():
    """order(tp, dp, pp) is llama3_70b's own order (pp 4 × dp 2 × tp 8, the last axis fastest): no penalty. An order
    that puts dp across the top level is slower than the naive one, whose step is the unplaced plan's."""
    same = _compiled(TREE + "  placement = order(tp, dp, pp)\n")
    naive = TR.naive_placement(same)
    assert not naive.same and naive.ratio == 1.0 and naive.order == ("tp", "dp", "pp")
    assert "naive placement (mesh order, innermost first: tp, dp, pp): " in plan_text(same)
    assert plan_json(same)["naive_placement"] == {"step_s": naive.step_s, "ratio": 1.0, "order": ["tp", "dp", "pp"]}
    worse = _compiled(TREE + "  placement = order(tp, pp, dp)\n")
    unplaced = _compiled(TREE)
    got = TR.naive_placement(worse)
    assert got.step_s == unplaced.costs.step.step_time_s
    assert got.ratio == pytest.approx(unplaced.costs.step.step_time_s / worse.costs.step.step_time_s) and got.ratio < 1
    assert TR.naive_placement(unplaced).same


def test_no_naive_placement_without_a_described_network():
    c = _compiled("  placement = order(tp, pp, dp)\n")
    assert TR.naive_placement(c) is None and plan_json(c)["naive_placement"] is None
    assert "naive placement" not in plan_text(c)


def test_the_naive_placement_is_costed_without_tracing_again(monkeypatch):
    """Only the links differ: the compiled cost model is predicted again, no model built, traced or lowered."""
    from compiler import cost as C
    from compiler import pipeline
    c = _compiled(TREE + "  placement = order(tp, pp, dp)\n")

    def refuse(*a, **k):
        raise AssertionError("the naive placement built a cost model or compiled again")
    monkeypatch.setattr(C.CostModel, "__init__", refuse)
    monkeypatch.setattr(pipeline, "compile_spec", refuse)
    assert TR.naive_placement(c).ratio < 1


def test_the_405b_sample_prints_its_traffic_and_naive_placement():
    text = (ROOT / "tests" / "golden" / "samples" / "llama3_405b" / "plan.txt").read_text()
    assert "traffic per step, by the tier each group crosses" in text
    assert "  top " in text and "naive placement (mesh order, innermost first: tp, pp, dp)" in text
