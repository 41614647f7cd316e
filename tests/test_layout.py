"""compiler/layout/groups.py: the process groups of a mesh and their ranks; compiler/layout/cluster.py: the tier
each crosses on a cluster."""
from __future__ import annotations

import itertools
import math

import pytest

from compiler.layout.cluster import Cluster, crosses
from compiler.layout.devices import DEVICES
from compiler.layout.groups import canonical, expand, groups


def _meshes(sizes=(1, 2, 3, 4), most=16):
    for k in range(1, 5):
        for names in itertools.permutations(("dp", "pp", "tp", "ep", "cp"), k):
            for ss in itertools.product(sizes, repeat=k):
                if math.prod(ss) <= most:
                    yield tuple(zip(names, ss))


def test_each_group_partitions_the_ranks_and_varies_only_along_its_axes():
    for axes in _meshes(sizes=(1, 2, 3), most=12):
        world = math.prod(n for _, n in axes)
        coords = [dict(zip((a for a, _ in axes), c)) for c in itertools.product(*(range(n) for _, n in axes))]
        for g in groups(axes):
            rows = g.rows()
            assert sorted(r for row in rows for r in row) == list(range(world))
            for row in rows:
                assert row == g.row_of(row[-1])
                assert row == tuple(sorted(row))  # ordered along the axes in mesh order: row-major ranks ascend
                fixed = {a: v for a, v in coords[row[0]].items() if a not in g.axes}
                assert all({a: coords[r][a] for a in fixed} == fixed for r in row)
                assert len(row) == g.size


def test_a_groups_canonical_pattern_has_its_rows_in_their_order():
    """groups.canonical (what links.py keeps a group's network price by, across meshes): the same rows, each in the
    same order, and the same pattern for the same rows of two meshes of different shapes."""
    shorter = 0
    for axes in _meshes(sizes=(1, 2, 3), most=12):
        for g in groups(axes):
            c = canonical(g.pattern)
            assert expand(c, g.world) == g.rows()
            assert all(n > 1 for _, n in c)
            shorter += len(c) < len(g.pattern)
    assert shorter > 100
    one = groups((("dp", 4), ("cp", 4), ("tp", 2)))["dp×cp"]
    other = groups((("dp", 16), ("tp", 2)))["dp"]
    assert one.pattern != other.pattern and canonical(one.pattern) == canonical(other.pattern) == ((2, 16),)


def test_the_folded_groups_are_named_as_the_cost_model_and_the_runtime_read_them():
    g = groups((("dp", 2), ("tp", 2), ("cp", 2), ("ep", 2)))
    assert g["dp×ep"].axes == ("dp", "ep") and g["dp×ep"].rows()[0] == (0, 1, 8, 9)
    assert g["dp×cp"].axes == ("dp", "cp") and g["dp×cp"].size == 4
    assert g["dp×cp×ep"].axes == ("dp", "cp", "ep") and g["dp×cp×ep"].rows() == ((0, 1, 2, 3, 8, 9, 10, 11),
                                                                                  (4, 5, 6, 7, 12, 13, 14, 15))
    two_nodes = Cluster(2, 8, DEVICES["h100"])
    assert g["batch"].rows() == g["dp×cp×ep"].rows()
    assert two_nodes.crosses(g["batch"]) == two_nodes.crosses(g["dp×cp×ep"])
    assert g["dense"].rows() == g["batch"].rows() and g["experts"].rows() == g["dp×cp"].rows()
    # a folded group of the cost model exists where the mesh has its axes; the experts' only under cp and ep
    h = groups((("dp", 4), ("ep", 2)))
    assert "dp×cp" not in h and "dp×cp×ep" not in h and "experts" not in h
    assert h["data"].rows() == h["batch"].rows() == h["dp×ep"].rows() and g["data"].rows() == g["dp×ep"].rows()
    assert "dense" not in groups((("ep", 2), ("tp", 4)))
    assert [n for n, _ in h.contract()] == ["dp", "ep", "batch", "dense"]


@pytest.mark.parametrize("per_node", [4, 6])
def test_a_group_crosses_nodes_exactly_when_some_group_has_ranks_on_two(per_node):
    """The tier rule (aligned blocks of the outermost axis's extent) is exact for groups without axes of size 1;
    with one (the cost model's folded groups keep them, as step_time.links always did) it can only say crosses
    where no group does, never the other way."""
    for axes in _meshes():
        world = math.prod(n for _, n in axes)
        if world % per_node:
            continue
        cluster = Cluster(world // per_node, per_node, DEVICES["h100"])
        for g in groups(axes):
            exact = any(len({r // per_node for r in row}) > 1 for row in g.rows())
            if all(n > 1 for _, n in g.pattern):
                assert cluster.crosses(g) == exact, (axes, per_node, g.name)
            else:
                assert cluster.crosses(g) or not exact, (axes, per_node, g.name)
    assert crosses(((1, 6),), 8) and not crosses(((1, 4),), 8) and not crosses(((4, 1),), 8)


def test_the_runtime_expands_the_contract_to_the_layouts_rows():
    """runtime.mesh.expand gives Group.rows from the patterns Parallel.groups carries."""
    from runtime import mesh
    for axes in _meshes(sizes=(1, 2, 3), most=12):
        g = groups(axes)
        world = math.prod(n for _, n in axes)
        for name, pattern in g.contract():
            assert mesh.expand(pattern, world) == [list(r) for r in g[name].rows()]


def test_the_runtimes_mesh_rows_are_the_layouts():
    """The DeviceMesh's groups (runtime.mesh.rows over its rank grid) are the Layout's axis groups, in order."""
    from types import SimpleNamespace

    import torch

    from runtime.mesh import rows
    for axes in _meshes(sizes=(1, 2, 3), most=12):
        grid = torch.arange(math.prod(n for _, n in axes)).reshape(*(n for _, n in axes))
        fake = SimpleNamespace(mesh=grid, mesh_dim_names=tuple(a for a, _ in axes))
        g = groups(axes)
        for a, _ in axes:
            assert rows(fake, (a,)) == [list(r) for r in g[a].rows()]


def test_the_cluster_prices_a_group_at_the_tier_it_crosses():
    """compiler/layout/cluster.py: inside a node the device's bandwidth × its intra_node_efficiency, between nodes
    the figure as given; the step-time model's links read them per group."""
    from types import SimpleNamespace

    from compiler.cost.links import links
    from compiler.layout import cluster
    a100 = DEVICES["a100"]
    c = cluster.Cluster(2, 8, a100)
    assert c.world_size == 16
    g = groups((("dp", 2), ("tp", 8)))
    assert not c.crosses(g["tp"]) and c.crosses(g["dp"])
    assert c.tier(g["tp"]).gbps == a100.intra_node_gbps * a100.intra_node_efficiency
    assert c.tier(g["dp"]) == cluster.Tier("inter_node", a100.inter_node_gbps, a100.inter_node_latency_us)
    plan = SimpleNamespace(axes=(("dp", 2), ("tp", 8)))
    lk = links(plan, c)
    assert lk["tp"].gbps == c.tier(g["tp"]).gbps and not lk["tp"].crosses_nodes
    assert lk["dp"].gbps == a100.inter_node_gbps and lk["dp"].crosses_nodes and lk["dp"].size == 2
    # the same mesh on one node of 16: dp's groups stay inside it
    one = cluster.Cluster(1, 16, a100)
    assert not one.crosses(g["dp"]) and links(plan, one)["dp"].gbps == c.tier(g["tp"]).gbps
    with pytest.raises(ValueError, match="hold 16 devices"):  # a plan of another world size is refused
        links(plan, c.with_nodes(1))
