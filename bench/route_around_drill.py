"""Route-around drill: a node made slow in an 8-rank run (4 simulated nodes of 2 processes) with
`resilience { on_straggler = replan }` is left out, `scalec run` re-plans on the 6 ranks left and the run resumes from
its last checkpoint on the new plan; its losses must equal a reference started on the new plan from the same
checkpoint.

    python3 -m bench.route_around_drill [-n 10] [--rank 5] [--onset 21] [--fraction 1.0] [--steps 50]
    python3 -m bench.route_around_drill --remembered [-n 10]
    python3 -m bench.route_around_drill --restart [-n 10]
    python3 -m bench.route_around_drill --dead [-n 10]
    python3 -m bench.route_around_drill --crashing [-n 10] [--onset 8]

Each trial, in a fresh directory:
1. `scalec run drill.scale --local-nodes` (four torchrun agents on loopback, launch.sh's LOCAL_NODES) with rank 5 (on
   node 2) doing `--fraction` more work from step `--onset` in the 8-rank world only (SCALEC_TEST_SLOW=...@8: on the
   nodes left nobody is slowed again). The detector names it in two windows in a row (an action waits for the
   second), the ranks stop after the next step, save, and end with
   REPLAN_CODE after rank 0 wrote `ckpt/replan.json`; `scalec run` re-plans (`drill.nodes3.scale`), compiles and
   launches it; the run resumes from that checkpoint and finishes.
2. The checkpoint the re-planned run resumed from is copied alone into a new directory, and `scalec run
   drill.nodes3.scale --local-nodes` trains from it to the same last step: the reference.
3. Pass: the re-plan happened on 3 of 4 nodes leaving out node 2, the re-planned run started from the step it was
   asked at, and every loss from there to the end is equal to the reference's (bitwise; `--tolerance` relative
   otherwise, 1e-6 is the issue's bound where the reduction order is unchanged).
   The trial's line also gives the what-if against the cost the drill injected (the hook's own count of its extra
   work over the what-if's steps), and the summary how many were within 10%.

`--remembered`: a node that keeps failing. Nobody is slowed; instead the checkpoint directory starts with a node
record (runtime/node_record.py) in which node 2 was slow in two earlier attempts: rank 0 leaves it out after the
first step, and the rest is as above.

`--dead`: a node that dies. Nobody is slowed; at step `--onset` node 2's two workers SIGKILL their torchrun agent and
themselves (SCALEC_TEST_NODE_DIES=node2:STEP, first attempt only). The other ranks' collectives fail and their agents
restart them; launch.sh lets the rendezvous form with 3 of the 4 nodes (`--nnodes 3:4` under `replan`), the program
finds node 2 missing against the node record's last members (runtime.leaving.shrunk), rank 0 writes the request, and
the rest is as above: the re-plan on 3 nodes resumes from the last checkpoint before the death.

`--crashing`: a node that crash-loops. Nobody is slowed; node 2's first worker SIGKILLs itself at step `--onset` in
each of the first two attempts (SCALEC_TEST_NODE_CRASHES=node2:STEP:2; its agent lives and torchrun restarts the
job from the last checkpoint). Its agent passes the crash to the next attempt, whose rank 0 marks node 2 `crashed`
in the node record; once it has crashed in two attempts in a row, the third attempt's rank 0 leaves it out after
its first step, and the rest is as above.

`--restart`: `on_straggler = restart(exclude = node)` with a spare agent waiting (launch.sh's SPARE_NODES=1): the
slow node is left out, the spare takes its place, the run resumes on the same plan, and its losses must equal the
same plan's from that checkpoint.

Prints one line per trial and, last, `route-around N/N passed` (exit 1 if any failed). Compute sections are
timed, as the runtime does on CPU, by the training thread's CPU time (runtime/sections.py): 8 processes on 2 cores make
wall-clock sections the scheduler's noise.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import free_port, run_session  # noqa: E402
from bench.straggler_drill import WHAT_IF, injected  # noqa: E402

MODEL = """model drill {
  vocab = 128  hidden = 64  heads = 4  layers = 2  seq = 32
  embedding(vocab, hidden)  positional(seq, hidden)
  repeat layers {
    residual { layernorm(hidden)  attention(hidden, heads) }
    residual { layernorm(hidden)  mlp(hidden, 4 * hidden, act = gelu) }
  }
  layernorm(hidden)  lm_head(vocab, hidden, tied = true)  cross_entropy
}
mesh { axis dp = 8  nodes = 4  devices_per_node = 2  device = cpu }
resilience {
  stragglers = detect(threshold = 0.8, window = 10)
  on_straggler = replan
}
train {
  global_batch = 48  seq_len = seq  steps = STEPS  seed = SEED
  optimizer = adamw(lr = 3e-3)  data = synthetic  log_every = 1000
  checkpoint_dir = "ckpt"  checkpoint_every = 5
}
"""

REPLANNED = re.compile(r"scalec: re-planned on (\d+) of (\d+) nodes \((.*)\): (.*) → (.*); predicted step")


def scalec_run(work: Path, scale: str, out: str, extra_env: dict, program_args: list, timeout: int):
    """`scalec run SCALE --local-nodes -o OUT -- PROGRAM_ARGS` in `work`: (status, output)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), MASTER_PORT=str(free_port()),
               OMP_NUM_THREADS="1", **extra_env)
    cmd = [sys.executable, "-m", "compiler.cli", "run", scale, "--local-nodes", "-o", out, "--", *program_args]
    return run_session(cmd, env, timeout, cwd=work)


