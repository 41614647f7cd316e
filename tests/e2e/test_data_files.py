"""Token files through `scalec run`: a relative path is found beside the .scale file from any working directory,
and ids outside the vocabulary are one error, the same on one device and under tensor parallelism (whose
vocabulary-parallel lookup would otherwise mask them and train on)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from compiler.files import SAMPLE_BYTES
from tests.e2e.runner import ROOT, single_device

pytestmark = pytest.mark.e2e

TOKENS = 'data         = tokens(path = "data/tokens.bin")'


def _scale(tmp_path: Path, name: str, *, one_device: bool, extra: str = "") -> Path:
    """gpt_tp (tp = 2) or its single-device form, vocabulary 256, reading data/tokens.bin beside it; `extra`:
    train settings added."""
    text = (ROOT / "samples" / "gpt_tp.scale").read_text().replace("vocab  = 128", "vocab  = 256")
    text = text.replace("data         = synthetic", TOKENS + extra)
    assert TOKENS in text
    path = tmp_path / "project" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(single_device(text, str(path)) if one_device else text)  # its tokens file found beside it
    return path


def _tokens(tmp_path: Path, ids: np.ndarray) -> None:
    (tmp_path / "project" / "data").mkdir(parents=True, exist_ok=True)
    ids.astype(np.uint16).tofile(tmp_path / "project" / "data" / "tokens.bin")


def _run(scale: Path, out: Path, cwd: Path) -> subprocess.CompletedProcess:
    cwd.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "compiler.cli", "run", str(scale), "-o", str(out), "--steps", "2"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=240)


def _rank_messages(output: str) -> set[str]:
    return {line.split("] ", 1)[1] for line in output.splitlines() if line.startswith("[rank ")}


def test_ids_outside_the_vocabulary_are_one_error_on_every_plan(tmp_path):
    # ids 250..309 for a vocabulary of 256, past the first MiB that `check` samples (in it, check would refuse
    # them before any process starts: tests/test_data.py), so that the ranks' own check is what stops the run
    inside = np.random.default_rng(0).integers(0, 256, SAMPLE_BYTES // 2)
    _tokens(tmp_path, np.concatenate([inside, np.tile(np.arange(250, 310), 70)]))
    data = tmp_path / "project" / "data" / "tokens.bin"
    want = (f"scalec: data file {data}: token id 256 at position {SAMPLE_BYTES // 2 + 6} is outside the vocabulary "
            "of 256 (ids 0..255)")
    for name, one in (("tp2.scale", False), ("one.scale", True)):
        proc = _run(_scale(tmp_path, name, one_device=one), tmp_path / "build" / name, tmp_path / "elsewhere")
        output = proc.stdout + proc.stderr
        assert proc.returncode != 0, f"{name} trained on ids outside the vocabulary:\n{output[-2000:]}"
        assert _rank_messages(output) == {want}, output[-3000:]
        # The ranks print one line each; no Python traceback of the program (torchrun's own report follows).
        assert "training failed" not in output and "IndexError" not in output
        assert not [ln for ln in output.splitlines() if ln.strip().startswith('File "') and "runtime" in ln]


def test_relative_data_path_is_found_from_any_directory(tmp_path):
    """`tokens(path = "data/tokens.bin")` is relative to the .scale file: `scalec run` from another directory,
    into a build directory elsewhere, trains; the program holds that path relative to itself, not this machine's
    absolute path. It also evaluates on the file's held-out tail (eval_split: 127 windows of 33, 31 held out, 16
    read) after each step."""
    _tokens(tmp_path, np.random.default_rng(0).integers(0, 256, 4096))
    out = tmp_path / "build" / "one"
    proc = _run(_scale(tmp_path, "one.scale", one_device=True,
                       extra="\n  eval_every = 1  eval_batches = 1  eval_split = 0.25"), out, tmp_path / "elsewhere")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "step     2/2" in proc.stdout
    evals = [line for line in proc.stdout.splitlines() if line.startswith("eval ")]
    assert [line.split("|")[0].strip() for line in evals] == ["eval     1/2", "eval     2/2"], proc.stdout
    assert "split=0.25," in (out / "program.py").read_text()
    program = (out / "program.py").read_text()
    assert "path='../../project/data/tokens.bin'," in program and str(tmp_path) not in program
