"""`plan`'s energy, dollars and carbon (compiler/cost/energy.py), each with its inputs and formula, as text
(`cost_text`) and plan.json's "step", "run" and "power" (`cost_json`)."""
from __future__ import annotations

from compiler.cost import energy as E
from compiler.report.goodput import duration
from compiler.report.units import count


def joules(j: float, *, kwh: bool = True) -> str:
    """Energy in the unit it is read in: J, kJ, MJ below a kWh's worth (always, `kwh=False`: a step's); kWh, MWh,
    GWh above."""
    if abs(j) < 3.6e6 or not kwh:
        return count(j, "J")
    kwh = j / E.J_PER_KWH
    for scale, unit in ((1e6, "GWh"), (1e3, "MWh")):
        if kwh >= scale:
            return f"{kwh / scale:.4g} {unit}"
    return f"{kwh:.4g} kWh"


def dollars(usd: float) -> str:
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(usd) >= scale:
            return f"${usd / scale:.4g}{unit}"
    return f"${usd:.4g}" if usd >= 1 else f"${usd:.3g}"


def tonnes(t: float) -> str:
    """Tonnes of CO2e: whole tonnes from 100 up, 3 significant digits below."""
    return f"{t:,.0f}" if t >= 100 else f"{t:.3g}"


def _watts(w: float) -> str:
    return count(w, "W")


def _power_lines(p, dev: str) -> list[str]:
    """The power block's two lines: each figure with its source, or, where one source holds for every figure of a
    line, that source once at its end."""
    def line(items):
        sources = {p.source(k) for _, k in items}
        if len(sources) == 1:
            return ", ".join(t for t, _ in items) + f" ({sources.pop()})"
        return ", ".join(f"{t} ({p.source(k)})" for t, k in items)
    device = [(f"{p.active_w:g} W computing", "active_w"), (f"{p.communicating_w:g} W communicating",
                                                          "communicating_w"), (f"{p.idle_w:g} W idle", "idle_w")]
    node = [(f"{_watts(p.host_w)} host", "host_w"), (f"{_watts(p.network_w)} network", "network_w")]
    return [f"power       {dev}: {line(device)}",
            f"            per node {line(node)}; PUE {p.pue:g} ({p.source('pue')})"]


def cost_text(compiled) -> list[str]:
    r = E.of(compiled)
    if r is None:
        return []
    s, p = r.step, r.step.power
    dev = compiled.spec.cluster.device.kind
    slow = max(s.ranks, key=lambda k: k.joules)
    lines = [""] + _power_lines(p, dev) + [
             f"energy      {joules(s.joules, kwh=False)} per step, {_watts(s.watts)} at the facility = PUE {p.pue:g} × "
             f"(devices {joules(s.devices_j, kwh=False)} + hosts {joules(s.hosts_j, kwh=False)} + network "
             f"{joules(s.network_j, kwh=False)})",
             f"            a device of {slow.who}: {p.active_w:g} W × {duration(slow.active_s)} computing + "
             f"{p.communicating_w:g} W × {duration(slow.communicating_s)} communicating + {p.idle_w:g} W × "
             f"{duration(slow.bubble_s + slow.waiting_s)} idle = {joules(slow.joules)}"]
    if s.bubble_j > 0:
        lines += [f"            pipeline bubble {joules(s.bubble_j, kwh=False)} a step ({s.bubble_j / s.joules:.1%}): devices "
                  f"idle in the schedule"]
    if s.straggler_s > 0:
        lines += [f"            a straggler at score {s.threshold:g} (the detection threshold): +{duration(s.straggler_s)}"
                  f" and +{joules(s.straggler_j, kwh=False)} a step, every other device idle meanwhile"]
    lines += [f"cost        {dollars(s.usd)} per step = {s.devices:,} device{'s' if s.devices != 1 else ''} × "
              f"{duration(s.seconds)} × ${p.usd_per_gpu_hour:g} per device-hour ({p.source('usd_per_gpu_hour')})"]
    length = (f"tokens = {count(r.tokens_written)} / {s.tokens:,} a step" if r.tokens_written is not None
              else f"{r.tokens:,} tokens")
    lines += [f"run         {r.steps:,} steps ({length}) in {duration(r.wall_s)} at ETTR {r.ettr:.1%}, {r.ettr_note}",
              f"            {count(r.gpu_hours)} GPU-hours, {joules(r.joules)}, {dollars(r.usd)}, "
              f"{tonnes(r.tco2e)} tCO2e at {p.grid_g_per_kwh:g} g/kWh ({p.source('grid')})",
              f"            {r.tokens_per_joule:.4g} tokens per joule, {count(r.flops_per_joule, 'FLOP')} (model) per "
              f"joule; figures and sources: compiler/layout/power.py"]
    return lines


def cost_json(compiled) -> dict:
    """plan.json's "step", "run" and "power" (null without a decided plan)."""
    r = E.of(compiled)
    if r is None:
        return {"step": None, "run": None, "power": None}
    p = r.step.power
    power = {"active_w": p.active_w, "communicating_w": p.communicating_w, "idle_w": p.idle_w, "host_w": p.host_w,
             "network_w": p.network_w, "pue": p.pue, "grid_g_per_kwh": p.grid_g_per_kwh, "grid_region": p.grid_region,
             "usd_per_gpu_hour": p.usd_per_gpu_hour, "written": list(p.written)}
    return {"step": r.step.as_json(), "run": {**r.as_json(), "ettr_note": r.ettr_note}, "power": power}
