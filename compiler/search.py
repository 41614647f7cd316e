"""`scalec search`: the fastest plans for a file's model on its cluster, by predicted step time, with reasons.

What is fixed and what is free. The model and the `train` section (global batch, sequence length, precision) are
fixed; so is the cluster: the mesh block's `nodes`, `devices_per_node`, `device` and its figures. Everything else
is free: the axis sizes dp, tp, pp and (for a model with `moe` layers) ep, the pipeline schedule and its virtual
stages, the micro-batch size and count, sequence parallelism, recomputation and the dp sharding (ddp, zero1, zero2,
fsdp; for zero2 and fsdp with several micro-batches and no pp, also when FSDP2 reduce-scatters: `fsdp_grad_sync`).
The file's own axes and plan settings are NOT constraints: the file is read by `check_path(cluster_only=True)`, so
its mesh may give only the cluster and its plan section may be absent or refused by the rules (only what no plan can
change is an error); `--fix KEY=VALUE` says what is fixed (`fixed` here).
`tp_layers` and `pad_vocab` are the file's, except that a tp degree the vocabulary refuses only for want of padding
(E0403 alone) is tried with `pad_vocab = true`.

Candidates. The mesh is laid out pp, dp, ep, tp, outermost first (Megatron's order: tp on neighbouring devices of
a node, pp outermost); an axis of size 1 is left out, except dp. A *family* is a mesh shape with its sequence
parallelism, micro-batch size and schedule (with its virtual stages); its *variants* are its dp shardings and
recomputations. Every candidate is checked by the rules (compiler/rules.py, through `Candidates.requires`: the one
copy of every divisibility and legality rule; nothing here restates one), costed by the memory model
(`Estimate.peak_bytes` against the device, as `compile`'s E0501) and timed by compiler/simulate.py.

Pruning, in order, each with why it is safe or what it may miss:

1. Rules. A candidate a rule refuses is never costed. Safe: `compile` would refuse it too.
2. Sequence parallelism dominates. With tp > 1, sequence parallelism moves the same bytes (a reduce-scatter and an
   all-gather in place of each all-reduce: the same ring steps and bytes), shards the norms' and residuals'
   compute and activations over tp, and adds one small all-reduce of the norm gradients per step. The search tries
   it alone where a rule allows it (not with `moe` layers, E0707; not when tp does not divide the sequence) and
   without it otherwise or when fixed. May miss: a model so small that that step's all-reduce costs more than the
   norms' compute it saves (tiny CPU models: tests/test_search_oracle.py finds such plans 1-3% faster on two of its
   three samples); and under selective recomputation, which gathers each region's sequence-parallel input again
   in backward (runtime.recompute: one all-gather more per region), a plan whose memory does not need sequence
   parallelism's sharded activations. `--fix sequence_parallel=false` costs that side.
3. Data parallelism of size 1. With dp = 1 the ZeRO stages shard nothing: only ddp is tried. Safe.
4. Branch and bound over families. A family's lower bound is, over the pp ranks, each rank's compute time (its
   collectives on the critical path included) without recomputation, what compiler/simulate.py's
   `predict(exact=False)` counts before any schedule idle time, data-parallel traffic and optimizer, plus the
   pipeline's fill and drain around it: rank r cannot start before the earlier stages' forwards of the first
   micro-batch, and after its backward of the last micro-batch the earlier stages still run
   theirs (not counted under zero-bubble, whose weight halves may come last). None of it depends on the dp
   sharding, and recomputation only adds to it. Families are visited by increasing bound; the search stops when the next
   bound reaches the K-th best exact step time. Safe: no candidate of a skipped family can be faster.
5. Recomputation escalates: none, then selective, then full, keeping the first that fits. Safe: each adds work
   (compiler/simulate.py adds recomputation's forward, selective a part of it), so the first that fits is the
   fastest of the three. Each dp sharding is tried (ZeRO's stages change the optimizer's and dp's time both ways).
6. Bound, then exact. A fitting variant's `predict(exact=False)` (a lower bound of its step time) is compared with
   the K-th best (or its layout's own entry) before the schedule is simulated exactly. Safe.
7. The most frugal variant first. A family's variant with the most dp sharding and the most recomputation a rule
   allows is costed first; when it does not fit, the family is dropped (and, per dp sharding, the sharding with
   its most recomputation). May miss: a variant the memory model puts below that one (ZeRO-3 and full
   recomputation keep the least of every kind of state; their working sets, a gathered unit or the block being
   recomputed, are small beside what they save).
8. Memory grows with the micro-batch size. Within a group (a family without its micro-batch size), the family of
   the smallest micro-batches is costed first; when its most frugal variant does not fit, no other does: what a
   micro-batch keeps grows with its size, and the micro-batches a schedule keeps in flight do not grow when they
   are fewer (GPipe keeps all of them: the same sequences), nor do the receive buffers and kept outputs (those
   of the micro-batches in flight).
   Without pp, a step of one micro-batch holds no accumulated gradient at its peak: that family is a group of
   its own. May miss: a layout where the memory model's in-flight count falls faster than the micro-batch grows.
Not pruned: every schedule is a family of its own (GPipe, 1F1B, zero-bubble, interleaved at each virtual-stage
count), and so is every micro-batch size.

Winners are distinct layouts: the best plan of each of the K best mesh shapes (axis sizes); with every axis fixed,
the K best plans of that shape. `Result.rejected` gives one line per axis value, and per schedule, that is not
among the winners, with its figures: what refused it, what it would need in memory, or how much slower it is
(exactly, when simulated; as a lower bound, when pruned).
"""
from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace

