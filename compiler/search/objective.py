"""`scalec search --minimize time | cost | energy` under `--deadline`, `--budget` and `--max-devices`: the search of
compiler/search/prune.py run on several allocations of the file's machines, each winner priced as `plan` prices a
run (compiler/cost/energy.py on the goodput model's ETTR), one chosen, and the table of the plans that trade time
for the objective.

The sweep. Where the objective is cost or energy, or `--max-devices` is given, the search runs on node counts
n ≤ M, M the file's nodes (`--nodes` where given) or `--max-devices` // devices per node: M, then M/2^k and
3M/2^(k+2) for k = 0, 1, ... rounded half up to whole nodes (at least one), each count once, largest first
(`node_counts`). Each count keeps the search's `top` winners, priced over the train section's steps. The descent
stops at the first count where no plan fits (fewer devices hold no more); with a deadline, at the first count
whose fastest plan misses it; minimising time, at the first count with a plan that meets the constraints. The last
two assume that a smaller allocation of the same machines is not faster, which
holds while the step is compute-bound (the same work over fewer devices) and can fail where a larger allocation's
communication dominates; the report says where the sweep stopped and why.

Choice. Options that miss the deadline (the run's wall time, ETTR included) or the budget (the run's dollars) are
dropped; of the rest, the least run time (`time`), dollars (`cost`) or kWh (`energy`), ties to the shorter run.
`--minimize time` without `--max-devices` is the single search on the file's nodes, its winners priced and
filtered the same way.

The Pareto table: the options no other beats on both the run's length and the objective's figure (dollars for
`time` and `cost`, energy for `energy`), shortest first; each row says what its trade buys against the fastest
option and the chosen one.
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field

from compiler.cost import energy as E
from compiler.parse import SUFFIXES
from compiler.report.cost import dollars, joules, tonnes
from compiler.report.goodput import duration
from compiler.report.units import count, nbytes, seconds

OBJECTIVES = ("time", "cost", "energy")
FIGURE = {"time": "dollars", "cost": "dollars", "energy": "energy"}  # the Pareto table's second axis
UNITS_S = {"s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
SCALES = {"": 1.0, "k": 1e3, **{k: 10.0 ** p for k, p in SUFFIXES.items()}}  # the .scale numbers' and k
PROGRESS_AFTER_S = 10.0  # per-count lines on stderr once the sweep has run this long


class ObjectiveError(ValueError):
    """A constraint that does not parse, or one the cluster cannot meet before anything is searched (exit 2)."""


def parse_deadline(text: str) -> float:
    """`--deadline`: a wall time with its unit, `30d`, `36h`, `2w`, `90min`, `600s` (a decimal point allowed);
    its seconds. No unit, an unknown one, or a deadline of 0 is refused."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(s|min|h|d|w)\s*", text)
    if not m:
        raise ObjectiveError(f"--deadline {text!r}: expected a duration with its unit, such as 30d, 36h, 2w, 90min "
                             "or 600s")
    value = float(m.group(1)) * UNITS_S[m.group(2)]
    if value <= 0:
        raise ObjectiveError(f"--deadline {text!r}: a deadline must be longer than 0")
    return value


def parse_budget(text: str) -> float:
    """`--budget`: dollars, as `2M$`, `$2M`, `2000000`, `1,500,000`, `250k$` or `1.5B` (k/K, M, B/G, T); the
    dollars. A budget of 0 or one that does not parse is refused."""
    t = text.strip().replace(",", "").replace("_", "")
    if t.startswith("$"):
        t = t[1:]
    elif t.endswith("$"):
        t = t[:-1]
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kKMBGT]?)\s*", t)
    if not m:
        raise ObjectiveError(f"--budget {text!r}: expected dollars, such as 2M$, $2M, 250k$ or 2000000")
    value = float(m.group(1)) * SCALES[m.group(2)]
    if value <= 0:
        raise ObjectiveError(f"--budget {text!r}: a budget must be more than $0")
    return value


