"""Pipeline schedules as data: each rank's ordered actions (made by runtime/schedule.py, which the program also
executes), a step × rank grid, an SVG timeline, and a static proof that they run.

The notation (`2F0`: stage 2, forward, micro-batch 0) and the schedules are described in runtime/schedule.py.

`verify` simulates the lists with blocking receives and buffered sends and reports the first rank that would wait
forever, a receive without its send, a send nobody receives, and any (stage, micro-batch) computed twice or never.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

from runtime.schedule import SCHEDULES, Action, Layout, actions, compute_order, with_communication  # noqa: F401
# the timing model lives in the runtime, which replays measured steps with it (runtime.stragglers)
from runtime.schedule_time import ScheduleError, finish_times, pair_seconds, steps, timed  # noqa: F401

# -- the static check ---------------------------------------------------------------------------------------------


COST = {"F": 1, "B": 2, "I": 1, "W": 1}  # relative durations for the timeline (backward ≈ 2 × forward)


@dataclass
class Timeline:
    """When each compute action ran: rank -> [(start, end, action)], in the given unit costs."""

    spans: dict
    makespan: float
    work: int = 0  # steps `verify` took: actions looked at (an action that waits is looked at again) and ranks resumed


    def idle_fraction(self, rank: int) -> float:
        busy = sum(e - s for s, e, _ in self.spans[rank])
        return 1 - busy / self.makespan


def verify(order: dict[int, list[Action]], lay: Layout, cost: dict | None = None, transfer: float = 0.0) -> Timeline:
    """Run the lists as the runtime would: each rank in order, a receive waits for its send, sends never wait.

    `cost` gives each computation's duration by kind ("F", "B", "I", "W"): a number, or a sequence indexed by stage
    (the step-time model, compiler/cost/step_time.py, gives each stage its own); `transfer` is the time a send takes to
    arrive (the receive of a message sent at t completes no earlier than t + transfer).

    The work is linear in the number of actions A: each action is looked at once, and once more if its rank had to
    wait at it (an action waits for one event); a rank is resumed once at the start and once per wait, each resume
    a heap operation over at most p ranks. So `Timeline.work` <= 3A + p, and nothing else walks more than the
    (stage, micro-batch) tables once: the published 530B (p 35 × v 3, 280 micro-batches) and 1T (p 64, 512)
    configurations verify in a fraction of a second (bench/schedule_check.py).

    Stages live where `lay` puts them (looped or a V); an overlap runs as its sub-actions in order (on a GPU they
    share the time: an upper bound); B, I and W may mix. Raises ScheduleError naming the rank and action on a
    deadlock, an unmatched send or receive, a missing, repeated or misplaced computation, or an early action."""
    cost = cost or COST
    order = _check_each_computation_once({r: [x for a in acts for x in a.parts] for r, acts in order.items()}, lay)
    n_stages, m, last = lay.stages, lay.m, lay.stages - 1
    # Event tables: 0 forward done, 1 backward (input) done, 2 activation sent, 3 gradient sent.
    events = [[[None] * m for _ in range(n_stages)] for _ in range(4)]
    received = [[[False] * m for _ in range(n_stages)] for _ in range(2)]  # 0 activation, 1 gradient
    FWD, BWD, SENT_F, SENT_B = 0, 1, 2, 3
    pos = dict.fromkeys(order, 0)
    clock = dict.fromkeys(order, 0.0)
    spans: dict = {r: [] for r in order}
    ready = [(0.0, r) for r in order]
    heapq.heapify(ready)
    blocked: dict = {}  # rank -> (action, event it waits for)
    waiting: dict = {}  # event -> rank

    def record(table: int, st: int, k: int, when: float) -> None:
        events[table][st][k] = when
        r_wait = waiting.pop((table, st, k), None)
        if r_wait is not None:
            blocked.pop(r_wait, None)
            heapq.heappush(ready, (clock[r_wait], r_wait))

    # Actions as small integers (the hot loop runs once per action: p = 128, m = 512 is ~400k of them).
    dur = [list(x) if isinstance(x, (list, tuple)) else [x] * n_stages
           for x in (cost.get(k, 0) for k in ("F", "B", "I", "W"))]
    coded = {r: [(_CODE_OF[a.kind], a.stage, a.mb) for a in acts] for r, acts in order.items()}
    home = [lay.rank_of(st) for st in range(n_stages)]
    ev_f, ev_b, ev_sf, ev_sb = events
    recv_f, recv_b = received
    work = 0
    while ready:
        _, r = heapq.heappop(ready)
        work += 1
        if r in blocked:
            continue
        acts, codes, span_r = order[r], coded[r], spans[r]
        i, t = pos[r], clock[r]
        n = len(codes)
        while i < n:
            work += 1
            c, st, k = codes[i]
            need = None
            if c == 6:                                       # RECV_F
                need = (SENT_F, st - 1, k)
            elif c == 7:                                     # RECV_B
                need = (SENT_B, st + 1, k)
            elif c == 0:                                     # F
                if st > 0:
                    if home[st - 1] == r:
                        need = (FWD, st - 1, k)
                    elif not recv_f[st - 1][k]:
                        raise ScheduleError(f"rank {r}: {acts[i]} runs before its input is received "
                                            f"(no {st}RECV_F{k} before it)")
            elif c == 1 or c == 2:                           # B, I
                if ev_f[st][k] is None:
                    raise ScheduleError(f"rank {r}: {acts[i]} runs before {st}F{k}")
                if st < last:
                    if home[st + 1] == r:
                        need = (BWD, st + 1, k)
                    elif not recv_b[st + 1][k]:
                        raise ScheduleError(f"rank {r}: {acts[i]} runs before its output gradient is received "
                                            f"(no {st}RECV_B{k} before it)")
            elif c == 3:                                     # W
                if ev_b[st][k] is None:
                    raise ScheduleError(f"rank {r}: {acts[i]} runs before {st}I{k}")
            elif c == 4:                                     # SEND_F
                if ev_f[st][k] is None:
                    raise ScheduleError(f"rank {r}: {acts[i]} sends before {st}F{k} computed it")
            elif c == 5 and ev_b[st][k] is None:             # SEND_B
                raise ScheduleError(f"rank {r}: {acts[i]} sends before the backward of micro-batch {k} "
                                    "computed it")
            if need is not None:
                when = events[need[0]][need[1]][need[2]]
                if when is None:
                    blocked[r] = (acts[i], need)
                    waiting[need] = r
                    break
                if when > t:
                    t = when
            end = t + dur[c][st] if c < 4 else t
            if c == 0:
                span_r.append((t, end, acts[i]))
                record(FWD, st, k, end)
            elif c == 1 or c == 2:
                span_r.append((t, end, acts[i]))
                record(BWD, st, k, end)
            elif c == 3:
                span_r.append((t, end, acts[i]))
            elif c == 4:
                record(SENT_F, st, k, t + transfer)
            elif c == 5:
                record(SENT_B, st, k, t + transfer)
            elif c == 6:
                recv_f[st - 1][k] = True
            else:
                recv_b[st + 1][k] = True
            t = end
            i += 1
        pos[r], clock[r] = i, t
    if blocked:
        _deadlock(order, blocked, pos)
    _check_every_send_received(events, received, lay)
    makespan = max((e for sp in spans.values() for _, e, _ in sp), default=0.0)
    return Timeline(spans, makespan, work)


def _check_each_computation_once(order: dict, lay: Layout) -> dict:
    """Every computation on the rank its stage lives on, each (stage, micro-batch) forward and backward exactly
    once, and a weight half (W) exactly for each input half (I), none for a full backward (B). Returns `order`."""
    n_stages, m = lay.stages, lay.m
    count_f = [[0] * m for _ in range(n_stages)]
    count_b = [[0] * m for _ in range(n_stages)]
    split = [[0] * m for _ in range(n_stages)]  # +1 per I, -1 per W: 0 at the end
    for r, acts in order.items():
        for a in acts:
            if a.kind in COST and lay.rank_of(a.stage) != r:
                raise ScheduleError(f"rank {r}: {a} computes stage {a.stage}, which lives on rank "
                                    f"{lay.rank_of(a.stage)}")
            if a.kind in ("F", "B", "I"):
                table = count_f if a.kind == "F" else count_b
                table[a.stage][a.mb] += 1
                if table[a.stage][a.mb] > 1:
                    raise ScheduleError(f"rank {r}: {a} is computed twice")
            if a.kind in ("I", "W"):
                split[a.stage][a.mb] += 1 if a.kind == "I" else -1
                if split[a.stage][a.mb] < 0:
                    raise ScheduleError(f"rank {r}: {a} has no input half {a.stage}I{a.mb} (or runs twice)")
    for st in range(n_stages):
        for k in range(m):
            if split[st][k]:
                raise ScheduleError(f"rank {lay.rank_of(st)}: {st}I{k} has no weight half {st}W{k}")
    for table, what in ((count_f, "forward"), (count_b, "backward")):
        for st in range(n_stages):
            for k in range(m):
                if not table[st][k]:
                    raise ScheduleError(f"rank {lay.rank_of(st)}: {what} of micro-batch {k} on stage {st} never runs")
    return order


_CODE_OF = {"F": 0, "B": 1, "I": 2, "W": 3, "SEND_F": 4, "SEND_B": 5, "RECV_F": 6, "RECV_B": 7}
"""verify's actions as small integers."""

