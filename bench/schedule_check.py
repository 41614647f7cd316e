"""Time the static schedule check (compiler/schedule.py: verify) at p = 128 ranks and m = 512 micro-batches for
each schedule, and at the published configurations of Korthikanti et al. 2022 / Narayanan et al. 2021 (530B:
p 35 × v 3, 280 micro-batches; 1T: p 64, 512 micro-batches, plain and with 2 chunks per rank): median of N runs,
plus the action-list generation time and `verify`'s work counter (linear in the actions).

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
    print(f"| {'configuration':<14} | {'schedule':<18} | {'p':>3} | {'v':>2} | {'m':>4} | {'actions':>9} | "
          f"{'work':>9} | {'generate':>8} | {'verify':>7} |")
    print(f"|{'-' * 16}|{'-' * 20}|{'-' * 5}|{'-' * 4}|{'-' * 6}|{'-' * 11}|{'-' * 11}|{'-' * 10}|{'-' * 9}|")
    rows = [("", name, args.p, v, args.m) for name, v in (("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2),
                                                          ("zero-bubble", 1))]
    rows += [("530B, 2520 GPU", "interleaved-1f1b", 35, 3, 280), ("1T, 3072 GPU", "1f1b", 64, 1, 512),
             ("1T, 3072 GPU", "interleaved-1f1b", 64, 2, 512)]
    for label, name, p, v, m in rows:
        gen, ver = [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            order = S.actions(name, p, m, v)
            t1 = time.perf_counter()
            tl = S.verify(order, S.Layout(p, v, m))
            t2 = time.perf_counter()
            gen.append(t1 - t0)
            ver.append(t2 - t1)
        n = sum(len(a) for a in order.values())
        print(f"| {label:<14} | {name:<18} | {p:>3} | {v:>2} | {m:>4} | {n:>9,} | {tl.work:>9,} | "
              f"{statistics.median(gen):>8.3f} | {statistics.median(ver):>7.3f} |")


if __name__ == "__main__":
    main()
