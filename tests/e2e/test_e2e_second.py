"""The second half of the e2e table (tests/e2e/cases.py `halves`), checked as tests/e2e/test_e2e.py checks the
first: a file of its own so that `--dist loadfile` runs the two halves on the two pytest workers side by side."""
from __future__ import annotations

import pytest

from tests.e2e.cases import SECOND, Case
from tests.e2e.test_e2e import check_case, reference_runs

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """This half's single-device runs, one per distinct reference text."""
    return reference_runs(tmp_path_factory)


@pytest.mark.parametrize("case", SECOND, ids=[c.id for c in SECOND])
def test_plan_matches_single_device(case: Case, references, tmp_path):
    check_case(case, references, tmp_path)
