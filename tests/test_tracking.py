"""Experiment tracking (runtime.tracking): a tiny generated program run with `--mlflow file:...` and with `--wandb`
offline, and the stored runs read back: the config holds the plan and the compiler's predictions (as `scalec plan
--json` prints them), the metrics the losses the `--metrics` file has, the summary the final loss; a resumed run
continues the same tracked run; a missing package or a failing backend is one line."""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import struct
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from compiler import codegen
from compiler.check import check_text
from compiler.pipeline import compile_spec
from compiler.report import plan as RP
from runtime import tracking
from runtime.config import Data, Optim, Parallel
from runtime.train import Config
from tests.test_train_log import _run

ROOT = Path(__file__).resolve().parents[1]
TINY = (ROOT / "samples" / "tiny_gpt.scale").read_text()

# Python's own sockets refuse anything but loopback and local sockets in the program, and say so: W&B offline and
# MLflow's file store must reach no network (W&B's wandb-core is a separate process: offline it uploads nothing).
_NO_NETWORK = r"""
import ipaddress, os, runpy, socket, sys
real = socket.socket.connect
def connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        host = address[0]
        try:
            local = ipaddress.ip_address(host).is_loopback
        except ValueError:
            local = host == "localhost"
        if not local:
            with open(os.environ["NETWORK_OUT"], "a") as f:
                f.write(f"{host}\n")
            raise OSError("network refused by the test")
    return real(self, address)
socket.socket.connect = connect
sys.argv = [sys.argv[1]] + sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny program and what `scalec plan --json` predicts for it."""
    out = tmp_path_factory.mktemp("tiny")
    compiled = compile_spec(check_text(TINY, "tiny_gpt.scale"))
    codegen.emit(compiled, str(out))
    return out, RP.plan_json(compiled)


BACKENDS = [name for name in ("mlflow", "wandb") if importlib.util.find_spec(name) is not None]
"""The backends installed here: one program run tracks in all of them, and each test reads back its own."""


def _track(program_dir, out_dir, *flags):
    """Run the program with no W&B or MLflow settings from the environment (W&B's default, offline, is what is
    tested), no telemetry and no network for Python's sockets; return its output and its --metrics records."""
    metrics, refused = out_dir / "m.jsonl", out_dir / "network.txt"
    with pytest.MonkeyPatch.context() as mp:
        for key in list(os.environ):
            if key.startswith(("WANDB_", "MLFLOW_")):
                mp.delenv(key)
        mp.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
        mp.setenv("DO_NOT_TRACK", "1")
        out = _run(program_dir, "--metrics", str(metrics), *flags, wrapper=_NO_NETWORK,
                   env={"NETWORK_OUT": str(refused)})
    assert not refused.exists(), refused.read_text()
    return out, [json.loads(line) for line in metrics.read_text().splitlines()]


def _flags(out_dir: Path, resumable: bool) -> list:
    """Every installed backend's flags: MLflow in a file store (or, resumable, a plain directory: its file: URI),
    W&B in DIR/wb (or, resumable, the checkpoint directory, its default)."""
    flags = []
    if "mlflow" in BACKENDS:
        flags += ["--mlflow", str(out_dir / "mlruns") if resumable else f"file:{out_dir / 'mlruns'}"]
    if "wandb" in BACKENDS:
        flags += ["--wandb", "scalec-test"] + ([] if resumable else ["--wandb-dir", str(out_dir / "wb")])
    return flags


@pytest.fixture(scope="module")
def fresh(tiny, tmp_path_factory):
    """One run of 4 steps tracked in every installed backend: (its directory, output, --metrics records)."""
    if not BACKENDS:
        pytest.skip("neither mlflow nor wandb is installed")
    out_dir = tmp_path_factory.mktemp("fresh")
    out, records = _track(tiny[0], out_dir, "--steps", "4", *_flags(out_dir, resumable=False))
    return out_dir, out, records


