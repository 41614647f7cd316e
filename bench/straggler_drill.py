"""Straggler drill: one rank made slow by real extra work (SCALEC_TEST_SLOW, runtime/sections.py) in an 8-rank run
on gloo, as 4 simulated nodes of 2 processes (four torchrun agents, c10d rendezvous on loopback, launch.sh's
LOCAL_NODES=1); the detector (runtime/stragglers.py) must name it with its node and slow section.

    python3 -m bench.straggler_drill [-n 10] [--rank 5] [--onset 50] [--fraction 0.3] [--clean-steps 1000]
    python3 -m bench.straggler_drill --ramp [--ramp-steps 300]
    python3 -m bench.straggler_drill --overhead [--steps 300]

Onset: each of `-n` seeded trials slows `--rank` by `--fraction` from step `--onset` on; a trial passes when the
rank is named, with its node and a section the hook slowed (forward, backward or optimizer: all alike, so the one
quoted is the one its noise left lowest), within 10 steps of the onset (at the end of the window that
ends there). False alarms: any rank named in a window with no slow step (the trials' windows before the onset and a
clean run of `--clean-steps` steps). Last line: `named N/10, false alarms F in S clean steps`.

Ramp: the slowdown grows linearly from 0 to `--fraction` over `--ramp-steps` steps; prints at which slowdown the
rank was first named (the target: once above 10%, before 15%).

The what-if: the predicted loss (ms/step) against the injected cost, the extra seconds per step the slowed rank
computed over the same steps (SCALEC_TEST_SLOW's own count, one line a window: what it did, on the compute
sections' clock), printed per trial. Each trial runs EPISODE windows past the onset; the what-if compared is the last
one of the episode that first named the rank (its mean over the windows that named it in a row).

Overhead: `resilience.detect` on against off, alternated (`overhead`: the one-rank tiny_gpt program, whose short
step is the hardest case), the median step times and the CPU time per step of each.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import free_port, run_session  # noqa: E402
from runtime.sections import SLOWED  # noqa: E402

PLAN = (ROOT / "samples" / "gpt_dp.scale").read_text().replace("axis dp = 2", "axis dp = 8").replace(
    "nodes = 1", "nodes = 4").replace("log_every    = 5", "log_every    = 1000").replace(
    "global_batch = 16", "global_batch = 128")


def build(work: Path, threshold: float | None = None, window: int | None = None, detect: bool = True) -> Path:
    """The drill's plan (gpt_dp with dp = 8 on 4 nodes of 2) compiled; the detector's settings written into the
    program's Config (the language's `resilience` section is another part of issue 41)."""
    from compiler import codegen
    from compiler.check import check_text
    from compiler.pipeline import compile_spec
    compiled = compile_spec(check_text(PLAN, "drill.scale"))
    out = work / f"build-{threshold}-{window}-{detect}"
    codegen.emit(compiled, str(out))
    program = out / "program.py"
    settings = [f"detect={detect}"] + ([f"threshold={threshold}"] if threshold else []) + (
        [f"window={window}"] if window else [])
    text, group = program.read_text(), f"resilience=train.Resilience({', '.join(settings)})"
    if "resilience=train.Resilience(" in text:
        text = re.sub(r"resilience=train\.Resilience\([^)]*\)", group, text)
    else:
        text = text.replace("CONFIG = train.Config(", f"CONFIG = train.Config(\n    {group},", 1)
    program.write_text(text)
    return out


CLOCK = ["default"]  # SCALEC_TEST_CPU_CLOCK of the runs (--clock; "default": unset, the runtime's own)


def launch(build_dir: Path, work: Path, name: str, steps: int, seed: int, env_extra: dict, timeout: int):
    """One run of the four agents; (exit status, output, metrics records)."""
    metrics = work / f"{name}.jsonl"
    env = dict(os.environ, PYTHONPATH=str(ROOT), LOCAL_NODES="1", MASTER_PORT=str(free_port()),
               OMP_NUM_THREADS="1", **env_extra)
    env.pop("SCALEC_TEST_CPU_CLOCK", None)
    if CLOCK[0] != "default":
        env["SCALEC_TEST_CPU_CLOCK"] = CLOCK[0]
    cmd = ["bash", str(build_dir / "launch.sh"), "--steps", str(steps), "--seed", str(seed), "--metrics",
           str(metrics)]
    rc, out = run_session(cmd, env, timeout)
    records = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    return rc, out, records


NAMED = re.compile(r"scalec: straggler at steps (\d+)-(\d+): rank (\d+) \(node (\d+), [^,]+, (\S+)\) is slow in "
                   r"(\w+|its compute) \(score [\d.]+\): (\w+) score ([\d.]+)")
WHAT_IF = re.compile(r"scalec: what-if \(steps (\d+)-(\d+)\): .* instead of ([\d,.]+): ([\d,.]+) ms/step")
EPISODE = 5
"""Windows each onset trial runs past its onset: the what-if compared is the episode's last (its mean over them)."""


