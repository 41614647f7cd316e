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
from compiler.search import precision as PR

WAITING, COMPUTE, TAIL = "waiting in the schedule", "compute", "optimizer and runtime"


@dataclass(frozen=True)
class Written:
    """The file's plan as written, costed; or, where it does not compile (a rule, the schedule's proof), the first
    diagnostic (`refused`)."""
    describe: str = ""
    step_time_s: float = 0.0
    peak_bytes: float = 0.0
    fits: bool = True
    precision: str = ""
    parts: tuple = ()           # (part, seconds) on its busiest rank, summing to that rank's end
    plan: object = None         # the decided Plan: its mesh and settings, compared with the ranked plan of its mesh
    refused: str | None = None  # "E0610: the message" where the file's plan does not compile

    def as_json(self) -> dict:
        if self.refused is not None:
            return {"refused": self.refused}
        return {"describe": self.describe, "precision": self.precision, "step_time_s": self.step_time_s,
                "peak_bytes": int(self.peak_bytes), "fits": self.fits,
                "parts_s": {k: v for k, v in self.parts}}


def busiest(pred):
    """The rank that computes and communicates longest (its end less its waiting in the schedule): the critical
    path of a pipeline, which the other ranks wait for (the slowest rank, whose end is the step time, is often a light
    one waiting for it: DeepSeek-V3's pp rank 0, which holds the embedding's and the head's stages). Without pp,
    every rank."""
    return max(pred.ranks, key=lambda r: (r.end_s - _waiting(r), r.end_s))


def _waiting(r) -> float:
    """A rank's waiting in the schedule: its pipeline phase (its end less what follows the pipeline: the
    once-per-step collectives, offload's copies, the optimizer and the runtime) less its busy time and its sends.
    Its own end, not the step's: a rank that ends before the slowest does not wait for it inside its step."""
    exposed = r.exposed_comm_s
    host, sends = exposed.get("host", 0.0), exposed.get("pp", 0.0)
    return max(r.end_s - r.sync_s - host - r.tail_s - r.compute_s - sends, 0.0)


def step_parts(pred) -> tuple:
    """The parts of `pred`'s step on its busiest rank (`busiest`), which sum to that rank's end
    (step_time.RankTime: `compute_s` its busy time, tp's, ep's and cp's exposed collectives on its path included;
    its pipeline end, then the once-per-step collectives `sync_s`, offload's copies ("host"), and `tail_s`):
    - compute: its busy time less the communication exposed on its compute's path;
    - each axis's exposed communication: on the compute's path, the pipeline's sends ("pp"), the once-per-step
      collectives after the pipeline, offload's copies ("host");
    - waiting in the schedule (`_waiting`);
    - the optimizer and the runtime's own cost."""
    r = busiest(pred)
    exposed = {a: t for a, t in r.exposed_comm_s.items() if t > 0}
    sends, host = exposed.get("pp", 0.0), exposed.get("host", 0.0)
    inside = sum(exposed.values()) - r.sync_s - sends - host  # on the compute's path, inside compute_s
    parts = [(COMPUTE, r.compute_s - inside), (WAITING, _waiting(r))]
    parts += sorted(exposed.items(), key=lambda kv: -kv[1])
    parts.append((TAIL, r.tail_s))
    return tuple(parts)


def written(path: str, spec: S.Spec, limit_bytes: float) -> Written | None:
    """The file at `path`'s own plan, costed on `spec`'s cluster (what the search ran on), or None where the file
    writes no plan to compare (no plan section, or no mesh axes: a missing setting) or is searched on another node
    count."""
    from compiler.check import check_file
    from compiler.parse import parse
    from compiler.pipeline import compile_spec
    try:
        tree = parse(spec.source, path)  # the text the search read, parsed once
        if not any(sec.kind.id == "plan" for sec in tree.sections):
            return None  # the mesh with the plan's defaults is not a plan the user wrote
        own = check_file(tree, spec.source)
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
                   fits=est.peak_bytes <= limit_bytes, precision=_precision(own, own.train.fp8), parts=step_parts(pred),
                   plan=compiled.plan)


def _precision(spec: S.Spec, fp8) -> str:
    """A plan's precision as the file writes it: the fp8 call with its recipe, or bf16 / fp32."""
    return PR.text(fp8) if fp8 is not None else spec.train.precision


def _mesh(axes) -> dict:
    """The sizes of a mesh's axes above 1, whatever their order (the search lays its axes out in its own)."""
    return {a: n for a, n in axes if n > 1}


def lines(w: Written, winners: list, spec: S.Spec, limit_bytes: float) -> list:
    """What `scalec search` prints of the file's plan: its step against the best's, its mesh's rank among the
    winners, and the parts of the step that differ most."""
    if w.refused is not None:
        return [f"the file's plan does not compile: {w.refused} (`scalec plan` shows where)"]
    head = f"the file's plan: {w.describe}, {w.precision}: {seconds(w.step_time_s)} a step"
    if not w.fits:
        head += (f", needing {nbytes(w.peak_bytes)} a rank, over the search's limit of {nbytes(limit_bytes)} (the "
                 "device less the headroom)")
    if not winners:
        return [head]
    best = winners[0]
    bt = best.prediction.step_time_s
    head += f", {w.step_time_s / bt:.2f}× the best" if abs(w.step_time_s / bt - 1) >= 0.005 else ", as the best"
    out = [head]
    same = next((i for i, x in enumerate(winners, 1) if _mesh(x.plan.axes) == _mesh(w.plan.axes)), None)
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
    """What the ranked plan of the file's mesh changes of the file's: each setting that differs ("gpipe instead of
    1f1b", "no sequence parallel"), its axes' order where that differs, and its precision."""
    mine, theirs = w.plan.settings_words(), x.plan.settings_words()
    words = []
    for key in dict.fromkeys([*theirs, *mine]):
        a, b = mine.get(key), theirs.get(key)
        if a == b:
            continue
        words.append(f"{b} instead of {a}" if a and b else b if b else _DROPPED.get(key, f"no {a}"))
    if tuple(a for a, n in x.plan.axes if n > 1) != tuple(a for a, n in w.plan.axes if n > 1):
        words.append("its axes laid out " + " × ".join(a for a, n in x.plan.axes if n > 1))
    prec = _precision(spec, x.fp8)
    if prec != w.precision:
        words.append(f"{prec} instead of {w.precision}")
    return ", ".join(words)


_DROPPED = {"compiled": "eager", "placement": "the mesh's own order", "schedule": "no pipeline",
            "recompute": "no recompute"}
"""How a setting the ranked plan turns off is said (otherwise "no " and the file's words)."""


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"
