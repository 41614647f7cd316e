"""Per-rank timing sections of every step, for the straggler detector (runtime.stragglers).

A step's time is cut into sections: data, forward, backward, optimizer, checkpoint, evaluation, the wait in each
kind of collective, and `other` (host work in no marked region). The cuts are the regions runtime.faults already
marks for its watchdog (`faults.op(..., kind=...)`: every collective and every collective region of the loop) and a
few compute-only regions marked here (`section`: data, the optimizer, a pipeline stage's forward and backward). Time
is exclusive: a region inside another (a tp all-reduce inside the forward) takes its time out of the outer one.

On CUDA the cuts are events recorded on the current stream (the device's time, not the host's, which runs ahead),
resolved only when the window's rows are read (`Timeline.rows`, once per window, where the detector gathers them
anyway): no host-device synchronisation inside a step. On CPU each cut reads two clocks: the compute sections
(`COMPUTE`) take the training thread's CPU time (`time.thread_time`), the others the wall time
(`time.perf_counter`). The CPU time is the CPU's counterpart of the device time the events measure: the work the
rank did, not the moments it spent waiting for a core. The thread's, not the process's: the process's time counts
the collectives' own threads too (gloo's, busy during DDP's overlapped reductions), and 8 ranks on this 2-core
machine then named 11 ranks falsely in 1,000 clean steps against none on the thread's clock. A host running more
processes than cores (this project's 2-core CI running 8 ranks) deschedules each rank for slices as long as a step,
and a wall-clock compute section is then mostly the scheduler's noise: the straggler detector would name whichever
rank waited longest for a core. The cost: a CPU rank slowed only because other processes take its cores is not named
(it computes no longer), nor the intra-op pool's share of a multi-threaded operation beyond the training thread's
own; a slower CPU, a busier rank or one doing more work is. SCALEC_TEST_CPU_CLOCK=wall times every section on the
wall clock, =thread on the training thread's CPU time (tests and the drill's comparisons).

A backward that ends with the gradient reduction (DDP's bucketed all-reduce, which DDP waits for inside
`loss.backward()`) is split where the last parameter's gradient was accumulated (a post-accumulate-grad hook marks
it): before is the backward's compute, after is the wait in the gradient reduction. Without that split a slow
rank's peers would show its delay in their backward, not in a wait.

Test-only drill hook, read only when set (as runtime.faults' SCALEC_TEST_* hooks): SCALEC_TEST_SLOW=RANK:STEP:
FRACTION[:RAMP_STEPS] makes that rank do extra matrix products at the start of each forward, backward and optimizer
step from step STEP (1-based) on, so that its compute takes FRACTION longer than this rank's own (the medians of the
last window before STEP), rising linearly over RAMP_STEPS steps when given: slow, computing, not hung, as a slow
device is slow in all its work.
"""
from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time

import torch

SECTIONS = ("data", "forward", "backward", "optimizer", "checkpoint", "eval", "other",
            "grad_reduce", "loss_reduce", "pp_p2p", "all_reduce", "all_gather", "reduce_scatter", "wait")
"""The sections in the order of the gathered table's columns."""
COMPUTE = ("data", "forward", "backward", "optimizer")
"""The sections a rank spends on its own work: where a slow rank is slow. The others are its peers' too."""
WAITS = ("grad_reduce", "loss_reduce", "pp_p2p", "all_reduce", "all_gather", "reduce_scatter", "wait")
"""The waits in collectives: where the peers of a slow rank wait for it (they explain, they never name)."""
INDEX = {name: i for i, name in enumerate(SECTIONS)}
_COMPUTE_COLUMNS = frozenset(INDEX[name] for name in COMPUTE)
_OTHER, _BACKWARD, _GRAD, _EVAL = INDEX["other"], INDEX["backward"], INDEX["grad_reduce"], INDEX["eval"]
BACKWARD_SYNC = "backward_sync"
"""A region's kind for a backward that ends in the gradient reduction: split at the last gradient's accumulation."""


