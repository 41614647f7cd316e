"""`scalec plan FILE --html OUT` and `scalec search FILE --html OUT`: one self-contained page to read in a browser.

The page is drawn from the very dictionaries `plan --json` and `search --json` print (`plan.plan_json`,
`search.to_json`) and from the SVG timeline `plan --svg` writes: nothing is recomputed here, so the page cannot
disagree with the text and the JSON. This module only turns those figures into geometry (bar widths, segments) and
words (units.py's formatters), and page.html.j2 lays them out.

Self-contained: inline CSS, inline SVG, one line of inline script (it marks the page rendered, which the browser test
reads), and a Content-Security-Policy that lets nothing else load or run: no network, no fonts, no external script.
Everything a user wrote that reaches the page (the file's path, and whatever a future model field carries) goes
through jinja2 with autoescape on; the only markup passed through unescaped is the timeline SVG, whose one text of
the user's (the model name, an identifier) schedule.svg escapes itself.

Deterministic: the same input gives the same bytes (no timestamps; the search's elapsed seconds are left out).
"""
from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

from compiler.report.goodput import duration
from compiler.report.units import count, flops, nbytes, seconds

# What marks the page rendered: the browser test reads `data-rendered` from the DOM chromium dumps. An inline script
# that failed to parse or run would leave it unset. Its hash goes into the page's Content-Security-Policy.
SCRIPT = 'document.documentElement.setAttribute("data-rendered", "ok");'

# The memory model's components of a rank's peak (cost/memory.py RankMemory.as_json), in the order they stack, with
# the words and colours of the legend. A component the model adds later shows as "other" until it is named here.
MEMORY_PARTS = (("weights", "weights", "#4e79a7"), ("gradients", "gradients", "#59a14f"),
                ("optimizer", "optimizer state", "#f28e2b"), ("activations", "activations", "#e15759"),
                ("working", "working set (buffers in flight)", "#76b7b2"))
OTHER = ("other", "not itemised", "#bab0ac")
COMPUTE_COLOUR, BUBBLE_COLOUR, OPTIMIZER_COLOUR = "#4e79a7", "#d3d3d3", "#f28e2b"
AXIS_COLOURS = ("#e15759", "#b07aa1", "#59a14f", "#edc948", "#9c755f", "#ff9da7", "#76b7b2")

BAR_WIDTH = 640   # pixels of the longest bar
LABEL_WIDTH = 190  # the rank names left of the bars
ROW = 26           # pixels per bar
TIMELINE_WIDTH = 1080  # pixels the timeline may grow to
ON_SCALE = 0.02  # the least share of the device the fullest rank uses for bars drawn against the device (12.8 px)
TEXT_PX = 14  # the page's text size (its CSS): the zoomed timeline's text is drawn no larger


def plan_html(compiled) -> str:
    """The page of `scalec plan FILE --html OUT`, from `plan --json`'s dictionary and `--svg`'s timeline."""
    from compiler.report import plan as RP
    return plan_page(RP.plan_json(compiled), RP.schedule_svg(compiled))


def search_html(result) -> str:
    """The page of `scalec search FILE --html OUT`, from `search --json`'s dictionary; for the best plan also its
    collectives (as `plan --json` lists them) and its schedule's timeline."""
    from compiler import search as SE
    from compiler.report import plan as RP
    best = None
    if result.winners:
        w = result.winners[0]
        best = {"ledger": RP.ledger_json(result.spec, w.plan, w.estimate.ledger, priced=True),
                "timeline_svg": RP.plan_schedule_svg(result.spec.model.name, w.plan)}
    written = ()
    if result.written is not None:  # the file's own plan beside the ranking, as the table prints it
        from compiler.search.written import lines
        written = [line.strip().removeprefix("- ") for line in
                   lines(result.written, result.winners, result.spec, result.limit_bytes)]
    return search_page(SE.to_json(result), best, written)


