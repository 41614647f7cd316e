"""The resume contract, launched (issue 37, items 1, 3, 5 and the smaller ones): one torchrun agent, one process,
a tiny model, the program compiled from a .scale file in a project directory and started from other directories.

- a resume after changing the seed, the global batch, the lr, the schedule, the data and seq_len is refused (exit
  78, one line naming every difference); with `--resume-changed` it proceeds and says what changed;
- a finished run extended by more steps resumes, its schedule's meaning stated (the default keeps the cosine's
  curve; `--resume-schedule reanchor` re-anchors it) and the logged learning rates follow it;
- `checkpoint_dir`, `data` and `init` are found from the .scale file whatever the current directory, and an
  `init = from(...)` run that resumes says its init was not read (not "weights from ... filled" after "resumed");
- Ctrl-C (SIGINT to the whole process group, as a terminal sends it) finishes the step and saves a checkpoint;
- `--metrics DIR` stops at start-up with one line and exit 78.

Unit versions of each case are in tests/test_resume_contract.py."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import torch

from compiler import codegen
from compiler.check import check_text
from compiler.pipeline import compile_spec
from runtime import data, resume
from runtime.errors import EXIT_CODE
from tests.e2e.runner import ROOT, assert_no_warnings

pytestmark = pytest.mark.e2e

TIMEOUT = 300
TINY = (ROOT / "samples" / "tiny_gpt.scale").read_text()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), MASTER_PORT=str(_free_port()), OMP_NUM_THREADS="1",
                PYTHONWARNINGS="default")


def _project(tmp_path: Path, text: str, name: str = "run") -> Path:
    """`text` written as PROJECT/NAME.scale and compiled into BUILD/NAME (another directory); the program's path."""
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    scale = project / f"{name}.scale"
    scale.write_text(text)
    out = tmp_path / "build" / name
    codegen.emit(compile_spec(check_text(text, str(scale))), str(out))
    return out


def _launch(out: Path, cwd: Path, *flags: str, expect: int = 0) -> str:
    cwd.mkdir(parents=True, exist_ok=True)
    cmd = ["bash", str(out / "launch.sh"), *flags]
    proc = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT)
    output = proc.stdout + proc.stderr
    if proc.returncode != expect:
        tail = "\n".join(output.splitlines()[-50:])
        pytest.fail(f"exit {proc.returncode}, not {expect}: {' '.join(cmd)}\n--- last 50 lines ---\n{tail}",
                    pytrace=False)
    if expect == 0:
        assert_no_warnings(output, cmd)
    return output


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _tiny(*edits) -> str:
    text = TINY.replace("warmup = 5", "warmup = 1").replace("log_every    = 5", "log_every    = 1\n"
                                                            '  checkpoint_dir = "ckpt"')
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    return text


def _tokens(path: Path, seed: int) -> None:
    ids = torch.randint(0, 128, (20_000,), generator=torch.Generator().manual_seed(seed))
    data.write_tokens(str(path), ids.numpy(), "uint16", 128)


