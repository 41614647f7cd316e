"""`scalec plan`: what a compiled plan costs, as text (`plan_text`), as JSON for tools (`plan_json`, keys described
in docs/planning.md) and as the pipeline schedule's timeline (`schedule_svg`).

The text reads top to bottom as the compiler decided: the mesh, parameters, batch, FLOPs, the predicted step time,
memory per rank (and what would fit when it does not), each MoE layer, the pipeline and its schedule, then every
collective of one step with the `.scale` line that caused it. The goldens under tests/golden/samples pin it.
"""
from __future__ import annotations

import os

from compiler import cost as C
from compiler.cost import fp8 as FP8
from compiler.cost import rebalance as REB
from compiler.cost import links as LK
from compiler import spec as S
from compiler.report import cost as CR
from compiler.report import goodput as GPR
from compiler.report import traffic as TR
from compiler.report.units import count, flops, nbytes, seconds


def _seconds(t: float) -> str:
    """`plan` has always written durations under a millisecond in ms (`0.412 ms`); search goes down to µs."""
    return seconds(t, smallest="ms")


def plan_text(compiled) -> str:
    """What `scalec plan FILE` prints: each figure with the formula it came from, so a reader can check it."""
    spec, costs, plan = compiled.spec, compiled.costs, compiled.plan
    m, t, cl = plan, spec.train, spec.cluster
    dev = cl.device
    values = _values(compiled)
    dp = m.size("dp")
    gb, seq = spec.value(t.global_batch), spec.value(t.seq_len)
    lines = [f"plan for `{spec.model.name}` ({spec.path})", ""]
    axes = "  ".join(f"{a}={n}" for a, n in m.axes) or "(none)"
    lines += [f"mesh        {axes}   world {m.world_size} = {cl.nodes} node{'s' if cl.nodes != 1 else ''} × "
              f"{cl.devices_per_node} {dev.kind} ({dev.peak_tflops:g} TFLOP/s peak, "
              f"{dev.memory_gb:g} GB each)"]
    placed = LK.resolved(plan, cl, costs.ledger)
    if placed is not None:  # only where the mesh writes a placement
        lines += [f"placement   {placed.describe()}; ranks by mesh coordinate (row-major): "
                  + (" ".join(map(str, placed.rank_map.ranks)) if m.world_size <= 64 else f"{m.world_size} ranks")]
    lines += [f"parameters  {costs.params_n:,} ({count(costs.params_n)})",
              f"            = {C.formula(costs.params, values)}"]
    ranks = f"dp {dp} × ep {m.size('ep')}" if m.size("ep") > 1 else f"dp {dp}"
    lines += [f"batch       {gb} sequences × {seq} tokens = {costs.tokens_step:,} tokens per step; "
              f"{ranks} × {plan.micro_batches} micro-batch{'es' if plan.micro_batches != 1 else ''} of "
              f"{costs.micro_batch_size} sequences per rank"]
    lines += [f"compute     {flops(costs.flops_step_n, scientific=True)} per step ({flops(costs.flops_step_n)}; "
              f"model FLOPs: matmuls, forward + backward)",
              f"            = {C.formula(costs.flops_step, values)}"]
    recompute = plan.recompute
    padded = compiled.model.formulas.padding_step != 0  # the experts' empty slots (none under dispatch = grouped)
    if recompute != "none" or padded:
        why = " and ".join(w for w, on in ((f"{recompute} recomputation's extra forward", recompute != "none"),
                                           ("the experts' empty slots (buffers padded to capacity)", padded)) if on)
        hw = flops(costs.flops_step_hw_n, scientific=True, what="hardware FLOP")
        lines += [f"            {hw} per step with {why} "
                  f"({costs.flops_step_hw_n / costs.flops_step_n:.3f}× the model's)",
                  f"            = {C.formula(costs.flops_step_hw, values)}"]
    if costs.flops_rank_step_hw_n * m.world_size != costs.flops_step_hw_n:
        lines += [f"            {flops(costs.flops_rank_step_hw_n, scientific=True)} per step on the busiest rank"]
    lines += _step_time_text(compiled)
    lines += _memory_text(compiled)
    lines += GPR.goodput_text(compiled)
    lines += CR.cost_text(compiled)
    lines += _moe_text(compiled)
    lines += _context_text(compiled)
    lines += _pipeline_text(compiled)
    lines += ["", "collectives per step" + (f" ({_pp_rank0(plan)}):" if m.size("pp") > 1 else ":")]
    if not costs.ledger.entries:
        lines += ["  none (one replica, no sharding)"]
    wide = max([4] + [len(c.axis) for c in costs.ledger.entries])  # a folded group's name: dp×cp×ep
    if costs.ledger.entries:
        lines += [f"  {'op':<15} {'axis':<{wide}} {'pass':<4} {'calls':<5} {'tier':<10} {'algorithm':<9} "
                  f"{'seconds':>9} {'busbw GB/s':>10} {'bytes':>10}"]
    for c, p in zip(costs.ledger.entries, TR.priced(spec, plan, costs.ledger)):
        b = spec.value(c.bytes_per_step(), plan)
        src = f"{os.path.basename(c.span.file)}:{c.span.line}" if c.span else "-"
        times = spec.value(c.per_step, plan)
        where = (f"{p.tier:<10} {p.algorithm:<9} {_seconds(p.seconds):>9} {p.busbw_gbps:>10.4g}" if p is not None
                 else _host_where(dev, c) if c.axis == "host" else f"{'-':<10} {'-':<9} {'-':>9} {'-':>10}")
        lines += [f"  {c.op:<15} {c.axis:<{wide}} {_DIRECTION[c.direction]:<4} ×{times:<4} {where} {nbytes(b):>10} = "
                  f"{C.formula(c.bytes_per_step(), values)} bytes  [{src}] {c.reason}"
                  + (f"; at most {nbytes(c.worst_bytes)}" if c.worst_bytes is not None else "")]
    lines += ["  (bytes: the full tensor each call moves, per rank and step; DDP/FSDP traffic is theirs to schedule;"
              " seconds: all its calls on its group's link, as the step-time model prices them, whether or not"
              " compute hides them; busbw: one call's, in nccl-tests' terms)"
              if costs.ledger.entries else ""]
    lines += _traffic_text(compiled)
    return "\n".join(lines) + "\n"


