"""bench/goodput_drill.py's bookkeeping, on timelines made here with known costs: a step s, a save C every `every`
steps, a restart R from the last checkpoint after each failure (also one inside a save and one inside a restart).
What it reads back from the records and kills must be those costs, and its accounting of the realisation must add up
to the wall time exactly (tests/test_goodput.py holds Daly's ETTR it compares with). The drill itself (real runs, real kills)
is `python -m bench.goodput_drill`, figures in docs/planning.md; a one-trial run is in the slow tier."""
from __future__ import annotations

import pytest

from bench import goodput_drill as G


def simulate(s: float, C: float, R: float, S0: float, every: int, steps: int, kills: list) -> dict:
    """The run the drill would see: each step's end (the last attempt's record of it) on the job clock."""
    t, step, saved, recs, first_end = S0, 0, 0, {}, None
    pending, phase = sorted(kills), "step"
    while step < steps:
        end = t + {"step": s, "save": C, "restart": R}[phase]
        if pending and pending[0] < end:  # a failure: back to the last checkpoint, after a restart
            t, phase, step = pending.pop(0), "restart", saved
            recs = {k: v for k, v in recs.items() if k <= saved}
            continue
        t = end
        if phase == "step":
            step += 1
            recs[step] = t
            first_end = first_end or t
            phase = "save" if step % every == 0 and step < steps else "step"
        else:
            saved = step if phase == "save" else saved
            phase = "step"
    return {"records": [{"step": k, "elapsed_s": v} for k, v in sorted(recs.items())], "kills": sorted(kills),
            "first_end": first_end}


@pytest.mark.parametrize("kills", [[], [9.0], [9.0, 15.1, 15.2, 25.0]],
                         ids=["no failure", "one", "several, one inside a restart"])
def test_the_costs_read_back_and_the_accounting_adds_up(kills):
    s, C, R, S0, every, steps = 0.02, 0.15, 4.0, 6.0, 10, 600
    run = simulate(s, C, R, S0, every, steps, kills)
    m = G.measure(run, every, steps)
    assert m["s"] == pytest.approx(s) and m["S0"] == pytest.approx(S0)
    assert m["C"] == pytest.approx(C)
    assert m["R"] == pytest.approx(R if kills else 0.0)
    assert m["failures"] == len(kills)
    assert m["predicted_T"] == pytest.approx(m["T"], rel=1e-9)  # every second of the wall time accounted for
    if not kills:
        assert m["T"] == pytest.approx(S0 + steps * s + (steps // every - 1) * C)


def test_a_failure_inside_a_restart_loses_that_restart():
    s, C, R, S0, every, steps = 0.02, 0.15, 4.0, 6.0, 10, 300
    run = simulate(s, C, R, S0, every, steps, [9.0, 11.0])  # the second strikes 2 s into the first's restart
    m = G.measure(run, every, steps)
    assert m["restarts"] == 1 and m["R"] == pytest.approx(R)
    assert m["predicted_T"] == pytest.approx(m["T"], rel=1e-9)



@pytest.mark.slow  # a minute or more of a two-rank run that is killed and restarted (docs/testing.md, slow tier)
@pytest.mark.e2e
def test_a_run_that_fails_at_random_is_accounted_for(tmp_path):
    """One real trial: seed 1 draws its first failure 1.15 s after the first step (random.Random(1)), so at least one
    kill lands in a run of 300 steps; the run finishes every step, and the model's accounting of what happened (its
    own s, C, R) holds its wall time within 5% (the rest: restarts cut short, which the mean R does not cover)."""
    build_dir = G.build(tmp_path, every=20, restarts=100)
    (tmp_path / "trial").mkdir()
    run = G.one_run(build_dir, tmp_path / "trial", steps=300, mtbf=8.0, seed=1, timeout=600)
    assert run["rc"] == 0 and max(r["step"] for r in run["records"]) == 300, run["log"][-3000:]
    m = G.measure(run, 20, 300)
    assert m["failures"] >= 1 and m["R"] > 0
    assert m["predicted_T"] == pytest.approx(m["T"], rel=0.05), m