class Timeline:
    """This rank's sections, one row of seconds per step: `begin` a step, regions `enter`/`exit` (nested), `end`
    it; `rows()` resolves the rows kept since the last call (CUDA: waits for the last event recorded)."""

    def __init__(self, device: torch.device, clock=None, compute_clock=None):
        self.cuda = device.type == "cuda"
        # CPU: (wall clock, compute sections' clock); one clock given (tests) is both
        wall, compute = cpu_clocks()
        self.clock = clock or wall
        self.compute_clock = compute_clock or clock or compute
        self.stack: list[int] = []
        self.count = 0          # cuts made in this step (a split mark is used only if none came after it)
        self.mark_at = None     # (count, time or event) of the last gradient accumulated
        self.open = False
        self.pending: list = []  # CPU: rows of seconds; CUDA: per step, [(column, event)] after its first event
        self.row = None
        self.last = None
        self._pool: list = []

    # -- cuts ---------------------------------------------------------------------------------------------------

    def _now(self):
        if not self.cuda:
            return self.clock(), self.compute_clock()
        ev = self._pool.pop() if self._pool else torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def _cut(self, column: int, now) -> None:
        """The interval from the last cut to `now` goes to `column` (a synced backward's, -1, to the backward)."""
        column = _BACKWARD if column == -1 else column
        if self.cuda:
            self.row.append((column, now))
        else:
            which = 1 if column in _COMPUTE_COLUMNS else 0
            self.row[column] += now[which] - self.last[which]
        self.last = now
        self.count += 1

    def begin(self) -> None:
        now = self._now()
        self.row = [] if self.cuda else [0.0] * len(SECTIONS)
        if self.cuda:
            self.row.append((-1, now))  # the step's first cut
        self.last, self.stack, self.count, self.mark_at, self.open = now, [], 0, None, True

    def end(self) -> None:
        if not self.open:
            return
        self._cut(self.stack[-1] if self.stack else _OTHER, self._now())
        self.pending.append(self.row)
        self.open = False

    def enter(self, kind: str) -> None:
        if not self.open:
            return
        top = self.stack[-1] if self.stack else _OTHER
        self._cut(top, self._now())
        # inside an evaluation everything is the evaluation's (a pipeline stage's forward too)
        self.stack.append(_EVAL if top == _EVAL else -1 if kind == BACKWARD_SYNC else INDEX[kind])

    def exit(self) -> None:
        if not (self.open and self.stack):  # a region entered before this step began
            return
        top = self.stack.pop()
        if top == -1:  # the backward with its gradient reduction: split at the last accumulation
            mark = self.mark_at
            if mark is not None and mark[0] == self.count:
                self._cut(_BACKWARD, mark[1])
                self._cut(_GRAD, self._now())
            else:
                self._cut(_BACKWARD, self._now())
        else:
            self._cut(top, self._now())

    def mark(self, *_) -> None:
        """The backward's own work ended (`mark_backward_end`'s callback): what follows in a synced backward is the
        gradient reduction's wait."""
        if not (self.open and self.stack and self.stack[-1] == -1):
            return
        if self.cuda and self.mark_at is not None and self.mark_at[0] == self.count:
            self.mark_at[1].record()  # marked again before another cut: its event re-recorded
        else:
            self.mark_at = (self.count, self._now())

    # -- reading ------------------------------------------------------------------------------------------------

    def rows(self) -> list[list[float]]:
        """The rows of the steps ended since the last call, in seconds per section; CUDA: resolved now."""
        pending, self.pending = self.pending, []
        if not self.cuda:
            return pending
        if pending:
            pending[-1][-1][1].synchronize()
        out = []
        for row in pending:
            secs = [0.0] * len(SECTIONS)
            prev = row[0][1]
            for column, ev in row[1:]:
                secs[column] += prev.elapsed_time(ev) / 1e3
                self._pool.append(prev)
                prev = ev
            self._pool.append(prev)
            out.append(secs)
        return out


def cpu_clocks():
    """The clocks of CPU sections, (the waits' and the others', the compute sections'): by default
    (time.perf_counter, time.thread_time), see the module's docstring; SCALEC_TEST_CPU_CLOCK=wall: perf_counter
    for both, =thread: time.thread_time (the training thread's CPU time) for both."""
    which = os.environ.get("SCALEC_TEST_CPU_CLOCK")
    if which == "wall":
        return time.perf_counter, time.perf_counter
    if which == "thread":
        return time.thread_time, time.thread_time
    return time.perf_counter, time.thread_time


_TIMELINE: Timeline | None = None