from compiler import plan as P
from compiler import spec as S
from compiler.report.units import nbytes, seconds
from runtime import choices  # torch-free

# Keys `--fix` accepts, with their type; the values a choice takes come from the checker's own tables.
FIX_KEYS = ("dp", "tp", "pp", "ep", "virtual_stages", "micro_batches", "micro_batch_size", "schedule",
            "sequence_parallel", "recompute", "data_parallel", "fsdp_grad_sync")
SCHEDULES = ("1f1b", "interleaved-1f1b", "zero-bubble", "gpipe")
DP_MODES = choices.DATA_PARALLEL
GRAD_SYNCS = ("step", "micro_batch")  # fsdp_grad_sync: when FSDP2 (zero2, fsdp) reduce-scatters, without pp
RECOMPUTE = choices.RECOMPUTE
ORDER = ("pp", "dp", "ep", "tp")  # the mesh's axes, outermost first


class FixError(ValueError):
    """A `--fix` that cannot be read: the CLI prints it as a usage error."""


def parse_fixes(items) -> dict:
    """`["tp=8", "schedule=1f1b", ...]` -> {"tp": 8, "schedule": "1f1b"}; FixError on an unknown key or value."""
    out: dict = {}
    for item in items or ():
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip().strip('"')
        if not eq or key not in FIX_KEYS:
            raise FixError(f"--fix {item!r}: expected KEY=VALUE with KEY one of {', '.join(FIX_KEYS)}")
        if key in ("dp", "tp", "pp", "ep", "virtual_stages", "micro_batches", "micro_batch_size"):
            if not value.isdigit() or int(value) < 1:
                raise FixError(f"--fix {item!r}: {key} takes a positive integer")
            out[key] = int(value)
        elif key == "sequence_parallel":
            if value not in ("true", "false"):
                raise FixError(f"--fix {item!r}: sequence_parallel takes true or false")
            out[key] = value == "true"
        else:
            choices = {"schedule": SCHEDULES, "recompute": RECOMPUTE, "data_parallel": DP_MODES,
                       "fsdp_grad_sync": GRAD_SYNCS}[key]
            if value not in choices:
                raise FixError(f"--fix {item!r}: {key} takes one of {', '.join(choices)}")
            out[key] = value
    return out


# -- results --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Winner:
    plan: P.Plan            # decided (stage layout, tp and ep decisions)
    prediction: object      # simulate.Prediction (exact)
    estimate: object        # cost.Estimate (pp rank 0; `.memory` every rank kind)
    reasons: tuple          # one short line each, from the figures

    @property
    def peak_bytes(self) -> float:
        return self.estimate.peak_bytes


@dataclass
class Counts:
    space: int = 0          # candidates the enumeration describes (families × dp shardings × recomputations)
    families: int = 0       # families enumerated (shape, sequence parallelism, micro-batch size, schedule)
    family_rules: int = 0   # of which refused by a rule before costing
    bounded_families: int = 0   # of which given a lower bound
    expanded: int = 0       # families whose variants were costed (the others pruned by their bound)
    checked: int = 0        # variants checked by the rules
    passed: int = 0         # of which the rules accepted
    costed: int = 0         # of which memory was estimated
    fitting: int = 0        # of which fit the device
    bounded: int = 0        # of which got a step-time lower bound
    exact: int = 0          # of which were simulated exactly
    structures: int = 0     # pass structures traced and compiled (compiler/candidates.py)

    def as_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Result:
    spec: S.Spec
    winners: list
    rejected: list          # one line per rejected family
    counts: Counts
    seconds: float
    fixed: dict
    timing: dict = field(default_factory=dict)   # phase -> seconds


# -- the search -----------------------------------------------------------------------------------------------


def _divisors(n: int) -> list:
    return [d for d in range(1, n + 1) if n % d == 0]


def _group(plan) -> tuple:
    """What a family is without its micro-batch size."""
    # without pp a step of one micro-batch holds no accumulated gradient at its peak: a group of its own
    return (plan.axes, plan.schedule, plan.virtual_stages, plan.sequence_parallel, plan.pad_vocab,
            plan.size("pp") == 1 and plan.micro_batches == 1)


def _variant(plan) -> tuple:
    """(data_parallel, fsdp_grad_sync) of a plan, as _Search.modes names its dp variants."""
    return (plan.data_parallel, plan.fsdp_grad_sync)


def _family(plan) -> tuple:
    return (plan.axes, plan.micro_batches, plan.schedule, plan.virtual_stages, plan.sequence_parallel)


def _axes(sizes: dict) -> tuple:
    return tuple((a, sizes[a]) for a in ORDER if sizes.get(a, 1) > 1 or a == "dp")


