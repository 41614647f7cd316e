"""`scalec plan --html` and `scalec search --html`: one self-contained page, drawn from `--json`'s figures, pinned by a
golden, closed to injection, and rendered by a real browser (headless Chromium) with no console error and every part
present: the memory bars, the timeline, one ledger row per collective, one ranking row per plan.

The browser tests skip when no Chromium is installed, except under CI=true, where they fail: CI installs it
(.ci/run)."""
from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from compiler.check import check_text
from compiler.cli import main
from compiler.pipeline import compile_spec
from compiler.report import html
from compiler.report import plan as RP

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "gpt_3d.scale"   # pp, tp and dp: every section of the page has something to show
EVIL = '<script>alert("path")</script>/<b onmouseover=alert(1)>x.scale'  # a path, the user text that reaches it


def _compiled(path: str = "samples/gpt_3d.scale"):
    return compile_spec(check_text(SAMPLE.read_text(encoding="utf-8"), path))


@pytest.fixture(scope="module")
def plan_page():
    compiled = _compiled()
    return html.plan_html(compiled), RP.plan_json(compiled)


@pytest.fixture(scope="module")
def searched():
    from compiler import search as SE
    result = SE.search(check_text(SAMPLE.read_text(encoding="utf-8"), "samples/gpt_3d.scale", cluster_only=True),
                       top=3)
    return html.search_html(result), SE.to_json(result)


def test_plan_page_matches_golden(plan_page, golden):
    golden.check("html/gpt_3d.plan.html", plan_page[0])


def test_plan_page_is_deterministic(plan_page):
    assert html.plan_html(_compiled()) == plan_page[0]


def test_search_page_leaves_out_the_elapsed_time(searched):
    """The search's own duration is the one figure of `--json` that differs between runs: the page has none of it."""
    _, data = searched
    first = html.search_page(data, {"ledger": [], "timeline_svg": ""})
    assert html.search_page({**data, "seconds": data["seconds"] + 12.5}, {"ledger": [], "timeline_svg": ""}) == first


def test_page_is_self_contained(plan_page, searched):
    for page in (plan_page[0], searched[0]):
        assert page.startswith("<!DOCTYPE html>")
        assert not re.search(r"<link|<img|<iframe|@import|url\(|\bsrc=", page)
        assert set(re.findall(r"https?://[^\s\"']+", page)) == {"http://www.w3.org/2000/svg"}  # SVG's namespace
        assert page.count("<script") == 1 and "default-src 'none'" in page


def test_page_shows_what_plan_json_says(plan_page):
    page, data = plan_page
    assert page.count('class="ledger-row"') == len(data["ledger"]) == 15
    assert page.count('class="mem-bar"') == len(data["memory"]["ranks"]) == 2
    assert page.count('class="stage-row"') == len(data["pipeline"]["stages"])
    assert page.count('<svg class="timeline-chart"') == 1 and "gpt_3d: 1f1b, pp = 2, v = 1, m = 4" in page
    for r in data["memory"]["ranks"]:  # each rank's components, stacked: the bar's segments are its parts
        bar = page.split(f'data-who="{r["who"]}"')[1].split("</g>")[0]
        assert bar.count("<rect") == sum(1 for k in ("weights", "gradients", "optimizer", "activations", "working")
                                         if r[k] > 0)


def test_memory_bars_share_one_scale_with_the_capacity_when_it_is_near():
    ranks = [{"who": "a", "peak_bytes": 60, "weights": 10, "gradients": 10, "optimizer": 20, "activations": 15,
              "working": 5}, {"who": "b", "peak_bytes": 90, "weights": 10, "gradients": 10, "optimizer": 20,
                              "activations": 15, "working": 5}]
    near = html._memory_view(ranks, 100)
    assert near["capacity"] and near["off_scale"] is None
    widths = [sum(float(s["w"]) for s in b["segments"]) for b in near["bars"]]
    assert widths[0] < widths[1] < float(near["capacity"]["x"]) - html.LABEL_WIDTH
    assert [s["key"] for s in near["bars"][1]["segments"]][-1] == "other"  # 30 bytes the parts do not name
    far = html._memory_view(ranks, 10 ** 9)
    assert far["capacity"] is None and "off this scale" in far["off_scale"]


def test_user_text_cannot_inject_markup():
    page = html.plan_html(_compiled(EVIL))
    assert page.count("<script") == 1 and "<b " not in page
    assert "&lt;script&gt;alert(&#34;path&#34;)&lt;/script&gt;" in page
    assert "&lt;b onmouseover=alert(1)&gt;x.scale:16" in page  # the ledger's site: the file's base name


def _cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = main(list(argv))
    return rc, out.getvalue()


def test_cli_writes_the_page(tmp_path):
    out = tmp_path / "plan.html"
    rc, printed = _cli("plan", str(SAMPLE), "--html", str(out))
    assert rc == 0 and printed.endswith(f"wrote {out}\n") and printed.startswith("plan for `gpt_3d`")
    assert out.read_text(encoding="utf-8").count('class="ledger-row"') == 15


def test_cli_refuses_html_with_json_and_elsewhere(tmp_path):
    out = tmp_path / "x.html"
    for argv in (("plan", str(SAMPLE), "--json", "--html", str(out)), ("search", str(SAMPLE), "--html", str(out),
                                                                        "--json"),
                 ("compile", str(SAMPLE), "--html", str(out))):
        rc, printed = _cli(*argv)
        assert rc == 2 and printed.count("\n") == 1 and printed.startswith("error: --html"), printed
    assert not out.exists()