@dataclass(frozen=True)
class Constraints:
    """What the chosen run must meet; None where not given."""

    deadline_s: float | None = None
    budget_usd: float | None = None
    max_devices: int | None = None

    @property
    def deadline_text(self) -> str:
        return duration(self.deadline_s) if self.deadline_s is not None else ""

    @property
    def budget_text(self) -> str:
        return dollars(self.budget_usd) if self.budget_usd is not None else ""

    def misses(self, o: "Option") -> list:
        """What `o` misses, one phrase each ([] where it meets every constraint)."""
        out = []
        if self.deadline_s is not None and o.wall_s > self.deadline_s:
            out.append(f"misses the {self.deadline_text} deadline by {duration(o.wall_s - self.deadline_s)} "
                       f"({o.wall_s / self.deadline_s:.2f}×)")
        if self.budget_usd is not None and o.usd > self.budget_usd:
            out.append(f"misses the {self.budget_text} budget by {dollars(o.usd - self.budget_usd)} "
                       f"({o.usd / self.budget_usd:.2f}×)")
        return out

    def shortfall(self, o: "Option") -> float:
        """How far `o` is from meeting every constraint: its largest ratio over a limit, less one (0: meets)."""
        over = [0.0]
        if self.deadline_s is not None:
            over.append(o.wall_s / self.deadline_s - 1)
        if self.budget_usd is not None:
            over.append(o.usd / self.budget_usd - 1)
        return max(over)

    def words(self) -> str:
        parts = []
        if self.deadline_s is not None:
            parts.append(f"deadline {self.deadline_text}")
        if self.budget_usd is not None:
            parts.append(f"budget {self.budget_text}")
        if self.max_devices is not None:
            parts.append(f"at most {self.max_devices:,} devices")
        return ", ".join(parts)

    def as_json(self) -> dict:
        return {"deadline_days": None if self.deadline_s is None else self.deadline_s / 86400,
                "budget_usd": self.budget_usd, "max_devices": self.max_devices}


@dataclass(frozen=True)
class Option:
    """One winner of the search on `nodes` nodes, priced: `rank` its place among that count's winners."""

    nodes: int
    rank: int
    spec: object            # the Spec on these nodes (Spec.on)
    winner: object          # compiler/search/result.py Winner
    run: E.Run

    @property
    def devices(self) -> int:
        return self.spec.cluster.world_size

    @property
    def step_s(self) -> float:
        return self.winner.prediction.step_time_s

    @property
    def wall_s(self) -> float:
        return self.run.wall_s

    @property
    def usd(self) -> float:
        return self.run.usd

    @property
    def kwh(self) -> float:
        return self.run.kwh

    def figure(self, minimize: str) -> float:
        """What `minimize` minimises: the run's wall time, dollars, or kWh."""
        return {"time": self.wall_s, "cost": self.usd, "energy": self.kwh}[minimize]

    def axis(self, minimize: str) -> float:
        """The Pareto table's second axis (FIGURE): dollars for time and cost, energy for energy."""
        return self.kwh if FIGURE[minimize] == "energy" else self.usd

    def as_json(self) -> dict:
        return {"nodes": self.nodes, "devices": self.devices, "rank": self.rank,
                "describe": self.winner.plan.describe(), "step_s": self.step_s, "run": self.run.as_json()}


@dataclass
class Outcome:
    """A priced search: every option, the choice, the Pareto set (indices into `options`), the sweep's counts."""

    minimize: str
    constraints: Constraints
    options: list
    swept: bool                       # several node counts (False: the file's own, as `search` always did)
    counts: list = field(default_factory=list)   # node counts searched, in order
    results: dict = field(default_factory=dict)  # nodes -> compiler/search/result.py Result
    stopped: str | None = None        # why the descent stopped before one node
    seconds: float = 0.0
    top: int = 5

    @property
    def meeting(self) -> list:
        return [i for i, o in enumerate(self.options) if not self.constraints.misses(o)]

    @property
    def chosen(self) -> int | None:
        """The option that meets the constraints with the least objective, ties to the shorter run; None: none."""
        ok = self.meeting
        if not ok:
            return None
        return min(ok, key=lambda i: (self.options[i].figure(self.minimize), self.options[i].wall_s, i))

    @property
    def fastest(self) -> int | None:
        if not self.options:
            return None
        return min(range(len(self.options)), key=lambda i: (self.options[i].wall_s, self.options[i].usd, i))

    @property
    def closest(self) -> int | None:
        """Where none meets the constraints, the option that misses them by the least (its largest ratio)."""
        if not self.options:
            return None
        return min(range(len(self.options)),
                   key=lambda i: (self.constraints.shortfall(self.options[i]), self.options[i].wall_s, i))

    @property
    def pareto(self) -> list:
        return pareto([(o.wall_s, o.axis(self.minimize)) for o in self.options])

    def result(self):
        """The search whose winners `--json`, `--html` and the exit status read: the chosen option's count, else
        the largest count's."""
        c = self.chosen
        nodes = self.options[c].nodes if c is not None else (self.counts[0] if self.counts else None)
        return self.results.get(nodes)