def plan_page(data: dict, timeline_svg: str) -> str:
    """`data` is `plan --json`'s object; `timeline_svg` the schedule's SVG."""
    mem, pred, dev = data["memory"], data["predicted"], data["mesh"]
    peak, limit = mem["peak_bytes"], mem["device_bytes"]
    facts = [("model", data["model"]), ("file", data["file"]),
             ("parameters", f"{data['parameters']:,} ({count(data['parameters'])})"),
             ("mesh", _mesh(data["mesh"]["axes"], dev["world_size"], dev["nodes"], dev["devices_per_node"],
                            dev["device"])),
             ("device", f"{dev['device']}: {dev['peak_tflops']:g} TFLOP/s peak, "
                        f"{nbytes(dev['device_memory_bytes'])} memory"),
             ("batch", f"{data['plan']['global_batch']} sequences × {data['plan']['seq_len']} tokens = "
                       f"{data['tokens_per_step']:,} tokens per step; micro-batches of {data['micro_batch_size']}"),
             ("compute", f"{flops(data['flops_per_step'])} per step (model FLOPs: matmuls, forward + backward)"
                         + (f"; {flops(data['hardware_flops_per_step'])} on the hardware, with recomputation "
                            "and padding" if data["hardware_flops_per_step"] != data["flops_per_step"] else "")),
             ("plan", _settings(data["plan"]))]
    headline = _headline(pred, peak, limit)
    sections = {
        "memory": _memory_view(mem["ranks"], limit),
        "time": _time_view(pred) if pred else None,
        "timeline_svg": timeline_svg, "piped": data["plan"]["axes"].get("pp", 1) > 1,
        "ledger": _ledger_view(data["ledger"]),
        "goodput": _goodput_view(data.get("goodput")),
        "cost": _cost_view(data.get("step"), data.get("run"), data.get("power")),
    }
    fixes = [{"change": f["change"], "peak": nbytes(f["peak_bytes"]), "fits": f["fits"]} for f in mem["fixes"]]
    return _render("plan", title=f"plan for {data['model']}", model=data["model"], file=data["file"], facts=facts,
                   headline=headline, details=sections, diagnostics=data["diagnostics"], fixes=fixes,
                   pipeline_rows=_stage_rows(data.get("pipeline")))


def _goodput_view(g: dict | None) -> list | None:
    """plan.json's "goodput" as (what, figure) rows (compiler/cost/goodput.py)."""
    if g is None:
        return None
    interval = g["checkpoint_interval_s"]
    every = g["checkpoint_every"]
    return [("ETTR, predicted", f"{g['ettr']:.1%}"),
            ("checkpoint interval", "none before the last step" if interval is None else
             f"{duration(interval)} ({every:,} steps{', auto' if g['auto'] else ''})"),
            ("best interval τ = √(2·C·M)", f"{duration(g['best_interval_s'])}: ETTR {g['ettr_at_best']:.1%}"),
            ("MTBF of the job, M", f"{duration(g['mtbf_hours'] * 3600)} ({g['rate_per_gpu_hour']:.3g} per device-hour "
                                   f"× {g['devices']:,} devices)"),
            ("save, C", duration(g["save_s"]) + ("" if g["staging_s"] is None else
                                                 f" (staging; files written in {duration(g['write_s'])})")),
            ("restart, R", duration(g["restart_s"]))]


def _cost_view(step: dict | None, run: dict | None, power: dict | None) -> list | None:
    """plan.json's "step", "run" and "power" as (what, figure) rows (compiler/cost/energy.py)."""
    from compiler.report.cost import dollars, joules
    if step is None or run is None:
        return None
    return [("per step", f"{duration(step['seconds'])}, {joules(step['joules'], kwh=False)}, "
                         f"{dollars(step['usd'])}"),
            ("of which the pipeline bubble", joules(step["bubble_joules"], kwh=False)),
            ("a straggler at the threshold", f"+{duration(step['straggler_seconds'])}, "
                                             f"+{joules(step['straggler_joules'], kwh=False)} a step"),
            ("the run", f"{run['steps']:,} steps in {duration(run['wall_s'])} (ETTR {run['ettr']:.1%})"),
            ("GPU-hours", f"{run['gpu_hours']:,.0f}"),
            ("energy", f"{joules(run['kwh'] * 3.6e6)} at PUE {power['pue']:g}"),
            ("dollars", f"{dollars(run['usd'])} at ${power['usd_per_gpu_hour']:g} per device-hour"),
            ("carbon", f"{run['tco2e']:,.4g} tCO2e at {power['grid_g_per_kwh']:g} g/kWh ({power['grid_region']})"),
            ("tokens per joule", f"{run['tokens_per_joule']:.4g}")]


