"""Expert re-placement's placement and row routing on one process (runtime/eplb.py, runtime/rebalance.py): the
placement is deterministic, evens a skewed load, keeps copies of an expert on distinct ranks, and its moves turn
one placement into the next; the rows reach their slots and come back in order. The multi-rank runs (the same
training as without re-placement, the load spread, the bytes) are tests/e2e/test_rebalance.py."""
from __future__ import annotations

import random

import pytest
import torch

from compiler.cost.rebalance import balanced_skew
from runtime import eplb, rebalance


def _spread(load, placement, ranks):
    return eplb.spread(eplb.rank_loads(eplb.predicted_slot_load(load, placement), ranks))


def test_canonical_holds_each_ranks_experts_first():
    assert eplb.canonical(8, 2, 5) == [0, 1, 2, 3, -1, 4, 5, 6, 7, -1]
    assert eplb.canonical(8, 4, 2) == [0, 1, 2, 3, 4, 5, 6, 7]


def test_a_skewed_load_is_evened_by_replicas():
    """Experts 0 and 1 take 90% of the load: canonically rank 0 holds 3.6× the mean; 8 replicas over 4 ranks give
    the hot experts a copy on every rank."""
    load = [45.0, 45.0] + [10 / 6] * 6
    canon = eplb.canonical(8, 4, 4)
    assert _spread(load, canon, 4) == pytest.approx(3.6)
    placed = eplb.place(load, 4, 4)
    assert _spread(load, placed, 4) < 1.05
    assert placed == eplb.place(list(load), 4, 4)  # deterministic: every rank computes the same
    for r in range(4):  # copies of one expert on distinct ranks
        mine = [e for e in placed[r * 4:(r + 1) * 4] if e >= 0]
        assert len(mine) == len(set(mine))
    assert sorted(set(placed) - {-1}) == list(range(8))  # every expert has a copy


def test_without_replicas_packing_alone_evens_a_movable_load():
    load = [8.0, 8.0, 1.0, 1.0, 1.0, 1.0, 8.0, 8.0]  # canonically ranks 0 and 3 hot
    placed = eplb.place(load, 4, 2)
    assert _spread(load, eplb.canonical(8, 4, 2), 4) == pytest.approx(16 / 9)
    assert _spread(load, placed, 4) == pytest.approx(1.0)


def test_hierarchical_placement_keeps_each_node_whole():
    """Two nodes of two ranks: each node holds half the experts' copies, and each expert's copies stay on one
    node."""
    rng = random.Random(0)
    load = [rng.uniform(1, 20) for _ in range(16)]
    placed = eplb.place(load, 4, 6, nodes=2)
    nodes = [set(placed[:12]) - {-1}, set(placed[12:]) - {-1}]
    assert not nodes[0] & nodes[1] and nodes[0] | nodes[1] == set(range(16))
    assert _spread(load, placed, 4) < _spread(load, eplb.canonical(16, 4, 6), 4)


def test_aligned_placements_move_no_rank_whose_experts_only_changed_rank():
    """A placement whose ranks' contents are the current ones in another rank order moves nothing once aligned;
    alignment keeps each rank's set (the spread) and stays within a node."""
    old = [0, 1, 2, 3, 4, 5, 6, 7]
    new = [4, 5, 0, 1, 6, 7, 2, 3]
    assert eplb.align(new, old, 4) == old
    moved = eplb.align([2, 3, 0, 1, 6, 7, 4, 5], old, 4, nodes=2)
    assert moved == old
    across = eplb.align([2, 3, 0, 1, 6, 7, 4, 5], [4, 5, 6, 7, 0, 1, 2, 3], 4, nodes=2)
    assert set(across[:4]) == {0, 1, 2, 3}  # no overlap within node 0: its contents stay on node 0
    rng = random.Random(1)
    for _ in range(5):
        load = [rng.expovariate(1.0) for _ in range(8)]
        new = eplb.place(load, 4, 3)
        aligned = eplb.align(new, eplb.canonical(8, 4, 3), 4)
        assert sorted(map(tuple, (sorted(aligned[r * 3:(r + 1) * 3]) for r in range(4)))) == \
            sorted(map(tuple, (sorted(new[r * 3:(r + 1) * 3]) for r in range(4))))
        assert _spread(load, aligned, 4) == pytest.approx(_spread(load, new, 4))