class _Search:
    def __init__(self, spec: S.Spec, top: int, fixed: dict, cands=None):
        from compiler.candidates import Candidates
        from compiler.simulate import Simulator
        self.spec, self.top, self.fixed = spec, top, dict(fixed)
        self.base = replace(P.from_spec(spec), layout=(), stages=(), tp=(), ep=(), spans=())
        self.world = self.base.world_size
        self.device = spec.mesh.device
        self.limit = self.device.memory_gb * 1e9
        self.moe = any(isinstance(x, S.MoE) for x in S.walk(spec.model.layers))
        reps = [x for x in spec.model.layers if isinstance(x, S.Repeat)]
        self.blocks = int(spec.value(reps[0].count)) if len(reps) == 1 else 1
        self.cands = cands or Candidates(spec)
        self.sim = Simulator(self.device)
        self.counts = Counts()
        self._pieces: dict = {}
        self.group_rep: dict = {}     # group -> its legal family of the most micro-batches (the smallest)
        self.group_fits: dict = {}    # group -> whether that family's most frugal variant fits
        self.group_fails: dict = {}   # group -> the smallest micro-batch size whose most frugal variant did not fit
        self.family_log: dict = {}    # family -> [(dp sharding, recompute, peak, exact step time or None)]
        self.peaks: dict = {}         # family -> {(dp variant, recompute): peak} of every variant costed
        # per family key (axis, value) -> what happened to its candidates
        self.stats: dict = {}
        self.best: list = []          # heap of (-time, key, Winner): the K best distinct layouts
        self.by_key: dict = {}        # layout key -> (time, Winner)
        self.all_axes_fixed = all(a in fixed for a in ORDER if a != "ep" or self.moe)

    # -- enumeration ---------------------------------------------------------------------------------------------

    def shapes(self):
        """Every (pp, dp, ep, tp) of the world size, respecting `--fix`."""
        f = self.fixed
        eps = _divisors(self.world) if self.moe else [1]
        for tp in _divisors(self.world):
            for pp in _divisors(self.world // tp):
                for ep in eps:
                    if (self.world // (tp * pp)) % ep:
                        continue
                    dp = self.world // (tp * pp * ep)
                    sizes = {"pp": pp, "dp": dp, "ep": ep, "tp": tp}
                    if any(a in f and f[a] != n for a, n in sizes.items()):
                        continue
                    yield sizes

    def groups(self, sizes: dict):
        """The families of one mesh shape, grouped by what the micro-batch size does not change: for each schedule
        (with its virtual stages) and sequence parallelism, (a plan maker, the micro-batch counts)."""
        f = self.fixed
        pp, dp, ep, tp = sizes["pp"], sizes["dp"], sizes["ep"], sizes["tp"]
        per_rank = self.base.global_batch // (dp * ep) if self.base.global_batch % (dp * ep) == 0 else 0
        sps = [f["sequence_parallel"]] if "sequence_parallel" in f else ([True, False] if tp > 1 else [False])
        ms = []
        for b in (_divisors(per_rank) if per_rank else [1]):
            m = per_rank // b if per_rank else 1
            if f.get("micro_batch_size", b) == b and f.get("micro_batches", m) == m:
                ms.append(m)
        if pp == 1:
            scheds = [("1f1b", 1)]
        else:
            scheds = [("1f1b", 1), ("zero-bubble", 1)]
            scheds += [("interleaved-1f1b", v) for v in range(2, self.blocks // pp + 1)]
            scheds += [("gpipe", 1)]
        axes = _axes(sizes)
        for sched, v in scheds:
            if pp > 1 and "schedule" in f and f["schedule"] != sched:
                continue
            if f.get("virtual_stages", v) != v:
                continue
            for sp in sps:
                def make(m, sched=sched, v=v, sp=sp):
                    return replace(self.base, axes=axes, micro_batches=m, schedule=sched, virtual_stages=v,
                                   sequence_parallel=sp, recompute=f.get("recompute", "none"),
                                   data_parallel=f.get("data_parallel", "ddp"),
                                   fsdp_grad_sync=f.get("fsdp_grad_sync", "step"))
                if ms:
                    yield make, ms

    def families(self, sizes: dict) -> list:
        """Every family of one mesh shape (plans with recompute none and ddp, or the fixed ones)."""
        return [make(m) for make, ms in self.groups(sizes) for m in ms]

    # -- bookkeeping of families for the report ------------------------------------------------------------------

    def _stat(self, plan):
        keys = [(a, plan.size(a)) for a in ("tp", "pp", "ep") if a != "ep" or self.moe]
        if plan.size("pp") > 1:
            keys.append(("schedule", plan.schedule))
        return [self.stats.setdefault(k, {"refused": Counter(), "passed": 0, "costed": 0, "fit": 0,
                                          "min_peak": None, "best_exact": None, "best_bound": None})
                for k in keys]

    def _refused(self, plan, problems, times: int = 1):
        """Count each refusal against the family it belongs to: a tensor-parallel code against the tp value, a
        pipeline code against pp and the schedule, an expert code against ep, any other against all."""
        own = {"tp": "E04", "pp": "E06", "schedule": "E06", "ep": "E07"}
        stats = self._stat(plan)
        keys = [(a, plan.size(a)) for a in ("tp", "pp", "ep") if a != "ep" or self.moe]
        if plan.size("pp") > 1:
            keys.append(("schedule", plan.schedule))
        for (a, _), st in zip(keys, stats):
            mine = [d for d in problems if d.code.startswith(own[a]) or d.code[:3] not in own.values()]
            for d in mine[:1] or problems[:1]:
                st["refused"][(d.code, d.brief or d.message, bool(mine))] += times

    # -- rules, with the vocabulary padded where that alone is what a rule wants -------------------------------

    def _legal(self, plan):
        problems = self.cands.requires(plan)
        if problems and not plan.pad_vocab and all(d.code == "E0403" for d in problems):
            padded = replace(plan, pad_vocab=True)
            if not self.cands.requires(padded):
                return padded, []
        return plan, problems

    def _family_legal(self, plan, memo):
        """`_legal`, remembering refusals that hold for every family sharing what the refusing rule reads: a
        tensor-parallel code (E04xx: tp, sequence parallelism, tp_layers, pad_vocab, seq_len), a pipeline code
        that does not read the micro-batches (E0601, E0604, E0605: pp, schedule, virtual stages), an expert code
        (E07xx: ep, dp, sequence parallelism, data_parallel). The rules themselves are only ever called."""
        keys = {"E04": (plan.size("tp"), plan.sequence_parallel, plan.pad_vocab),
                "E06": (plan.size("pp"), plan.schedule, plan.virtual_stages),
                "E07": (plan.size("ep"), plan.size("dp") > 1, plan.sequence_parallel, plan.data_parallel)}
        for prefix, k in keys.items():
            got = memo.get((prefix, k))
            if got is not None:
                return plan, got
        plan, problems = self._legal(plan)
        for d in problems:
            prefix = d.code[:3]
            if prefix in ("E04", "E07") or d.code in ("E0601", "E0604", "E0605"):
                memo.setdefault((prefix, keys[prefix]), []).append(d)
        return plan, problems

    # -- the lower bound of a family -------------------------------------------------------------------------

    def busy(self, decided, fill: bool = False) -> float:
        """The busiest rank's compute time of `decided` (collectives on its critical path included), before any
        schedule idle time, data-parallel traffic and optimizer: what compiler/simulate.py's `predict` counts as
        each rank's `compute_s` with `exact=False` (tests/test_search.py holds the two equal). With `fill`, under
        pp, each rank's busy time plus the pipeline's fill before its first action and drain after its last,
        which no schedule avoids (the data dependencies alone): still a lower bound of the exact step time."""
        from compiler.simulate import links
        cm = self.cands.cost_model(decided)
        sizes = tuple(decided.size(a) for a in ("dp", "tp", "ep", "pp"))
        env = sizes + (decided.micro_batch_size,)
        key = (id(cm), env, decided.recompute, decided.schedule == "zero-bubble")
        pieces = self._pieces.get(key)
        if pieces is None:
            pieces = self._pieces[key] = self.sim.pieces(cm, decided, env, links(decided, self.device))
        m = decided.micro_batches
        if cm.piped:
            pp = decided.size("pp")
            fwd, bwd, _, _ = self.sim.stage_times(cm, decided, env, pieces)
            busy = [m * (sum(fwd[r::pp]) + sum(bwd[r::pp])) for r in range(pp)]
            if not fill:
                return max(busy)
            # Rank r starts with stage r's forward of the first micro-batch, which needs every earlier stage's
            # forward of it first; it ends with stage r's backward of the last micro-batch, after which every
            # earlier stage still runs its own (not under zero-bubble, whose weight halves may come last).
            drain = decided.schedule != "zero-bubble"
            return max(busy[r] + sum(fwd[:r]) + (sum(bwd[:r]) if drain else 0.0) for r in range(pp))
        counts = {("block", name): c for name, (_, c) in cm.counts.items()}
        return m * sum((p.forward + p.backward) * counts.get(k, 1) for k, p in pieces.items())

    # -- ranking -------------------------------------------------------------------------------------------------

    def _key(self, plan):
        if self.all_axes_fixed:
            return (plan.axes, plan.micro_batch_size, plan.schedule, plan.virtual_stages, plan.data_parallel,
                    plan.recompute, plan.sequence_parallel, _variant(plan)[1])
        return plan.axes

    def threshold(self, key=None) -> float:
        t = -self.best[0][0] if len(self.best) >= self.top else math.inf
        if key is not None and key in self.by_key:
            t = min(t, self.by_key[key][0])
        return t

    def _offer(self, t, key, winner):
        old = self.by_key.get(key)
        if old is not None:
            if t >= old[0]:
                return
            self.best = [x for x in self.best if x[1] != key]
            heapq.heapify(self.best)
        self.by_key[key] = (t, winner)
        heapq.heappush(self.best, (-t, key, winner))
        while len(self.best) > self.top:
            _, k, _ = heapq.heappop(self.best)
            self.by_key.pop(k, None)

    # -- one family ----------------------------------------------------------------------------------------------

    def _cost(self, plan0, mode, rc, cache):
        """(decided, estimate) of one variant, or None when a rule refuses it; memoised per family."""
        if (mode, rc) in cache:
            return cache[(mode, rc)]
        plan = replace(plan0, data_parallel=mode[0], fsdp_grad_sync=mode[1], recompute=rc)
        self.counts.checked += 1
        plan, problems = self._legal(plan)
        if problems:
            self._refused(plan, problems)
            cache[(mode, rc)] = None
            return None
        self.counts.passed += 1
        stats = self._stat(plan)
        decided = self.cands.decide(plan)
        est = self.cands.estimate(decided)
        self.counts.costed += 1
        peak = est.peak_bytes
        self.peaks.setdefault(_family(plan), {})[(mode, rc)] = peak
        worst = max(est.memory, key=lambda r: r.peak)
        for st in stats:
            st["passed"] += 1
            st["costed"] += 1
            if st["min_peak"] is None or peak < st["min_peak"][0]:
                st["min_peak"] = (peak, worst.who, decided.describe())
        if peak <= self.limit:
            self.counts.fitting += 1
            for st in stats:
                st["fit"] += 1
        cache[(mode, rc)] = (decided, est)
        return cache[(mode, rc)]

    def modes(self, plan) -> list:
        """The dp variants of a family, least sharded first (the last is the most frugal, rule 7): (data_parallel,
        fsdp_grad_sync), each dp sharding (only ddp with dp = 1), FSDP2's (zero2, fsdp) with its gradients
        reduce-scattered once per step and, where that is a choice (several micro-batches, no pp), every
        micro-batch (sharded between micro-batches: less memory, m× the reduce-scatters), unless fixed."""
        f = self.fixed
        kinds = [f["data_parallel"]] if "data_parallel" in f else (list(DP_MODES) if plan.size("dp") > 1 else ["ddp"])
        out = []
        for kind in kinds:
            syncs = [f.get("fsdp_grad_sync", "step")]
            if ("fsdp_grad_sync" not in f and kind in ("zero2", "fsdp") and plan.size("dp") > 1
                    and plan.micro_batches > 1 and plan.size("pp") == 1):
                syncs = list(GRAD_SYNCS)
            out += [(kind, s) for s in syncs]
        return out

    def expand(self, plan0, lb, log):
        f = self.fixed
        dp = plan0.size("dp")
        modes = self.modes(plan0)
        rcs = [f["recompute"]] if "recompute" in f else list(RECOMPUTE)
        key = self._key(plan0)
        tried = self.family_log.setdefault(_family(plan0), [])
        cache: dict = {}
        fits = lambda got: got is not None and got[1].peak_bytes <= self.limit  # noqa: E731
        # rule 8: the group's smallest micro-batches first; when its most frugal variant does not fit, no
        # micro-batch size of the group does
        g = _group(plan0)
        if plan0.micro_batch_size >= self.group_fails.get(g, math.inf):
            return tried  # rule 8: a smaller micro-batch of the group did not fit
        if g not in self.group_fits:
            rep = self.group_rep[g]
            if rep is plan0:
                self.group_fits[g] = True  # decided below, by the family itself
            else:
                rc = {}
                got = next((x for mode in reversed(self.modes(rep)) for r in reversed(rcs)
                            if (x := self._cost(rep, mode, r, rc)) is not None), None)
                self.group_fits[g] = fits(got)
        if not self.group_fits.get(g, True):
            return tried
        # rule 7: the family's most frugal variant (the last dp sharding, the most recomputation a rule allows)
        # first; when it does not fit, no variant does
        frugal = next((got for mode in reversed(modes) for rc in reversed(rcs)
                       if (got := self._cost(plan0, mode, rc, cache)) is not None), None)
        if frugal is None or not fits(frugal):
            self.group_fails[g] = min(self.group_fails.get(g, math.inf), plan0.micro_batch_size)
            if self.group_rep.get(g) is plan0:
                self.group_fits[g] = False
            return tried
        rc_bound = {}
        for mode in modes:
            # rule 7 again, per dp sharding: with its most recomputation it must fit
            most = next((got for rc in reversed(rcs) if (got := self._cost(plan0, mode, rc, cache)) is not None),
                        None)
            if not fits(most):
                continue
            for rc in rcs:
                if lb >= self.threshold(key):
                    return tried
                if rc not in rc_bound:  # recomputation's own lower bound (the family's, with its extra forward)
                    rc_bound[rc] = self.busy(self.cands.decide(replace(plan0, recompute=rc)), fill=True)
                if rc_bound[rc] >= self.threshold(key):
                    break  # more recomputation is only slower
                got = self._cost(plan0, mode, rc, cache)
                if got is None:
                    continue
                decided, est = got
                peak = est.peak_bytes
                if peak > self.limit:
                    tried.append((mode, rc, peak, None, None))
                    continue  # more recomputation may fit
                stats = self._stat(decided)
                cm = self.cands.cost_model(decided)
                bound = self.sim.predict(cm, decided, est, exact=False)
                self.counts.bounded += 1
                for st in stats:
                    if st["best_bound"] is None or bound.step_time_s < st["best_bound"]:
                        st["best_bound"] = bound.step_time_s
                if bound.step_time_s >= self.threshold(key):
                    tried.append((mode, rc, peak, None, bound.step_time_s))
                    break  # more recomputation is only slower
                pred = self.sim.predict(cm, decided, est, exact=True, detail=False)
                self.counts.exact += 1
                tried.append((mode, rc, peak, pred.step_time_s, bound.step_time_s))
                for st in stats:
                    if st["best_exact"] is None or pred.step_time_s < st["best_exact"][0]:
                        st["best_exact"] = (pred.step_time_s, decided.describe())
                log.append((decided, est, pred, plan0))
                self._offer(pred.step_time_s, key, (decided, est, pred))
                break  # the least recomputation that fits is the fastest
        return tried

    def run(self) -> Result:
        t0 = time.perf_counter()
        timing = {}
        groups = [g for sizes in self.shapes() for g in self.groups(sizes)]
        self.counts.families = sum(len(ms) for _, ms in groups)
        self.counts.space = sum(len(self.modes(make(m))) for make, ms in groups for m in ms) * (
            1 if "recompute" in self.fixed else len(RECOMPUTE))
        timing["enumerate"] = time.perf_counter() - t0
        # 1. rules and a lower bound per family
        t1 = time.perf_counter()
        bounded = []
        seen_structures = set()
        from compiler.candidates import structure
        memo: dict = {}
        whole = ("E04", "E07", "E0601", "E0604", "E0605")  # refusals the micro-batch count does not change
        for make, ms in groups:
            first, problems = self._family_legal(make(ms[0]), memo)
            if problems and any(d.code.startswith(whole) for d in problems):
                self.counts.family_rules += len(ms)
                self._refused(first, problems, len(ms))
                continue
            for m in ms:
                plan, problems = self._family_legal(make(m), memo) if m != ms[0] else (first, problems)
                if problems:
                    self.counts.family_rules += 1
                    self._refused(plan, problems)
                    continue
                if not plan.sequence_parallel and plan.size("tp") > 1 and "sequence_parallel" not in self.fixed:
                    # rule 2: without sequence parallelism only where a rule refuses it
                    twin = replace(plan, sequence_parallel=True)
                    if not self._family_legal(twin, memo)[1]:
                        continue
                decided = self.cands.decide(plan)
                seen_structures.add(structure(decided))
                lb = self.busy(decided, fill=True)
                self.group_rep.setdefault(_group(plan), plan)  # ms: most micro-batches first
                self.counts.bounded_families += 1
                bounded.append((lb, len(bounded), plan))
        self.counts.structures = len(seen_structures)
        timing["rules_and_family_bounds"] = time.perf_counter() - t1
        # 2. best first
        t2 = time.perf_counter()
        bounded.sort(key=lambda x: (x[0], x[1]))
        log: list = []
        for lb, _, plan in bounded:
            if lb >= self.threshold():
                for st in self._stat(plan):
                    if st["best_bound"] is None or lb < st["best_bound"]:
                        st["best_bound"] = lb
                continue
            self.counts.expanded += 1
            self.expand(plan, lb, log)
        timing["best_first"] = time.perf_counter() - t2
        ranked = sorted(((t, w) for t, w in self.by_key.values()), key=lambda x: x[0])
        best_t = ranked[0][0] if ranked else None
        # the winners again with every detail (the pipeline's exposed send time): the same step times
        ranked = [(t, (d, est, self.sim.predict(self.cands.cost_model(d), d, est))) for t, (d, est, _) in ranked]
        winners = [Winner(d, pred, est, tuple(self.reasons(d, est, pred, best_t))) for _, (d, est, pred) in ranked]
        rejected = self.rejected(winners, best_t) if groups else self.unsatisfiable()
        return Result(self.spec, winners, rejected, self.counts, time.perf_counter() - t0, self.fixed, timing)

    # -- reasons -------------------------------------------------------------------------------------------------

    def _families_with(self, fixed: dict) -> int:
        """How many families the enumeration gives with only `fixed` fixed."""
        saved, self.fixed = self.fixed, fixed
        try:
            return sum(len(ms) for sizes in self.shapes() for _, ms in self.groups(sizes))
        finally:
            self.fixed = saved

    def unsatisfiable(self) -> list:
        """Why `--fix` leaves not one candidate to check (the rules never saw one, so they give no reason): the
        fixed axes against the devices, ep on a model without `moe`, then each fixed setting that alone leaves
        none, or else the settings together. One line each, as `rejected` lines read."""
        f, out = self.fixed, []
        axes = {a: f[a] for a in ORDER if a in f}
        prod = math.prod(axes.values())
        m = self.spec.mesh
        if self.world % prod:
            shown = " × ".join(f"{a}={n}" for a, n in axes.items()) + (f" = {prod}" if len(axes) > 1 else "")
            out.append(f"{shown} does not divide the {self.world} devices ({m.nodes} node{'s' if m.nodes != 1 else ''}"
                       f" × {m.devices_per_node}): the axes multiply to the device count; sizes that divide it: "
                       + ", ".join(map(str, _divisors(self.world))))
        if f.get("ep", 1) > 1 and not self.moe:
            out.append(f"ep={f['ep']}: the model has no `moe` layer to shard over ep (E0704)")
        if out:
            return out
        gb, blocks = self.base.global_batch, self.blocks
        for key, value in f.items():
            if self._families_with({key: value}):
                continue
            if key in ("micro_batches", "micro_batch_size"):
                out.append(f"{key}={value}: no split of the global batch ({gb} sequences over dp × ep ranks, "
                           "micro_batches × micro_batch_size on each) has it")
            elif key == "virtual_stages":
                out.append(f"virtual_stages={value}: interleaving needs pp > 1 and pp × virtual_stages at most the "
                           f"{blocks} blocks")
            else:
                out.append(f"{key}={value}: no candidate on {self.world} devices has it")
        if not out:
            out.append("the fixed settings " + ", ".join(f"{k}={v}" for k, v in f.items()) + " exclude one "
                       "another: no candidate has them all (each alone leaves some)")
        return out

    def reasons(self, d, est, pred, best_t) -> list:
        from compiler.simulate import links
        lk = links(d, self.device)
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
            out.append(f"ep {ep} all-to-alls {where}: {seconds(pred.exposed_comm_s.get('ep', 0.0))} exposed")
        dpn = d.size("dp")
        if dpn > 1:
            dp_s = sum(t for a, t in pred.exposed_comm_s.items() if a in ("dp", "dp×ep"))
            out.append(f"dp {dpn} ({d.data_parallel}): {seconds(dp_s)} of its traffic exposed")
        tried = self.family_log.get(_family(d), [])
        peak = est.peak_bytes
        if d.recompute != "none":
            less = [p for mode, rc, p, _, _ in tried if mode == _variant(d) and rc != d.recompute
                    and RECOMPUTE.index(rc) < RECOMPUTE.index(d.recompute)]
            if less:
                out.append(f"{d.recompute} recompute: with less, {nbytes(min(less))} of {nbytes(self.limit)}")
        if d.data_parallel != "ddp":
            ddp = [(p, t, b) for mode, rc, p, t, b in tried if mode[0] == "ddp" and rc == d.recompute]
            if ddp:
                p, t, b = ddp[0]
                if p > self.limit:
                    out.append(f"{d.data_parallel}: ddp would need {nbytes(p)} ({d.recompute} recompute)")
                elif t is not None:
                    out.append(f"{d.data_parallel}: ddp {t / pred.step_time_s:.2f}× its step time")
                elif b is not None:
                    out.append(f"{d.data_parallel}: ddp at least {b / pred.step_time_s:.2f}× its step time")
        if d.data_parallel in ("zero2", "fsdp") and d.size("dp") > 1 and d.micro_batches > 1 and d.size("pp") == 1:
            # fsdp_grad_sync: the other choice of when the reduce-scatters run, as costed
            mine = _variant(d)
            other = [(p, t, b) for mode, rc, p, t, b in tried if mode[0] == mine[0] and mode != mine
                     and rc == d.recompute]
            what = ("reduce-scatter every micro-batch" if mine[1] == "micro_batch" else
                    "reduce-scatter once per step")
            costed = self.peaks.get(_family(d), {})
            if not other and any(m0 == mine[0] and m1 != mine[1] and rc == d.recompute for (m0, m1), rc in costed):
                other = [(p, None, None) for ((m0, m1), rc), p in costed.items()
                         if m0 == mine[0] and m1 != mine[1] and rc == d.recompute]
            if other:
                p, t, b = other[0]
                alt = "once per step" if mine[1] == "micro_batch" else "every micro-batch"
                if p > self.limit:
                    out.append(f"{what}: {alt} would need {nbytes(p)}")
                elif t is not None:
                    out.append(f"{what}: {alt} {nbytes(p)} at {t / pred.step_time_s:.2f}× its step time")
                elif b is not None:
                    out.append(f"{what}: {alt} at least {b / pred.step_time_s:.2f}× its step time")
        out.append(f"peak {nbytes(peak)} of {nbytes(self.limit)} "
                   f"({max(est.memory, key=lambda r: r.peak).who})")
        return out

    def rejected(self, winners, best_t) -> list:
        from compiler.simulate import links
        won = set()
        for w in winners:
            for a in ("tp", "pp", "ep"):
                won.add((a, w.plan.size(a)))
            if w.plan.size("pp") > 1:
                won.add(("schedule", w.plan.schedule))
        out = []
        refused: dict = {}  # (axis, code) -> [values], the message of the first: one line for many values
        for (a, n), st in sorted(self.stats.items(), key=lambda kv: (kv[0][0], str(kv[0][1]).zfill(8))):
            if (a, n) in won:
                continue
            name = f"{a} {n}" if a != "schedule" else n
            if not st["passed"] and st["refused"] and not st["costed"] and st["best_bound"] is None:
                code, msg = _why_refused(st)
                got = refused.setdefault((a, code), (len(out), [], msg))
                if not got[1]:
                    out.append(None)
                got[1].append(name)
                continue
            if st["costed"] and not st["fit"]:
                peak, who, what = st["min_peak"]
                out.append(f"{name} does not fit: {nbytes(peak, gigabytes=True)} of "
                           f"{nbytes(self.limit, gigabytes=True, unit=False)} on {who} "
                           f"(its least: {what})")
                continue
            why = ""
            if a == "tp" and n > 1:
                probe = replace(self.base, axes=(("dp", self.world // n), ("tp", n)))
                why = " crosses nodes:" if links(probe, self.device)["tp"].crosses_nodes else ""
            if st["best_exact"] is not None and best_t:
                t, what = st["best_exact"]
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


def _why_refused(st) -> str:
    """The most frequent refusal of a family, preferring its own axis's rules."""
    (code, msg, _), _ = max(st["refused"].items(), key=lambda kv: (kv[0][2], kv[1]))
    return code, msg


def search(spec: S.Spec, top: int = 5, fixed: dict | None = None, cands=None) -> Result:
    """The `top` fastest plans of `spec`'s model on its cluster (see the module's docstring)."""
    return _Search(spec, top, fixed or {}, cands).run()


# -- output ---------------------------------------------------------------------------------------------------


def _exposed(pred) -> str:
    items = [(a, t) for a, t in pred.exposed_comm_s.items() if t > 0]
    return ", ".join(f"{a} {seconds(t)}" for a, t in sorted(items, key=lambda x: -x[1])) or "none"


def text(result: Result) -> str:
    """The table `scalec search` prints: the winners with their reasons, the rejected families, the counts."""
    spec = result.spec
    m, dev = spec.mesh, spec.mesh.device
    lines = [f"search for `{spec.model.name}` ({spec.path}) on {m.world_size} {dev.kind} = {m.nodes} node"
             f"{'s' if m.nodes != 1 else ''} × {m.devices_per_node} ({dev.memory_gb:g} GB each)"
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
    """`scalec search --json` (keys described in the README)."""
    spec = result.spec
    return {
        "model": spec.model.name, "file": spec.path, "fixed": dict(result.fixed),
        "cluster": {"nodes": spec.mesh.nodes, "devices_per_node": spec.mesh.devices_per_node,
                    "device": spec.mesh.device.kind, "device_memory_bytes": int(spec.mesh.device.memory_gb * 1e9)},
        "winners": [{"rank": i, "plan": w.plan.to_json(), "describe": w.plan.describe(),
                     "predicted": w.prediction.as_json(), "peak_bytes": int(w.peak_bytes),
                     "memory": [r.as_json() for r in w.estimate.memory], "reasons": list(w.reasons)}
                    for i, w in enumerate(result.winners, 1)],
        "rejected": list(result.rejected),
        "counts": result.counts.as_json(),
        "seconds": result.seconds,
    }


def _offset(text_: str, line: int, col: int) -> int:
    starts = [0]
    for ln in text_.split("\n"):
        starts.append(starts[-1] + len(ln) + 1)
    return starts[line - 1] + col - 1


def _section_text(plan: P.Plan, kept: list) -> tuple:
    axes = "\n".join(f"  axis {a} = {n}" for a, n in plan.axes)
    mesh = (f"mesh {{\n{axes}\n  nodes = {plan.nodes}\n  devices_per_node = {plan.devices_per_node}\n"
            + "".join(f"  {k}\n" for k in kept) + "}")
    settings = [f"data_parallel = {plan.data_parallel}", f"micro_batches = {plan.micro_batches}"]
    if plan.size("pp") > 1:
        settings.append(f'schedule = "{plan.schedule}"')
        if plan.virtual_stages > 1:
            settings.append(f"virtual_stages = {plan.virtual_stages}")
    if plan.size("tp") > 1:
        settings.append(f"sequence_parallel = {'true' if plan.sequence_parallel else 'false'}")
    if tuple(plan.tp_layers) != ("attention", "mlp", "vocab"):
        settings.append(f"tp_layers = ({', '.join(plan.tp_layers)})")
    if plan.pad_vocab:
        settings.append("pad_vocab = true")
    settings.append(f"recompute = {plan.recompute}")
    if plan.grad_reduce != "fp32":  # the file's precision settings, kept
        settings.append(f"grad_reduce = {plan.grad_reduce}")
    if plan.fp32_residual:
        settings.append("fp32_residual = true")
    if plan.syncs_each_micro_batch:
        settings.append("fsdp_grad_sync = micro_batch")
    return mesh, "plan {\n" + "".join(f"  {s}\n" for s in settings) + "}"


def scale_text(spec: S.Spec, winner: Winner) -> str:
    """The winner as a complete .scale file: the user's text of every other section exactly as written, the mesh
    and plan sections replaced (the mesh's device and its figures kept as written), a comment header first."""
    from compiler import ast
    from compiler.parse import parse
    source = spec.source
    tree = parse(source, spec.path)
    by_kind = {sec.kind.id: sec for sec in tree.sections}
    mesh_sec = by_kind["mesh"]
    kept = []
    for st in mesh_sec.body:
        if isinstance(st, ast.Assign) and st.key.id not in ("nodes", "devices_per_node"):
            a, b = _offset(source, st.span.line, st.span.col), _offset(source, st.span.end_line, st.span.end_col)
            kept.append(source[a:b])
    mesh, plan = _section_text(winner.plan, kept)
    edits = [(mesh_sec.span, mesh)]
    if "plan" in by_kind:
        edits.append((by_kind["plan"].span, plan))
    out = source
    for span, new in sorted(edits, key=lambda e: (e[0].line, e[0].col), reverse=True):
        a, b = _offset(out, span.line, span.col), _offset(out, span.end_line, span.end_col)
        out = out[:a] + new + out[b:]
    if "plan" not in by_kind:  # after the mesh section
        a = out.index(mesh) + len(mesh)
        out = out[:a] + "\n\n" + plan + out[a:]
    p = winner.prediction
    header = (f"# Written by `scalec search` from {spec.path}: its mesh and plan sections replaced by the fastest "
              f"plan found,\n# {winner.plan.describe()}:\n# predicted {seconds(p.step_time_s)} per step, "
              f"{p.tokens_per_s:,.0f} tokens/s, MFU {p.mfu:.1%}, "
              f"peak {nbytes(winner.peak_bytes, gigabytes=True)} per rank "
              f"(of {spec.mesh.device.memory_gb:g}).\n")
    return header + out
