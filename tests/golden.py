"""Golden files: compare a produced text with tests/golden/..., or rewrite it under --update-golden."""
from __future__ import annotations

import difflib
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"


class Golden:
    def __init__(self, update: bool, nodeid: str):
        self.update = update
        self.nodeid = nodeid
        self.updated: list[str] = []

    def check(self, relpath: str, actual: str) -> None:
        path = GOLDEN / relpath
        expected = path.read_text(encoding="utf-8") if path.exists() else None
        if expected == actual:
            return
        if self.update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(actual, encoding="utf-8")
            self.updated.append(relpath)
            return
        if expected is None:
            pytest.fail(f"golden file tests/golden/{relpath} does not exist; create it with\n"
                        f"  python -m pytest '{self.nodeid}' --update-golden", pytrace=False)
        diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True),
                                            f"tests/golden/{relpath} (expected)", "actual", n=2))
        pytest.fail(f"output differs from tests/golden/{relpath}:\n{diff}\nIf the change is intended, update this "
                    f"case with\n  python -m pytest '{self.nodeid}' --update-golden", pytrace=False)

    def report(self) -> None:
        for p in self.updated:
            print(f"updated tests/golden/{p}")