@pytest.mark.parametrize("seed", range(5))
def test_moves_turn_one_placement_into_the_next(seed):
    """Simulated on every rank at once: the rows each rank sends and receives make the new placement."""
    rng = random.Random(seed)
    ranks, slots, experts = 4, 3, 8
    old = eplb.canonical(experts, ranks, slots)
    for _ in range(3):
        new = eplb.place([rng.expovariate(1.0) for _ in range(experts)], ranks, slots)
        plan = eplb.plan_moves(old, new, ranks)
        held = [old[r * slots:(r + 1) * slots] for r in range(ranks)]
        after = [list(h) for h in held]
        for d in range(ranks):
            for s in range(ranks):
                for j, i in zip(plan[s][0][d], plan[d][1][s]):  # s's rows j become d's rows i, in order
                    after[d][i] = held[s][j]
            for j, i in plan[d][2]:
                after[d][i] = held[d][j]
        got = [e for r in after for e in r]
        assert [g if n >= 0 else n for g, n in zip(got, new)] == new
        old = new


def test_rows_reach_their_slots_and_return_in_order():
    """A replicated expert's rows split between its copies (the larger chunk first on rank 0); an empty slot takes
    none; from_slots undoes to_slots, its gradient too."""
    counts_E = torch.tensor([5, 2, 0, 3])
    slots_P = torch.tensor([0, 1, 0, -1, 2, 3])  # expert 0 has two copies, slot 3 is empty
    rows_TH = torch.arange(10.0).reshape(10, 1).requires_grad_()
    load_E, slot_load_P = torch.zeros(4, dtype=torch.float64), torch.zeros(6, dtype=torch.float64)
    out, counts_P = rebalance.to_slots(rows_TH, counts_E, slots_P, load_E, slot_load_P)
    assert counts_P.tolist() == [3, 2, 2, 0, 0, 3]
    assert out[:, 0].tolist() == [0, 1, 2, 5, 6, 3, 4, 7, 8, 9]
    assert load_E.tolist() == [5, 2, 0, 3] and slot_load_P.tolist() == [3, 2, 2, 0, 0, 3]
    back = rebalance.from_slots(out * 2, counts_E, slots_P)
    assert back[:, 0].tolist() == [2 * i for i in range(10)]
    back.sum().backward()
    assert rows_TH.grad[:, 0].tolist() == [2.0] * 10


def test_the_plans_figure_is_the_runtimes_placement():
    """compiler/cost/rebalance.balanced_skew prices runtime/eplb.place: no replica leaves a skew that packing
    cannot fix, enough replicas even it."""
    assert balanced_skew(1.0, 8, 4, 0) == pytest.approx(1.0)
    assert balanced_skew(3.0, 8, 4, 0) > 1.5
    assert balanced_skew(3.0, 8, 4, 8) == pytest.approx(1.0)


def test_plan_prices_replicas_and_states_the_gain_at_a_skew():
    """moe_gpt dropless and grouped on ep 2 with 2 replicas: the replicas are in the experts' weights (5 slots of
    3·64·128 weights per layer), the ledger holds their gradient all-reduce (2 experts' rows, fp32, both layers) and
    the moves; at skew 1 the what-if is the predicted step, at skew 2 without re-placement it is longer and with it
    the balanced step again (2 replicas even a rank holding everything), and `plan` prints it."""
    from compiler.check import check_text
    from compiler.pipeline import compile_spec
    from compiler.cost import rebalance as REB
    from compiler.report.plan import plan_text
    from tests.e2e.runner import ROOT, with_plan
    text = (ROOT / "samples/moe_gpt.scale").read_text().replace(
        "capacity_factor = 1.25", "capacity_factor = none, dispatch = grouped").replace(
        "dropped = residual)", "dropped = residual, rebalance = replicate(every = 10, extra = 2))")
    compiled = compile_spec(check_text(with_plan(text, "r.scale", axes=(("ep", 2),), devices_per_node=2), "r.scale"))
    costs, spec, plan = compiled.costs, compiled.spec, compiled.plan
    per_expert = 3 * 64 * 128
    assert costs.expert_params_rank == 2 * 5 * per_expert  # two moe layers, 5 slots each
    grads = next(c for c in costs.ledger.entries if c.op == "all_reduce" and c.axis == "ep" and c.measured)
    assert grads.bytes == 2 * 2 * per_expert * 4
    moves = next(c for c in costs.ledger.entries if c.op == "all_to_all" and not c.measured)
    assert moves.bytes == 2 * 5 * per_expert * 3 * 4 // 10
    same = REB.step_at_skew(costs, spec, plan, 1.0)
    assert same[0] == pytest.approx(costs.step.step_time_s) and same[1] == pytest.approx(same[0])
    before, after, left = REB.step_at_skew(costs, spec, plan, 2.0)
    assert before > costs.step.step_time_s and left == pytest.approx(1.0) and after == pytest.approx(same[0])
    assert "expected step at a per-rank expert load skew" in plan_text(compiled)
