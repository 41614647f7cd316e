"""scalec: check, plan, compile and run .scale training plans.

  scalec check FILE              report every problem in FILE, or say it is fine
  scalec explain CODE            what a diagnostic code (E0401, ...) means and what to do about it
  scalec plan FILE               parameters, FLOPs, memory per rank, mesh and collectives
  scalec compile FILE [-o DIR]   write DIR (default build/<model name>): program.py, plan.json, launch.sh
  scalec search FILE [-o BEST]   the fastest plans for FILE's model on its cluster, with reasons
  scalec reshard OLD NEW         before resuming OLD's checkpoint on NEW's plan: each tensor's pieces under both
                                 plans and the bytes each rank of NEW reads; refused when the models differ
  scalec import CONFIG [-o FILE] the .scale model section of a Hugging Face config.json (Llama, Mistral, Qwen 2,
                                 Mixtral); -o writes a whole file, with placeholder mesh and train sections
  scalec export FILE CKPT -o DIR a checkpoint of FILE's model as Hugging Face safetensors and config.json
  scalec run FILE [-- FLAGS]     compile, then launch under torchrun with as many processes as this node runs;
                                 FLAGS go to the program (e.g. -- --checkpoint-dir ckpt --seed 7), torchrun's own
                                 flags in one quoted string: --torchrun-args "--redirects 3 --log-dir 'my logs'"

Exit status: 0 on success, 1 when the input has errors (printed as diagnostics), 2 on a usage error, 3 on an
internal error (a bug in scalec: one line; SCALEC_BACKTRACE=1 prints the Python trace too).
"""
from __future__ import annotations

import argparse
import codecs
import json
import os
import shlex
import subprocess
import sys
import traceback

from compiler import __version__
from compiler import cost as C
from compiler import spec as S
from compiler.diagnostics import ScaleError


def _load(path: str, budget: bool = True, show=None):
    """Compile `path` (which proves its pipeline schedule); with `budget`, also refuse a plan whose predicted peak
    memory does not fit (compile, run, unless --force); `show` sees each segment's graph after each pass."""
    from compiler.pipeline import compile_checked
    compiled = compile_checked(path, memory=budget, show=show)
    _print_warnings(compiled.spec)
    return compiled


def _print_warnings(spec) -> None:
    """The check's warnings (settings with no effect in this plan, ...), rendered like errors, on stderr."""
    if spec.warnings:
        from compiler.diagnostics import render_all
        sys.stderr.write(render_all(list(spec.warnings), {spec.path: spec.source}) + "\n")


def _show_graph(after: str, cls: str, gm) -> None:
    """`--show-graphs`: a segment's graph as the pass left it, as FX prints it, on stderr (stdout keeps the
    command's output)."""
    sys.stderr.write(f"# ---- {cls} after {after} ----\n{gm.code.strip()}\n\n")


def cmd_check(args) -> int:
    from compiler.check import check_path
    spec = check_path(args.file)
    _print_warnings(spec)
    warned = f", {len(spec.warnings)} warning{'s' if len(spec.warnings) != 1 else ''}" if spec.warnings else ""
    print(f"{args.file}: ok{warned} (model `{spec.model.name}`, {spec.mesh.world_size} device"
          f"{'s' if spec.mesh.world_size != 1 else ''})")
    return 0


def cmd_explain(args) -> int:
    from compiler.codes import explain
    text = explain(args.code)
    if text is None:
        sys.stderr.write(f"error: unknown diagnostic code `{args.code}` (codes look like E0401)\n")
        return 2
    sys.stdout.write(text)
    return 0