def _host_where(dev, c) -> str:
    """A host<->device copy's columns in the collectives table: the host link (devices.py `host_gbps`), a copy,
    its calls' seconds on that link (compiler/cost/offload.py `copy_s`: how much of it the step hides is the step
    time's to say), the link's bandwidth."""
    from compiler.cost import offload as OFF
    return f"{'host link':<10} {'copy':<9} {_seconds(OFF.copy_s(dev, c.bytes)):>9} {dev.host_gbps:>10.4g}"


def _traffic_text(compiled) -> list[str]:
    """The step's bytes per tier, and where the mesh describes its network what the placement saves over the
    mesh's own order (compiler/report/traffic.py)."""
    tiers = TR.by_tier(compiled)
    if not tiers:
        return []
    plan = compiled.plan
    lines = ["traffic per step, by the tier each group crosses"
             + (f" ({_pp_rank0(plan)}):" if plan.size("pp") > 1 else " (every rank):")]
    wide = max(len(", ".join(t.axes)) for t in tiers)
    lines += [f"  {t.tier:<10} {nbytes(t.bytes):>10}  {', '.join(t.axes):<{wide}}  exposed {_seconds(t.exposed_s)}"
              for t in tiers]
    naive = TR.naive_placement(compiled)
    if naive is not None:
        order = ", ".join(naive.order)
        lines += [f"naive placement (mesh order, innermost first: {order}): {_seconds(naive.step_s)} per step, "
                  f"{naive.ratio:.2f}x the plan's"
                  + (" (no placement is written: the plan is on the mesh's order)" if naive.same else
                     f" {_seconds(compiled.costs.step.step_time_s)}")]
    return lines


_DIRECTION = {"forward": "fwd", "backward": "bwd", "step": "step"}


def _values(compiled) -> dict:
    """Every symbol's number under the compiled plan: the file's sizes and the plan's axes (the order in which
    `formula` writes a formula's terms: the largest first)."""
    return {**compiled.spec.values, **S.axis_values(compiled.plan)}

