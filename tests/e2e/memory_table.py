"""Measure e2e cases' memory under torchrun and print every rank's figures beside the compiler's prediction.

    PYTHONPATH=$PWD python3 -m tests.e2e.memory_table pp2_1f1b tp2_gqa_swiglu_untied [--steps 2] [--json FILE]

Each case (tests/e2e/cases.py, by id) runs with `--memory-report` (runtime/memory.py: the last step, every rank);
`--json` also writes {case id: the report} for tools comparing them with `scalec plan`'s predictions.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from tests.e2e.cases import ALL_CASES
from tests.e2e.runner import case_text, launch


def measure(case_id: str, workdir: Path, steps: int = 2) -> dict:
    """The parsed --memory-report of case `case_id` run for `steps` steps."""
    case = next(c for c in ALL_CASES if c.id == case_id)
    run = launch(case_text(case), case.id, workdir, steps=steps, timeout=case.timeout, nproc=case.nproc,
                 dump_grads=False, memory_report=True)
    return run.memory


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", nargs="+", help="case ids")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--json", help="write {case id: report} here")
    args = p.parse_args()
    reports = {}
    with tempfile.TemporaryDirectory() as tmp:
        for cid in args.cases:
            m = reports[cid] = measure(cid, Path(tmp), args.steps)
            print(f"{cid}: predicted {m['predicted_peak_bytes']:,} B, measured {m['peak_bytes']:,} B "
                  f"(rank {m['peak_rank']})")
            for r in m["ranks"]:
                c, s = r["coords"], r["state_bytes"]
                print(f"  rank {r['rank']} dp{c['dp']} tp{c['tp']} pp{c['pp']} ep{c['ep']}: peak {r['peak_bytes']:,} "
                      f"activations {r['activation_bytes']:,} params {s['params']:,} grads {s['grads']:,} "
                      f"optimizer {s['optimizer']:,} other {r['other_existing_bytes']:,}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(reports, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