def plan_text(compiled) -> str:
    spec, costs = compiled.spec, compiled.costs
    m, t = spec.mesh, spec.train
    dp = m.size("dp")
    gb, seq = spec.value(t.global_batch), spec.value(t.seq_len)
    lines = [f"plan for `{spec.model.name}` ({spec.path})", ""]
    axes = "  ".join(f"{a}={n}" for a, n in m.axes) or "(none)"
    lines += [f"mesh        {axes}   world {m.world_size} = {m.nodes} node{'s' if m.nodes != 1 else ''} × "
              f"{m.devices_per_node} {m.device.kind} ({m.device.peak_tflops:g} TFLOP/s peak, "
              f"{m.device.memory_gb:g} GB each)"]
    lines += [f"parameters  {costs.params_n:,} ({C.human(costs.params_n)})",
              f"            = {C.formula(costs.params, spec.values)}"]
    ranks = f"dp {dp} × ep {m.size('ep')}" if m.size("ep") > 1 else f"dp {dp}"
    lines += [f"batch       {gb} sequences × {seq} tokens = {costs.tokens_step:,} tokens per step; "
              f"{ranks} × {spec.plan.micro_batches} micro-batch{'es' if spec.plan.micro_batches != 1 else ''} of "
              f"{costs.micro_batch_size} sequences per rank"]
    lines += [f"compute     {costs.flops_step_n:.4e} FLOP per step ({C.human(costs.flops_step_n, 'FLOP')}; "
              f"model FLOPs: matmuls, forward + backward)",
              f"            = {C.formula(costs.flops_step, spec.values)}"]
    recompute = getattr(compiled.plan, "recompute", "none") if compiled.plan else "none"
    padded = costs.flops_step_hw_n > costs.flops_step_n and any(
        isinstance(x, S.MoE) for x in S.walk(spec.model.layers))
    if recompute != "none" or padded:
        why = " and ".join(w for w, on in ((f"{recompute} recomputation's extra forward", recompute != "none"),
                                           ("the experts' empty slots (buffers padded to capacity)", padded)) if on)
        lines += [f"            {costs.flops_step_hw_n:.4e} hardware FLOP per step with {why} "
                  f"({costs.flops_step_hw_n / costs.flops_step_n:.3f}× the model's)",
                  f"            = {C.formula(costs.flops_step_hw, spec.values)}"]
    if costs.flops_rank_step_hw_n * m.world_size != costs.flops_step_hw_n:
        lines += [f"            {costs.flops_rank_step_hw_n:.4e} FLOP per step on the busiest rank"]
    lines += _step_time_text(compiled)
    lines += _memory_text(compiled)
    lines += _moe_text(compiled)
    lines += _pipeline_text(compiled)
    lines += ["", "collectives per step" + (f" ({_pp_rank0(spec)}):" if m.size("pp") > 1 else ":")]
    if not costs.ledger.entries:
        lines += ["  none (one replica, no sharding)"]
    for c in costs.ledger.entries:
        b = spec.value(c.bytes_per_step())
        src = f"{os.path.basename(c.span.file)}:{c.span.line}" if c.span else "-"
        times = spec.value(c.per_step)
        lines += [f"  {c.op:<15} {c.axis:<3} {_DIRECTION[c.direction]:<4} ×{times:<4} {C.human(b, 'B'):>10} = "
                  f"{C.formula(c.bytes_per_step(), spec.values)} bytes  [{src}] {c.reason}"]
    lines += ["  (bytes: the full tensor each call moves, per rank and step; DDP/FSDP traffic is theirs to schedule)"
              if costs.ledger.entries else ""]
    return "\n".join(lines) + "\n"


_DIRECTION = {"forward": "fwd", "backward": "bwd", "step": "step"}


def _seconds(t: float) -> str:
    return f"{t * 1e3:.3g} ms" if t < 1 else f"{t:.3g} s"


def _step_time_text(compiled) -> list[str]:
    """The step-time model's prediction (compiler/simulate.py): time, throughput, MFU, where the time goes."""
    from compiler import simulate as SIM
    pred = SIM.predict(compiled)
    if pred is None:
        return []
    dev = compiled.spec.mesh.device
    hw = ("" if abs(pred.hardware_tflops_per_device - pred.model_tflops_per_device) < 1e-9 else
          f" ({pred.hardware_tflops_per_device:.4g} hardware: with recomputation and padding)")
    how = "compiled" if compiled.plan.compiles else "eager"
    lines = ["", f"step time   {_seconds(pred.step_time_s)} per step predicted on {dev.kind}, {how} "
                 f"({dev.peak_tflops:g} TFLOP/s peak; figures and sources: compiler/cost/devices.py)",
             f"            {pred.tokens_per_s:,.0f} tokens/s; {pred.model_tflops_per_device:.4g} model TFLOP/s per "
             f"device{hw}; MFU {pred.mfu:.1%}"]
    exposed = ", ".join(f"{a} {_seconds(t)}" for a, t in pred.exposed_comm_s.items() if t > 0) or "none"
    lines += [f"            pipeline bubble {pred.bubble_fraction:.1%} (the slowest rank idle in the schedule); "
              f"exposed communication: {exposed}; "
              f"AdamW {_seconds(pred.optimizer_s)}"]
    lines += ["            links: " + "; ".join(k.describe() for k in pred.links)]
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


