"""Context parallelism on this machine: a long-sequence tiny model on cp = 2 (2 ranks × 1 thread, gloo, the generated
program's `launch.sh`) against the same model on one device, side by side in one run (issue 24).

    python bench/context_parallel.py                   # seq 4096, 3 rounds of 8 steps, all_gather
    python bench/context_parallel.py --variant ring
    python bench/context_parallel.py --quick           # one round of 4 steps (the smoke test's)

It prints the median step time of each and their ratio; the activations per rank the memory model predicts for each
(`scalec plan --json`'s `memory.ranks[].activations`: cp holds S/cp tokens of every sequence, so ≈ 1/2; attention's kept q, k,
v and output are among them) and their ratio; and the bytes the cp program moved over cp in its last step (the
runtime's `--count-bytes`) against the ledger's analytic bytes (plan.json `ledger`, axis cp), which must be equal.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import env, read_metrics  # noqa: E402

WHO = "bench/context_parallel.py"

TEXT = """
model long_tiny {{
  vocab  = 256
  hidden = {hidden}
  heads  = 4
  kv     = 2
  layers = 2
  seq    = {seq}
  ffn    = 4 * hidden

  embedding(vocab, hidden)
  repeat layers {{
    residual {{ rmsnorm(hidden)  attention(hidden, heads, kv_heads = kv, bias = false) }}
    residual {{ rmsnorm(hidden)  mlp(hidden, ffn, act = swiglu, bias = false) }}
  }}
  rmsnorm(hidden)
  lm_head(vocab, hidden, tied = false)
  cross_entropy
}}

mesh {{
  {axis}
  devices_per_node = {devices}
  device = cpu
}}

plan {{
  {variant}
  compile = false
}}

train {{
  global_batch = {batch}
  seq_len      = seq
  steps        = 100
  optimizer    = adamw(lr = 3e-3)
}}
"""


def _compile(text: str, out: Path) -> dict:
    from compiler import codegen
    from compiler.check import check_text
    from compiler.pipeline import compile_spec
    compiled = compile_spec(check_text(text, "long_tiny.scale"))
    codegen.emit(compiled, str(out))
    plan = json.loads((out / "plan.json").read_text())
    plan["activations_per_rank"] = max(r.as_json()["activations"] for r in compiled.costs.memory)
    return plan


def _run(build: Path, steps: int, metrics: Path, counted: Path) -> None:
    cmd = ["bash", str(build / "launch.sh"), "--steps", str(steps), "--metrics", str(metrics),
           "--count-bytes", str(counted)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode:
        print(proc.stdout)
        raise SystemExit(f"{WHO}: {' '.join(cmd)} failed (exit {proc.returncode})")


def measure(seq: int = 4096, hidden: int = 64, batch: int = 2, variant: str = "all_gather", steps: int = 8,
            skip: int = 2, rounds: int = 3, keep: str | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="scalec-cp-") as tmp:
        work = Path(keep).resolve() if keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        common = dict(hidden=hidden, seq=seq, batch=batch)
        builds = {"cp2": work / "build_cp2", "one": work / "build_one"}
        plans = {"cp2": _compile(TEXT.format(axis="axis cp = 2", devices=2, variant=f"context_parallel = {variant}",
                                             **common), builds["cp2"]),
                 "one": _compile(TEXT.format(axis="axis dp = 1", devices=1, variant="", **common), builds["one"])}
        times = {k: [] for k in builds}
        counts = {}
        for r in range(rounds):
            for k, build in builds.items():
                metrics, counted = work / f"{k}_{r}.jsonl", work / f"{k}_bytes_{r}.json"
                _run(build, steps, metrics, counted)
                times[k] += [m["step_time"] for m in read_metrics(metrics)[skip:]]
                counts[k] = json.loads(counted.read_text()) if counted.exists() else {}
        act = {k: p["activations_per_rank"] for k, p in plans.items()}
        measured = sum(n for key, n in counts["cp2"].items() if key.endswith("/cp"))
        # the gradients' all-reduce over cp is DDP's (bucketed; the runtime does not count it): left out of both
        ledger = sum(int(e["bytes_per_step"]) for e in plans["cp2"]["ledger"]
                     if e["axis"] == "cp" and e["op"] != "all_reduce")
        med = {k: statistics.median(v) for k, v in times.items()}
        return {"seq": seq, "hidden": hidden, "batch": batch, "variant": variant, "steps_timed": len(times["cp2"]),
                "median_step_s": med, "step_time_ratio": med["cp2"] / med["one"],
                "activations_per_rank": act, "activation_ratio": act["cp2"] / act["one"],
                "cp_bytes_measured": measured, "cp_bytes_ledger": ledger,
                "cp_bytes_by_op": {key: n for key, n in counts["cp2"].items() if key.endswith("/cp")}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--variant", default="all_gather", choices=["all_gather", "ring", "all_to_all"])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--skip", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="one round of 4 steps (2 warm-up)")
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--keep", metavar="DIR")
    a = p.parse_args(argv)
    if a.quick:
        a.steps, a.skip, a.rounds = 4, 2, 1
    res = measure(a.seq, a.hidden, a.batch, a.variant, a.steps, a.skip, a.rounds, a.keep)
    m, act = res["median_step_s"], res["activations_per_rank"]
    print(f"long_tiny: seq {a.seq}, hidden {a.hidden}, batch {a.batch}; cp 2 ({a.variant}, 2 ranks × 1 thread, gloo) "
          f"against one device; {res['steps_timed']} steps timed each")
    print(f"  median step      cp2 {m['cp2'] * 1e3:8.1f} ms   one {m['one'] * 1e3:8.1f} ms   ratio "
          f"{res['step_time_ratio']:.2f}")
    print(f"  activations/rank cp2 {act['cp2'] / 2**20:8.2f} MiB  one {act['one'] / 2**20:8.2f} MiB  ratio "
          f"{res['activation_ratio']:.3f} (memory model)")
    print(f"  cp bytes/step    measured {res['cp_bytes_measured']:,}   ledger {res['cp_bytes_ledger']:,}   "
          + ("equal" if res["cp_bytes_measured"] == res["cp_bytes_ledger"] else "DIFFER"))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0 if res["cp_bytes_measured"] == res["cp_bytes_ledger"] else 1


if __name__ == "__main__":
    sys.exit(main())
