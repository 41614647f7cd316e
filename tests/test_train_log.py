"""The training loop's overheads and its log: no host synchronisation on steps that are not read, the preemption vote
agreed without one, prefetched data equal to the data, the log line's speed figures, TensorBoard events."""
from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from compiler import codegen
from compiler.check import check_text
from compiler.pipeline import compile_spec
from runtime import data, faults, optimizer, parallelize, progress, train
from runtime.config import Speed
from tests import multirank

ROOT = Path(__file__).resolve().parents[1]
TINY = (ROOT / "samples" / "tiny_gpt.scale").read_text()


# -- the log's figures ---------------------------------------------------------------------------------------------


def test_speed_is_model_flops_per_device_over_the_plans_peak():
    speed = Speed(flops_per_step=8e12, peak_flops=1e12, device="x")
    got = progress.speed_figures(speed, world=4, dt=0.5)  # 8e12 / 4 devices / 0.5 s = 4e12 FLOP/s per device
    assert got == {"tflops": pytest.approx(4.0), "mfu": pytest.approx(4.0)}
    assert progress.speed_figures(Speed(), world=1, dt=1.0) == {}  # no FLOPs known: nothing claimed


def test_log_line_shows_speed_memory_elapsed_and_eta():
    record = {"step": 10, "loss": 2.5, "grad_norm": 0.75, "lr": 1e-3, "step_time": 0.2, "tokens_per_s": 5000.0,
              "tflops": 312.5, "mfu": 0.4567, "elapsed_s": 3725.0, "eta_s": 61.0,
              "peak_memory_bytes": 12_300_000_000, "peak_memory_rank": 3}
    line = progress.log_line(record, 100)
    for part in ("step    10/100", "loss   2.5000", "grad-norm   0.750", "5,000 tok/s", "200.0 ms/step",
                 "312 TFLOP/s/device", "MFU 45.7%", "peak 12.3 GB (rank 3)", "elapsed 1:02:05", "ETA 1:01"):
        assert part in line, (part, line)


def test_clock_averages_over_the_steps_since_the_last_read():
    clock = progress.Clock(start=0)
    clock.t_last -= 3.0  # three seconds ago
    assert clock.lap(3) == pytest.approx(1.0, abs=0.05)  # three steps in three seconds
    clock.t_last -= 1.0
    assert clock.lap(4) == pytest.approx(1.0, abs=0.05)


def test_launch_time_from_the_environment_then_the_process(monkeypatch):
    monkeypatch.setenv(progress.LAUNCH_TIME, "1234.5")
    assert progress.launch_time() == 1234.5
    monkeypatch.delenv(progress.LAUNCH_TIME)
    started = progress.launch_time()  # this process's start, from /proc
    assert started <= time.time()
    assert started <= progress._IMPORTED + 1.0  # the process started before this module was imported
    assert time.time() - started < 24 * 3600