def namings(out: str) -> list[dict]:
    """Every straggler line of a run's output, parsed."""
    found = []
    for m in NAMED.finditer(out):
        found.append({"first": int(m[1]), "last": int(m[2]), "rank": int(m[3]), "node": int(m[4]),
                      "device": m[5], "section": m[6], "score": float(m[8])})
    return found


def what_ifs(out: str) -> dict:
    """The episode's first step -> (its last step, measured ms/step, predicted loss ms/step) of its last what-if
    line."""
    return {int(m[1]): (int(m[2]), float(m[3].replace(",", "")), float(m[4].replace(",", "")))
            for m in WHAT_IF.finditer(out)}


DONE = re.compile(r"scalec: SCALEC_TEST_SLOW: rank \S+ steps (\d+)-(\d+): ([\d.]+) ms of extra work per step")


def injected(out: str, first: int, last: int, fraction: float) -> float | None:
    """The extra work the hook did, ms per step, over the windows of steps `first`-`last` (its own count, each
    window's line); without those lines, its forward + backward + optimizer before the onset × `fraction`."""
    done = [float(m[3]) for m in DONE.finditer(out) if int(m[1]) >= first and int(m[2]) <= last]
    if done:
        return sum(done) / len(done)
    base = slow_base(out)
    return base * fraction if base is not None else None


def clean_windows(records: list, onset: int | None) -> tuple[int, int]:
    """(steps in windows with no slow step, false alarms among them) from the metrics records' window figures."""
    steps = alarms = 0
    for r in records:
        if "straggler_window" not in r:
            continue
        first, last = r["straggler_window"]
        if onset is None or last < onset:
            steps += last - first + 1
            alarms += len(r["stragglers"])
    return steps, alarms


def onset_trials(args, work: Path, build_dir: Path) -> tuple[int, int, int, list]:
    named = alarms = clean = wrong = 0
    errors = []
    node_of = args.rank // 2
    for i in range(args.n):
        steps = args.onset + EPISODE * args.window + 5
        rc, out, records = launch(build_dir, work, f"onset{i}", steps, 1000 + i,
                                  {"SCALEC_TEST_SLOW": f"{args.rank}:{args.onset}:{args.fraction}"}, args.timeout)
        s, a = clean_windows(records, args.onset)
        clean, alarms = clean + s, alarms + a
        hits = [x for x in namings(out) if x["last"] >= args.onset and x["rank"] == args.rank]
        others = [x for x in namings(out) if x["last"] >= args.onset and x["rank"] != args.rank]
        wrong += len(others)
        first = hits[0] if hits else None
        ok = (rc == 0 and first is not None and first["rank"] == args.rank and first["last"] - args.onset <= 10
              and first["node"] == node_of and first["section"] in SLOWED)
        named += bool(ok)
        wi = what_ifs(out).get(first["first"]) if first else None
        cost = injected(out, first["first"], wi[0], args.fraction) if wi else None
        err = ""
        if wi and cost:
            errors.append((wi[2] - cost) / cost)
            err = f"; what-if {wi[2]:.2f} ms/step lost against {cost:.2f} injected ({errors[-1]:+.0%})"
        where = (f"rank {first['rank']} node {first['node']} {first['device']} in {first['section']} "
                 f"(score {first['score']:.2f}) at step {first['last']}" if first else "not named")
        print(f"trial {i + 1:>2}: {'pass' if ok else 'FAIL'}: {where}{err}; clean windows: {s} steps, {a} alarm(s); "
              f"other ranks named after the onset: {len(others)}"
              + "".join(f"\n  {x}" for x in out.splitlines() if first and x.startswith(
                  (f"scalec: straggler at steps {first['first']}-{first['last']}: rank {args.rank} ",
                   f"scalec: what-if (steps {first['first']}-")))
              + ("" if rc == 0 else f"\n{out[-2000:]}"), flush=True)
    print(f"other ranks named in windows after the onset: {wrong}")
    return named, alarms, clean, errors


