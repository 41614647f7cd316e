"""bench/cpu_calibration.py: its fits recover known figures, and its quick mode runs end to end (2 gloo ranks)."""
from __future__ import annotations

import json
import math

import pytest

from bench import cpu_calibration as cal


def test_alpha_beta_fit_recovers_a_known_line():
    """time = 30 us + bytes / 2 GB/s, exactly: the fit gives back alpha and beta; noise on the small sizes moves
    alpha only, not beta (beta comes from the large sizes)."""
    alpha, beta = 30e-6, 2e9
    sizes = [4 ** i for i in range(1, 14)]
    points = [{"bytes": b, "time_s": alpha + b / beta} for b in sizes]
    fit = cal.fit_alpha_beta(points)
    assert fit["alpha_us"] == pytest.approx(30.0, rel=1e-9)
    assert fit["beta_gb_s"] == pytest.approx(2.0, rel=1e-9)
    assert fit["fit_worst_rel_err"] < 1e-9
    noisy = [dict(p, time_s=p["time_s"] + (10e-6 if p["bytes"] <= 4096 else 0)) for p in points]
    fit = cal.fit_alpha_beta(noisy)
    assert fit["alpha_us"] == pytest.approx(40.0, rel=1e-9)
    assert fit["beta_gb_s"] == pytest.approx(2.0, rel=1e-9)


def test_matmul_fit_recovers_a_fixed_cost():
    peak, t0 = 50e9, 4e-6
    points = [{"flops": 2 * n ** 3, "time_s": t0 + 2 * n ** 3 / peak} for n in (64, 128, 256, 512)]
    assert cal.fit_matmul(points, peak) == pytest.approx(t0, rel=1e-9)


def test_quick_mode_measures_every_figure(tmp_path, capsys):
    out = tmp_path / "cpu.json"
    assert cal.main(["--quick", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    printed = capsys.readouterr().out
    for key in ("matmul_fp32", "matmul_bf16"):
        assert res[key]["peak_gflops"] > 0.1 and math.isfinite(res[key]["t0_us"])
        assert all(p["time_s"] > 0 for p in res[key]["points"])
    for name in ("add", "copy", "scale_inplace"):
        assert res["memory_bandwidth"][name]["gb_s"] > 0.1
    assert 0 < res["op_overhead"]["add_us"] < 1000
    ops = res["gloo"]["2"]
    assert sorted(ops) == sorted(cal.OPS)
    for op, fit in ops.items():
        assert [p["bytes"] for p in fit["points"]][-1] >= 2 ** 20, op
        assert all(p["time_s"] > 0 for p in fit["points"]), op
        assert fit["beta_gb_s"] > 0 and math.isfinite(fit["alpha_us"]), op
        assert f"{op:<16}{2:>6}" in printed
    assert "peak" in printed and "GB/s" in printed
