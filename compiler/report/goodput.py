"""`plan`'s goodput block: the failure model's figures (compiler/cost/goodput.py), each with its inputs and formula,
as text (`goodput_text`) and plan.json's "goodput" (`goodput_json`)."""
from __future__ import annotations

from compiler.cost import goodput as GP
from compiler.report.units import nbytes, seconds


def duration(t: float) -> str:
    """A duration in the unit it is read in: ms, s, min, h or days."""
    if t < 120:
        return seconds(t, smallest="ms")
    if t < 2 * 3600:
        return f"{t / 60:.3g} min"
    if t < 2 * 86400:
        return f"{t / 3600:.3g} h"
    return f"{t / 86400:,.3g} days" if t < 1e3 * 86400 else f"{t / 86400:,.0f} days"


def _steps(n: int) -> str:
    return f"{n:,} step{'s' if n != 1 else ''}"


def goodput_text(compiled) -> list[str]:
    """The block: ETTR as the program runs and at the best interval, the interval (written, auto's or none), then
    M, C and R with their inputs."""
    g = GP.of(compiled)
    if g is None:
        return []
    lines = [""]
    young = GP.young_interval(g.save_s, g.mtbf_s)
    best = f"τ = √(2·C·M) = √(2 × {duration(g.save_s)} × {duration(g.mtbf_s)}) = {duration(young)} (Young 1974)"
    if g.best_interval_s > young * (1 + 1e-9):
        floor = "the files' write" if g.best_interval_s == g.write_s and g.staging_s is not None else "one step"
        best += f", raised to {floor}: {duration(g.best_interval_s)}"
    interval = g.interval_s
    if not g.checkpoints:
        head = (f"goodput     ETTR {g.ettr:.1%} predicted: no checkpoint_dir, so every interruption starts the run "
                f"again at step 0 ({_steps(g.steps)}, {duration(g.run_s)} of work)")
        lines += [head, f"            with checkpoints every {_steps(g.best_steps)} ({duration(g.best_interval_s)}) "
                        f"it would be {g.ettr_best:.1%}: add `checkpoint_dir` and `checkpoint_every = auto`"]
    elif interval is None and g.auto:
        lines += [f"goodput     ETTR {g.ettr:.1%} predicted: checkpoint_every = auto is {_steps(g.every)} "
                  f"(τ / step time = {duration(g.best_interval_s)} / {duration(g.step_s)}), not shorter than the run "
                  f"({_steps(g.steps)}): only the last step is saved"]
    elif interval is None:
        lines += [f"goodput     ETTR {g.ettr:.1%} predicted: checkpoint_every = {g.every} saves only the last step, "
                  "so every interruption starts the run again at step 0",
                  f"            every {_steps(g.best_steps)} ({duration(g.best_interval_s)}) it would be "
                  f"{g.ettr_best:.1%}: `checkpoint_every = auto`"]
    else:
        how = (f"auto: τ / step time = {duration(g.best_interval_s)} / {duration(g.step_s)}, rounded" if g.auto
               else "as written")
        lines += [f"goodput     ETTR {g.ettr:.1%} predicted, checkpoints every {_steps(g.every)} = "
                  f"{duration(interval)} ({how})"]
        if not g.auto:
            lines += [f"            at the best interval, {_steps(g.best_steps)} ({duration(g.best_interval_s)}): "
                      f"{g.ettr_best:.1%} (`checkpoint_every = auto` writes it)"]
    lines += [f"            failures: {g.rate_per_gpu_hour:.3g} interruptions per device-hour ({g.rate_source})",
              f"              MTBF M = 1 / (rate × {g.devices:,} device{'s' if g.devices != 1 else ''}) = "
              f"{duration(g.mtbf_s)}"]
    written = (f"{nbytes(g.save_bytes_node)} per node ({GP.CHECKPOINT_BYTES_PER_PARAM} B a parameter, fp32 weights "
               f"and AdamW's moments, each written once, over {g.nodes:,} node{'s' if g.nodes != 1 else ''})",
               f"at {g.write_gbps:.3g} GB/s per node ({g.storage_source}) = {duration(g.write_s)}")
    if g.staging_s is None:
        lines += [f"            save C = {duration(g.save_s)}: {written[0]}", f"              {written[1]}"]
    else:
        lines += [f"            save C = {duration(g.save_s)}: the staging copy that blocks the step "
                  f"(checkpoint_async), {nbytes(g.staging_bytes)} per rank at {g.host_gbps:g} GB/s device to host",
                  f"              the files, written meanwhile: {written[0]} {written[1]}"]
    if g.restart_written:
        lines += [f"            restart R = {duration(g.restart_s)} as written (`restart`)"]
    else:
        parts = [f"start-up {duration(g.startup_s)} ({g.startup_source})",
                 f"load {nbytes(g.load_bytes_node)} per node at {g.read_gbps:.3g} GB/s = {duration(g.load_s)}"]
        parts += [f"compile {duration(g.compile_s)}"] if g.compile_s else []
        lines += [f"            restart R = {duration(g.restart_s)}: " + " + ".join(parts)]
    lines += [f"            best interval {best}",
              "            ETTR = τ / (M·e^(R/M)·(e^((τ+C)/M) − 1)) (Daly 2006); figures and sources: "
              "compiler/layout/failures.py"]
    return lines


def goodput_json(compiled) -> dict | None:
    g = GP.of(compiled)
    return None if g is None else g.as_json()
