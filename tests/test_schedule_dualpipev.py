"""DualPipeV's action lists: equal to torch 2.13's ScheduleDualPipeV for a grid of (pp, micro-batches), proved by our
checker, with the same sends and receives as torch's lowering, and read back by torch's action parser."""
from __future__ import annotations

import pytest
from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping
from torch.distributed.pipelining.schedules import ScheduleDualPipeV, _Action, _add_send_recv

from compiler import schedule as S
from runtime.pipeline import torch_order

GRID = [(p, m) for p in range(1, 9) for m in range(2 * p, 4 * p + 4)]  # torch needs m >= 2p (its stages)


def _torch(p: int, m: int) -> dict:
    """torch's own compute lists, without building stages: its per-rank planner reads only these two fields."""
    sched = ScheduleDualPipeV.__new__(ScheduleDualPipeV)
    sched.pp_group_size, sched._n_microbatches = p, m
    return {r: sched._calculate_single_rank_operations(r) for r in range(p)}


def _lay(p: int, m: int) -> S.Layout:
    return S.Layout.of("dualpipev", p, 2, m)


def test_the_v_layout_is_torchs():
    for p in range(1, 9):
        assert {s: _lay(p, 2 * p).rank_of(s) for s in range(2 * p)} == generate_stage_to_rank_mapping(p, 2 * p, "v")
        assert all(_lay(p, 2 * p).stages_of(r) == [r, 2 * p - 1 - r] for r in range(p))


def test_the_lists_equal_torchs_and_the_checker_proves_them():
    for p, m in GRID:
        lay = _lay(p, m)
        ours = S.compute_order("dualpipev", lay)
        theirs = _torch(p, m)
        for r in range(p):
            assert [str(a) for a in ours[r]] == [str(a) for a in theirs[r]], (p, m, r)
        tl = S.verify(S.with_communication(ours, lay), lay)
        assert tl.makespan > 0


def test_sends_and_receives_match_torchs_lowering():
    """torch's _add_send_recv puts each receive where its send is made; ours puts it just before its computation.
    The compute actions and sends are the same sequence, the receives the same set, on every rank."""
    for p, m in GRID[::3]:
        lay = _lay(p, m)
        theirs = _add_send_recv(_torch(p, m), lay.rank_of, 2 * p)
        ours = S.with_communication(S.compute_order("dualpipev", lay), lay)
        for r in range(p):
            t, o = [str(a) for a in theirs[r]], [str(a) for a in ours[r]]
            assert [a for a in t if "RECV" not in a] == [a for a in o if "RECV" not in a], (p, m, r)
            assert sorted(a for a in t if "RECV" in a) == sorted(a for a in o if "RECV" in a), (p, m, r)


def test_an_overlap_prints_and_parses_as_torchs():
    order = S.compute_order("dualpipev", _lay(4, 10))
    overlap = next(a for a in order[0] if a.sub is not None)
    assert str(overlap) == "(0F7;7B3)OVERLAP_F_B"
    parsed = torch_order("dualpipev", 4, 10, 2)
    assert all(str(t) == str(a) for r in order for t, a in zip(parsed[r], order[r]))
    assert parsed[0][order[0].index(overlap)] == _Action.from_str("(0F7;7B3)OVERLAP_F_B")


def test_refusals():
    with pytest.raises(ValueError, match="at least 2·pp = 8 micro-batches"):
        S.compute_order("dualpipev", _lay(4, 7))
    with pytest.raises(ValueError, match="two stages per rank"):
        S.compute_order("dualpipev", S.Layout(4, 3, 8, "v"))
    loop = S.Layout(4, 2, 8)  # the lists are the V's whatever the layout says; checked against a loop, refused
    with pytest.raises(S.ScheduleError, match="rank 0: 7F0 computes stage 7, which lives on rank 3"):
        S.verify(S.with_communication(S.compute_order("dualpipev", loop), loop), loop)


def test_the_checker_rejects_a_broken_overlap():
    lay = _lay(2, 4)
    order = S.with_communication(S.compute_order("dualpipev", lay), lay)
    i = next(i for i, a in enumerate(order[0]) if a.sub is not None)
    f, b = order[0][i].sub
    order[0][i] = S.Action(-1, "OVERLAP_F_B", -1, (f,))  # its backward lost
    with pytest.raises(S.ScheduleError, match=f"rank 0: backward of micro-batch {b.mb} on stage {b.stage} never"):
        S.verify(order, lay)


def test_the_checker_rejects_a_weight_half_after_a_full_backward():
    lay = _lay(2, 4)
    order = S.with_communication(S.compute_order("dualpipev", lay), lay)
    full = next(a for a in order[1] if a.kind == "B")
    order[1].append(S.Action(full.stage, "W", full.mb))
    with pytest.raises(S.ScheduleError, match=f"{full.stage}W{full.mb} has no input half"):
        S.verify(order, lay)


def test_grid_p4_m8(golden):
    """The grid `scalec plan` prints (an overlap's forward and backward in two cells: verify runs them in order)."""
    lay = _lay(4, 8)
    golden.check("schedules/dualpipev_p4_m8.txt", S.grid(S.actions("dualpipev", 4, 8, 2), lay))


def test_memory_model_counts_the_v_stages_and_the_overlaps():
    """compiler.cost.memory.rank_peaks on dualpipev: each rank's micro-batches alive at its peak, per stage of its
    V (r and 2p-1-r, not r + p), counting the forwards and backwards inside overlapped pairs, equal to a walk of the
    runtime's own action lists; rank 0 holds the last stage (the head) beside the first."""
    from compiler.cost.memory import rank_peaks
    for p, m in ((2, 4), (2, 9), (3, 6), (4, 8), (4, 13)):
        want = []
        for r, acts in S.compute_order("dualpipev", _lay(p, m)).items():
            alive, best, most = {}, {}, -1
            for x in (x for a in acts for x in a.parts):
                alive[x.stage] = alive.get(x.stage, 0) + (x.kind == "F") - (x.kind in ("B", "W"))
                if sum(alive.values()) > most:
                    most, best = sum(alive.values()), {s: n for s, n in alive.items() if n}
            want.append(best)
        got = rank_peaks("dualpipev", p, m, 2, tuple((k, k + 1) for k in range(2 * p)))
        assert list(got) == want, (p, m)
        assert set(got[0]) == {0, 2 * p - 1}


def test_step_model_times_each_rank_on_its_v_stages():
    """compiler/cost/step_time.py on dualpipev: the timed steps carry the V's placement (the sends' crossings), and
    each pp rank's compute is that of the stages it holds: on gpt_pp (4 stages of one block) rank 0 holds stages 0
    and 3 (the embedding, the head and the loss beside its two blocks), more than rank 1's two blocks."""
    from pathlib import Path

    from compiler.check import check_text
    from compiler.cost.pipeline_time import _order
    from compiler.pipeline import compile_spec
    for p, m in ((2, 4), (4, 8)):
        assert _order("dualpipev", p, m, 2) == S.steps(S.compute_order("dualpipev", _lay(p, m)), _lay(p, m))
    text = (Path(__file__).parents[1] / "samples" / "gpt_pp.scale").read_text()
    compiled = compile_spec(check_text(text.replace('schedule = "1f1b"', 'schedule = "dualpipev"'), "v.scale"))
    assert compiled.plan.stage_layout.stages_of(0) == [0, 3]
    first, second = compiled.costs.step.ranks
    assert first.compute_s > second.compute_s
