"""What samples/deepseek_v3.scale's comment and docs/released_models.md say `plan` and `search` give for DeepSeek-V3's
published layout, held to what they give: `plan`'s figures to its golden output (tests/golden/samples/, rewritten
only by `--update-golden`, so a change of the model that moves them fails here until the prose says the new
figures), the search's (slow tier: a 20 s search) to the search itself."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "deepseek_v3.scale"
DOC = ROOT / "docs" / "released_models.md"


def _comment() -> str:
    """The sample's header comment, as one line of prose."""
    lines = []
    for line in SAMPLE.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# "))
    return " ".join(lines)


def _paragraph() -> str:
    """docs/released_models.md's paragraph on the sample, as one line of prose."""
    text = DOC.read_text()
    start = text.index("`samples/deepseek_v3.scale` writes DeepSeek-V3")
    return " ".join(text[start:text.index("\n\n", start)].split())


def _golden_plan() -> dict:
    """The figures of `scalec plan samples/deepseek_v3.scale` (its golden output) the prose states."""
    text = (ROOT / "tests" / "golden" / "samples" / "deepseek_v3" / "plan.txt").read_text()
    step = float(re.search(r"^step time +([\d.]+) s per step", text, re.M)[1])
    peaks = [float(x) for x in re.findall(r"^  pp rank \d+ \(stages [\d, ]+\)(?: +[\d.]+ [kMG]?B){5} +([\d.]+) GB$",
                                          text, re.M)]
    return {"step": step, "mfu": re.search(r"MFU ([\d.]+)%", text)[1], "peak": max(peaks),
            "devices": int(re.search(r"world (\d+) =", text)[1]),
            "tokens": int(re.search(r"= ([\d,]+) tokens per step", text)[1].replace(",", ""))}


def test_the_stated_plan_figures_are_plans():
    got = _golden_plan()
    gpu_hours = got["devices"] * got["step"] / got["tokens"] * 1e12 / 3600 / 1e6  # per trillion tokens, millions
    for prose in (_comment(), _paragraph()):
        assert f"{got['step']:.1f} s" in prose and f"MFU {got['mfu']}%" in prose, prose
        assert f"{got['peak']:.1f} GB of 80" in prose, prose
        assert f"{gpu_hours:.3f}M GPU-hours per trillion tokens" in prose, prose
        assert f"{got['devices']:,} GPUs × {got['step']:.1f} s over {got['tokens'] / 1e6:.1f}M tokens" in prose, prose


@pytest.mark.slow
def test_the_stated_search_figures_are_the_searchs():
    """The published layout's (pp 16 × dp 2 × ep 64) place among the search's winners, its step time, the first's,
    and their ratio, as both texts state them."""
    from compiler import search as SE
    from compiler.check import check_path
    spec = check_path(str(SAMPLE), cluster_only=True)
    result = SE.search(spec, top=5)
    times = [w.prediction.step_time_s for w in result.winners]
    published = next(i for i, w in enumerate(result.winners)
                     if (w.plan.size("pp"), w.plan.size("dp"), w.plan.size("ep")) == (16, 2, 64))
    first = result.winners[0].plan
    place = ["1st", "2nd", "3rd", "4th", "5th"][published]
    stated = re.compile(
        rf"ranks this layout's best \([^)]*: {times[published]:.1f} s\) {place}, "
        rf"{times[published] / times[0]:.2f}× its first \(pp {first.size('pp')} × dp {first.size('dp')} × "
        rf"ep {first.size('ep')}, {first.schedule}, {first.data_parallel}, FP8: {times[0]:.1f} s")
    for prose in (_comment(), _paragraph()):
        assert stated.search(prose), (stated.pattern, prose)
