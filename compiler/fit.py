"""Whether a plan fits its devices, and what would make it fit.

`budget` is the memory advice `compile`, `plan` and `run` give (E0501 over a device, W0502 within 10% of one);
`fixes` is what it suggests: the same plan with one thing changed (recomputation, smaller micro-batches, a ZeRO
stage, FSDP's reduce-scatter every micro-batch, more tp or pp taken from dp, and last offload), each checked by the
rules every plan meets and costed by the same memory model, from the one trace the compiler already has
(compiler/candidates.py)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from compiler import plan as P
from runtime import choices  # torch-free
from compiler.diagnostics import Diagnostic


@dataclass(frozen=True)
class Fix:
    change: str      # what to write in the .scale file
    peak: float      # the predicted peak of the fullest rank with it
    fits: bool


def _with_axis(plan: P.Plan, axis: str, factor: int, source: str) -> P.Plan | None:
    """`plan` with `axis` × factor and `source` ÷ factor (the same devices), or None when it does not divide."""
    axes = dict(plan.axes)
    n = axes.get(source, 1)
    if n % factor or n == 1:
        return None
    axes[source] = n // factor
    axes[axis] = axes.get(axis, 1) * factor
    order = [a for a, _ in plan.axes] + [a for a in (axis,) if a not in dict(plan.axes)]
    return replace(plan, axes=tuple((a, axes[a]) for a in order), stages=(), tp=(), ep=())


def variants(plan: P.Plan) -> list:
    """(change, plan) for each single change worth trying."""
    out = []
    recompute = getattr(plan, "recompute", None)
    if recompute is not None:
        for mode in ("selective", "full"):
            if recompute != mode and not (recompute == "full" and mode == "selective"):
                out.append((f"recompute = {mode}", replace(plan, recompute=mode)))
    mb, m = plan.micro_batch_size, plan.micro_batches
    for k in (2, 4):
        if mb % k == 0:
            out.append((f"micro_batches = {m * k} ({mb // k} sequence{'s' if mb // k != 1 else ''} each)",
                        replace(plan, micro_batches=m * k, stages=())))
    if plan.shards_grads and m > 1 and not plan.syncs_each_micro_batch:
        # FSDP2's gradients reduce-scattered every micro-batch: sharded, not accumulated whole
        synced = replace(plan, fsdp_grad_sync="micro_batch")
        if synced.syncs_each_micro_batch:
            out.append(("fsdp_grad_sync = micro_batch", synced))
    if plan.size("dp") > 1:
        for kind in choices.SHARDED:
            if kind != plan.data_parallel:
                out.append((f"data_parallel = {kind}", replace(plan, data_parallel=kind)))
    for axis in ("tp", "pp"):
        for source in ("dp", "ep"):
            bigger = _with_axis(plan, axis, 2, source)
            if bigger is not None:
                out.append((f"{axis} = {bigger.size(axis)} ({source} = {bigger.size(source)})", bigger))
                break
    return out + offloads(plan)


OFFLOADS = (("optimizer", 0.5), ("optimizer", 1.0), ("params", 1.0), ("activations", 1.0))
"""The offloads `fixes` tries, after every other change (compiler/cost/offload.py prices them; parameter offload
only where the plan is fsdp)."""


def offloads(plan: P.Plan) -> list:
    """(change, plan) for each offload worth trying on a plan without one, as the plan section writes it."""
    from compiler.report.scale import offload_setting
    if getattr(plan, "offload", "none") != "none":
        return []
    out = []
    for kind, f in OFFLOADS:
        if kind == "params" and plan.zero_stage != 3:
            continue
        moved = P.evolve(plan, offload=kind, offload_fraction=f)
        out.append((f"offload = {offload_setting(moved)}", moved))
    return out


def fixes(compiled, limit: float) -> list[Fix]:
    """Each variant the rules accept, with the peak it would give; those that fit first, lowest peak first."""
    from compiler.candidates import Candidates
    base = compiled.plan
    if base is None:
        return []
    cands = Candidates(compiled.spec, compiled.unsharded)
    found = []
    for change, plan in variants(base):
        if cands.requires(plan):  # a rule refuses it (a tp degree the heads do not allow, zero2 with ep, ...)
            continue
        peak = cands.estimate(cands.decide(plan)).peak_bytes  # every pp rank's peak: the fullest
        found.append(Fix(change, peak, peak <= limit))
    # offload after the others that fit: it adds copies and host work to the step (compiler/cost/offload.py)
    return sorted(found, key=lambda f: (not f.fits, f.fits and f.change.startswith("offload"), f.peak))


def advice(compiled) -> tuple[Fix, ...]:
    """What would make a compiled plan (compiler.pipeline.Compiled) fit one device of its mesh: `fixes` at the
    device's memory, lowered and costed once per compiled plan, on first ask (kept in `compiled.advice`). `budget`'s
    E0501 and every form of the `plan` report (text, JSON, HTML) read this one list; none lowers or costs again."""
    got = compiled.advice
    if got is None:
        got = compiled.advice = tuple(fixes(compiled, compiled.spec.cluster.device.memory_gb * 1e9))
    return got


def budget(compiled) -> list[Diagnostic]:
    """What the memory model says of a compiled plan (compiler.pipeline.Compiled): E0501 (an error) when the
    fullest rank's predicted peak exceeds one device, with what would make it fit (`advice`); W0502 (a warning) when
    it fits with less than 10% to spare."""
    from compiler.cost import memory as MEM
    return MEM.over_memory(compiled.spec, compiled.costs.memory, lambda: advice(compiled))