def set_timeline(timeline: Timeline | None) -> None:
    """The timeline `section` regions go to (the one runtime.faults' marks go to too), or None."""
    global _TIMELINE
    _TIMELINE = timeline


def mark_backward_end(loss: torch.Tensor) -> None:
    """Before `loss.backward()` whose backward ends in the gradient reduction (BACKWARD_SYNC): the timeline's mark
    at the end of the backward's own work, where the reduction's wait begins. A hook on `loss` runs first in its
    backward and queues a callback, which autograd runs once the backward's graph is done, before the callbacks
    that DDP (once its last bucket is ready) and FSDP2 (from its hooks on the model's output, which `loss` divides)
    queue later to wait for their reductions. One call a backward: a hook per parameter cost autograd 2.7 µs each
    (bench/straggler_drill.py `mark_cost` measures this one's)."""
    timeline = _TIMELINE
    if timeline is None or not loss.requires_grad:
        return

    def queue(_grad):
        torch.autograd.Variable._execution_engine.queue_callback(timeline.mark)
    loss.register_hook(queue)


class section:
    """`with section("data"):` a compute-only region of the step (no collective: not a watchdog mark)."""
    __slots__ = ("kind",)

    def __init__(self, kind: str):
        self.kind = kind

    def __enter__(self):
        if _TIMELINE is not None:
            _TIMELINE.enter(self.kind)

    def __exit__(self, *exc):
        if _TIMELINE is not None:
            _TIMELINE.exit()
        return False


# -- the drill: SCALEC_TEST_SLOW ---------------------------------------------------------------------------------


SLOWED = ("forward", "backward", "optimizer")
"""The regions the drill's hook slows: a rank's whole compute but its data loading (a slow device)."""


def slow_setting(value: str | None) -> tuple | None:
    """SCALEC_TEST_SLOW's RANK:STEP:FRACTION[:RAMP_STEPS] as (rank, step, fraction, ramp), or None."""
    if not value:
        return None
    parts = value.split(":")
    if len(parts) not in (3, 4):
        raise SystemExit(f"scalec: SCALEC_TEST_SLOW={value}: expected RANK:STEP:FRACTION[:RAMP_STEPS]")
    rank = None if parts[0] == "*" else int(parts[0])  # *: every rank (with @NAME: every rank of that node)
    return rank, int(parts[1]), float(parts[2]), int(parts[3]) if len(parts) == 4 else 0


def slow_fraction(setting: tuple, step: int) -> float:
    """How much longer this rank's compute takes at `step` (1-based): 0 before the onset, FRACTION
    after it, rising linearly over RAMP_STEPS steps (reaching FRACTION at onset + RAMP_STEPS - 1)."""
    _, onset, fraction, ramp = setting
    if step < onset:
        return 0.0
    return fraction * min(1.0, (step - onset + 1) / ramp) if ramp else fraction


