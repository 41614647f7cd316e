"""Run the end-to-end cases kept out of the CI suite (tests/e2e/cases.py MORE: combinations the suite's table already
proves pairwise), each against the single-device model as tests/e2e/test_e2e.py does.

    python -m bench.e2e_more [-k EXPR]
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.e2e.cases import MORE

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    ids = " or ".join(c.id for c in MORE)
    extra = argv if argv else ["-k", ids]
    env = {**os.environ, "SCALEC_E2E_MORE": "1"}
    return subprocess.call([sys.executable, "-m", "pytest", "-q", "tests/e2e/test_e2e.py", *extra], cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
