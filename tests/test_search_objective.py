"""`scalec search --minimize time | cost | energy` with `--deadline`, `--budget` and `--max-devices`
(compiler/search/objective.py): the sweep's node counts, the Pareto set non-dominated and holding the fastest and the
cheapest, a cost-minimising choice under a deadline that differs from the fastest and says why, the priced run
`plan` prints for the written file, the constraints' parsing and usage errors, and no plan meeting them.

The model: a GPT of 1.3B parameters (hidden 2048, 24 layers) on up to 8 nodes of 8 A100s, a global batch of 128
sequences of 2048 tokens for 20,000 steps. Its search takes about half a second a node count here, so a sweep of six
counts costs a few seconds. On it a smaller allocation is really cheaper: on 8 nodes each rank holds two sequences
and the fastest plan adds tp = 2 (MFU 61%, predicted), on one node each rank holds sixteen (MFU 67.5%)."""
from __future__ import annotations

import json
import math

import pytest

from compiler.check import check_path
from compiler.cli import main
from compiler.search import objective as OBJ

GPT_1B = """model gpt_1b {
  vocab  = 50304
  hidden = 2048
  heads  = 16
  layers = 24
  seq    = 2048

  embedding(vocab, hidden)
  positional(seq, hidden)
  repeat layers {
    residual { layernorm(hidden)  attention(hidden, heads) }
    residual { layernorm(hidden)  mlp(hidden, 4 * hidden, act = gelu) }
  }
  layernorm(hidden)
  lm_head(vocab, hidden, tied = true)
  cross_entropy
}

mesh {
  nodes = 8
  devices_per_node = 8
  device = a100
}

train {
  global_batch = 128
  seq_len      = seq
  steps        = 20000
  precision    = bf16
  optimizer    = adamw(lr = 3e-4)
}
"""


