"""The bookkeeping of a search's families for its report (compiler/search/report.py): per family key (an axis value,
a schedule, a context-parallel variant) what happened to its candidates, the refusals, counted once per distinct
list of problems, and the lower bounds of what the run left unsimulated (`best_bound`, `left`). A mixin of
compiler/search/prune.py's Search, which sets `stats`, `_stat_key_cache`, `_cp_shape_memo`, `_pending`, `counts`,
`cands`, `space` and `moe`, and bounds families (`busy`, `after`, `adds_after`)."""
from __future__ import annotations

import heapq
import math
from collections import Counter

# The report's family keys -> the axis (Diagnostic.axis) whose refusals are that key's own: a refusal by a rule of
# another of these axes is another key's; one of no axis (the whole mesh's rules) is every key's.
OWN = {"tp": "tp", "pp": "pp", "schedule": "pp", "ep": "ep", "cp": "cp", "context_parallel": "cp"}
OWNED = frozenset(OWN.values())

AFTER = "cheap+after"
"""A family's entry in the run's heap whose bound is its cheap one plus `after` (`_advance`); its `busy` is next."""


class Tally:
    """What Search keeps per family key for the report (see the module's docstring)."""

    def _stat_keys(self, plan) -> tuple:
        return self._stat_keys_of(plan.axes, plan.schedule, plan.context_parallel)

    def _stat_keys_of(self, axes: tuple, schedule: str, context_parallel: str) -> tuple:
        at = (axes, schedule, context_parallel)
        keys = self._stat_key_cache.get(at)
        if keys is None:
            sizes = dict(axes)
            keys = [(a, sizes.get(a, 1)) for a in ("tp", "pp", "ep", "cp") if a != "ep" or self.moe]
            if sizes.get("pp", 1) > 1:
                keys.append(("schedule", schedule))
            if sizes.get("cp", 1) > 1:
                keys.append(("context_parallel", context_parallel))
            keys = self._stat_key_cache[at] = tuple(keys)
        return keys

    def _cp_shape_refused(self, sizes: dict, groups: list) -> tuple:
        """Under cp, the refusals that hold for every group of a mesh shape with one attention variant
        (compiler/rules/context_parallel.py SHAPE_RULES: they read cp's size, seq_len, the model's layers, compile
        and the variant, none of what tells those groups apart), checked on one plan per variant: those groups'
        families counted as refused by them at once (the bulk of a long-context search's space is cp shapes a
        short-sequence model or a compiled plan cannot take). Returns (the groups left, the candidates refused)."""
        from compiler.rules.context_parallel import SHAPE_RULES
        by_variant: dict = {}
        for g in groups:
            by_variant.setdefault(g.context_parallel, []).append(g)
        left, held = [], 0
        for variant, gs in by_variant.items():
            # what SHAPE_RULES read of a candidate is cp's size and the variant (seq_len, the layers and compile are
            # the search's own): one probe per pair, its refusals shared by every shape with it (a probe per shape
            # and variant was a twentieth of the 175B search)
            at = (sizes["cp"], variant)
            shape = self._cp_shape_memo.get(at)
            if shape is None:
                make, ms = gs[0]
                shape = self._cp_shape_memo[at] = [d for d in self.cands.requires(make(ms[0]))
                                                   if d.rule in SHAPE_RULES]
            if not shape:
                left += gs
                continue
            for g in gs:
                self._pending_add(self._stat_keys_of(g.axes, g.schedule, variant), shape, len(g[1]))
                self.counts.family_rules += len(g[1])
            held += self.space.size_of(sizes, gs)
        return left, held

    def _stat(self, plan):
        return self._stats_of(self._stat_keys(plan))

    def _stats_of(self, keys) -> list:
        stats, out = self.stats, []
        for k in keys:
            st = stats.get(k)
            if st is None:  # made only when new: a search asks some 70,000 times for a few dozen keys
                st = stats[k] = {"refused": Counter(), "passed": 0, "costed": 0, "fit": 0, "min_peak": None,
                                 "best_exact": None, "best_bound": None, "left": None}
            out.append(st)
        return out

    def _refused(self, plan, problems, times: int = 1):
        """Count each refusal against the family it belongs to (its axis, Diagnostic.axis): a tensor-parallel rule's
        against the tp value, a pipeline rule's against pp and the schedule, an expert rule's against ep, a context
        rule's against cp and its variant, any other against all. Deferred
        (`_count_refusals`): a search refuses hundreds of thousands of families with a few shared lists of problems
        (the rules' memo), so each distinct (family keys, problems) is counted once, `times` summed."""
        self._pending_add(self._stat_keys(plan), problems, times)

    def _pending_add(self, keys: tuple, problems, times: int) -> None:
        # by the diagnostics themselves (kept alive in the entry, so their ids stay theirs): a rule's refusal given
        # again (rules.REUSABLE) is one entry, whichever list holds it
        at = (keys, tuple(map(id, problems)))
        got = self._pending.get(at)
        if got is None:
            self._pending[at] = [problems, times]
        else:
            got[1] += times

    def _count_refusals(self) -> None:
        # summed per key and list of problems first: the 175B search holds ~30,000 entries over a few dozen keys
        # and lists (each key's counts, and the order it first meets each refusal, are the same)
        per_key: dict = {}
        for (keys, ids), (problems, times) in self._pending.items():
            for k in keys:
                got = per_key.get((k, ids))
                if got is None:
                    per_key[(k, ids)] = [problems, times]
                else:
                    got[1] += times
        for (k, _), (problems, times) in per_key.items():
            self._count_refused((k,), problems, times)
        self._pending.clear()

    def _count_refused(self, keys, problems, times: int):
        stats = self._stats_of(keys)
        for (a, _), st in zip(keys, stats):
            mine = [d for d in problems if d.axis == OWN[a] or d.axis not in OWNED]
            for d in mine[:1] or problems[:1]:
                st["refused"][(d.code, d.brief or d.message, bool(mine))] += times

    def _best_bound(self, plan, bound: float, left: bool = False) -> None:
        """A variant's bound as its keys' `best_bound`: one that fits, or one pruned by its bound before its
        memory was costed (of a family whose frugal variant fits: every fitting variant of its keys in the family
        is at least as slow as the least of these); with `left`, the latter (`_left`)."""
        for st in self._stat(plan):
            if st["best_bound"] is None or bound < st["best_bound"]:
                st["best_bound"] = bound
        if left:
            self._left(plan, bound)

    def _left(self, plan, bound: float | None) -> None:
        """A bound of variants of `plan`'s family left unsimulated (rules 4 and 6: it reached the threshold) as its
        keys' `left`, the least: where it is below a key's best simulated step time, the report cannot call that
        its best."""
        if bound is None:
            return
        for st in self._stat(plan):
            if st["left"] is None or bound < st["left"]:
                st["left"] = bound

    def _advance(self, i: int, plan, known, exact: dict, whole: dict, standing: float = 0.0) -> tuple:
        """A family's next bound in a heap of standing bounds, (bound, known). After its cheap one (`known` False,
        the bound `standing`), under pp, that plus `after` (AFTER), which the families of a mesh shape share
        (`_after_of_family`: one computation for all of them); then its `busy` with the pipeline's fill, plus
        `after` (True: the family's bound). So a family costs its own `busy` only where the first two leave it
        next in line. `exact` and `whole` keep each family's `busy` and bound by its index, for the run and the
        report alike."""
        if known is False and self.adds_after(plan):
            # cheap <= busy, and rounding is monotone: cheap + after <= busy + after, the family's bound
            return standing + self._after_of_family(plan), AFTER
        if i not in exact:
            exact[i] = self.busy(self.cands.decide(plan), fill=True)
        if known is not AFTER:
            return exact[i], True
        got = whole.get(i)
        if got is None:
            got = whole[i] = exact[i] + self._after_of_family(plan)
        return got, True

    def _after_of_family(self, plan) -> float:
        """`after` of `plan`'s family, kept per what it reads (`Bounds.after_key`: the mesh, its stage layout,
        which neither the micro-batches nor the schedules of one layout style change, and the dp shardings, which
        read the micro-batches only where FSDP2 gathers per micro-batch). The same float for each family that
        shares it: Bounds keeps it per the same."""
        got = self._after_of.get(self.bounds.after_key(plan, None))
        if got is None:
            got = self._after_of.get(self.bounds.after_key(plan, plan.micro_batches))
        if got is None:
            decided = self.cands.decide(plan)
            got = self.after(decided)
            m = plan.micro_batches if self.bounds.after_reads_micro_batches(decided, self.modes(decided)) else None
            self._after_of[self.bounds.after_key(plan, m)] = got
        return got

    def _bound_left(self, left: list, exact: dict, whole: dict) -> None:
        """The report's lower bound of each family key whose families were none of them simulated (`best_bound`)
        and, of each simulated key, of what it left unsimulated (`left`): see below. `left`: the run's heap when it
        stopped, (standing bound, index, plan, known); `exact`, `whole`: `_advance`'s."""
        by_key: dict = {}
        for entry in left:
            for k, st in zip(self._stat_keys(entry[2]), self._stat(entry[2])):
                if st["best_exact"] is None:
                    by_key.setdefault(k, (st, []))[1].append(entry)
                elif st["left"] is None or entry[0] < st["left"]:
                    # whether a family unvisited could be faster than the key's best simulated (`left`): the least
                    # of their standing bounds, none below the run's last threshold
                    st["left"] = entry[0]
        for st in self.stats.values():  # a key not simulated: what its visited families left counts too
            if st["best_exact"] is None and st["left"] is not None:
                st["best_bound"] = min(st["left"], st["best_bound"] or math.inf)
        for st, entries in by_key.values():
            # a key not simulated: the least bound of what it left and of its families unvisited, best first as
            # the run goes (`_advance`: a family's `busy`, then `after`, each only when its standing bound is the
            # least), until the least standing is a whole bound or no lower than what it left
            best, heap = st["best_bound"], entries  # (standing bound, index, ...): the index breaks ties
            heapq.heapify(heap)
            while heap and (best is None or heap[0][0] < best):
                lb, i, plan, known = heap[0]
                if known is True:
                    best = lb
                    break
                lb, known = self._advance(i, plan, known, exact, whole, lb)
                heapq.heapreplace(heap, (lb, i, plan, known))
            st["best_bound"] = best
