"""Contention (compiler/layout/contention.py): the groups of one kind run their collective at the same moment, and
those whose flows leave by the same uplink share it. Each figure below is derived by hand in its comment.

Uplink capacity is counted in NICs: a switch domain of D devices under a level whose per-device share is s (a
fat-tree's 1/o above an o:1 uplink) carries D·s NICs' worth, split equally among the flows leaving by it; a flow
never runs above its NIC."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from compiler.check import check_path
from compiler.cli import main
from compiler.cost import links as LK
from compiler.cost import network as N
from compiler.layout.cluster import Cluster
from compiler.layout.contention import contention
from compiler.layout.groups import expand, groups
from compiler.layout.topology import Dragonfly, FatTree, Torus

ROOT = Path(__file__).resolve().parents[1]
H100 = check_path(str(ROOT / "samples" / "llama3_8b.scale")).cluster.device


def _cluster(nodes: int, topology, fabric="ib") -> Cluster:
    return Cluster(nodes, 8, H100, fabric=fabric, topology=topology)


def _ring_busbw(cluster, rows) -> float:
    p = N.price_on(cluster, "all_reduce", 8 * 2 ** 30, rows)
    return next(a for a in p.algorithms if a.name == "ring").busbw_gbps


def test_two_groups_on_one_leaf_uplink_get_half_of_one_alone():
    """Leaves of one node (8 devices) under 1:8 uplinks: each leaf's uplink carries 8 / 8 = 1 NIC. One 2-rank group
    from node 0 to node 1 is one flow out of each leaf: a whole NIC. A second group beside it (ranks 1 and 9) puts
    a second flow on the same two uplinks: half a NIC each. (The topology's share alone said 1/8 for both.)"""
    cluster = _cluster(4, FatTree(nodes_per_leaf=1, oversubscription=8))
    alone = N.price_on(cluster, "all_reduce", 8 * 2 ** 30, ((0, 8),))
    both = N.price_on(cluster, "all_reduce", 8 * 2 ** 30, ((0, 8), (1, 9)))
    assert (alone.group.share, alone.group.sharing) == (1.0, 1)
    assert (both.group.share, both.group.sharing) == (0.5, 2)
    assert _ring_busbw(cluster, ((0, 8),)) / _ring_busbw(cluster, ((0, 8), (1, 9))) == pytest.approx(2, rel=1e-3)
    assert N.span(cluster, (0, 8)).share == pytest.approx(1 / 8)  # every rank crossing at once: the old figure


def test_groups_in_different_pods_do_not_contend():
    """Pods of two one-node leaves, leaf uplinks 1:8 (1 NIC each), a 1:1 top. A group inside pod 0 (node 0 to 1) and
    one inside pod 1 (node 2 to 3) leave by different leaf uplinks: each a whole NIC, as alone. Two groups that
    both cross the 1:1 top from pod 0 to pod 1 (ranks 0 and 8, on nodes 0 and 1, to nodes 2 and 3) share the pod's
    uplink, 16 devices / (8 × 1) = 2 NICs, with 2 flows: shared by 2, yet a whole NIC each (and each leaf uplink,
    1 NIC, holds one flow)."""
    cluster = _cluster(4, FatTree(nodes_per_leaf=1, nodes_per_pod=2, oversubscription=(8, 1)))
    apart = contention(cluster.topology, ((0, 8), (16, 24)), 4, 8)
    assert [(c.share, c.sharing, c.level) for c in apart] == [(1.0, 1, "spine")] * 2
    across = contention(cluster.topology, ((0, 16), (8, 24)), 4, 8)
    assert [(c.share, c.sharing, c.level) for c in across] == [(1.0, 2, "top")] * 2


def _mesh(axes: tuple, cluster: Cluster) -> dict:
    return LK.links(SimpleNamespace(axes=axes, placement=None), cluster)


def test_a_one_in_seven_top_with_all_sixteen_dp_groups_crossing():
    """dp 8 × pp 2 × tp 8 on 16 nodes of 8: leaves of 2 nodes (1:1 uplinks), pods of 8 nodes, a 1:7 top tier.
    dp group (p, t) holds ranks t + 8p + 16d, d = 0..7, on nodes 2d + p: its ring runs p, p+2, .., p+14, four nodes
    in each pod, so it leaves each pod once. The 16 dp groups (2 pp × 8 tp) put 16 flows on each pod's uplink,
    which carries 64 devices / 7 = 64/7 NICs: 64 / (7 × 16) = 4/7 of a NIC per flow. Each leaf (nodes 2d, 2d+1, 16
    devices, 16 NICs up) holds one rank of each of the 16 groups, each leaving once: 16 flows, a whole NIC each.
    So 4/7, limited at the top, shared by 16 groups; every rank crossing at once would have said 1/7.
    The ring's busbw (k = 1 rank per node): NIC 50 GB/s × ib's 0.94 × 4/7 = 26.86 GB/s."""
    axes = (("dp", 8), ("pp", 2), ("tp", 8))
    cluster = _cluster(16, FatTree(nodes_per_leaf=2, nodes_per_pod=8, oversubscription=7))
    rows = groups(axes)["dp"].rows()
    assert len(rows) == 16
    got = contention(cluster.topology, rows, 16, 8)
    assert {(round(c.share, 12), c.sharing, c.flows, c.level) for c in got} == {(round(4 / 7, 12), 16, 16, "top")}
    assert got[0].capacity == pytest.approx(64 / 7)
    dp = _mesh(axes, cluster)["dp"]
    span = dp.network[0]
    assert (span.tier, span.sharing, span.share) == ("top", 16, pytest.approx(4 / 7))
    assert _ring_busbw(cluster, rows) == pytest.approx(H100.inter_node_gbps * 0.94 * 4 / 7, rel=1e-3)
    assert "its slowest uplink shared by 16 groups" in dp.describe()
    # at 1:1 the same 16 flows over 64 NICs' worth: no contention
    flat = _cluster(16, FatTree(nodes_per_leaf=2, nodes_per_pod=8, oversubscription=1))
    assert {c.share for c in contention(flat.topology, rows, 16, 8)} == {1.0}


def test_every_rank_crossing_gives_the_topologys_own_share():
    """pp 4 × dp 2 × tp 8 on 8 nodes, leaves of 2 nodes, a 1:7 top (llama3_70b's mesh): pp's 16 rings each leave
    every leaf once, 16 flows over a leaf's 16 devices / 7: 1/7, what the topology says when every rank crosses."""
    axes = (("pp", 4), ("dp", 2), ("tp", 8))
    cluster = _cluster(8, FatTree(nodes_per_leaf=2, oversubscription=7))
    rows = groups(axes)["pp"].rows()
    assert {round(c.share, 12) for c in contention(cluster.topology, rows, 8, 8)} == {round(1 / 7, 12)}
    assert {round(N.span(cluster, r).share, 12) for r in rows} == {round(1 / 7, 12)}


def test_a_dragonflys_global_links_are_shared_the_same_way():
    """Two dragonfly groups of 2 nodes, global links 1:8: a group's global uplink carries 16 devices / 8 = 2 NICs.
    Three rings from group 0 to group 1 (ranks 0, 1, 2 on node 0 to ranks 16, 17, 18 on node 2) put 3 flows on it:
    2/3 of a NIC each; two get a whole NIC each."""
    topology = Dragonfly(groups=2, nodes_per_group=2, global_oversubscription=8)
    three = contention(topology, ((0, 16), (1, 17), (2, 18)), 4, 8)
    assert {(round(c.share, 12), c.sharing, c.level) for c in three} == {(round(2 / 3, 12), 3, "global")}
    assert {c.share for c in contention(topology, ((0, 16), (1, 17)), 4, 8)} == {1.0}


def test_a_torus_keeps_the_share_of_every_rank_crossing():
    """A torus's switches do not nest: contention says nothing and the hop share stands, shared by every group."""
    cluster = _cluster(4, Torus(4))
    assert contention(cluster.topology, ((0, 8),), 4, 8) is None
    rows = ((0, 16), (1, 17))
    p = N.price_on(cluster, "all_reduce", 2 ** 30, rows)
    assert p.group.share == N.span(cluster, rows[0]).share == 0.5 and p.group.sharing == 2


def test_llama3_405b_dp_rings_leave_each_pod_once():
    """samples/llama3_405b.scale: dp 128 × pp 16 × tp 8 on 2,048 nodes, leaves of 2 nodes, 8 pods of 256 nodes under
    a 1:7 aggregation tier (Llama 3's, "The Llama 3 Herd of Models" §3.3.1). A dp ring (one rank per node, 16 nodes
    apart) leaves each pod once: 128 groups, 128 flows over a pod uplink of 2,048 / 7 = 292.6 NICs, 2.3 NICs each,
    so the NIC limits it (the leaf uplinks: 16 flows over 16 NICs). Every rank crossing at once said 1/7."""
    spec = check_path(str(ROOT / "samples" / "llama3_405b.scale"))
    axes, cluster = tuple(spec.plan.axes), spec.cluster
    rows = expand(groups(axes)["dp"].pattern, cluster.world_size)
    got = contention(cluster.topology, rows, cluster.nodes, cluster.devices_per_node)
    assert {(c.share, c.sharing, c.level) for c in got} == {(1.0, 16, "spine")}  # the leaf's: 16 flows, 16 NICs
    assert math.isclose(N.span(cluster, rows[0]).share, 1 / 7)


def test_scalec_network_states_the_contention_it_assumed(tmp_path, capsys):
    """`scalec network --group dp` on the mesh of the 1:7 case above, written as a file: the text and --json say how
    many groups share the uplink that limits a dp group (16) and the share that leaves each (4/7); one group
    alone (--ranks) shares with none."""
    text = (ROOT / "samples" / "llama3_8b.scale").read_text()
    mesh = ("mesh {\n  axis dp = 8\n  axis pp = 2\n  axis tp = 8\n  nodes = 16\n  devices_per_node = 8\n"
            "  device = h100\n  topology = fat_tree(nodes_per_leaf = 2, nodes_per_pod = 8, oversubscription = 7)\n}")
    path = tmp_path / "dp16.scale"
    path.write_text(re.sub(r"global_batch = \d+", "global_batch = 1024",
                           re.sub(r"mesh \{.*?\n\}", mesh, text, count=1, flags=re.S)))
    assert main(["network", str(path), "--group", "dp"]) == 0
    out = capsys.readouterr().out
    assert ("contention: one of 16 groups run at once; 16 groups share the uplink that limits it, 0.571 of a NIC "
            "per flow") in out
    assert main(["network", str(path), "--group", "dp", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert list(got) == ["op", "ranks", "bytes", "algorithms", "chosen", "sharing"] and got["sharing"] == 16
    assert main(["network", str(path), "--ranks", "16"]) == 0
    assert "contention: alone; it alone uses the uplink that limits it, a whole NIC per flow" in \
        capsys.readouterr().out
