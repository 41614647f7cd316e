"""The wheel holds the whole compiler and runtime: `pip install .` (not editable) must give a working scalec.

A hand-written package list once left compiler.cost and compiler.layers out, so the installed `scalec` failed at
import, and the editable install that CI used never saw it. This test builds the wheel from the project's own files
(no network, no build isolation: setuptools is already here) and requires every module and data file of the source
tree in it. .ci/wheel goes further on CI: installs it into a fresh virtual environment and runs check, plan and a
one-step run from there.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("compiler", "runtime", "grammar")
DATA = ("*.py", "*.lark", "*.j2")


def _sources() -> set[str]:
    found = set()
    for package in PACKAGES:
        for pattern in DATA:
            found |= {p.relative_to(ROOT).as_posix() for p in (ROOT / package).rglob(pattern)
                      if "__pycache__" not in p.parts}
    return found


def test_the_wheel_holds_every_module_and_data_file(tmp_path):
    src = tmp_path / "src"  # a copy, so the build leaves no build/ or egg-info in the tree
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    wheel, = (tmp_path / "dist").glob("scalec-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(_sources() - names)
    assert not missing, f"the wheel lacks {len(missing)} files of the source tree, e.g. {missing[:5]}"
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "scalec = compiler.cli:entry" in zipfile.ZipFile(wheel).read(entry).decode()