def _memory_how(spec) -> str:
    dp, kind = spec.mesh.size("dp"), spec.plan.data_parallel
    if dp == 1 or kind == "ddp":
        return "replicated on every dp rank (DDP)"
    if spec.train.precision == "bf16":  # memory.state_per_param: the fp32 master is sharded with the moments
        return {"zero1": f"fp32 master and AdamW moments sharded over dp={dp} (ZeRO-1, distributed optimizer)",
                "zero2": f"fp32 master, gradients and AdamW moments sharded over dp={dp}, bf16 weights gathered "
                         "through the step (ZeRO-2, FSDP2)",
                "fsdp": f"sharded over dp={dp} (FSDP2, ZeRO-3)"}.get(kind, kind)
    return {"zero1": f"AdamW moments sharded over dp={dp} (ZeRO-1)",
            "zero2": f"gradients and AdamW moments sharded over dp={dp} (ZeRO-2)",
            "fsdp": f"sharded over dp={dp} (FSDP2, ZeRO-3)"}.get(kind, kind)


def _memory_text(compiled) -> list[str]:
    """Model state at rest, then the predicted peak of each kind of rank with its breakdown, whether it fits, and if
    not what would."""
    from compiler.cost import memory as MEM
    spec, costs = compiled.spec, compiled.costs
    dev = spec.mesh.device
    limit = dev.memory_gb * 1e9
    st = costs.model_state
    opt = MEM.optimizer_label(spec.train.precision, spec.plan.data_parallel, spec.mesh.size("dp"))
    lines = [f"memory      model state per rank: weights {C.human(st.params, 'B')} + gradients {C.human(st.grads, 'B')}"
             f" + {opt} {C.human(st.optimizer, 'B')} = {C.human(st.total, 'B')}, {_memory_how(spec)}"
             + (f" ({_pp_rank0(spec)})" if spec.mesh.size("pp") > 1 else "")]
    rows = list(costs.memory)
    if len(rows) > 8:  # many pp ranks: the first, the fullest, the last
        worst = max(rows, key=lambda r: r.peak)
        rows = sorted({id(r): r for r in (rows[0], rows[1], worst, rows[-2], rows[-1])}.values(),
                      key=lambda r: r.pp_rank)
    lines += [f"            peak per rank, predicted (what the program allocates; {spec.train.precision}, "
              f"recompute {getattr(compiled.plan, 'recompute', 'none') if compiled.plan else 'none'}):"]
    head = f"  {'rank':<32} {'weights':>10} {'grads':>10} {'AdamW':>10} {'activations':>12} {'working':>10} {'peak':>10}"
    lines += [head]
    for r in rows:
        lines += [f"  {r.who:<32} {C.human(r.weights, 'B'):>10} {C.human(r.grads, 'B'):>10} "
                  f"{C.human(r.optimizer, 'B'):>10} {C.human(r.activations, 'B'):>12} {C.human(r.working, 'B'):>10} "
                  f"{C.human(r.peak, 'B'):>10}"]
    if len(rows) < len(costs.memory):
        lines += [f"  ({len(costs.memory) - len(rows)} more pp ranks between; `scalec plan --json` lists all)"]
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
        lines += [f"            {'would fit' if f.fits else 'still too big'}: {f.change} → {C.human(f.peak, 'B')}"
                  for f in _fixes(compiled)[:6]]
    return lines


def _fixes(compiled) -> list:
    from compiler import fit
    return fit.fixes(compiled, compiled.spec.mesh.device.memory_gb * 1e9)


def _predicted_json(compiled) -> dict | None:
    from compiler import simulate as SIM
    pred = SIM.predict(compiled)
    return pred.as_json() if pred is not None else None