_EVENT_NAMES = ("{st}F{k}", "{st}I{k}", "{st}SEND_F{k}", "{st}SEND_B{k}")
"""What provides each event of verify's tables (0 forward done, 1 backward (input) done, 2 activation sent, 3
gradient sent)."""


def _deadlock(order: dict, blocked: dict, pos: dict) -> None:
    """Raise the deadlock verify found, root cause first: a rank waiting for something no list contains; else the
    waits form a cycle."""
    present = {str(x) for acts in order.values() for x in acts}

    def provider(table: int, st: int, k: int) -> str:
        return _EVENT_NAMES[table].format(st=st, k=k)

    def absent(item) -> bool:
        table, st, k = item[1][1]
        return provider(table, st, k) not in present and (table != 1 or f"{st}B{k}" not in present)

    r, (a, need) = min(blocked.items(), key=lambda it: (not absent(it), it[0]))
    cause = "no rank ever runs it" if absent((r, (a, need))) else "it waits behind this rank (a cycle)"
    raise ScheduleError(f"rank {r} waits forever at {a} (action {pos[r]} of {len(order[r])}): it needs "
                        f"{provider(*need)}, and {cause}")


def _check_every_send_received(events: list, received: list, lay: Layout) -> None:
    for table, got, kind in ((2, 0, "F"), (3, 1, "B")):
        for st in range(lay.stages):
            for k in range(lay.m):
                if events[table][st][k] is not None and not received[got][st][k]:
                    raise ScheduleError(f"rank {lay.rank_of(st)}: {st}SEND_{kind}{k} is never received")


