"""The estimate is whole: a compiled plan's Estimate carries its step time, made once, and the "what would fit"
advice is computed once (compiler/fit.py `advice`); the reports and codegen format them and never cost again."""
from __future__ import annotations

import json
from pathlib import Path

from compiler import codegen
from compiler import fit
from compiler.check import check_text
from compiler.cost import step_time as ST
from compiler.pipeline import compile_spec
from compiler.report import plan as RP

ROOT = Path(__file__).resolve().parents[1]


def _counting(monkeypatch, owner, name):
    calls = []
    real = getattr(owner, name)

    def counted(*args, **kw):
        calls.append(1)
        return real(*args, **kw)
    monkeypatch.setattr(owner, name, counted)
    return calls


def test_a_plan_that_does_not_fit_is_costed_once_by_every_report(monkeypatch):
    """gpt_pp (pipelined: its report has a pipeline section too) on a device of 1 MB: `plan`, `plan --json` (its
    memory fixes and its E0501 diagnostic) and the program's predicted step time read one prediction and one list
    of fixes. Before, the step time was simulated three times for the reports and once more with a second CostModel
    by codegen, and the variants were lowered and costed three times."""
    text = (ROOT / "samples" / "gpt_pp.scale").read_text().replace("device = cpu", "device = cpu  memory_gb = 0.001")
    compiled = compile_spec(check_text(text, "gpt_pp.scale"))
    predicted = _counting(monkeypatch, ST.Simulator, "predict")
    lowered = _counting(monkeypatch, fit, "fixes")
    text_report = RP.plan_text(compiled)
    doc = RP.plan_json(compiled)
    speed = codegen.speed_values(compiled.spec, compiled.traced, compiled.costs, compiled.plan)
    assert "does NOT fit" in text_report and "pipeline    " in text_report
    assert doc["memory"]["fixes"] and [d["code"] for d in doc["diagnostics"]] == ["E0501"]
    assert predicted == [1] and lowered == [1]
    assert fit.advice(compiled) is compiled.advice
    assert speed["predicted_step_s"] == float(f"{compiled.costs.step.step_time_s:.4g}")
    assert doc["predicted"] == compiled.costs.step.as_json() == json.loads(json.dumps(doc["predicted"]))
    assert ST.predict(compiled) is compiled.costs.step
