"""Fault drills: a rank killed mid-run (torchrun restarts the job, which resumes from its checkpoint, bitwise equal to
an uninterrupted run), a preemption (SIGTERM: checkpoint, exit 0, resume equal) and a hang (the job ends naming the
waiting ranks' operation and `.scale` line, and the rank that never joined). Test-only hooks: SCALEC_TEST_*_AT."""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import torch

from compiler import codegen
from compiler.check import check_text
from compiler.pipeline import compile_spec
from tests.e2e.runner import ROOT, _free_port

pytestmark = pytest.mark.e2e

STEPS = 6
DP2 = (ROOT / "samples" / "gpt_dp.scale").read_text().replace(
    "log_every    = 5", "log_every    = 1\n  restarts = 1  checkpoint_every = 2")


def _start(text: str, name: str, work: Path, *, env: dict = (), extra: tuple = ()):
    """Compile `text` and start its launch.sh (not waiting): the process, its metrics and weights files."""
    out = work / name
    compiled = compile_spec(check_text(text, f"{name}.scale"))
    codegen.emit(compiled, str(out))
    metrics, weights = out / "metrics.jsonl", out / "weights.pt"
    cmd = ["bash", str(out / "launch.sh"), "--steps", str(STEPS), "--metrics", str(metrics), *extra]
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), LOCAL_NODES="1", MASTER_PORT=str(_free_port()),
                    OMP_NUM_THREADS="1", SCALEC_TEST_SAVE_WEIGHTS=str(weights), **dict(env))
    return subprocess.Popen(cmd, cwd=out, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True), metrics, weights


def _run(text: str, name: str, work: Path, *, env: dict = (), extra: tuple = (), timeout: int = 240):
    t0 = time.monotonic()
    popen, metrics, weights = _start(text, name, work, env=env, extra=extra)
    try:
        output, _ = popen.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        popen.kill()
        raise
    proc = subprocess.CompletedProcess(popen.args, popen.returncode, output, "")
    by_step = {}
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            r = json.loads(line)
            by_step[r["step"]] = r["loss"]  # a resumed attempt repeats the steps after its checkpoint
    return (proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t0, by_step,
            torch.load(weights) if weights.exists() else None)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    rc, out, _, losses, weights = _run(DP2, "reference", tmp_path_factory.mktemp("faults"))
    assert rc == 0, out[-3000:]
    return losses, weights


def _bitwise(weights, ref) -> bool:
    return weights is not None and weights.keys() == ref.keys() and all(torch.equal(weights[k], ref[k]) for k in ref)


@pytest.mark.slow  # a drill: the slow tier (`pytest --slow -m slow`; 54 s of a loaded full run; bench/restart_drill.py)
def test_killed_rank_restarts_and_resumes_bitwise(uninterrupted, tmp_path):
    """Rank 1 is SIGKILLed at the start of step 4 (first attempt only): torchrun restarts the job (restarts = 1),
    which resumes from step 2's checkpoint; losses and final weights equal the uninterrupted run's, bitwise. The
    surviving rank's one line names the rank that died."""
    rc, out, _, losses, weights = _run(DP2, "killed", tmp_path, env={"SCALEC_TEST_KILL_AT": "1:4"},
                                       extra=("--checkpoint-dir", str(tmp_path / "ckpt")))
    assert rc == 0, out[-3000:]
    assert "resumed from" in out and "(step 2)" in out
    assert "lost a peer at step 4" in out and "rank 1 did not answer" in out, out[-3000:]
    ref_losses, ref_weights = uninterrupted
    assert losses == ref_losses
    assert _bitwise(weights, ref_weights)


@pytest.mark.slow  # a drill: the slow tier (`pytest --slow -m slow`; 42 s of a loaded full run; bench/restart_drill.py)
def test_sigterm_checkpoints_exits_cleanly_and_resumes_equal(uninterrupted, tmp_path):
    """Rank 0 gets SIGTERM (a preemption) at step 3: every rank stops after that same step, the checkpoint is
    saved and the job exits 0; relaunched, it resumes there and ends bitwise equal to the uninterrupted run."""
    ckpt = ("--checkpoint-dir", str(tmp_path / "ckpt"))
    rc, out, _, first, _ = _run(DP2, "preempted", tmp_path, env={"SCALEC_TEST_TERM_AT": "0:3"}, extra=ckpt)
    assert rc == 0, out[-3000:]
    assert "stopped by SIGTERM after step 3; checkpoint saved" in out and sorted(first) == [1, 2, 3]
    rc, out, _, second, weights = _run(DP2, "resumed", tmp_path, extra=ckpt)
    assert rc == 0 and "(step 3)" in out, out[-3000:]
    ref_losses, ref_weights = uninterrupted
    assert {**first, **second} == ref_losses
    assert _bitwise(weights, ref_weights)


def test_hang_ends_the_job_naming_the_collective(tmp_path):
    """Rank 1 sleeps forever at step 2 under tp = 2 with `timeout = 5`: within timeout + 30 s the job exits non-zero
    with one message naming rank 0's coordinates, the operation it waits in and its `.scale` line, and rank 1 as the
    rank that never joined."""
    text = (ROOT / "samples" / "gpt_tp.scale").read_text().replace("log_every", "timeout = \"5 s\"\n  log_every")
    rc, out, dt, _, _ = _run(text, "hang", tmp_path, env={"SCALEC_TEST_HANG_AT": "1:2"}, timeout=180)
    assert rc != 0
    assert "a collective did not complete within the timeout (5 s" in out, out[-3000:]
    assert re.search(r"rank 0 \(tp=0\) waits in all_reduce over tp \(forward\) at hang\.scale:\d+ \(tp: forward "
                     r"all-reduce, backward identity; the vocabulary-parallel embedding", out), out[-3000:]
    assert "rank 1 never joined" in out and "at step 2" in out
    assert out.count("did not complete within the timeout") == 1
    assert dt < 5 + 30 + 20, f"took {dt:.0f} s"  # + 20 s: start-up of two ranks on a loaded 2-core machine


