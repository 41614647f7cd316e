"""`scalec search` sets the file's own plan beside its ranking (compiler/search/written.py): costed as `scalec plan`
costs it, its mesh's rank among the winners, and the parts of the step (on each plan's busiest rank) that differ
most from the best's."""
from __future__ import annotations

import json

import pytest

from compiler.check import check_path, check_text
from compiler.cli import main
from compiler.cost.step_time import slowest_rank
from compiler.pipeline import compile_spec
from compiler.report.units import seconds
from compiler.search import written as WR


def test_the_file_plan_is_costed_as_plan_costs_it_and_set_against_the_best(capsys):
    assert main(["search", "samples/gpt_dp.scale", "--top", "3", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    own = got["file_plan"]
    pred = compile_spec(check_path("samples/gpt_dp.scale")).costs.step
    assert own["step_time_s"] == pytest.approx(pred.step_time_s, rel=1e-12)
    assert own["describe"] == "dp=2 (1 micro-batch, ddp)" and own["precision"] == "fp32" and own["fits"]
    busy = WR.busiest(pred)
    assert sum(own["parts_s"].values()) == pytest.approx(busy.end_s, rel=1e-9)  # the parts sum to its end
    assert main(["search", "samples/gpt_dp.scale", "--top", "3"]) == 0
    text = capsys.readouterr().out
    best = got["winners"][0]["predicted"]["step_time_s"]
    ratio = own["step_time_s"] / best
    line = next(x for x in text.splitlines() if x.startswith("the file's plan: "))
    assert line.startswith("the file's plan: dp=2 (1 micro-batch, ddp), fp32: ")
    assert (f"{ratio:.2f}× the best" in line) if abs(ratio - 1) >= 0.005 else line.endswith("as the best")
    rank = next(w["rank"] for w in got["winners"] if w["describe"].startswith("dp=2 ("))
    assert f"its mesh ranks {WR._ordinal(rank)}" in text  # gpt_dp's two ranks: dp 2 is among the shapes shown


OFFLOADED = ("samples/llama3_70b_offload.scale", (("offload = optimizer(fraction = 0.5)", "offload = activations"),
                                                  ("recompute = full", "recompute = none")))


@pytest.mark.parametrize("sample,edits", [("samples/moe_gpt.scale", ()), ("samples/gpt_3d.scale", ()),
                                          ("samples/mixtral_8x7b.scale", ()), OFFLOADED],
                         ids=["moe_gpt", "gpt_3d", "mixtral_8x7b", "activation_offload"])
def test_the_parts_sum_to_the_busiest_ranks_end_each_at_least_zero(sample, edits):
    """Without pp, under pp (whose sends the waiting holds: counted once, as "pp"), interleaved with ep (mixtral's
    busiest rank is not the last to end), and with activation offload (its copies after the pipeline, "host")."""
    text = open(sample).read()
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    pred = compile_spec(check_text(text, sample)).costs.step
    parts = dict(WR.step_parts(pred))
    r = WR.busiest(pred)
    assert sum(parts.values()) == pytest.approx(r.end_s, rel=1e-9)
    assert min(parts.values()) >= 0, parts
    assert {a for a, t in r.exposed_comm_s.items() if t > 0} <= set(parts)
    assert parts[WR.TAIL] == r.tail_s
    if edits:
        assert parts["host"] > 0  # the copies the step waits for, not in the compute
    # the busiest computes and communicates at least as long as the rank whose end is the step time
    s = slowest_rank(pred.ranks)
    assert r.end_s - parts[WR.WAITING] >= s.end_s - WR._waiting(s)


def test_the_mesh_is_matched_by_its_sizes_and_each_changed_setting_named():
    """The search lays its axes out in its own order (pp, dp, tp): gpt_3d's file writes dp × pp × tp. The ranked
    plan of the same sizes is its mesh's, and what it changes is said setting by setting, dropped ones too."""
    import dataclasses
    from compiler.search import Winner
    spec = check_path("samples/gpt_3d.scale")
    w = WR.written("samples/gpt_3d.scale", spec, 1e12)
    plan = dataclasses.replace(w.plan, axes=(("pp", 2), ("dp", 2), ("tp", 2)), micro_batches=1,
                               data_parallel="zero2", sequence_parallel=False, schedule="gpipe")
    other = dataclasses.replace(w.plan, axes=(("pp", 2), ("dp", 4)))
    pred = compile_spec(spec).costs.step
    winners = [Winner(other, pred, None, ()), Winner(plan, pred, None, ())]
    got = WR.lines(w, winners, spec, 1e12)
    assert got[1] == ("  - its mesh ranks 2nd with 1 micro-batch instead of 4 micro-batches, zero2 instead of ddp, "
                      "gpipe instead of 1f1b, no sequence parallel, its axes laid out pp × dp × tp "
                      f"({seconds(pred.step_time_s)}, 1.00× the best)")


def test_a_file_without_axes_or_plan_has_no_plan_to_compare_and_a_refused_one_says_why(tmp_path, capsys):
    text = open("samples/gpt_dp.scale").read()
    bare = tmp_path / "bare.scale"
    bare.write_text("\n".join(x for x in text.splitlines() if "axis " not in x) + "\n")
    spec = check_path(str(bare), cluster_only=True)
    assert WR.written(str(bare), spec, 1e12) is None  # the search chooses the axes: nothing written to set beside
    planless = tmp_path / "planless.scale"  # the mesh's axes, no plan section: the defaults are not the user's plan
    start, end = text.index("plan {"), text.index("}", text.index("plan {")) + 1
    planless.write_text(text[:start] + text[end:])
    assert WR.written(str(planless), check_path(str(planless), cluster_only=True), 1e12) is None
    refused = tmp_path / "refused.scale"  # dp 2 × tp 3 over heads that 3 does not divide
    refused.write_text(text.replace("axis dp = 2", "axis dp = 2\n  axis tp = 3").replace("devices_per_node = 2",
                                                                                          "devices_per_node = 6"))
    got = WR.written(str(refused), check_path(str(refused), cluster_only=True), 1e12)
    assert got is not None and got.refused.startswith("E0")
    assert WR.lines(got, [], None, 1e12)[0].startswith("the file's plan does not compile: E0")
    assert main(["search", str(bare), "--top", "1"]) == 0
    assert "the file's plan" not in capsys.readouterr().out


def test_the_html_page_shows_the_file_plan_as_the_table_does(tmp_path, capsys):
    out = tmp_path / "search.html"
    assert main(["search", "samples/gpt_dp.scale", "--top", "2", "--html", str(out)]) == 0
    page = out.read_text()
    assert "<h3>The file's plan</h3>" in page and "dp=2 (1 micro-batch, ddp), fp32: " in page
    assert "its mesh ranks " in page