def plan_json(compiled) -> dict:
    """Everything `plan` prints, for tools (described in the README)."""
    from compiler import schedule as SCH
    spec, costs = compiled.spec, compiled.costs
    m = spec.mesh
    limit = m.device.memory_gb * 1e9
    peak = costs.peak_bytes
    out = {
        "model": spec.model.name, "file": spec.path,
        "mesh": {"axes": dict(m.axes), "world_size": m.world_size, "nodes": m.nodes,
                 "devices_per_node": m.devices_per_node, "device": m.device.kind,
                 "device_memory_bytes": int(limit), "peak_tflops": m.device.peak_tflops},
        "plan": compiled.plan.to_json() if compiled.plan else None,
        "parameters": int(costs.params_n), "parameters_formula": str(costs.params),
        "tokens_per_step": int(costs.tokens_step), "micro_batch_size": int(costs.micro_batch_size),
        "flops_per_step": int(costs.flops_step_n), "flops_per_step_formula": str(costs.flops_step),
        "flops_per_rank_step": int(costs.flops_rank_step_n),
        "hardware_flops_per_step": int(costs.flops_step_hw_n),
        "hardware_flops_per_step_formula": str(costs.flops_step_hw),
        "hardware_flops_per_rank_step": int(costs.flops_rank_step_hw_n),
        "predicted": _predicted_json(compiled),
        "memory": {"peak_bytes": int(peak), "device_bytes": int(limit), "fits": peak <= limit,
                   "model_state_bytes_per_rank": {"weights": costs.model_state.params,
                                                  "gradients": costs.model_state.grads,
                                                  "optimizer": costs.model_state.optimizer},
                   "ranks": [r.as_json() for r in costs.memory],
                   "fixes": ([{"change": f.change, "peak_bytes": int(f.peak), "fits": f.fits}
                              for f in _fixes(compiled)] if peak > limit else [])},
        "ledger": [{"op": c.op, "axis": c.axis, "direction": c.direction, "times": int(spec.value(c.per_step)),
                    "bytes": int(spec.value(c.bytes_per_step())), "formula": str(c.bytes_per_step()),
                    "measured": c.measured, "reason": c.reason,
                    "at": f"{os.path.basename(c.span.file)}:{c.span.line}" if c.span else None}
                   for c in costs.ledger.entries],
        "diagnostics": [{"code": d.code, "severity": d.severity, "message": d.message}
                        for d in _memory_diagnostics(compiled)],
    }
    if costs.stages:
        p, v, mb = m.size("pp"), spec.plan.virtual_stages, spec.plan.micro_batches
        pred = out["predicted"]
        out["pipeline"] = {"schedule": spec.plan.schedule, "pp": p, "virtual_stages": v, "micro_batches": mb,
                           "bubble_fraction": pred["bubble_fraction"] if pred else None,
                           "stages": [{"stage": st.stage, "rank": st.rank, "blocks": list(st.blocks),
                                       "parameters": st.params, "model_state_bytes": st.state,
                                       "activation_bytes_in_flight": st.activations} for st in costs.stages]}
    return out


def _pp_rank0(spec) -> str:
    """Which rank the per-rank numbers describe under pp: pp rank 0, with every stage it holds."""
    p, v = spec.mesh.size("pp"), spec.plan.virtual_stages
    if v == 1:
        return "a rank of the first pipeline stage"
    return f"pp rank 0, stages {', '.join(str(k) for k in range(0, p * v, p))}"


def _moe_text(compiled) -> list[str]:
    """Each `moe` layer: capacity, experts per rank, and the dispatch buffers of one micro-batch."""
    spec, costs = compiled.spec, compiled.costs
    seen = [x for x in S.walk(spec.model.layers) if isinstance(x, S.MoE)]  # a repeat's body is walked once
    lines = []
    if not seen:
        return []
    mesh, v = spec.mesh, spec.value
    ep, dp, tp = mesh.size("ep"), mesh.size("dp"), mesh.size("tp")
    b = costs.micro_batch_size
    act = C.BYTES[spec.train.precision]
    for x in seen:
        e, c, h = v(x.experts), v(x.capacity), v(x.hidden)
        buffer, hidden = C.moe_held_elements(spec, x, b)
        where = f"{os.path.basename(x.span.file)}:{x.span.line}"
        capacity = (f"dropless (capacity_factor = none) → {x.capacity} = {c} slots per expert per sequence (the "
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
                  + f"; dispatch and combine buffers {e}×{b * c}×{h} = {C.human(buffer * act, 'B')} each, "
                  f"expert activations {C.human(hidden * act, 'B')} per "
                  "layer and micro-batch"]
    if ep > 1:
        lines += [f"            expert weights per rank {costs.expert_params_rank:,} of {costs.params_rank:,}"
                  + (f" ({_pp_rank0(spec)})" if mesh.size("pp") > 1 else "")]
    return lines


def _memory_diagnostics(compiled) -> list:
    from compiler.fit import budget
    return budget(compiled)


