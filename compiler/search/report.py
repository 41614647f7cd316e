"""What `scalec search` prints: the winners' reasons and the rejected-families lines (from the bookkeeping of the run,
compiler/search/prune.py), the table (`text`), `--json` (`to_json`) and the winner as a .scale file (`scale_text`,
`-o BEST.scale`, printed by compiler/report/scale.py). Figures are formatted by compiler/report/units.py.

Winners are distinct layouts: the best plan of each of the K best mesh shapes (axis sizes); with every axis fixed,
the K best plans of that shape. `Result.rejected` gives one line per axis value, and per schedule, that is not
among the winners, with its figures: what refused it, what it would need in memory, or how much slower it is
(exactly, when simulated; as a lower bound, when pruned).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from compiler.plan import placement_text
from compiler.report import scale as scale_printer
from compiler.report.units import nbytes, seconds
from compiler.search.space import ORDER, RECOMPUTE, divisors_of, family_of, placement_key, variant_of

if TYPE_CHECKING:
    from compiler import spec as S
    from compiler.search.result import Result, Winner

# -- the lines of the run: reasons of each winner, the families rejected, why `--fix` leaves none --------------


def unsatisfiable(space, cluster) -> list:
    """Why `--fix` leaves not one candidate to check (the rules never saw one, so they give no reason): the
    fixed axes against the devices, ep on a model without `moe`, then each fixed setting that alone leaves
    none, or else the settings together. One line each, as `rejected` lines read."""
    f, out = space.fixed, []
    axes = {a: f[a] for a in ORDER if a in f}
    prod = math.prod(axes.values())
    m = cluster  # compiler/layout/cluster.py Cluster: the machines searched
    if space.world % prod:
        shown = " × ".join(f"{a}={n}" for a, n in axes.items()) + (f" = {prod}" if len(axes) > 1 else "")
        out.append(f"{shown} does not divide the {space.world} devices ({m.nodes} node{'s' if m.nodes != 1 else ''}"
                   f" × {m.devices_per_node}): the axes multiply to the device count; sizes that divide it: "
                   + ", ".join(map(str, divisors_of(space.world))))
    if f.get("ep", 1) > 1 and not space.moe:
        out.append(f"ep={f['ep']}: the model has no `moe` layer to shard over ep (E0704)")
    if out:
        return out
    gb, blocks = space.base.global_batch, space.blocks
    for key, value in f.items():
        if space.families_with({key: value}):
            continue
        if key in ("micro_batches", "micro_batch_size"):
            out.append(f"{key}={value}: no split of the global batch ({gb} sequences over dp × ep ranks, "
                       "micro_batches × micro_batch_size on each) has it")
        elif key == "virtual_stages":
            out.append(f"virtual_stages={value}: interleaving needs pp > 1 and pp × virtual_stages at most the "
                       f"{blocks} blocks")
        else:
            out.append(f"{key}={value}: no candidate on {space.world} devices has it")
    if not out:
        out.append("the fixed settings " + ", ".join(f"{k}={v}" for k, v in f.items()) + " exclude one "
                   "another: no candidate has them all (each alone leaves some)")
    return out


def _placement_name(placement) -> str:
    return "the mesh's order" if placement is None else placement_text(placement)


def _placement_reason(s, d, pred, lk) -> list:
    """Where the network is described (pruning rule 9): the placement the winner takes, the tier each axis's
    traffic crosses under it, and the other placement's step time."""
    from compiler.cost.links import tier_name
    alt = s.placed.get(placement_key(d)) if s.vary_placement else None
    if alt is None:
        return []
    other, t = alt
    where = ", ".join(f"{a} {n} on {tier_name(lk[a])}" for a, n in d.axes if n > 1 and a in lk)
    return [f"placement {_placement_name(d.placement)} ({where}); {_placement_name(other)}: "
            f"{t / pred.step_time_s:.2f}× its step time"]


def _slowest_hidden(pred) -> dict:
    """The seconds per axis the slowest rank's overlapped pairs hid (dualpipev; compiler/cost/step_time.py)."""
    from compiler.cost.step_time import slowest_rank
    return slowest_rank(pred.ranks).hidden_comm_s if pred.ranks else {}


