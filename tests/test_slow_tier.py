"""The slow tier (marker `slow`, tests/conftest.py): out of the suite CI runs, which stays within its time budget, and
one command away (`pytest --slow -m slow`): nothing in it is skipped or lost, only deselected by default."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from _pytest.mark.structures import ParameterSet

ROOT = Path(__file__).resolve().parents[1]


def _collected(*args: str) -> tuple[list[str], str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return [line for line in out.stdout.splitlines() if "::" in line], out.stdout.splitlines()[-1]


def test_slow_tests_are_deselected_by_default_and_run_with_slow():
    path = "tests/test_pipeline_in_flight.py"
    default, summary = _collected(path)
    everything, _ = _collected(path, "--slow")
    slow = sorted(set(everything) - set(default))
    assert set(default) < set(everything) and "2 deselected" in summary
    assert len(slow) == 2 and all("compiled" in t for t in slow), slow


def test_the_cases_out_of_the_table_are_the_slow_tier_of_test_e2e():
    """tests/e2e/cases.py MORE: each case in test_e2e.py's parameters, marked slow (`python -m bench.e2e_more`)."""
    from tests.e2e.cases import FIRST, MORE
    from tests.e2e.test_e2e import RUN
    marked = [p.values[0] for p in RUN if isinstance(p, ParameterSet) and any(m.name == "slow" for m in p.marks)]
    assert [c.id for c in marked] == [c.id for c in MORE] and MORE
    assert [c for c in RUN if not isinstance(c, ParameterSet)] == list(FIRST)