BASE = re.compile(r"scalec: SCALEC_TEST_SLOW: rank \d+ forward ([\d.]+) ms \+ backward ([\d.]+) ms \+ "
                  r"optimizer ([\d.]+) ms per step")


def slow_base(out: str) -> float | None:
    """The slowed rank's forward + backward + optimizer ms/step before the onset, as its drill hook printed it."""
    m = BASE.search(out)
    return float(m[1]) + float(m[2]) + float(m[3]) if m else None


def clean_run(args, work: Path, build_dir: Path) -> tuple[int, int]:
    if args.clean_steps <= 0:
        return 0, 0
    rc, out, records = launch(build_dir, work, "clean", args.clean_steps, 7, {}, args.timeout * 4)
    if rc != 0:
        print(out[-3000:])
    s, a = clean_windows(records, None)
    print(f"clean run: {args.clean_steps} steps, {s} steps in scored windows, {a} alarm(s)"
          + "".join(f"\n  {x}" for x in re.findall(r"scalec: straggler at [^\n]*", out)), flush=True)
    return s, a


def ramp(args, work: Path, build_dir: Path) -> int:
    """`-n` ramps (seeds 99, 100, ...); the number that named the rank once above 10%, before 15%."""
    passed = sum(ramp_once(args, work, build_dir, 99 + i) == 0 for i in range(args.n))
    print(f"ramp: named above 10% and before 15% in {passed}/{args.n}")
    return 0 if passed == args.n else 1


def ramp_once(args, work: Path, build_dir: Path, seed: int) -> int:
    steps = args.onset + args.ramp_steps + args.window
    rc, out, records = launch(build_dir, work, "ramp", steps, seed,
                              {"SCALEC_TEST_SLOW": f"{args.rank}:{args.onset}:{args.fraction}:{args.ramp_steps}"},
                              args.timeout * 3)
    hits = [x for x in namings(out) if x["rank"] == args.rank and x["last"] >= args.onset]
    false = [x for x in namings(out) if x["rank"] != args.rank or x["last"] < args.onset]
    if rc != 0 or not hits:
        print(out[-3000:])
        print(f"ramp: not named (exit {rc})")
        return 1
    at = hits[0]["last"]
    # slowdown at the window's last step, and at its middle (what a window median sees)
    last = args.fraction * min(1.0, (at - args.onset + 1) / args.ramp_steps)
    mid = args.fraction * min(1.0, (at - args.window / 2 - args.onset + 1) / args.ramp_steps)
    ok = 0.10 < last < 0.15
    first = hits[0]
    print(f"ramp (seed {seed}): rank {args.rank} named at step {at} (node {first['node']}, {first['section']}, "
          f"score {first['score']:.2f}), slowdown {last:.1%} at that step ({mid:.1%} at its window's middle); "
          f"other namings {len(false)}: {'pass' if ok else 'FAIL'} (target: above 10%, before 15%)")
    return 0 if ok else 1


def _loop(program, ctx, steps: int, work: Path, detect: bool) -> list[float]:
    """`steps` steps of the one-rank program in this process, straggler detection on or off; its step times."""
    from dataclasses import replace

    from bench.common import read_metrics
    from bench.overhead import _args
    from runtime import train
    metrics = work / "metrics.jsonl"
    cfg = program.CONFIG
    cfg = replace(cfg, steps=steps, log_every=10 ** 9, resilience=replace(cfg.resilience, detect=detect))
    train.run(program.Model, cfg, ctx, _args(str(metrics)))
    return [r["step_time"] for r in read_metrics(metrics)]


