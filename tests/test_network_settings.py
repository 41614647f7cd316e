"""The mesh's network (issue 40): `fabric`, `topology`, `scale_up` and `placement` read into the Cluster and the
Plan (compiler/network_checks.py), every impossible shape refused at its argument, every setting that changes
nothing warned, and files that write none of them unchanged."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from compiler.check import check_text
from compiler.diagnostics import ScaleError
from compiler.layout.devices import DEVICES
from compiler.layout.topology import Dragonfly, FatTree, RailOptimized, SwitchTree, Torus
from compiler.search.space import Space

ROOT = Path(__file__).resolve().parents[1]
SEVENTY = (ROOT / "samples" / "llama3_70b.scale").read_text()  # pp 4 × dp 2 × tp 8 on 8 nodes of 8 H100
MESH = "  nodes = 8\n  devices_per_node = 8\n  device = h100\n"

MODEL = """model gpt {
  vocab = 128  hidden = 64  heads = 4  layers = 2  seq = 16
  embedding(vocab, hidden)  positional(seq, hidden)
  repeat layers {
    residual { layernorm(hidden)  attention(hidden, heads) }
    residual { layernorm(hidden)  mlp(hidden, 4 * hidden, act = gelu) }
  }
  layernorm(hidden)  lm_head(vocab, hidden, tied = true)  cross_entropy
}
train { global_batch = 144  seq_len = seq  steps = 2  optimizer = adamw(lr = 1e-3) }
"""


def _tiny(mesh: str, path: str = "net.scale"):
    return check_text(MODEL + "mesh {\n" + mesh + "\n}\n", path)


def _errors(mesh: str, path: str = "net.scale") -> list:
    with pytest.raises(ScaleError) as info:
        _tiny(mesh, path)
    return [(d.code, d.span.line, d.span.col, d.message) for d in info.value.diagnostics if d.severity == "error"]


def _seventy(extra: str):
    assert SEVENTY.count(MESH) == 1
    return check_text(SEVENTY.replace(MESH, MESH + extra), "llama3_70b.scale")


def test_a_file_without_a_network_is_what_it_was():
    spec = check_text(SEVENTY, "llama3_70b.scale")
    assert spec.cluster.fabric is None and spec.cluster.topology is None and spec.plan.placement is None
    assert "placement" not in spec.plan.to_json(spec.cluster) and "placement" not in spec.plan.describe()


def test_the_issues_mesh_checks_clean_and_reaches_the_cluster_and_the_plan():
    """fabric = roce, a fat-tree of racks of 2 nodes in pods of 4 under a 1:7 top tier, placement = auto: no
    diagnostic, the Cluster holds them, the Plan the placement, plan.json and describe() show it."""
    spec = _seventy("  fabric = roce\n  topology = fat_tree(nodes_per_leaf = 2, nodes_per_pod = 4, "
                    "oversubscription = 7)\n  placement = auto\n")
    assert spec.warnings == ()
    assert spec.cluster.fabric == "roce"
    assert spec.cluster.topology == FatTree(nodes_per_leaf=2, nodes_per_pod=4, oversubscription=(1.0, 7.0))
    assert spec.plan.placement == "auto" and spec.plan.to_json(spec.cluster)["placement"] == "auto"
    assert spec.plan.describe().endswith("placement auto)")
    assert spec.cluster.with_nodes(4).topology == spec.cluster.topology  # the same fabric, fewer nodes


@pytest.mark.parametrize("text, want", [
    ("topology = fat_tree(nodes_per_leaf = 4, oversubscription = (3))", FatTree(nodes_per_leaf=4, oversubscription=3)),
    ("topology = fat_tree(2, 4, (2, 4))", FatTree(nodes_per_leaf=2, nodes_per_pod=4, oversubscription=(2.0, 4.0))),
    ("topology = rail_optimized(nodes_per_group = 4, pxn = false)", RailOptimized(nodes_per_group=4, pxn=False)),
    ("topology = torus(2, 2, 2)", Torus(2, 2, 2)),
    ("topology = torus(x = 8, wrap = false)", Torus(8, wrap=False)),
    ("topology = dragonfly(groups = 2, nodes_per_group = 4, nodes_per_switch = 2, global_oversubscription = 2)",
     Dragonfly(groups=2, nodes_per_group=4, nodes_per_switch=2, global_oversubscription=2.0)),
    ("topology = torus(8)  scale_up = 4", Torus(8, scale_up=4)),
    # scale_up alone: one non-blocking level over every node, under NVLink domains of two nodes
    ("scale_up = 16", FatTree(nodes_per_leaf=8, scale_up=16)),
])
def test_each_topology_is_read_into_the_cluster(text, want):
    spec = _seventy(f"  {text}\n")
    assert spec.cluster.topology == want and spec.warnings == ()


def test_a_slurm_topology_conf_beside_the_file(tmp_path):
    (tmp_path / "topology.conf").write_text("# two racks\nSwitchName=r0 Nodes=gpu[01-04]\n"
                                            "SwitchName=r1 Nodes=gpu[05-08]\nSwitchName=top Switches=r[0-1]\n")
    spec = check_text(SEVENTY.replace(MESH, MESH + '  topology = from("topology.conf", oversubscription = 2)\n'),
                      str(tmp_path / "a.scale"))
    t = spec.cluster.topology
    assert isinstance(t, SwitchTree) and t.hosts[0] == "gpu01" and t.levels(8) == ("scale_up", "leaf", "top")
    assert t.crossing(0, 8 * 4, 8).share == 0.5  # node 0 and node 4: racks r0 and r1, through the 1:2 top


def test_a_topology_conf_that_is_no_tree_is_refused_at_the_call_naming_its_lines(tmp_path):
    (tmp_path / "topology.conf").write_text("SwitchName=r0 Nodes=n[1-4]\nSwitchName=r1 Nodes=n4\n"
                                            "SwitchName=top Switches=r[0-2]\n")
    errors = _errors('  axis dp = 4  nodes = 4  devices_per_node = 1\n  topology = from("topology.conf")',
                     str(tmp_path / "a.scale"))
    assert [(c, line, col) for c, line, col, _ in errors] == [("E0321", 13, 19)] * 2
    assert [m for *_, m in errors] == ["topology.conf:2: node n4 hangs off two switches",
                                       "topology.conf:3: switch r2 is listed under top but never described"]
    missing = _errors('  axis dp = 4  nodes = 4  devices_per_node = 1\n  topology = from("nope.conf")',
                      str(tmp_path / "a.scale"))
    assert [(c, m) for c, _, _, m in missing] == [("E0321", "topology file nope.conf: no such file or directory")]


@pytest.mark.parametrize("mesh, want", [
    # a pod that does not divide the nodes: at nodes_per_pod
    ("nodes = 6  topology = fat_tree(nodes_per_leaf = 1, nodes_per_pod = 4)",
     [("E0320", "4)", "a pod of 4 nodes does not divide the 6 nodes")]),
    # a torus whose product is not the node count: at the call
    ("nodes = 6  topology = torus(2, 2)", [("E0320", "torus", "2 × 2 × 1 = 4 nodes, but the cluster has 6")]),
    ("nodes = 6  topology = dragonfly(groups = 4, nodes_per_group = 2)",
     [("E0320", "4,", "4 groups of 2 nodes are not the cluster's 6 nodes")]),
    ("nodes = 6  topology = rail_optimized(nodes_per_group = 4)",
     [("E0320", "4)", "a rail group of 4 nodes does not divide the 6 nodes")]),
    # 1:7 written as the fraction 1/7 (below 1), and two ratios for one uplink level
    ("nodes = 6  topology = fat_tree(nodes_per_leaf = 2, oversubscription = 0.14)",
     [("E0320", "0.14", "ratio 0.14 at level 1 is below 1 (1 is non-blocking, 7 is 1:7)")]),
    ("nodes = 6  topology = fat_tree(nodes_per_leaf = 2, oversubscription = (1, 7))",
     [("E0320", "(1, 7)", "2 ratios given for 1 uplink levels")]),
    ("nodes = 6  topology = dragonfly(groups = 2, nodes_per_group = 3, nodes_per_switch = 2)",
     [("E0320", "2)", "a switch of 2 nodes does not divide the 3 nodes of a group")]),
    ("nodes = 6  topology = rail_optimized(nodes_per_group = 3, nodes_per_pod = 4)",
     [("E0320", "3,", "a rail group of 3 nodes does not divide the 4 nodes of a pod"),
      ("E0320", "4)", "a pod of 4 nodes does not divide the 6 nodes")]),
    # an NVL72 domain over single-device nodes spans 72 of them: at scale_up
    ("nodes = 6  scale_up = 72", [("E0320", "72", "a scale-up domain spans 72 nodes, which does not divide the "
                                                  "6 nodes")]),
])
def test_every_impossible_shape_is_refused_at_its_argument(mesh, want):
    line = "  " + mesh
    assert _errors("  axis dp = 6  devices_per_node = 1\n" + line) == [
        (code, 13, line.index(anchor) + 1, message) for code, anchor, message in want]


def test_a_scale_up_domain_that_neither_divides_nor_spans_nodes():
    line = "  nodes = 2  scale_up = 3"
    assert _errors("  axis dp = 8  devices_per_node = 4\n" + line) == [
        ("E0320", 13, line.index("3") + 1, "a scale-up domain of 3 devices neither divides nor is a multiple of "
                                           "devices_per_node = 4")]


@pytest.mark.parametrize("placement, want", [
    ("order(tp, tp, dp)", [("E0322", 13, 25, "axis tp is named 2 times"),
                           ("E0322", 13, 15, "order(...) leaves out pp")]),
    ("order(tp, pp, cp, dp)", [("E0322", 13, 29, "the mesh has no axis cp")]),
    ("order(tp, dp)", [("E0322", 13, 15, "order(...) leaves out pp")]),
    ("random", [("E0111", 13, 15, "unknown placement `random`")]),
    ("order(tp = 1)", [("E0112", 13, 21, "`order(...)` takes the mesh's axis names, innermost first")]),
    ("4", [("E0112", 13, 15, "`placement` must be `auto` or `order(...)`")]),
    ("auto(tp)", [("E0113", 13, 20, "`auto` takes no arguments")]),
    ("orde(tp, pp, dp)", [("E0111", 13, 15, "unknown placement `orde`")]),
    ("order()", [("E0112", 13, 15, "`order(...)` takes the mesh's axis names, innermost first")]),
])
def test_a_placement_that_is_no_order_of_the_axes_is_refused(placement, want):
    assert _errors(f"  axis dp = 2  axis pp = 2  axis tp = 2  nodes = 2  devices_per_node = 4\n"
                   f"  placement = {placement}") == want


def test_an_order_reaches_the_plan_and_the_search_keeps_only_auto():
    spec = _seventy("  placement = order(tp, dp, pp)\n")
    assert spec.plan.placement == ("tp", "dp", "pp") and spec.warnings == ()
    assert spec.plan.to_json()["placement"] == ["tp", "dp", "pp"]
    assert "placement order(tp, dp, pp)" in spec.plan.describe()
    assert Space(spec, {}).base.placement is None  # the candidates' axes are not the file's
    assert Space(_seventy("  placement = auto\n"), {}).base.placement == "auto"
    assert _seventy("  placement = auto()\n").plan.placement == "auto"  # as `optimizer = adamw` is adamw()


@pytest.mark.parametrize("mesh, code, line", [
    ("axis dp = 2 axis tp = 2  nodes = 1  devices_per_node = 4\n  fabric = ib", "W0320", 13),
    ("axis dp = 2 axis tp = 2  nodes = 1  devices_per_node = 4\n  topology = fat_tree(nodes_per_leaf = 1)",
     "W0320", 13),
    ("axis dp = 8  nodes = 2  devices_per_node = 4\n  scale_up = 4", "W0320", 13),
    # one axis larger than 1: every order is the identity
    ("axis dp = 8  axis tp = 1  nodes = 2  devices_per_node = 4\n  placement = order(tp, dp)", "W0321", 13),
    ("axis dp = 8  nodes = 2  devices_per_node = 4\n  placement = auto", "W0321", 13),
    # one node, one NVLink domain: every pair of ranks on the same link
    ("axis dp = 2 axis tp = 2  nodes = 1  devices_per_node = 4\n  placement = auto", "W0321", 13),
])
def test_a_setting_with_no_effect_warns_at_it(mesh, code, line):
    spec = _tiny("  " + mesh)
    assert [(w.code, w.span.line) for w in spec.warnings] == [(code, line)]


@pytest.mark.parametrize("mesh", [
    # auto orders a torus's nodes even for one axis (a ring of single hops)
    "axis dp = 8  nodes = 8  devices_per_node = 1\n  topology = torus(2, 2, 2)  placement = auto",
    # two NVLink islands in one node: placement decides which pairs share one
    "axis dp = 2 axis tp = 2  nodes = 1  devices_per_node = 4\n  scale_up = 2  placement = order(tp, dp)",
    # NVL72 over trays of 4
    "axis dp = 72  nodes = 18  devices_per_node = 4\n  scale_up = 72  fabric = ib",
])
def test_a_setting_with_an_effect_does_not_warn(mesh):
    assert _tiny("  " + mesh).warnings == ()


@pytest.mark.parametrize("kind", ["b200", "gb200"])
def test_blackwell_devices_and_their_overrides(kind):
    spec = check_text(SEVENTY.replace("device = h100", f"device = {kind}"), "a.scale")
    device = spec.cluster.device
    assert device.kind == kind and device.peak_tflops == DEVICES[kind].peak_tflops > DEVICES["h100"].peak_tflops
    assert device.intra_node_gbps == 900.0 and device.inter_node_gbps == 50.0 and device.hbm_gbps == 8000.0
    over = check_text(SEVENTY.replace("device = h100", f"device = {kind}\n  peak_tflops = 2000  memory_gb = 192"),
                      "a.scale").cluster.device
    assert (over.peak_tflops, over.memory_gb) == (2000.0, 192.0)
    assert dataclasses.replace(over, peak_tflops=device.peak_tflops, memory_gb=device.memory_gb) == device


def test_a_refused_topology_does_not_hide_the_other_mesh_errors_nor_enumerate_a_huge_cluster():
    """Collect, then report: a pod that does not divide 10^12 + 39 nodes (a prime: its hint is found from the
    divisors up to a bound, not by counting to it) and axes that do not hold the machines, both in one run."""
    errors = _errors("  axis dp = 8  nodes = 1000000000039  devices_per_node = 8\n"
                     "  topology = fat_tree(nodes_per_leaf = 1, nodes_per_pod = 1000)")
    assert [c for c, *_ in errors] == ["E0320", "E0301"]


def test_a_topology_conf_of_other_nodes_is_refused_at_the_call(tmp_path):
    """A valid tree of 4 nodes for a cluster of 6, and two trees with no switch joining them."""
    (tmp_path / "topology.conf").write_text("SwitchName=a Nodes=n[1-2]\nSwitchName=b Nodes=n[3-4]\n")
    line = '  topology = from("topology.conf")'
    errors = _errors("  axis dp = 6  nodes = 6  devices_per_node = 1\n" + line, str(tmp_path / "a.scale"))
    assert [(c, ln, col) for c, ln, col, _ in errors] == [("E0320", 13, line.index("from") + 1)] * 2
    assert [m for *_, m in errors] == ["the switch tree holds 4 nodes, the cluster 6",
                                       "the switches form 2 trees (a, b) with no switch joining them"]