@pytest.fixture(scope="module")
def resumed(tiny, tmp_path_factory):
    """A run of 4 steps stopped after 2 (checkpointing) and resumed, tracked in every installed backend: (its
    directory, the resumed part's output, the --metrics records)."""
    if not BACKENDS:
        pytest.skip("neither mlflow nor wandb is installed")
    out_dir = tmp_path_factory.mktemp("resumed")
    flags = ["--steps", "4", "--checkpoint-dir", str(out_dir / "ckpt"), *_flags(out_dir, resumable=True)]
    _track(tiny[0], out_dir, *flags, "--stop-after", "2")
    out, records = _track(tiny[0], out_dir, *flags)
    return out_dir, out, records


def _assert_predictions(predicted: dict, plan_json: dict) -> None:
    """The tracked predictions are the compiler's: the program's CONFIG holds them rounded for printing."""
    assert predicted["step_time_s"] == pytest.approx(plan_json["predicted"]["step_time_s"], rel=1e-3)
    assert predicted["tokens_per_s"] == pytest.approx(plan_json["predicted"]["tokens_per_s"], rel=1e-3)
    assert predicted["mfu"] == pytest.approx(plan_json["predicted"]["mfu"], rel=1e-3)
    assert predicted["peak_memory_bytes"] == plan_json["memory"]["peak_bytes"]
    assert predicted["tokens_per_step"] == plan_json["tokens_per_step"]


# -- MLflow ------------------------------------------------------------------------------------------------------------


def _mlflow_runs(store: Path, name: str, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=f"file:{store}")
    exp = client.get_experiment_by_name(name)
    assert exp is not None, f"no experiment {name} in {store}"
    return client, client.search_runs([exp.experiment_id])


@pytest.mark.e2e
def test_mlflow_run_holds_the_plan_predictions_and_the_losses(tiny, fresh, monkeypatch):
    pytest.importorskip("mlflow")
    program, plan_json = tiny
    out_dir, _, records = fresh
    store = out_dir / "mlruns"
    client, runs = _mlflow_runs(store, "tiny_gpt", monkeypatch)
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    params = run.data.params
    _assert_predictions({k.removeprefix("predicted."): json.loads(v) for k, v in params.items()
                         if k.startswith("predicted.") and k != "predicted.device"}, plan_json)
    # the plan, and the settings as run (--steps 4 overrides the file's 30)
    assert json.loads(params["plan.plan.axes.dp"]) == plan_json["plan"]["axes"]["dp"]
    assert params["plan.plan.schedule"] == plan_json["plan"]["schedule"]
    assert params["program.steps"] == "4" and params["program.data.global_batch"] == "8"
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == \
        [(r["step"], r["loss"]) for r in records]
    assert run.data.metrics["summary/final_loss"] == records[-1]["loss"]
    assert run.data.metrics["summary/predicted_step_time_s"] == pytest.approx(
        plan_json["predicted"]["step_time_s"], rel=1e-3)
    # the nested config and plan.json itself, as artifacts
    artifacts = store / run.info.experiment_id / run.info.run_id / "artifacts"
    config = json.loads((artifacts / "config.json").read_text())
    assert config["plan"]["plan"] == plan_json["plan"]
    assert json.loads((artifacts / "plan.json").read_text()) == json.loads((program / "plan.json").read_text())


@pytest.mark.e2e
def test_mlflow_resumed_run_continues_the_same_run(resumed, monkeypatch):
    pytest.importorskip("mlflow")
    out_dir, out, records = resumed
    store, ckpt = out_dir / "mlruns", out_dir / "ckpt"
    assert "resuming MLflow run" in out
    client, runs = _mlflow_runs(store, "tiny_gpt", monkeypatch)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert json.loads((ckpt / tracking.IDS_FILE).read_text())["mlflow"]["run_id"] == runs[0].info.run_id
    steps = sorted(m.step for m in client.get_metric_history(runs[0].info.run_id, "train/loss"))
    assert steps == [1, 2, 3, 4]
    assert [r["step"] for r in records] == [1, 2, 3, 4]


# -- W&B, offline ---------------------------------------------------------------------------------------------------