def timing_cost(program, ctx, work: Path, steps: int) -> tuple[float, float, dict]:
    """The detector's own time per step, measured directly: a run of `steps` steps counts the timeline's calls per
    step and times the detector's per-window work (`Detector.end`: rows, gather, scores); the same calls are then
    timed in a loop of their own. Returns (timeline seconds per step, window work seconds per step, calls/step)."""
    from runtime import sections, stragglers
    calls = {name: 0 for name in ("begin", "end", "enter", "exit", "mark")}
    saved = {name: getattr(sections.Timeline, name) for name in calls}
    spent = [0.0]
    end = stragglers.Detector.end

    def counting(name):
        def run(self, *a):
            calls[name] += 1
            return saved[name](self, *a)
        return run

    def timed_end(self, step):
        t0 = time.perf_counter()
        end(self, step)
        spent[0] += time.perf_counter() - t0
    for name in calls:
        setattr(sections.Timeline, name, counting(name))
    stragglers.Detector.end = timed_end
    try:
        _loop(program, ctx, steps, work, True)
    finally:
        for name, fn in saved.items():
            setattr(sections.Timeline, name, fn)
        stragglers.Detector.end = end
    per_step = {k: v / steps for k, v in calls.items()}
    import torch
    tl, reps = sections.Timeline(torch.device("cpu")), 2000
    regions, marks = round(per_step["enter"]), round(per_step["mark"])
    t0 = time.perf_counter()
    for i in range(reps):
        tl.begin()
        for _ in range(regions - 1):
            tl.enter("forward")
            tl.exit()
        tl.enter(sections.BACKWARD_SYNC)
        for _ in range(marks):
            tl.mark()
        tl.exit()
        tl.end()
        if i % 10 == 9:
            tl.rows()
    return (time.perf_counter() - t0) / reps, spent[0] / steps, per_step


def mark_cost(reps: int = 20, steps: int = 2000) -> float:
    """What the synced backward's mark costs a step where a backward reduces (more than one batch rank, or FSDP2;
    elsewhere none is set): `sections.mark_backward_end` (a hook on the loss, which queues autograd's callback of
    `mark`) on a backward of one multiplication, against the same backward without it, alternated `reps` times of
    `steps` each; seconds per backward. The timeline's own loop above calls `mark` directly, which leaves out
    autograd's calls; a backward this small leaves the difference above the machine's noise."""
    import torch

    from runtime import sections
    x = torch.ones(4, requires_grad=True)
    tl = sections.Timeline(torch.device("cpu"))

    def run(marked: bool) -> float:
        t0 = time.perf_counter()
        with sections.timed(tl):
            for _ in range(steps):
                tl.begin()
                tl.enter(sections.BACKWARD_SYNC)
                loss = (x * 2).sum()
                if marked:
                    sections.mark_backward_end(loss)
                loss.backward()
                tl.exit()
                tl.end()
        tl.rows()
        return (time.perf_counter() - t0) / steps
    run(True)
    spent = {True: [], False: []}
    for i in range(reps):
        for marked in (True, False) if i % 2 == 0 else (False, True):
            spent[marked].append(run(marked))
    return statistics.median(spent[True]) - statistics.median(spent[False])