@pytest.fixture(scope="module")
def gpt_1b(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("objective") / "gpt_1b.scale"
    path.write_text(GPT_1B)
    return str(path)


@pytest.fixture(scope="module")
def swept(gpt_1b):
    """Every count of 8 nodes, unconstrained, minimising cost: the options the Pareto tests read."""
    return OBJ.sweep(check_path(gpt_1b, cluster_only=True), "cost", OBJ.Constraints(), top=3)


def test_node_counts():
    assert OBJ.node_counts(8) == [8, 6, 4, 3, 2, 1]
    assert OBJ.node_counts(1) == [1]
    # 192 = the 175B sample's: halvings and three-quarters of them, 4.5 rounded up, 1.5 and 1.125 to 2 and 1
    assert OBJ.node_counts(192) == [192, 144, 96, 72, 48, 36, 24, 18, 12, 9, 6, 5, 3, 2, 1]
    with pytest.raises(ValueError):
        OBJ.node_counts(0)


def test_pareto_of_points():
    pts = [(1.0, 10.0), (2.0, 8.0), (2.0, 9.0), (3.0, 8.0), (4.0, 5.0), (1.0, 10.0), (5.0, 6.0)]
    # (2, 9) is beaten by (2, 8), (3, 8) by (2, 8), (5, 6) by (4, 5); the repeated (1, 10) kept once
    assert OBJ.pareto(pts) == [0, 1, 4]


def test_pareto_set_is_non_dominated_and_holds_the_fastest_and_the_cheapest(swept):
    out = swept
    assert out.counts == [8, 6, 4, 3, 2, 1] and out.stopped is None
    opts = out.options
    assert len(opts) > len(out.counts)  # several plans a count
    front = out.pareto
    for i in front:
        for j, q in enumerate(opts):
            p = opts[i]
            assert not (q.wall_s <= p.wall_s and q.usd <= p.usd and (q.wall_s < p.wall_s or q.usd < p.usd)), \
                (i, j)
    # every option left out is beaten by one in the set
    for j, q in enumerate(opts):
        if j not in front:
            assert any(opts[i].wall_s <= q.wall_s and opts[i].usd <= q.usd for i in front), j
    fastest = min(range(len(opts)), key=lambda i: opts[i].wall_s)
    cheapest = min(range(len(opts)), key=lambda i: opts[i].usd)
    assert fastest in front and cheapest in front and fastest != cheapest
    assert out.fastest == fastest and out.chosen == cheapest  # no constraint: the cheapest is chosen
    # the trade is real: the cheapest is on fewer devices and at least 10% cheaper
    assert opts[cheapest].devices < opts[fastest].devices
    assert opts[cheapest].usd < 0.9 * opts[fastest].usd
    # energy is its own axis: the least energy is in that front
    least = min(range(len(opts)), key=lambda i: opts[i].kwh)
    assert least in OBJ.pareto([(o.wall_s, o.kwh) for o in opts])


def test_an_option_is_priced_as_plan_prices_its_file(swept, tmp_path, capsys):
    """The run an option prints is the one `scalec plan` prints for the file `-o` writes (one cost model)."""
    from compiler.search import scale_text
    o = swept.options[swept.chosen]
    path = tmp_path / "best.scale"
    path.write_text(scale_text(o.spec, o.winner))
    assert f"nodes = {o.nodes}" in path.read_text()
    assert main(["plan", str(path), "--json"]) == 0
    run = json.loads(capsys.readouterr().out)["run"]
    for key in ("steps", "days", "gpu_hours", "kwh", "usd", "tco2e", "tokens_per_joule"):
        assert run[key] == pytest.approx(o.run.as_json()[key], rel=1e-9), key


def test_cost_with_a_deadline_takes_fewer_nodes_than_time_and_says_why(gpt_1b, tmp_path, capsys):
    best = tmp_path / "cheap.scale"
    assert main(["search", gpt_1b, "--top", "2", "--minimize", "cost", "--deadline", "3h", "-o", str(best)]) == 0
    text = capsys.readouterr().out
    written = best.read_text()
    nodes = int(next(line for line in written.splitlines() if line.strip().startswith("nodes =")).split("=")[1])
    assert 1 < nodes < 8  # one node is cheapest but misses 3 h
    assert "the plan of least cost found on" in written
    why = next(line for line in text.splitlines() if "not the fastest (8 nodes" in line)
    assert "minimising cost, the chosen is" in why and "cheaper" in why and "within the 3 h deadline" in why
    # the descent stops at the first count whose fastest plan misses the deadline, and says so
    # (3 nodes: 24 ranks do not divide the 128 sequences evenly, 3.4 h; 2 nodes would take 4 h)
    assert "searched 8, 6, 4, 3 nodes" in text
    assert "stopped at 3: its fastest plan takes" in text and "past the 3 h deadline" in text
    marked = [line for line in text.splitlines() if line.startswith("  * ")]
    assert len(marked) == 1 and f"{nodes * 8:>8,}" in marked[0]  # the chosen row, marked once in the table
    # the same file minimising time: its own 8 nodes, the output as before plus nothing
    assert main(["search", gpt_1b, "--top", "2", "--minimize", "time"]) == 0
    plain = capsys.readouterr().out
    assert main(["search", gpt_1b, "--top", "2"]) == 0
    assert capsys.readouterr().out.split("\n")[:-2] == plain.split("\n")[:-2]  # the last line holds the seconds
    assert "on 64 a100 = 8 nodes × 8" in plain and "pareto" not in plain


def test_json_keys(gpt_1b, capsys):
    assert main(["search", gpt_1b, "--top", "1", "--minimize", "energy", "--max-devices", "32", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert {"model", "file", "fixed", "cluster", "winners", "rejected", "counts", "seconds"} <= set(got)
    assert got["minimize"] == "energy"
    assert got["constraints"] == {"deadline_days": None, "budget_usd": None, "max_devices": 32}
    assert got["sweep"]["nodes"] == [4, 3, 2, 1]
    assert [o["nodes"] for o in got["options"]] == [4, 3, 2, 1]
    for o in got["options"]:
        assert {"nodes", "devices", "describe", "step_s", "run"} <= set(o)
        assert {"steps", "days", "gpu_hours", "kwh", "usd", "tco2e", "tokens_per_joule"} <= set(o["run"])
    chosen = got["options"][got["chosen"]]
    assert chosen["run"]["kwh"] == min(o["run"]["kwh"] for o in got["options"])
    assert got["chosen"] in got["pareto"] and got["fastest"] in got["pareto"]
    # the top-level search is the chosen count's
    assert got["cluster"]["nodes"] == chosen["nodes"]


def test_the_page_takes_the_chosen_counts_search(gpt_1b, tmp_path, capsys):
    page = tmp_path / "cheap.html"
    assert main(["search", gpt_1b, "--top", "1", "--minimize", "cost", "--max-devices", "16", "--html",
                 str(page)]) == 0
    assert "1 node (8 a100)" in capsys.readouterr().out.split("\n")[2]  # chosen: one node, the cheaper
    assert "<html" in page.read_text() and "dp=8" in page.read_text()


def test_time_with_a_budget_drops_winners_and_says_which(gpt_1b, capsys):
    # the 8-node winners cost about $114 (GPU-hours at $1.5): a budget of $110 drops them all
    assert main(["search", gpt_1b, "--top", "2", "--budget", "$110"]) == 1
    got = capsys.readouterr()
    assert "dropped #1: misses the $110 budget by" in got.out
    assert got.err.startswith("error: no plan meets budget $110: the closest, 8 nodes (64 a100)")
    assert "misses the $110 budget by" in got.err and len(got.err.strip().splitlines()) == 1
    assert "`--minimize cost` or `--max-devices` searches fewer nodes too" in got.err
    # a budget every winner meets drops none and says so; the table is the search's, as before
    assert main(["search", gpt_1b, "--top", "2", "--budget", "1k$"]) == 0
    out = capsys.readouterr().out
    assert "minimize time; budget $1k\n  every winner meets it\n" in out and "dropped" not in out


def test_time_over_allocations_under_a_budget_stops_at_the_first_that_meets_it(gpt_1b, capsys):
    """Minimising time with --max-devices, the descent stops at the first count with a plan under the budget (fewer
    nodes are taken to be no faster), and the line under the choice says what the fastest misses."""
    assert main(["search", gpt_1b, "--top", "2", "--max-devices", "64", "--budget", "$110", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    chosen, fastest = got["options"][got["chosen"]], got["options"][got["fastest"]]
    assert fastest["nodes"] == 8 and fastest["run"]["usd"] > 110 >= chosen["run"]["usd"]
    assert got["sweep"]["nodes"][-1] == chosen["nodes"] < 8
    assert got["sweep"]["stopped"].startswith("minimising time, a plan here meets the constraints")
    assert chosen["run"]["days"] == min(o["run"]["days"] for o in got["options"] if o["run"]["usd"] <= 110)


def test_a_deadline_no_plan_meets_exits_1_naming_the_closest(gpt_1b, tmp_path, capsys):
    out = tmp_path / "never.scale"
    assert main(["search", gpt_1b, "--top", "1", "--minimize", "cost", "--deadline", "30min", "-o", str(out)]) == 1
    got = capsys.readouterr()
    line = got.err.strip()
    assert len(line.splitlines()) == 1
    assert line.startswith("error: no plan meets deadline 30 min: the closest, 8 nodes (64 a100), ")
    assert "misses the 30 min deadline by" in line and f"nothing written to {out}" in line
    assert not out.exists()
    assert "searched 8 nodes" in got.out  # 8 nodes' fastest misses it: nothing smaller is searched


def test_constraints_parse():
    day = 86400
    assert OBJ.parse_deadline("30d") == 30 * day
    assert OBJ.parse_deadline("36h") == 36 * 3600
    assert OBJ.parse_deadline("2w") == 14 * day
    assert OBJ.parse_deadline(" 1.5d ") == 1.5 * day
    assert OBJ.parse_deadline("90min") == 5400
    for bad in ("30", "30x", "0d", "-1d", "d", "thirty days", ""):
        with pytest.raises(OBJ.ObjectiveError):
            OBJ.parse_deadline(bad)
    for text in ("2M$", "$2M", "2000000", "2,000,000", "2000k$", "$2.0M"):
        assert OBJ.parse_budget(text) == 2e6, text
    assert OBJ.parse_budget("1.5B") == 1.5e9 and OBJ.parse_budget("250k$") == 250e3
    for bad in ("2M€", "lots", "0", "$", "2MM", "-5$"):
        with pytest.raises(OBJ.ObjectiveError):
            OBJ.parse_budget(bad)


@pytest.mark.parametrize("argv, says", [
    (["--deadline", "soon"], "--deadline 'soon': expected a duration with its unit"),
    (["--budget", "lots"], "--budget 'lots': expected dollars"),
    (["--max-devices", "4"], "--max-devices 4 is less than one node (8 devices per node"),
    (["--max-devices", "many"], "--max-devices 'many': expected a count of devices"),
    (["--max-devices", "16", "--nodes", "2"], "--max-devices and --nodes: choose one"),
])
def test_usage_errors_are_one_line_exit_2(gpt_1b, capsys, argv, says):
    assert main(["search", gpt_1b, *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_an_unknown_objective_is_refused_by_argparse(gpt_1b, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["search", gpt_1b, "--minimize", "speed"])
    assert exc.value.code == 2
    assert "invalid choice: 'speed'" in capsys.readouterr().err


def test_trade_words():
    assert OBJ._ratio_time(180, 100) == "1.8× longer" and OBJ._ratio_time(100, 100.1) == "as long"
    assert OBJ._pct(77, 100, "cheaper", "dearer", "same") == "23% cheaper"
    assert OBJ._pct(105, 100, "cheaper", "dearer", "same") == "5.0% dearer"
    assert math.isclose(OBJ.Constraints(deadline_s=86400).shortfall(
        type("O", (), {"wall_s": 1.5 * 86400, "usd": 1.0})()), 0.5)