def reasons(s, d, est, pred, best_t) -> list:
    """The short lines under a winner: how far from the best, where each axis's traffic runs and what it exposes,
    what less recomputation or another dp sharding would have cost (from the run's log of its family), its peak.
    `s` is the run (compiler/search/prune.py's Search), as for `rejected`."""
    from compiler.cost.links import links
    lk = links(d, s.cluster, (lambda: est.ledger) if d.placement == "auto" else None)
    out = []
    if best_t is not None and pred.step_time_s > best_t:
        out.append(f"{pred.step_time_s / best_t:.2f}× the best step time")
    tp = d.size("tp")
    if tp > 1:
        where = "crosses nodes" if lk["tp"].crosses_nodes else "stays inside a node"
        out.append(f"tp {tp} {where} ({seconds(pred.exposed_comm_s.get('tp', 0.0))} of tp collectives exposed)")
    pp = d.size("pp")
    if pp > 1:
        v = f", {d.virtual_stages} stages per rank" if d.virtual_stages > 1 else ""
        out.append(f"pp {pp}: bubble {pred.bubble_fraction:.1%} at {d.micro_batches} micro-batches "
                   f"({d.schedule}{v})")
    ep = d.size("ep")
    if ep > 1:
        where = "cross nodes" if lk["ep"].crosses_nodes else "stay inside a node"
        if getattr(d, "ep_nodes", ()):  # dispatched by node: ep's two halves (runtime/moe_nodes.py)
            where = f"cross {d.ep_nodes[0]} nodes once per token and node, then inside the node"
        names = ("ep", "ep_rail", "ep_node")
        hid = sum(_slowest_hidden(pred).get(a, 0.0) for a in names)
        hidden = f" ({seconds(hid)} hidden in {d.schedule}'s overlapped pairs)" if hid > 0 else ""
        exposed = sum(pred.exposed_comm_s.get(a, 0.0) for a in names)
        out.append(f"ep {ep} all-to-alls {where}: {seconds(exposed)} exposed{hidden}")
    cp = d.size("cp")
    if cp > 1:
        seq = d.seq_len
        out.append(f"cp {cp} keeps {_tokens(seq)} activations at {nbytes(est.peak_bytes)} "
                   f"({seq // cp:,} tokens of each sequence per rank; {d.context_parallel})")
        where = "crosses nodes" if lk["cp"].crosses_nodes else "stays inside a node"
        out.append(f"cp {cp} {where} ({seconds(pred.exposed_comm_s.get('cp', 0.0))} of cp traffic exposed)")
    dpn = d.size("dp")
    if dpn > 1:
        dp_s = sum(t for a, t in pred.exposed_comm_s.items() if a in ("dp", "dp×ep", "dp×cp"))
        out.append(f"dp {dpn} ({d.data_parallel}): {seconds(dp_s)} of its traffic exposed")
    out += _placement_reason(s, d, pred, lk)
    from compiler.search.offloaded import reason as offload_reason
    out += offload_reason(s, d, est, pred)  # rule 10: what offload fits, at what cost
    tried = s.family_log.get(family_of(d), [])
    peak = est.peak_bytes
    if d.recompute != "none":
        less = [p for mode, rc, p, _, _ in tried if mode == variant_of(d) and rc != d.recompute and p is not None
                and RECOMPUTE.index(rc) < RECOMPUTE.index(d.recompute)]
        if less:
            out.append(f"{d.recompute} recompute: with less, {nbytes(min(less))} of {_allowed(s)}")
    if d.shards_optimizer:
        ddp = [(p, t, b) for mode, rc, p, t, b in tried if mode[0] == "ddp" and rc == d.recompute]
        plain = next((m for m in s.modes(d) if m[0] == "ddp"), None)
        if plain is not None and (not ddp or ddp[0][0] is None):  # its memory not costed at this recomputation:
            # the run knew it would not fit from one with more recomputation (rule 7), or pruned it by its bound
            # first (rule 6); where it would not fit, that is the reason to say
            p = s.peak_of(d, plain, d.recompute)
            ddp = [(p, None, None)] if p is not None and p > s.limit else ddp
        if ddp:
            p, t, b = ddp[0]
            if p is not None and p > s.limit:
                out.append(f"{d.data_parallel}: ddp would need {nbytes(p)} ({d.recompute} recompute)")
            elif t is not None:
                out.append(f"{d.data_parallel}: ddp {t / pred.step_time_s:.2f}× its step time")
            elif b is not None:
                out.append(f"{d.data_parallel}: ddp at least {b / pred.step_time_s:.2f}× its step time")
    if d.shards_grads and d.micro_batches > 1 and d.size("pp") == 1:
        # fsdp_grad_sync: the other choice of when the reduce-scatters run, as costed
        mine = variant_of(d)
        other = [(p, t, b) for mode, rc, p, t, b in tried if mode[0] == mine[0] and mode != mine
                 and rc == d.recompute]
        what = ("reduce-scatter every micro-batch" if mine[1] == "micro_batch" else
                "reduce-scatter once per step")
        costed = s.peaks.get(family_of(d), {})
        if not other and any(m0 == mine[0] and m1 != mine[1] and rc == d.recompute for (m0, m1), rc in costed):
            other = [(p, None, None) for ((m0, m1), rc), p in costed.items()
                     if m0 == mine[0] and m1 != mine[1] and rc == d.recompute]
        alt_mode = next((m for m in s.modes(d) if m[0] == mine[0] and m != mine), None)
        if alt_mode is not None and (not other or other[0][0] is None):  # its memory not costed here (rule 6)
            p = s.peak_of(d, alt_mode, d.recompute)
            other = [(p, None, None)] if p is not None and p > s.limit else other
        if other:
            p, t, b = other[0]
            alt = "once per step" if mine[1] == "micro_batch" else "every micro-batch"
            if p is not None and p > s.limit:
                out.append(f"{what}: {alt} would need {nbytes(p)}")
            elif t is not None:
                out.append(f"{what}: {alt} {nbytes(p)} at {t / pred.step_time_s:.2f}× its step time")
            elif b is not None:
                out.append(f"{what}: {alt} at least {b / pred.step_time_s:.2f}× its step time")
    out.append(f"peak {nbytes(peak)} of {nbytes(s.device_bytes)}, {_free(1 - peak / s.device_bytes)} free "
               f"({max(est.memory, key=lambda r: r.peak).who})")
    return out