def _pipeline_text(compiled) -> list[str]:
    from compiler import schedule as SCH
    from compiler import simulate as SIM
    spec, costs = compiled.spec, compiled.costs
    if not costs.stages:
        return []
    p, v, m = spec.mesh.size("pp"), spec.plan.virtual_stages, spec.plan.micro_batches
    pred = SIM.predict(compiled)
    lines = ["", f"pipeline    {spec.plan.schedule}, pp = {p} × {v} stage{'s' if v > 1 else ''} per rank, "
             f"{m} micro-batches of {costs.micro_batch_size:g} sequences; bubble {pred.bubble_fraction:.1%} "
             f"(simulated: the slowest rank's idle share of the step; the published (p-1)/(v·m+p-1) "
             f"{'before ZB-H1' if spec.plan.schedule == 'zero-bubble' else 'would say'} "
             f"{SCH.bubble_fraction(p, m, v):.1%})"]
    lines += ["  stage  rank  blocks     parameters per rank   model state   activations in flight"]
    for st in costs.stages:
        lo, hi = st.blocks
        lines += [f"  {st.stage:>5}  {st.rank:>4}  {lo:>3}..{hi - 1:<4} {st.params:>21,}   {C.human(st.state, 'B'):>10}   "
                  f"{C.human(st.activations, 'B'):>10}"]
    order = SCH.actions(spec.plan.schedule, p, m, v)  # proved by the driver while compiling (E0609 otherwise)
    lay = SCH.Layout(p, v, m)
    lines += [f"schedule    every send has its receive and no rank waits forever "
              f"({sum(len(x) for x in order.values()):,} actions checked)"]
    if p <= 8 and m * v <= 16:
        lines += ["", *SCH.grid(order, lay).rstrip("\n").split("\n")]
    return lines