def losses(path: Path) -> dict:
    """step -> loss of a metrics file (the last record of a step wins: a resumed run rewrites from its checkpoint)."""
    out = {}
    if path.exists():
        for line in path.read_text().splitlines():
            r = json.loads(line)
            out[r["step"]] = r["loss"]
    return out


LEFT_OUT = re.compile(r"scalec: leaving out node (\d+) \((\S+)\) after step (\d+) \((.*)\); the checkpoint is "
                      r"saved and the job restarts without it")


def trial(args, i: int, keep: bool) -> tuple[bool, str]:
    work = Path(tempfile.mkdtemp(prefix=f"route_around{i}_"))
    try:
        text = MODEL.replace("STEPS", str(args.steps)).replace("SEED", str(1000 + i))
        if args.restart:
            text = text.replace("on_straggler = replan", "on_straggler = restart(exclude = node)")
        (work / "drill.scale").write_text(text)
        slow = {"SCALEC_TEST_SLOW": f"{args.rank}:{args.onset}:{args.fraction}@8"}
        if args.restart:  # a spare agent waits; the slow node is node2 by name (the spare that replaces it is not)
            # five agents race for four places: which waits as the spare, and which node holds rank 5, differs from
            # run to run; rank 5 is slowed until a node has been left out (@fresh), wherever it runs
            slow = {"SCALEC_TEST_SLOW": f"{args.rank}:{args.onset}:{args.fraction}@fresh", "SPARE_NODES": "1"}
        if args.remembered:  # no slow rank: node 2's history says it keeps failing
            from runtime import node_record
            slow = {}
            record = node_record.NodeRecord(str(work / "ckpt" / node_record.FILE))
            (work / "ckpt").mkdir()
            for attempt in (0, 1):
                record.mark("node2", "slow", {"rank": args.rank, "section": "backward", "score": 0.5, "step": 20},
                            attempt, group_rank=2, host="earlier")
        if args.dead:  # no slow rank: node 2 dies at the onset step
            slow = {"SCALEC_TEST_NODE_DIES": f"node{args.rank // 2}:{args.onset}"}
        if getattr(args, "crashing", False):  # no slow rank: node 2's first worker crashes at the onset step, twice
            slow = {"SCALEC_TEST_NODE_CRASHES": f"node{args.rank // 2}:{args.onset}:2"}
        t = time.perf_counter()
        rc, out = scalec_run(work, "drill.scale", "build", slow, ["--metrics", str(work / "run.jsonl")],
                             args.timeout)
        (work / "run.log").write_text(out)
        if args.restart:
            m = LEFT_OUT.search(out)
            if rc != 0 or m is None:
                return False, f"no node left out (status {rc}): " + " | ".join(out.strip().splitlines()[-6:])
            at, what, ref_scale = int(m[3]), f"{m[4][:60]}...; the spare took its place", "drill.scale"
            if f"rank {args.rank} on it" not in m[4]:
                return False, f"left out node {m[1]} ({m[2]}): {m[4]}"
        else:
            m = REPLANNED.search(out)
            requests = sorted((work / "ckpt").glob("replan.step*.json"))
            if rc != 0 or m is None or not requests:
                return False, f"no re-plan (status {rc}): " + " | ".join(out.strip().splitlines()[-6:])
            request = json.loads(requests[0].read_text())
            at, what, ref_scale = request["step"], f"{m[3][:60]}...; {m[4]} → {m[5]}", "drill.nodes3.scale"
            last = (args.onset - 1) // 5 * 5  # the checkpoint before the death (checkpoint_every = 5)
            crashed = getattr(args, "crashing", False)
            if crashed and out.count("'s workers crashed in the last attempt") != 2:
                return False, "node 2's two crashes were not both recorded"
            if (int(m[1]), int(m[2])) != (3, 4) or request["exclude"] != [args.rank // 2] or (
                    args.remembered and at != 1) or (args.dead and at != last) or (crashed and at != last + 1):
                return False, f"re-planned on {m[1]} of {m[2]} nodes leaving out {request['exclude']}"
        ok, line = against_reference(args, work, at, ref_scale)
        where = f"node {m[1]} ({m[2]})" if args.restart else "node 2"
        return ok, (f"{where} left out after step {at} ({what}); {line}{what_if_line(args, out)}; "
                    f"{time.perf_counter() - t:.0f} s")
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