def search_page(data: dict, best: dict | None, written=()) -> str:
    """`data` is `search --json`'s object; `best`, when a plan won, the best plan's `ledger` (as `plan --json`
    lists it) and `timeline_svg`; `written`, the lines on the file's own plan (compiler/search/written.py)."""
    cl = data["cluster"]
    limit = cl["device_memory_bytes"]
    rows = []
    for w in data["winners"]:
        p = w["predicted"]
        rows.append({"rank": w["rank"], "step": seconds(p["step_time_s"]), "tokens": f"{p['tokens_per_s']:,.0f}",
                     "mfu": f"{p['mfu']:.1%}", "peak": nbytes(w["peak_bytes"]), "bubble": f"{p['bubble_fraction']:.1%}",
                     "exposed": _exposed(p["exposed_comm_s"]), "describe": w["describe"], "reasons": w["reasons"]})
    details = None
    if data["winners"] and best is not None:
        w = data["winners"][0]
        details = {"describe": w["describe"], "memory": _memory_view(w["memory"], limit),
                   "time": _time_view(w["predicted"]), "timeline_svg": best["timeline_svg"],
                   "piped": w["plan"]["axes"].get("pp", 1) > 1,
                   "ledger": _ledger_view(best["ledger"])}
    c = data["counts"]
    facts = [("model", data["model"]), ("file", data["file"]),
             ("cluster", f"{cl['nodes']} node{'s' if cl['nodes'] != 1 else ''} × {cl['devices_per_node']} "
                         f"{cl['device']} ({nbytes(limit)} each)"),
             ("fixed", ", ".join(f"{k}={v}" for k, v in data["fixed"].items()) or "nothing (every setting free)")]
    counts = (f"{c['space']:,} candidates in {c['families']:,} families; {c['family_rules']:,} families refused by "
              f"the rules, {c['bounded_families']:,} bounded, {c['expanded']:,} expanded; {c['checked']:,} variants "
              f"checked, {c['costed']:,} costed, {c['fitting']:,} fit, {c['exact']:,} simulated exactly")
    headline = []
    if data["winners"]:
        w = data["winners"][0]
        headline = _headline(w["predicted"], w["peak_bytes"], limit)
    return _render("search", title=f"search for {data['model']}", model=data["model"], file=data["file"],
                   facts=facts, headline=headline, winners=rows, rejected=data["rejected"], counts=counts,
                   details=details, pipeline_rows=[], written=list(written))


# -- views: the figures as the template shows them -------------------------------------------------------------


def _mesh(axes: dict, world: int, nodes: int, per_node: int, device: str) -> str:
    shown = " × ".join(f"{a}={n}" for a, n in axes.items()) or "one device"
    return f"{shown}: world {world} = {nodes} node{'s' if nodes != 1 else ''} × {per_node} {device}"


def _settings(plan: dict) -> str:
    """The plan settings a reader looks for first, as plan.json names them."""
    out = [f"data_parallel = {plan['data_parallel']}", f"micro_batches = {plan['micro_batches']}",
           f"micro_batch_size = {plan['micro_batch_size']}"]
    if plan["axes"].get("pp", 1) > 1:
        out += [f"schedule = {plan['schedule']}", f"virtual_stages = {plan['virtual_stages']}"]
    if plan["axes"].get("tp", 1) > 1:
        out += [f"sequence_parallel = {str(plan['sequence_parallel']).lower()}",
                f"tp_layers = ({', '.join(plan['tp_layers'])})"]
    out += [f"recompute = {plan['recompute']}", f"compile = {str(plan['compile']).lower()}",
            f"grad_reduce = {plan['grad_reduce']}"]
    return "; ".join(out)


def _headline(pred: dict | None, peak: int, limit: int) -> list:
    """The four figures at the top: step time, tokens/s, MFU, peak memory against the device's; each (label,
    value, what it means, whether it is bad news)."""
    out = []
    if pred:
        out += [("step time", seconds(pred["step_time_s"]), "predicted", False),
                ("tokens/s", f"{pred['tokens_per_s']:,.0f}", "the whole mesh", False),
                ("MFU", f"{pred['mfu']:.1%}", f"{pred['model_tflops_per_device']:.4g} model TFLOP/s per device",
                 False)]
    share = peak / limit if limit else 0.0
    out.append(("peak memory", nbytes(peak), f"{_share(share)} of {nbytes(limit)}"
                + ("" if peak <= limit else ": does NOT fit"), peak > limit))
    return out


def _share(x: float) -> str:
    return f"{x:.1%}" if x >= 0.001 or x == 0 else "under 0.1%"


