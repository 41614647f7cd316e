"""The pruned best-first run of `scalec search`: over the space of compiler/search/space.py, the `top` fastest plans
by predicted step time, costing as few candidates as its rules allow; compiler/search/report.py words the result.

Pruning, in order, each with why it is safe or what it may miss:

1. Rules. A candidate a rule refuses is never costed. Safe: `compile` would refuse it too.
2. Sequence parallelism dominates. With tp > 1, sequence parallelism moves the same bytes (a reduce-scatter and an
   all-gather in place of each all-reduce: the same ring steps and bytes), shards the norms' and residuals'
   compute and activations over tp, and adds one small all-reduce of the norm gradients per step. The search tries
   it alone where a rule allows it (not when tp does not divide the sequence) and
   without it otherwise or when fixed. May miss: a model so small that that step's all-reduce costs more than the
   norms' compute it saves (tiny CPU models: tests/test_search_oracle.py finds such a plan 5% faster on
   moe_gpt's whole space); and under selective recomputation, which gathers each region's sequence-parallel input again
   in backward (runtime.recompute: one all-gather more per region), a plan whose memory does not need sequence
   parallelism's sharded activations. `--fix sequence_parallel=false` costs that side.
3. Data parallelism of size 1. With dp = 1 the ZeRO stages shard nothing: only ddp is tried. Safe.
4. Branch and bound over families. A family's lower bound is, over the pp ranks, each rank's compute time (its
   collectives on the critical path included) without recomputation, what compiler/cost/step_time.py's
   `predict(exact=False)` counts before any schedule idle time, data-parallel traffic and optimizer, plus the
   pipeline's fill and drain around it: rank r cannot start before the earlier stages' forwards of the first
   micro-batch, and after its backward of the last micro-batch the earlier stages still run
   theirs (not counted under zero-bubble and dualpipev, whose weight halves may come last); under dualpipev less
   what its overlapped pairs hide (the same as `predict`'s). None of it depends on the dp sharding, and
   recomputation only adds to it. Under pp, where the run tries no offload, each rank's pipeline end is followed
   by its once-per-step collectives (all exposed after the pipeline step), the optimizer's step and the runtime's
   cost (`predict`'s), so the bound adds the least of those over the ranks and the family's dp shardings
   (`Bounds.after_pipeline`; FSDP2 sharding the parameters left out where ZeRO-2 is tried: it moves the same
   and gathers 2m times more; the 175B sample's search expands 105 families with it, 1,943 without). That part
   reads the mesh, its stage layout and the dp shardings, not the micro-batches (but where FSDP2 gathers per
   micro-batch) nor which schedule of one layout style: computed once for the families that share it
   (`Bounds.after_key`). Families are visited by increasing bound; the search stops when the next bound reaches
   the K-th best exact step time. Safe: no candidate of a skipped family can be faster. The bound needs the
   family's stage layout; until a family is next in line a cheaper one stands for it (`cheap_bound`: under pp,
   its share of the whole model's time over the pp ranks, never above the bound; under dualpipev less the most its
   pairs could hide, the lesser of the model's ep and tp collectives and its other time), then, under pp, that
   plus what follows the pipeline, and only then the bound, so only the families visited, and those the report's
   bound per key needs, have their own `busy` computed.
5. Recomputation escalates: none, then selective, then full, keeping the first that fits. Safe: each adds work
   (compiler/cost/step_time.py adds recomputation's forward, selective a part of it), so the first that fits is the
   fastest of the three. Each dp sharding is tried (ZeRO's stages change the optimizer's and dp's time both ways).
6. Bound, then memory, then exact. Once the family's most frugal variant fits (rule 7), a variant's
   `predict(exact=False)` (a lower bound of its step time, from an estimate without the memory model: the
   step-time model reads none of it) is compared with the K-th best (or its layout's own entry) before its memory
   is costed and before the schedule is simulated exactly; per dp sharding the least recomputation in reach first
   (rule 5: the fastest), so a sharding whose bound reaches the threshold has no more of its memory costed. Safe.
7. The most frugal variant first. A family's variant with the most dp sharding and the most recomputation a rule
   allows is costed first; when it does not fit, the family is dropped (and, per dp sharding, the sharding with
   its most recomputation whose bound is still below the threshold: rule 6 never offers one beyond it). May miss:
   a variant the memory model puts below that one (ZeRO-3 and full
   recomputation keep the least of every kind of state; their working sets, a gathered unit or the block being
   recomputed, are small beside what they save).
8. Memory grows with the micro-batch size. Within a group (a family without its micro-batch size), the family of
   the smallest micro-batches is costed first; when its most frugal variant does not fit, no other does: what a
   micro-batch keeps grows with its size, and the micro-batches a schedule keeps in flight do not grow when they
   are fewer (GPipe keeps all of them: the same sequences), nor do the receive buffers and kept outputs (those
   of the micro-batches in flight).
   Without pp, a step of one micro-batch holds no accumulated gradient at its peak: that family is a group of
   its own. May miss: a layout where the memory model's in-flight count falls faster than the micro-batch grows.
9. Placement last. Where the cluster's network is described (a `topology` or `fabric`), each variant simulated
   exactly is simulated under the other placement too (the mesh's own order, or `placement = auto`) and the faster
   kept; the bounds before it read the family's own placement (auto where the file writes it, else the mesh
   order). May miss: a family whose bound under that placement reaches the threshold but that the other would
   make fast enough.
10. Offload last. Where a family's variants fit no other way (rules 7 and 8 drop it), its dp shardings are tried
   with offload (compiler/search/space.py `offloads`: optimizer offload at a growing fraction, FSDP2's parameter
   offload under fsdp, activations), the least offload and then the least recomputation that fits kept per
   sharding (`offloaded.py`). Only where `--fix offload=...` names a kind, or when no plan fits without offload
   (`search` then runs again with it): a cluster that fits the model pays nothing for it. May miss: a plan whose
   offload makes it faster than every plan that fits without (the host's step only adds time: none under these
   models but a larger micro-batch that fits only with it).
Not pruned: every schedule is a family of its own (GPipe, 1F1B, zero-bubble, interleaved at each virtual-stage
count, DualPipeV), and so is every micro-batch size.

"""
from __future__ import annotations

