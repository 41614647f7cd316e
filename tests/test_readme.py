"""The README and docs/ as a user reads them: the README holds exactly two set-up commands and CI runs the second one
verbatim; the README stays a short front door; and every page's examples work: each whole `.scale` file in a
```scale block checks, each cheap `scalec` command of a ```sh block exits 0, every link resolves and every page of
docs/ is on the README's map.

Blocks are fenced with an info string: `scale` (a whole file, checked), `scale fragment` (a piece of a file, not
checked on its own), `sh` (commands, run below when cheap), `python`, `text`, `json`."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
INFO = {"scale", "scale fragment", "sh", "python", "text", "json"}

# `scalec` subcommands of the sh blocks: run in-process when cheap (a sample checked, planned, compiled, a code
# explained), or left to the tests that run them, for the reason given.
RUN = {"check", "plan", "explain", "compile", "network"}
SKIP = {
    "run": "trains under torchrun: tests/e2e/ trains every sample's plan, tests/test_run_command.py the command",
    "search": "tens of seconds a cluster: tests/test_search*.py run the search",
    "data": "needs the tokenizer and writes a dataset: tests/e2e/test_from_text.py runs the commands of running.md",
    "export": "needs a trained checkpoint: tests/e2e/test_from_text.py and tests/test_export.py",
    "import": "needs a config.json: tests/test_import.py",
    "reshard": "tests/test_reshard.py",
}
OUTPUT_FLAGS = ("-o", "--output", "--svg", "--html")  # rewritten into the test's temporary directory


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def blocks(path: Path) -> list[tuple[str, str, int]]:
    """(info string, body, line of the opening fence) of every fenced block of the page."""
    found, lines, i = [], path.read_text(encoding="utf-8").splitlines(), 0
    while i < len(lines):
        m = re.match(r"^```(.*)$", lines[i])
        if m:
            start, i = i, i + 1
            while not lines[i].startswith("```"):
                i += 1
            found.append((m.group(1).strip(), "\n".join(lines[start + 1:i]) + "\n", start + 1))
        i += 1
    return found


def commands(body: str) -> list[str]:
    """The lines of a sh block, continuation lines (ending in a backslash) joined, comments dropped."""
    out, pending = [], ""
    for line in body.splitlines():
        line = pending + line.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


# -- the set-up commands ------------------------------------------------------------------------------------------

def _setup_commands() -> list[str]:
    readme = README.read_text()
    section = readme.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", section, re.S)]


def test_exactly_two_setup_commands():
    commands = _setup_commands()
    assert len(commands) == 2 and all("\n" not in c for c in commands)
    assert "scalec run samples/" in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    assert _setup_commands()[1] in (ROOT / ".ci" / "run").read_text().splitlines()


# -- the README as a front door -----------------------------------------------------------------------------------

def test_the_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move what is not the front door to docs/"
    long = [n for n, line in enumerate(lines, 1) if len(line) > 200]
    assert not long, f"README.md lines over 200 characters: {long}"


def test_the_readme_holds_nothing_historical():
    """No changelog: no commit ids (the suite's measured times go to docs/testing.md, without them)."""
    text = README.read_text(encoding="utf-8")
    ids = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", text) if re.search(r"[a-f]", w) and re.search(r"\d", w)]
    assert not ids, f"README.md names commits: {ids}"


def _subcommands(monkeypatch) -> list[str]:
    """The CLI's subcommands, read from its parser as tests/test_vocabulary.py reads its flags."""
    import argparse
    from compiler.cli import main
    seen: list[str] = []

    def capture(self, *a, **kw):
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                seen.extend(action.choices)
        raise SystemExit(0)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    with pytest.raises(SystemExit):
        main(["check", "x"])
    monkeypatch.undo()
    return seen


def test_the_readme_lists_every_command(monkeypatch):
    table = README.read_text(encoding="utf-8").split("## Commands", 1)[1].split("\n## ", 1)[0]
    names = _subcommands(monkeypatch)
    assert "export" in names
    missing = [name for name in names if f"`scalec {name}" not in table]
    assert not missing, f"the README's commands table lacks {missing}"


# -- every page's examples ----------------------------------------------------------------------------------------

def test_every_block_says_what_it_is():
    bad = [f"{_rel(p)}:{line} ```{info}" for p in PAGES for info, _, line in blocks(p) if info not in INFO]
    assert not bad, f"fenced blocks need one of the info strings {sorted(INFO)}: {bad}"


SCALE_FILES = [pytest.param(p, line, body, id=f"{_rel(p)}:{line}")
               for p in PAGES for info, body, line in blocks(p) if info == "scale"]


@pytest.mark.parametrize("page,line,body", SCALE_FILES)
def test_scale_file_checks(page, line, body, tmp_path, capsys):
    from compiler.cli import main
    path = tmp_path / f"{page.stem}_{line}.scale"
    path.write_text(body, encoding="utf-8")
    code = main(["check", str(path)])
    out = capsys.readouterr()
    assert code == 0, f"{_rel(page)}:{line}: the ```scale block does not check (mark a piece of a file as " \
                      f"```scale fragment)\n{out.out}{out.err}"


def _sh_commands():
    for page in PAGES:
        for info, body, line in blocks(page):
            if info != "sh":
                continue
            for command in commands(body):
                argv = shlex.split(command)
                if argv[0] != "scalec":
                    continue  # pip, pytest, python -m bench..., sbatch: not the compiler's front door
                sub = argv[1]
                marks = [pytest.mark.skip(reason=SKIP[sub])] if sub in SKIP else []
                yield pytest.param(page, line, argv, marks=marks, id=f"{_rel(page)}:{line}:{' '.join(argv[:3])}")


SH_COMMANDS = list(_sh_commands())


def test_the_pages_show_commands():
    ran = [p for p in SH_COMMANDS if p.values[2][1] in RUN]
    assert len(ran) >= 20 and {p.values[2][1] for p in ran} == RUN


@pytest.mark.parametrize("page,line,argv", SH_COMMANDS)
def test_sh_command_runs(page, line, argv, tmp_path, monkeypatch, capsys):
    from compiler.cli import main
    sub = argv[1]
    assert sub in RUN, f"{_rel(page)}:{line}: `scalec {sub}` is neither run here nor skipped with a reason (SKIP)"
    argv = list(argv)
    for i, word in enumerate(argv[:-1]):
        if word in OUTPUT_FLAGS:
            argv[i + 1] = str(tmp_path / Path(argv[i + 1]).name)
    monkeypatch.chdir(ROOT)
    code = main(argv[1:])
    out = capsys.readouterr()
    assert code == 0, f"{_rel(page)}:{line}: `{shlex.join(argv)}` exited {code}\n{out.out[-3000:]}{out.err[-3000:]}"


# -- links and the map --------------------------------------------------------------------------------------------

def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (word characters, hyphens, spaces kept), spaces
    to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = _slug(heading)
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def _links(path: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_link_resolves(page):
    broken = []
    for link in _links(page):
        if re.match(r"^[a-z]+:", link):
            continue  # http(s), mailto: not followed
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(f"{link} (no such file)")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{link} (no heading #{anchor} in {_rel(path)})")
    assert not broken, f"{_rel(page)}: broken links: {broken}"


def test_every_page_is_on_the_readme_map():
    section = README.read_text(encoding="utf-8").split("## Documentation", 1)[1].split("\n## ", 1)[0]
    mapped = {(ROOT / link).resolve() for link in re.findall(r"\]\(([^)#\s]+)\)", section)}
    missing = [_rel(p) for p in DOCS if p.resolve() not in mapped]
    assert not missing, f"docs pages missing from the README's map (## Documentation): {missing}"


@pytest.mark.parametrize("page", DOCS, ids=_rel)
def test_a_page_is_one_topic(page):
    lines = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M).splitlines()
    assert lines[0].startswith("# ") and sum(1 for ln in lines if ln.startswith("# ")) == 1, \
        f"{_rel(page)}: one page, one topic: a single `# Title` on its first line"


def test_the_readme_shows_what_plan_prints(tmp_path, monkeypatch, capsys):
    """The README's abridged `scalec plan` of its example is what plan prints for it, line for line."""
    from compiler.cli import main
    readme = README.read_text(encoding="utf-8")
    example = next(body for info, body, _ in blocks(README) if info == "scale")
    shown = next(body for info, body, _ in blocks(README) if info == "text" and body.startswith("plan for"))
    (tmp_path / "gpt.scale").write_text(example, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "gpt.scale"]) == 0
    printed = capsys.readouterr().out.splitlines()
    lines = [ln for ln in shown.splitlines() if ln.strip() and ln != "..."]
    assert len(lines) >= 6 and "Saved as `gpt.scale`" in readme
    for ln in lines:
        assert ln in printed, f"README.md shows `{ln}`, which `scalec plan gpt.scale` no longer prints"