def _step_time_text(compiled) -> list[str]:
    """The step-time model's prediction (compiler/cost/step_time.py): time, throughput, MFU, where the time goes."""
    pred = _prediction(compiled)
    if pred is None:
        return []
    dev = compiled.spec.cluster.device
    hw = ("" if abs(pred.hardware_tflops_per_device - pred.model_tflops_per_device) < 1e-9 else
          f" ({pred.hardware_tflops_per_device:.4g} hardware: with recomputation and padding)")
    how = "compiled" if compiled.plan.compiles else "eager"
    lines = ["", f"step time   {_seconds(pred.step_time_s)} per step predicted on {dev.kind}, {how} "
                 f"({dev.peak_tflops:g} TFLOP/s peak; figures and sources: compiler/layout/devices.py)",
             f"            {pred.tokens_per_s:,.0f} tokens/s; {pred.model_tflops_per_device:.4g} model TFLOP/s per "
             f"device{hw}; MFU {pred.mfu:.1%}"]
    exposed = ", ".join(f"{a} {_seconds(t)}" for a, t in pred.exposed_comm_s.items() if t > 0) or "none"
    busiest = _busiest_idle(pred)
    lines += [f"            pipeline bubble {pred.bubble_fraction:.1%} (the slowest rank idle in the schedule"
              f"{busiest}); exposed communication: {exposed}; "
              f"AdamW {_seconds(pred.optimizer_s)}"]
    lines += _offload_step_text(compiled, pred)
    lines += ["            links: " + "; ".join(k.describe() for k in pred.links)]
    lines += FP8.describe(compiled)  # precision = fp8: what it converts, saves and costs
    ranks = list(pred.ranks)
    if len(ranks) > 1:
        shown = ranks if len(ranks) <= 4 else [ranks[0], ranks[-1], max(ranks, key=lambda r: r.end_s)]
        seen = set()
        for r in shown:
            if r.who in seen:
                continue
            seen.add(r.who)
            lines += [f"            {r.who}: computes {_seconds(r.compute_s)}, waits {_seconds(r.idle_s)}, "
                      f"ends at {_seconds(r.end_s)}"]
    return lines


def _busiest_idle(pred) -> str:
    """Where the rank that computes most is not the slowest one: its idle share, the bubble on the step's critical
    path (stages of unequal work leave the light ranks waiting for the heavy ones: under dualpipev, pp rank 0,
    holding the first and the last stage, ends last and waits most)."""
    ranks = list(pred.ranks)
    if len(ranks) < 2 or pred.bubble_fraction == 0:
        return ""
    slowest = max(ranks, key=lambda r: r.end_s)
    busiest = max(ranks, key=lambda r: r.compute_s)
    if busiest is slowest or busiest.end_s <= 0:
        return ""
    return f"; the busiest, {busiest.who}, {busiest.idle_s / busiest.end_s:.1%}"


def _offload_step_text(compiled, pred) -> list[str]:
    """Under offload, what the host costs the step (compiler/cost/offload.py), with the host link's figures."""
    from compiler.cost import offload as OFF
    from compiler.plan import offload_text
    plan, dev = compiled.plan, compiled.spec.cluster.device
    if plan.offload == "none":
        return []
    copies = [c for c in compiled.costs.ledger.entries if c.axis == OFF.HOST]
    moved = sum(c.bytes for c in copies)
    link = (f"host link {dev.host_gbps:g} GB/s a direction"
            + (f", host AdamW {dev.host_adam_params_per_s / 1e9:.3g}e9 parameters/s" if plan.offload != "activations"
               else "") + " (compiler/layout/devices.py)")
    if plan.offload == "optimizer":
        down = sum(OFF.copy_s(dev, c.bytes) for c in copies)
        how = (f"the host's AdamW {_seconds(pred.host_step_s)} after its copies {_seconds(down)} "
               f"({nbytes(moved)}), beside the device's AdamW of the other {1 - plan.offload_fraction:.0%}: the "
               f"step's AdamW is the slower, {_seconds(pred.optimizer_s)}")
    elif plan.offload == "params":
        how = (f"the host's AdamW over every parameter {_seconds(pred.host_step_s)}; the shards' copies "
               f"({nbytes(moved)}) under the compute, {_seconds(pred.host_copy_s)} of them exposed")
    else:
        how = (f"the activations' copies ({nbytes(moved)}) under the compute, {_seconds(pred.host_copy_s)} of "
               "them exposed")
    return [f"            {offload_text(plan)}: {how}; {link}"]


def _memory_how(spec, plan) -> str:
    dp, stage = plan.size("dp"), plan.zero_stage
    if stage == 0:
        return "replicated on every dp rank (DDP)"
    # the group the ZeRO stages shard over (runtime.mesh's dense_mesh, runtime.train's _zero1_group): dp × cp under
    # context parallelism; under ep FSDP2 shards the dense weights over dp × ep and the experts over dp (both also
    # over cp under cp)
    cp, ep = plan.size("cp"), plan.size("ep")
    over = f"dp × cp = {dp * cp}" if cp > 1 else f"dp={dp}"
    if ep > 1 and plan.shards_grads:
        over = (f"dp × cp × ep = {dp * cp * ep} (the dense weights; the experts over dp × cp = {dp * cp})" if cp > 1
                else f"dp × ep = {dp * ep} (the dense weights; the experts over dp={dp})")
    if spec.train.precision == "bf16":  # memory.state_per_param: the fp32 master is sharded with the moments
        return {1: f"fp32 master and AdamW moments sharded over {over} (ZeRO-1, distributed optimizer)",
                2: f"fp32 master, gradients and AdamW moments sharded over {over}, bf16 weights gathered "
                   "through the step (ZeRO-2, FSDP2)",
                3: f"sharded over {over} (FSDP2, ZeRO-3)"}[stage]
    return {1: f"AdamW moments sharded over {over} (ZeRO-1)",
            2: f"gradients and AdamW moments sharded over {over} (ZeRO-2)",
            3: f"sharded over {over} (FSDP2, ZeRO-3)"}[stage]