class Slow:
    """The drill's extra work on one rank: at the start of each SLOWED region (forward, backward, optimizer) from
    the onset on, matrix products for `slow_fraction` × this rank's own median time of that region (per step, over
    the last window read before the onset). On CPU the products run until that much time has passed (as much
    computing as the time asks, whatever the other processes on the cores do); on CUDA their number comes from one
    timed calibration (the only synchronisation, once, in a test-only path)."""

    def __init__(self, setting: tuple, device: torch.device):
        self.setting, self.device = setting, device
        self.cuda = device.type == "cuda"
        n = 512 if self.cuda else 64
        self.a = torch.randn(n, n, device=device)
        self.b = torch.randn(n, n, device=device)
        self.base: dict | None = None  # seconds per step of each SLOWED region before the onset
        self.recent: list = []         # rows of the last window read
        self.unit = None               # CUDA: seconds per product
        self.fraction = 0.0
        self.step_calls: dict = {}     # region kind -> regions entered this step (each gets its share)
        self.calls: dict = {}          # region kind -> regions per step (learned before the onset)
        self.done = 0.0                # seconds of extra work done (the drill compares the what-if with it)
        self.reported = 0.0            # `done` when the last window's was printed

    def seen(self, rows: list, first: int = 0, last: int = 0) -> None:
        """A window's rows were read (steps `first`-`last`): before the onset kept for the base; after it, the
        extra work done since the last window printed per step (the cost the drills hold the what-if to)."""
        if rows and self.base is None:
            self.recent = rows
        elif self.base is not None and last >= first > 0:
            who = self.setting[0] if self.setting[0] is not None else "(every rank here)"
            print(f"scalec: SCALEC_TEST_SLOW: rank {who} steps {first}-{last}: "
                  f"{(self.done - self.reported) / (last - first + 1) * 1e3:.3f} ms of extra work per step",
                  flush=True)
            self.reported = self.done

    def begin_step(self, step: int) -> None:
        for kind, n in self.step_calls.items():
            if self.base is None and n:
                self.calls[kind] = n
        self.step_calls = {}
        self.fraction = slow_fraction(self.setting, step)
        if self.fraction and self.base is None:
            if not self.recent:
                print("scalec: SCALEC_TEST_SLOW needs the section times of a window before its onset (straggler "
                      "detection on, onset after the first window)", file=sys.stderr, flush=True)
                self.fraction = 0.0
                return
            self.base = {kind: statistics.median(r[INDEX[kind]] for r in self.recent)
                         for kind in SLOWED}
            who = self.setting[0] if self.setting[0] is not None else "(every rank here)"
            print(f"scalec: SCALEC_TEST_SLOW: rank {who} forward {self.base['forward'] * 1e3:.3f} ms + "
                  f"backward {self.base['backward'] * 1e3:.3f} ms + optimizer {self.base['optimizer'] * 1e3:.3f} ms "
                  f"per step before step {self.setting[1]}; "
                  f"{self.setting[2]:.0%} more from there", flush=True)

    def work(self, kind: str) -> None:
        """At the start of a SLOWED region: this call's share of the step's extra work."""
        self.step_calls[kind] = self.step_calls.get(kind, 0) + 1
        if not self.fraction:
            return
        seconds = self.fraction * self.base[kind] / max(1, self.calls.get(kind, 1))
        if self.cuda:
            self.done += seconds  # as many products as that takes (calibrated once): no clock read per call
            if self.unit is None:
                torch.cuda.synchronize(self.device)
                t = time.perf_counter()
                for _ in range(20):
                    torch.mm(self.a, self.b)
                torch.cuda.synchronize(self.device)
                self.unit = (time.perf_counter() - t) / 20
            for _ in range(round(seconds / self.unit)):
                torch.mm(self.a, self.b)
            return
        clock = cpu_clocks()[1]  # as much computing as the compute sections' clock counts
        began = clock()
        deadline = began + seconds
        while clock() < deadline:
            torch.mm(self.a, self.b)
        self.done += clock() - began  # what it did: the last product's overshoot too


_SLOW: Slow | None = None


def start_slow(rank: int, device: torch.device, world: int = 0) -> Slow | None:
    """The drill's Slow when SCALEC_TEST_SLOW names this rank (`*`: every rank), else None. After it, `@WORLD`
    slows it only in a world of that many ranks (a re-planned run on the nodes left is not slowed again), `@NAME`
    only on the node of that name (runtime.node_record.node_name), `@fresh` only in an attempt no node has been left
    out of (the spare that takes the node's place, and whatever rank it gets, is not slowed)."""
    global _SLOW
    from runtime.node_record import LEFT_OUT_ENV, node_name
    value, _, only = (os.environ.get("SCALEC_TEST_SLOW") or "").partition("@")
    if only == "fresh":  # only in an attempt no node has been left out of yet (runtime.launch sets LEFT_OUT_ENV)
        here = not os.environ.get(LEFT_OUT_ENV, "").strip("0")
    else:
        here = not only or (int(only) == world if only.isdigit() else only == node_name())
    setting = slow_setting(value) if here else None
    _SLOW = Slow(setting, device) if setting and setting[0] in (None, rank) else None
    return _SLOW


def slow_work(kind: str) -> None:
    """A forward, backward or optimizer region begins: the drill's extra work, when this rank is the slowed one."""
    if _SLOW is not None and not (_TIMELINE and _TIMELINE.stack and _TIMELINE.stack[-1] == _EVAL):
        _SLOW.work(kind)


@contextlib.contextmanager
def timed(timeline: Timeline | None):
    """`timeline` receives the marks (runtime.faults' regions and `section`) inside the block."""
    from runtime import faults
    set_timeline(timeline)
    faults.set_sections(timeline)
    try:
        yield
    finally:
        set_timeline(None)
        faults.set_sections(None)
