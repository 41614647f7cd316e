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


class Steps(tuple):
    """`steps`' answer: per rank its compute actions as `timed` walks them, with `pairs`, the distinct overlapped
    pairs of the order as (forward stage, backward stage, backward kind: 1 B or 2 I), and `pair_counts`, per rank how
    many of each (its index in `pairs` -> count)."""

    pairs: tuple = ()
    pair_counts: tuple = ()


def steps(order: dict[int, list[Action]], lay: Layout) -> Steps:
    """`order`'s compute actions per rank as `timed` walks them, (duration index, own end index, index of the end
    it waits for or -1, whether that end is on another rank), made once per schedule shape: the step-time model
    times one shape with many stage durations (compiler/cost/step_time.py keeps them). Ends are one flat list,
    forwards' (stage, micro-batch) first, then backwards' (B or its input half I); a weight half W ends nothing
    and waits for nothing; durations are one flat list, F, B, I, W, each per stage, then one of no time, then one
    per distinct overlapped pair (`Steps.pairs`).

    An overlapped pair (`OVERLAP_F_B`: a forward and a backward of two micro-batches, side by side) starts when
    both its inputs are there; its forward's output is there F later (the forward's own compute and communication,
    one after the other, the communication beside the backward's compute), its backward's when the pair ends
    (`pair_seconds` after the start). Four entries: two of no time that wait for the forward's input and the
    backward's gradient, one of F that ends the forward, one of the rest of the pair that ends the backward. With
    nothing to hide the pair is the forward then the backward, as `verify` runs it, except that the forward
    waits for the backward's gradient too."""
    n, m, p = lay.stages, lay.m, lay.p
    out = []
    home = [lay.rank_of(st) for st in range(n)]
    zero = 4 * n
    pairs: dict = {}
    counts = []

    def entry(a: Action, r: int) -> tuple:
        c = _KIND[a.kind]
        st, k = a.stage, a.mb
        if c == 3:
            return (3 * n + st, -1, -1, False)
        if c == 0:
            dep = (st - 1) * m + k if st > 0 else -1
            return (st, st * m + k, dep, st > 0 and home[st - 1] != r)
        dep = n * m + (st + 1) * m + k if st < n - 1 else -1
        return (c * n + st, n * m + st * m + k, dep, st < n - 1 and home[st + 1] != r)

    for r in range(p):
        acts = []
        mine: dict = {}
        for a in order[r]:
            if a.sub is not None:  # OVERLAP_F_B: (forward, backward)
                fw, bw = a.sub
                ef, eb = entry(fw, r), entry(bw, r)
                j = pairs.setdefault((fw.stage, bw.stage, _KIND[bw.kind]), len(pairs))
                mine[j] = mine.get(j, 0) + 1
                acts += [(zero, -1, ef[2], ef[3]), (zero, -1, eb[2], eb[3]), (ef[0], ef[1], -1, False),
                         (zero + 1 + j, eb[1], -1, False)]
            elif a.kind in _KIND:
                acts.append(entry(a, r))
        out.append(acts)
        counts.append(mine)
    got = Steps(out)
    got.pairs, got.pair_counts = tuple(pairs), tuple(counts)
    return got


def pair_seconds(f: float, b: float, f_comm: float, b_comm: float) -> float:
    """How long an overlapped pair takes: a forward of `f` seconds, `f_comm` of them communication its partner's
    compute can hide (an expert all-to-all, a tensor-parallel collective), beside a backward of `b` seconds with
    `b_comm` such. Each side's communication hides behind the other side's compute (b - b_comm, f - f_comm), not
    behind its own, which waits for it (a dispatch before its experts, a combine after them): the pair costs both
    computes plus what each side's communication exceeds the other's compute by,
        (f - f_comm) + (b - b_comm) + max(0, f_comm - (b - b_comm)) + max(0, b_comm - (f - f_comm)),
    = f + b when nothing communicates (CPU, where the two run one after the other), and never below either side
    alone nor below the pair's communication (f_comm + b_comm: one link carries both)."""
    cf, cb = f - f_comm, b - b_comm
    return cf + cb + max(0.0, f_comm - cb) + max(0.0, b_comm - cf)


def timed(steps_: tuple, lay: Layout, cost: dict, transfer: float = 0.0) -> dict[int, float]:
    """`finish_times` of the compute actions `steps` made of an order: each rank runs its actions in order until
    one waits for an end not yet reached, then the next rank; round and round until every rank is done. An
    overlapped pair takes `pair_seconds` of its forward and backward, with `cost`'s "F_comm" and "B_comm" (each
    stage's seconds of communication inside its forward and its backward that a partner's compute can hide; none
    when absent: the pair then takes F + B)."""
    n, m, p = lay.stages, lay.m, lay.p

    def per_stage(x):
        return list(x) if isinstance(x, (list, tuple)) else [x] * n
    dur = [d for k in ("F", "B", "I", "W") for d in per_stage(cost.get(k, 0))]
    dur.append(0.0)
    pairs = getattr(steps_, "pairs", ())
    if pairs:
        fc, bc = per_stage(cost.get("F_comm", 0)), per_stage(cost.get("B_comm", 0))
        # the rest of each pair after its forward
        dur += [pair_seconds(dur[sf], dur[c * n + sb], fc[sf], bc[sb]) - dur[sf] for sf, sb, c in pairs]
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