import heapq
import itertools
import math
import time
from dataclasses import replace

from compiler import plan as P
from compiler import spec as S
from compiler.rules import per_shape
from compiler.search import precision as PR
from compiler.search import report as R
from compiler.search.bounds import Bounds
from compiler.search.collector import young_collections
from compiler.search.dispatch import dispatched, every_axis_fixed
from compiler.search.legality import Legality
from compiler.search.result import Counts, Result, Winner
from compiler.search.space import ORDER, Space, family_of, group_of, placement_key, variant_of
from compiler.search.tally import Tally


class Search(Tally, Legality):
    """One run: the space, the rules and the cost model (compiler/candidates.py), the simulator, the K best so far,
    and the bookkeeping compiler/search/report.py words (`stats`, `family_log`, `peaks`)."""

    def __init__(self, spec: S.Spec, top: int, fixed: dict, cands=None, headroom: float | None = None,
                 offload: bool = False):
        from compiler.candidates import Candidates
        from compiler.cost import memory as MEM
        from compiler.cost.step_time import Simulator
        self.spec, self.top = spec, top
        self.space = Space(spec, fixed)
        self.fixed, self.base, self.world = self.space.fixed, self.space.base, self.space.world
        self.moe, self.blocks = self.space.moe, self.space.blocks
        self.cluster, self.device = spec.cluster, spec.cluster.device
        self.device_bytes = self.device.memory_gb * 1e9
        # what a plan may use: the device less the headroom, W0502's margin unless `--headroom` says otherwise, so
        # that no winner is one `plan` warns of (the same expression as cost.memory.over_memory's)
        self.headroom = MEM.MARGIN if headroom is None else headroom
        self.limit = self.device_bytes * (1 - self.headroom)
        self.cands = cands or Candidates(spec)
        self.sim = Simulator(self.cluster)
        self.counts = Counts()
        self.bounds = Bounds(self.cands, self.sim, self.cluster)
        self.group_rep: dict = {}     # group -> its legal family of the most micro-batches (the smallest)
        self.group_fits: dict = {}    # group -> whether that family's most frugal variant fits
        self.group_fails: dict = {}   # group -> the smallest micro-batch size whose most frugal variant did not fit
        self.family_log: dict = {}    # family -> [(dp sharding, recompute, peak, exact step time or None)]
        self.peaks: dict = {}         # family -> {(dp variant, recompute): peak} of every variant costed
        # per family key (axis, value) -> what happened to its candidates
        self.stats: dict = {}
        self._stat_key_cache: dict = {}  # (axes, schedule, context_parallel) -> _stat_keys
        self._pending: dict = {}      # (stat keys, ids of the problems) -> [problems, times]: refusals not yet counted
        self._cp_shape_memo: dict = {}  # (cp, variant) -> cp's shape-wide refusals (Tally._cp_shape_refused)
        self._after_of: dict = {}     # Bounds.after_key -> its families' `after` (Tally._advance)
        self.best: list = []          # heap of (-time, key, Winner): the K best distinct layouts
        self.by_key: dict = {}        # layout key -> (time, Winner)
        self.all_axes_fixed = all(a in fixed for a in ORDER if a != "ep" or self.moe)
        # rule 9: placement varied where the network is described (a placement changes no price on the two tiers)
        from compiler.cost.links import described
        self.vary_placement = described(self.cluster)
        self.placed: dict = {}        # _placement_key -> (the other placement, its exact step time)
        # rule 10: offload tried where nothing else fits (`offload`, or a kind fixed); what it saved, per winner
        self.offload = offload or fixed.get("offload", "none") != "none"
        self.offloaded: dict = {}     # offloaded.key -> (the variant's peak and step time without offload)

    # -- the space (compiler/search/space.py), as the run and the tests walk it ---------------------------------

    def shapes(self):
        return self.space.shapes()

    def groups(self, sizes: dict):
        return self.space.groups(sizes)

    def families(self, sizes: dict) -> list:
        return self.space.families(sizes)

    def modes(self, plan) -> list:
        return self.space.modes(plan)

    # -- the lower bound of a family -------------------------------------------------------------------------

    def busy(self, decided, fill: bool = False) -> float:
        """compiler/search/bounds.py `Bounds.busy`: the family's bound (rule 4)."""
        return self.bounds.busy(decided, fill)

    def bound(self, decided) -> float:
        """A family's bound (rule 4): `busy` with the pipeline's fill and drain, plus `after`."""
        return self.busy(decided, fill=True) + self.after(decided)

    def after(self, decided) -> float:
        """Under pp, where the run tries no offload, what follows every rank's pipeline phase whatever the family's
        dp sharding (`Bounds.after_pipeline`); else 0."""
        if not self.adds_after(decided):
            return 0.0
        return self.bounds.after_pipeline(decided, self.modes(decided))

    def adds_after(self, plan) -> bool:
        """Whether `after` adds anything to `plan`'s family (decided or not: it reads the mesh and the offload): not
        without pp, nor where offload may put the optimizer's step on the host (it may take less there)."""
        return plan.size("pp") > 1 and not self.offload and plan.offload == "none"

    def cheap_bound(self, plan) -> float:
        """compiler/search/bounds.py `Bounds.cheap`: what stands for the bound until the family is next in line."""
        return self.bounds.cheap(plan)

    # -- ranking -------------------------------------------------------------------------------------------------

    def _key(self, plan):
        if self.all_axes_fixed:
            return (plan.axes, plan.micro_batch_size, plan.schedule, plan.virtual_stages, plan.data_parallel,
                    plan.recompute, plan.sequence_parallel, variant_of(plan)[1])
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

    def _variant(self, plan0, mode, rc, legal: dict | None) -> tuple:
        """(the variant, what the rules say of it), memoised in `legal` (a family's, shared by its bound and its
        costing)."""
        got = legal.get((mode, rc)) if legal is not None else None
        if got is None:
            got = self._legal(P.evolve(plan0, data_parallel=mode[0], fsdp_grad_sync=mode[1], recompute=rc))
            if legal is not None:
                legal[(mode, rc)] = got
        return got

    def _cost(self, plan0, mode, rc, cache, legal: dict | None = None):
        """(decided, estimate) of one variant, or None when a rule refuses it; memoised per family."""
        if (mode, rc) in cache:
            return cache[(mode, rc)]
        self.counts.checked += 1
        plan, problems = self._variant(plan0, mode, rc, legal)
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
        self.peaks.setdefault(family_of(plan), {})[(mode, rc)] = peak
        worst = max(est.memory, key=lambda r: r.peak)
        for st in stats:
            st["passed"] += 1
            st["costed"] += 1
            if st["min_peak"] is None or peak < st["min_peak"][0]:
                st["min_peak"] = (peak, worst.who, decided)  # described by the report (thousands are replaced)
        if peak <= self.limit:
            self.counts.fitting += 1
            for st in stats:
                st["fit"] += 1
        cache[(mode, rc)] = (decided, est)
        return cache[(mode, rc)]

    def _time_bound(self, plan0, mode, rc, times: dict, legal: dict):
        """Rule 6's bound of one variant, `predict(exact=False)` (its step time without the schedule's idle time),
        from an estimate without the memory model (the step-time model reads none of it), or None where a rule
        refuses the variant (`_cost` counts that)."""
        if (mode, rc) not in times:
            plan, problems = self._variant(plan0, mode, rc, legal)
            bound = None
            if not problems:
                decided = self.cands.decide(plan)
                est = self.cands.estimate(decided, memory=False)
                bound = self.sim.predict(self.cands.cost_model(decided), decided, est, exact=False).step_time_s
                self.counts.bounded += 1
            times[(mode, rc)] = (bound, plan)
        return times[(mode, rc)][0]

    def _placed(self, cm, decided, est, pred) -> tuple:
        """Rule 9: on a cluster whose network is described, the variant under the other placement too (the mesh's
        own order, or `placement = auto`), the faster kept; the other's step time kept for the reasons
        (`placed`)."""
        if not self.vary_placement:
            return decided, pred
        other = P.evolve(decided, placement=None if decided.placement == "auto" else "auto")
        alt = self.sim.predict(cm, other, est, exact=True, detail=False)
        self.counts.exact += 1
        won, lost = ((other, alt), (decided, pred)) if alt.step_time_s < pred.step_time_s else \
            ((decided, pred), (other, alt))
        self.placed[placement_key(won[0])] = (lost[0].placement, lost[1].step_time_s)
        return won

    def peak_of(self, plan, mode, rc):
        """The predicted peak of `plan`'s family at dp sharding `mode` and recomputation `rc`, for the report: from
        the family's log where the run costed it, else costed now (outside the run's counts); None where a rule
        refuses it."""
        for m, r, p, _, _ in self.family_log.get(family_of(plan), []):
            if m == mode and r == rc and p is not None:
                return p
        got = self.peaks.get(family_of(plan), {}).get((mode, rc))
        if got is not None:
            return got
        variant, problems = self._variant(plan, mode, rc, None)
        return None if problems else self.cands.estimate(self.cands.decide(variant)).peak_bytes

    def expand(self, plan0, lb, log):
        """Cost the variants of one family under rules 5 to 8 (the module's docstring), offering each fitting one
        that its bound does not prune; the family's log of what was tried, for the reasons."""
        modes = self.modes(plan0)
        rcs = self.space.recomputes()
        key = self._key(plan0)
        tried = self.family_log.setdefault(family_of(plan0), [])
        cache: dict = {}
        fits = lambda got: got is not None and got[1].peak_bytes <= self.limit  # noqa: E731
        # rule 8: the group's smallest micro-batches first; when its most frugal variant does not fit, no
        # micro-batch size of the group does
        g = group_of(plan0)
        if plan0.micro_batch_size >= self.group_fails.get(g, math.inf):
            return self._no_fit(plan0, key, log, tried)  # rule 8: a smaller micro-batch of the group did not fit
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
            return self._no_fit(plan0, key, log, tried)
        rc_bound: dict = {plan0.recompute: lb}  # the family's own bound is its recomputation's (`run` made it)
        times: dict = {}
        legal: dict = {}

        def in_reach(rc) -> bool:  # recomputation's own lower bound (the family's, with its extra forward)
            if rc not in rc_bound:
                rc_bound[rc] = self.bound(self.cands.decide(P.evolve(plan0, recompute=rc)))
            return rc_bound[rc] < self.threshold(key)

        def beyond(j):  # the bound of the recomputations from the j-th on that are out of reach (rule 6), or None
            return next((rc_bound[rc] for rc in rcs[j:] if not in_reach(rc)), None)

        def first(mode):  # the dp sharding's least recomputation in reach and its bound, or None
            return next(((rc, b) for rc in itertools.takewhile(in_reach, rcs)
                         if (b := self._time_bound(plan0, mode, rc, times, legal)) is not None), None)

        # rule 7: the family's most frugal variant (the last dp sharding, the most recomputation a rule allows)
        # first; when it does not fit, no variant does
        frugal = next((got for mode in reversed(modes) for rc in reversed(rcs)
                       if (got := self._cost(plan0, mode, rc, cache, legal)) is not None), None)
        if frugal is None or not fits(frugal):
            self.group_fails[g] = min(self.group_fails.get(g, math.inf), plan0.micro_batch_size)
            if self.group_rep.get(g) is plan0:
                self.group_fits[g] = False
            return self._no_fit(plan0, key, log, tried)
        # rule 6 before memory: each dp sharding's bound at its least recomputation in reach (rule 5: the least
        # is the fastest), from a time-only estimate; a sharding whose bound reaches the threshold has no more of
        # its memory costed
        for mode in modes:
            least = first(mode)
            if least is None:
                self._left(plan0, beyond(0))
                continue
            if least[1] >= self.threshold(key):
                tried.append((mode, least[0], None, None, least[1]))
                self._best_bound(times[(mode, least[0])][1], least[1], left=True)
                continue
            reach = list(itertools.takewhile(in_reach, rcs))
            # rule 7 again, per dp sharding: with its most recomputation the bound leaves in reach (rule 6: a
            # recomputation whose bound reaches the threshold is never offered, nor any with more) it must fit
            most = next((got for rc in reversed(reach)
                         if (got := self._cost(plan0, mode, rc, cache, legal)) is not None), None)
            if not fits(most):
                self._left(plan0, beyond(len(reach)))
                continue
            for j, rc in enumerate(rcs):
                if lb >= self.threshold(key):
                    self._left(plan0, lb)
                    return tried
                if not in_reach(rc):
                    self._left(plan0, rc_bound[rc])
                    break  # more recomputation is only slower
                bound = self._time_bound(plan0, mode, rc, times, legal)
                if bound is None:
                    continue
                if bound >= self.threshold(key):
                    tried.append((mode, rc, None, None, bound))
                    self._best_bound(times[(mode, rc)][1], bound, left=True)
                    break  # more recomputation is only slower
                got = self._cost(plan0, mode, rc, cache, legal)
                if got is None:
                    continue
                decided, est = got
                peak = est.peak_bytes
                if peak > self.limit:
                    tried.append((mode, rc, peak, None, None))
                    continue  # more recomputation may fit
                stats = self._stat(decided)
                self._best_bound(decided, bound)
                cm = self.cands.cost_model(decided)
                pred = self.sim.predict(cm, decided, est, exact=True, detail=False)
                decided, pred = self._placed(cm, decided, est, pred)
                self.counts.exact += 1
                tried.append((mode, rc, peak, pred.step_time_s, bound))
                for st in stats:
                    if st["best_exact"] is None or pred.step_time_s < st["best_exact"][0]:
                        st["best_exact"] = (pred.step_time_s, decided)
                log.append((decided, est, pred, plan0))
                self._offer(pred.step_time_s, key, (decided, est, pred))
                break  # the least recomputation that fits is the fastest
        return tried

    def _no_fit(self, plan0, key, log, tried):
        """A family none of whose variants fits: rule 10 tries it with offload where the run may (`offload`)."""
        if self.offload:
            from compiler.search.offloaded import expand_offloaded
            expand_offloaded(self, plan0, key, log)
        return tried

    def run(self) -> Result:
        t0 = time.perf_counter()
        timing = {}
        built = self.cands.structures_built
        groups, families, space = [], 0, 0
        for sizes in self.shapes():
            gs = list(self.groups(sizes))
            families += sum(len(ms) for _, ms in gs)
            if gs and sizes.get("cp", 1) > 1:
                gs, held = self._cp_shape_refused(sizes, gs)
                space += held
            groups += gs
        self.counts.families = families
        self.counts.space = space + self.space.size(groups)
        timing["enumerate"] = time.perf_counter() - t0
        # 1. rules and a lower bound per family
        t1 = time.perf_counter()
        bounded = []
        memo: dict = {}
        dp_mode, rc = self.fixed.get("data_parallel", "ddp"), self.fixed.get("recompute", "none")
        m_memo: dict = {}  # (a group's settings, its batch ranks, m) -> what the rules refuse
        for g in groups:
            make, ms = g
            keys = self._memo_keys(g.sizes, g.schedule, g.virtual_stages, g.sequence_parallel, g.context_parallel,
                                   dp_mode, rc)
            problems = self._remembered(keys, memo)
            if problems is not None:  # refused by what the group's settings alone decide: no plan of it made
                self.counts.family_rules += len(ms)
                self._pending_add(self._stat_keys_of(g.axes, g.schedule, g.context_parallel), problems, len(ms))
                continue
            first, problems = self._family_legal(make(ms[0]), memo, keys)
            if problems and any(per_shape(d) for d in problems):  # refusals the micro-batch count does not change
                self.counts.family_rules += len(ms)
                self._refused(first, problems, len(ms))
                continue
            # the group's other families differ from its first in the micro-batch count alone: what every rule
            # reads of them (rules.READS) is the group's settings (its memo keys), m and the batch ranks, so a
            # refusal of one is remembered under those (a tenth of the 175B search refused the same few
            # micro-batch counts again and again)
            at = (tuple(keys.values()), g.sizes["dp"] * g.sizes["ep"])
            # the first passed every rule as made (not padded): another m is legal where the rules that read m
            # passed its settings before (rules.MICRO_BATCH_READERS), no rule run
            as_made = not problems and first.pad_vocab == self.base.pad_vocab
            for m in ms:
                if m == ms[0]:
                    plan = first
                else:
                    problems = m_memo.get((at, m))
                    if problems is not None:
                        self.counts.family_rules += 1
                        self._pending_add(self._stat_keys_of(g.axes, g.schedule, g.context_parallel), problems, 1)
                        continue
                    plan = make(m)
                    if not (as_made and self.cands.passes_in_micro_batches(plan)):
                        plan, problems = self._legal(plan)
                    if problems:
                        m_memo[(at, m)] = problems
                if problems:
                    self.counts.family_rules += 1
                    self._refused(plan, problems)
                    continue
                if not plan.sequence_parallel and plan.size("tp") > 1 and "sequence_parallel" not in self.fixed:
                    # rule 2: without sequence parallelism only where a rule refuses it
                    twin = P.evolve(plan, sequence_parallel=True)
                    if not self._family_legal(twin, memo)[1]:
                        continue
                self.group_rep.setdefault(group_of(plan), plan)  # ms: most micro-batches first
                self.counts.bounded_families += 1
                bounded.append((self.cheap_bound(plan), len(bounded), plan, False))
        timing["rules_and_family_bounds"] = time.perf_counter() - t1
        # 2. best first, by the families' bounds (rule 4): each family's cheap bound stands for its bound until it
        # is the smallest, when (under pp) what follows its pipeline is added, and when that is the smallest its
        # own bound computed (`busy`, `Tally._advance`); each time it goes back in. A family whose own bound is the
        # smallest is expanded. The order is the order of the bounds (each standing one is never above its
        # family's bound), index breaking ties, as a sort of every bound would give.
        t2 = time.perf_counter()
        heapq.heapify(bounded)
        exact: dict = {}  # index -> the family's `busy` (fill)
        whole: dict = {}  # index -> the family's bound (`bound`)
        log: list = []
        while bounded:
            lb, i, plan, known = bounded[0]
            if known is not True:  # its bound in two steps, the second only if the first leaves it next in line
                lb, known = self._advance(i, plan, known, exact, whole, lb)
                heapq.heapreplace(bounded, (lb, i, plan, known))
                continue
            if lb >= self.threshold():
                break  # every family left is bounded at least as high: none is visited
            heapq.heappop(bounded)
            self.counts.expanded += 1
            self.expand(plan, lb, log)
        self._bound_left(bounded, exact, whole)
        timing["best_first"] = time.perf_counter() - t2
        self.counts.structures = self.cands.structures_built - built
        ranked = sorted(((t, w) for t, w in self.by_key.values()), key=lambda x: x[0])
        best_t = ranked[0][0] if ranked else None
        # the winners again with every detail (the pipeline's exposed send time): the same step times
        ranked = [(t, (d, est, self.sim.predict(self.cands.cost_model(d), d, est))) for t, (d, est, _) in ranked]
        winners = [Winner(d, pred, est, tuple(R.reasons(self, d, est, pred, best_t))) for _, (d, est, pred) in ranked]
        self._count_refusals()
        rejected = (R.rejected(self, winners, best_t) if self.counts.families
                    else R.unsatisfiable(self.space, self.spec.cluster))
        return Result(self.spec, winners, rejected, self.counts, time.perf_counter() - t0, self.fixed, timing,
                      self.headroom)