def pareto(points: list) -> list:
    """Indices of the points (time, figure) no other point beats on both (at most equal on each, less on one),
    shortest first; of equal points the first."""
    keep = []
    for i, (t, y) in enumerate(points):
        beaten = any((t2 <= t and y2 <= y and (t2 < t or y2 < y)) or ((t2, y2) == (t, y) and j < i)
                     for j, (t2, y2) in enumerate(points) if j != i)
        if not beaten:
            keep.append(i)
    return sorted(keep, key=lambda i: (points[i][0], points[i][1], i))


def node_counts(most: int) -> list:
    """The allocations the sweep tries, largest first: `most`, most/2^k and 3·most/2^(k+2) for k = 0, 1, ...,
    rounded half up to whole nodes, at least one, each once."""
    if most < 1:
        raise ValueError(f"node_counts: {most} nodes")
    got, k = set(), 0
    while True:
        for x in (most / 2 ** k, 3 * most / 2 ** (k + 2)):
            got.add(max(1, math.floor(x + 0.5)))
        if most / 2 ** k < 1:
            break
        k += 1
    return sorted(got, reverse=True)


def price(spec, winner) -> E.Run:
    """`winner`'s run on `spec`'s cluster, as `plan` prices a compiled plan (compiler/cost/energy.py `priced`)."""
    return E.priced(spec, winner.plan, winner.estimate, winner.prediction)


def priced(spec, result) -> list:
    """The Options of one search's winners on `spec`'s nodes."""
    return [Option(spec.cluster.nodes, i, spec, w, price(spec, w)) for i, w in enumerate(result.winners, 1)]


def single(spec, result, minimize: str, constraints: Constraints, top: int = 5) -> Outcome:
    """`--minimize time` without `--max-devices`: the one search as run, its winners priced."""
    return Outcome(minimize, constraints, priced(spec, result), swept=False, counts=[spec.cluster.nodes],
                   results={spec.cluster.nodes: result}, seconds=result.seconds, top=top)


def sweep(spec, minimize: str, constraints: Constraints, top: int = 5, fixed: dict | None = None,
          headroom: float | None = None, most: int | None = None, progress=None) -> Outcome:
    """The search on each of `node_counts(most)` (default the spec's nodes), its winners priced, descending until
    no plan fits or, with a deadline, until a count's fastest plan misses it (the module's docstring: smaller
    allocations are taken to be no faster). `progress(line)`, where given, hears of each count once the sweep has
    run PROGRESS_AFTER_S."""
    from compiler.candidates import Candidates
    from compiler.search.prune import search
    start = time.perf_counter()
    most = spec.cluster.nodes if most is None else most
    out = Outcome(minimize, constraints, [], swept=True, top=top)
    unsharded = None
    dpn, kind = spec.cluster.devices_per_node, spec.cluster.device.kind
    for n in node_counts(most):
        on = spec.on(spec.cluster.with_nodes(n))
        cands = Candidates(on, unsharded=unsharded)  # one trace of the model for every count
        unsharded = cands.unsharded
        result = search(on, top=top, fixed=fixed, cands=cands, headroom=headroom)
        out.counts.append(n)
        out.results[n] = result
        options = priced(on, result)
        out.options += options
        elapsed = time.perf_counter() - start
        if progress is not None and elapsed >= PROGRESS_AFTER_S:
            best = min(options, key=lambda o: o.wall_s, default=None)
            what = (f"fastest {duration(best.wall_s)}, {dollars(best.usd)}, {joules(best.run.joules)}" if best
                    else "no plan fits")
            progress(f"search --minimize {minimize}: {n} nodes × {dpn} {kind}: {what} ({elapsed:.0f} s so far)")
        last = n == 1
        if not options:
            if not last:
                out.stopped = (f"no plan fits {n} node{'s' if n != 1 else ''} ({n * dpn:,} {kind}): fewer hold "
                               "no more")
            break
        fastest = min(options, key=lambda o: o.wall_s)
        if minimize == "time" and any(not constraints.misses(o) for o in options):
            if not last:
                out.stopped = ("minimising time, a plan here meets the constraints: fewer nodes are taken to be no "
                               "faster")
            break
        if constraints.deadline_s is not None and fastest.wall_s > constraints.deadline_s:
            if not last:
                out.stopped = (f"its fastest plan takes {duration(fastest.wall_s)}, past the "
                               f"{constraints.deadline_text} deadline: fewer nodes are taken to be no faster")
            break
    out.seconds = time.perf_counter() - start
    return out


