"""The mistake table: plausible user mistakes, each refused with a located diagnostic or named by a warning.

Every tests/mistakes/<case>.scale is one mistake a user could make, written as a whole file, with its expectations
inline (as the golden diagnostics mark theirs):

    # mistake: what the user did wrong, in one line          (required, the first line)
    # command: plan {file} --json                            (optional: the scalec arguments; default `check {file}`;
                                                              {dir} is the case's directory, for its files/)
    # exit: 2                                                (optional: the exit status; default 1 when an error is
                                                              expected, else 0)
    # stderr: some text                                      (optional, repeatable: a substring the output must hold)
    # unlocated: E0501                                       (optional, repeatable: a diagnostic with no span)
    ...
      sequence_parallel = true  # warning: W0123             (the diagnostic's span starts on this line)
      tp = 3  # error: E0203@8                               (@col: and at this column, 1-based)

The runner runs `scalec` in-process on the case and reads what it printed: every `error[CODE]` / `warning[CODE]`
with its `--> file:line:col`. The diagnostics printed must be exactly the ones marked (no silent acceptance, no
extra error), the exit status as expected, and no traceback or internal compiler error. Auxiliary files a case
needs (a token file, a checkpoint's header) live in tests/mistakes/files/, referred to relative to the case.

Mistakes that only a running program can see (a checkpoint of another model, a corrupted shard) are not here:
their tests run the program (tests/e2e/test_checkpoint.py, tests/test_checkpoint_guard.py); a resume that changes
the run, a checkpoint_dir found from the .scale file, Ctrl-C, `--metrics DIR` and a resumed `init = from(...)`:
tests/test_resume_contract.py and tests/e2e/test_resume_contract.py.
"""
from __future__ import annotations

import io
import re
import shlex
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from compiler.cli import main

ROOT = Path(__file__).parent / "mistakes"
CASES = sorted(ROOT.glob("*.scale"))
MARK = re.compile(r"#\s*(error|warning):\s*([EW][0-9]{4}(?:@[0-9]+)?(?:\s*,\s*[EW][0-9]{4}(?:@[0-9]+)?)*)")
HEADER = re.compile(r"^#\s*(mistake|command|exit|stderr|unlocated):\s*(.*?)\s*$")
PRINTED = re.compile(r"^(error|warning)\[([EW][0-9]{4})\]: .*\n(?:\s*--> (.+):(\d+):(\d+))?", re.MULTILINE)
MINIMUM = 30  # the floor: at least 30 plausible mistakes in the table


def _expectations(text: str) -> dict:
    header: dict = {"mistake": "", "command": "check {file}", "exit": None, "stderr": [], "unlocated": []}
    marks = []
    for i, line in enumerate(text.splitlines(), 1):
        h = HEADER.match(line)
        if h:
            key, value = h.groups()
            if key in ("stderr", "unlocated"):
                header[key].append(value)
            else:
                header[key] = value
            continue
        for m in MARK.finditer(line):
            for item in m.group(2).split(","):
                code, _, col = item.strip().partition("@")
                marks.append((m.group(1), code, i, int(col) if col else None))
    return {**header, "marks": marks}


def _run(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exc:  # argparse's own usage errors
            status = exc.code if isinstance(exc.code, int) else 1
    return status, out.getvalue() + err.getvalue()


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_mistake(case: Path):
    text = case.read_text(encoding="utf-8")
    want = _expectations(text)
    assert want["mistake"], f"{case.name}: the first line must say the mistake (`# mistake: ...`)"
    assert want["marks"] or want["unlocated"] or want["stderr"], f"{case.name}: nothing expected"
    argv = [a.replace("{file}", str(case)).replace("{dir}", str(case.parent)) for a in shlex.split(want["command"])]
    status, printed = _run(argv)
    assert "Traceback" not in printed and "internal compiler error" not in printed, printed
    found_located, found_unlocated = [], []
    for m in PRINTED.finditer(printed):
        severity, code, file, line, col = m.groups()
        if file is None:
            found_unlocated.append(code)
        else:
            assert Path(file).name == case.name, f"a diagnostic points into another file: {file}\n{printed}"
            found_located.append((severity, code, int(line), int(col)))
    expected = sorted((s, c, ln) for s, c, ln, _ in want["marks"])
    got = sorted((s, c, ln) for s, c, ln, _ in found_located)
    assert got == expected, f"{case.name}: diagnostics printed differ from the marks\n{printed}"
    for severity, code, line, col in want["marks"]:
        if col is not None:
            assert (severity, code, line, col) in found_located, f"{code} not at {line}:{col}\n{printed}"
    assert sorted(found_unlocated) == sorted(want["unlocated"]), printed
    for piece in want["stderr"]:
        assert piece in printed, f"{case.name}: expected {piece!r} in the output\n{printed}"
    errors = any(s == "error" for s, *_ in want["marks"]) or any(c.startswith("E") for c in want["unlocated"])
    expected_status = int(want["exit"]) if want["exit"] is not None else (1 if errors else 0)
    assert status == expected_status, f"{case.name}: exit {status}, expected {expected_status}\n{printed}"


def test_the_table_is_large_enough():
    assert len(CASES) >= MINIMUM, f"the mistake table holds {len(CASES)} cases; the floor is {MINIMUM}"


def test_every_case_says_what_the_mistake_is():
    missing = [c.name for c in CASES if not c.read_text(encoding="utf-8").startswith("# mistake:")]
    assert not missing, f"cases without a `# mistake:` first line: {missing}"
