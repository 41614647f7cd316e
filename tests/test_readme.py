"""The README holds exactly two set-up commands, and CI runs the second one verbatim."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _setup_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", section, re.S)]


def test_exactly_two_setup_commands():
    commands = _setup_commands()
    assert len(commands) == 2 and all("\n" not in c for c in commands)
    assert "scalec run samples/" in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    assert _setup_commands()[1] in (ROOT / ".ci" / "run").read_text().splitlines()