# -- words --------------------------------------------------------------------------------------------------------


def _ratio_time(a: float, b: float) -> str:
    """Run time `a` against `b`: "1.8× longer", "2.1× shorter", "as long"."""
    if b <= 0 or abs(a / b - 1) < 0.005:
        return "as long"
    return f"{a / b:.3g}× longer" if a > b else f"{b / a:.3g}× shorter"


def _pct(a: float, b: float, less: str, more: str, same: str) -> str:
    """`a` against `b` as a share: "23% cheaper" (less), "15% dearer" (more), or `same` within half a percent."""
    if b <= 0 or abs(a / b - 1) < 0.005:
        return same
    share = abs(1 - a / b)
    return f"{share:.1%} {less if a < b else more}" if share < 0.1 else f"{share:.0%} {less if a < b else more}"


def trade(o: Option, ref: Option) -> str:
    """What `o` buys against `ref`: its run's length, dollars and energy."""
    return ", ".join((_ratio_time(o.wall_s, ref.wall_s), _pct(o.usd, ref.usd, "cheaper", "dearer", "same cost"),
                      _pct(o.kwh, ref.kwh, "less energy", "more energy", "same energy")))


def _where(o: Option) -> str:
    return f"{o.nodes} node{'s' if o.nodes != 1 else ''} ({o.devices:,} {o.spec.cluster.device.kind})"


def _run_words(o: Option) -> str:
    r = o.run
    return (f"{duration(r.wall_s)}, {count(r.gpu_hours)} GPU-hours, {joules(r.joules)}, {dollars(r.usd)}, "
            f"{tonnes(r.tco2e)} tCO2e")


def why(out: Outcome) -> str | None:
    """Where the chosen option is not the fastest: why (the constraint the fastest misses, or what the choice
    saves and what it costs in time)."""
    c, f = out.chosen, out.fastest
    if c is None or f is None or c == f:
        return None
    o, fast = out.options[c], out.options[f]
    missed = out.constraints.misses(fast)
    head = f"not the fastest ({_where(fast)}, {fast.winner.plan.describe()}: {_run_words(fast)})"
    if missed:
        return f"{head}: it {' and '.join(missed)}; the chosen is {trade(o, fast)}"
    saving = {"cost": f"{_pct(o.usd, fast.usd, 'cheaper', 'dearer', 'as cheap')} ({dollars(o.usd)} against "
                      f"{dollars(fast.usd)})",
              "energy": f"{_pct(o.kwh, fast.kwh, 'less energy', 'more energy', 'the same energy')} "
                        f"({joules(o.run.joules)} against {joules(fast.run.joules)})",
              "time": _ratio_time(o.wall_s, fast.wall_s)}[out.minimize]
    within = (f", within the {out.constraints.deadline_text} deadline ({duration(o.wall_s)})"
              if out.constraints.deadline_s is not None else "")
    return (f"{head}: minimising {out.minimize}, the chosen is {saving} for {o.wall_s / fast.wall_s:.2f}× the "
            f"time{within}")


def _row_reason(out: Outcome, i: int) -> str:
    o, c, f = out.options[i], out.chosen, out.fastest
    parts = []
    if i == f:
        parts.append("the fastest")
    elif f is not None:
        parts.append(f"against the fastest: {trade(o, out.options[f])}")
    if i == c:
        parts.append("chosen")
    elif c is not None and c != f:
        parts.append(f"against the chosen: {trade(o, out.options[c])}")
    parts += out.constraints.misses(o)
    return "; ".join(parts)


