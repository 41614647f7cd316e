"""The pipeline phase of a step, timed: the schedule's action lists (runtime/schedule.py) with per-stage durations
through runtime/schedule_time.py, kept per shape and extended past the warm-up along the steady state's line, and
what dualpipev's overlapped pairs hide. compiler/cost/step_time.py's `Simulator` gives the durations.
"""
from __future__ import annotations

from runtime import choices  # torch-free: the schedules that pair a forward with a backward (PAIRED)

# The collectives an overlapped pair (dualpipev's OVERLAP_F_B: one micro-batch's forward beside another's
# backward, on two streams) hides behind its partner's compute: the experts' all-to-alls above all (DeepSeek-V3
# report §3.2.1, what DualPipe was built for) and tensor parallelism's collectives. Not pp's sends (priced as the
# schedule's transfers), nor ring attention's (overlapped with its own blocks already), nor dp's (after the pipeline).
# The experts' all-to-alls dispatched by node run over ep's two halves (runtime/moe_nodes.py): hidden alike.
OVERLAPPED = ("ep", "tp", "ep_rail", "ep_node")


# The schedules whose lists pair a forward with a backward (runtime.choices.PAIRED, shared with the runtime): their
# pairs take `pair_seconds` (runtime/schedule_time.py), the OVERLAPPED axes' collectives of each side hidden behind
# the other side's compute.
PAIRED = choices.PAIRED


_ORDERS: dict = {}
# Past a warm-up, every schedule repeats one steady state per p micro-batches, so a rank's end of the pipeline grows
# by the same amount for each further p: simulated at STEADY·p·v and STEADY·p·v + p micro-batches and extended along
# that line beyond. tests/test_simulate.py holds the line to the full simulation: to rounding for stages within ±25%
# of each other, every schedule; for stages up to 4× apart interleaving's steady state settles later (within 1%);
# dualpipev's within 0.3% (tests/test_dualpipev_plan.py).
STEADY = 3


def pipeline_ends(schedule: str, p: int, m: int, v: int, cost: dict, transfer: float) -> dict:
    """Each pp rank's end of the pipeline phase: the schedule's action lists (runtime/schedule.py) timed by
    compiler/schedule.py `finish_times` (as `verify` runs them) with these per-stage durations and send time."""
    from compiler import schedule as SCH
    key = (schedule, p, m, v, tuple((k, tuple(x) if isinstance(x, list) else x) for k, x in sorted(cost.items())),
           transfer)
    got = _ENDS.get(key)  # a family's dp shardings share their stages' times, and the winners are timed again
    if got is not None:
        return dict(got)
    m1 = STEADY * p * v
    if m <= m1 + p:
        got = SCH.timed(_order(schedule, p, m, v), SCH.Layout.of(schedule, p, v, m), cost, transfer)
    else:
        one = pipeline_ends(schedule, p, m1, v, cost, transfer)
        two = pipeline_ends(schedule, p, m1 + p, v, cost, transfer)
        k = (m - m1) / p
        got = {r: one[r] + k * (two[r] - one[r]) for r in one}
    if len(_ENDS) >= 4096:  # a long-lived process (the tests, bench/) times many shapes: keep the memo small
        _ENDS.clear()
    _ENDS[key] = got
    return dict(got)


_ENDS: dict = {}  # pipeline_ends by its arguments


def _order(schedule: str, p: int, m: int, v: int):
    """The schedule's compute order (runtime/schedule.py's action lists) as compiler/schedule.py `timed` walks it,
    made once per shape."""
    from compiler import schedule as SCH
    key = (schedule, p, m, v)
    got = _ORDERS.get(key)
    if got is None:
        lay = SCH.Layout.of(schedule, p, v, m)
        got = _ORDERS[key] = SCH.steps(SCH.compute_order(schedule, lay), lay)
    return got


def pipeline_hidden(schedule: str, p: int, m: int, v: int, cost: dict) -> dict:
    """Per pp rank, the seconds its overlapped pairs save over running their two sides one after the other: the
    collectives hidden behind the partner's compute (`pair_seconds`), summed over the rank's pairs. What a pair
    saves does not depend on when it runs, only which stages it pairs, and each further micro-batch adds the same
    pairs to every rank (dualpipev: one (F0, B1) and one (F1, B0) in its steady phase), so the sum is linear in m
    from the least m the schedule runs (p·v): counted on the lists of p·v and p·v + 1 micro-batches and extended
    exactly (tests/test_dualpipev_plan.py counts it on the full lists). Not to be changed."""
    from compiler.schedule import pair_seconds  # the runtime's timing model, as compiler/schedule.py re-exports it
    key = ("hidden", schedule, p, v, tuple((k, tuple(x) if isinstance(x, list) else x)
                                           for k, x in sorted(cost.items())))
    m0 = p * v
    lines = _ENDS.get(key)  # the two counts, kept per shape and durations: every m of them reads the same
    if lines is None:
        one = _hidden_of(_order(schedule, p, m0, v), p * v, cost, pair_seconds)
        two = _hidden_of(_order(schedule, p, m0 + 1, v), p * v, cost, pair_seconds)
        if len(_ENDS) >= 4096:
            _ENDS.clear()
        lines = _ENDS[key] = (one, two)
    one, two = lines
    return {r: one[r] + (m - m0) * (two[r] - one[r]) for r in one}


def _hidden_of(st, n: int, cost: dict, pair_seconds) -> dict:
    """`pipeline_hidden` of the timed order `st` (runtime.schedule_time.steps) with `n` stages."""
    def per_stage(x):
        return list(x) if isinstance(x, (list, tuple)) else [x] * n
    f, fc, bc = per_stage(cost["F"]), per_stage(cost.get("F_comm", 0)), per_stage(cost.get("B_comm", 0))
    back = {1: per_stage(cost["B"]), 2: per_stage(cost.get("I", cost["B"]))}
    saved = [f[sf] + back[c][sb] - pair_seconds(f[sf], back[c][sb], fc[sf], bc[sb]) for sf, sb, c in st.pairs]
    return {r: sum(k * saved[j] for j, k in mine.items()) for r, mine in enumerate(st.pair_counts)}
