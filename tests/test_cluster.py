"""compiler/layout/cluster.py: the machines are the Spec's Cluster, not the Plan's, so the same Spec can be planned
on another Cluster (the search, elastic re-planning): searched or costed on half its nodes, it gives what the file
written with that many nodes gives."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from compiler import search as SE
from compiler.candidates import Candidates
from compiler.check import check_text
from compiler.cost.step_time import Simulator
from compiler.layout.cluster import Cluster
from compiler.plan import Plan

ROOT = Path(__file__).resolve().parents[1]
LLAMA = (ROOT / "samples" / "llama3_8b.scale").read_text()  # 1 node × 8 H100, axis dp = 8


def _on_nodes(nodes: int) -> str:
    assert LLAMA.count("  nodes = 1\n") == 1
    return LLAMA.replace("  nodes = 1\n", f"  nodes = {nodes}\n")


@pytest.fixture(scope="module")
def two_and_one():
    """llama3_8b written on two nodes (16 H100, its dp = 8 the search's to replace), and as the sample writes it
    on one."""
    two = check_text(_on_nodes(2), "llama3_8b.scale", cluster_only=True)
    one = check_text(LLAMA, "llama3_8b.scale", cluster_only=True)
    return two, one


def test_the_cluster_is_the_specs_and_the_plan_holds_no_machine(two_and_one):
    two, one = two_and_one
    assert two.cluster == Cluster(2, 8, one.cluster.device, power=one.cluster.power) and one.cluster.world_size == 8
    assert two.plan.world_size == 16 and two.plan.axes == (("dp", 16),)  # cluster_only: dp over every device
    assert not {"nodes", "devices_per_node"} & {f.name for f in dataclasses.fields(Plan)}
    half = two.cluster.with_nodes(1)
    assert half == one.cluster
    on = two.on(half)
    assert on.cluster == one.cluster and on.plan.axes == (("dp", 8),) and on.model == one.model


def test_the_same_spec_searched_on_half_the_nodes_is_the_spec_written_with_them(two_and_one):
    two, one = two_and_one
    # in the files' bf16 (an FP8 device's second run in fp8 doubles the time and adds nothing to the question)
    got = SE.search(two, top=3, cluster=two.cluster.with_nodes(1), fixed={"precision": "bf16"})
    want = SE.search(one, top=3, fixed={"precision": "bf16"})
    assert got.winners and got.spec.cluster == one.cluster
    for g, w in zip(got.winners, want.winners, strict=True):
        assert g.plan.world_size == 8 and g.plan.to_json(got.spec.cluster) == w.plan.to_json(one.cluster)
        assert g.prediction == w.prediction and g.estimate.peak_bytes == w.estimate.peak_bytes
        assert g.reasons == w.reasons
    assert got.rejected == want.rejected
    # on the file's own two nodes the plans are of 16 devices, and the best is another plan
    whole = SE.search(two, top=1, fixed={"precision": "bf16"})
    assert whole.winners[0].plan.world_size == 16 and whole.winners[0].plan.to_json() != got.winners[0].plan.to_json()


def test_a_plan_costed_on_another_cluster_is_costed_as_the_file_written_on_it(two_and_one):
    """Candidates and the step-time model on half the nodes: the same estimate and prediction as the one-node file's;
    the same axes on two nodes of four (the tp groups inside a node, dp's across) are slower, and a plan of another
    world size than the cluster's is refused."""
    two, one = two_and_one
    mine = Candidates(two, cluster=two.cluster.with_nodes(1))
    theirs = Candidates(one, unsharded=mine.unsharded)
    plan = dataclasses.replace(one.plan, axes=(("dp", 2), ("tp", 4)), data_parallel="fsdp", micro_batches=4)
    a, b = mine.decide(plan), theirs.decide(plan)
    assert a == b
    est_a, est_b = mine.estimate(a), theirs.estimate(b)
    assert est_a.peak_bytes == est_b.peak_bytes and est_a.ledger == est_b.ledger
    pred = Simulator(mine.spec.cluster).predict(mine.cost_model(a), a, est_a)
    assert pred == Simulator(one.cluster).predict(theirs.cost_model(b), b, est_b)
    split = Cluster(2, 4, one.cluster.device)  # 8 devices again, dp's groups now across the nodes
    slower = Simulator(split).predict(mine.cost_model(a), a, est_a)
    assert slower.step_time_s > pred.step_time_s
    with pytest.raises(ValueError, match="hold 8 devices, the cluster 16"):
        Simulator(two.cluster).predict(mine.cost_model(a), a, est_a)
