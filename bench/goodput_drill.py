"""Goodput drill: compiler/cost/goodput.py's failure model held against runs that really fail.

    python3 -m bench.goodput_drill [-n 5] [--mtbf 20] [--steps 2000] [--every 50] [--seed 0]

Each trial trains the gpt_dp sample (dp = 2, gloo, one torchrun agent of two processes: launch.sh) for `--steps`
steps, saving a checkpoint every `--every` steps, with `restarts` high enough never to run out. From the end of the
first step on, failures arrive as a Poisson process of mean time between them `--mtbf` seconds (exponential gaps drawn
from a seeded generator, one seed per trial): at each, this script SIGKILLs one worker (rank drawn alike), torchrun's
agent restarts both, and the program resumes from its last checkpoint. A failure that finds no worker alive (the
agent between two attempts) strikes the first worker that starts.

Everything measured comes from the run's own metrics file (`--metrics`: each step's end on the job's clock,
SCALEC_LAUNCH_TIME, which this script sets and every attempt shares) and the kill times:
- s, a step: the mean gap between consecutive steps' ends that holds no save and no failure;
- C, a save: the mean of (gap after a checkpoint step − s);
- R, a restart: the mean of (the resumed attempt's first step's end − s − the failure), over restarts that no
  second failure cut short;
- the start-up S0 (the first attempt's first step's end, as this script saw it appear, − s) and the wall time T
  (the last step's end), both on the job's clock.

(a) One realisation against the model's accounting of it: T against S0 + N·s + saves·C + completed restarts·R + the
work each failure lost (from the last progress point, a checkpoint's end or a restart's, to the failure). With the
trial's own mean costs this closes by construction up to what the model has no term for (tests/test_goodput_drill.py
holds the bookkeeping to 1e-9 on made timelines): it says no wall time went unaccounted. Printed again with each
trial's s, C and R taken from the other trials, the model used as a predictor: there it differs by how much the
costs vary from run to run (on a shared machine, a lot).

(b) ETTR: measured, N·s / (T − S0) per trial, pooled over the trials as Σ N·s / Σ (T − S0); predicted, Daly's ETTR
(compiler.cost.goodput.ettr) at τ = every·s and the measured C, R and M (the pooled wall time after start-up over
the failures in it).

Prints one line per trial and, last, `goodput measured M.MMM predicted P.PPP (N trials, F failures)`.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import free_port  # noqa: E402

SAMPLE = ROOT / "samples" / "gpt_dp.scale"


def plan(every: int, restarts: int) -> str:
    text = SAMPLE.read_text()
    assert "log_every    = 5" in text
    return text.replace("log_every    = 5", f"log_every    = 1000\n  restarts = {restarts}  checkpoint_every = {every}")


def build(work: Path, every: int, restarts: int) -> Path:
    from compiler import codegen
    from compiler.check import check_text
    from compiler.pipeline import compile_spec
    out = work / "build"
    codegen.emit(compile_spec(check_text(plan(every, restarts), "goodput_drill.scale")), str(out))
    return out


def _workers(agent: int) -> list[int]:
    """The agent's children (torchrun's workers), from /proc."""
    try:
        text = Path(f"/proc/{agent}/task/{agent}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


class Injector(threading.Thread):
    """Kills one worker at seeded exponential times after the first step's end (`started` set)."""

    def __init__(self, agent: int, mtbf: float, seed: int, started: threading.Event, t0: float):
        super().__init__(daemon=True)
        self.agent, self.mtbf, self.rng, self.started, self.t0 = agent, mtbf, random.Random(seed), started, t0
        self.done = threading.Event()
        self.kills: list[float] = []  # the job clock (seconds since t0) of each failure

    def run(self) -> None:
        if not self._wait(self.started):
            return
        at = time.time()
        while True:
            at += self.rng.expovariate(1.0 / self.mtbf)
            if self.done.wait(max(0.0, at - time.time())):
                return
            victim = self.rng.randrange(2)
            while not self.done.is_set():
                pids = _workers(self.agent)
                if pids:
                    try:
                        os.kill(sorted(pids)[min(victim, len(pids) - 1)], signal.SIGKILL)
                        self.kills.append(time.time() - self.t0)  # the failure is the kill, late or on time
                        break
                    except ProcessLookupError:
                        pass
                time.sleep(0.01)

    def _wait(self, event: threading.Event) -> bool:
        while not event.wait(0.05):
            if self.done.is_set():
                return False
        return True