def _memory_text(compiled) -> list[str]:
    """Model state at rest, then the predicted peak of each kind of rank with its breakdown, whether it fits, and if
    not what would."""
    from compiler.cost import memory as MEM
    spec, costs, plan = compiled.spec, compiled.costs, compiled.plan
    dev = spec.cluster.device
    limit = dev.memory_gb * 1e9
    st = costs.model_state
    opt = MEM.optimizer_label(spec.train.precision, plan.data_parallel, plan.size("dp"))
    lines = [f"memory      model state per rank: weights {nbytes(st.params)} + gradients {nbytes(st.grads)}"
             f" + {opt} {nbytes(st.optimizer)} = {nbytes(st.total)}, {_memory_how(spec, plan)}"
             + (f" ({_pp_rank0(plan)})" if plan.size("pp") > 1 else "")
             + ("; with what offload keeps on the host (the table's host column)"
                if plan.offload in ("optimizer", "params") else "")]
    rows = list(costs.memory)
    if len(rows) > 8:  # many pp ranks: the first, the fullest, the last
        worst = max(rows, key=lambda r: r.peak)
        rows = sorted({id(r): r for r in (rows[0], rows[1], worst, rows[-2], rows[-1])}.values(),
                      key=lambda r: r.pp_rank)
    lines += [f"            peak per rank, predicted (what the program allocates; {spec.train.precision}, "
              f"recompute {plan.recompute}):"]
    host = plan.offload != "none"  # the host's bytes beside the device's (compiler/cost/offload.py)
    head = f"  {'rank':<32} {'weights':>10} {'grads':>10} {'AdamW':>10} {'activations':>12} {'working':>10} {'peak':>10}"
    lines += [head + (f" {'host':>10}" if host else "")]
    for r in rows:
        lines += [f"  {r.who:<32} {nbytes(r.weights):>10} {nbytes(r.grads):>10} "
                  f"{nbytes(r.optimizer):>10} {nbytes(r.activations):>12} {nbytes(r.working):>10} "
                  f"{nbytes(r.peak):>10}" + (f" {nbytes(r.host or 0):>10}" if host else "")]
    if len(rows) < len(costs.memory):
        lines += [f"  ({len(costs.memory) - len(rows)} more pp ranks between; `scalec plan --json` lists all)"]
    staged = [r for r in costs.memory if r.checkpoint_host is not None]
    if staged:  # checkpoint_async only (memory.checkpoint_staging): host memory, beside the device peak
        fullest = max(staged, key=lambda r: r.checkpoint_host)
        device = max(r.checkpoint_device for r in staged)
        lines += [f"            checkpoint_async: each save's staging copy takes {nbytes(fullest.checkpoint_host)} of "
                  f"host memory on {fullest.who} until its files are written"
                  + (f", and {nbytes(device)} of device memory while it gathers FSDP's tp pieces" if device else "")
                  + " (not in the peak)"]
    if host:
        from compiler.plan import offload_text
        fullest = max(costs.memory, key=lambda r: r.host or 0)
        lines += [f"            {offload_text(plan)}: the device columns are what stays on the device; host is what "
                  f"each rank holds in host memory ({_host_what(plan)}), at most {nbytes(fullest.host or 0)} "
                  f"on {fullest.who}"]
    worst = max(costs.memory, key=lambda r: r.peak)
    lines += [f"            the peak of {worst.who}: at {worst.moment}"
              + (f", {worst.in_flight}" if worst.in_flight else "")
              + (f"; working set: {worst.working_what}" if worst.working_what else "")]
    share = worst.peak / limit
    if share <= 1 - MEM.MARGIN:
        pct = f"{share:.0%}" if share >= 0.01 else "under 1%"
        lines += [f"            fits: {pct} of the {dev.memory_gb:g} GB of one {dev.kind}"]
    elif share <= 1:
        lines += [f"            fits, but tightly: {share:.0%} of the {dev.memory_gb:g} GB of one {dev.kind} "
                  f"(less than {MEM.MARGIN:.0%} to spare: fragmentation and the CUDA context need some)"]
    else:
        lines += [f"            does NOT fit: {share:.0%} of the {dev.memory_gb:g} GB of one {dev.kind}; `compile` "
                  "and `run` refuse it (--force to try anyway)"]
        lines += [f"            {'would fit' if f.fits else 'still too big'}: {f.change} → {nbytes(f.peak)}"
                  for f in _fixes(compiled)[:6]]
    return lines