# -- printing -----------------------------------------------------------------------------------------------------


def grid(order: dict[int, list[Action]], lay: Layout) -> str:
    """A step × rank grid of the compute actions at unit cost each: `.` where a rank idles."""
    tl = verify({r: a for r, a in order.items()}, lay, cost={"F": 1, "B": 1, "I": 1, "W": 1})
    steps = int(tl.makespan)
    cells = {r: ["."] * steps for r in tl.spans}
    for r, sp in tl.spans.items():
        for s, _, a in sp:
            cells[r][int(s)] = str(a)
    width = max(4, max((len(c) for row in cells.values() for c in row), default=1))
    head = "step " + " ".join(f"{'rank ' + str(r):>{width}}" for r in sorted(cells))
    rows = [f"{t:>4} " + " ".join(f"{cells[r][t]:>{width}}" for r in sorted(cells)) for t in range(steps)]
    return "\n".join([head] + rows) + "\n"


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """The published bubble as a fraction of total time: (p-1)/(m+p-1) for 1F1B and GPipe, with v chunks per rank
    (p-1)/(v·m+p-1) (Narayanan et al. 2021)."""
    return (p - 1) / (v * m + p - 1)


_COLOURS = {"F": "#4c78a8", "B": "#59a14f", "I": "#59a14f", "W": "#f28e2b"}


def svg(timeline: Timeline, title: str = "") -> str:
    """The timeline as an SVG: one row per rank, one box per computation (forward blue, backward green, weight
    gradient orange), idle time left blank so the bubbles show. Deterministic text."""
    unit, row, pad, label = 18, 22, 4, 56
    ranks = sorted(timeline.spans)
    width = label + int(timeline.makespan * unit) + 2 * pad
    height = (len(ranks) + 1) * row + 2 * pad + (row if title else 0)
    top = pad + (row if title else 0)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="monospace" font-size="10">']
    if title:
        out.append(f'<text x="{pad}" y="{pad + 12}" font-size="12">{_escape(title)}</text>')
    for i, r in enumerate(ranks):
        y = top + i * row
        busy = sum(e - s for s, e, _ in timeline.spans[r])
        idle = 1 - busy / timeline.makespan if timeline.makespan else 0.0
        out.append(f'<text x="{pad}" y="{y + 14}">rank {r}</text>')
        out.append(f'<rect x="{label}" y="{y}" width="{timeline.makespan * unit:g}" height="{row - 4}" '
                   f'fill="#eeeeee"><title>rank {r}: idle {idle:.1%}</title></rect>')
        for s, e, a in timeline.spans[r]:
            x = label + s * unit
            out.append(f'<rect x="{x:g}" y="{y}" width="{(e - s) * unit - 1:g}" height="{row - 4}" '
                       f'fill="{_COLOURS[a.kind]}"><title>{a}</title></rect>')
            out.append(f'<text x="{x + 2:g}" y="{y + 12}" fill="white">{a.kind}{a.mb}</text>')
    y = top + len(ranks) * row + 12
    out.append(f'<text x="{label}" y="{y}">time (forward = 1); grey: idle (the bubble)</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
