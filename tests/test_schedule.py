"""Pipeline schedules as data: every schedule runs (static check), its bubble is the published one, its grid is
pinned, and a broken action list is rejected with the rank and action named."""
from __future__ import annotations

import pytest

from compiler import schedule as S

CASES = [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("zero-bubble", 1)]


@pytest.mark.parametrize("name,v", CASES)
def test_grid_of_each_schedule_p4_m8(name, v, golden):
    lay = S.Layout(4, v, 8)
    golden.check(f"schedules/{name}_p4_m8.txt", S.grid(S.actions(name, 4, 8, v), lay))


@pytest.mark.parametrize("p,m", [(2, 2), (2, 8), (4, 4), (4, 8), (8, 16)])
@pytest.mark.parametrize("name,v", CASES)
def test_bubble_matches_the_published_formulas(name, v, p, m):
    """With forward 1, backward 2 (input 1 + weights 1): 1F1B and GPipe idle (p-1)/(m+p-1) of the time, interleaved
    (p-1)/(v·m+p-1) (Narayanan et al. 2021); ZB-H1's bubble is (p-1)(F+I-W) against 1F1B's (p-1)(F+I+W)."""
    if name == "interleaved-1f1b" and m % p:
        pytest.skip("interleaving needs micro-batches in groups of p")
    lay = S.Layout(p, v, m)
    tl = S.verify(S.actions(name, p, m, v), lay)
    work = 3 * m * v  # per rank: F + I + W (or F + B) for each of its micro-batches and stages
    if name == "zero-bubble":
        assert tl.makespan == work + (p - 1) * (1 + 1 - 1)
    else:
        assert tl.makespan == work + (p - 1) * 3
        assert tl.idle_fraction(0) == pytest.approx(S.bubble_fraction(p, m, v), rel=1e-12)


def test_every_rank_runs_each_of_its_stages_forward_and_backward():
    order = S.actions("interleaved-1f1b", 4, 8, 2)
    for r, acts in order.items():
        f = {(a.stage, a.mb) for a in acts if a.kind == "F"}
        assert f == {(s, k) for s in (r, r + 4) for k in range(8)}


@pytest.mark.parametrize("name,v", CASES)
def test_static_check_at_the_largest_supported_size(name, v):
    """p = 128, m = 512 (timed by bench/schedule_check.py, not here)."""
    lay = S.Layout(128, v, 512)
    tl = S.verify(S.actions(name, 128, 512, v), lay)
    assert tl.makespan > 0


def _broken(edit) -> dict:
    order = S.actions("1f1b", 4, 8)
    edit(order)
    return order


def test_rejects_a_receive_without_its_send():
    def drop_send(order):
        order[1] = [a for a in order[1] if str(a) != "1SEND_F3"]
    with pytest.raises(S.ScheduleError, match=r"rank 2 waits forever at 2RECV_F3 .*needs 1SEND_F3, and no rank"):
        S.verify(_broken(drop_send), S.Layout(4, 1, 8))


def test_rejects_receives_out_of_order():
    def swap(order):
        acts = order[3]
        i = next(j for j, a in enumerate(acts) if str(a) == "3RECV_F1")
        k = next(j for j, a in enumerate(acts) if str(a) == "3RECV_F2")
        acts[i], acts[k] = acts[k], acts[i]
    with pytest.raises(S.ScheduleError, match=r"rank 3: 3F1 runs before its input is received"):
        S.verify(_broken(swap), S.Layout(4, 1, 8))


def test_rejects_a_cycle_of_waits():
    """Rank 1 receives micro-batch 1's gradient before sending micro-batch 2's activation that rank 2 needs to
    produce it... in 1F1B order moved so that each waits for the other."""
    def cycle(order):
        acts = order[1]
        recv = next(j for j, a in enumerate(acts) if str(a) == "1RECV_B0")
        send = next(j for j, a in enumerate(acts) if str(a) == "1SEND_F1")
        acts.insert(send, acts.pop(recv))  # wait for the gradient of mb 0 before sending mb 1 forward
        acts[:] = [a for a in acts]
    order = _broken(cycle)
    with pytest.raises(S.ScheduleError, match=r"waits forever"):
        S.verify(order, S.Layout(4, 1, 8))