def _memory_view(ranks: list, limit: int) -> dict:
    """One stacked bar per kind of rank (each pp rank under pp), its components in MEMORY_PARTS' order, on one scale
    with the device's capacity. When the capacity is so far beyond every peak that the bars would be slivers (a toy
    model on a big device: under ON_SCALE of it), the bars are drawn to the largest peak instead and the capacity
    line is said to be off the scale, with the share used, so the bars stay readable."""
    top = max([r["peak_bytes"] for r in ranks] + [1])
    # The bars are drawn against the device: a rank at 39% is a bar 39% long beside the capacity line, never a full
    # bar. Only when the fullest rank would be a sliver (under ON_SCALE of the device: a toy model on a big device)
    # are they drawn to it instead, and the note says the capacity is off the scale and what share is used.
    capacity_on_scale = top >= ON_SCALE * limit
    scale = max(top, limit if capacity_on_scale else 0) * 1.04
    bars, legend_used = [], set()
    for i, r in enumerate(ranks):
        parts = [(key, label, colour, r.get(key, 0)) for key, label, colour in MEMORY_PARTS]
        rest = r["peak_bytes"] - sum(v for *_, v in parts)
        if rest > 0:
            parts.append((*OTHER, rest))
        x, segs = 0.0, []
        for key, label, colour, v in parts:
            if v <= 0:
                continue
            w = v / scale * BAR_WIDTH
            segs.append({"key": key, "x": f"{LABEL_WIDTH + x:.2f}", "w": f"{w:.2f}", "colour": colour,
                         "title": f"{r['who']}: {label} {nbytes(v)}"})
            legend_used.add(key)
            x += w
        bars.append({"who": r["who"], "label": _short(r["who"]), "y": 8 + i * ROW, "segments": segs,
                     "peak": nbytes(r["peak_bytes"]), "end": LABEL_WIDTH + BAR_WIDTH + 8, "share": _share(r["peak_bytes"] / limit) if limit else "",
                     "row": {"weights": nbytes(r.get("weights", 0)), "gradients": nbytes(r.get("gradients", 0)),
                             "optimizer": nbytes(r.get("optimizer", 0)),
                             "activations": nbytes(r.get("activations", 0)),
                             "working": nbytes(r.get("working", 0)), "other": nbytes(max(rest, 0)),
                             "moment": r.get("moment", ""), "in_flight": r.get("in_flight", "")}})
    height = 8 + len(ranks) * ROW + (24 if capacity_on_scale else 0)
    legend = [{"label": label, "colour": colour} for key, label, colour in (*MEMORY_PARTS, OTHER)
              if key in legend_used]
    cap = None
    if capacity_on_scale:
        cap = {"x": f"{LABEL_WIDTH + limit / scale * BAR_WIDTH:.2f}", "label": f"device capacity {nbytes(limit)}"}
    return {"bars": bars, "legend": legend, "capacity": cap, "height": height,
            "width": LABEL_WIDTH + BAR_WIDTH + 170, "label_x": LABEL_WIDTH - 8, "limit": nbytes(limit), "axis_y": height - 10,
            "off_scale": None if capacity_on_scale else
            f"Device capacity {nbytes(limit)}: off this scale (the fullest rank uses {_share(top / limit)})",
            "other": any(b["row"]["other"] != nbytes(0) for b in bars)}


def _short(who: str) -> str:
    """A rank's name as the bars' label: `pp rank 0 (stages 0, 4, 8, ...)` past 26 characters is `pp rank 0 (20
    stages)`; the whole name is in the bar's tooltip and the table."""
    if len(who) <= 26 or " (" not in who:
        return who
    head, _, inner = who.partition(" (")
    n = inner.count(",") + 1
    return f"{head} ({n} stages)" if inner.startswith("stages") else head


