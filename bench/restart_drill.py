"""Restart drill: SIGKILL one rank mid-run, N times in a row; each time torchrun (train { restarts }) restarts the
job, which resumes from the last checkpoint and must end with the same losses and weights, bitwise, as a run that was
never interrupted.

    python3 bench/restart_drill.py [-n 10] [--steps 6] [--kill-at 1:4] [--kill-ranks 0,1] [--nodes 2]

`--nodes 2` runs the plan as two nodes of one process each: two torchrun agents (LOCAL_NODES=1, c10d rendezvous on
loopback), where a restart is a membership change for the agent whose worker did not fail. `--kill-ranks 0,1`
kills those ranks in turn, one per trial (rank 0 in trial 1, rank 1 in trial 2, ...), at --kill-at's step.

Prints one line per trial (pass/fail, seconds) and N/N passed at the end; exit 1 if any failed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import free_port, run_session  # noqa: E402

PLAN = (ROOT / "samples" / "gpt_dp.scale").read_text().replace(
    "log_every    = 5", "log_every    = 1\n  restarts = 1  checkpoint_every = 2")


def plan(nodes: int) -> str:
    """The drill's plan: gpt_dp (dp = 2) on one node of two processes, or on two nodes of one."""
    if nodes == 1:
        return PLAN
    if nodes != 2:
        raise SystemExit("restart_drill: --nodes is 1 or 2 (dp = 2)")
    return PLAN.replace("nodes = 1", "nodes = 2").replace("devices_per_node = 2", "devices_per_node = 1")


def kills(kill_at: str, kill_ranks: str | None, n: int) -> list[str]:
    """SCALEC_TEST_KILL_AT of each trial: `kill_at` (RANK:STEP), or the ranks of `kill_ranks` in turn at its step."""
    rank, step = kill_at.split(":")
    ranks = [r.strip() for r in kill_ranks.split(",")] if kill_ranks else [rank]
    return [f"{ranks[i % len(ranks)]}:{step}" for i in range(n)]


def build(work: Path, nodes: int = 1) -> Path:
    from compiler import codegen
    from compiler.check import check_text
    from compiler.pipeline import compile_spec
    compiled = compile_spec(check_text(plan(nodes), "drill.scale"))
    out = work / "build"
    codegen.emit(compiled, str(out))
    return out


def launch(build_dir: Path, work: Path, name: str, steps: int, env_extra: dict, timeout: int):
    ckpt, metrics = work / f"{name}.ckpt", work / f"{name}.jsonl"
    shutil.rmtree(ckpt, ignore_errors=True)
    weights = work / f"{name}.weights.pt"
    env = dict(os.environ, PYTHONPATH=str(ROOT), LOCAL_NODES="1", MASTER_PORT=str(free_port()),
               OMP_NUM_THREADS="1", SCALEC_TEST_SAVE_WEIGHTS=str(weights), **env_extra)
    cmd = ["bash", str(build_dir / "launch.sh"), "--steps", str(steps), "--metrics", str(metrics),
           "--checkpoint-dir", str(ckpt)]
    t0 = time.perf_counter()
    rc, out = run_session(cmd, env, timeout)
    dt = time.perf_counter() - t0
    records = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    return rc, out, dt, records, ckpt, weights


def final_state(weights: Path):
    import torch
    return torch.load(weights) if weights.exists() else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", type=int, default=10, help="trials in a row")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--kill-at", default="1:4", help="RANK:STEP that SIGKILLs itself on the first attempt")
    p.add_argument("--kill-ranks", metavar="R,R,...", help="kill these ranks in turn, one per trial (at --kill-at's "
                                                          "step), e.g. 0,1")
    p.add_argument("--nodes", type=int, default=1, help="1: one torchrun agent of two processes; 2: two agents of one")
    p.add_argument("--timeout", type=int, default=180)
    args = p.parse_args(argv)
    import torch
    work = Path(tempfile.mkdtemp(prefix="restart_drill_"))
    build_dir = build(work, args.nodes)
    schedule = kills(args.kill_at, args.kill_ranks, args.n)
    rc, out, ref_dt, ref_records, _, ref_w = launch(build_dir, work, "reference", args.steps, {}, args.timeout)
    if rc != 0:
        print(out[-3000:])
        print(f"the uninterrupted reference run failed ({rc})")
        return 1
    ref_losses = [r["loss"] for r in ref_records]
    ref_weights = final_state(ref_w)
    print(f"reference: {args.steps} steps in {ref_dt:.1f} s, final loss {ref_losses[-1]:.6f}", flush=True)
    passed, times = 0, []
    for i in range(args.n):
        rc, out, dt, records, ckpt, w = launch(build_dir, work, f"trial{i}", args.steps,
                                               {"SCALEC_TEST_KILL_AT": schedule[i]}, args.timeout)
        by_step = {r["step"]: r["loss"] for r in records}  # the resumed attempt rewrites the steps after the save
        losses = [by_step.get(s + 1) for s in range(args.steps)]
        weights = final_state(w)
        restarted = "resumed from" in out
        same_w = weights is not None and ref_weights.keys() == weights.keys() and all(
            torch.equal(ref_weights[k], weights[k]) for k in ref_weights)
        ok = rc == 0 and restarted and losses == ref_losses and same_w
        passed += ok
        times.append(dt)
        why = "" if ok else (f"  exit {rc}, resumed {restarted}, losses equal {losses == ref_losses}, "
                             f"weights equal {same_w}\n" + "\n".join(out.splitlines()[-25:]))
        print(f"trial {i + 1:>2} (kill {schedule[i]}): {'pass' if ok else 'FAIL'} in {dt:5.1f} s{why}", flush=True)
    agents = f"{args.nodes} torchrun agent{'s' if args.nodes > 1 else ''}"
    print(f"{passed}/{args.n} passed ({agents}); seconds per trial: min {min(times):.1f}, max {max(times):.1f}, "
          f"mean {sum(times) / len(times):.1f} (uninterrupted reference {ref_dt:.1f})")
    shutil.rmtree(work, ignore_errors=True)
    return 0 if passed == args.n else 1


if __name__ == "__main__":
    sys.exit(main())
