"""runtime.energy against a stand-in pynvml and a powercap tree in a temporary folder (no GPU and no RAPL here):
joules per step from the counters' deltas, RAPL's wrap undone, a counter that goes backwards reported and its
interval not used, a missing counter said in one line with no figure (never 0), rank 0's line with and without a
prediction, and the line a real CPU run prints on this host."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from runtime import energy, health
from runtime.config import Config, Data, Optim, Parallel

ROOT = Path(__file__).resolve().parents[1]
GPU = types.SimpleNamespace(type="cuda", index=0)
CPU = types.SimpleNamespace(type="cpu", index=None)


class _NVMLError(Exception):
    def __init__(self, value: int, text: str):
        super().__init__(text)
        self.value = value


def _nvml(counts=None, error: _NVMLError | None = None, missing: bool = False, init_error=None):
    """A pynvml whose energy counter reads `counts` in turn (millijoules; the first is open_nvml's trial read), or
    raises `error`; without the function where `missing`; whose nvmlInit raises `init_error`."""
    m = types.ModuleType("pynvml")
    m.NVMLError, m.NVML_ERROR_NOT_SUPPORTED, m.NVML_ERROR_NO_PERMISSION = _NVMLError, 3, 4
    it = iter(counts or ())

    def init():
        if init_error:
            raise init_error
    m.nvmlInit = init
    m.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    if not missing:
        def total(handle):
            assert handle == ("handle", 0)
            if error is not None:
                raise error
            return next(it)
        m.nvmlDeviceGetTotalEnergyConsumption = total
    return m


@pytest.fixture(autouse=True)
def _gpu_zero(monkeypatch):
    monkeypatch.setattr(health, "nvml_index", lambda nvml, i: i)  # no torch.cuda here to ask for the UUID


def _powercap(root: Path, packages: dict, ranges: dict | None = None, subzones: bool = True) -> Path:
    """A powercap tree: `packages[n]` is package n's energy_uj; with its core subzone and a psys zone, which are not
    read (parts of the package, or the platform over the packages)."""
    for n, uj in packages.items():
        z = root / f"intel-rapl:{n}"
        z.mkdir(parents=True)
        (z / "name").write_text(f"package-{n}\n")
        (z / "energy_uj").write_text(f"{uj}\n")
        if ranges is None or n in ranges:
            (z / "max_energy_range_uj").write_text(f"{(ranges or {}).get(n, 262143328850)}\n")
        if subzones:
            (root / f"intel-rapl:{n}:0").mkdir()
            (root / f"intel-rapl:{n}:0" / "name").write_text("core\n")
            (root / f"intel-rapl:{n}:0" / "energy_uj").write_text("999999999\n")
    if subzones:
        (root / "intel-rapl:9").mkdir()
        (root / "intel-rapl:9" / "name").write_text("psys\n")
        (root / "intel-rapl:9" / "energy_uj").write_text("888888888\n")
    return root


def _set(root: Path, n: int, uj: int) -> None:
    (root / f"intel-rapl:{n}" / "energy_uj").write_text(f"{uj}\n")


# -- one rank's meter ------------------------------------------------------------------------------------------


def test_nvml_deltas_give_joules_per_step():
    # millijoules since the driver loaded: 1,000 J at the start, +3,000 J over steps 1-3, +250 J over step 4
    counter, missing = energy.open_nvml(0, _nvml([1_000_000, 1_000_000, 4_000_000, 4_250_000]))
    assert missing is None and counter.source == "NVML" and counter.what == "GPU 0"
    meter = energy.Meter(counter, say=pytest.fail)
    meter.start(0)
    assert meter.lap(3) == pytest.approx(1000.0)  # 3,000 J / 3 steps
    assert meter.lap(4) == pytest.approx(250.0)


def test_an_evaluation_between_laps_is_left_out():
    # 0 → 600 J (steps 1-2), evaluation 600 → 5,600 J, then 5,600 → 6,000 J (step 3): 1,000 J over 3 steps
    counter, _ = energy.open_nvml(0, _nvml([0, 0, 600_000, 5_600_000, 6_000_000]))
    meter = energy.Meter(counter, say=pytest.fail)
    meter.start(0)
    meter.pause()
    meter.resume()
    assert meter.lap(3) == pytest.approx(1000.0 / 3)


def test_a_counter_that_goes_backwards_is_reported_and_not_used():
    said = []
    counter, _ = energy.open_nvml(0, _nvml([5_000_000, 5_000_000, 7_000_000, 1_000_000, 1_400_000]))
    meter = energy.Meter(counter, rank=3, say=said.append)
    meter.start(0)
    assert meter.lap(2) == pytest.approx(1000.0)
    assert meter.lap(4) is None  # the driver reloaded between: no figure, and the line says why
    assert said == ["scalec: energy: rank 3: NVML's counter of GPU 0 went backwards (7,000.0 J → 1,000.0 J; the "
                    "driver reloaded?) — steps 3-4 not measured"]
    assert meter.lap(6) == pytest.approx(200.0)  # measured again from the new baseline
    assert len(said) == 1


@pytest.mark.parametrize("nvml, why", [
    (None, "no NVML (pip install nvidia-ml-py)"),
    (_nvml(error=_NVMLError(3, "Not Supported")),
     "GPU 0's energy counter: not supported on this GPU (NVML has it from Volta on)"),
    (_nvml(error=_NVMLError(4, "Insufficient Permissions")),
     "GPU 0's energy counter: no permission (Insufficient Permissions)"),
    (_nvml(missing=True), "this pynvml has no nvmlDeviceGetTotalEnergyConsumption (pip install -U nvidia-ml-py)"),
    (_nvml(init_error=_NVMLError(9, "Driver Not Loaded")), "NVML did not start (Driver Not Loaded)"),
])
def test_a_missing_nvml_counter_is_one_line_and_no_value(monkeypatch, nvml, why):
    if nvml is None:
        monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    said = []
    ctx = types.SimpleNamespace(rank=0, world_size=1, device=GPU, coords={}, is_logger=True)
    e = energy.Energy(_cfg(), ctx, 0, nvml=nvml, say=said.append)
    assert said == [f"scalec: energy: not measured: {why}"]
    for step in (1, 5, 10):
        assert e.lap(step) == {}  # no energy field at all, never a 0
        e.say()
    assert len(said) == 1


def test_rapl_sums_the_packages_and_undoes_a_wrap(tmp_path):
    root = _powercap(tmp_path, {0: 1_000_000, 1: 262_143_000_000}, ranges={0: 262_143_328_850, 1: 262_143_328_850})
    counter, missing = energy.open_rapl(str(root))
    assert missing is None and counter.what == "2 CPU packages"
    meter = energy.Meter(counter, say=pytest.fail)
    meter.start(0)
    _set(root, 0, 31_000_000)   # +30 J
    _set(root, 1, 9_671_150)    # wrapped: 328,850 µJ to the range's end, then 9,671,150 µJ: +10 J
    assert meter.lap(4) == pytest.approx(40.0 / 4)
    _set(root, 0, 43_000_000)   # +12 J, package 1 idle
    assert meter.lap(5) == pytest.approx(12.0)


def test_rapl_without_a_range_reports_a_counter_that_went_down(tmp_path):
    said = []
    root = _powercap(tmp_path, {0: 50_000_000}, ranges={}, subzones=False)
    counter, _ = energy.open_rapl(str(root))
    meter = energy.Meter(counter, say=said.append)
    meter.start(10)
    _set(root, 0, 20_000_000)
    assert meter.lap(20) is None
    assert said == ["scalec: energy: rank 0: RAPL's counter of 1 CPU package went backwards (50.0 J → 20.0 J; no "
                    "max_energy_range_uj to undo a wrap) — steps 11-20 not measured"]


def test_rapl_missing_or_unreadable_says_which(tmp_path, monkeypatch):
    assert energy.open_rapl(str(tmp_path / "absent")) == (
        None, f"no RAPL powercap on this host (no {tmp_path / 'absent'})")
    (tmp_path / "empty").mkdir()
    assert "no RAPL package zone" in energy.open_rapl(str(tmp_path / "empty"))[1]
    root = _powercap(tmp_path / "locked", {0: 1})
    real = energy._read_int

    def locked(path):  # as Linux 5.10 on leaves energy_uj to a user (root reads any file: the mode is no test here)
        if path.endswith("energy_uj"):
            raise PermissionError(13, "Permission denied", path)
        return real(path)
    monkeypatch.setattr(energy, "_read_int", locked)
    counter, why = energy.open_rapl(str(root))
    assert counter is None and "readable by root only" in why and "CVE-2020-8694" in why


def test_a_counter_gone_mid_run_is_said_once():
    said = []
    meter = energy.Meter(energy.Counter("RAPL", "1 CPU package", _gone, 1e-6, (None,), (OSError,)), 2, said.append)
    meter.start(0)
    assert meter.lap(1) is None and meter.lap(2) is None
    assert said == ["scalec: energy: rank 2: RAPL's counter of 1 CPU package cannot be read any more (gone) — "
                    "energy not measured from here on"]


def _gone():
    raise OSError("gone")


# -- rank 0's lines ---------------------------------------------------------------------------------------------


def _gpu(pp=0, host="a"):
    return {"source": "NVML", "what": "GPU 0", "missing": None, "host": host, "pp": pp}


def test_the_gpu_line_without_a_prediction():
    world = [_gpu(0), _gpu(0), _gpu(1), {"source": None, "what": None, "missing": "no NVML", "host": "a", "pp": 1}]
    fields, line = energy.interval([300.0, 310.0, 250.0, None], world, {}, 11, 20)
    assert fields == {"energy_window": [11, 20], "energy_j_per_step": 300.0, "energy_j_per_step_sum": 860.0}
    assert line == ("scalec: energy steps 11-20: rank 0 300.0 J/step, 3 of 4 ranks 860.0 J/step (NVML, each "
                    "rank's GPU)")
    assert energy.startup_line(world) == ("scalec: energy: measured by NVML's total energy counter of each rank's "
                                          "own GPU on 3 of 4 ranks; not measured on rank 3 (no NVML)")


def test_the_gpu_line_beside_the_prediction_of_each_pp_rank():
    world = [_gpu(0), _gpu(0), _gpu(1), _gpu(1)]
    fields, line = energy.interval([300.0, 310.0, 250.0, 270.0], world, {0: 250.0, 1: 260.0}, 1, 10)
    # pp 0: (300 + 310) / 2 = 305 against 250; pp 1: 260 against 260; the job: 1,130 against 1,020
    assert line == ("scalec: energy steps 1-10: rank 0 300.0 J/step, 4 of 4 ranks 1,130.0 J/step (NVML, each rank's "
                    "GPU); pp 0 305.0 J/step per GPU, predicted 250.0 (1.22×); pp 1 260.0 J/step per GPU, predicted "
                    "260.0 (1.00×)")
    assert fields["energy_measured_over_predicted"] == pytest.approx(1130 / 1020)
    assert fields["energy_j_per_step_sum"] == pytest.approx(1130.0)


def test_rank_0_unmeasured_has_no_figure_of_its_own():
    world = [{"source": None, "what": None, "missing": "no NVML", "host": "a", "pp": 0}, _gpu(0)]
    fields, line = energy.interval([None, 123.0], world, {0: 100.0}, 5, 5)
    assert "energy_j_per_step" not in fields and fields["energy_j_per_step_sum"] == 123.0
    assert line.startswith("scalec: energy steps 5-5: 1 of 2 ranks 123.0 J/step") and "(1.23×)" in line
    assert energy.interval([None, None], world, {0: 100.0}, 6, 9) == (
        {}, "scalec: energy steps 6-9: not measured on any rank")


def test_rapl_counts_each_host_once_and_divides_nothing():
    cpu = {"source": "RAPL", "what": "2 CPU packages", "missing": None, "pp": 0}
    world = [dict(cpu, host="a"), dict(cpu, host="a"), dict(cpu, host="b"), dict(cpu, host="b")]
    fields, line = energy.interval([80.0, 80.5, 60.0, 60.0], world, {}, 1, 3)
    assert fields["energy_j_per_step"] == 80.0 and fields["energy_j_per_step_sum"] == 140.0  # hosts a + b, once each
    assert line == ("scalec: energy steps 1-3: 140.0 J/step on 2 hosts' CPU packages (RAPL: whole sockets, shared "
                    "by the job's 4 ranks there)")
    fields, line = energy.interval([80.0, 80.5, 60.0, 60.0], world, {0: 20.0}, 1, 3)
    assert fields["energy_measured_over_predicted"] == pytest.approx(140 / 80)
    assert line.endswith("; predicted 80.0 J/step for the job's 4 devices (1.75×: the packages' whole draw against "
                         "the plan's devices)")
    start = energy.startup_line(world)
    assert start.startswith("scalec: energy: measured by RAPL (powercap) on 2 hosts (a: 2 CPU packages, 2 ranks, b: "
                            "2 CPU packages, 2 ranks): whole sockets, every process on them counts")
    assert "not divided among them" in start


def test_the_not_measured_line_names_each_reason():
    world = [{"source": None, "what": None, "missing": why, "host": "a", "pp": 0}
             for why in ("no NVML", "no NVML", "no NVML", "GPU 3's energy counter: not supported")]
    assert energy.startup_line(world) == ("scalec: energy: not measured: ranks 0-2: no NVML; rank 3: GPU 3's "
                                          "energy counter: not supported")
    assert energy.startup_line(world[:2]) == "scalec: energy: not measured on any of the 2 ranks: no NVML"


def test_the_trackers_get_the_figures_only_where_measured():
    from runtime import progress
    record = {"step": 10, "loss": 2.0, "energy_window": [1, 10], "energy_j_per_step": 300.0,
              "energy_j_per_step_sum": 1130.0, "energy_measured_over_predicted": 1.1}
    got = progress.train_scalars(record)
    assert {k: got[k] for k in got if "energy" in k} == {"train/energy_j_per_step": 300.0,
                                                         "train/energy_j_per_step_sum": 1130.0,
                                                         "train/energy_measured_over_predicted": 1.1}
    assert not [k for k in progress.train_scalars({"step": 10, "loss": 2.0}) if "energy" in k]


def test_the_names_are_nvml_s_own():
    """Where nvidia-ml-py is installed (the `gpu` extra): the function read here and the two error codes named."""
    pynvml = pytest.importorskip("pynvml")
    assert callable(pynvml.nvmlDeviceGetTotalEnergyConsumption)
    assert (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_NO_PERMISSION) == (
        energy.NVML_ERROR_NOT_SUPPORTED, energy.NVML_ERROR_NO_PERMISSION)


# -- the runtime contract and a real run -------------------------------------------------------------------------


def _cfg(**kw) -> Config:
    return Config(name="t", source="t.scale", steps=10, seed=0, parallel=Parallel(axes=(("dp", 1),)),
                  optim=Optim(lr=1e-3), data=Data(global_batch=1, seq_len=4, vocab=8), **kw)


def test_the_prediction_is_read_from_the_contract(tmp_path):
    assert _cfg().predicted_joules_per_step == ()
    root = _powercap(tmp_path, {0: 0})
    said = []
    ctx = types.SimpleNamespace(rank=0, world_size=1, device=CPU, coords={}, is_logger=True)
    e = energy.Energy(_cfg(predicted_joules_per_step=((0, 5.0),)), ctx, 0, powercap=str(root), say=said.append)
    _set(root, 0, 40_000_000)  # 40 J over 4 steps
    fields = e.lap(4)
    e.say()
    e.say()  # once
    assert fields["energy_j_per_step"] == pytest.approx(10.0) and fields["energy_measured_over_predicted"] == 2.0
    assert said[1:] == ["scalec: energy steps 1-4: 10.0 J/step on 1 host's CPU packages (RAPL: whole sockets, shared "
                        "by the job's 1 rank there); predicted 5.0 J/step for the job's 1 device (2.00×: the "
                        "packages' whole draw against the plan's devices)"]


def _two_ranks(root: str, rank: int, _collectives) -> None:
    """Rank 0 reads a powercap tree, rank 1 none: rank 0's start-up line names rank 1's reason, and its interval
    figures are its own alone (rank 1 sends no number, not a zero)."""
    said = []
    import torch
    ctx = types.SimpleNamespace(rank=rank, world_size=2, device=torch.device("cpu"), coords={"dp": rank},
                                is_logger=rank == 0)
    e = energy.Energy(_cfg(), ctx, 0, powercap=root if rank == 0 else root + "-absent", say=said.append)
    assert e.on  # both ranks gather: one of them measures
    if rank == 0:
        _set(Path(root), 0, 20_000_000)  # 20 J over 2 steps
    fields = e.lap(2)
    e.say()
    if rank == 1:
        assert fields == {} and said == []
        return
    assert fields == {"energy_window": [1, 2], "energy_j_per_step": 10.0, "energy_j_per_step_sum": 10.0}
    assert said[0].endswith(f"; not measured on rank 1 (no RAPL powercap on this host (no {root}-absent))")
    assert said[1].startswith("scalec: energy steps 1-2: 10.0 J/step on 1 host's CPU packages")
    assert "shared by the job's 2 ranks there" in said[1]  # both ranks are on this host, rank 1 reads nothing


@pytest.mark.e2e
def test_two_ranks_gather_what_each_measured(tmp_path):
    import functools

    from tests import multirank
    root = _powercap(tmp_path / "powercap", {0: 0})
    multirank.spawn(functools.partial(_two_ranks, str(root)), world=2, axes=(), timeout=60)


@pytest.mark.e2e
@pytest.mark.skipif(os.path.exists(energy.POWERCAP), reason="this host has a powercap tree: the line differs")
def test_a_cpu_run_says_energy_is_not_measured(tmp_path):
    """The tiny sample for 2 steps on this host (no /sys/class/powercap): the one line, and no energy field."""
    from compiler import codegen
    from compiler.check import check_text
    from compiler.pipeline import compile_spec
    from tests import multirank
    codegen.emit(compile_spec(check_text((ROOT / "samples" / "tiny_gpt.scale").read_text(), "tiny_gpt.scale")),
                 str(tmp_path))
    env = dict(os.environ, PYTHONPATH=str(ROOT), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(multirank.free_port()), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(tmp_path / "program.py"), "--steps", "2", "--metrics",
                           str(tmp_path / "m.jsonl")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = [line for line in proc.stdout.splitlines() if "energy" in line]
    assert said == [f"scalec: energy: not measured: no RAPL powercap on this host (no {energy.POWERCAP})"]
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert len(records) == 2 and not [k for r in records for k in r if k.startswith("energy")]


_TEN_WATTS = r"""
import os, runpy, sys, time
from runtime import energy
energy.POWERCAP = os.environ["FAKE_POWERCAP"]
real = energy._read_int
def read(path):  # a package that draws 10 W: 10 J a second, in microjoules
    return int(time.perf_counter() * 10e6) if path.endswith("energy_uj") else real(path)
energy._read_int = read
sys.argv = [sys.argv[1]] + sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.e2e
def test_a_run_measures_its_logged_intervals_without_its_evaluations(tmp_path):
    """The tiny sample for 6 steps, logged at 1, 3 and 6 and evaluated after 3 and 6, on a stand-in package that
    draws 10 W: each logged record's joules per step is 10 W × the mean step time of its window (both leave the
    evaluations out), and the line under each logged step (and its evaluation's) says so."""
    from compiler import codegen
    from compiler.check import check_text
    from compiler.pipeline import compile_spec
    from tests import multirank
    text = (ROOT / "samples" / "tiny_gpt.scale").read_text()
    text = text.replace("log_every    = 5", "log_every    = 3  eval_every = 3  eval_batches = 8")
    codegen.emit(compile_spec(check_text(text, "tiny_gpt.scale")), str(tmp_path))
    root = _powercap(tmp_path / "powercap", {0: 0}, subzones=False)
    env = dict(os.environ, PYTHONPATH=str(ROOT), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(multirank.free_port()), OMP_NUM_THREADS="1",
               FAKE_POWERCAP=str(root))
    proc = subprocess.run([sys.executable, "-c", _TEN_WATTS, str(tmp_path / "program.py"), "--steps", "6",
                           "--metrics", str(tmp_path / "m.jsonl")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    measured = {r["step"]: r for r in records if "energy_j_per_step" in r}
    assert sorted(measured) == [1, 3, 6] and [measured[s]["energy_window"] for s in (1, 3, 6)] == [[1, 1], [2, 3],
                                                                                                   [4, 6]]
    by_step = {r["step"]: r for r in records}
    for r in measured.values():  # with --metrics the clock laps every step: its mean over the window
        first, last = r["energy_window"]
        seconds = sum(by_step[s]["step_time"] for s in range(first, last + 1)) / (last - first + 1)
        # the clock and the counter are read a moment apart: 5% and 3 ms of the 10 W cover that (a full suite run on
        # 2 cores read them 2 ms apart: 17% of these 12 ms steps); an evaluation of 8 batches counted in, 8 forwards
        # of about a third of a step each over a window of 2 or 3 steps, would add more than 10 ms a step
        assert r["energy_j_per_step"] == pytest.approx(10 * seconds, rel=0.05, abs=0.03), (r, seconds)
        assert r["energy_j_per_step_sum"] == r["energy_j_per_step"]
    lines = proc.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("step     3/6"))
    assert lines[at + 1].startswith("eval     3/6") and lines[at + 2].startswith("scalec: energy steps 2-3: ")
    assert "J/step on 1 host's CPU packages (RAPL: whole sockets, shared by the job's 1 rank there)" in lines[at + 2]
