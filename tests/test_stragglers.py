"""runtime/stragglers.py and runtime/sections.py as pure functions: the scores on synthetic section tables, the
rank they name (never a peer that only waits for it), no alarm on noise, the what-if against hand-computed figures
(with and without pp), the timeline's exclusive sections and its split of a backward that ends in the gradient
reduction, and the drill hook's ramp. The drills themselves run in bench/straggler_drill.py."""
from __future__ import annotations

import random
import statistics
import time
from types import SimpleNamespace

import pytest
import torch

from runtime import schedule_time, sections, stragglers
from runtime.sections import INDEX, SECTIONS

MS = 1e-3


def row(**secs) -> list[float]:
    out = [0.0] * len(SECTIONS)
    for k, v in secs.items():
        out[INDEX[k]] = v * MS
    return out


def table(per_rank: list[dict], steps: int = 10, noise: float = 0.0, seed: int = 0) -> list:
    rng = random.Random(seed)
    return [[row(**{k: v * (1 + rng.uniform(-noise, noise)) for k, v in secs.items()}) for _ in range(steps)]
            for secs in per_rank]


def scores(per_rank, groups=None, best=None, **kw):
    stats = stragglers.window_stats(table(per_rank, **kw))
    groups = groups or [0] * len(per_rank)
    rel = stragglers.relative_scores(stats, groups)
    ind = stragglers.individual_scores(stats, [] if best is None else best)
    return stats, groups, rel, ind


NORMAL = {"forward": 10, "backward": 20, "optimizer": 2, "grad_reduce": 3}


def test_relative_and_individual_scores():
    slow = dict(NORMAL, forward=20, backward=40)  # twice as slow in its compute
    stats, groups, rel, ind = scores([NORMAL, NORMAL, slow])
    assert rel[0]["forward"] == 1.0 and rel[2]["forward"] == pytest.approx(0.5)
    assert rel[2]["compute"] == pytest.approx(32 / 62)
    best: list = []
    stragglers.individual_scores(stragglers.window_stats(table([NORMAL] * 3)), best)  # a first, fast window
    _, _, _, ind = scores([NORMAL, NORMAL, slow], best=best)
    assert ind[0]["compute"] == 1.0 and ind[2]["forward"] == pytest.approx(0.5)


