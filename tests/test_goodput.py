"""The failure model and goodput (compiler/cost/goodput.py): its figures held to the formulas with inputs worked by
hand, `checkpoint_every = auto` resolved into the program, and what `plan` prints and plan.json carries."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from compiler import codegen
from compiler.check import check_text
from compiler.cost import goodput as GP
from compiler.layout import failures as FAIL
from compiler.pipeline import compile_spec
from compiler.report.plan import plan_json, plan_text

ROOT = Path(__file__).resolve().parents[1]
# gpt_dp on two nodes of one device, checkpointing; failures far more frequent than real ones, so that the tiny
# model's interval is a handful of steps
SECTION = """
resilience {
  stragglers = detect(threshold = 0.8, window = 10)
  on_straggler = restart(exclude = node)
  interruptions = per_gpu_hour(10000)
  storage_write_gbps = 0.02
  restart = 2
}
"""


def _text(every: str = "auto", section: str = SECTION, extra: str = "") -> str:
    text = (ROOT / "samples" / "gpt_dp.scale").read_text()
    text = text.replace("nodes = 1", "nodes = 2").replace("devices_per_node = 2", "devices_per_node = 1")
    text = text.replace("log_every    = 5", f'log_every    = 5\n  checkpoint_dir = "ck"  checkpoint_every = {every}'
                                           f"{extra}")
    return text.replace("\ntrain {", section + "\ntrain {")


@pytest.fixture(scope="module")
def compiled():
    return compile_spec(check_text(_text(), "gp.scale"))


def test_young_and_daly_by_hand():
    # C = 10 s, M = 5 h = 18,000 s, R = 100 s: τ = √(2 · 10 · 18,000) = √360,000 = 600 s
    assert GP.young_interval(10.0, 18000.0) == pytest.approx(600.0, rel=1e-12)
    # Daly: 600 / (18,000 · e^(100/18,000) · (e^(610/18,000) − 1))
    #     = 600 / (18,000 · 1.0055710 · 0.0344698) = 0.96168
    assert GP.ettr(600.0, 10.0, 100.0, 18000.0) == pytest.approx(0.96168, abs=2e-5)
    # to first order: 1 − C/τ − τ/(2M) − R/M = 1 − 1/60 − 1/60 − 1/180 = 0.96111
    assert GP.ettr(600.0, 10.0, 100.0, 18000.0) == pytest.approx(1 - 1 / 60 - 1 / 60 - 1 / 180, abs=1e-3)
    # Young's τ is the best interval of the model to this order: ±20% lose more
    assert GP.ettr(600.0, 10.0, 100.0, 18000.0) > max(GP.ettr(480.0, 10.0, 100.0, 18000.0),
                                                       GP.ettr(720.0, 10.0, 100.0, 18000.0))
    # no checkpoint: one segment of the whole run, C = 0; a run of 10 MTBFs almost never ends
    assert GP.ettr(180000.0, 0.0, 100.0, 18000.0) == pytest.approx(
        180000.0 / (18000.0 * math.exp(100 / 18000) * math.expm1(10.0)), rel=1e-12)
    assert GP.ettr(1e9, 0.0, 100.0, 18000.0) == 0.0


def test_llama3_default_rate():
    # 419 interruptions / (54 days × 24 h × 16,384 GPUs) = 419 / 21,233,664 = 1.9733e-5 per GPU-hour: 3.09 h at 16K
    assert FAIL.DEFAULT_RATE == pytest.approx(1.9733e-5, rel=1e-4)
    assert 1 / (FAIL.DEFAULT_RATE * 16384) == pytest.approx(3.093, rel=1e-3)


def test_figures_follow_the_section(compiled):
    g = GP.of(compiled)
    params = compiled.costs.params_n
    assert g.mtbf_s == pytest.approx(3600 / (10000 * 2))                     # 1 / (rate × 2 devices) = 0.18 s
    assert g.save_bytes_node == 12 * params / 2                               # each byte once, over 2 nodes
    assert g.save_s == pytest.approx(12 * params / 2 / 0.02e9)                # at 0.02 GB/s per node
    assert g.restart_s == 2.0 and g.restart_written
    step = compiled.costs.step.step_time_s
    tau = math.sqrt(2 * g.save_s * g.mtbf_s)
    assert g.best_interval_s == pytest.approx(max(tau, step))
    assert g.best_steps == max(1, round(g.best_interval_s / step)) and g.every == g.best_steps and g.auto
    assert g.ettr == pytest.approx(GP.ettr(g.every * step, g.save_s, 2.0, g.mtbf_s))


def test_auto_writes_the_interval_into_the_program(compiled, tmp_path):
    g = GP.of(compiled)
    assert 1 < g.best_steps < 100  # a handful of steps: the assertion below is not a default's
    program = codegen.program(compiled.spec, compiled.traced, compiled.costs, compiled.plan, str(tmp_path))
    assert f"every={g.best_steps}," in program
    # and plan.json's copy of the contract (written without the costs' memory and speed groups)
    written = json.loads(codegen.plan_json(compiled.spec, compiled.traced, compiled.costs, compiled.plan,
                                           str(tmp_path)))
    assert written["train"]["checkpoint"]["every"] == g.best_steps
    # the resilience section reaches the contract the straggler detector reads
    assert "train.Resilience(\n        detect=True,\n        threshold=0.8,\n        window=10,\n" in program
    assert "on_straggler='restart',\n        exclude='node'," in program


def test_no_resilience_section_writes_no_resilience_group(tmp_path):
    c = compile_spec(check_text(_text(every="3", section=""), "gp.scale"))
    program = codegen.program(c.spec, c.traced, c.costs, c.plan, str(tmp_path))
    assert "Resilience(" not in program and "every=3," in program


def test_plan_prints_and_carries_goodput(compiled):
    out = plan_json(compiled)["goodput"]
    assert list(out)[:5] == ["ettr", "checkpoint_interval_s", "mtbf_hours", "save_s", "restart_s"]
    g = GP.of(compiled)
    assert out["mtbf_hours"] == pytest.approx(0.5 / 10000) and out["restart_s"] == 2.0
    assert out["checkpoint_interval_s"] == pytest.approx(g.every * g.step_s) and out["ettr"] == g.ettr
    text = plan_text(compiled)
    assert f"goodput     ETTR {g.ettr:.1%} predicted, checkpoints every {g.every:,} steps" in text
    assert "(auto: τ / step time = " in text and "τ = √(2·C·M) = √(2 × " in text
    assert "restart R = 2 s as written (`restart`)" in text


def test_without_checkpoints_plan_says_what_they_would_give():
    c = compile_spec(check_text(_text(section="").replace('  checkpoint_dir = "ck"  checkpoint_every = auto', ""),
                                "gp.scale"))
    g = GP.of(c)
    assert not g.checkpoints and g.interval_s is None
    assert g.ettr == GP.ettr(g.run_s, 0.0, g.restart_s, g.mtbf_s)
    assert plan_json(c)["goodput"]["checkpoint_interval_s"] is None
    assert "no checkpoint_dir, so every interruption starts the run again at step 0" in plan_text(c)
    # the restart on cpu: the start-up measured here (bench/startup.py) and the load
    assert g.restart_s == pytest.approx(FAIL.STARTUP_S["cpu"] + g.load_s)


def test_async_save_blocks_for_the_staging_copy():
    c = compile_spec(check_text(_text(every="5", extra="  checkpoint_async = true"), "gp.scale"))
    g = GP.of(c)
    staged = max(m.checkpoint_host for m in c.costs.memory)
    assert g.staging_s == pytest.approx(staged / (FAIL.host_link_gbps(c.spec.cluster.device) * 1e9))
    assert g.save_s == g.staging_s < g.write_s
    # the files are written while the next steps run: an interval is at least that write
    assert g.best_interval_s >= g.write_s