def _time_view(pred: dict) -> dict:
    """The step of the rank that ends last, cut into the step-time model's parts: the pipeline bubble (its idle
    share), each axis's exposed communication, the optimizer, and the rest: computation (with the runtime's
    per-step overhead). Then each kind of rank as the model reports it, and the links."""
    step = pred["step_time_s"]
    parts = [("bubble (idle in the schedule)", pred["bubble_fraction"] * step, BUBBLE_COLOUR)]
    axes = list(pred["exposed_comm_s"])
    colour = {a: AXIS_COLOURS[i % len(AXIS_COLOURS)] for i, a in enumerate(axes)}
    parts += [(f"exposed {a} communication", t, colour[a]) for a, t in pred["exposed_comm_s"].items()]
    parts.append(("optimizer (AdamW)", pred["optimizer_s"], OPTIMIZER_COLOUR))
    compute = max(step - sum(t for _, t, _ in parts), 0.0)
    parts.insert(0, ("computation (and runtime overhead)", compute, COMPUTE_COLOUR))
    x, segs = 0.0, []
    for label, t, c in parts:
        if t <= 0:
            continue
        w = t / step * BAR_WIDTH if step else 0.0
        segs.append({"label": label, "x": f"{x:.2f}", "w": f"{w:.2f}", "colour": c, "time": seconds(t),
                     "share": f"{t / step:.1%}" if step else ""})
        x += w
    ranks = [{"who": r["who"], "compute": seconds(r["compute_s"]), "idle": seconds(r["idle_s"]),
              "exposed": _exposed(r["exposed_comm_s"]), "end": seconds(r["end_s"])} for r in pred["ranks"]]
    links = [{"axis": k["axis"], "size": k["size"], "crosses": "yes" if k["crosses_nodes"] else "no",
              "gbps": f"{k['gbps']:g}", "latency": f"{k['latency_us']:g} µs"} for k in pred["links"]]
    return {"step": seconds(step), "segments": segs, "width": BAR_WIDTH, "ranks": ranks, "links": links}


def _exposed(comm: dict) -> str:
    items = sorted(((a, t) for a, t in comm.items() if t > 0), key=lambda x: -x[1])
    return ", ".join(f"{a} {seconds(t)}" for a, t in items) or "none"


def _ledger_view(ledger: list) -> list:
    """Every collective of one step: where the .scale file caused it, the axis it runs over, how often, the tier
    its group crosses, the algorithm, seconds and bus bandwidth the step-time model prices it at (plan --json's
    "tier", "algorithm", "seconds", "busbw_gbps"), the bytes of one call and of the step (per rank), the formula
    and the reason."""
    direction = {"forward": "fwd", "backward": "bwd", "step": "step"}
    return [{"op": c["op"], "axis": c["axis"], "direction": direction.get(c["direction"], c["direction"]),
             "times": c["times"], "per_call": nbytes(c["bytes"] / c["times"]) if c["times"] else "-",
             "bytes": nbytes(c["bytes"]), "formula": c["formula"], "at": c["at"] or "-", "reason": c["reason"],
             "measured": "yes" if c["measured"] else "no", "tier": c.get("tier") or "-",
             "algorithm": c.get("algorithm") or "-",
             "seconds": seconds(c["seconds"]) if c.get("seconds") is not None else "-",
             "busbw": f"{c['busbw_gbps']:.4g}" if c.get("busbw_gbps") is not None else "-"} for c in ledger]


def _stage_rows(pipeline: dict | None) -> list:
    if not pipeline:
        return []
    return [{"stage": s["stage"], "rank": s["rank"], "blocks": f"{s['blocks'][0]}..{s['blocks'][1] - 1}",
             "parameters": f"{s['parameters']:,}", "state": nbytes(s["model_state_bytes"]),
             "activations": nbytes(s["activation_bytes_in_flight"])} for s in pipeline["stages"]]


def _zoomed(svg: str) -> str:
    """schedule.svg's drawing inside an outer SVG that scales it up (its boxes are 18 pixels per forward: small on
    a page) within the page's width, and no further than brings its text (font-size 10) to the page's TEXT_PX: a
    small timeline (one rank, two boxes) zoomed twice had 20-24 px text, twice the page's. The drawing itself is
    today's `plan --svg`, unchanged."""
    got = re.match(r'<svg [^>]*width="(\d+)" height="(\d+)"', svg)
    if not got:
        return svg
    w, h = int(got.group(1)), int(got.group(2))
    size = re.match(r'<svg [^>]*font-size="(\d+(?:\.\d+)?)"', svg)
    z = max(1.0, min(TEXT_PX / float(size.group(1)) if size else 1.0, TIMELINE_WIDTH / w))
    return (f'<svg class="timeline-chart" xmlns="http://www.w3.org/2000/svg" width="{w * z:.0f}" '
            f'height="{h * z:.0f}" viewBox="0 0 {w} {h}">\n{svg}</svg>\n')


# -- the template ----------------------------------------------------------------------------------------------


def _render(kind: str, **context) -> str:
    import jinja2
    from markupsafe import Markup
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    digest = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
    details = context.get("details")
    if details is not None:  # schedule.svg's own text, escaped there: passed through as markup
        details = {**details, "timeline_svg": Markup(_zoomed(details["timeline_svg"]))}
    context["details"] = details
    return env.get_template("page.html.j2").render(kind=kind, script=Markup(SCRIPT), script_hash=digest, **context)
