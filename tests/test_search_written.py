"""`scalec search` sets the file's own plan beside its ranking (compiler/search/written.py): costed as `scalec plan`
costs it, its mesh's rank among the winners, and the parts of the step (on each plan's busiest rank) that differ
most from the best's."""
from __future__ import annotations

import json

import pytest

from compiler.check import check_path
from compiler.cli import main
from compiler.cost.step_time import slowest_rank
from compiler.pipeline import compile_spec
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


def test_the_parts_sum_to_the_busiest_ranks_end_and_name_the_exposed_axes():
    pred = compile_spec(check_path("samples/moe_gpt.scale")).costs.step
    parts = dict(WR.step_parts(pred))
    r = WR.busiest(pred)
    assert sum(parts.values()) == pytest.approx(r.end_s, rel=1e-9)
    assert {a for a, t in r.exposed_comm_s.items() if t > 0} <= set(parts)
    assert parts[WR.WAITING] == r.idle_s and parts[WR.TAIL] == r.tail_s
    # the busiest computes and communicates at least as long as the rank whose end is the step time
    s = slowest_rank(pred.ranks)
    assert r.end_s - r.idle_s >= s.end_s - s.idle_s


def test_a_file_without_axes_has_no_plan_to_compare_and_a_refused_one_says_why(tmp_path, capsys):
    text = open("samples/gpt_dp.scale").read()
    bare = tmp_path / "bare.scale"
    bare.write_text("\n".join(x for x in text.splitlines() if "axis " not in x) + "\n")
    spec = check_path(str(bare), cluster_only=True)
    assert WR.written(str(bare), spec, 1e12) is None  # the search chooses the axes: nothing written to set beside
    refused = tmp_path / "refused.scale"  # dp 2 × tp 3 over heads that 3 does not divide
    refused.write_text(text.replace("axis dp = 2", "axis dp = 2\n  axis tp = 3").replace("devices_per_node = 2",
                                                                                          "devices_per_node = 6"))
    got = WR.written(str(refused), check_path(str(refused), cluster_only=True), 1e12)
    assert got is not None and got.refused.startswith("E0")
    assert WR.lines(got, [], None, 1e12)[0].startswith("the file's plan is refused by the rules: E0")
    assert main(["search", str(bare), "--top", "1"]) == 0
    assert "the file's plan" not in capsys.readouterr().out


def test_the_html_page_shows_the_file_plan_as_the_table_does(tmp_path, capsys):
    out = tmp_path / "search.html"
    assert main(["search", "samples/gpt_dp.scale", "--top", "2", "--html", str(out)]) == 0
    page = out.read_text()
    assert "<h3>The file's plan</h3>" in page and "dp=2 (1 micro-batch, ddp), fp32: " in page
    assert "its mesh ranks " in page