def text(out: Outcome) -> str:
    """The choice, then the Pareto table and the sweep's line. For the single search (`swept` False) these lines
    follow the search's own table; swept, they stand alone (`--nodes N` prints one count's search whole)."""
    spec = next(iter(out.results.values())).spec if out.results else None
    lines = []
    cons = out.constraints.words()
    if out.swept and spec is not None:
        dpn, kind = spec.cluster.devices_per_node, spec.cluster.device.kind
        lines += [f"search --minimize {out.minimize} for `{spec.model.name}` ({spec.path}) on up to "
                  f"{out.counts[0]} nodes × {dpn} {kind}" + (f"; {cons}" if cons else ""), ""]
    elif cons:
        lines += ["", f"minimize {out.minimize}; {cons}"]
    c = out.chosen
    if not out.swept:
        dropped = [i for i in range(len(out.options)) if out.constraints.misses(out.options[i])]
        for i in dropped:
            lines.append(f"  dropped #{out.options[i].rank}: {'; '.join(out.constraints.misses(out.options[i]))}")
        if not dropped and out.options:
            lines.append(f"  every winner meets {'it' if cons.count(',') == 0 else 'them'}")
        if c is not None and out.options[c].rank != 1:
            lines.append(f"  chosen: #{out.options[c].rank}, the fastest that meets the constraints")
    if c is not None and out.swept:
        o = out.options[c]
        w = o.winner
        p = w.prediction
        lines += [f"chosen: {_where(o)}, #{o.rank} of its search: {_run_words(o)}",
                  f"  {w.plan.describe()}",
                  f"  step {seconds(p.step_time_s)}, {p.tokens_per_s:,.0f} tokens/s, MFU {p.mfu:.1%}, peak "
                  f"{nbytes(w.peak_bytes)}; ETTR {o.run.ettr:.1%}"]
        lines += [f"    - {r}" for r in w.reasons]
    reason = why(out)
    if reason:
        lines += [f"  {reason}"]
    if c is None and out.options:
        lines += [f"  {no_plan_line(out)}"]
    if out.options and (out.swept or out.constraints.deadline_s is not None or out.constraints.budget_usd is not None):
        lines += ["", f"pareto: the plans no other beats on both run time and {FIGURE[out.minimize]}, shortest "
                      f"first (* chosen)",
                  f"    {'devices':>8}  {'step':>9}  {'run':>10}  {'GPU-hours':>10}  {'energy':>10}  {'dollars':>9}  "
                  f"{'tCO2e':>7}"]
        for i in out.pareto:
            o = out.options[i]
            r = o.run
            mark = "*" if i == c else " "
            lines += [f"  {mark} {o.devices:>8,}  {seconds(o.step_s):>9}  {duration(r.wall_s):>10}  "
                      f"{count(r.gpu_hours):>10}  {joules(r.joules):>10}  {dollars(r.usd):>9}  "
                      f"{tonnes(r.tco2e):>7}",
                      f"      {o.nodes} node{'s' if o.nodes != 1 else ''}, #{o.rank}: {o.winner.plan.describe()}",
                      f"      {_row_reason(out, i)}"]
    if out.swept:
        stop = f"; stopped at {out.counts[-1]}: {out.stopped}" if out.stopped else ""
        lines += ["", f"searched {', '.join(map(str, out.counts))} nodes (top {out.top} each, "
                      f"{len(out.options)} plans priced){stop}; {out.seconds:.2f} s"]
    return "\n".join(lines) + "\n"


def no_plan_line(out: Outcome) -> str:
    """Where no option meets the constraints: the closest and by how much it misses."""
    i = out.closest
    if i is None:
        return "no plan fits the devices"
    o = out.options[i]
    more = "" if out.swept else " (`--minimize cost` or `--max-devices` searches fewer nodes too)"
    return (f"no plan meets {out.constraints.words()}: the closest, {_where(o)}, {o.winner.plan.describe()}, "
            f"{' and '.join(out.constraints.misses(o))}{more}")


def to_json(out: Outcome, base: dict) -> dict:
    """`search --json` with the objective's keys added to `base` (compiler/search/report.py `to_json` of the
    search `Outcome.result` names, its keys unchanged): "minimize", "constraints", "options" (each "nodes",
    "devices", "rank", "describe", "step_s", "run" as plan.json's), "pareto" and "chosen" and "fastest" (indices
    into "options"; "chosen" null where none meets the constraints), "sweep" (the node counts, where it stopped
    and why, its seconds)."""
    return {**base, "minimize": out.minimize, "constraints": out.constraints.as_json(),
            "options": [o.as_json() for o in out.options], "pareto": out.pareto, "chosen": out.chosen,
            "fastest": out.fastest,
            "sweep": {"nodes": list(out.counts), "stopped": out.stopped, "seconds": out.seconds} if out.swept
            else None}
