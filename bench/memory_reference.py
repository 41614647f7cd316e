"""The memory model against GPU measurements: each program of tests/reference/gpu-measured.json (peak
torch.cuda.max_memory_allocated on one H100), its predicted peak beside the measured one, with the breakdown.

    python -m bench.memory_reference [--json FILE]

On a machine with a GPU, measure your own programs with `program.py --memory-report FILE` (runtime/memory.py)
and compare them with `scalec plan FILE --json`'s `memory.peak_bytes` the same way.
"""
from __future__ import annotations

import argparse
import json

from bench.common import ROOT


def rows(path=ROOT / "tests" / "reference" / "gpu-measured.json") -> list[dict]:
    from compiler.check import check_text
    from compiler.pipeline import compile_spec
    ref = json.loads(path.read_text())
    out = []
    for row in ref["rows"]:
        costs = compile_spec(check_text(row["spec"], f"{row['name']}.scale")).costs
        worst = max(costs.memory, key=lambda r: r.peak)
        out.append({"name": row["name"], "measured_bytes": row["peak_allocated_bytes"],
                    "predicted_bytes": int(worst.peak), "ratio": worst.peak / row["peak_allocated_bytes"],
                    "breakdown": worst.as_json()})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args()
    got = rows()
    print(f"{'program':<16} {'measured GB':>12} {'predicted GB':>13} {'ratio':>7}   breakdown (GB)")
    for r in got:
        b = r["breakdown"]
        parts = " + ".join(f"{k} {b[k] / 1e9:.2f}" for k in ("weights", "gradients", "optimizer", "activations",
                                                             "working") if b[k])
        print(f"{r['name']:<16} {r['measured_bytes'] / 1e9:>12.3f} {r['predicted_bytes'] / 1e9:>13.3f} "
              f"{r['ratio']:>7.4f}   {parts} ({b['moment']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(got, f, indent=1)


if __name__ == "__main__":
    main()
