"""Time `check`, `plan` and `compile` for each sample (in process, torch already imported), median of N runs.

    python bench/compile_time.py [--repeat N]

Planning builds the model on the meta device: the script also asserts that no parameter was allocated.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compiler import codegen  # noqa: E402
from compiler.check import check_text  # noqa: E402
from compiler.report.plan import plan_text  # noqa: E402
from compiler.pipeline import compile_spec  # noqa: E402


def _median(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    rows = []
    for sample in sorted((ROOT / "samples").glob("*.scale")):
        text = sample.read_text()
        rel = sample.relative_to(ROOT).as_posix()
        check = _median(lambda: check_text(text, rel), args.repeat)
        compiled = compile_spec(check_text(text, rel))
        assert all(t.device.type == "meta" for t in compiled.traced.model.parameters()), "weights were allocated"
        plan = _median(lambda: plan_text(compile_spec(check_text(text, rel))), args.repeat)
        with tempfile.TemporaryDirectory() as out:
            def emit():
                c = compile_spec(check_text(text, rel))
                codegen.emit(c, out)
            comp = _median(emit, args.repeat)
        rows.append((sample.stem, compiled.costs.params_n, check, plan, comp))
    print(f"median of {args.repeat} runs, seconds, in one process (torch import excluded)\n")
    print(f"| {'sample':<10} | {'parameters':>17} | {'check':>7} | {'plan':>7} | {'compile':>7} |")
    print(f"|{'-' * 12}|{'-' * 19}|{'-' * 9}|{'-' * 9}|{'-' * 9}|")
    for name, n, c, pl, co in rows:
        print(f"| {name:<10} | {n:>17,} | {c:>7.3f} | {pl:>7.3f} | {co:>7.3f} |")


if __name__ == "__main__":
    main()