def overhead(args, work: Path) -> int:
    """Detect on against off, side by side: the one-rank tiny_gpt program (the shortest step, so the largest share
    the timing can take) in this process, alternated `-n` times, `--steps` each; the medians of the steps after the
    first window, and the CPU time per step (a run of 2N steps less one of N: steadier on a shared machine)."""
    import torch

    from bench.overhead import _compile
    from runtime import mesh
    torch.set_num_threads(1)
    program = _compile("samples/tiny_gpt.scale", work / "one")
    ctx = mesh.setup(program.CONFIG.parallel.axes, 0, program.CONFIG.parallel.groups)
    wall, cpu = {True: [], False: []}, {True: [], False: []}
    for i in range(args.n):
        for detect in (True, False) if i % 2 == 0 else (False, True):
            wall[detect] += _loop(program, ctx, args.steps, work, detect)[args.window:]
            spent = []
            for k in (args.steps, 2 * args.steps):
                t0 = time.process_time()
                _loop(program, ctx, k, work, detect)
                spent.append(time.process_time() - t0)
            cpu[detect].append((spent[1] - spent[0]) / args.steps)
    timeline, window_work, per_step = timing_cost(program, ctx, work, args.steps)
    w_on, w_off = statistics.median(wall[True]), statistics.median(wall[False])
    c_on, c_off = statistics.median(cpu[True]), statistics.median(cpu[False])
    print(f"tiny_gpt, one rank, {args.n} runs of {args.steps} steps each way: median step detect on "
          f"{w_on * 1e3:.3f} ms, off {w_off * 1e3:.3f} ms ({(w_on - w_off) / w_off:+.2%}); CPU time per step on "
          f"{c_on * 1e3:.3f} ms, off {c_off * 1e3:.3f} ms ({(c_on - c_off) / c_off:+.2%})")
    print(f"measured directly: the timeline {timeline * 1e6:.1f} µs per step ({per_step['enter']:.0f} regions, "
          f"{per_step['mark']:.0f} gradient marks), the window's rows and scores {window_work * 1e6:.1f} µs per step: "
          f"{(timeline + window_work) / w_off:.2%} of the {w_off * 1e3:.3f} ms step without detection")
    mark = mark_cost()
    print(f"where a backward reduces (more than one batch rank, or FSDP2), its mark adds {mark * 1e6:.1f} µs per step "
          f"(a hook and autograd's callback): {(timeline + window_work + mark) / w_off:.2%} of the step in all")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", type=int, default=10, help="seeded trials (onset), or runs each way (--overhead)")
    p.add_argument("--rank", type=int, default=5)
    p.add_argument("--onset", type=int, default=50)
    p.add_argument("--fraction", type=float, default=0.3)
    p.add_argument("--clean-steps", type=int, default=1000, help="a clean run's steps (false alarms)")
    p.add_argument("--ramp", action="store_true", help="the ramp drill instead")
    p.add_argument("--ramp-steps", type=int, default=300)
    p.add_argument("--overhead", action="store_true", help="detect on against off instead")
    p.add_argument("--steps", type=int, default=200, help="steps per run of --overhead")
    p.add_argument("--threshold", type=float, help="resilience threshold (default: runtime.config's)")
    p.add_argument("--window", type=int, help="resilience window (default: runtime.config's)")
    p.add_argument("--clock", choices=("default", "wall", "thread"), default="default",
                   help="the CPU sections' clock: default (the runtime's: compute sections on the training "
                        "thread's CPU time, waits on the wall clock), wall (every section; 8 processes share 2 "
                        "cores here: wall time is mostly the scheduler's) or thread (every section on the training "
                        "thread's CPU time)")
    p.add_argument("--timeout", type=int, default=300)
    args = p.parse_args(argv)
    CLOCK[0] = args.clock
    from runtime.config import Resilience
    args.window = args.window or Resilience().window
    work = Path(tempfile.mkdtemp(prefix="straggler_drill_"))
    try:
        if args.overhead:
            return overhead(args, work)
        build_dir = build(work, args.threshold, args.window)
        if args.ramp:
            return ramp(args, work, build_dir)
        t0 = time.perf_counter()
        named, alarms, clean, errors = onset_trials(args, work, build_dir)
        s, a = clean_run(args, work, build_dir)
        if errors:
            print(f"what-if against the injected cost: within 10% in {sum(abs(e) <= 0.10 for e in errors)}/"
                  f"{len(errors)} trials, mean error {statistics.mean(errors):+.1%}, largest "
                  f"{max(errors, key=abs):+.1%}")
        print(f"({time.perf_counter() - t0:.0f} s)")
        print(f"clock {args.clock}, threshold {args.threshold or Resilience().threshold}, window {args.window}")
        print(f"named {named}/{args.n}, false alarms {alarms + a} in {clean + s} clean steps")
        return 0 if named == args.n and alarms + a == 0 else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
