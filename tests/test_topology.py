"""compiler/layout/topology.py: the level two ranks' traffic crosses, the per-device share there, every impossible
shape as a Problem, and Slurm's topology.conf read into a switch tree."""
from __future__ import annotations

import pytest

from compiler.layout.topology import (Dragonfly, FatTree, RailOptimized, SlurmError, SwitchTree, Torus,
                                      expand_hostlist, parse_slurm, snake)


def _names(topology, per_node, pairs):
    return [topology.crossing(a, b, per_node).name for a, b in pairs]


def test_fat_tree_levels_and_the_oversubscribed_top():
    """Leaves of 2 nodes, pods of 4, 1:7 above the spines: 1/7 of the leaf's per-device bandwidth at the top."""
    t = FatTree(nodes_per_leaf=2, nodes_per_pod=4, oversubscription=7)
    assert t.levels(8) == ("scale_up", "leaf", "spine", "top")
    assert t.oversubscription == (1.0, 7.0)
    # rank 1: same node; 9: node 1 (same leaf); 17: node 2 (other leaf, same pod); 40: node 5 (other pod)
    assert _names(t, 8, [(0, 1), (0, 9), (0, 17), (0, 40), (39, 40)]) == ["scale_up", "leaf", "spine", "top", "leaf"]
    assert [t.crossing(0, r, 8).share for r in (1, 9, 17)] == [1.0, 1.0, 1.0]
    assert t.crossing(0, 40, 8).share == pytest.approx(1 / 7)
    both = FatTree(nodes_per_leaf=2, nodes_per_pod=4, oversubscription=(2, 4))
    assert [both.share(i, 8) for i in range(4)] == [1.0, 1.0, 0.5, 0.125]


def test_a_scale_up_domain_over_several_nodes():
    """GB200 NVL72: 72 GPUs in one NVLink domain over 18 trays of 4; the 73rd GPU is on the network."""
    t = FatTree(nodes_per_leaf=36, oversubscription=1, scale_up=72)
    assert t.levels(4) == ("scale_up", "leaf", "top")
    assert _names(t, 4, [(0, 3), (0, 71), (0, 72), (71, 72), (0, 36 * 4)]) == [
        "scale_up", "scale_up", "leaf", "leaf", "top"]
    assert t.problems(36, 4) == ()


def test_a_scale_up_domain_inside_a_node():
    """Two NVLink islands of 4 in a node of 8: between them, the node's own level, below the network."""
    t = FatTree(nodes_per_leaf=2, scale_up=4)
    assert t.levels(8) == ("scale_up", "node", "leaf", "top")
    assert _names(t, 8, [(0, 3), (0, 4), (0, 8), (0, 16)]) == ["scale_up", "node", "leaf", "top"]


def test_rails_with_and_without_pxn():
    """Same-index devices of a rail group meet on their rail leaf; other pairs only with PXN's NVLink hop."""
    pxn = RailOptimized(nodes_per_group=4)
    direct = RailOptimized(nodes_per_group=4, pxn=False, oversubscription=2)
    pairs = [(0, 8), (0, 9), (0, 32)]  # node 0 device 0 with node 1 device 0, node 1 device 1, node 4 device 0
    assert _names(pxn, 8, pairs) == ["rail", "rail", "spine"]
    assert _names(direct, 8, pairs) == ["rail", "spine", "spine"]
    assert direct.crossing(0, 9, 8).share == 0.5
    assert pxn.domains(8) is not None and direct.domains(8) is None


def test_torus_hops_wrap_and_share():
    t = Torus(4, 2, 2)
    assert t.coords(13) == (1, 1, 1)
    assert t.hops(0, 3) == (1, 0, 0)  # wraps around x
    assert Torus(4, 2, 2, wrap=False).hops(0, 3) == (3, 0, 0)
    assert t.levels(1) == ("scale_up", "1 hop", "2 hops", "3 hops", "4 hops")
    far = t.crossing(0, 14, 1)  # (0,0,0) -> (2,1,1)
    assert (far.name, far.hops, far.share) == ("4 hops", (2, 1, 1), 0.5)
    spread = t.crossing(0, 13, 1)  # (1,1,1): three hops, one per dimension, each link shared by one flow
    assert (spread.name, spread.share) == ("3 hops", 1.0)