# -- in a real browser ---------------------------------------------------------------------------------------------

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _chromium() -> str:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI=true but no Chromium ({', '.join(BROWSERS)}) on PATH: .ci/run installs it with apt-get "
                    "when it runs as root", pytrace=False)
    pytest.skip(f"no Chromium on PATH ({', '.join(BROWSERS)}): the page is not checked in a browser here "
                "(apt-get install chromium)")


def _browse(page: str, tmp_path: Path, *action: str) -> tuple[str, list[str]]:
    """Open `page` in headless Chromium with `action` (--dump-dom, --screenshot=...): its stdout, and the lines of
    the page's console (an uncaught error, a blocked load or script) that Chromium logged."""
    path = tmp_path / "page.html"
    path.write_text(page, encoding="utf-8")
    r = subprocess.run([_chromium(), "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
                        f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
                        "--window-size=1280,2000", *action, path.as_uri()],
                       capture_output=True, text=True, timeout=180)
    console = [line for line in r.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout, console


def _rendered(dom: str) -> None:
    assert re.search(r'<html[^>]*data-rendered="ok"', dom), "the page's script did not run"


def test_plan_page_in_a_browser(plan_page, tmp_path):
    page, data = plan_page
    dom, console = _browse(page, tmp_path, "--dump-dom")
    assert console == []
    _rendered(dom)
    assert dom.count('class="mem-bar"') == len(data["memory"]["ranks"])
    assert dom.count('class="ledger-row"') == len(data["ledger"])
    assert dom.count('<svg class="timeline-chart"') == 1 and dom.count('class="time-part"') >= 3
    shot = tmp_path / "plan.png"
    _, console = _browse(page, tmp_path, f"--screenshot={shot}")
    assert console == []
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(png[16:20], "big") == 1280


def test_search_page_in_a_browser(searched, tmp_path):
    page, data = searched
    dom, console = _browse(page, tmp_path, "--dump-dom")
    assert console == []
    _rendered(dom)
    assert dom.count('class="ranking-row"') == len(data["winners"]) == 3
    assert dom.count('class="mem-bar"') == len(data["winners"][0]["memory"])
    assert dom.count('<svg class="timeline-chart"') == 1 and 'class="ledger-row"' in dom


def test_injected_text_stays_text_in_a_browser(tmp_path):
    dom, console = _browse(html.plan_html(_compiled(EVIL)), tmp_path, "--dump-dom")
    assert console == []  # a script the policy blocked would be logged here
    _rendered(dom)
    assert dom.count("<script") == 1 and "<b " not in dom


def test_a_broken_page_is_caught(tmp_path):
    """The browser check can fail: an uncaught error and a blocked load are both seen."""
    page = html.plan_html(_compiled()).replace("<footer>", '<img src="http://example.invalid/x.png"><footer>')
    _, console = _browse(page, tmp_path, "--dump-dom")
    assert any("Content Security Policy" in line for line in console)
    page = "<!DOCTYPE html><html><body><script>throw new Error('boom')</script></body></html>"
    dom, console = _browse(page, tmp_path, "--dump-dom")
    assert any("Uncaught Error: boom" in line for line in console) and "data-rendered" not in dom


def test_memory_bars_are_drawn_against_the_device_when_usage_is_low():
    """A rank at 39% of the device is a bar 39% as long as the capacity line, beside it: drawn to the fullest rank
    it filled the chart and looked full. Only a sliver (under html.ON_SCALE) is drawn off the device's scale."""
    ranks = [{"who": "every rank", "peak_bytes": 39, "weights": 10, "gradients": 10, "optimizer": 19}]
    view = html._memory_view(ranks, 100)
    assert view["capacity"] and view["off_scale"] is None
    bar = sum(float(s["w"]) for s in view["bars"][0]["segments"])
    line = float(view["capacity"]["x"]) - html.LABEL_WIDTH
    assert bar / line == pytest.approx(0.39, abs=0.005)
    assert view["bars"][0]["share"] == "39.0%"
    small = html._memory_view([{**ranks[0], "peak_bytes": 3, "weights": 3, "gradients": 0, "optimizer": 0}], 100)
    assert small["capacity"] is not None  # 3% is still drawn against the device ...
    tiny = html._memory_view([{**ranks[0], "peak_bytes": 1, "weights": 1, "gradients": 0, "optimizer": 0}], 100)
    assert tiny["capacity"] is None and "the fullest rank uses 1.0%" in tiny["off_scale"]  # ... 1% is not


def test_a_small_timeline_is_not_zoomed_past_the_pages_text_size():
    """tiny_gpt's timeline (one rank, two boxes, 118 pixels wide) was zoomed twice: its 10 px text drew at 20 px and
    its title at 24, beside the page's 14 px. The zoom stops where the text reaches the page's size."""
    page = html.plan_html(_compiled("samples/tiny_gpt.scale"))
    outer = re.search(r'<svg class="timeline-chart"[^>]*width="([\d.]+)"[^>]*viewBox="0 0 ([\d.]+) ', page)
    zoom = float(outer.group(1)) / float(outer.group(2))
    inner = re.search(r'<svg xmlns="http://www.w3.org/2000/svg" width="\d+" height="\d+" font-family="monospace" '
                      r'font-size="(\d+)"', page)
    assert zoom > 1 and float(inner.group(1)) * zoom <= html.TEXT_PX + 0.5
