"""The pipeline's timing model: when each rank finishes its compute actions, given the schedule's per-rank action
lists (runtime/schedule.py) and each stage's durations. One model, used by both sides: the compiler's step-time
model (compiler/cost/step_time.py, through compiler/schedule.py) prices a plan with it, and the straggler detector
(runtime/stragglers.py) replays a measured step with it to say what the step would take without its straggler.
"""
from __future__ import annotations

from runtime.schedule import Action, Layout


class ScheduleError(Exception):
    """A schedule that cannot run: names the rank, the action and why."""


def finish_times(order: dict[int, list[Action]], lay: Layout, cost: dict, transfer: float = 0.0) -> dict[int, float]:
    """When each rank finishes its compute actions, run as `verify` runs them (each rank in order, a forward waits
    for the previous stage's forward of its micro-batch and a backward for the next stage's backward, `transfer`
    later when that stage is on another rank), from the compute order alone (`compute_order`, no send and receive
    actions): the step-time model's fast path, which assumes a schedule `verify` has accepted
    (tests/test_simulate.py holds it equal to `verify`'s timeline). `cost` as in `verify`."""
    return timed(steps(order, lay), lay, cost, transfer)


_KIND = {"F": 0, "B": 1, "I": 2, "W": 3}


def steps(order: dict[int, list[Action]], lay: Layout) -> tuple:
    """`order`'s compute actions per rank as `timed` walks them, (duration index, own end index, index of the end
    it waits for or -1, whether that end is on another rank), made once per schedule shape: the step-time model
    times one shape with many stage durations (compiler/cost/step_time.py keeps them). Ends are one flat list,
    forwards' (stage, micro-batch) first, then backwards' (B or its input half I); a weight half W ends nothing
    and waits for nothing; durations are one flat list, F, B, I, W, each per stage."""
    n, m, p = lay.stages, lay.m, lay.p
    out = []
    home = [lay.rank_of(st) for st in range(n)]
    for r in range(p):
        acts = []
        for a in (x for act in order[r] for x in act.parts):  # an overlap: its sub-actions in order
            c = _KIND.get(a.kind)
            if c is None:
                continue
            st, k = a.stage, a.mb
            if c == 3:
                acts.append((3 * n + st, -1, -1, False))
            elif c == 0:
                dep = (st - 1) * m + k if st > 0 else -1
                acts.append((st, st * m + k, dep, st > 0 and home[st - 1] != r))
            else:
                dep = n * m + (st + 1) * m + k if st < n - 1 else -1
                acts.append((c * n + st, n * m + st * m + k, dep, st < n - 1 and home[st + 1] != r))
        out.append(acts)
    return tuple(out)


def timed(steps_: tuple, lay: Layout, cost: dict, transfer: float = 0.0) -> dict[int, float]:
    """`finish_times` of the compute actions `steps` made of an order: each rank runs its actions in order until
    one waits for an end not yet reached, then the next rank; round and round until every rank is done."""
    n, m, p = lay.stages, lay.m, lay.p

    def per_stage(x):
        return list(x) if isinstance(x, (list, tuple)) else [x] * n
    dur = [d for k in ("F", "B", "I", "W") for d in per_stage(cost.get(k, 0))]
    end = [-1.0] * (2 * n * m)
    pos, clock = [0] * p, [0.0] * p
    remaining = sum(len(x) for x in steps_)
    while remaining:
        progressed = False
        for r in range(p):
            acts, i, t = steps_[r], pos[r], clock[r]
            size = len(acts)
            while i < size:
                di, me, dep, cross = acts[i]
                if dep >= 0:
                    ready = end[dep]
                    if ready < 0:
                        break
                    if cross:
                        ready += transfer
                    if ready > t:
                        t = ready
                t += dur[di]
                if me >= 0:
                    end[me] = t
                i += 1
            if i != pos[r]:
                remaining -= i - pos[r]
                progressed = True
            pos[r], clock[r] = i, t
        if not progressed:
            raise ScheduleError("the schedule waits forever (run `verify` for where)")
    return {r: clock[r] for r in range(p)}