def _host_what(plan) -> str:
    if plan.offload == "optimizer":
        return (f"{plan.offload_fraction:.0%} of the optimizer's state, pinned buffers of as many fp32 gradients and, "
                "without an fp32 master, parameters")
    if plan.offload == "params":
        return "the sharded parameters, gradients and AdamW moments, pinned"
    return "the offloaded activations of the micro-batches in flight"


def _fixes(compiled) -> tuple:
    """What would make the plan fit (compiler.fit.advice: lowered and costed there, once per compiled plan)."""
    from compiler import fit
    return fit.advice(compiled)


def _prediction(compiled):
    """The step-time prediction the compiled plan's estimate carries (cost.Estimate.step), or None without a plan."""
    return compiled.costs.step if compiled.plan is not None else None


def _predicted_json(compiled) -> dict | None:
    pred = _prediction(compiled)
    return pred.as_json() if pred is not None else None


def plan_json(compiled) -> dict:
    """Everything `plan` prints, for tools (described in docs/planning.md)."""
    spec, costs, plan = compiled.spec, compiled.costs, compiled.plan
    m, cl = plan, spec.cluster
    dev = cl.device
    limit = dev.memory_gb * 1e9
    peak = costs.peak_bytes
    out = {
        "model": spec.model.name, "file": spec.path,
        "mesh": {"axes": dict(m.axes), "world_size": m.world_size, "nodes": cl.nodes,
                 "devices_per_node": cl.devices_per_node, "device": dev.kind,
                 "device_memory_bytes": int(limit), "peak_tflops": dev.peak_tflops,
                 **placement_json(spec, plan, costs.ledger)},
        "plan": plan.to_json(spec.cluster),
        "parameters": int(costs.params_n), "parameters_formula": str(costs.params),
        "tokens_per_step": int(costs.tokens_step), "micro_batch_size": int(costs.micro_batch_size),
        "flops_per_step": int(costs.flops_step_n), "flops_per_step_formula": str(costs.flops_step),
        "flops_per_rank_step": int(costs.flops_rank_step_n),
        "hardware_flops_per_step": int(costs.flops_step_hw_n),
        "hardware_flops_per_step_formula": str(costs.flops_step_hw),
        "hardware_flops_per_rank_step": int(costs.flops_rank_step_hw_n),
        "predicted": _predicted_json(compiled),
        "goodput": GPR.goodput_json(compiled),
        **CR.cost_json(compiled),
        "memory": {"peak_bytes": int(peak), "device_bytes": int(limit), "fits": peak <= limit,
                   **({"host_peak_bytes": int(max(r.host or 0 for r in costs.memory))}
                      if plan.offload != "none" else {}),
                   "model_state_bytes_per_rank": {"weights": costs.model_state.params,
                                                  "gradients": costs.model_state.grads,
                                                  "optimizer": costs.model_state.optimizer},
                   "ranks": [r.as_json() for r in costs.memory],
                   "fixes": ([{"change": f.change, "peak_bytes": int(f.peak), "fits": f.fits}
                              for f in _fixes(compiled)] if peak > limit else [])},
        "ledger": ledger_json(spec, plan, costs.ledger, priced=True),
        "traffic": [t.as_json() for t in TR.by_tier(compiled)],
        "naive_placement": (lambda n: n.as_json() if n is not None else None)(TR.naive_placement(compiled)),
        "diagnostics": [{"code": d.code, "severity": d.severity, "message": d.message}
                        for d in _memory_diagnostics(compiled)],
    }
    if costs.stages:
        p, v, mb = m.size("pp"), plan.virtual_stages, plan.micro_batches
        pred = out["predicted"]
        out["pipeline"] = {"schedule": plan.schedule, "pp": p, "virtual_stages": v, "micro_batches": mb,
                           "bubble_fraction": pred["bubble_fraction"] if pred else None,
                           "stages": [{"stage": st.stage, "rank": st.rank, "blocks": list(st.blocks),
                                       "parameters": st.params, "model_state_bytes": st.state,
                                       "activation_bytes_in_flight": st.activations} for st in costs.stages]}
    return out