def _wandb_records(path: str) -> list:
    """The protobuf records of an offline run's `run-ID.wandb` file: W&B's header (":W&B", a magic number, a
    version: 7 bytes), then LevelDB's log format: 32 KiB blocks of chunks, each `crc32c (4), length (2), type (1)`
    (1 whole, 2 first, 3 middle, 4 last), a block's tail too short for a chunk header padded with zeros."""
    from wandb.proto import wandb_internal_pb2 as pb
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    block, pos, pending, out = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:  # zero padding to the block's end
            pos += left
            continue
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def _wandb_run(run_dir: str) -> dict:
    """An offline run read back: its id, project, config, history (step -> scalars) and summary."""
    got = {"config": {}, "history": {}, "summary": {}}
    for record in _wandb_records(glob.glob(os.path.join(run_dir, "run-*.wandb"))[0]):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            got.update(id=record.run.run_id, project=record.run.project)
            got["config"].update({i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            got["config"].update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            got["history"][row["_step"]] = row
        elif kind == "summary":
            got["summary"].update({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                   for i in record.summary.update})
    return got


@pytest.mark.e2e
def test_wandb_offline_run_holds_the_plan_predictions_and_the_losses(tiny, fresh):
    pytest.importorskip("wandb")
    _, plan_json = tiny
    out_dir, out, records = fresh
    runs = glob.glob(str(out_dir / "wb" / "wandb" / "offline-run-*"))
    assert len(runs) == 1, out
    run = _wandb_run(runs[0])
    assert run["project"] == "scalec-test"
    config = run["config"]
    _assert_predictions(config["predicted"], plan_json)
    assert config["plan"]["plan"] == plan_json["plan"]
    assert config["program"]["steps"] == 4 and config["run"]["world_size"] == 1
    assert [(step, row["train/loss"]) for step, row in sorted(run["history"].items())] == \
        [(r["step"], r["loss"]) for r in records]
    assert run["summary"]["final_loss"] == records[-1]["loss"]
    assert run["summary"]["predicted_step_time_s"] == pytest.approx(plan_json["predicted"]["step_time_s"],
                                                                     rel=1e-3)


@pytest.mark.e2e
def test_wandb_resumed_run_keeps_its_id(resumed):
    pytest.importorskip("wandb")
    out_dir, out, _ = resumed
    ckpt = out_dir / "ckpt"  # the W&B run directory's default
    run_id = json.loads((ckpt / tracking.IDS_FILE).read_text())["wandb"]
    assert f"resuming W&B run {run_id} at step 2 (offline" in out
    parts = sorted(glob.glob(str(ckpt / "wandb" / "offline-run-*")))
    assert len(parts) == 2 and all(p.endswith(run_id) for p in parts)
    first, second = (_wandb_run(p) for p in parts)
    assert first["id"] == second["id"] == run_id
    assert sorted(first["history"]) == [1, 2] and sorted(second["history"]) == [3, 4]
    assert second["config"]["run"]["start_step"] == 2


# -- one line, never a traceback ---------------------------------------------------------------------------------------


def _cfg():
    return Config(name="m", source="m.scale", steps=3, seed=0, parallel=Parallel(axes=(("dp", 1),)),
                  optim=Optim(lr=1e-3), data=Data(global_batch=2, seq_len=4, vocab=8))


def test_missing_packages_are_one_line_each(monkeypatch, capsys):
    for name in ("wandb", "mlflow", "mlflow.tracking", "torch.utils.tensorboard"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed
    args = SimpleNamespace(tensorboard="tb", wandb="proj", wandb_dir=None, mlflow="file:x")
    track = tracking.open_tracking(args, _cfg(), world_size=1, device="cpu", start=0)
    assert track.trackers == []
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3, lines
    assert "(pip install wandb)" in lines[1] and "(pip install mlflow-skinny)" in lines[2]
    assert "(pip install tensorboard)" in lines[0]
    track.log(1, {"train/loss": 1.0})  # with no backend: nothing to do, nothing raised
    track.finish()


class _Recorder(tracking.Tracker):
    def __init__(self, flag, fail_on=None):
        self.flag, self.fail_on, self.calls = flag, fail_on, []

    def start(self, config):
        self.calls.append(("start", config))

    def log(self, step, scalars):
        if self.fail_on == "log":
            raise ConnectionError("server went away\nsecond line")
        self.calls.append(("log", step, scalars))

    def finish(self, summary, failed=False):
        self.calls.append(("finish", summary, failed))


def test_a_failing_backend_is_dropped_in_one_line_and_the_others_go_on(capsys):
    good, bad = _Recorder("--good"), _Recorder("--mlflow http://x", fail_on="log")
    track = tracking.Tracking([bad, good], {"step_time_s": 0.5, "tokens_per_step": 100})
    track.start({"a": 1})
    for step, (loss, dt) in enumerate([(3.0, 9.0), (2.0, 1.0), (1.5, 2.0)], 1):
        track.log(step, {"train/loss": loss, "train/step_time": dt})
    track.log(3, {"eval/loss": 1.7, "eval/ppl": 5.5})  # any named scalars flow through
    track.finish({"peak_memory_bytes": 7})
    out = capsys.readouterr().out.splitlines()
    assert out == ["scalec: --mlflow http://x: ConnectionError: server went away; tracking stops there"]
    assert track.trackers == [good]
    assert good.calls[-2] == ("log", 3, {"eval/loss": 1.7, "eval/ppl": 5.5})
    kind, summary, failed = good.calls[-1]
    # the measured step time is the median of the intervals after the first (which holds the start-up)
    assert summary == {"final_loss": 1.5, "final_step": 3, "measured_step_time_s": 1.5,
                       "measured_tokens_per_s": 100 / 1.5, "predicted_step_time_s": 0.5,
                       "measured_over_predicted_step_time": 3.0, "peak_memory_bytes": 7}
    assert kind == "finish" and not failed


def test_a_failed_training_marks_its_runs_failed():
    rec = _Recorder("--x")
    track = tracking.Tracking([rec])
    tracking._OPEN.add(track)
    tracking.abandon()
    assert rec.calls[-1][0] == "finish" and rec.calls[-1][2] is True
    assert track not in tracking._OPEN
    track.finish()  # once only
    assert len(rec.calls) == 1


def test_flatten_and_uris():
    flat = tracking.flatten({"plan": {"axes": {"dp": 2}, "layout": [], "tp": {}}, "name": "m", "x": "y" * 7000})
    assert flat["plan.axes.dp"] == "2" and flat["plan.layout"] == "[]" and flat["plan.tp"] == "{}"
    assert flat["name"] == "m" and len(flat["x"]) == 6000 and flat["x"].endswith("(cut)")
    assert tracking.mlflow_uri("file:./mlruns") == "file:./mlruns"
    assert tracking.mlflow_uri("http://host:5000") == "http://host:5000"
    assert tracking.mlflow_uri("runs") == "file:" + os.path.abspath("runs")


def test_init_weights_facts_reach_the_config(tmp_path):
    from runtime.hf import Loaded
    loaded = [Loaded(path="/w", names=("a", "b"), tensors_read=2, tensors=5, bytes_read=10, bytes=40),
              Loaded(path="/w", names=("c",), tensors_read=1, tensors=5, bytes_read=6, bytes=40)]
    config = tracking.run_config(_cfg(), world_size=2, device="cpu", start=0, plan=None, loaded=loaded)
    assert config["init"] == {"path": "/w", "parameters": 3, "tensors": 5, "bytes": 40, "tensors_read_rank0": 3,
                              "bytes_read_rank0": 16}
    assert "plan" not in config and config["program"]["steps"] == 3 and "sources" not in config["program"]


def test_scalec_run_passes_the_tracking_flags_to_the_program(monkeypatch):
    from compiler.cli import launch_command, main
    seen = {}

    def capture(args):  # the namespace `scalec run` would hand cmd_run
        seen["args"] = args
        return 0
    monkeypatch.setattr("compiler.cli.cmd_run", capture)
    assert main(["run", "f.scale", "--", "--wandb", "my project", "--wandb-dir", "wb", "--mlflow",
                 "file:./mlruns"]) == 0
    cmd, _ = launch_command(seen["args"], 1, "out", {})
    assert cmd[2:] == ["--wandb", "my project", "--wandb-dir", "wb", "--mlflow", "file:./mlruns"]