def _free(share: float) -> str:
    """A share of the device left free, floored (never rounded up past the headroom): 0.0999 -> "9.9%"."""
    return f"{math.floor(share * 1000) / 10:g}%"


def _allowed(s) -> str:
    """What a plan may use: "72 GB (80 GB less 10% headroom)", or the device where no headroom is kept."""
    if not s.headroom:
        return nbytes(s.device_bytes)
    return f"{nbytes(s.limit)} ({nbytes(s.device_bytes)} less {s.headroom:.0%} headroom)"


def _tokens(seq: int) -> str:
    """131072 -> "128K", 4096 -> "4K", 1000 -> "1,000-token"."""
    return f"{seq // 1024}K" if seq % 1024 == 0 else f"{seq:,}-token"


def rejected(s, winners, best_t) -> list:
    """One line per axis value, and per schedule, that is not among the winners, with what refused it, what it
    would need in memory, or how much slower it is (exactly, when simulated; as a lower bound, when pruned)."""
    from compiler.cost.links import links
    won = set()
    for w in winners:
        for a in ("tp", "pp", "ep", "cp"):
            won.add((a, w.plan.size(a)))
        if w.plan.size("pp") > 1:
            won.add(("schedule", w.plan.schedule))
        if w.plan.size("cp") > 1:
            won.add(("context_parallel", w.plan.context_parallel))
    out = []
    refused: dict = {}  # (axis, code) -> [values], the message of the first: one line for many values
    for (a, n), st in sorted(s.stats.items(), key=lambda kv: (kv[0][0], str(kv[0][1]).zfill(8))):
        if (a, n) in won:
            continue
        name = f"{a} {n}" if a != "schedule" else n  # "context_parallel ring": cp's attention variant
        if not st["passed"] and st["refused"] and not st["costed"] and st["best_bound"] is None:
            code, msg = _why_refused(st)
            got = refused.setdefault((a, code), (len(out), [], msg))
            if not got[1]:
                out.append(None)
            got[1].append(name)
            continue
        if st["costed"] and not st["fit"]:
            peak, who, least = st["min_peak"]
            what = least.describe()
            margin = f" less {s.headroom:.0%} headroom" if s.headroom else ""
            out.append(f"{name} does not fit: {nbytes(peak, gigabytes=True)} of "
                       f"{nbytes(s.device_bytes, gigabytes=True, unit=False)}{margin} on {who} "
                       f"(its least: {what})")
            continue
        why = ""
        if a in ("tp", "cp") and n > 1:
            probe = replace(s.base, axes=(("dp", s.world // n), (a, n)))
            why = " crosses nodes:" if links(probe, s.cluster)[a].crosses_nodes else ""
        if st["best_exact"] is not None and best_t:
            t, fastest = st["best_exact"]
            what = fastest.describe()
            if st["left"] is not None and st["left"] < t:  # a plan left unsimulated may be faster than its best
                out.append(f"{name}{why} at least {st['left'] / best_t:.2f}× slower than the best (lower bound; "
                           f"its best simulated {t / best_t:.2f}×: {what})")
            else:
                out.append(f"{name}{why} {t / best_t:.2f}× slower than the best (its best: {what})")
        elif st["best_bound"] is not None and best_t:
            out.append(f"{name}{why} at least {st['best_bound'] / best_t:.2f}× slower than the best "
                       "(lower bound; not simulated)")
        elif st["refused"]:
            code, msg = _why_refused(st)
            out.append(f"{name}: {msg} ({code})")
    for (a, code), (i, names, msg) in refused.items():
        more = f" (and {', '.join(x.split()[-1] for x in names[1:])})" if len(names) > 1 else ""
        out[i] = f"{names[0]}{more}: {msg} ({code})"
    return out


def _why_refused(st) -> tuple:
    """(code, message) of the most frequent refusal of a family, preferring its own axis's rules."""
    (code, msg, _), _ = max(st["refused"].items(), key=lambda kv: (kv[0][2], kv[1]))
    return code, msg


# -- output ---------------------------------------------------------------------------------------------------


def _exposed(pred) -> str:
    items = [(a, t) for a, t in pred.exposed_comm_s.items() if t > 0]
    return ", ".join(f"{a} {seconds(t)}" for a, t in sorted(items, key=lambda x: -x[1])) or "none"


def text(result: Result) -> str:
    """The table `scalec search` prints: the winners with their reasons, the rejected families, the counts."""
    spec = result.spec
    m = spec.cluster
    dev = m.device
    room = (f"; {result.headroom:.0%} headroom: plans up to {nbytes(result.limit_bytes)}"
            if result.headroom else "; no headroom")
    lines = [f"search for `{spec.model.name}` ({spec.path}) on {m.world_size} {dev.kind} = {m.nodes} node"
             f"{'s' if m.nodes != 1 else ''} × {m.devices_per_node} ({dev.memory_gb:g} GB each{room})"
             + (f"; fixed: {', '.join(f'{k}={v}' for k, v in result.fixed.items())}" if result.fixed else ""), ""]
    if not result.winners:
        lines += ["no plan passes the rules and fits the devices"]
    head = (f"  {'#':>2}  {'step':>9}  {'tokens/s':>10}  {'MFU':>5}  {'peak/rank':>9}  {'bubble':>6}  "
            f"exposed communication")
    if result.winners:
        lines += [head]
    for i, w in enumerate(result.winners, 1):
        p = w.prediction
        lines += [f"  {i:>2}  {seconds(p.step_time_s):>9}  {p.tokens_per_s:>10,.0f}  {p.mfu:>5.1%}  "
                  f"{nbytes(w.peak_bytes):>9}  {p.bubble_fraction:>6.1%}  {_exposed(p)}",
                  f"      {w.plan.describe()}"]
        lines += [f"        - {r}" for r in w.reasons]
    if result.written is not None:
        from compiler.search.written import lines as written_lines
        lines += [""] + written_lines(result.written, result.winners, spec, result.limit_bytes)
    if result.rejected:
        lines += ["", "rejected:"] + [f"  {r}" for r in result.rejected]
    c = result.counts
    lines += ["", f"{c.space:,} candidates in {c.families:,} families (mesh shape, sequence parallelism, "
              f"micro-batch size, schedule); {c.family_rules:,} families refused by the rules, "
              f"{c.bounded_families:,} bounded, {c.expanded:,} expanded; {c.checked:,} variants checked, "
              f"{c.costed:,} costed, {c.fitting:,} fit, {c.bounded:,} bounded, {c.exact:,} simulated exactly; "
              f"{c.structures} pass structures; {result.seconds:.2f} s"]
    return "\n".join(lines) + "\n"


def to_json(result: Result) -> dict:
    """`scalec search --json` (keys described in docs/planning.md)."""
    spec = result.spec
    return {
        "model": spec.model.name, "file": spec.path, "fixed": dict(result.fixed),
        "cluster": {"nodes": spec.cluster.nodes, "devices_per_node": spec.cluster.devices_per_node,
                    "device": spec.cluster.device.kind,
                    "device_memory_bytes": int(spec.cluster.device.memory_gb * 1e9),
                    "headroom": result.headroom,  # the share of each device no plan may use
                    "memory_limit_bytes": int(result.limit_bytes)},
        "winners": [{"rank": i, "plan": w.plan.to_json(spec.cluster), "describe": w.plan.describe(),
                     "predicted": w.prediction.as_json(), "peak_bytes": int(w.peak_bytes),
                     "memory": [r.as_json() for r in w.estimate.memory], "reasons": list(w.reasons),
                     "dispatch": w.dispatch,
                     "fp8": None if w.fp8 is None else {"recipe": w.fp8.recipe, "filter": w.fp8.filter}}
                    for i, w in enumerate(result.winners, 1)],
        "file_plan": None if result.written is None else result.written.as_json(),
        "rejected": list(result.rejected),
        "counts": result.counts.as_json(),
        "seconds": result.seconds,
    }


def scale_text(spec: S.Spec, winner: Winner, chosen: str | None = None) -> str:
    """The winner as a complete .scale file (`-o BEST.scale`): a comment header with its predicted figures, then the
    file printed by compiler/report/scale.py (its mesh and plan sections from the winner's plan on `spec`'s cluster,
    its node count included, the rest of `spec`'s source as written, the mesh's device and its figures included).
    `chosen` says how the plan was chosen where it is not the fastest found (`search --minimize`)."""
    from compiler.parse import parse
    p = winner.prediction
    header = (f"# Written by `scalec search` from {spec.path}: its mesh and plan sections replaced by "
              f"{chosen or 'the fastest plan found'},\n# {winner.plan.describe()}:\n# predicted {seconds(p.step_time_s)} per step, "
              f"{p.tokens_per_s:,.0f} tokens/s, MFU {p.mfu:.1%}, "
              f"peak {nbytes(winner.peak_bytes, gigabytes=True)} per rank "
              f"(of {spec.cluster.device.memory_gb:g}).\n")
    source = spec.source
    if winner.dispatch == "grouped":
        source = grouped_source(spec)
        header += ("# Its dropless `moe` layers dispatched grouped (`dispatch = grouped`: the rows sorted by expert), "
                   "where the file's were padded.\n")
    if winner.precision_changed:  # the search's precision (compiler/search/precision.py), not the file's
        from compiler.search import precision as PR
        source = PR.source(source, spec, winner.fp8)
        header += f"# Its precision {PR.text(winner.fp8)}, where the file's was {PR.text(spec.train.fp8)}.\n"
    return scale_printer.scale_file(winner.plan, spec.cluster, source, parse(source, spec.path), header)


def grouped_source(spec: S.Spec) -> str:
    """`spec`'s source with `dispatch = grouped` in each dropless `moe` call of padded dispatch (the argument
    added before its closing parenthesis, or a written `dispatch = padded` replaced): what dispatch.grouped_dispatch
    searched, as text."""
    import re

    from compiler import spec as S
    lines = spec.source.split("\n")
    for m in sorted((x for x in S.walk(spec.model.layers) if isinstance(x, S.MoE) and x.capacity_factor == "none"
                     and x.dispatch == "padded"), key=lambda x: (x.span.line, x.span.col), reverse=True):
        sp = m.span
        last = lines[sp.end_line - 1]
        call = "\n".join(lines[sp.line - 1:sp.end_line])
        if re.search(r"\bdispatch\s*=\s*padded\b", call):
            for i in range(sp.line - 1, sp.end_line):
                lines[i] = re.sub(r"\bdispatch(\s*)=(\s*)padded\b", r"dispatch\1=\2grouped", lines[i])
            continue
        close = sp.end_col - 2  # the call's closing parenthesis
        assert last[close] == ")", (last, sp)
        lines[sp.end_line - 1] = last[:close] + ", dispatch = grouped" + last[close:]
    return "\n".join(lines)
