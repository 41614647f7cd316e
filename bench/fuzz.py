"""Fuzz `scalec check`, `plan` and `compile` with mutants of the samples, in one process (tests/fuzz.py).

    python3 bench/fuzz.py --inputs 10000 [--seed 1] [--bound 10] [--save DIR]

Inputs are spread evenly over samples/*.scale; each goes through check, then plan and compile when it checks. Prints
how the inputs ended (ok, located diagnostic, crash = any other exception, stall = interrupted by the watchdog),
every crash and input over the bound with its id and mutations, the slowest inputs, and the total time. With
--save, each failing input is written to DIR/<id>.scale to replay it with `scalec check|plan|compile`. Exit status 1
if any input crashed, stalled or took longer than the bound.
"""
from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import fuzz  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", type=int, default=1000, help="total number of inputs (default 1000)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--bound", type=float, default=10.0, help="seconds an input may take (default 10)")
    p.add_argument("--hard-limit", type=float, default=60.0, help="seconds after which an input is interrupted")
    p.add_argument("--save", metavar="DIR", help="write each failing input to DIR/<id>.scale")
    p.add_argument("--sample", action="append", help="only these samples (file names), repeatable")
    args = p.parse_args()
    samples = [s for s in fuzz.SAMPLES if not args.sample or s.name in args.sample]
    per = -(-args.inputs // len(samples))
    counts: collections.Counter = collections.Counter()
    phases: collections.Counter = collections.Counter()
    failures, times = [], []
    t0 = time.perf_counter()
    done = 0
    for sample in samples:
        n = min(per, args.inputs - done)
        for ident, what, text in fuzz.mutants(sample, args.seed, n):
            out = fuzz.run(text, "fuzz.scale", hard_limit=args.hard_limit)
            counts[out.kind] += 1
            phases[(out.kind, out.phase)] += 1
            times.append((out.seconds, ident, what, out.kind))
            slow = out.seconds > args.bound
            if out.kind in ("crash", "stall") or slow:
                failures.append((ident, what, out, text))
                print(f"{out.kind.upper()}{' (slow)' if slow else ''} {ident} [{what}] {out.seconds:.2f} s\n"
                      f"{out.detail.rstrip()[-1500:]}\n", flush=True)
                if args.save:
                    Path(args.save).mkdir(parents=True, exist_ok=True)
                    Path(args.save, ident.replace(":", "_") + ".scale").write_text(text, encoding="utf-8")
        done += n
        print(f"{sample.name}: {n} inputs, {time.perf_counter() - t0:.0f} s so far", flush=True)
    total = time.perf_counter() - t0
    times.sort(reverse=True)
    over = sum(1 for s, *_ in times if s > args.bound)
    print(f"\n{done} inputs in {total:.1f} s ({total / max(done, 1) * 1000:.0f} ms each on average)")
    print("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    print("by phase reached: " + ", ".join(f"{k}/{ph} {v}" for (k, ph), v in sorted(phases.items())))
    print(f"tracebacks (crashes): {counts['crash']}; stalls: {counts['stall']}; over {args.bound:g} s: {over}")
    print("slowest:")
    for s, ident, what, kind in times[:5]:
        print(f"  {s:7.2f} s  {kind:<10} {ident} [{what}]")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
