"""`scalec search` chooses FP8 like any other setting (compiler/search/precision.py, issue 43 item 4): a bf16 file
on a device with FP8 matmuls is searched with `precision = fp8(recipe = tensorwise, filter = auto)` too, the
winners ranked by predicted step time with a reason naming the precision; `--fix precision=...` fixes it; files
that cannot gain (a100, fp32) are searched once, as before."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from compiler import search as SE
from compiler.check import check_text
from compiler.search import precision as PR
from compiler.search import prune

# Llama-3-8B on one node of 8 H100s, FSDP over 8 fixed: a few families per search (about a second each)
FSDP8 = {"dp": 8, "tp": 1, "pp": 1, "data_parallel": "fsdp", "micro_batches": 8, "recompute": "full"}
REASON = re.compile(r"fp8 \(tensorwise, (\d+) of (\d+) linears\), not the file's bf16: (\d+\.\d\d)× faster than "
                    r"bf16 at best \((.+) → (.+)\)")


def _llama8b(*edits):
    text = (Path(__file__).resolve().parents[1] / "samples" / "llama3_8b.scale").read_text()
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    return check_text(text, "l.scale", cluster_only=True)


@pytest.fixture(scope="module")
def h100():
    spec = _llama8b()
    return spec, {p: SE.search(spec, top=2, fixed={**FSDP8, **({"precision": p} if p else {})})
                  for p in (None, "bf16", "fp8")}


def _runs(monkeypatch) -> list:
    """The specs prune.Search runs are made of, appended as they are made."""
    made, init = [], prune.Search.__init__

    def counted(self, spec, *a, **k):
        made.append(spec)
        init(self, spec, *a, **k)
    monkeypatch.setattr(prune.Search, "__init__", counted)
    return made


def test_a_bf16_h100_search_ranks_fp8_by_predicted_time_with_its_reason(h100):
    spec, got = h100
    both, bf16, fp8 = got[None], got["bf16"], got["fp8"]
    t16, t8 = bf16.winners[0].prediction.step_time_s, fp8.winners[0].prediction.step_time_s
    assert t8 < t16  # the model's own figures: the chosen matmuls 2× faster on h100, minus their casts
    w = both.winners[0]
    assert w.fp8 == PR.SEARCHED and w.precision_changed
    assert w.prediction.step_time_s == t8
    (line,) = [r for r in w.reasons if r.startswith("fp8 (")]
    m = REASON.fullmatch(line)
    assert m, line
    chosen, total = int(m[1]), int(m[2])
    assert 0 < chosen < total  # `auto` leaves the small projections (k, v) in bf16
    assert m[3] == f"{t16 / t8:.2f}"
    # both runs counted: the merged result is the two searches' together
    assert both.counts.families == bf16.counts.families + fp8.counts.families
    assert [x["fp8"] for x in SE.to_json(both)["winners"]][0] == {"recipe": "tensorwise", "filter": "auto"}


def test_fix_precision_bf16_searches_bf16_alone(h100, monkeypatch):
    spec, got = h100
    bf16 = got["bf16"]
    assert all(w.fp8 is None and not w.precision_changed for w in bf16.winners)
    assert not any("fp8" in r for w in bf16.winners for r in w.reasons)
    assert bf16.fixed["precision"] == "bf16"
    made = _runs(monkeypatch)
    SE.search(spec, top=1, fixed={**FSDP8, "precision": "bf16"})
    assert [s.train.fp8 for s in made] == [None]


def test_the_winners_file_writes_fp8_and_checks(h100):
    spec, got = h100
    w = got[None].winners[0]
    text = SE.scale_text(spec, w)
    assert "precision    = fp8(recipe = tensorwise, filter = auto)" in text
    assert "# Its precision fp8(recipe = tensorwise, filter = auto), where the file's was bf16." in text
    again = check_text(text, "best.scale")
    assert again.train.fp8 == PR.SEARCHED and again.train.precision == "bf16"
    # a bf16 winner's file keeps the file's line
    assert "precision    = bf16" in SE.scale_text(spec, got["bf16"].winners[0])


def test_a_file_that_cannot_gain_is_searched_once(monkeypatch):
    made = _runs(monkeypatch)
    a100 = _llama8b(("device = h100", "device = a100"))
    result = SE.search(a100, top=1, fixed=FSDP8)
    assert len(made) == 1 and result.winners[0].fp8 is None
    assert not any("fp8" in r for r in result.winners[0].reasons)
    with pytest.raises(SE.FixError, match="a100 has no FP8 matmul rate"):
        SE.search(a100, top=1, fixed={**FSDP8, "precision": "fp8"})
    made.clear()
    fp32 = _llama8b(("precision    = bf16", "precision    = fp32"))
    (w,) = SE.search(fp32, top=1, fixed=FSDP8).winners
    assert len(made) == 1 and w.fp8 is None
    assert w.reasons[-1].startswith("precision fp32, as written; fp8 not searched: the file trains in fp32; fp8 "
                                    "computes in bf16, another numerics class")
    with pytest.raises(SE.FixError, match="trains in fp32, which the search does not change"):
        SE.search(fp32, top=1, fixed={**FSDP8, "precision": "bf16"})


def test_a_written_fp8_is_kept_unless_fixed_to_bf16(monkeypatch):
    made = _runs(monkeypatch)
    spec = _llama8b(("precision    = bf16", "precision    = fp8(recipe = rowwise)"))
    (w,) = SE.search(spec, top=1, fixed=FSDP8).winners
    assert len(made) == 1 and w.fp8.recipe == "rowwise" and not w.precision_changed
    assert "precision    = fp8(recipe = rowwise)" in SE.scale_text(spec, w)
    (w,) = SE.search(spec, top=1, fixed={**FSDP8, "precision": "bf16"}).winners
    assert w.fp8 is None and w.precision_changed
    assert "precision    = bf16" in SE.scale_text(spec, w)


def test_fp8_winners_cost_as_their_own_plan_does():
    """FP8's linears are read from the sharded modules, whose features are tp's shard: a search shares one pass
    structure between tp degrees, so under fp8 each degree has its own (candidates.py), and every winner's step
    time is the one a fresh cost model gives its plan (`plan` on its file). Without that, tp 8 was costed with tp
    2's matmuls: llama3_70b's search put a 19.3 s plan at 9.41 s."""
    from compiler.candidates import Candidates
    from compiler.cost.step_time import Simulator
    spec = _llama8b()
    s8 = PR.with_fp8(spec, PR.SEARCHED)
    result = SE.search(spec, top=4, fixed={"pp": 1, "cp": 1, "data_parallel": "fsdp", "recompute": "full",
                                            "micro_batches": 8, "precision": "fp8"})
    assert len({w.plan.size("tp") for w in result.winners}) > 2
    for w in result.winners:
        c = Candidates(s8)
        d = c.decide(w.plan)
        fresh = Simulator(s8.cluster).predict(c.cost_model(d), d, c.estimate(d)).step_time_s
        assert w.prediction.step_time_s == pytest.approx(fresh, rel=1e-9), w.plan.describe()