def test_rejects_a_send_nobody_receives():
    def extra(order):
        order[0].append(S.Action(0, "SEND_F", 9 - 2))
        order[1] = [a for a in order[1] if str(a) != "1RECV_F7"] 
    with pytest.raises(S.ScheduleError, match=r"rank 1: 1F7 runs before its input is received"):
        S.verify(_broken(extra), S.Layout(4, 1, 8))


def test_rejects_a_missing_or_repeated_computation():
    def drop(order):
        order[2] = [a for a in order[2] if str(a) != "2B5"]
    with pytest.raises(S.ScheduleError, match=r"rank 2: backward of micro-batch 5 on stage 2 never runs"):
        S.verify(_broken(drop), S.Layout(4, 1, 8))

    def twice(order):
        order[0].append(S.Action(0, "F", 3))
    with pytest.raises(S.ScheduleError, match=r"rank 0: 0F3 is computed twice"):
        S.verify(_broken(twice), S.Layout(4, 1, 8))


def test_svg_timeline_is_pinned_and_well_formed(golden):
    import xml.etree.ElementTree as ET
    lay = S.Layout(4, 1, 8)
    text = S.svg(S.verify(S.actions("zero-bubble", 4, 8), lay), "zero-bubble (ZB-H1), p = 4, m = 8")
    root = ET.fromstring(text)
    boxes = [e for e in root.iter("{http://www.w3.org/2000/svg}rect") if e.find("{http://www.w3.org/2000/svg}title")
             is not None and not e.find("{http://www.w3.org/2000/svg}title").text.startswith("rank")]
    assert len(boxes) == 4 * 8 * 3  # F, I, W for each micro-batch on each rank
    golden.check("schedules/zero-bubble_p4_m8.svg", text)


@pytest.mark.parametrize("name,v", CASES)
def test_the_runtime_executes_the_checked_lists(name, v):
    """runtime/pipeline.py hands torch exactly the compute order that verify() proved and grid() prints."""
    from runtime.pipeline import torch_order
    lay = S.Layout(4, v, 8)
    ours = S.compute_order(name, lay)
    theirs = torch_order(name, 4, 8, v)
    assert {r: [str(a) for a in acts] for r, acts in theirs.items()} == \
           {r: [str(a) for a in acts] for r, acts in ours.items()}



@pytest.mark.parametrize("name", ["korthikanti_530b", "korthikanti_1t"])
def test_published_trillion_scale_pipelines_verify_with_linear_work(name):
    """Korthikanti et al.'s 530B (2520 GPUs, p 35 × v 3, 280 micro-batches) and 1T (3072 GPUs, p 64 × v 2, 512)
    configurations pass the rules (the retired E0608 refused both) and their schedules are proved by work linear in
    the actions: each looked at once, again once if its rank waited there, plus one resume per wait (seconds in
    bench/schedule_check.py)."""
    from pathlib import Path

    from compiler import plan as P
    from compiler.rules import pipeline_split as PS
    from compiler.pipeline import check_path
    spec = check_path(str(Path(__file__).parent / "reference" / f"{name}.scale"))
    plan = spec.plan
    assert PS.requires(spec, plan) == []
    p, v, m = plan.size("pp"), plan.virtual_stages, plan.micro_batches
    order = S.actions(plan.schedule, p, m, v)
    n = sum(len(a) for a in order.values())
    assert n == PS.schedule_actions(plan.schedule, p, v, m) > 16384 * 6  # past the old cap's ~100,000 actions
    tl = S.verify(order, S.Layout(p, v, m))
    assert n < tl.work <= 3 * n + p


@pytest.mark.parametrize("name,v", CASES)
def test_verify_work_is_linear_in_the_actions(name, v):
    """Doubling the micro-batches doubles the actions and the work, to a few steps per rank (no step grows faster)."""
    works = []
    for m in (64, 128):
        order = S.actions(name, 8, m, v)
        works.append((S.verify(order, S.Layout(8, v, m)).work, sum(len(a) for a in order.values())))
    (w1, n1), (w2, n2) = works
    assert n2 == 2 * n1 and w2 <= 2 * w1 + 8 and w2 <= 3 * n2 + 8


def test_the_action_count_is_known_without_building_the_lists():
    from compiler.rules.pipeline_split import schedule_actions
    for name, v in CASES:
        for p, m in ((2, 4), (4, 8), (8, 16)):
            assert schedule_actions(name, p, v, m) == sum(len(a) for a in S.actions(name, p, m, v).values())
