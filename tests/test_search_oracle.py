"""`scalec search` against a brute-force oracle: on small samples, the search's top-K is exactly what costing every
candidate of its space gives.

The search prunes (compiler/search/prune.py's docstring lists eight rules: sequence parallelism dominates, dp = 1
tries only ddp, branch and bound over families, recomputation escalates, bound before exact, the most frugal variant
first, memory grows with the micro-batch size). Each rule is argued safe or says what it may miss; this test is the
check that the arguments hold on real figures. The oracle below enumerates the space compiler/search/space.py's
docstring describes, written out again here and wider where the search narrows it by a pruning argument (every dp
sharding at dp = 1; both sequence-parallel settings wherever tp > 1; interleaving at every virtual-stage count, the
rules refusing the impossible ones; every micro-batch count of the global batch), and costs every candidate with the
per-plan functions the search itself uses (`Candidates.requires/decide/estimate/cost_model`, `Simulator.predict`):
one memory model and one step-time model, none of the pruning code. It then ranks as the search promises: the
best plan of each mesh shape, the K fastest shapes.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from compiler import plan as P
from compiler import search as SE
from compiler import spec as S
from compiler.candidates import Candidates
from compiler.check import check_path
from compiler.cost.step_time import Simulator

TOP = 4
SCHEDULES = ("1f1b", "zero-bubble", "gpipe", "interleaved-1f1b")
DP_MODES = ("ddp", "zero1", "zero2", "fsdp")
RECOMPUTE = ("none", "selective", "full")
CONTEXT_PARALLEL = ("all_gather", "ring", "all_to_all")  # written here, not read from the search: its own list


def _divisors(n: int) -> list:
    return [d for d in range(1, n + 1) if n % d == 0]


def _legal(cands: Candidates, plan: P.Plan):
    """The plan the search's space holds for `plan`, or None: a tp degree the vocabulary refuses only for want of
    padding (E0403 alone) is in the space with `pad_vocab = true` (compiler/search/space.py's docstring)."""
    problems = cands.requires(plan)
    if problems and not plan.pad_vocab and all(d.code == "E0403" for d in problems):
        plan = replace(plan, pad_vocab=True)
        problems = cands.requires(plan)
    return None if problems else plan


def space(spec: S.Spec):
    """Every candidate plan of the search's space for `spec` (no `--fix`), before the rules: mesh shapes laid out
    pp, dp, cp, ep, tp (ep only for a model with `moe` layers; axes of size 1 left out but dp), each cp > 1 with
    each attention variant, micro-batch counts, schedules with their virtual stages (pp > 1 only: one schedule is
    one plan without a pipeline), sequence parallelism (with tp > 1), dp shardings with FSDP2's gradient sync where
    it is a choice (zero2 and fsdp with several micro-batches and no pp), recomputation."""
    base = replace(spec.plan, layout=(), stages=(), tp=(), ep=(), spans=())
    world, gb = base.world_size, base.global_batch
    moe = any(isinstance(x, S.MoE) for x in S.walk(spec.model.layers))
    reps = [x for x in spec.model.layers if isinstance(x, S.Repeat)]
    blocks = int(spec.value(reps[0].count)) if len(reps) == 1 else 1
    for tp in _divisors(world):
        for pp in _divisors(world // tp):
            for cp in _divisors(world // (tp * pp)):
                for ep in (_divisors(world // (tp * pp * cp)) if moe else [1]):
                    dp = world // (tp * pp * cp * ep)
                    sizes = {"pp": pp, "dp": dp, "cp": cp, "ep": ep, "tp": tp}
                    axes = tuple((a, sizes[a]) for a in ("pp", "dp", "cp", "ep", "tp") if sizes[a] > 1 or a == "dp")
                    scheds = [("1f1b", 1)] if pp == 1 else [
                        (s, v) for s in SCHEDULES for v in (range(2, blocks + 1) if s == "interleaved-1f1b" else [1])]
                    for m in range(1, gb + 1):
                        if gb % (dp * ep * m):
                            continue
                        for sched, v, sp, mode, sync, rc, cpv in _settings(scheds, tp, m, pp, cp):
                            yield replace(base, axes=axes, micro_batches=m, schedule=sched, virtual_stages=v,
                                          sequence_parallel=sp, data_parallel=mode, fsdp_grad_sync=sync,
                                          recompute=rc, context_parallel=cpv)


def _settings(scheds, tp: int, m: int, pp: int, cp: int):
    for sched, v in scheds:
        for sp in ([False, True] if tp > 1 else [False]):
            for mode in DP_MODES:
                syncs = ("step", "micro_batch") if mode in ("zero2", "fsdp") and m > 1 and pp == 1 else ("step",)
                for sync in syncs:
                    for rc in RECOMPUTE:
                        for cpv in (CONTEXT_PARALLEL if cp > 1 else ("all_gather",)):
                            yield sched, v, sp, mode, sync, rc, cpv


def cost_all(spec: S.Spec) -> tuple[dict, int]:
    """Every candidate of the space that the rules accept and that fits the device, costed: {candidate as the
    space gives it: (decided plan, exact step time)}, and the size of the space."""
    cands = Candidates(spec)
    sim = Simulator(spec.cluster)
    limit = spec.cluster.device.memory_gb * 1e9
    out: dict = {}
    n = 0
    for plan in space(spec):
        n += 1
        legal = _legal(cands, plan)
        if legal is None:
            continue
        decided = cands.decide(legal)
        est = cands.estimate(decided)
        out[plan] = None if est.peak_bytes > limit else (
            decided, sim.predict(cands.cost_model(decided), decided, est, detail=False).step_time_s)
    return out, n


def rank(costed: dict, top: int, keep=lambda plan: True) -> list:
    """The search's promise over `costed`'s fitting candidates that `keep` keeps: the best plan of each mesh shape,
    the `top` fastest shapes, as (axes, step time, every decided plan at that time: a tie may be any of them)."""
    best: dict = {}
    for plan, got in costed.items():
        if got is None or not keep(plan):
            continue
        decided, t = got
        old = best.get(plan.axes)
        if old is None or t < old[0]:
            best[plan.axes] = (t, [decided])
        elif t == old[0]:
            old[1].append(decided)
    ranked = sorted(best.items(), key=lambda kv: kv[1][0])[:top]
    return [(axes, t, plans) for axes, (t, plans) in ranked]


def under_rule_2(costed: dict):
    """Rule 2 of the search restated (sequence parallelism dominates: with tp > 1, a candidate without it only
    where the rules refuse it), as a filter over the costed space. The search documents that this rule may miss
    on tiny CPU models, where sequence parallelism's extra all-reduce outweighs the norms' compute it saves."""
    return lambda plan: (plan.sequence_parallel or plan.size("tp") == 1
                         or replace(plan, sequence_parallel=True) not in costed)


def _differences(result, oracle) -> list:
    """What differs between the search's winners and the oracle's ranking, one line each (empty: the same)."""
    out = []
    got = [(w.plan.axes, w.prediction.step_time_s, w.plan) for w in result.winners]
    if [g[0] for g in got] != [o[0] for o in oracle]:
        out.append(f"layouts: search {[dict(g[0]) for g in got]} != oracle {[dict(o[0]) for o in oracle]}")
    for (axes, t, plan), (o_axes, o_t, o_plans) in zip(got, oracle):
        if axes != o_axes:
            continue
        if t != o_t:
            out.append(f"{dict(axes)}: search {t:.9g} s ({plan.describe()}) != oracle {o_t:.9g} s "
                       f"({o_plans[0].describe()})")
        elif plan not in o_plans:
            out.append(f"{dict(axes)}: search's plan {plan.describe()} is not among the oracle's at {t:.9g} s: "
                       + "; ".join(p.describe() for p in o_plans))
    return out


# Samples whose whole space costs in seconds: 8 devices over 4 blocks (every axis and schedule), 4 over 2, and a
# model with `moe` layers (ep) on 2.
SAMPLES = ("samples/gpt_3d.scale", "samples/gpt_2d.scale", "samples/moe_gpt.scale")

# Where the search's top-K is not the oracle's over the whole space, the difference (a finding, kept visible): rule 2
# (sequence parallelism dominates) drops the faster plan without sequence parallelism on these tiny CPU models,
# as its "may miss" says; `--fix sequence_parallel=false` finds it. The other rules hold (the test under rule 2).
WHOLE_SPACE_DIFFERS = {
    # (gpt_3d and gpt_2d differed so too until cp joined the space: their top shapes are now cp plans, which rule 2
    # does not touch; `moe` layers take sequence parallelism since each gathers its sequence over tp)
    "samples/moe_gpt.scale":
        "rule 2 misses: {'dp': 1, 'tp': 2}: search 0.0260453483 s (dp=1 × tp=2 (1 micro-batch, ddp, sequence "
        "parallel)) != oracle 0.0248162283 s (dp=1 × tp=2 (1 micro-batch, ddp))",
}


@pytest.fixture(scope="module")
def costed():
    """Each sample's spec, costed space and search result, shared by the two comparisons (the costing is most of
    this file's time)."""
    cache: dict = {}

    def get(path):
        if path not in cache:
            spec = check_path(path)
            table, n = cost_all(spec)
            cache[path] = (spec, table, n, SE.search(spec, top=TOP))
        return cache[path]
    return get


def _whole_space_case(path: str):
    if path not in WHOLE_SPACE_DIFFERS:
        return path
    return pytest.param(path, marks=pytest.mark.xfail(strict=True, raises=AssertionError,
                                                      reason=WHOLE_SPACE_DIFFERS[path]))


def _enough(path: str, table: dict, n: int) -> None:
    fit = sum(got is not None for got in table.values())
    assert fit >= TOP, f"{path}: only {fit} of {n} candidates fit; the comparison would say little"


@pytest.mark.parametrize("path", [_whole_space_case(p) for p in SAMPLES])
def test_search_top_k_is_the_brute_force_top_k(path, costed):
    """Over the whole space: every pruning rule, the documented unsafe ones included."""
    spec, table, n, result = costed(path)
    _enough(path, table, n)
    assert _differences(result, rank(table, TOP)) == []


@pytest.mark.parametrize("path", SAMPLES)
def test_search_top_k_is_the_brute_force_top_k_under_rule_2(path, costed):
    """Over the space narrowed by rule 2 alone (the one rule that says it may miss on models this small): what is
    left is pruned by the rules the search argues safe, and by 7 and 8, which may miss only on a memory model
    unlike ours."""
    spec, table, n, result = costed(path)
    _enough(path, table, n)
    assert _differences(result, rank(table, TOP, under_rule_2(table))) == []


def _key_best(table: dict, key, keep) -> float | None:
    """The oracle's least step time over the fitting candidates of a report key ((axis, size), ("schedule", name),
    ("context_parallel", variant)) that `keep` keeps, or None."""
    a, v = key
    times = [got[1] for plan, got in table.items() if got is not None and keep(plan) and (
        plan.size(a) == v if a in P.AXES else
        plan.size("pp") > 1 and plan.schedule == v if a == "schedule" else
        plan.size("cp") > 1 and plan.context_parallel == v)]
    return min(times, default=None)


@pytest.mark.parametrize("path", SAMPLES)
def test_each_rejected_keys_figure_is_what_the_oracle_allows(path, costed):
    """The report's line per rejected key (compiler/search/report.py `rejected`) claims no more than the search
    proved: "its best" is the oracle's best of that key where the line says so, and every "at least" is at most
    the oracle's best (the bound below what the search left unsimulated). Over the space narrowed by rule 2."""
    spec, table, n, _ = costed(path)
    s = SE.Search(spec, TOP, {})
    result = s.run()
    best_t = result.winners[0].prediction.step_time_s
    narrowed = under_rule_2(table)
    # the search's plans leave its headroom free (W0502's margin); the oracle's fit the whole device
    within = {plan for plan, got in table.items()
              if got is not None and s.cands.estimate(got[0]).peak_bytes <= s.limit}
    keep = lambda plan: narrowed(plan) and plan in within  # noqa: E731
    claims = 0
    for key, st in s.stats.items():
        oracle = _key_best(table, key, keep)
        if st["best_exact"] is not None:
            t = st["best_exact"][0]
            if st["left"] is not None and st["left"] < t:
                assert oracle is not None and st["left"] <= oracle * (1 + 1e-12) and oracle <= t, (key, st, oracle)
            else:
                assert oracle == pytest.approx(t, rel=1e-12), (key, t, oracle)
            claims += 1
        elif st["costed"] and not st["fit"]:
            assert oracle is None, (key, "does not fit", oracle)  # the report's "does not fit"
            claims += 1
        elif st["best_bound"] is not None and oracle is not None:
            assert st["best_bound"] <= oracle * (1 + 1e-12), (key, st["best_bound"], oracle)
            claims += 1
    assert claims >= 5 and best_t > 0
