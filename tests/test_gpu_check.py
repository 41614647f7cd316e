"""bench/gpu_check: the CPU dry run keeps the prepared GPU check from rotting (every section runs, every row is a
measurement or a named refusal, the record is one that compiler/layout/devices.py reads), and the H200 record it
wrote is readable and holds what the note quotes."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from compiler.layout.devices import CALIBRATED, DEVICES, CalibrationError, calibration

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "bench" / "results" / "gpu_check_h200_2026-11-28.json"


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check") / "gpu_check.json"
    proc = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--device", "cpu", "--quick", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def test_dry_run_measures_every_section(dry_run):
    record, printed = dry_run
    kinds = {r["kind"] for r in record["kernels"] if "rate" in r}
    assert {"memory", "matmul", "attention", "fp8", "overlap"} <= kinds
    assert "of the shorter hidden" in printed  # the grouped GEMM beside a copy (issue 44's one-GPU overlap)
    for r in record["kernels"]:  # a measurement (finite, positive) or a named refusal, never a silent gap
        assert ("rate" in r and math.isfinite(r["rate"]) and r["rate"] > 0 and r["ms"] > 0) or r.get("error"), r
    columns = {r["column"]: r for r in record["programs"]}
    assert set(columns) == {"ours_eager", "hand_eager"}
    for r in columns.values():
        assert r.get("error") is None and r["median_ms"] > 0 and 0 < r["mfu"] < 1
    ours = columns["ours_eager"]
    assert ours["predicted_step_ms"] > 0 and ours["predicted_step_ms_calibrated"] > 0
    assert ours["predicted_peak_bytes"] > 0
    # the program's own energy reading beside the prediction field, or why there is none: never a zero
    assert ours["predicted_joules_per_step"] == [] or all(j > 0 for _, j in ours["predicted_joules_per_step"])
    if "energy_j_per_step" in ours:
        assert ours["energy_j_per_step"] > 0 and ours["energy_counter"] == "RAPL"
    else:
        assert ours["energy"].startswith("not measured: ") and "energy (the generated program's own" in printed
        assert ours["energy"] in printed
    assert "energy" not in columns["hand_eager"] and "energy_j_per_step" not in columns["hand_eager"]
    assert "programs (median" in printed and "calibration:" in printed
    train, extend = record["resume"]  # a checkpoint saved, then a longer run resumed from it
    assert train["ok"] and not train["resumed"] and extend["ok"] and extend["resumed"], record["resume"]


def test_dry_run_record_is_read_as_calibration(dry_run):
    record, _ = dry_run
    kind, figures = calibration(record)
    # every measured figure, but an efficiency measured above the `cpu` entry's rough peak (a quiet machine's matmul
    # can beat 0.1 TFLOP/s), which the record names instead
    assert kind == "cpu" and set(figures) | set(record["calibration"].get("above_peak", [])) == set(CALIBRATED)
    assert figures["hbm_gbps"] == record["calibration"]["hbm_gbps"]


def test_calibration_refuses_what_is_not_a_record():
    good = {"format": 1, "date": "2026-11-28", "torch": "2.11.0",
            "calibration": {"device": "h200", "matmul_efficiency": 0.79}}
    assert calibration(good) == ("h200", {"matmul_efficiency": 0.79})
    for bad in ({**good, "format": 2}, {**good, "date": ""},
                {**good, "calibration": {"device": "tpu", "matmul_efficiency": 0.79}},
                {**good, "calibration": {"device": "h200", "matmul_efficiency": 1.5}},
                {**good, "calibration": {"device": "h200", "peak_tflops": 2000}}):
        with pytest.raises(CalibrationError):
            calibration(bad)


def test_h200_record():
    """The record of 2026-11-28 (torch 2.11, one H200): what the issue's note quotes, readable as calibration,
    and its eager programs' measured peaks within 1% of plan's prediction."""
    record = json.loads(RECORD.read_text())
    kind, figures = calibration(record)
    assert kind == "h200" and record["torch"].startswith("2.11")
    assert 0.7 < figures["matmul_efficiency"] <= DEVICES["h200"].matmul_efficiency * 1.05
    eager = [r for r in record["programs"] if r["column"] == "ours_eager"]
    assert len(eager) == 3 and all(abs(r["peak_measured_over_predicted"] - 1) < 0.01 for r in eager)


def test_energy_figures_weigh_the_steady_intervals_by_their_steps():
    from bench.gpu_check import energy_figures
    records = [{"step": 1, "energy_window": [1, 1], "energy_j_per_step": 900.0},  # the first step: warm-up
               {"step": 2}, {"step": 10, "energy_window": [2, 10], "energy_j_per_step": 500.0},  # warm-up in it
               {"step": 20, "energy_window": [11, 20], "energy_j_per_step": 300.0},
               {"step": 25, "energy_window": [21, 25], "energy_j_per_step": 330.0}]
    got = energy_figures(records, 10, "cuda", ((0, 250.0),))
    # (300 J × 10 steps + 330 J × 5 steps) / 15 steps = 310 J/step, against 250 predicted
    assert got == {"predicted_joules_per_step": [[0, 250.0]], "energy_j_per_step": pytest.approx(310.0),
                   "energy_counter": "NVML", "energy_steps": [11, 25],
                   "energy_measured_over_predicted": pytest.approx(1.24)}
    assert "energy_measured_over_predicted" not in energy_figures(records, 10, "cuda", ())