def placement_json(spec, plan, ledger) -> dict:
    """plan.json's mesh "placement", only where one is written: as resolved, its order (innermost first; null
    where it is no axis order), what the compiler says of it, and the rank of each mesh coordinate (row-major)."""
    placed = LK.resolved(plan, spec.cluster, ledger)
    if placed is None:
        return {}
    return {"placement": {"written": plan.placement if isinstance(plan.placement, str) else list(plan.placement),
                          "order": list(placed.order) if placed.order is not None else None,
                          "note": placed.note, "ranks": list(placed.rank_map.ranks)}}


def ledger_json(spec, plan, ledger, priced: bool = False) -> list:
    """`--json`'s `ledger`: each collective of one step under `plan` (bytes: per rank and step, all its calls), as
    `plan --json` and the HTML pages of `plan` and of `search`'s best plan show it. With `priced`, also where it
    goes (compiler/report/traffic.py `priced`): "tier", "algorithm", "seconds" (all its calls) and "busbw_gbps"
    (one call's), null where its group has no link."""
    out = [{"op": c.op, "axis": c.axis, "direction": c.direction, "times": int(spec.value(c.per_step, plan)),
            "bytes": int(spec.value(c.bytes_per_step(), plan)), "formula": str(c.bytes_per_step()),
            "measured": c.measured, "reason": c.reason,
            "at": f"{os.path.basename(c.span.file)}:{c.span.line}" if c.span else None}
           for c in ledger.entries]
    if priced:
        for row, p in zip(out, TR.priced(spec, plan, ledger)):
            row.update({"tier": p.tier, "algorithm": p.algorithm, "seconds": p.seconds, "busbw_gbps": p.busbw_gbps}
                       if p is not None else dict.fromkeys(("tier", "algorithm", "seconds", "busbw_gbps")))
    return out


def _pp_rank0(plan) -> str:
    """Which rank the per-rank numbers describe under pp: pp rank 0, with every stage it holds."""
    if plan.virtual_stages == 1:
        return "a rank of the first pipeline stage"
    return f"pp rank 0, stages {', '.join(map(str, plan.stage_layout.stages_of(0)))}"


def _context_text(compiled) -> list[str]:
    """Context parallelism: the tokens of each sequence a rank holds, what attention keeps on it, and the cp
    traffic of a step (the ledger's, per direction)."""
    from compiler.cost import activations as A
    from compiler.symbols import MICRO_BATCH
    spec, costs, plan = compiled.spec, compiled.costs, compiled.plan
    cp = plan.size("cp")
    if cp == 1:
        return []
    seq = spec.value(spec.train.seq_len)
    variant = plan.context_parallel
    lines = [f"context     cp {cp} ({variant}): each rank holds {seq // cp:,} of every sequence's {seq:,} tokens "
             f"(chunks i and {2 * cp - 1} − i of {2 * cp}, balanced for the causal mask)"]
    # attention's own keeps, per layer and micro-batch: what its op records keep (runtime.context_parallel's
    # attention: its queries, the gathered keys and values under all_gather, the output and the log-sum-exp)
    precision = A.precision_key(spec, plan)
    layers, per_layer = 0, None
    for count_, gm in compiled.traced.repeats().values():
        saved, calls = A.attention_saved_bytes(gm, precision)
        if calls:
            kept = spec.value(saved.xreplace({MICRO_BATCH: costs.micro_batch_size}), plan) / calls
            per_layer = kept if per_layer is None else max(per_layer, kept)
            layers += int(spec.value(count_, plan)) * calls
    if per_layer is not None:
        what = {"all_gather": "its queries, the keys and values gathered over cp, the output and the log-sum-exp",
                "ring": "its queries, keys and values (the rank's own), the output and the log-sum-exp",
                "all_to_all": "q, k and v of heads / cp over the whole sequence, the output and the log-sum-exp"}
        lines += [f"            attention keeps {nbytes(per_layer)} per layer and micro-batch on a rank "
                  f"({what.get(variant, variant)}); {layers} layers: {nbytes(per_layer * layers)} per micro-batch"
                  + (f" (recompute {plan.recompute}: held only while its block's backward runs)"
                     if plan.recompute != "none" else "")]
    sent = {}
    for c in costs.ledger.entries:
        if c.axis == "cp":
            sent[c.direction] = sent.get(c.direction, 0) + spec.value(c.bytes_per_step(), plan)
    if sent:
        said = (("forward", "forward"), ("backward", "backward"), ("step", "once a step (gradients)"))
        lines += ["            cp traffic per step and rank: " + ", ".join(f"{nbytes(sent[d])} {w}" for d, w in said
                                                                        if d in sent)]
    return lines