def test_a_changed_resume_is_refused_naming_each_difference_then_allowed(tmp_path):
    """The defect: after changing the seed, the global batch, the lr (×100), the schedule, the token file and
    seq_len, the run printed "resumed from ..." and trained on. Now: one line, exit 78, nothing trained; with
    --resume-changed the run resumes and its log says what changed."""
    (tmp_path / "project").mkdir()
    _tokens(tmp_path / "project" / "a.bin", 0)
    _tokens(tmp_path / "project" / "b.bin", 1)
    before = _tiny(("steps        = 30", "steps        = 4"),
                   ("log_every    = 1", 'log_every    = 1\n  data = tokens(path = "a.bin")'))
    out = _project(tmp_path, before)
    flag = ("--checkpoint-dir", str(tmp_path / "ckpt"))  # the contract alone (the file's own is tested below)
    first = _launch(out, tmp_path / "cwd", *flag, "--stop-after", "2", "--metrics", str(tmp_path / "m1.jsonl"))
    ckpt = tmp_path / "ckpt" / "step_00000002"
    assert f"checkpoint {ckpt}" in first

    after = (before.replace("global_batch = 8", "global_batch = 4").replace("seq_len      = seq", "seq_len      = 32")
             .replace("lr = 3e-3", "lr = 3e-1").replace("cosine(warmup = 1, min_lr = 3e-4)", "constant(warmup = 1)")
             .replace('"a.bin"', '"b.bin"').replace("optimizer", "seed = 7\n  optimizer"))
    out = _project(tmp_path, after)
    refused = _launch(out, tmp_path / "cwd", *flag, "--metrics", str(tmp_path / "m2.jsonl"), expect=EXIT_CODE)
    lines = [line for line in refused.splitlines() if "was written by another run" in line]
    assert len(lines) == 1, refused
    line = lines[0]
    for difference in ("seed 1234 → 7", "global_batch 8 → 4", "seq_len 64 → 32", "lr 0.003 → 0.3",
                       "lr_schedule cosine → constant", "min_lr 0.0003 → 0",
                       f"data {tmp_path}/project/a.bin (uint16, 40,000 bytes", f"→ {tmp_path}/project/b.bin"):
        assert difference in line, (difference, line)
    keys = "seed,global_batch,seq_len,data,lr,lr_schedule,min_lr"
    assert f"--resume-changed {keys};" in line
    assert "resumed from" not in refused and "step     3/" not in refused

    allowed = _launch(out, tmp_path / "cwd", *flag, "--metrics", str(tmp_path / "m3.jsonl"), "--resume-changed",
                      keys)
    assert f"scalec: resumed from {ckpt} (step 2)" in allowed
    changed = [x for x in allowed.splitlines() if x.startswith("scalec: resuming with changed settings")]
    assert len(changed) == 1 and all(d in changed[0] for d in ("seed 1234 → 7", "lr 0.003 → 0.3", "data "))
    assert "micro_batching 1 micro-batch(es) of 8 on 1 batch rank(s) → 1 micro-batch(es) of 4" in allowed
    records = _records(tmp_path / "m3.jsonl")
    assert [r["step"] for r in records][-2:] == [3, 4] and records[-1]["lr"] == pytest.approx(0.3)