def test_launcher_exports_its_start_to_the_workers():
    code = ("import os, time; import runtime.launch; "
            "print(time.time() - float(os.environ['SCALEC_LAUNCH_TIME']))")
    env = {k: v for k, v in os.environ.items() if k != "SCALEC_LAUNCH_TIME"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert 0 <= float(out.stdout) < 60
    assert progress.LAUNCH_TIME == "SCALEC_LAUNCH_TIME"


# -- optimizer, data-parallel knobs, data ----------------------------------------------------------------------------


def test_adamw_is_a_loop_on_cpu_and_fused_on_cuda():
    """What the memory model assumes (compiler/cost: no AdamW temporaries on either)."""
    cfg_optim = train.Optim(lr=1e-3)
    opt = optimizer.adamw([torch.nn.Parameter(torch.ones(2, 2))], cfg_optim)
    assert not opt.defaults.get("foreach") and not opt.defaults.get("fused")
    if torch.cuda.is_available():
        opt = optimizer.adamw([torch.nn.Parameter(torch.ones(2, 2, device="cuda"))], cfg_optim)
        assert opt.defaults["fused"] is True


def test_fsdp_prefetch_names_the_next_blocks_forward_and_the_previous_backward():
    class Block:
        def __init__(self, i):
            self.i, self.fwd, self.bwd = i, None, None

        def set_modules_to_forward_prefetch(self, mods):
            self.fwd = [m.i for m in mods]

        def set_modules_to_backward_prefetch(self, mods):
            self.bwd = [m.i for m in mods]
    blocks = [Block(i) for i in range(4)]
    parallelize.fsdp_prefetch(blocks, 1)
    assert [b.fwd for b in blocks] == [[1], [2], [3], None]
    assert [b.bwd for b in blocks] == [None, [0], [1], [2]]
    blocks = [Block(i) for i in range(4)]
    parallelize.fsdp_prefetch(blocks, 2)
    assert blocks[0].fwd == [1, 2] and blocks[3].bwd == [2, 1]
    blocks = [Block(i) for i in range(2)]
    parallelize.fsdp_prefetch(blocks, 0)
    assert all(b.fwd is None and b.bwd is None for b in blocks)


def test_the_compiler_writes_the_plans_bucket_and_prefetch():
    """The program's bucket and prefetch depth are the Plan's (compiler.plan.Plan.ddp_bucket_bytes, fsdp_prefetch),
    the figures its step-time and memory models cost: the defaults, and a value a search might choose."""
    import dataclasses
    dp = (ROOT / "samples" / "gpt_dp.scale").read_text()
    spec = check_text(dp, "dp.scale")
    compiled = compile_spec(spec)
    values = codegen.config_values(spec, compiled.traced, plan=compiled.plan)
    assert values["parallel"]["ddp_bucket_mb"] * 2 ** 20 == compiled.plan.ddp_bucket_bytes == 25 * 2 ** 20
    other = dataclasses.replace(compiled.plan, ddp_bucket_bytes=2 ** 20)
    assert codegen.config_values(spec, compiled.traced, plan=other)["parallel"]["ddp_bucket_mb"] == 1.0
    from tests.e2e.runner import with_plan
    fsdp = check_text(with_plan(dp, data_parallel="fsdp"), "dp.scale")
    assert fsdp.plan.data_parallel == "fsdp"
    compiled = compile_spec(fsdp)
    values = codegen.config_values(fsdp, compiled.traced, plan=compiled.plan)
    assert values["parallel"]["fsdp_prefetch"] == compiled.plan.fsdp_prefetch == 1
    assert "ddp_bucket_mb" not in values["parallel"]
    other = dataclasses.replace(compiled.plan, fsdp_prefetch=2)
    assert codegen.config_values(fsdp, compiled.traced, plan=other)["parallel"]["fsdp_prefetch"] == 2


def test_prefetched_batches_are_the_data():
    source = data.Synthetic(vocab=50, seq_len=8, seed=3)

    def fetch(step):
        return [data.micro_batch(source, step, 8, 1, 2, j, 2) for j in range(2)]
    loader = data.Prefetcher(fetch, torch.device("cpu"), stop=5)
    try:
        for step in (0, 1, 2, 4):  # in order (prefetched), then a skip (built on demand)
            got, want = loader.get(step), fetch(step)
            assert len(got) == 2
            for (t, y), (t0, y0) in zip(got, want):
                assert torch.equal(t, t0) and torch.equal(y, y0)
        assert loader.pending is None  # nothing prepared past the last step
    finally:
        loader.close()


# -- the preemption vote ---------------------------------------------------------------------------------------------


def _vote_rank(out: str, rank: int, _collectives) -> None:
    results = []
    vote = faults.StopVote(torch.device("cpu"))
    for step in range(4):
        if rank == 1 and step == 2:
            faults._TERM = True  # as the SIGTERM handler does, on one rank only
        vote.start()
        time.sleep(0.01 * rank)  # the ranks reach the end of the step at different times
        results.append(vote.result())
    with open(f"{out}.{rank}", "w") as f:
        json.dump(results, f)


@pytest.mark.e2e
def test_stop_vote_stops_every_rank_after_the_same_step(tmp_path):
    out = str(tmp_path / "votes")
    multirank.spawn(functools.partial(_vote_rank, out), 2, axes=())
    for rank in range(2):
        assert json.loads(Path(f"{out}.{rank}").read_text()) == [False, False, True, True]


# -- no host synchronisation on unread steps, TensorBoard ------------------------------------------------------------

_COUNT_SYNCS = r"""
import json, os, runpy, sys
import torch
from runtime import faults
calls = []
def counting(name):
    real = getattr(torch.Tensor, name)
    def f(self, *a, **kw):
        caller = sys._getframe(1).f_code.co_filename
        if "/runtime/" in caller or caller.endswith("program.py"):
            calls.append((faults._STEP, name, f"{os.path.basename(caller)}:{sys._getframe(1).f_lineno}"))
        return real(self, *a, **kw)
    setattr(torch.Tensor, name, f)
for name in ("item", "tolist", "__float__", "__int__", "__bool__", "cpu", "numpy"):
    counting(name)
real_exit = os._exit
def leave(code):
    with open(os.environ["SYNCS_OUT"], "w") as fh:
        json.dump(calls, fh)
    real_exit(code)
os._exit = leave
sys.argv = [sys.argv[1]] + sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.fixture(scope="module")
def tiny_program(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    text = TINY.replace("log_every    = 5", "log_every    = 3")
    assert text != TINY
    codegen.emit(compile_spec(check_text(text, "tiny_gpt.scale")), str(out))
    return out


def _run(program_dir: Path, *flags, wrapper: str | None = None, env: dict | None = None):
    env = dict(os.environ, PYTHONPATH=str(ROOT), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(multirank.free_port()), OMP_NUM_THREADS="1", **(env or {}))
    cmd = [sys.executable] + (["-c", wrapper] if wrapper else []) + [str(program_dir / "program.py"), *flags]
    proc = subprocess.run(cmd, cwd=program_dir, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


@pytest.mark.e2e
def test_unlogged_steps_read_nothing_from_the_device(tiny_program, tmp_path):
    """Steps 1, 3 and 6 are logged (the first, every 3rd, the last): only they read values of tensors in the
    runtime's code; steps 2, 4 and 5 read none (on CUDA each read is a host-device synchronisation)."""
    syncs = tmp_path / "syncs.json"
    out = _run(tiny_program, "--steps", "6", wrapper=_COUNT_SYNCS, env={"SYNCS_OUT": str(syncs)})
    assert "step     3/6" in out and "step     2/6" not in out
    steps = {step for step, _, _ in json.loads(syncs.read_text())}
    calls = json.loads(syncs.read_text())
    assert {1, 3, 6} <= steps, calls  # the logged steps do read (so the counting works)
    assert not steps & {2, 4, 5}, [c for c in calls if c[0] in (2, 4, 5)]


@pytest.mark.e2e
def test_metrics_read_every_step_with_speed_and_times(tiny_program, tmp_path):
    metrics = tmp_path / "m.jsonl"
    out = _run(tiny_program, "--steps", "4", "--metrics", str(metrics))
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for r in records:
        assert r["tflops"] > 0 and 0 < r["mfu"] and r["elapsed_s"] > 0 and r["eta_s"] >= 0
    assert records[-1]["eta_s"] == 0 and records[0]["eta_s"] > 0
    assert records[-1]["elapsed_s"] > records[0]["elapsed_s"]
    assert "MFU against the plan's device (cpu:" in out and "MFU " in out and "ETA " in out
    assert "since the job started" in out


@pytest.mark.e2e
def test_tensorboard_events_hold_the_scalars(tiny_program, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing import event_accumulator
    logdir = tmp_path / "tb"
    _run(tiny_program, "--steps", "4", "--tensorboard", str(logdir))
    acc = event_accumulator.EventAccumulator(str(logdir))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/grad_norm", "train/lr", "train/tflops", "train/mfu", "train/eta_s"} <= tags
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 3, 4]  # the logged steps
    assert all(e.value > 0 for e in acc.Scalars("train/loss"))


@pytest.mark.e2e
def test_evaluation_leaves_training_as_it_was_and_is_logged(tiny_program, tmp_path):
    """eval_every = 3 on a 4-step run evaluates after steps 3 and 4 (the last): the training losses are those of
    the same program without evaluation (no data position or random stream moved), the eval fields join those
    steps' records (the train keys as they were), a line under the step's, and TensorBoard's eval/loss, eval/ppl."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing import event_accumulator
    out = tmp_path / "eval"
    text = TINY.replace("log_every    = 5", "log_every    = 3  eval_every = 3  eval_batches = 2")
    codegen.emit(compile_spec(check_text(text, "tiny_gpt.scale")), str(out))
    with_eval, without = tmp_path / "with.jsonl", tmp_path / "without.jsonl"
    logdir = tmp_path / "tb"
    log = _run(out, "--steps", "4", "--metrics", str(with_eval), "--tensorboard", str(logdir))
    _run(tiny_program, "--steps", "4", "--metrics", str(without))
    got, want = ([json.loads(line) for line in f.read_text().splitlines()] for f in (with_eval, without))
    assert [r["loss"] for r in got] == [r["loss"] for r in want]
    assert [r["step"] for r in got if "eval_loss" in r] == [3, 4]
    for g, w in zip(got, want):
        assert set(g) - set(w) == ({"eval_loss", "eval_ppl"} if g["step"] in (3, 4) else set())
    evals = [r for r in got if "eval_loss" in r]
    assert evals[1]["eval_loss"] < evals[0]["eval_loss"] < 5.0  # ln(128) = 4.85 at the start
    assert evals[0]["eval_ppl"] == pytest.approx(math.exp(evals[0]["eval_loss"]))
    lines = log.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("step     3/4"))
    assert lines[at + 1] == progress.eval_line({"step": 3, **{k: evals[0][k] for k in ("eval_loss", "eval_ppl")}}, 4)
    acc = event_accumulator.EventAccumulator(str(logdir))
    acc.Reload()
    assert [e.step for e in acc.Scalars("eval/loss")] == [3, 4]
    assert acc.Scalars("eval/ppl")[0].value == pytest.approx(evals[0]["eval_ppl"], rel=1e-6)


def test_eval_line_and_a_diverged_perplexity():
    record = progress.eval_record(20, 4.1234)
    assert progress.eval_line(record, 100) == "eval    20/100 | loss   4.1234 | ppl 61.77"
    assert progress.eval_record(5, 1e4)["eval_ppl"] == math.inf  # exp past a double: infinite, not an exception


def test_tensorboard_missing_is_one_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as if not installed
    assert progress.tensorboard("somewhere") is None
    assert "tensorboard package is not installed" in capsys.readouterr().out


def test_runner_finds_warnings_but_the_named_exemptions():
    from tests.e2e.runner import ALLOWED_WARNINGS, warnings_in
    out = ("step 1 | loss 2.0\n"
           "/x/distributed_c10d.py:1: FutureWarning: `torch.distributed.all_gather_into_tensor` is deprecated.\n"
           "/x/_script.py:1488: DeprecationWarning: `torch.jit.script` is deprecated. Please switch\n"
           "/y/z.py:3: UserWarning: something odd\n")
    found = warnings_in(out)
    assert len(found) == 2 and "FutureWarning" in found[0] and "UserWarning" in found[1]
    assert all(reason for reason in ALLOWED_WARNINGS.values())  # each exemption says why


def _ddp_bucket_rank(out: str, rank: int, _collectives) -> None:
    import types
    from runtime import tensor_parallel as tp
    cfg = train.Config(name="m", source="m.scale", steps=1, seed=0, optim=train.Optim(lr=1e-3),
                       data=train.Data(global_batch=2, seq_len=2, vocab=3),
                       parallel=train.Parallel(axes=(("dp", 1),), batch_ranks=2, ddp_bucket_mb=3.0))
    ctx = types.SimpleNamespace(batch_size=2, batch_group=dist.group.WORLD, device=torch.device("cpu"),
                                axis_size=lambda axis: 1)
    ddp = parallelize.wrap_data_parallel(torch.nn.Linear(4, 4), ctx, cfg, tp.Shards((), (), ()))
    with open(out, "w") as f:
        json.dump(ddp.bucket_bytes_cap, f)


@pytest.mark.e2e
def test_ddp_gets_the_plans_bucket(tmp_path):
    out = str(tmp_path / "cap.json")
    multirank.spawn(functools.partial(_ddp_bucket_rank, out), 1, axes=())
    assert json.loads(Path(out).read_text()) == 3 * 2 ** 20