def _moe_text(compiled) -> list[str]:
    """Each `moe` layer: capacity, experts per rank, and the dispatch buffers of one micro-batch."""
    spec, costs = compiled.spec, compiled.costs
    seen = [x for x in S.walk(spec.model.layers) if isinstance(x, S.MoE)]  # a repeat's body is walked once
    lines = []
    if not seen:
        return []
    mesh, v = compiled.plan, spec.value
    ep, dp, tp = mesh.size("ep"), mesh.size("dp"), mesh.size("tp")
    b = costs.micro_batch_size
    act = C.BYTES[spec.train.precision]
    for x in seen:
        e, c, h = v(x.experts), v(x.capacity), v(x.hidden)
        buffer, hidden = C.moe_held_elements(spec, x, b)
        where = f"{os.path.basename(x.span.file)}:{x.span.line}"
        capacity = ("dropless, grouped (capacity_factor = none, dispatch = grouped): the tokens sorted by "
                    "expert, each expert's matmuls on its own rows only (hardware FLOPs = model FLOPs; torch's grouped "
                    "GEMM pads each expert's rows to a multiple of 16, runtime.moe.GROUP_ALIGN)" if x.dispatch == "grouped" else
                    f"dropless (capacity_factor = none) → {x.capacity} = {c} slots per expert per sequence (the "
                    "worst case: every token of a sequence to one expert; buffers padded to it, nothing dropped)"
                    if x.capacity_factor == "none" else
                    f"capacity factor {x.capacity_factor:g} → {x.capacity} = {c} slots per expert per sequence "
                    f"(min(seq, ⌈factor·top_k·seq/experts⌉)); over capacity: "
                    f"{'through the residual' if x.dropped == 'residual' else 'the token itself'}")
        lines += [f"experts     moe at {where}: {e} experts, top-{x.top_k}, {capacity}",
                  f"            {e // ep} expert{'s' if e // ep != 1 else ''} per rank"
                  + (f" (ep = {ep} is folded out of data parallelism: the batch splits over dp × ep = {dp * ep} "
                     f"ranks holding the dense weights; each expert lives on the {dp * tp} rank"
                     f"{'s' if dp * tp != 1 else ''} of its ep index" + (f" (dp {dp} × tp {tp}: experts are not "
                     "sharded over tp)" if tp > 1 else "") + ")" if ep > 1 else "")
                  + (f"; rows sorted by expert {b * v(spec.train.seq_len) * x.top_k}×{h} = {nbytes(buffer * act)}"
                     " (balanced: as many on each rank's experts), " if x.dispatch == "grouped" else
                     f"; dispatch and combine buffers {e}×{b * c}×{h} = {nbytes(buffer * act)} each, ")
                  + f"expert activations {nbytes(hidden * act)} per "
                  "layer and micro-batch"]
        if x.shared_ffn is not None:  # only a model with a shared expert prints this line
            lines += [f"            a shared expert of width {x.shared_ffn} = {v(x.shared_ffn)} for every token"
                      + (", scaled by sigmoid(x · w)" if x.shared_gate == "sigmoid" else "")
                      + "; a dense part (replicated over ep" + (", an MLP's shards over tp" if tp > 1 else "") + ")"]
        if x.renormalize is not None and x.renormalize != (x.top_k > 1):
            score = "sigmoid" if x.scoring == "sigmoid" else "softmax probability"
            lines += ["            gates: " + (f"each the chosen experts' {score}, not renormalised"
                                               if not x.renormalize else "renormalised over the top-1 choice: all 1")]
        if x.scoring != "softmax" or x.groups > 1 or x.routed_scale != 1.0:  # only DeepSeek-V3's router prints this
            lines += ["            router: " + ("sigmoid scores" if x.scoring == "sigmoid" else "softmax scores")
                      + (f", each token's top {x.top_k} within its best {x.topk_groups} of {x.groups} expert groups"
                         if x.groups > 1 else "") + (f", gates × {x.routed_scale:g}" if x.routed_scale != 1.0 else "")]
    if ep > 1 and REB.rebalanced(spec):
        lines += _rebalance_text(compiled)
    if ep > 1:
        lines += [f"            expert weights per rank {costs.expert_params_rank:,} of {costs.params_rank:,}"
                  + (f" ({_pp_rank0(mesh)})" if mesh.size("pp") > 1 else "")]
    return lines


