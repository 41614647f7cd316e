"""The front door stays light: `scalec --help`, `scalec check` and `scalec explain` import no torch.

Each runs in a fresh interpreter through a tiny driver that calls compiler.cli.main and then reports whether
`torch` (or anything of runtime/) was imported. torch is imported where a model is built: plan, compile, run.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
DRIVER = """
import contextlib, io, json, sys
from compiler.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
    try:
        rc = main(sys.argv[1:])
    except SystemExit as e:
        rc = e.code
light = {LIGHT!r}
heavy = sorted(m for m in sys.modules if m == "torch" or m.startswith(("torch.", "runtime")) and m not in light)
print(json.dumps({"rc": rc, "heavy": heavy[:5], "out": out.getvalue()[-300:]}))
"""
# Runtime modules that import no torch by design, which the checker reads so that it checks what the program does:
# the package itself (a docstring), Hugging Face's names (runtime/hf_names.py, read by `init = from(...)`'s check) and
# the names the language shares with the runtime (runtime/choices.py: axes, data parallelism, schedules, recomputation)
# and the held-out split of a token file (runtime/split.py: the checker sizes it as the program cuts it), and the reader
# of a Megatron index's header (runtime/indexed.py: the checker reads a dataset's dtype as the program does).
LIGHT = {"runtime", "runtime.hf_names", "runtime.choices", "runtime.split", "runtime.indexed"}


def _run(*args: str) -> dict:
    r = subprocess.run([sys.executable, "-c", DRIVER.replace("{LIGHT!r}", repr(sorted(LIGHT))), *args], capture_output=True, text=True, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_help_imports_no_torch():
    got = _run("--help")
    assert got["rc"] == 0 and "--version" in got["out"]
    assert got["heavy"] == []


def test_explain_imports_no_torch():
    got = _run("explain", "E0401")
    assert got["rc"] == 0 and got["heavy"] == []


@pytest.mark.parametrize("sample", ["tiny_gpt", "gpt3_175b", "moe_1t", "gpt_3d"])
def test_check_imports_no_torch(sample):
    got = _run("check", f"samples/{sample}.scale")
    assert got["rc"] == 0, got["out"]
    assert got["heavy"] == [], f"scalec check imported {got['heavy']}"


def test_a_bad_file_is_reported_without_torch_too():
    got = _run("check", "tests/golden/diagnostics/" + sorted(
        p.name for p in (ROOT / "tests" / "golden" / "diagnostics").glob("*.scale"))[0])
    assert got["rc"] == 1 and "aborting due to" in got["out"]
    assert got["heavy"] == []


def test_the_rules_and_the_plan_import_without_torch():
    """The front end and the plan, torch-free by position: the rules (compiler/rules/), the Spec and the Plan, the
    Plan's printer, the graph keys, the device figures."""
    code = ("import sys, compiler.rules.pipeline_split, compiler.rules.expert_parallel, "
            "compiler.rules.tensor_parallel, compiler.spec, compiler.report.scale, "
            "compiler.graph_meta, compiler.check, compiler.parse, compiler.binder, compiler.layers, "
            "compiler.layout.devices, compiler.layout.groups, compiler.layout.cluster, compiler.codes, compiler.plan\n"
            f"print(sorted(m for m in sys.modules if (m == 'torch' or m.startswith(('torch.', 'runtime'))) "
            f"and m not in {sorted(LIGHT)!r})[:5])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
