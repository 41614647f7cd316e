"""Run the end-to-end cases kept out of the CI suite (tests/e2e/cases.py MORE: combinations the suite's table already
proves pairwise), each against the single-device model as tests/e2e/test_e2e.py does. They are the table's part of
the slow tier (marker `slow`, docs/testing.md): this is `pytest --slow -m slow tests/e2e/test_e2e.py`.

    python -m bench.e2e_more [-k EXPR] [PYTEST ARGS]
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    return subprocess.call([sys.executable, "-m", "pytest", "-q", "--slow", "-m", "slow", "tests/e2e/test_e2e.py", *argv],
                           cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