def _rebalance_text(compiled) -> list[str]:
    """`rebalance`: the slots, and the step at a few load skews without and with re-placement (what-ifs: no skew is
    measured before a run; the run logs its own, `per-rank expert load max/mean`)."""
    spec, plan, v = compiled.spec, compiled.plan, compiled.spec.value
    ep = plan.size("ep")
    lines = []
    for m, _ in REB.rebalanced(spec):
        every, extra = m.rebalance
        e = int(v(m.experts))
        lines += [f"rebalance   moe at {os.path.basename(m.span.file)}:{m.span.line}: re-placed every {every} steps "
                  f"from the measured load (DeepSeek's EPLB, runtime/eplb.py): {(e + extra) // ep} slots per ep rank "
                  f"({e // ep} experts + {extra} replicas over {ep} ranks), the replicas' weights, gradients and AdamW "
                  "state in the memory above"]
    said = []
    for skew in (1.5, 2.0, 3.0):
        if skew > ep:
            continue
        before, after, left = REB.step_at_skew(compiled.costs, spec, plan, skew)
        said.append(f"{skew:g}× → {left:.2f}×: {before * 1e3:.3g} → {after * 1e3:.3g} ms "
                    f"({before / after - 1:+.0%})")
    lines += ["            expected step at a per-rank expert load skew (max/mean; assumed, not measured: the run logs "
              "its own), without → with re-placement: " + "; ".join(said)]
    return lines


def _memory_diagnostics(compiled) -> list:
    from compiler.fit import budget
    return budget(compiled)


def _pipeline_text(compiled) -> list[str]:
    from compiler import schedule as SCH
    costs, plan = compiled.costs, compiled.plan
    if not costs.stages:
        return []
    p, v, m = plan.size("pp"), plan.virtual_stages, plan.micro_batches
    pred = costs.step
    if plan.schedule == "dualpipev":  # DeepSeek's bubble is a time, not a share: (PP/2-1)(F&B+B-3W), PP = 2p
        published = ("DeepSeek's (PP/2-1)(F&B+B-3W) over PP = 2p half stages is a time, which the simulation "
                     "reproduces for equal stages")
    else:
        says = "before ZB-H1" if plan.schedule == "zero-bubble" else "would say"
        published = f"the published (p-1)/(v·m+p-1) {says} {SCH.bubble_fraction(p, m, v):.1%}"
    lines = ["", f"pipeline    {plan.schedule}, pp = {p} × {v} stage{'s' if v > 1 else ''} per rank, "
             f"{m} micro-batches of {costs.micro_batch_size:g} sequences; bubble {pred.bubble_fraction:.1%} "
             f"(simulated: the slowest rank's idle share of the step; {published})"]
    lines += ["  stage  rank  blocks     parameters per rank   model state   activations in flight"]
    for st in costs.stages:
        lo, hi = st.blocks
        lines += [f"  {st.stage:>5}  {st.rank:>4}  {lo:>3}..{hi - 1:<4} {st.params:>21,}   {nbytes(st.state):>10}   "
                  f"{nbytes(st.activations):>10}"]
    order = SCH.actions(plan.schedule, p, m, v)  # proved by the driver while compiling (E0609 otherwise)
    lay = plan.stage_layout
    lines += [f"schedule    every send has its receive and no rank waits forever "
              f"({sum(len(x) for x in order.values()):,} actions checked)"]
    if p <= 8 and m * v <= 16:
        lines += ["", *SCH.grid(order, lay).rstrip("\n").split("\n")]
    return lines


def schedule_svg(compiled) -> str:
    """`plan --svg`: the timeline of the schedule the program runs (the one the driver proved), titled with the
    model and the schedule's shape."""
    return plan_schedule_svg(compiled.spec.model.name, compiled.plan)


def plan_schedule_svg(model: str, plan) -> str:
    """The timeline of `plan`'s schedule (a Plan: a compiled file's, or a search's winner), titled with `model`."""
    from compiler import schedule as SCH
    p, v, m = plan.size("pp"), plan.virtual_stages, plan.micro_batches
    title = f"{model}: {plan.schedule}, pp = {p}, v = {v}, m = {m}"
    return SCH.svg(SCH.verify(SCH.actions(plan.schedule, p, m, v), plan.stage_layout), title)


def schedule_svg_note(compiled, path: str) -> str | None:
    """What to tell the user about an SVG of a mesh with no pipeline: there is nothing to see in it but one rank."""
    if compiled.plan.size("pp") != 1:
        return None
    return (f"note: the mesh has no pipeline (no `pp` axis): {path} shows one rank's forward and backward per "
            "micro-batch, with no bubble to see\n")
