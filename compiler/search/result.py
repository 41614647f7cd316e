"""What a run of `scalec search` returns (compiler/search/prune.py runs it, compiler/search/report.py words it): the
winners, the counts of what was enumerated, refused and costed, and the times. Data only, below both."""
from __future__ import annotations

from dataclasses import dataclass, field

from compiler import plan as P
from compiler import spec as S


@dataclass(frozen=True)
class Winner:
    plan: P.Plan            # decided (stage layout, tp and ep decisions)
    prediction: object      # cost.step_time.Prediction (exact)
    estimate: object        # cost.Estimate (pp rank 0; `.memory` every rank kind)
    reasons: tuple          # one short line each, from the figures
    dispatch: str | None = None  # "grouped" where the search changed the file's dropless padded `moe` layers
    fp8: S.FP8 | None = None     # the `precision = fp8(...)` it trains with (None: bf16 or fp32 alone)
    precision_changed: bool = False  # whether that is the search's choice (search/precision.py), not the file's

    @property
    def peak_bytes(self) -> float:
        return self.estimate.peak_bytes


@dataclass
class Counts:
    space: int = 0          # candidates the enumeration describes (families × dp shardings × recomputations)
    families: int = 0       # families enumerated (shape, sequence parallelism, micro-batch size, schedule)
    family_rules: int = 0   # of which refused by a rule before costing
    bounded_families: int = 0   # of which given a lower bound
    expanded: int = 0       # families whose variants were costed (the others pruned by their bound)
    checked: int = 0        # variants checked by the rules
    passed: int = 0         # of which the rules accepted
    costed: int = 0         # of which memory was estimated
    fitting: int = 0        # of which fit the device
    bounded: int = 0        # of which got a step-time lower bound
    exact: int = 0          # of which were simulated exactly
    structures: int = 0     # pass structures traced and compiled (compiler/candidates.py)

    def as_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Result:
    spec: S.Spec
    winners: list
    rejected: list          # one line per rejected family
    counts: Counts
    seconds: float
    fixed: dict
    timing: dict = field(default_factory=dict)   # phase -> seconds
    headroom: float = 0.0   # the share of each device no plan may use (`--headroom`; W0502's margin by default)
    written: object = None  # search/written.py Written: the file's own plan, costed, where the file writes one

    @property
    def limit_bytes(self) -> float:
        """What a plan may hold per rank: the device's memory less the headroom."""
        return self.spec.cluster.device.memory_gb * 1e9 * (1 - self.headroom)


def ranked_together(first: Result, second: Result, top: int, one_shape: bool, winner_of) -> Result:
    """The winners of two runs of one search (the file's setting and a variant of it: MoE dispatch, precision)
    ranked together: distinct layouts, the faster run's of each, unless every axis is fixed (`one_shape`); each
    winner as `winner_of(winner, its step time, the other run's best step time or None, whether it is the second
    run's)` makes it (its reason naming its run and the other's best). The rejected lines of the run whose winner
    is first; the counts and times of both."""
    best = [min((w.prediction.step_time_s for w in r.winners), default=None) for r in (first, second)]
    ranked = sorted([(w.prediction.step_time_s, 0, i, w) for i, w in enumerate(first.winners)]
                    + [(w.prediction.step_time_s, 1, i, w) for i, w in enumerate(second.winners)],
                    key=lambda x: x[:3])
    winners, seen, sides = [], set(), []
    for t, side, _, w in ranked:
        if not one_shape and w.plan.axes in seen:
            continue
        seen.add(w.plan.axes)
        winners.append(winner_of(w, t, best[1 - side], side == 1))
        sides.append(side)
        if len(winners) == top:
            break
    won = second if sides and sides[0] == 1 else first
    counts = Counts(**{k: getattr(first.counts, k) + getattr(second.counts, k) for k in first.counts.__dict__})
    timing = {k: first.timing.get(k, 0.0) + second.timing.get(k, 0.0) for k in {**first.timing, **second.timing}}
    return Result(first.spec, winners, won.rejected, counts, first.seconds + second.seconds, first.fixed, timing,
                  first.headroom)