def one_run(build_dir: Path, work: Path, steps: int, mtbf: float, seed: int, timeout: int) -> dict:
    """One trial: the steps' ends on the job clock (the last record of each step and attempt), the kills, status."""
    metrics, ckpt = work / "run.jsonl", work / "ckpt"
    t0 = time.time()
    env = dict(os.environ, PYTHONPATH=str(ROOT), MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1",
               SCALEC_LAUNCH_TIME=repr(t0))
    cmd = ["bash", str(build_dir / "launch.sh"), "--steps", str(steps), "--metrics", str(metrics),
           "--checkpoint-dir", str(ckpt)]
    log = open(work / "run.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work)
    started = threading.Event()
    inj = Injector(proc.pid, mtbf, seed, started, t0)  # launch.sh execs the agent: same pid
    inj.start()
    deadline = time.time() + timeout
    first_end = None
    while proc.poll() is None and time.time() < deadline:
        if not started.is_set() and metrics.exists() and metrics.stat().st_size:
            line = metrics.read_text().split("\n")[0]
            try:
                first_end = json.loads(line)["elapsed_s"]  # the first step's end on the job clock: start-up ends
            except (ValueError, KeyError):
                continue
            started.set()
        time.sleep(0.02)
    inj.done.set()
    if proc.poll() is None:  # past the timeout: torchrun passes SIGTERM on to its workers
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    rc = proc.wait()
    inj.join()
    log.close()
    records = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    return {"rc": rc, "records": records, "kills": inj.kills, "log": (work / "run.log").read_text(),
            "first_end": first_end}


def measure(run: dict, every: int, steps: int) -> dict:
    """s, C, R, S0, T and the accounting of (a) for one trial (module docstring). The metrics file keeps one record
    per step, the attempt's that finished it (a resumed run drops the records after its checkpoint), so attempts are
    told apart by the kills: no gap that holds a kill is a step's or a save's."""
    ends = sorted((r["elapsed_s"], r["step"]) for r in run["records"])
    kills = sorted(run["kills"])

    def cut(a: float, b: float) -> bool:  # a failure between a and b
        return any(a < k <= b for k in kills)
    by_step = sorted(run["records"], key=lambda r: r["step"])
    plain, after_save = [], []
    for r0, r1 in zip(by_step, by_step[1:]):
        t0, t1 = r0["elapsed_s"], r1["elapsed_s"]
        if t1 <= t0 or cut(t0, t1):
            continue
        (after_save if r0["step"] % every == 0 else plain).append(t1 - t0)
    s = statistics.fmean(plain)  # means: the accounting sums expected costs
    save = statistics.fmean(g - s for g in after_save) if after_save else 0.0
    # each restart no second failure cut short: from the failure to the start of the first step that ended after it
    r_times = []
    for i, k in enumerate(kills):
        after = [t for t, _ in ends if t > k]
        if after and not (i + 1 < len(kills) and kills[i + 1] < after[0]):
            r_times.append(after[0] - s - k)
    R = statistics.fmean(r_times) if r_times else 0.0
    S0 = run["first_end"] - s
    T = ends[-1][0]
    # progress points: each checkpoint's end (its step's end + C) and each restart's end (its failure + R) where the
    # next failure came later; a failure loses the time since the last of them, or since the failure before it
    # where that one's restart had not ended
    saved = [t + save for t, st in ends if st % every == 0]
    lost, completed, prev = 0.0, 0, None
    for i, k in enumerate(kills):
        if k > T:
            break
        since = max([p for p in saved if p <= k] + [S0])
        if prev is not None:
            since = max(since, prev + R if prev + R <= k else prev)
        lost += k - since
        if (i + 1 >= len(kills) or kills[i + 1] >= k + R) and k + R <= T:
            completed += 1
        prev = k
    saves = sum(1 for st in range(1, steps) if st % every == 0)
    predicted = S0 + steps * s + saves * save + completed * R + lost
    return {"s": s, "C": save, "R": R, "S0": S0, "T": T, "failures": sum(1 for k in kills if k <= T),
            "predicted_T": predicted, "lost": lost, "restarts": completed, "work": steps * s}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=5, help="trials (default 5)")
    p.add_argument("--mtbf", type=float, default=20.0, help="mean seconds between failures (default 20)")
    p.add_argument("--steps", type=int, default=2000, help="steps per trial (default 2000)")
    p.add_argument("--every", type=int, default=50, help="checkpoint every N steps (default 50)")
    p.add_argument("--seed", type=int, default=0, help="the first trial's seed (default 0)")
    p.add_argument("--timeout", type=int, default=900, help="seconds one trial may take")
    p.add_argument("--keep", action="store_true", help="keep the working directory")
    args = p.parse_args(argv)
    from compiler.cost.goodput import ettr
    work = Path(tempfile.mkdtemp(prefix="goodput_drill_"))
    build_dir = build(work, args.every, restarts=1000)
    rows = []
    try:
        for i in range(args.n):
            trial = work / f"trial{i}"
            trial.mkdir()
            run = one_run(build_dir, trial, args.steps, args.mtbf, args.seed + i, args.timeout)
            done = {r["step"] for r in run["records"]}
            if run["rc"] != 0 or args.steps not in done:
                print(f"trial {i + 1}: FAIL: status {run['rc']}\n" + "\n".join(run["log"].splitlines()[-15:]))
                return 1
            m = measure(run, args.every, args.steps)
            rows.append(m)
            print(f"trial {i + 1}: {m['failures']} failures; s {m['s'] * 1e3:.1f} ms, C {m['C'] * 1e3:.1f} ms, "
                  f"R {m['R']:.2f} s, start-up {m['S0']:.2f} s; (a) wall {m['T']:.2f} s, accounting "
                  f"{m['predicted_T']:.2f} s ({m['predicted_T'] / m['T'] - 1:+.1%}: work {m['work']:.2f}, "
                  f"{m['restarts']} restarts, lost {m['lost']:.2f}); ETTR {m['work'] / (m['T'] - m['S0']):.3f}",
                  flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if len(rows) > 1:  # (a) again, each trial's s, C and R taken from the other trials: the model as a predictor
        for i, m in enumerate(rows):
            others = [o for j, o in enumerate(rows) if j != i]
            s_o = statistics.fmean(o["s"] for o in others)
            C_o = statistics.fmean(o["C"] for o in others)
            R_o = [o["R"] for o in others if o["restarts"]]
            R_o = statistics.fmean(R_o) if R_o else m["R"]
            saves = sum(1 for st in range(1, args.steps) if st % args.every == 0)
            loo = m["S0"] + args.steps * s_o + saves * C_o + m["restarts"] * R_o + m["lost"]
            print(f"trial {i + 1}: (a) with the other trials' s, C, R: accounting {loo:.2f} s against "
                  f"{m['T']:.2f} s ({loo / m['T'] - 1:+.1%})")
    wall = sum(m["T"] - m["S0"] for m in rows)
    failures = sum(m["failures"] for m in rows)
    measured = sum(m["work"] for m in rows) / wall
    s = statistics.fmean(m["s"] for m in rows)
    C = statistics.fmean(m["C"] for m in rows)
    R = statistics.fmean(m["R"] for m in rows if m["R"] > 0) if any(m["R"] > 0 for m in rows) else 0.0
    M = wall / failures if failures else float("inf")
    predicted = ettr(args.every * s, C, R, M) if failures else 1.0 / (1.0 + C / (args.every * s))
    print(f"inputs: M {M:.2f} s (measured: {wall:.1f} s over {failures} failures; injected {args.mtbf:g} s), "
          f"tau {args.every * s:.3f} s ({args.every} steps of {s * 1e3:.1f} ms), C {C * 1e3:.1f} ms, R {R:.2f} s")
    print(f"goodput measured {measured:.3f} predicted {predicted:.3f} ({len(rows)} trials, {failures} failures)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
