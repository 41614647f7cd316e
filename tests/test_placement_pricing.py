"""compiler/cost/links.py under the mesh's `placement`: each group is priced on the ranks its placement gives it
(compiler/layout/rank_order.py), where the mesh describes its network; elsewhere a placement changes no price."""
from __future__ import annotations

from pathlib import Path

from compiler.check import check_text
from compiler.cost import links as LK
from compiler.pipeline import compile_spec
from compiler.report.plan import plan_json

ROOT = Path(__file__).resolve().parents[1]
LLAMA = (ROOT / "samples" / "llama3_70b.scale").read_text()  # pp 4 × dp 2 × tp 8 on 8 nodes of 8 H100
TREE = "  topology = fat_tree(nodes_per_leaf = 2, oversubscription = 7)\n"  # 1:7 above the leaves of 2 nodes


def _with(extra: str) -> str:
    assert LLAMA.count("  device = h100\n") == 1
    return LLAMA.replace("  device = h100\n", f"  device = h100\n{extra}")


def _step(extra: str) -> tuple:
    spec = check_text(_with(extra), "llama3_70b.scale")
    return LK.links(spec.plan, spec.cluster), plan_json(compile_spec(spec))["predicted"]["step_time_s"]


def test_dp_across_the_oversubscribed_top_predicts_a_slower_step():
    inside, t_inside = _step(TREE + "  placement = order(tp, dp, pp)\n")  # dp's pairs 8 ranks apart: one leaf
    across, t_across = _step(TREE + "  placement = order(tp, pp, dp)\n")  # dp's pairs 32 ranks apart: two leaves
    assert inside["dp"].tier == "leaf" and across["dp"].tier == "top"
    assert inside["dp"].gbps > 5 * across["dp"].gbps
    assert inside["tp"] == across["tp"]  # tp stays in its node either way
    assert t_across > t_inside


def test_the_mesh_order_written_as_a_placement_prices_as_unwritten():
    plain, t_plain = _step(TREE)
    same, t_same = _step(TREE + "  placement = order(tp, dp, pp)\n")
    assert plain == same and t_plain == t_same


def test_without_a_described_network_a_placement_changes_no_price():
    plain, t_plain = _step("")
    placed, t_placed = _step("  placement = order(tp, pp, dp)\n")
    assert plain == placed and t_plain == t_placed
