"""Shared test options: `--update-golden` rewrites golden files (refused when CI=true); `--slow` runs the slow tier
too (tests marked `slow`: out of CI's time budget, each one a command away: docs/testing.md); and the guard that keeps
`pytest -m "not e2e"` fast: a test that launches processes (torchrun, a generated program, gloo ranks through
torch.multiprocessing), in its body or in a fixture of any scope, must carry the `e2e` marker, or it fails at the
launch."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite golden files that differ (never in CI)")
    parser.addoption("--slow", action="store_true", default=False,
                     help="run the slow tier too (tests marked slow, deselected otherwise: out of CI's time budget); "
                          "`--slow -m slow` runs the slow tier alone")


def pytest_configure(config):
    _guard_launches()
    if config.getoption("--update-golden") and os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        raise pytest.UsageError("--update-golden is refused when CI=true: goldens change only by a deliberate, "
                                "reviewed local run")


def pytest_collection_modifyitems(config, items):
    """The slow tier (marker `slow`) is deselected unless `--slow` is given: the suite CI runs stays within its
    budget, and what it leaves out is counted in the summary's "deselected" and runs with `--slow -m slow`."""
    if config.getoption("--slow"):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


@pytest.fixture
def golden(request):
    from tests.golden import Golden
    g = Golden(update=request.config.getoption("--update-golden"), nodeid=request.node.nodeid)
    yield g
    g.report()


# What makes a test slow here is starting processes that import torch and build a model: torchrun and the ranks
# it starts, a generated program run directly, gloo ranks spawned by tests/multirank.py. `scalec check`/`plan` in a
# subprocess (the front-door tests) starts one light interpreter and is not counted, nor is a launch script run
# under a stand-in torchrun or srun (tests/test_escaping.py, tests/test_sbatch.py): a script that does start
# torchrun is caught at torchrun only when the test starts it itself, so such tests are marked by hand.
LAUNCHES = ("torchrun", "torch.distributed.run", "program.py")


def _launch_named(args) -> str | None:
    """What `args` launches of LAUNCHES, or None: a syntax check (`bash -n`) and a program's `--help` start none."""
    words = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    words = [os.fsdecode(w) if isinstance(w, (bytes, os.PathLike)) else str(w) for w in words]
    text = " ".join(words)
    if "-n" in words[1:2] or "--help" in text:
        return None
    if "compiler.cli" in text and " run " in f" {text} ":
        return "scalec run"
    return next((w for w in LAUNCHES if w in text), None)


_current: list = []  # the test being run (its setup, call and teardown, fixtures of any scope included)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _current.append(item)
    try:
        yield
    finally:
        _current.pop()


def _refuse_unmarked(what: str) -> None:
    """Fails the running test if it is not marked e2e (see the module's docstring)."""
    item = _current[-1] if _current else None
    if item is not None and not item.get_closest_marker("e2e"):
        pytest.fail(f"{item.nodeid} launches processes ({what}) but is not marked e2e: add @pytest.mark.e2e, so "
                    "that `pytest -m \"not e2e\"` stays the fast part", pytrace=False)


def _guard_launches() -> None:
    """Wraps subprocess.Popen and torch.multiprocessing's spawn for the session: a launch checks the running test."""
    original = subprocess.Popen

    class Guarded(original):
        def __init__(self, args, *a, **kw):
            what = _launch_named(args)
            if what:
                _refuse_unmarked(what)
            super().__init__(args, *a, **kw)

    subprocess.Popen = Guarded
    import torch.multiprocessing as tmp
    for name in ("spawn", "start_processes"):
        real = getattr(tmp, name)

        def guarded(*a, _real=real, _name=name, **kw):
            _refuse_unmarked(f"torch.multiprocessing.{_name}")
            return _real(*a, **kw)
        setattr(tmp, name, guarded)
