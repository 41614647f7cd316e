"""compiler/cost/links.py on a described network: a group that leaves its node is priced on the mesh's topology and
fabric (compiler/cost/network.py: the slowest level its rings cross, oversubscription included, NCCL's fastest
algorithm there); a group inside a node, and a file that describes no network, are priced as before."""
from __future__ import annotations

from pathlib import Path

from compiler.check import check_text
from compiler.cost import links as LK
from compiler.pipeline import compile_spec
from compiler.report.plan import plan_json

ROOT = Path(__file__).resolve().parents[1]
LLAMA = (ROOT / "samples" / "llama3_70b.scale").read_text()  # pp 4 × dp 2 × tp 8 on 8 nodes of 8 H100


def _with(extra: str, text: str = LLAMA) -> str:
    assert text.count("  device = h100\n") == 1
    return text.replace("  device = h100\n", f"  device = h100\n{extra}")


def _step(text: str) -> tuple:
    spec = check_text(text, "llama3_70b.scale")
    return spec, LK.links(spec.plan, spec.cluster), plan_json(compile_spec(spec))


def test_no_network_written_prices_as_before():
    spec, lk, _ = _step(LLAMA)
    assert all(link.network is None and link.tier == "" for link in lk.values())
    assert lk["pp"].gbps == spec.cluster.device.inter_node_gbps


def test_an_oversubscribed_top_tier_slows_the_groups_that_cross_it():
    _, flat, flat_json = _step(_with("  topology = fat_tree(nodes_per_leaf = 2, oversubscription = 1)\n"))
    _, over, over_json = _step(_with("  topology = fat_tree(nodes_per_leaf = 2, oversubscription = 7)\n"))
    # pp's rings join nodes 2 apart (pp is outermost): across leaves, over the top tier; dp's stay in a leaf
    assert over["pp"].tier == "top" and over["dp"].tier == "leaf"
    assert abs(flat["pp"].gbps / over["pp"].gbps - 7) < 0.05
    assert over["dp"].gbps == flat["dp"].gbps
    assert LK.collective_s("send_recv", 1e8, over["pp"]) > 6 * LK.collective_s("send_recv", 1e8, flat["pp"])
    # tp stays inside its node: the two tiers' fitted link, not the network's
    assert over["tp"].network is None and over["tp"] == flat["tp"]
    assert over_json["predicted"]["step_time_s"] > flat_json["predicted"]["step_time_s"]


def test_roce_is_slower_than_infiniband_between_nodes():
    _, ib, _ = _step(_with("  fabric = ib\n"))
    _, roce, _ = _step(_with("  fabric = roce\n"))
    assert roce["dp"].network is not None and roce["dp"].gbps < ib["dp"].gbps
    assert roce["tp"] == ib["tp"]


def test_a_groups_network_price_is_kept_across_meshes_by_its_rows():
    """links.py prices a group's rows on the network once per cluster (`_worst`): a mesh of another shape whose
    group has the same rows (dp 4 × tp 8 beside pp 2 × dp 2 × tp 8 on 8 nodes: tp the same) reads the same price,
    and every link equals the one priced afresh."""
    spec = check_text(_with("  topology = fat_tree(nodes_per_leaf = 2, oversubscription = 7)\n"), "llama3_70b.scale")
    meshes = [(("pp", 4), ("dp", 2), ("tp", 8)), (("pp", 2), ("dp", 4), ("tp", 8)), (("dp", 8), ("tp", 8)),
              (("pp", 8), ("dp", 8)), (("dp", 16), ("cp", 2), ("tp", 2))]
    LK._WORST.clear()
    kept = [LK._links(axes, spec.cluster) for axes in meshes]
    assert len(LK._WORST) < sum(1 for links in kept for link in links.values() if link.network is not None)
    for axes, links in zip(meshes, kept):
        LK._WORST.clear()
        assert LK._links(axes, spec.cluster) == links
        assert [link.network for link in LK._links(axes, spec.cluster).values()] == \
            [link.network for link in links.values()]