@young_collections()
def search(spec: S.Spec, top: int = 5, fixed: dict | None = None, cands=None, headroom: float | None = None,
           cluster=None) -> Result:
    """The `top` fastest plans of `spec`'s model on its cluster (see the module's docstring) whose predicted peak
    leaves `headroom` of each device free (default cost.memory.MARGIN, the margin W0502 warns within). With
    `cluster` (compiler/layout/cluster.py), on those machines instead (`Spec.on`: the same model and training on
    another cluster; `cands`, if given, must be Candidates of that cluster).

    MoE dispatch is an implementation choice like the others where it changes no result: a dropless `moe` written
    with padded dispatch (the default) is also searched with `dispatch = grouped` (the same routing and outputs,
    the rows sorted by expert instead of a slot per token for every expert), unless `--fix dispatch=...` says
    which; the winners of both are ranked together, each saying which dispatch it takes and what the other costs.
    So is FP8 (compiler/search/precision.py): a bf16 file on a device with FP8 matmuls is also searched with
    `precision = fp8(recipe = tensorwise, filter = auto)` on the same trace, unless `--fix precision=...`; a file's
    own fp8 is kept unless `--fix precision=bf16`."""
    if cluster is not None:
        spec = spec.on(cluster)
    if cands is not None and cands.spec.cluster != spec.cluster:
        raise ValueError("search: the candidates were made for another cluster than the one searched")
    fixed = dict(fixed or {})
    fix_precision = fixed.pop("precision", None)
    first, fp8, changed = PR.variants(spec, fix_precision)  # FixError where --fix precision=fp8 cannot be had
    dispatch = fixed.pop("dispatch", None)
    if first is not spec and cands is not None:  # another precision: the same trace, other costs
        from compiler.candidates import Candidates
        cands = Candidates(first, unsharded=cands.unsharded)
    if fp8 is None:
        result = PR.mark(dispatched(Search, first, top, fixed, dispatch, cands, headroom), first.train.fp8, changed)
        note = PR.note(spec)
        if note:
            result.winners = [replace(w, reasons=tuple(w.reasons) + (note,)) for w in result.winners]
    else:
        from compiler.candidates import Candidates
        cands = cands or Candidates(spec)
        cands8 = Candidates(fp8, unsharded=cands.unsharded)  # the same trace: fp8 changes no graph, only costs
        result = PR.merge(dispatched(Search, spec, top, fixed, dispatch, cands, headroom),
                          dispatched(Search, fp8, top, fixed, dispatch, cands8, headroom), top,
                          every_axis_fixed(fixed, spec), cands8)
    if dispatch is not None:
        result.fixed = {**result.fixed, "dispatch": dispatch}
    if fix_precision is not None:
        result.fixed = {**result.fixed, "precision": fix_precision}
    return result

