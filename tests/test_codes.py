"""Every diagnostic code is registered once in compiler/codes.py, and the register holds no dead entries."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from compiler.codes import CODES, RETIRED, explain

ROOT = Path(__file__).parent.parent
CODE = re.compile(r"[\"']([EW]0\d\d\d)[\"']")


def _emitted() -> dict[str, list[str]]:
    """Code -> the compiler files that emit it (a code written as a string literal, outside compiler/codes.py)."""
    out: dict[str, list[str]] = {}
    for path in sorted((ROOT / "compiler").rglob("*.py")):
        if path.name == "codes.py":
            continue
        for code in set(CODE.findall(path.read_text(encoding="utf-8"))):
            out.setdefault(code, []).append(str(path.relative_to(ROOT)))
    return out


def test_every_emitted_code_is_registered():
    emitted = _emitted()
    assert len(emitted) > 30  # the scan finds the codes (a broken pattern would find none and pass)
    missing = {c: files for c, files in emitted.items() if c not in CODES}
    assert not missing, f"codes emitted but not in compiler/codes.py: {missing}"


def test_every_registered_code_is_emitted_or_retired():
    emitted = _emitted()
    dead = sorted(c for c in CODES if c not in emitted)
    assert not dead, f"registered but never emitted (emit them, or move them to RETIRED with the reason): {dead}"
    assert not set(CODES) & set(RETIRED), "a retired code is never registered again"


def test_every_entry_has_a_title_and_a_paragraph():
    for code, entry in CODES.items():
        assert re.fullmatch(r"[EW]0\d\d\d", code)
        assert entry.title and not entry.title.endswith(".")
        assert len(entry.explanation) > 60 and entry.explanation.endswith("."), code


def _scalec(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "compiler.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_explain_prints_the_entry():
    r = _scalec("explain", "e0302")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("E0302: global batch does not divide\n\n")
    assert "micro_batches" in r.stdout
    assert explain("E0606").startswith("E0606: retired")


def test_explain_of_an_unknown_code_is_one_line_and_exit_2():
    r = _scalec("explain", "E0999")
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr == "error: unknown diagnostic code `E0999` (codes look like E0401)\n"


def test_no_code_is_registered_twice():
    """A dict literal keeps the last of two equal keys without a word: two meanings given one code lose the first
    (W0140 once stood for both a short timeout and asynchronous checkpoints with nothing to overlap)."""
    import ast
    tree = ast.parse((ROOT / "compiler" / "codes.py").read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    twice = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key in node.keys:
                if isinstance(key, ast.Constant) and isinstance(key.value, str) and CODE.fullmatch(repr(key.value)):
                    if key.value in seen:
                        twice.append(f"{key.value} (lines {seen[key.value]} and {key.lineno})")
                    seen[key.value] = key.lineno
    assert len(seen) > 30, "the scan finds the register's keys"
    assert not twice, f"codes registered twice in compiler/codes.py: {twice}"
