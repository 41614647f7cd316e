"""The file's own plan beside a search's ranking: where the plan the user wrote stands (`scalec search` prints it
under the winners), and what separates it from the first, part by part of the step.

A search reads only the file's cluster (its axes and plan are the search's to choose). Where the file writes a whole
plan, the user asks first how theirs compares: it is compiled and costed as `scalec plan` does (the same estimate
and step time), its step set beside the best's, and the difference said on each plan's busiest rank (the critical
path the others wait for) as the parts that sum to its step: compute, waiting in the pipeline schedule, each axis's
exposed communication, the optimizer and the runtime's own cost."""
from __future__ import annotations

from dataclasses import dataclass

from compiler import spec as S
from compiler.diagnostics import ScaleError
from compiler.report.units import nbytes, seconds

WAITING, COMPUTE, TAIL = "waiting in the schedule", "compute", "optimizer and runtime"


@dataclass(frozen=True)
class Written:
    """The file's plan as written, costed; or, where the rules refuse it, the first refusal (`refused`)."""
    describe: str = ""
    step_time_s: float = 0.0
    peak_bytes: float = 0.0
    fits: bool = True
    precision: str = ""
    parts: tuple = ()           # (part, seconds) on its busiest rank, summing to that rank's end
    axes: tuple = ()            # its mesh (Plan.axes), to find the search's best of the same shape
    refused: str | None = None  # "E0610: the message" where the file's plan does not pass the rules

    def as_json(self) -> dict:
        if self.refused is not None:
            return {"refused": self.refused}
        return {"describe": self.describe, "precision": self.precision, "step_time_s": self.step_time_s,
                "peak_bytes": int(self.peak_bytes), "fits": self.fits,
                "parts_s": {k: v for k, v in self.parts}}


def busiest(pred):
    """The rank that computes and communicates longest (its step less its waiting): the critical path of a pipeline,
    which the other ranks wait for (the slowest rank, whose end is the step time, is often a light one waiting for
    it: DeepSeek-V3's pp rank 0, which holds the embedding's and the head's stages). Without pp, every rank."""
    return max(pred.ranks, key=lambda r: (r.end_s - r.idle_s, r.end_s))


def step_parts(pred) -> tuple:
    """The parts of `pred`'s step on its busiest rank (`busiest`), which sum to that rank's end: the compute (its
    busy time less the communication exposed in it), the waiting in the pipeline schedule, each axis's exposed
    communication (inside the pipeline and after it), the optimizer and the runtime's own cost."""
    r = busiest(pred)
    exposed = {a: t for a, t in r.exposed_comm_s.items() if t > 0}
    inside = sum(exposed.values()) - r.sync_s  # the exposed communication counted in compute_s
    parts = [(COMPUTE, r.compute_s - inside), (WAITING, r.idle_s)]
    parts += sorted(exposed.items(), key=lambda kv: -kv[1])
    parts.append((TAIL, r.tail_s))
    return tuple(parts)


def written(path: str, spec: S.Spec, limit_bytes: float) -> Written | None:
    """The file at `path`'s own plan, costed on `spec`'s cluster (what the search ran on), or None where the file
    writes no whole plan (no mesh axes: a missing setting) or is searched on another node count."""
    from compiler.check import check_path
    from compiler.pipeline import compile_spec
    try:
        own = check_path(path)
        if own.cluster.nodes != spec.cluster.nodes:
            return None
        compiled = compile_spec(own)  # the schedule proved too (E0609), as `plan` proves it
    except ScaleError as err:
        first = err.diagnostics[0]
        if any(d.code == "E0113" for d in err.diagnostics):  # no axes or another setting missing: nothing to compare
            return None
        return Written(refused=f"{first.code}: {first.message}")
    est, pred = compiled.costs, compiled.costs.step
    return Written(describe=compiled.plan.describe(), step_time_s=pred.step_time_s, peak_bytes=est.peak_bytes,
                   fits=est.peak_bytes <= limit_bytes, precision=precision_word(own.train, own.train.fp8),
                   parts=step_parts(pred), axes=compiled.plan.axes)


def precision_word(train, fp8) -> str:
    return "fp8" if fp8 is not None else train.precision


def lines(w: Written, winners: list, spec: S.Spec, limit_bytes: float) -> list:
    """What `scalec search` prints of the file's plan: its step against the best's, its mesh's rank among the
    winners, and the parts of the step that differ most."""
    if w.refused is not None:
        return [f"the file's plan is refused by the rules: {w.refused} (`scalec plan` shows where)"]
    head = f"the file's plan: {w.describe}, {w.precision}: {seconds(w.step_time_s)} a step"
    if not w.fits:
        head += f", needing {nbytes(w.peak_bytes)} a rank of {nbytes(limit_bytes)} (it does not fit)"
    if not winners:
        return [head]
    best = winners[0]
    bt = best.prediction.step_time_s
    head += f", {w.step_time_s / bt:.2f}× the best" if abs(w.step_time_s / bt - 1) >= 0.005 else ", as the best"
    out = [head]
    same = next((i for i, x in enumerate(winners, 1) if x.plan.axes == w.axes), None)
    if same is not None:
        x = winners[same - 1]
        settings = _differs(w, x, spec)
        out.append(f"  - its mesh ranks {_ordinal(same)}" + (f" with {settings}" if settings else "")
                   + f" ({seconds(x.prediction.step_time_s)}"
                   + (f", {x.prediction.step_time_s / bt:.2f}× the best" if same > 1 else "") + ")")
    else:
        out.append(f"  - its mesh is not among the {len(winners)} shown")
    mine, theirs = dict(w.parts), dict(step_parts(best.prediction))
    keys = list(dict.fromkeys([*mine, *theirs]))
    deltas = sorted(((k, mine.get(k, 0.0), theirs.get(k, 0.0)) for k in keys),
                    key=lambda d: -abs(d[1] - d[2]))
    shown = [d for d in deltas if abs(d[1] - d[2]) >= 0.005 * bt][:4]
    if shown:
        out.append("  - against the best, each on its busiest rank: " + "; ".join(
            f"{k} {seconds(a)} vs {seconds(b)} ({'+' if a >= b else '−'}{seconds(abs(a - b))})"
            for k, a, b in shown))
    return out


def _differs(w: Written, x, spec: S.Spec) -> str:
    """The ranked plan's settings where they are not the file's: its description's words, and its precision."""
    mine = set(_words(w.describe))
    words = [t for t in _words(x.plan.describe()) if t not in mine]
    prec = precision_word(spec.train, x.fp8)
    if prec != w.precision:
        words.append(prec)
    return ", ".join(words)


def _words(describe: str) -> list:
    inside = describe[describe.find("(") + 1:describe.rfind(")")] if "(" in describe else ""
    return [t.strip() for t in inside.split(",") if t.strip()]


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"
