"""Pruning rule 10 of compiler/search/prune.py: offload, tried for the families that fit no other way, and the run
that tries it only when it must (`run`), with what it says of a winner that offloads (`reason`).

A family none of whose variants fits (rules 7 and 8) is tried, per dp sharding, with each offload of
compiler/search/space.py `offloads` in turn, least first (optimizer offload at a growing fraction, then FSDP2's
parameter offload where the sharding is fsdp, then activations). As rule 7 does without offload, the variant with
the most recomputation goes first: when it does not fit, no less recomputation does with that offload, and the next
offload is tried; when it fits, the least recomputation that fits (and whose step-time bound is below the run's
threshold, rule 6) is simulated exactly and offered. The first offload that fits ends the sharding's search: more
offload only adds copies and host work.
"""
from __future__ import annotations

from compiler import plan as P
from compiler.search.space import placement_key


def key(plan) -> tuple:
    """A variant with its offload (what `Search.offloaded` remembers per winner)."""
    return placement_key(plan) + (plan.offload, plan.offload_fraction, plan.offload_modules)


def run(search_class, spec, top, fixed, cands, headroom):
    """One search, and where no plan fits and offload is neither fixed nor refused (`--fix offload=none`), the same
    search again with offload tried (rule 10): a cluster that fits the model pays nothing for it. Where offload
    does not help either, the first run's result says so in one line more: the least peak offload reached."""
    result = search_class(spec, top, fixed, cands, headroom).run()
    if result.winners or "offload" in fixed or not result.counts.families:
        return result
    again = search_class(spec, top, fixed, cands, headroom, offload=True)
    found = again.run()
    if found.winners:
        return found
    least = min((st["min_peak"] for st in again.stats.values() if st["min_peak"] is not None),
                key=lambda x: x[0], default=None)
    if least is not None:
        from compiler.report.units import nbytes
        peak, who, plan = least
        result.rejected.append(f"offload does not make it fit either: its least is {nbytes(peak)} on {who} "
                               f"({plan.describe()})")
    return result


def _offloaded(plan, mode, rc, offload):
    kind, fraction = offload
    return P.evolve(plan, data_parallel=mode[0], fsdp_grad_sync=mode[1], recompute=rc, offload=kind,
                    offload_fraction=fraction)


def expand_offloaded(s, plan0, at, log) -> None:
    """Rule 10 on one family of the run `s` (prune.Search; `at`: the family's ranking key, `log`: the run's log of
    exact predictions)."""
    rcs = s.space.recomputes()
    for mode in s.modes(plan0):
        for offload in s.space.offloads(mode[0], plan0.size("dp")):
            frugal = _cost(s, _offloaded(plan0, mode, rcs[-1], offload))
            if frugal is None or frugal[1].peak_bytes > s.limit:
                continue  # no recomputation fits with this offload: more offload may
            for rc in rcs:
                got = frugal if rc == rcs[-1] else None
                if got is None:
                    plan, problems = s._legal(_offloaded(plan0, mode, rc, offload))
                    if problems:
                        continue
                    decided = s.cands.decide(plan)
                    est = s.cands.estimate(decided, memory=False)
                    bound = s.sim.predict(s.cands.cost_model(decided), decided, est, exact=False).step_time_s
                    s.counts.bounded += 1
                    if bound >= s.threshold(at):
                        continue  # rule 6: more recomputation is slower, the frugal one is tried last
                    got = _cost(s, plan)
                    if got is None or got[1].peak_bytes > s.limit:
                        continue
                decided, est = got
                cm = s.cands.cost_model(decided)
                pred = s.sim.predict(cm, decided, est, exact=True, detail=False)
                s.counts.exact += 1
                if pred.step_time_s >= s.threshold(at):
                    break
                plain = P.evolve(decided, offload="none", offload_fraction=1.0, offload_modules=())
                without = s.cands.estimate(plain)
                s.offloaded[key(decided)] = (without.peak_bytes,
                                             s.sim.predict(cm, plain, without, exact=True, detail=False).step_time_s)
                for st in s._stat(decided):
                    if st["best_exact"] is None or pred.step_time_s < st["best_exact"][0]:
                        st["best_exact"] = (pred.step_time_s, decided)
                log.append((decided, est, pred, plan0))
                s._offer(pred.step_time_s, at, (decided, est, pred))
                break
            break  # the least offload that fits this dp sharding


def _cost(s, plan):
    """(decided, estimate) of an offloaded variant, counted as the run counts any, or None where a rule refuses
    it."""
    s.counts.checked += 1
    plan, problems = s._legal(plan)
    if problems:
        s._refused(plan, problems)
        return None
    s.counts.passed += 1
    decided = s.cands.decide(plan)
    est = s.cands.estimate(decided)
    s.counts.costed += 1
    peak = est.peak_bytes
    for st in s._stat(decided):
        st["passed"] += 1
        st["costed"] += 1
        if st["min_peak"] is None or peak < st["min_peak"][0]:
            st["min_peak"] = (peak, max(est.memory, key=lambda r: r.peak).who, decided)
        if peak <= s.limit:
            st["fit"] += 1
    if peak <= s.limit:
        s.counts.fitting += 1
    return decided, est


def reason(s, d, est, pred) -> list:
    """A winner that offloads: what it fits and at what cost ("optimizer offload 50% fits 70.6B on 16 h100 at
    1.01× the step time; without it 83.7 GB of 72 GB")."""
    from compiler.plan import offload_text
    from compiler.report.units import count, nbytes
    got = getattr(s, "offloaded", {}).get(key(d))
    if d.offload == "none" or got is None:
        return []
    peak, t = got
    return [f"{offload_text(d)} fits {count(est.params_n)} parameters on {d.world_size} {s.device.kind} at "
            f"{pred.step_time_s / t:.2f}× the step time; without it {nbytes(peak)} of "
            f"{nbytes(s.limit)} per device"]