def test_torus_snakes_are_rings_of_single_hops():
    for dims in ((2, 2, 1), (2, 2, 2), (4, 2, 1), (4, 4, 2), (3, 2, 2)):
        t = Torus(*dims)
        nodes = dims[0] * dims[1] * dims[2]
        for order in t.node_orders(nodes)[1:]:
            assert sorted(order) == list(range(nodes))
            assert all(sum(t.hops(a, b)) == 1 for a, b in zip(order, order[1:]))
    assert snake([2, 3]) == [(0, 0), (1, 0), (1, 1), (0, 1), (0, 2), (1, 2)]


def test_dragonfly_levels():
    t = Dragonfly(groups=4, nodes_per_group=8, nodes_per_switch=2, global_oversubscription=2)
    assert t.levels(4) == ("scale_up", "switch", "group", "global")
    assert _names(t, 4, [(0, 4), (0, 8), (0, 32)]) == ["switch", "group", "global"]
    assert t.crossing(0, 32, 4).share == 0.5
    assert t.problems(32, 4) == ()


def test_the_level_is_the_scale_up_domains_then_the_node_then_the_network():
    """Topology.level compares the scale-up domains inline (placing 16,384 ranks asks it millions of times): the
    same level as the definition (the domains' ids: a domain of at least a node counts ranks node·per_node + local
    in blocks of its size, a smaller one a node's locals) for every pair of ranks of small clusters of each kind."""
    import random

    def domain(loc, su, per_node):
        node, local = loc
        return ((node * per_node + local) // su, 0) if su >= per_node else (node, local // su)

    def defined(t, a, b, per_node):
        su = t.scale_up_devices(per_node)
        if domain(a, su, per_node) == domain(b, su, per_node):
            return 0
        if a[0] == b[0]:
            return 1
        return 1 + (1 if su < per_node else 0) + t.network_level(a, b)

    cases = [(FatTree(nodes_per_leaf=2, nodes_per_pod=4, oversubscription=7), 16, 8),
             (FatTree(nodes_per_leaf=36, scale_up=72), 36, 4), (FatTree(nodes_per_leaf=2, scale_up=4), 8, 8),
             (FatTree(nodes_per_leaf=2, scale_up=2), 8, 8),
             (RailOptimized(nodes_per_group=4, nodes_per_pod=8, pxn=False), 16, 8),
             (RailOptimized(nodes_per_group=4, scale_up=4), 8, 8), (Torus(2, 2, 2), 8, 4),
             (Dragonfly(groups=4, nodes_per_group=8, nodes_per_switch=2), 32, 4)]
    rng = random.Random(3)
    for t, nodes, per_node in cases:
        world = nodes * per_node
        pairs = [(rng.randrange(world), rng.randrange(world)) for _ in range(3000)]
        pairs += [(r, r + d) for r in range(0, world - 9, 7) for d in (1, per_node - 1, per_node, per_node + 1)]
        for x, y in pairs:
            a, b = divmod(x, per_node), divmod(y, per_node)
            assert t.level(a, b, per_node) == defined(t, a, b, per_node), (t, a, b)


@pytest.mark.parametrize("topology,nodes,per_node,fields", [
    (FatTree(nodes_per_leaf=5, nodes_per_pod=12), 32, 8, ["nodes_per_leaf", "nodes_per_pod"]),
    (FatTree(nodes_per_leaf=4, nodes_per_pod=8, oversubscription=(1, 0.5)), 32, 8, ["oversubscription"]),
    (FatTree(nodes_per_leaf=4, oversubscription=(1, 2, 3)), 32, 8, ["oversubscription"]),
    (FatTree(nodes_per_leaf=4, scale_up=12), 32, 8, ["scale_up"]),
    (FatTree(nodes_per_leaf=2, scale_up=72), 20, 4, ["scale_up"]),
    (Torus(4, 4, 2), 30, 8, ["torus"]),
    (Torus(4, 0, 2), 8, 8, ["y"]),
    (Dragonfly(groups=3, nodes_per_group=8), 32, 4, ["groups"]),
    (Dragonfly(groups=4, nodes_per_group=8, global_oversubscription=0.9), 32, 4, ["global_oversubscription"]),
    (RailOptimized(nodes_per_group=6), 32, 8, ["nodes_per_group"]),
    (FatTree(nodes_per_leaf=4), 0, 8, ["nodes"]),
])
def test_impossible_shapes_are_problems(topology, nodes, per_node, fields):
    problems = topology.problems(nodes, per_node)
    assert [p.field for p in problems] == fields
    assert all(p.message and p.hint for p in problems)


def test_possible_shapes_have_no_problems():
    assert FatTree(nodes_per_leaf=16, nodes_per_pod=256, oversubscription=7).problems(2048, 8) == ()
    assert Torus(4, 4, 4).problems(64, 4) == ()
    assert RailOptimized(nodes_per_group=32, nodes_per_pod=128, oversubscription=(1, 2)).problems(256, 8) == ()


def test_hostlists():
    assert expand_hostlist("node[001-003,7],gpu5") == ["node001", "node002", "node003", "node7", "gpu5"]
    assert expand_hostlist("r[1-2]n[08-09]") == ["r1n08", "r1n09", "r2n08", "r2n09"]
    with pytest.raises(ValueError):
        expand_hostlist("n[a-b]")


CONF = """
# two pods of two leaves, under one core switch
SwitchName=leaf0 Nodes=gpu[001-002]
SwitchName=leaf1 Nodes=gpu[003-004]
SwitchName=leaf2 Nodes=gpu[005-006] LinkSpeed=400
SwitchName=leaf3 Nodes=gpu[007-008]
SwitchName=spine0 Switches=leaf[0-1]
SwitchName=spine1 Switches=leaf[2-3]
SwitchName=core Switches=spine[0-1]
"""


def test_slurm_topology_conf():
    t = parse_slurm(CONF, oversubscription=4)
    assert isinstance(t, SwitchTree)
    assert t.hosts == tuple(f"gpu{i:03d}" for i in range(1, 9))
    assert t.chains[4] == ("leaf2", "spine1", "core")
    assert t.levels(8) == ("scale_up", "leaf", "spine", "top")
    assert _names(t, 8, [(0, 8), (0, 16), (0, 32), (40, 56)]) == ["leaf", "spine", "top", "spine"]
    assert t.crossing(0, 32, 8).share == 0.25
    assert t.domains(8) == ((0, 0, 1, 1, 2, 2, 3, 3), (0, 0, 0, 0, 1, 1, 1, 1))
    assert t.problems(8, 8) == ()
    assert [p.field for p in t.problems(16, 8)] == ["topology"]


def test_slurm_errors_name_their_lines():
    bad = ("SwitchName=a Nodes=n[1-2]\nSwitchName=b Nodes=n2\nSwitchName=top Switches=a,c\n"
           "Nodes=n9\nSwitchName=a Nodes=n7\n")
    with pytest.raises(SlurmError) as err:
        parse_slurm(bad)
    messages = {(p.field, p.message) for p in err.value.problems}
    assert ("line 2", "node n2 hangs off two switches") in messages
    assert ("line 3", "switch c is listed under top but never described") in messages
    assert ("line 5", "switch a is described twice") in messages
    assert any(f == "line 4" for f, _ in messages)
    split = parse_slurm("SwitchName=a Nodes=n1\nSwitchName=b Nodes=n2\n")
    assert [p.field for p in split.problems(2, 1)] == ["topology"]
    with pytest.raises(SlurmError):
        parse_slurm("SwitchName=a Switches=b\nSwitchName=b Switches=a Nodes=n1\n")