WHAT_IF_ERRORS: list = []  # each slowed trial's what-if against the injected cost (relative error)


def what_if_line(args, out: str) -> str:
    """The last what-if before the node was left out (its episode: the windows that named rank 5 in a row)
    against the cost the drill injected (bench.straggler_drill's reading of the hook's line); "" where no rank was
    slowed (or the line is missing), and the error kept for the summary."""
    lines = list(WHAT_IF.finditer(out))
    cost = injected(out, int(lines[-1][1]), int(lines[-1][2]), args.fraction) if lines else None
    if not cost:
        return ""
    lost = float(lines[-1][4].replace(",", ""))
    WHAT_IF_ERRORS.append((lost - cost) / cost)
    return (f"; what-if (steps {lines[-1][1]}-{lines[-1][2]}) {lost:.1f} ms/step lost against {cost:.1f} "
            f"injected ({WHAT_IF_ERRORS[-1]:+.0%})")


def against_reference(args, work: Path, at: int, scale: str) -> tuple[bool, str]:
    """`scale` (the plan the run went on with) trained from the checkpoint of step `at` alone, to the same last step;
    the run's losses after `at` against it."""
    src = work / "ckpt" / f"step_{at:08d}"
    if not src.is_dir():
        return False, f"no checkpoint {src.name} to resume from"
    shutil.copytree(src, work / "ref_ckpt" / src.name)
    rc, out = scalec_run(work, scale, "build_ref", {},
                         ["--checkpoint-dir", str(work / "ref_ckpt"), "--metrics", str(work / "ref.jsonl")],
                         args.timeout)
    if rc != 0:
        return False, f"reference failed (status {rc}): " + " | ".join(out.strip().splitlines()[-4:])
    got, ref = losses(work / "run.jsonl"), losses(work / "ref.jsonl")
    steps = [s for s in sorted(ref) if s > at]
    if not steps or steps[-1] != args.steps or any(s not in got for s in steps):
        return False, f"steps after {at}: run {sorted(s for s in got if s > at)}, reference {steps}"
    worst = max(abs(got[s] - ref[s]) / max(abs(ref[s]), 1e-30) for s in steps)
    return worst <= args.tolerance, (f"steps {steps[0]}-{steps[-1]} "
                                     f"{'bitwise equal' if worst == 0 else f'max relative difference {worst:.2e}'} "
                                     "to the reference")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=10, help="trials (default 10)")
    p.add_argument("--rank", type=int, default=5, help="the slowed rank (default 5, on node 2)")
    p.add_argument("--onset", type=int, default=21, help="the step its slowdown starts (default 21)")
    p.add_argument("--fraction", type=float, default=1.0, help="how much more work it does (default 1.0)")
    p.add_argument("--steps", type=int, default=50, help="the run's steps (default 50)")
    p.add_argument("--tolerance", type=float, default=1e-6, help="largest relative loss difference (default 1e-6)")
    p.add_argument("--timeout", type=int, default=600, help="seconds one `scalec run` may take")
    p.add_argument("--keep", action="store_true", help="keep each trial's directory")
    p.add_argument("--restart", action="store_true",
                   help="on_straggler = restart(exclude = node) with a spare agent: the spare takes node 2's place")
    p.add_argument("--dead", action="store_true",
                   help="no slow rank: node 2 dies at --onset (its agent and workers killed); re-planned on 3 nodes")
    p.add_argument("--crashing", action="store_true",
                   help="no slow rank: node 2's worker crashes at --onset in two attempts; left out in the third")
    p.add_argument("--remembered", action="store_true",
                   help="no slow rank: node 2 was slow in two earlier attempts (the node record), left out at once")
    args = p.parse_args(argv)
    passed = 0
    for i in range(args.n):
        ok, line = trial(args, i, args.keep)
        passed += ok
        print(f"trial {i + 1}: {'pass' if ok else 'FAIL'}: {line}", flush=True)
    if WHAT_IF_ERRORS:
        e = WHAT_IF_ERRORS
        print(f"what-if against the injected cost: within 10% in {sum(abs(x) <= 0.10 for x in e)}/{len(e)} trials, "
              f"mean error {sum(e) / len(e):+.1%}, largest {max(e, key=abs):+.1%}")
    print(f"route-around {passed}/{args.n} passed")
    return 0 if passed == args.n else 1


if __name__ == "__main__":
    sys.exit(main())