@pytest.fixture(scope="module")
def four_layer_checkpoint(tmp_path_factory):
    """A checkpoint (step 2) of DP2's model with 4 layers instead of 2."""
    work = tmp_path_factory.mktemp("four_layers")
    rc, out, _, _, _ = _run(DP2.replace("layers = 2", "layers = 4"), "four", work,
                            extra=("--checkpoint-dir", str(work / "ckpt"), "--stop-after", "2"))
    assert rc == 0, out[-3000:]
    return work / "ckpt"


@pytest.mark.parametrize("nodes", [1, 2], ids=["one_agent", "two_agents"])
def test_a_checkpoint_of_another_model_ends_the_job_at_once(nodes, four_layer_checkpoint, tmp_path):
    """The defect: the 2-layer model resumed the 4-layer model's checkpoint; and a start-up failure no restart can
    fix was retried `restarts` times, printing the same error each time. Now, with restarts = 3, the job stops at
    the first attempt with E0901's words once, exit code 78 (runtime.errors.EXIT_CODE); with two torchrun agents
    (`nodes = 2`, LOCAL_NODES=1) both stop."""
    import shutil

    from runtime.errors import EXIT_CODE
    text = DP2.replace("restarts = 1", "restarts = 3")
    if nodes == 2:
        text = text.replace("nodes = 1\n  devices_per_node = 2", "nodes = 2\n  devices_per_node = 1")
    ckpt = tmp_path / "ckpt"
    shutil.copytree(four_layer_checkpoint, ckpt)
    rc, out, _, losses, _ = _run(text, f"two_layers_{nodes}", tmp_path, extra=("--checkpoint-dir", str(ckpt)),
                                 env={"LOGLEVEL": "INFO"})  # torchrun's agent logs each restart at INFO
    assert rc == EXIT_CODE, out[-3000:]
    assert out.count("the models differ") == 1, out[-3000:]
    assert (f"scalec: the models differ: {ckpt}/step_00000002 has `blocks.2.attn_k.bias` and 31 more parameters "
            "that this model lacks") in out
    assert "resumed" not in out and not losses
    # one attempt ("will restart worker group" is how torchrun's agent logs a restart); one report per agent
    assert "will restart worker group" not in out and out.count("scalec: the job failed") == nodes, out[-3000:]
    assert "a failure no restart can fix: not restarted" in out


def _line(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


HANG_DP = (ROOT / "samples" / "gpt_dp.scale").read_text().replace("log_every", "timeout = \"8 s\"\n  log_every")
HANG_FSDP = HANG_DP.replace("data_parallel = ddp ", "data_parallel = fsdp")
HANG_PP = (ROOT / "samples" / "gpt_pp.scale").read_text().replace("log_every", "timeout = \"8 s\"\n  log_every")
# case: (.scale text, SCALEC_TEST_HANG_AT of rank 1, what rank 0 waits in, the .scale lines it names)
HANGS = {
    "ddp": (HANG_DP, "1:3", "the backward (with DDP's gradient all-reduce over the batch ranks)",
            [("axis dp = 2", "axis dp = 2"), ("data_parallel = ddp", "data_parallel = ddp")]),
    "fsdp": (HANG_FSDP, "1:2", "the forward (with FSDP's weight all-gathers over dp)",
             [("data_parallel = fsdp", "data_parallel = fsdp")]),
    "pp": (HANG_PP, "1:2", "the pipeline schedule (sends and receives between stages over pp)",
           [("axis pp = 2", "axis pp = 2"), ("schedule = ", 'schedule = "1f1b"')]),
    "loss": (HANG_DP, "1:2:loss", "the loss all-reduce over the batch ranks", [("axis dp = 2", "axis dp = 2")]),
}


@pytest.fixture(scope="module")
def hangs(tmp_path_factory):
    """The four hangs at once (each mostly waits out its timeout): {case: (exit status, output)}."""
    work = tmp_path_factory.mktemp("hangs")
    started = {case: _start(text, f"hang_{case}", work, env={"SCALEC_TEST_HANG_AT": at})[0]
               for case, (text, at, _, _) in HANGS.items()}
    done = {}
    for case, popen in started.items():
        try:
            out, _ = popen.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            popen.kill()
            out, _ = popen.communicate()
        done[case] = (popen.returncode, out)
    return done


@pytest.mark.parametrize("case", sorted(HANGS))
def test_a_hang_in_the_runtimes_own_collectives_names_its_scale_line(hangs, case):
    """Rank 1 stops at step 2 or 3 (at its start, or before the loss all-reduce; at step 2 DDP's forward waits for
    its bucket order, at step 3 the backward for its all-reduce): rank 0's report names the operation
    it waits in and the `.scale` lines that caused it: DDP's backward the dp axis and `data_parallel`, FSDP's
    gathers the `data_parallel = fsdp` line, the pipeline's sends the pp axis and `schedule`, the loss all-reduce
    the dp axis."""
    text, _, what, lines = HANGS[case]
    rc, out = hangs[case]
    assert rc != 0
    where = ", ".join(f"hang_{case}.scale:{_line(text, needle)} ({shown})" for needle, shown in lines)
    coords = "pp=0; pipeline stage 0" if case == "pp" else "dp=0"
    step = HANGS[case][1].split(":")[1]
    assert f"rank 0 ({coords}) waits in {what} at {where} at step {step}" in out, out[-3000:]
    assert "rank 1 never joined" in out
