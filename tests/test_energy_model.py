"""The energy, dollar and carbon model (compiler/cost/energy.py) held to its definition: per rank and per phase on a
hand-checked plan, the run's figures from the step's, the inputs as the mesh writes them (compiler/layout/power.py),
and plan.json's names that tools read."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from compiler.cost import energy as E
from compiler.cost.step_time import RankTime
from compiler.layout import power as POWER
from compiler.layout.cluster import Cluster


def _cluster(nodes=2, per=2, **figures):
    dev = SimpleNamespace(kind="h100")
    return Cluster(nodes, per, dev, power=POWER.resolve("h100", figures))


def _prediction(step_s, ranks):
    return SimpleNamespace(step_time_s=step_s, ranks=tuple(ranks))


def test_a_hand_checked_two_stage_plan_per_rank_and_phase():
    # pp 2 over 4 devices on 2 nodes: 2 devices of each pp rank. pp rank 0 computes 6 s of which 1 s is tp's
    # all-reduces, waits 2 s in the schedule of which 0.5 s are exposed sends, then 1 s of dp sync and 0.5 s of
    # optimizer: it ends at 9.5 s. pp rank 1 computes 7 s (no tp), idles 1 s, syncs 1 s, 0.5 s optimizer: 9.5 s.
    r0 = RankTime("pp rank 0", 6.0, 2.0, {"tp": 1.0, "pp": 0.5, "dp": 1.0}, 9.5, sync_s=1.0, tail_s=0.5)
    r1 = RankTime("pp rank 1", 7.0, 1.0, {"dp": 1.0}, 9.5, sync_s=1.0, tail_s=0.5)
    assert E.phases(r0, 10.0) == pytest.approx((5.0 + 0.5, 1.0 + 0.5 + 1.0, 1.5, 0.5))
    assert E.phases(r1, 10.0) == pytest.approx((7.5, 1.0, 1.0, 0.5))
    cl = _cluster(active_w=700, communicating_w=300, idle_w=100, host_w=1000, network_w=500, pue=1.2,
                  usd_per_gpu_hour=2.0)
    est = SimpleNamespace(tokens_step=1000, flops_step_n=5e15)
    s = E.step(_prediction(10.0, [r0, r1]), cl, est, threshold=0.8)
    j0 = 700 * 5.5 + 300 * 2.5 + 100 * (1.5 + 0.5)   # 4,800 J a device of pp rank 0
    j1 = 700 * 7.5 + 300 * 1.0 + 100 * (1.0 + 0.5)   # 5,700 J
    assert [k.joules for k in s.ranks] == pytest.approx([j0, j1])
    assert [k.devices for k in s.ranks] == [2, 2]
    assert s.devices_j == pytest.approx(2 * j0 + 2 * j1)
    assert s.hosts_j == pytest.approx(2 * 1000 * 10.0) and s.network_j == pytest.approx(2 * 500 * 10.0)
    assert s.joules == pytest.approx(1.2 * (2 * j0 + 2 * j1 + 30_000))
    assert s.watts == pytest.approx(s.joules / 10.0)
    assert s.bubble_j == pytest.approx(1.2 * 100 * (2 * 1.5 + 2 * 1.0))
    # the straggler: the slowest rank's active time (both end at 9.5 s; pp rank 1's 7.5 s is the larger) × 0.25,
    # one device computing and three idle, the nodes' hosts and network, times PUE
    assert s.straggler_s == pytest.approx(7.5 * 0.25)
    assert s.straggler_j == pytest.approx(7.5 * 0.25 * (700 + 3 * 100 + 2 * 1500) * 1.2)
    assert s.usd == pytest.approx(4 * 10.0 / 3600 * 2.0)


def test_the_run_is_the_step_times_the_steps_over_ettr():
    r = RankTime("every rank", 1.0, 0.0, {}, 1.0)
    cl = _cluster(nodes=1, per=8, pue=1.1)
    s = E.step(_prediction(1.0, [r]), cl, SimpleNamespace(tokens_step=4096, flops_step_n=1e15))
    run = E.run(s, steps=3600, ettr=0.9, tokens=None)
    assert run.wall_s == pytest.approx(3600 / 0.9)
    assert run.days == pytest.approx(3600 / 0.9 / 86400)
    assert run.gpu_hours == pytest.approx(8 * 3600 / 0.9 / 3600)
    assert run.kwh == pytest.approx(s.joules * 3600 / 0.9 / 3.6e6)
    assert run.usd == pytest.approx(run.gpu_hours * 2.0)
    assert run.tco2e == pytest.approx(run.kwh * 481 / 1e6)
    assert run.tokens_per_joule == pytest.approx(3600 * 4096 / run.joules)
    assert run.flops_per_joule == pytest.approx(3600 * 1e15 / run.joules)


def test_phases_sum_to_the_step_on_a_compiled_pipeline():
    from compiler import pipeline
    c = pipeline.compile_path("samples/gpt_pp.scale")
    run = E.of(c)
    T = c.costs.step.step_time_s
    assert run.step.seconds == T
    for rank, kind in zip(c.costs.step.ranks, run.step.ranks):
        parts = E.phases(rank, T)
        assert min(parts) >= 0 and sum(parts) == pytest.approx(T)
        assert kind.joules == pytest.approx(sum(w * t for w, t in zip(
            (run.step.power.active_w, run.step.power.communicating_w, run.step.power.idle_w, run.step.power.idle_w),
            parts)))
    assert run.step.bubble_j > 0  # a pipeline: its devices idle in the schedule
    assert run.steps == c.spec.train.steps


def test_inputs_resolve_over_the_device_defaults_with_their_sources():
    p = POWER.resolve("h800", {"pue": 1.3, "usd_per_gpu_hour": None}, ("region", "france"))
    assert (p.pue, p.grid_g_per_kwh, p.grid_region, p.usd_per_gpu_hour) == (1.3, 56.0, "france", 2.0)
    assert p.source("pue") == "as written" and "DeepSeek" in p.source("usd_per_gpu_hour")
    q = POWER.resolve("a100", {}, ("intensity", 120.0, "Quebec, 2024"))
    assert (q.grid_g_per_kwh, q.grid_region, q.source("grid")) == (120.0, "Quebec, 2024", "as written")
    assert POWER.of(Cluster(1, 1, SimpleNamespace(kind="b200"))).active_w == 1000.0  # a Cluster made in code


def _plan_json(tmp_path, mesh_extra="", train_len="steps = 20"):
    from compiler.cli import main
    import contextlib
    import io
    src = (open("tests/mistakes/front_resilience_zero_failures.scale").read()
           .split("resilience {")[0]
           .replace("device = cpu", "device = cpu\n" + mesh_extra).replace("steps = 20", train_len))
    path = tmp_path / "t.scale"
    path.write_text(src)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["plan", str(path), "--json"])
    assert rc in (0, None), out.getvalue()
    return json.loads(out.getvalue())


def test_plan_json_carries_the_names_tools_read(tmp_path):
    got = _plan_json(tmp_path, 'usd_per_gpu_hour = 1.5  grid = region("norway")  pue = 1.25')
    assert set(got["run"]) >= {"steps", "days", "gpu_hours", "kwh", "usd", "tco2e", "tokens_per_joule"}
    assert set(got["step"]) >= {"seconds", "joules", "usd"}
    assert got["power"]["grid_g_per_kwh"] == 30.0 and got["power"]["pue"] == 1.25
    assert sorted(got["power"]["written"]) == ["pue", "usd_per_gpu_hour"]
    assert got["step"]["usd"] == pytest.approx(got["step"]["seconds"] / 3600 * 1.5)
    assert got["run"]["tco2e"] == pytest.approx(got["run"]["kwh"] * 30.0 / 1e6)


def test_tokens_set_the_steps_rounded_up(tmp_path):
    got = _plan_json(tmp_path, train_len="tokens = 1.5K")  # 8 × 16 = 128 tokens a step: 1,500 / 128 = 11.7
    assert got["run"]["steps"] == math.ceil(1500 / 128) == 12
    assert got["run"]["tokens"] == 12 * 128


@pytest.mark.parametrize("text,value", [("15.6T", 15_600_000_000_000), ("16M", 16_000_000), ("2K", 2000),
                                        ("0.5B", 500_000_000), ("1e3K", 1_000_000), ("3G", 3_000_000_000)])
def test_a_number_takes_a_decimal_suffix(text, value):
    from compiler.parse import _number_value
    got = _number_value(text)
    assert got == value and isinstance(got, int)


def test_a_suffix_is_not_the_start_of_a_name():
    from compiler.parse import parse
    (sec,) = parse("train { tokens = 15T }", "x.scale").sections
    assert sec.body[0].value.value == 15 * 10**12
    (sec,) = parse("train { tokens = 15Tb }", "x.scale").sections  # 15, then a name the checker refuses
    assert sec.body[0].value.value == 15 and sec.body[1].kind.id == "Tb"
