"""docs/internals.md matches the tree: every module path it names exists, and every module of compiler/ and runtime/
is named in it (so a split or a new module updates the map in the same change)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "internals.md"
PACKAGES = ("compiler", "runtime")


def _named() -> set:
    """The paths the page names, relative to the project: written whole (`compiler/cost/step_time.py`), or in the
    module tables under `## compiler/` and `## runtime/` relative to that package (`cost/`, `importer*.py`)."""
    names: set = set()
    section = None
    for line in DOC.read_text().splitlines():
        heading = re.match(r"^## (\w+)/\s*$", line)
        if line.startswith("## "):
            section = heading.group(1) if heading and heading.group(1) in PACKAGES else None
        # a module table's first column names modules relative to its package; elsewhere only whole paths count
        first = line.split("|")[1] if section and line.startswith("|") and line.count("|") > 2 else ""
        for token in re.findall(r"[\w*./-]+", line):
            token = token.rstrip(".,;:")
            if not re.search(r"\.(py|j2|lark)$|/$", token) or token.startswith(("http", "./", "../")):
                continue
            if token.startswith(tuple(f"{p}/" for p in PACKAGES) + ("grammar/", "tests/", "bench/", "docs/")):
                names.add(token)
            elif re.search(rf"`{re.escape(token)}`", first):
                names.add(f"{section}/{token}")
    return names


def test_every_path_the_page_names_exists():
    missing = sorted(n for n in _named() if not list(ROOT.glob(n.rstrip("/"))))
    assert not missing, f"docs/internals.md names paths that are not in the tree: {missing}"


def test_every_module_is_on_the_map():
    """Each module and package of compiler/ and runtime/, at any depth, is named by a path or a pattern."""
    named = _named()
    patterns = [re.compile(re.escape(n.rstrip("/")).replace(r"\*", ".*") + "$") for n in named]
    unnamed = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*")):
            if "__pycache__" in path.parts or path.name == "__init__.py":
                continue
            if not (path.suffix in (".py", ".j2") or (path.is_dir() and (path / "__init__.py").exists())):
                continue
            rel = path.relative_to(ROOT).as_posix()
            # a module inside a named package is on the map through its package (`cost/` covers cost/memory.py)
            inside = any(rel.startswith(n) for n in named if n.endswith("/") and n.rstrip("/") not in PACKAGES)
            if not inside and not any(p.match(rel) for p in patterns):
                unnamed.append(rel)
    assert not unnamed, f"modules missing from docs/internals.md: {unnamed}"
