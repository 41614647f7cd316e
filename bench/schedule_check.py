"""Time the static schedule check (compiler/schedule.py: verify) at the largest supported size, p = 128 ranks and
m = 512 micro-batches, for each schedule: median of N runs, plus the action-list generation time.

    python bench/schedule_check.py [--repeat N] [-p 128] [-m 512]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compiler import schedule as S  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-m", type=int, default=512)
    args = ap.parse_args()
    print(f"p = {args.p}, m = {args.m}; median of {args.repeat} runs, seconds\n")
    print(f"| {'schedule':<18} | {'v':>2} | {'actions':>9} | {'generate':>8} | {'verify':>7} |")
    print(f"|{'-' * 20}|{'-' * 4}|{'-' * 11}|{'-' * 10}|{'-' * 9}|")
    for name, v in (("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("zero-bubble", 1)):
        gen, ver = [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            order = S.actions(name, args.p, args.m, v)
            t1 = time.perf_counter()
            S.verify(order, S.Layout(args.p, v, args.m))
            t2 = time.perf_counter()
            gen.append(t1 - t0)
            ver.append(t2 - t1)
        n = sum(len(a) for a in order.values())
        print(f"| {name:<18} | {v:>2} | {n:>9,} | {statistics.median(gen):>8.3f} | {statistics.median(ver):>7.3f} |")


if __name__ == "__main__":
    main()
