"""Shared test options: `--update-golden` rewrites golden files (refused when CI=true)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite golden files that differ (never in CI)")


def pytest_configure(config):
    if config.getoption("--update-golden") and os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        raise pytest.UsageError("--update-golden is refused when CI=true: goldens change only by a deliberate, "
                                "reviewed local run")


@pytest.fixture
def golden(request):
    from tests.golden import Golden
    g = Golden(update=request.config.getoption("--update-golden"), nodeid=request.node.nodeid)
    yield g
    g.report()