def test_a_finished_run_is_extended_with_its_schedule_stated(tmp_path):
    """The defect: a changed `steps` was refused, so a finished run could never be extended. Now it resumes; by
    default the cosine keeps its curve (min_lr after the old last step), with --resume-schedule reanchor the decay
    is re-anchored to the new last step; the log says which, and the logged learning rates follow it."""
    out = _project(tmp_path, _tiny(("steps        = 30", "steps        = 4")))
    ckpt = tmp_path / "ckpt"
    flag = ("--checkpoint-dir", str(ckpt))  # the contract alone (the file's own is tested below)
    _launch(out, tmp_path / "cwd", *flag, "--metrics", str(tmp_path / "m.jsonl"))
    shutil.copytree(ckpt, tmp_path / "finished")

    kept = _launch(out, tmp_path / "cwd", *flag, "--steps", "6", "--metrics", str(tmp_path / "m.jsonl"))
    assert f"scalec: resumed from {ckpt}/step_00000004 (step 4)" in kept
    assert "scalec: steps 4 → 6: the cosine keeps its curve (--resume-schedule keep, the default)" in kept
    records = _records(tmp_path / "m.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r["lr"] for r in records[3:]] == pytest.approx([3e-4] * 3)
    manifest = json.loads((ckpt / "step_00000006" / "scalec.json").read_text())
    assert (manifest["run"]["steps"], manifest["run"]["schedule_steps"]) == (6, 4)

    shutil.rmtree(ckpt)
    shutil.copytree(tmp_path / "finished", ckpt)
    again = _launch(out, tmp_path / "cwd", *flag, "--steps", "8", "--resume-schedule", "reanchor",
                    "--metrics", str(tmp_path / "m.jsonl"))
    assert "scalec: steps 4 → 8: the cosine is re-anchored (--resume-schedule reanchor)" in again
    lrs = [r["lr"] for r in _records(tmp_path / "m.jsonl")[4:]]
    want = [3e-3 * resume.multiplier(k, schedule="cosine", warmup=1, lr=3e-3, min_lr=3e-4, anchor=8)
            for k in range(5, 9)]
    assert lrs == pytest.approx(want) and lrs[0] > 1e-3


# Slow tier (the suite's budget): in CI, tests/test_resume_contract.py holds checkpoint_dir relative to the .scale
# file in the generated program, the checkpoints left where earlier versions looked, and init not read on resume.
@pytest.mark.slow
def test_paths_are_found_from_the_scale_file_and_a_resumed_init_is_not_read(tmp_path):
    """The defect: checkpoint_dir was resolved from the current directory, so a rerun from another directory
    silently started again at step 1; and a resumed `init = from(...)` run printed "weights from ... filled" after
    "resumed from". Now the second run, from another directory, resumes the project's checkpoint and says its init
    was not read."""
    files = ROOT / "tests" / "mistakes" / "files"
    text = (files / "files_llama.scale").read_text().replace('init = from("files_llama")',
                                                              'init = from("files_llama")  checkpoint_dir = "ckpt"')
    (tmp_path / "project").mkdir()
    shutil.copytree(files / "files_llama", tmp_path / "project" / "files_llama")
    out = _project(tmp_path, text, "llama")
    first = _launch(out, tmp_path / "a")
    assert f"weights from {tmp_path}/project/files_llama" in first
    assert f"checkpoint {tmp_path}/project/ckpt/step_00000002" in first
    second = _launch(out, tmp_path / "b" / "c", "--steps", "3")
    ckpt = tmp_path / "project" / "ckpt"
    assert f"scalec: resumed from {ckpt}/step_00000002 (step 2)" in second
    assert (f"scalec: init = from({tmp_path}/project/files_llama) was not read: the run resumed from its "
            "checkpoint (step 2), whose weights it continues") in second
    assert "weights from" not in second
    assert (ckpt / "step_00000003").is_dir() and not (tmp_path / "a" / "ckpt").exists()
    # checkpoints where earlier versions put them (the same relative path from the current directory): the run
    # stops with one line rather than starting again at step 1 beside them
    (tmp_path / "old").mkdir()
    shutil.move(str(ckpt), str(tmp_path / "old" / "ckpt"))
    stopped = _launch(out, tmp_path / "old", "--steps", "4", expect=EXIT_CODE)
    assert (f'checkpoint_dir = "ckpt" is relative to the .scale file: {ckpt} holds no checkpoint, but '
            f"{tmp_path}/old/ckpt (the same path from the current directory") in stopped
    assert not re.search(r"step\s+\d+/4", stopped) and not ckpt.exists()


# Slow tier (the suite's budget): in CI, tests/test_resume_contract.py holds SIGINT asking for a stop at the step as
# SIGTERM does (whose save and resume tests/e2e/test_faults.py runs) and the launcher's words.
@pytest.mark.slow
def test_ctrl_c_finishes_the_step_and_saves(tmp_path):
    """The defect: Ctrl-C made the launcher say a checkpoint was being saved while every rank died with
    KeyboardInterrupt. Now SIGINT to the whole process group (as a terminal sends it) ends the step, saves it and
    exits, and the launcher says what happened."""
    out = _project(tmp_path, _tiny(("steps        = 30", "steps        = 100000")))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = subprocess.Popen(["bash", str(out / "launch.sh")], cwd=cwd, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    deadline = time.monotonic() + TIMEOUT
    try:
        for line in proc.stdout:
            lines.append(line)
            if re.match(r"step\s+3/100000", line):
                os.killpg(proc.pid, signal.SIGINT)
                break
            assert time.monotonic() < deadline, "".join(lines[-50:])
        rest, _ = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    output = "".join(lines) + rest
    stopped = re.search(r"scalec: stopped by SIGINT after step (\d+); checkpoint saved in (\S+)", output)
    assert stopped, output[-3000:]
    step = int(stopped.group(1))
    assert stopped.group(2) == str(tmp_path / "project" / "ckpt")
    assert (tmp_path / "project" / "ckpt" / f"step_{step:08d}" / "scalec.json").exists()
    assert "KeyboardInterrupt" not in output and "Traceback" not in output
    assert "scalec: torchrun stopped by SIGINT and passed it on" in output
    assert proc.returncode == 128 + signal.SIGINT


# Slow tier (the suite's budget): in CI, tests/test_resume_contract.py holds --metrics DIR as a one-line start-up
# error (FatalError, exit 78).
@pytest.mark.slow
def test_metrics_pointing_at_a_directory_is_one_line_and_exit_78(tmp_path):
    out = _project(tmp_path, _tiny(("steps        = 30", "steps        = 2")))
    (tmp_path / "metrics").mkdir()
    output = _launch(out, tmp_path / "cwd", "--metrics", str(tmp_path / "metrics"), expect=EXIT_CODE)
    assert f"scalec: --metrics {tmp_path}/metrics is a directory" in output
    assert "IsADirectoryError" not in output and "Traceback" not in output
    assert not re.search(r"step\s+\d+/2", output)  # stopped before step 1