def test_the_slow_rank_is_named_not_its_peers_that_wait():
    """Rank 2 computes 30% longer; at the gradient reduction the others wait for it (their waits grow by what it
    is late, its own wait shrinks): only rank 2 is named, in a compute section, and the waits explain it."""
    peer = dict(NORMAL, grad_reduce=3 + 9)
    slow = dict(NORMAL, forward=13, backward=26, grad_reduce=3)
    stats, groups, rel, ind = scores([peer, peer, slow, peer], noise=0.02)
    named = stragglers.stragglers(stats, groups, rel, ind, threshold=0.8)
    assert [n["rank"] for n in named] == [2]
    assert named[0]["section"] in ("forward", "backward") and named[0]["section_score"] == pytest.approx(
        1 / 1.3, abs=0.03)
    assert named[0]["score"] == pytest.approx(32 / 41, abs=0.03)  # its compute: forward + backward + optimizer
    world = [{"node": r // 2, "host": "h", "device": "cpu", "coords": {"dp": r}} for r in range(4)]
    line = stragglers.describe(named[0], world, stats, groups, 0.8, 11, 20)
    assert "rank 2 (node 1, h, cpu)" in line and "its peers waited 9.0 ms/step more" in line


def test_a_slowdown_too_small_for_one_window_is_named_once_sustained():
    """Rank 3 computes 15% longer: its relative score, 0.87, is above the threshold (0.8), so no one window names it;
    averaged over SUSTAINED windows it is below halfway to 1 (0.9), and it is named then, as `sustained`, and its
    peers are not. A rank as slow in only some of the windows (mean above 0.9) is not."""
    slow = dict(NORMAL, forward=11.5, backward=23)
    history = []
    for w in range(stragglers.SUSTAINED):
        stats, groups, rel, ind = scores([NORMAL, NORMAL, NORMAL, slow], noise=0.01, seed=w)
        sig = stragglers.significant(stats, groups)
        history.append([stragglers.naming_score(rel[r], sig[0]) for r in range(4)])
        named = stragglers.stragglers(stats, groups, rel, ind, 0.8, sig, history)
        if w < stragglers.SUSTAINED - 1:
            assert named == [] and 0.84 < history[-1][3] < 0.9
    assert [(n["rank"], n["kind"]) for n in named] == [(3, "sustained")]
    assert named[0]["score"] == pytest.approx(statistics.fmean(h[3] for h in history))
    world = [{"node": r // 2, "host": "h", "device": "cpu", "coords": {"dp": r}} for r in range(4)]
    line = stragglers.describe(named[0], world, stats, groups, 0.8, 51, 60)
    assert "sustained score 0.8" in line and "over the last 6 windows" in line and "threshold 0.9)" in line
    mixed = [[1.0, 1.0, 1.0, 0.87 if w % 2 else 0.97] for w in range(stragglers.SUSTAINED)]
    assert stragglers.stragglers(stats, groups, rel, ind, 0.8, sig, mixed) == []


def test_no_alarm_on_uniform_noise():
    for seed in range(20):
        stats, groups, rel, ind = scores([NORMAL] * 8, noise=0.05, seed=seed)
        assert stragglers.stragglers(stats, groups, rel, ind, threshold=0.7) == []


def test_a_tiny_section_does_not_name():
    """A data section of 0.1 ms against 0.05 on the others (score 0.5) is noise: below SIGNIFICANT of the step."""
    stats, groups, rel, ind = scores([dict(NORMAL, data=0.05)] * 3 + [dict(NORMAL, data=0.1)])
    assert rel[3]["data"] == pytest.approx(0.5)
    assert stragglers.stragglers(stats, groups, rel, ind, threshold=0.7) == []


def test_individual_names_only_a_rank_alone_in_its_group_and_not_a_whole_slow_job():
    best: list = []
    stragglers.individual_scores(stragglers.window_stats(table([NORMAL] * 2)), best)
    slow = dict(NORMAL, forward=20, backward=40)
    stats, _, _, _ = scores([NORMAL, slow])
    groups = [0, 1]  # two pipeline stages, one rank each: nothing relative to either
    rel = stragglers.relative_scores(stats, groups)
    ind = stragglers.individual_scores(stats, [dict(b) for b in best])
    named = stragglers.stragglers(stats, groups, rel, ind, threshold=0.7)
    assert [(n["rank"], n["kind"]) for n in named] == [(1, "individual")]
    stats, _, _, _ = scores([slow, slow])  # everyone slower than its best: the machine, not a straggler
    ind = stragglers.individual_scores(stats, [dict(b) for b in best])
    assert stragglers.stragglers(stats, groups, stragglers.relative_scores(stats, groups), ind, 0.7) == []


def test_the_median_of_the_others():
    rng = random.Random(3)
    assert stragglers._others_median([0.5]) == [None]
    for n in (2, 3, 8, 9, 100):
        values = [rng.choice((0.5, 0.7, 0.9, 1.0)) for _ in range(n)]
        want = [statistics.median(values[:i] + values[i + 1:]) for i in range(n)]
        assert stragglers._others_median(values) == pytest.approx(want)


def test_what_if_without_pp():
    """The step ends when the slowest rank reaches the collective: its compute (forward + backward + optimizer)
    plus the transfer, the least any rank waits. Ranks 0, 1: 32 ms of compute, waiting 5 and 6 ms; rank 2: 47 ms,
    waiting 1 ms: modelled 48. Rank 2 at its peers' median (32 ms): 32 + 1 = 33, not 32 + rank 0's 5 ms, whose wait
    was partly for rank 2 (and on a busy host partly the scheduler's). Lost: 15 ms/step, rank 2's extra compute."""
    per_rank = [dict(NORMAL, grad_reduce=5), dict(NORMAL, grad_reduce=6),
                {"forward": 15, "backward": 30, "optimizer": 2, "grad_reduce": 1}]
    stats = stragglers.window_stats(table(per_rank))
    measured, without, lost = stragglers.what_if(stats, [0, 0, 0], {2})
    assert lost == pytest.approx(15 * MS)
    assert measured == pytest.approx(38 * MS) and without == pytest.approx(23 * MS)  # steps 37, 38, 48: median 38


def test_what_if_with_pp_times_the_schedule():
    """dp 2 × pp 2, gpipe, 2 micro-batches. F and B per micro-batch: 1 and 2 ms on every rank but rank 3 (stage 1
    of the second pipeline), 2 and 4. First pipeline: 0F0 [0,1] 0F1 [1,2]; 1F0 [1,2] 1F1 [2,3] 1B0 [3,5]
    1B1 [5,7]; 0B0 [5,7] 0B1 [7,9]: 9 ms. Second: 1F0 [1,3] 1F1 [3,5] 1B0 [5,9] 1B1 [9,13]; 0B0 [9,11]
    0B1 [13,15]: 15 ms. Rank 3 at stage 1's other rank (rank 1): 9 ms. Lost 6 ms/step (data and optimizer equal)."""
    par = SimpleNamespace(axes=(("dp", 2), ("pp", 2)), virtual_stages=1, micro_batches=2, schedule="gpipe")
    world = [{"dp": r // 2, "pp": r % 2} for r in range(4)]
    pipe = stragglers.pipeline_model(par, world)
    assert pipe[2] == [[0, 1], [2, 3]]
    fast, slow = {"forward": 2, "backward": 4, "optimizer": 1}, {"forward": 4, "backward": 8, "optimizer": 1}
    stats = stragglers.window_stats(table([fast, fast, fast, slow]))
    assert stragglers.modelled_step(stats, pipe) == pytest.approx(16 * MS)
    _, _, lost = stragglers.what_if(stats, [0, 1, 0, 1], {3}, pipe)
    assert lost == pytest.approx(6 * MS)
    # pp alone (dp 1): rank 1 has no peer; its own best window (the fast figures) is the reference
    pipe = stragglers.pipeline_model(SimpleNamespace(**dict(vars(par), axes=(("pp", 2),))), world[:2])
    best: list = []
    stragglers.best_windows(stragglers.window_stats(table([fast, fast])), best)  # an earlier, fast window
    _, _, lost = stragglers.what_if(stragglers.window_stats(table([fast, slow])), [0, 1], {1}, pipe, best)
    assert lost == pytest.approx(6 * MS)


def test_the_what_if_takes_the_other_ranks_at_their_typical_speed():
    """Peers at 31, 32, 33 and 35 ms of compute (one window's noise), the straggler at 45: lost 12.5 ms/step, the
    straggler's compute over its peers' median (32.5), not 10 over the slowest of them, whose extra 2 ms is noise
    that a step without the straggler would not save either."""
    per_rank = [{"forward": f, "backward": 20, "optimizer": 2, "grad_reduce": 1} for f in (9, 10, 11, 13, 23)]
    _, _, lost = stragglers.what_if(stragglers.window_stats(table(per_rank)), [0] * 5, {4})
    assert lost == pytest.approx(12.5 * MS)


def test_window_best_is_the_mean_of_its_faster_half():
    steps = [row(forward=v) for v in (9, 5, 7, 4, 30, 6)]  # one step slowed by something else
    stats = stragglers.window_stats([steps])
    assert stats[0]["best"]["forward"] == pytest.approx(5 * MS)  # 4, 5 and 6: the faster half
    assert stats[0]["forward"] == pytest.approx(6.5 * MS)  # the median, which the what-if replays
    assert [stragglers.fastest_steps(n) for n in (1, 2, 3, 10, 11)] == [1, 1, 2, 5, 6]


def test_the_what_if_spans_the_windows_that_named_the_same_rank(capsys):
    """Rank 3 named in three windows in a row, 10, 14 and 12 ms/step slower: the third window's what-if covers
    steps 1-30 and reads their mean, 12 ms/step. A window that names no one ends the episode; the next naming starts
    another (steps 41-50)."""
    world = [{"node": r // 2, "name": f"node{r // 2}", "host": "h", "device": "cpu",
              "coords": {"dp": r}} for r in range(4)]
    fake = SimpleNamespace(threshold=0.8, groups=[0] * 4, best=[], best_medians=[], episode=None, history=[],
                           world=world, pipeline=None, on_straggler="report", exclude="node", named_before=set(),
                           verdict="", pending={}, track=SimpleNamespace(log=lambda *a: None),
                           _remember=lambda *a: None)
    for w, extra in enumerate((10, 14, 12, None, 10)):
        slow = NORMAL if extra is None else dict(NORMAL, forward=10 + extra, backward=20 + 2 * extra)
        stragglers.Detector.score(fake, torch.tensor(table([NORMAL, NORMAL, NORMAL, slow])), 10 * w + 1, 10 * w + 10)
        out = capsys.readouterr().out
        if w == 2:
            assert "what-if (steps 1-30)" in out and ": 36.0 ms/step" in out  # (30 + 42 + 36) / 3
        if w == 3:
            assert "what-if" not in out and fake.episode is None
    assert "what-if (steps 41-50)" in out and ": 30.0 ms/step" in out


def test_the_compiler_times_schedules_with_the_runtime_model():
    from compiler import schedule
    assert schedule.timed is schedule_time.timed and schedule.finish_times is schedule_time.finish_times
    assert schedule.ScheduleError is schedule_time.ScheduleError


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_timeline_sections_are_exclusive_and_the_synced_backward_is_split():
    clock = Clock()
    tl = sections.Timeline(torch.device("cpu"), clock)
    tl.begin()
    clock.t = 1.0
    tl.enter("forward")
    clock.t = 3.0
    tl.enter("all_reduce")          # a tp all-reduce inside the forward: its own section
    clock.t = 3.5
    tl.exit()
    clock.t = 5.0
    tl.exit()
    tl.enter(sections.BACKWARD_SYNC)
    clock.t = 9.0
    tl.mark()                       # the backward's own work done: DDP's wait follows
    clock.t = 12.0
    tl.exit()
    clock.t = 12.5
    tl.end()
    (got,) = tl.rows()
    assert got[INDEX["other"]] == 1.5 and got[INDEX["forward"]] == 3.5 and got[INDEX["all_reduce"]] == 0.5
    assert got[INDEX["backward"]] == 4.0 and got[INDEX["grad_reduce"]] == 3.0 and sum(got) == 12.5


def test_cpu_compute_sections_take_the_cpu_clock_and_waits_the_wall_clock(monkeypatch):
    """On CPU a rank descheduled for a core is not slower hardware: its forward and backward take the compute
    clock (the training thread's CPU time by default), its waits and `other` the wall clock."""
    wall, cpu = Clock(), Clock()
    tl = sections.Timeline(torch.device("cpu"), wall, cpu)
    tl.begin()
    wall.t, cpu.t = 2.0, 0.5        # host work in no region: 2 s of wall time, 0.5 s computing
    tl.enter("forward")
    wall.t, cpu.t = 7.0, 3.5        # the forward computed 3 s in 5 s of wall time (waiting for a core)
    tl.enter("all_reduce")
    wall.t, cpu.t = 8.0, 3.6
    tl.exit()
    wall.t, cpu.t = 9.0, 4.5
    tl.exit()
    tl.end()
    (got,) = tl.rows()
    assert got[INDEX["other"]] == 2.0 and got[INDEX["all_reduce"]] == 1.0
    assert got[INDEX["forward"]] == pytest.approx(3.9)  # 3.0 before the all-reduce, 0.9 after
    monkeypatch.delenv("SCALEC_TEST_CPU_CLOCK", raising=False)
    assert sections.cpu_clocks() == (time.perf_counter, time.thread_time)
    monkeypatch.setenv("SCALEC_TEST_CPU_CLOCK", "wall")
    assert sections.cpu_clocks() == (time.perf_counter, time.perf_counter)


@pytest.mark.parametrize("queued_by", ["ddp", "fsdp"])
def test_the_backward_is_split_where_its_own_work_ends_before_the_reduction_waits(queued_by):
    """`mark_backward_end`: the mark is autograd's callback once the backward's graph is done, ahead of the one a
    data-parallel wrapper queues to wait for its reduction (stood in for here by a 60 ms sleep): DDP queues its once
    the last bucket is ready (a gradient's accumulation), FSDP2 from its hook on the model's output, at the start of
    the backward. The wait is the reduction's (wall clock), the backward's compute is not (its CPU clock)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 1))
    engine = torch.autograd.Variable._execution_engine

    def wait(*_):
        engine.queue_callback(lambda: time.sleep(0.06))
    if queued_by == "ddp":
        model[0].weight.register_post_accumulate_grad_hook(wait)  # the last gradient's: the last bucket
    out = model(torch.randn(4, 16)).sum()
    if queued_by == "fsdp":
        out.register_hook(wait)  # on the model's output, which the loss below divides
    loss = out / 2
    tl = sections.Timeline(torch.device("cpu"))
    with sections.timed(tl):
        tl.begin()
        tl.enter(sections.BACKWARD_SYNC)
        sections.mark_backward_end(loss)
        loss.backward()
        tl.exit()
        tl.end()
    (got,) = tl.rows()
    assert got[INDEX["grad_reduce"]] >= 0.055 and got[INDEX["backward"]] < 0.03, got


def test_a_mark_before_an_inner_region_does_not_split():
    clock = Clock()
    tl = sections.Timeline(torch.device("cpu"), clock)
    tl.begin()
    tl.enter(sections.BACKWARD_SYNC)
    clock.t = 1.0
    tl.mark()
    tl.enter("all_reduce")
    clock.t = 2.0
    tl.exit()
    clock.t = 3.0
    tl.exit()
    tl.end()
    (got,) = tl.rows()
    assert got[INDEX["backward"]] == 2.0 and got[INDEX["grad_reduce"]] == 0.0


class FakeEvent:
    """torch.cuda.Event on the fake clock: `record` takes the time (the stream's position), `elapsed_time` is in
    milliseconds as CUDA's; `synchronize` is counted (one per window, none in a step)."""
    clock, syncs = Clock(), []

    def __init__(self, enable_timing=False):
        assert enable_timing
        self.at = None

    def record(self):
        self.at = FakeEvent.clock.t

    def elapsed_time(self, end):
        return (end.at - self.at) * 1e3

    def synchronize(self):
        FakeEvent.syncs.append(self.at)


def test_cuda_timeline_resolves_events_once_per_window(monkeypatch):
    """The CUDA path's bookkeeping on fake events: the same sections as on CPU, events reused from a pool, the
    gradient mark one event re-recorded, one synchronisation when the rows are read and none before."""
    monkeypatch.setattr(sections.torch.cuda, "Event", FakeEvent)
    clock, FakeEvent.syncs = FakeEvent.clock, []
    tl = sections.Timeline(torch.device("cuda"))
    for step in range(2):
        clock.t = 100.0 * step
        tl.begin()
        clock.t += 1
        tl.enter("forward")
        clock.t += 2
        tl.exit()
        tl.enter(sections.BACKWARD_SYNC)
        clock.t += 3
        tl.mark()
        clock.t += 1
        tl.mark()  # marked again before another cut: the same event, re-recorded
        clock.t += 4
        tl.exit()
        tl.end()
    assert FakeEvent.syncs == []
    rows = tl.rows()
    assert len(FakeEvent.syncs) == 1 and len(rows) == 2
    for got in rows:
        assert got[INDEX["other"]] == 1.0 and got[INDEX["forward"]] == 2.0
        assert got[INDEX["backward"]] == 4.0 and got[INDEX["grad_reduce"]] == 4.0
    pooled = len(tl._pool)
    tl.begin()
    tl.end()
    assert len(tl._pool) == pooled - 2  # the next step's events came from the pool


def test_drill_setting_and_ramp():
    assert sections.slow_setting("5:50:0.3") == (5, 50, 0.3, 0)
    setting = sections.slow_setting("5:50:0.3:300")
    assert sections.slow_fraction(setting, 49) == 0.0
    assert sections.slow_fraction(setting, 50) == pytest.approx(0.001)
    assert sections.slow_fraction(setting, 199) == pytest.approx(0.15)
    assert sections.slow_fraction(setting, 400) == pytest.approx(0.3)
    with pytest.raises(SystemExit):
        sections.slow_setting("5:50")


def test_the_drill_hook_slows_the_whole_compute(monkeypatch, capsys):
    """From its onset the hook adds FRACTION of each slowed region's median before it (forward, backward and the
    optimizer step: a slow device is slow in all its work), split over the region's calls per step; it prints the
    three medians at the onset and, each window after it, the extra work it did per step (the drills' injected
    cost)."""
    slow = sections.Slow((0, 3, 0.5, 0), torch.device("cpu"))
    monkeypatch.setattr(slow, "a", torch.zeros(1, 1))
    monkeypatch.setattr(slow, "b", torch.zeros(1, 1))
    for step in (1, 2):  # before the onset: the regions' calls per step are learned, nothing is added
        slow.begin_step(step)
        for kind in ("forward", "forward", "backward", "optimizer"):
            slow.work(kind)
    slow.seen([row(forward=4, backward=6, optimizer=2)] * 10)
    assert slow.done == 0.0
    slow.begin_step(3)
    assert slow.base == pytest.approx({"forward": 4 * MS, "backward": 6 * MS, "optimizer": 2 * MS})
    assert "forward 4.000 ms + backward 6.000 ms + optimizer 2.000 ms per step" in capsys.readouterr().out
    for kind in ("forward", "forward", "backward", "optimizer"):
        slow.work(kind)
    # each forward call half of the forward's share; what it did counts (the last product's overshoot too)
    assert 0.5 * 12 * MS <= slow.done < 0.5 * 12 * MS + 1 * MS
    slow.seen([row(forward=1)], 3, 3)  # a window after the onset: the extra work per step it did, printed
    assert f"rank 0 steps 3-3: {slow.done * 1e3:.3f} ms of extra work per step" in capsys.readouterr().out


def test_restart_and_replan_ask_every_rank_to_leave_the_worst_straggler_s_node(capsys, monkeypatch):
    from runtime import faults, leaving
    monkeypatch.setattr(faults, "_LEAVE", 0.0)
    world = [{"node": r // 2, "name": f"node{r // 2}", "host": "h"} for r in range(8)]
    named = [{"rank": 5, "score": 0.7, "section": "backward"}, {"rank": 2, "score": 0.78, "section": "forward"}]
    verdict = {"ranks": [2, 5], "on_straggler": "report", "exclude": "node", "nodes": [1, 2], "named": named,
               "lost_s": 0.1, "world": world}
    assert stragglers.act(verdict) == "" and not faults.leave_asked()  # report: the caller's lines only
    assert capsys.readouterr().out == ""
    why = stragglers.act(dict(verdict, on_straggler="replan"))
    assert "rank 5 on it is a straggler, slow in backward (score 0.70)" in why
    assert "node 2 (node2) is left out after the next step" in capsys.readouterr().out
    assert leaving.decode(faults._LEAVE) == (5, "replan")
    assert stragglers.act(dict(verdict, on_straggler="restart")) == ""  # asked once; the vote carries it
    assert leaving.decode(1.0) is None and leaving.decode(0.0) is None  # a signal, nothing
    assert leaving.decode(leaving.encode(16383, "restart")) == (16383, "restart")


def test_leaving_finish_writes_the_request_and_gives_each_rank_its_status(tmp_path, capsys):
    import json

    from runtime import leaving, node_record
    from runtime.errors import EXIT_EXCLUDE, EXIT_REJOIN, REPLAN_CODE
    world = [{"node": r // 2, "name": f"node{r // 2}", "host": "h"} for r in range(8)]
    assert leaving.finish((5, "replan"), world, 0, str(tmp_path), 40, 0, "slow") == REPLAN_CODE
    got = json.loads((tmp_path / leaving.REQUEST).read_text())
    assert got == {"nodes": 4, "exclude": [2], "hosts": ["node2"], "why": "slow", "step": 40}
    assert "leaving out node 2 (node2) after step 40 to re-plan" in capsys.readouterr().out
    record = node_record.NodeRecord(str(tmp_path / node_record.FILE)).load()
    assert record["node2"][-1]["kind"] == "excluded" and record["node2"][-1]["group_rank"] == 2
    assert leaving.finish((5, "replan"), world, 3, str(tmp_path), 40, 0, "") == REPLAN_CODE  # not rank 0: no file
    assert leaving.finish((5, "restart"), world, 4, "", 40, 0, "") == EXIT_EXCLUDE  # rank 4 shares node 2
    assert leaving.finish((5, "restart"), world, 1, "", 40, 0, "") == EXIT_REJOIN
    from compiler import run_command
    assert leaving.finish((5, "replan"), world, 0, str(tmp_path), 40, 0, "slow") == REPLAN_CODE
    asked = run_command.read_request(str(tmp_path))  # what the program wrote is what `scalec run` reads, once
    assert asked is not None and asked["nodes"] == 4 and asked["exclude"] == [2]
    assert run_command.read_request(str(tmp_path)) is None


# slow tier: 8-25 s of two CPU processes here; the scores, the naming and the timeline it relies on are this file's
# unit tests above, and the 8-rank drills are bench/straggler_drill.py
@pytest.mark.slow
def test_a_slowed_rank_is_named_in_a_two_rank_run(tmp_path):
    """gpt_dp (dp = 2, DDP on gloo) under torchrun with rank 1 doing twice its compute from step 11: the
    window of steps 11-20 names rank 1, its node and a compute section; the window before names nobody. The compute
    sections are timed by the training thread's CPU time, the runtime's CPU default: two ranks on a shared 2-core
    machine. The 8-rank drills are bench/straggler_drill.py."""
    import json
    import os
    import subprocess
    from pathlib import Path

    from compiler import codegen
    from compiler.check import check_text
    from compiler.pipeline import compile_spec
    root = Path(__file__).resolve().parents[1]
    text = (root / "samples" / "gpt_dp.scale").read_text().replace("log_every    = 5", "log_every    = 100")
    codegen.emit(compile_spec(check_text(text, "drill.scale")), str(tmp_path / "build"))
    program = tmp_path / "build" / "program.py"
    program.write_text(program.read_text().replace(
        "CONFIG = train.Config(",
        "CONFIG = train.Config(\n    resilience=train.Resilience(threshold=0.8, window=10),", 1))
    metrics = tmp_path / "m.jsonl"
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1", SCALEC_TEST_SLOW="1:11:1.0")
    env.pop("SCALEC_TEST_CPU_CLOCK", None)
    out = subprocess.run(["bash", str(tmp_path / "build" / "launch.sh"), "--steps", "21", "--metrics", str(metrics)],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "scalec: straggler at steps 11-20: rank 1 (node 0, " in out.stdout, out.stdout
    assert any(f"is slow in {s} " in out.stdout for s in sections.SLOWED), out.stdout  # each slowed alike
    assert "straggler at steps 1-10" not in out.stdout and "scalec: what-if (steps 11-20): without rank 1" in out.stdout
    records = {r["step"]: r for r in map(json.loads, metrics.read_text().splitlines())}
    assert records[21]["stragglers"] == [1] and records[21]["straggler_window"] == [11, 20]
    assert len(records[21]["relative_score"]) == 2 and records[11]["stragglers"] == []


def test_an_unhealthy_device_is_named_and_its_node_marked(tmp_path, capsys):
    """The window's health check (runtime.health.Monitor's reasons, here given): rank 0 names the device and marks
    its node `unhealthy` in the node record; a healthy window says nothing."""
    from types import SimpleNamespace

    from runtime import node_record
    reasons = [["clocks held down: hw_slowdown"]]
    fake = SimpleNamespace(health=SimpleNamespace(check=lambda: reasons[0]), marked=set(),
                           ctx=SimpleNamespace(world_size=1, is_logger=True),
                           world=[{"node": 0, "host": "h0", "device": "cuda:0", "name": "node0"}],
                           cfg=SimpleNamespace(checkpoint=SimpleNamespace(dir=str(tmp_path))))
    stragglers.Detector._health(fake, 20)
    assert "rank 0 (node 0, h0, cuda:0) is unhealthy at step 20: clocks held down: hw_slowdown" in \
        capsys.readouterr().out
    events = node_record.NodeRecord(str(tmp_path / node_record.FILE)).load()["node0"]
    assert [e["kind"] for e in events] == ["unhealthy"] and events[0]["detail"]["step"] == 20
    stragglers.Detector._health(fake, 25)  # unhealthy again: named again, but marked once an attempt
    assert "unhealthy at step 25" in capsys.readouterr().out
    assert len(node_record.NodeRecord(str(tmp_path / node_record.FILE)).load()["node0"]) == 1
    reasons[0] = []
    stragglers.Detector._health(fake, 30)
    assert capsys.readouterr().out == ""


def test_a_node_that_keeps_failing_is_left_out_at_start_up(tmp_path, capsys, monkeypatch):
    """The node record found node2 slow in two earlier attempts: with on_straggler = replan rank 0 asks to leave it
    out after the first step; with `report`, or found once, nobody is."""
    from types import SimpleNamespace

    from runtime import faults, leaving, node_record
    record = node_record.NodeRecord(str(tmp_path / node_record.FILE))
    for attempt in (0, 1):
        record.mark("node2", "slow", {"rank": 5, "section": "backward", "score": 0.6, "step": 20}, attempt)
    record.mark("node1", "slow", {"rank": 3, "section": "forward", "score": 0.7, "step": 20}, 1)
    world = [{"node": r // 2, "name": f"node{r // 2}", "host": "h"} for r in range(8)]

    def detector(action):
        return SimpleNamespace(on_straggler=action, world=world, verdict="",
                               cfg=SimpleNamespace(checkpoint=SimpleNamespace(dir=str(tmp_path))))
    monkeypatch.setattr(faults, "_LEAVE", 0.0)
    d = detector("report")
    stragglers.Detector._leave_remembered(d)
    assert not faults.leave_asked() and d.verdict == ""
    d = detector("replan")
    stragglers.Detector._leave_remembered(d)
    assert leaving.decode(faults._LEAVE) == (4, "replan")  # node2's first rank
    assert "it keeps failing: node node2" in d.verdict and "slow in attempts 0 and 1" in d.verdict
    assert "node 2 (node2) is left out after the first step" in capsys.readouterr().out


def test_an_action_waits_for_the_same_rank_named_in_two_windows_in_a_row(tmp_path, capsys, monkeypatch):
    """on_straggler = replan takes a node away: a rank named in one window is only reported (a noisy window on a
    shared host names someone now and then); named again in the next, its node is left out."""
    from runtime import faults, leaving
    monkeypatch.setattr(faults, "_LEAVE", 0.0)
    world = [{"node": r // 2, "name": f"node{r // 2}", "host": "h", "device": "cpu",
              "coords": {"dp": r}} for r in range(4)]
    fake = SimpleNamespace(threshold=0.8, groups=[0] * 4, best=[], best_medians=[], episode=None, history=[],
                           world=world, pipeline=None,
                           on_straggler="replan", exclude="node", named_before=set(), verdict="", pending={},
                           track=SimpleNamespace(log=lambda *a: None), _remember=lambda *a: None)
    slow = dict(NORMAL, forward=20, backward=40)
    tables = [torch.tensor(table([NORMAL, NORMAL, NORMAL, slow])) for _ in range(2)]
    stragglers.Detector.score(fake, tables[0], 1, 10)
    out = capsys.readouterr().out
    assert "rank 3 (node 1" in out and "named in one window; acted on if named again" in out
    assert not faults.leave_asked()
    stragglers.Detector.score(fake, tables[1], 11, 20)
    assert leaving.decode(faults._LEAVE) == (3, "replan")
    assert "node 1 (node1) is left out after the next step" in capsys.readouterr().out


def test_a_sustained_naming_is_reported_and_not_acted_on(tmp_path, capsys, monkeypatch):
    """A rank named only as `sustained`, in window after window, is logged and in the metrics, and on_straggler =
    replan does not take its node away (nor does the node record hold it against the node)."""
    from runtime import faults
    monkeypatch.setattr(faults, "_LEAVE", 0.0)
    world = [{"node": r // 2, "name": f"node{r // 2}", "host": "h", "device": "cpu",
              "coords": {"dp": r}} for r in range(4)]
    remembered = []
    fake = SimpleNamespace(threshold=0.8, groups=[0] * 4, best=[], best_medians=[], episode=None, history=[],
                           world=world, pipeline=None,
                           on_straggler="replan", exclude="node", named_before=set(), verdict="", pending={},
                           track=SimpleNamespace(log=lambda *a: None), _remember=lambda *a: remembered.append(a))
    slow = dict(NORMAL, forward=11.5, backward=23)  # 0.87: never below 0.8 in one window
    for w in range(stragglers.SUSTAINED + 2):
        stragglers.Detector.score(fake, torch.tensor(table([NORMAL, NORMAL, NORMAL, slow])), 10 * w + 1, 10 * w + 10)
    out = capsys.readouterr().out
    assert out.count("rank 3 (node 1") == 3 and "sustained score" in out
    assert fake.pending["stragglers"] == [3]
    assert not faults.leave_asked() and "left out" not in out and remembered == []


def test_the_drill_hook_can_be_held_to_one_world_or_one_node(monkeypatch):
    """SCALEC_TEST_SLOW's `@WORLD` (a re-planned run on the nodes left is not slowed again) and `@NAME` (the spare
    that takes a node's place is not slowed)."""
    cpu = torch.device("cpu")
    monkeypatch.setenv("SCALEC_TEST_SLOW", "5:21:1.0@8")
    assert sections.start_slow(5, cpu, 8) is not None and sections.start_slow(5, cpu, 6) is None
    assert sections.start_slow(4, cpu, 8) is None  # another rank
    monkeypatch.setenv("SCALEC_TEST_SLOW", "5:21:1.0@node2")
    monkeypatch.setenv("SCALEC_NODE", "node2")
    assert sections.start_slow(5, cpu, 8) is not None
    monkeypatch.setenv("SCALEC_NODE", "node4")
    assert sections.start_slow(5, cpu, 8) is None
    monkeypatch.setenv("SCALEC_TEST_SLOW", "*:21:1.0@fresh")
    assert sections.start_slow(3, cpu, 8) is not None  # every rank, no node left out yet
    monkeypatch.setenv("SCALEC_LEFT_OUT", "1")
    assert sections.start_slow(3, cpu, 8) is None
    monkeypatch.delenv("SCALEC_TEST_SLOW")
    sections.start_slow(5, cpu, 8)  # leaves no slow rank behind for the other tests


def test_a_straggler_s_node_is_marked_slow_once_an_attempt(tmp_path):
    """Named in every window, its node is marked `slow` in the node record once (the first window) this attempt."""
    from runtime import node_record
    fake = SimpleNamespace(marked=set(), world=[{"node": 1, "name": "node1", "host": "h"}],
                           cfg=SimpleNamespace(checkpoint=SimpleNamespace(dir=str(tmp_path))))
    named = [{"rank": 0, "section": "backward", "score": 0.5}]
    for last in (10, 20, 30):
        stragglers.Detector._remember(fake, named, last)
    events = node_record.NodeRecord(str(tmp_path / node_record.FILE)).load()["node1"]
    assert [(e["kind"], e["detail"]["step"]) for e in events] == [("slow", 10)]


def test_a_node_that_crashes_in_two_attempts_in_a_row_is_recorded_and_left_out(tmp_path, capsys, monkeypatch):
    """node2's agent saw its workers crash in attempts 0 and 1: rank 0 of attempts 1 and 2 marks it, and attempt 2
    leaves it out after the first step (on_straggler = replan), saying why."""
    from types import SimpleNamespace

    from runtime import faults, leaving
    seen = {"rank": 4, "exit": -9, "how": "killed by SIGKILL"}
    world = [{"node": r // 2, "name": f"node{r // 2}", "host": "h", "crashed": seen if r // 2 == 2 else None}
             for r in range(8)]
    d = SimpleNamespace(on_straggler="replan", world=world, verdict="",
                        cfg=SimpleNamespace(checkpoint=SimpleNamespace(dir=str(tmp_path))))
    monkeypatch.setattr(faults, "_LEAVE", 0.0)
    for attempt in (1, 2):
        monkeypatch.setattr(faults, "_ATTEMPT", attempt)
        stragglers.Detector._remember_crashes(d)
        stragglers.Detector._leave_remembered(d)
        assert faults.leave_asked() == (attempt == 2)
    out = capsys.readouterr().out
    assert "node 2 (node2)'s workers crashed in the last attempt (rank 4, killed by SIGKILL)" in out
    assert leaving.decode(faults._LEAVE) == (4, "replan")
    assert "node 2 (node2) is left out after the first step: it keeps failing: node node2" in out
    assert "crashing in attempts 0 and 1 (rank 4 killed by SIGKILL)" in d.verdict