def cmd_plan(args) -> int:
    compiled = _load(args.file, budget=False)
    if args.json:
        json.dump(plan_json(compiled), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(plan_text(compiled))
    if args.svg:  # with --json too (stdout then holds only the JSON: the note goes to stderr)
        from compiler import schedule as SCH
        spec = compiled.spec
        p, v, m = spec.mesh.size("pp"), spec.plan.virtual_stages, spec.plan.micro_batches
        lay = SCH.Layout(p, v, m)
        title = f"{spec.model.name}: {spec.plan.schedule}, pp = {p}, v = {v}, m = {m}"
        with open(args.svg, "w", encoding="utf-8") as f:
            f.write(SCH.svg(SCH.verify(SCH.actions(spec.plan.schedule, p, m, v), lay), title))
        if p == 1:
            sys.stderr.write(f"note: the mesh has no pipeline (no `pp` axis): {args.svg} shows one rank's forward "
                             "and backward per micro-batch, with no bubble to see\n")
        print(f"wrote {args.svg}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _build_dir(compiled, out: str | None) -> str:
    return out or os.path.join("build", compiled.spec.model.name)


def cmd_compile(args) -> int:
    from compiler import codegen
    compiled = _load(args.file, budget=not args.force, show=_show_graph if args.show_graphs else None)
    _forced(args, compiled)
    out = _build_dir(compiled, args.output)
    for path in codegen.emit(compiled, out):
        print(f"wrote {path}")
    return 0


def cmd_reshard(args) -> int:
    from compiler import reshard
    old, new = _load(args.old, budget=False), _load(args.new, budget=False)
    sys.stdout.write(reshard.report(old, new, args.old, args.new))
    return 0


def cmd_export(args) -> int:
    from compiler import export as X
    spec = _load(args.file, budget=False).spec
    try:
        written = X.export(spec, args.checkpoint, args.out, config_from=args.config)
    except X.ExportError as err:
        print(f"scalec export: {err}", file=sys.stderr)
        return 1
    print(f"wrote {', '.join(os.path.join(args.out, w) for w in written)}")
    return 0


def cmd_import(args) -> int:
    from compiler.check import check_text
    from compiler.importer import complete, import_config
    if os.path.isdir(args.file):  # a checkpoint's directory, as save_pretrained writes it
        config = os.path.join(args.file, "config.json")
        if not os.path.isfile(config):
            sys.stderr.write(f"error: {args.file} is a directory without a config.json: name a Hugging Face "
                             "checkpoint's directory or its config.json\n")
            return 1
        args.file = config
    with open(args.file, encoding="utf-8-sig") as f:  # a leading byte-order mark is not part of the text
        text = f.read()
    model = import_config(text, args.file)
    if args.output is None:
        sys.stdout.write(model)
        return 0
    whole = complete(model)
    spec = check_text(whole, args.output)  # what is written checks
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(whole)
    print(f"wrote {args.output}: model `{spec.model.name}` from {args.file}, with placeholder mesh and train "
          "sections")
    return 0


def cmd_search(args) -> int:
    from compiler import search as SE
    from compiler.check import check_path
    try:
        fixed = SE.parse_fixes(args.fix)
    except SE.FixError as err:
        sys.stderr.write(f"error: {err}\n")
        return 2
    spec = check_path(args.file, cluster_only=True)  # the axes and the plan are the search's to choose
    _print_warnings(spec)
    result = SE.search(spec, top=args.top, fixed=fixed)
    if args.json:
        json.dump(SE.to_json(result), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(SE.text(result))
    if not result.winners:  # the reasons are printed above, under `rejected`
        fixed = " with the settings --fix fixes" if fixed else ""
        sys.stderr.write(f"error: no plan{fixed} passes the rules and fits the devices"
                         f"{'; nothing written to ' + args.output if args.output else ''}\n")
        return 1
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(SE.scale_text(spec, result.winners[0]))
        if not args.json:
            print(f"wrote {args.output}")
    return 0


def _positive_int(text: str) -> int:
    """argparse type of a count (`--steps`, `--top`): 0 or a negative number is a usage error (exit 2) before
    anything is compiled or launched, not a run that trains nothing."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {n}")
    return n


def _program_steps(program_args: list[str]) -> None:
    """`scalec run FILE -- --steps N`: the program's own --steps, held to what `scalec run --steps` takes."""
    for i, a in enumerate(program_args):
        value = a.partition("=")[2] if a.startswith("--steps=") else (
            program_args[i + 1] if a == "--steps" and i + 1 < len(program_args) else None)
        if value is not None:
            try:
                _positive_int(value)
            except argparse.ArgumentTypeError as err:
                raise UsageError(f"--steps (after `--`): {err}") from None


class UsageError(Exception):
    """A command line that cannot run: printed as one line, exit status 2."""


def launch_command(args, nodes: int, out: str, environ: dict) -> tuple[list[str], dict]:
    """The launch.sh command and environment of `scalec run`: program flags (`--steps`, `--metrics`, everything
    after `--`) as arguments, each kept whole; `--torchrun-args` split as a shell would into TORCHRUN_ARGS; on a
    mesh of several nodes, this node's share (NODE_RANK, MASTER_ADDR from the environment) or, with
    `--local-nodes`, every node here."""
    env = dict(environ)
    # The program imports the same runtime this compiler came with.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        torchrun = shlex.split(args.torchrun_string or "")
    except ValueError as err:
        raise UsageError(f"--torchrun-args: {err} in {args.torchrun_string!r}") from None
    env["TORCHRUN_ARGS"] = shlex.join(torchrun)
    env.pop("LOCAL_NODES", None)
    if nodes > 1 and args.local_nodes:
        env["LOCAL_NODES"] = "1"
    elif nodes > 1 and not (environ.get("NODE_RANK") and environ.get("MASTER_ADDR")):
        raise UsageError(f"this mesh spans {nodes} nodes: run `scalec run` on each with NODE_RANK=<0..{nodes - 1}> "
                         "and MASTER_ADDR=<address of node 0> set, or pass --local-nodes to start every node on "
                         "this machine")
    program_args = []
    if args.steps is not None:
        program_args += ["--steps", str(args.steps)]
    if args.metrics:
        program_args += ["--metrics", args.metrics]
    return ["bash", os.path.join(out, "launch.sh"), *program_args, *args.program_args], env


def _forced(args, compiled) -> None:
    """--force: the memory error becomes a warning the user still sees."""
    if args.force:
        for d in _memory_diagnostics(compiled):
            if d.severity == "error":
                sys.stderr.write(f"warning (--force): {d.message}\n")


def cmd_run(args) -> int:
    from compiler import codegen
    try:
        _program_steps(args.program_args)
    except UsageError as err:
        sys.stderr.write(f"error: {err}\n")
        return 2
    compiled = _load(args.file, budget=not args.force)
    _forced(args, compiled)
    out = _build_dir(compiled, args.output)
    m = compiled.spec.mesh
    try:
        cmd, env = launch_command(args, m.nodes, out, os.environ)
    except UsageError as err:
        sys.stderr.write(f"error: {err}\n")
        return 2
    codegen.emit(compiled, out)
    here = m.world_size if env.get("LOCAL_NODES") or m.nodes == 1 else m.devices_per_node
    extra = f"; torchrun {env['TORCHRUN_ARGS']}" if env["TORCHRUN_ARGS"] else ""
    print(f"scalec: {shlex.join(cmd)}   ({here} processes{extra})", flush=True)
    return subprocess.call(cmd, env=env)


def _undecodable_as_bytes(err: UnicodeError):
    """Error handler of stdout and stderr: a file name's byte that is not UTF-8 (kept by Python as a lone surrogate)
    is written back as that byte, as the user typed it; any other character the stream cannot encode, escaped."""
    ch = err.object[err.start] if isinstance(err, UnicodeEncodeError) else ""
    if ch and 0xdc80 <= ord(ch) <= 0xdcff:
        return bytes([ord(ch) - 0xdc00]), err.start + 1
    return codecs.backslashreplace_errors(err)


codecs.register_error("scalec.undecodable", _undecodable_as_bytes)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    for stream in (sys.stdout, sys.stderr):  # file names are printed; one that is not UTF-8 must not crash us
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="scalec.undecodable")
    program_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, program_args = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="scalec", description="Compile .scale training plans into torch.distributed "
                                "programs.", formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"scalec {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    c = sub.add_parser("check", help="report every problem in a .scale file",
                       description="Parse and check FILE; print every problem found, each located in the source.")
    c.add_argument("file", metavar="FILE")
    c.set_defaults(func=cmd_check)
    c = sub.add_parser("explain", help="what a diagnostic code means",
                       description="Print the title and explanation of a diagnostic code, e.g. `scalec explain "
                                   "E0401`.")
    c.add_argument("code", metavar="CODE")
    c.set_defaults(func=cmd_explain, file=None)
    c = sub.add_parser("plan", help="parameters, FLOPs, memory per rank, mesh and collectives",
                       description="Build the model on the meta device (no weights are allocated) and print what "
                                   "the plan costs: parameters, FLOPs per step, model-state memory per rank, the "
                                   "mesh and the collectives of one step.")
    c.add_argument("file", metavar="FILE")
    c.add_argument("--svg", metavar="OUT", help="write the pipeline schedule's timeline as an SVG")
    c.add_argument("--json", action="store_true", help="print everything as JSON (keys described in the README)")
    c.set_defaults(func=cmd_plan)
    c = sub.add_parser("compile", help="write the program, plan.json and launch script",
                       description="Compile FILE into DIR: program.py (the same file on every rank), plan.json and "
                                   "launch.sh (the torchrun command).")
    c.add_argument("file", metavar="FILE")
    c.add_argument("-o", "--output", metavar="DIR", help="output directory (default build/<model name>)")
    c.add_argument("--show-graphs", action="store_true",
                   help="print every segment's graph after each pass (to stderr)")
    c.add_argument("--force", action="store_true", help="compile even if the predicted peak memory does not fit")
    c.set_defaults(func=cmd_compile)
    c = sub.add_parser("reshard", help="what moving a checkpoint from one plan to another reads",
                       description="Compile OLD and NEW (plans of one model) and print, for each tensor of the "
                                   "checkpoint, its pieces under both plans (axis, dim, pieces, pipeline stage) and "
                                   "the bytes each rank of NEW reads. Runs nothing.")
    c.add_argument("old", metavar="OLD")
    c.add_argument("new", metavar="NEW")
    c.set_defaults(func=cmd_reshard, file=None)
    c = sub.add_parser("export", help="a checkpoint of FILE's model as a Hugging Face checkpoint",
                       description="Read CHECKPOINT (a step_N directory the program saved, under any plan) and write "
                                   "DIR/config.json and DIR/model*.safetensors in Hugging Face's layout of FILE's "
                                   "model (Llama, Qwen 2 or Mixtral), loadable by transformers and by "
                                   "`init = from(DIR)`.")
    c.add_argument("file", metavar="FILE")
    c.add_argument("checkpoint", metavar="CHECKPOINT")
    c.add_argument("-o", "--output", dest="out", required=True, metavar="DIR")
    c.add_argument("--config", metavar="CONFIG",
                   help="the config.json (or checkpoint directory) the model was imported from: its keys the model "
                        "does not set (token ids, ...) are kept, its generation config and tokenizer copied "
                        "(default: the directory of the train section's `init = from(...)`, if it holds one)")
    c.set_defaults(func=cmd_export)
    c = sub.add_parser("search", help="the fastest plans for the model on the cluster, with reasons",
                       description="Search the plans of FILE's model on FILE's cluster (the mesh's nodes, "
                                   "devices_per_node, device and its figures; the train section as written) and "
                                   "print the fastest by predicted step time, each with its reasons, then the "
                                   "families rejected and why. Free: dp, tp, pp, ep (MoE models), virtual stages, "
                                   "micro-batch size and count, schedule, sequence parallelism, recompute, "
                                   "data_parallel. The file's own axes and plan settings are not constraints (the "
                                   "mesh may give only nodes, devices_per_node and device; the plan section may be "
                                   "absent): --fix says what is fixed. Exit status 1 when no plan fits.")
    c.add_argument("file", metavar="FILE")
    c.add_argument("--top", type=_positive_int, default=5, metavar="K", help="how many plans to print (default 5)")
    c.add_argument("--fix", action="append", default=[], metavar="KEY=VALUE",
                   help="fix a setting (repeatable): dp, tp, pp, ep, virtual_stages, micro_batches, "
                        "micro_batch_size, schedule, sequence_parallel, recompute, data_parallel, fsdp_grad_sync")
    c.add_argument("-o", "--output", metavar="BEST.scale",
                   help="write the fastest plan as a complete .scale file (FILE's other sections kept as written)")
    c.add_argument("--json", action="store_true", help="print the result as JSON (keys described in the README)")
    c.set_defaults(func=cmd_search)
    c = sub.add_parser("import", help="the .scale model section of a Hugging Face config.json",
                       description="Print the .scale model section equivalent to CONFIG, a Hugging Face config.json "
                                   "(or the checkpoint directory holding it) of LlamaForCausalLM, "
                                   "MistralForCausalLM, Qwen2ForCausalLM or MixtralForCausalLM; each line's comment "
                                   "names the JSON keys it came from. A key "
                                   "that is neither mapped nor known to be irrelevant, or a value the language "
                                   "cannot express, is an error located at the key.")
    c.add_argument("file", metavar="CONFIG", help="a config.json, or the directory holding one")
    c.add_argument("-o", "--output", metavar="FILE",
                   help="write a whole .scale file: the model section and placeholder mesh and train sections")
    c.set_defaults(func=cmd_import)
    c = sub.add_parser("run", help="compile, then train under torchrun",
                       description="Compile FILE, then launch it under torchrun with this node's processes. "
                                   "Arguments after `--` go to the program (see `build/<name>/program.py --help`: "
                                   "--checkpoint-dir, --seed, --debug, ...), each kept whole; torchrun's own flags "
                                   "go in one string, split as a shell would: --torchrun-args \"--log-dir 'my "
                                   "logs'\". A mesh of several nodes runs this node's share: set NODE_RANK and "
                                   "MASTER_ADDR (and MASTER_PORT) on each machine, or pass --local-nodes.")
    c.add_argument("file", metavar="FILE")
    c.add_argument("-o", "--output", metavar="DIR", help="build directory (default build/<model name>)")
    c.add_argument("--steps", type=_positive_int, help="train for this many steps instead of the file's")
    c.add_argument("--metrics", metavar="FILE", help="write one JSON line per step to FILE")
    c.add_argument("--torchrun-args", dest="torchrun_string", metavar="'FLAGS'",
                   help="torchrun's own flags, in one string (e.g. \"--redirects 3 --log-dir logs\")")
    c.add_argument("--local-nodes", action="store_true",
                   help="on a mesh of several nodes, start every node's processes on this machine (testing)")
    c.add_argument("--force", action="store_true", help="run even if the predicted peak memory does not fit")
    c.set_defaults(func=cmd_run)
    args = p.parse_args(argv)
    args.program_args = program_args
    if program_args and args.command != "run":
        p.error("arguments after `--` are for `scalec run` only")
    try:
        return args.func(args)
    except ScaleError as err:
        sys.stderr.write(err.render())
        return 1
    except FileNotFoundError as err:
        sys.stderr.write(f"error: cannot read {err.filename}: no such file\n")
        return 1
    except IsADirectoryError as err:
        sys.stderr.write(f"error: {err.filename} is a directory, not a .scale file\n")
        return 1
    except OSError as err:
        sys.stderr.write(f"error: {err.strerror or err}: {err.filename or ''}\n")
        return 1
    except UnicodeDecodeError:
        sys.stderr.write(f"error: {args.file} is not UTF-8 text\n")
        return 1
    except Exception as exc:  # noqa: BLE001 - a bug of ours, not of the input: say so in one line
        try:
            detail = str(exc).strip().split("\n")[0][:200]
        except Exception:  # noqa: BLE001 - the message itself may fail to print
            detail = ""
        what = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
        sys.stderr.write(f"error: internal compiler error: {what} (a bug in scalec, not in your file; please "
                         "report it, with the trace that SCALEC_BACKTRACE=1 prints)\n")
        if os.environ.get("SCALEC_BACKTRACE", "") not in ("", "0"):
            traceback.print_exc()
        return 3


if __name__ == "__main__":
    sys.exit(main())
