"""The lower bounds the search visits families by (compiler/search/prune.py, rule 4): a family's busiest rank's
compute time with the pipeline's fill and drain (`busy`), and, until the family is next in line, a cheaper bound
that needs no stage layout (`cheap`). Both read the simulator's pieces (compiler/cost/step_time.py), kept per what
they read, and keep the per-rank sums they make of them."""
from __future__ import annotations

import itertools
import math

from compiler import plan as P
from compiler.cost import recompute_passes
from compiler.cost.step_time import PAIRED
from compiler.cost.formulas import env_of
from compiler.cost.links import links
from runtime import choices  # torch-free


class Bounds:
    """The bounds of one search's families: its candidates (cost models, layouts), simulator and cluster."""

    def __init__(self, cands, sim, cluster):
        self.cands, self.sim, self.cluster = cands, sim, cluster
        # (id of the pieces, pp, stage layout) -> per pp rank (one micro-batch's forward and backward, the earlier
        # stages' forwards, their backwards); id of the pieces -> the whole model's one micro-batch, without pp;
        # ("whole", id of the pieces) -> cheap's sum
        self._stage_times: dict = {}

    def busy(self, decided, fill: bool = False) -> float:
        """The busiest rank's compute time of `decided` (collectives on its critical path included), before any
        schedule idle time, data-parallel traffic and optimizer: what compiler/cost/step_time.py's `predict` counts as
        each rank's `compute_s` with `exact=False` (tests/test_search.py holds the two equal). With `fill`, under
        pp, each rank's busy time plus the pipeline's fill before its first action and drain after its last,
        which no schedule avoids (the data dependencies alone): still a lower bound of the exact step time."""
        cm = self.cands.cost_model(decided)
        env = env_of(decided)
        # the simulator keeps the pieces per what they read (plans that differ in dp or pp share them), and so
        # the times below per pieces: their id is the key
        pieces = self.sim.pieces(cm, decided, env, links(decided, self.cluster))
        key = id(pieces)
        m = decided.micro_batches
        if cm.piped:
            pp = decided.size("pp")
            lay = decided.stage_layout
            at = (key, pp, cm.stages_for(decided, env), lay.style)  # families of a shape share their stages' times
            got = self._stage_times.get(at)
            if got is None:  # per rank: one micro-batch's forward and backward, the earlier stages' of each
                fwd, bwd = self.sim.stage_times(cm, decided, env, pieces)[:2]
                # the earlier stages' sums as sum(fwd[:r]) adds them, left to right from 0 (the same floats)
                before_f, before_b = itertools.accumulate(fwd, initial=0), itertools.accumulate(bwd, initial=0)
                got = self._stage_times[at] = tuple((sum(fwd[s] + bwd[s] for s in lay.stages_of(r)), f, b)
                                                    for r, f, b in zip(range(pp), before_f, before_b))
            # dualpipev: what its overlapped pairs hide leaves each rank's busy time (as in `predict`)
            hidden = self.sim.hidden(cm, decided, env, pieces)
            if not fill:
                return max(m * one - hidden[r] for r, (one, _, _) in enumerate(got))
            # Rank r starts with stage r's forward of the first micro-batch, which needs every earlier stage's
            # forward of it first; it ends with stage r's backward of the last micro-batch, after which every
            # earlier stage still runs its own (not under zero-bubble and dualpipev, whose weight halves may come
            # last).
            drain = decided.schedule not in choices.SPLIT_BACKWARD
            return max(m * one - hidden[r] + before_f + (before_b if drain else 0.0)
                       for r, (one, before_f, before_b) in enumerate(got))
        one = self._stage_times.get(key)
        if one is None:
            counts = {("block", name): c for name, (_, c) in cm.counts.items()}
            one = self._stage_times[key] = sum((p.forward + p.backward) * counts.get(k, 1) for k, p in pieces.items())
        return m * one

    def after_pipeline(self, decided, modes) -> float:
        """Under pp, the least over the dp shardings `modes` ((data_parallel, fsdp_grad_sync), the family's) of
        what follows every rank's pipeline phase (compiler/cost/step_time.py `after_pipeline`: the once-per-step
        collectives, the optimizer, the runtime's cost), a little below it: the family's bound adds it to `busy`'s.
        Kept per what it reads: the structure, the mesh, the stage layout and its style, the placement, the
        padded vocabulary, the gradients' dtype and, under FSDP2's gathers per micro-batch, the micro-batches."""
        cm = self.cands.cost_model(decided)
        stages = cm.stages_for(decided)
        least = None
        for plan in self._after_plans(decided, modes):
            at = ("after", id(cm), plan.axes, stages, plan.stage_layout.style, plan.placement, plan.pad_vocab,
                  plan.grad_reduce, plan.data_parallel, plan.fsdp_grad_sync,
                  plan.micro_batches if plan.shards_params else None)
            got = self._stage_times.get(at)
            if got is None:
                got = self._stage_times[at] = self.sim.after_pipeline(cm, plan, cm.step_inputs(plan))
            least = got if least is None else min(least, got)
        return 0.0 if least is None else least * (1 - 1e-9)

    @staticmethod
    def after_key(plan, m) -> tuple:
        """What `after_pipeline` reads of a family's plan before its stage layout is decided (the layout is the
        mesh's, the pipeline's stages' and the user's layout's: compiler/candidates.py `decide`), with `m` its
        micro-batches where it reads them (`after_reads_micro_batches`), else None: the families of a mesh
        shape whose schedules lay their stages out alike share it."""
        return (plan.axes, plan.sequence_parallel, plan.tp_layers, plan.context_parallel, plan.fp32_residual,
                plan.pipeline_stages, plan.layout, plan.schedule in choices.V_SHAPED, plan.placement, plan.pad_vocab,
                plan.grad_reduce, m)

    def after_reads_micro_batches(self, decided, modes) -> bool:
        """Whether `after_pipeline` reads the micro-batch count: where a dp sharding it takes gathers the
        parameters per micro-batch (FSDP2 sharding them); else it is the same for every family of a group."""
        return any(p.shards_params for p in self._after_plans(decided, modes))

    @staticmethod
    def _after_plans(decided, modes) -> list:
        plans = [P.evolve(decided, data_parallel=data_parallel, fsdp_grad_sync=sync) for data_parallel, sync in modes]
        if any(p.shards_grads and not p.shards_params for p in plans):
            # FSDP2 sharding the parameters too moves what ZeRO-2's does and gathers them 2m times instead of once
            # (compiler/cost/ledger_parts.py `_data_parallel`): its part is the larger, and the less often kept
            plans = [p for p in plans if not p.shards_params]
        return plans

    def cheap(self, plan) -> float:
        """A lower bound of `busy(decide(plan), fill=True)` that needs no stage layout: under pp the busiest rank
        does at least its share of the whole model's forward and backward (m micro-batches of it over pp ranks),
        and under a schedule of one stage per rank at least `_chained`'s (its fill and drain: 1f1b, gpipe; its fill
        alone: zero-bubble, whose weight halves may come last); without pp it is `busy` itself. The pieces are the ones `busy` reads (kept per what they read), so a search bounds every
        family with them and decides the stage layout only of those it visits."""
        # what it reads of the plan: the structure (compiler.cost.structure), env, the links (axes, placement), what
        # the pieces read besides (recomputation, its passes, compile) and the micro-batches; the schedules of a
        # mesh shape (a family each) share it
        at = ("cheap", plan.axes, plan.sequence_parallel, plan.tp_layers, plan.context_parallel, plan.fp32_residual,
              plan.placement, plan.micro_batch_size, plan.micro_batches, plan.recompute, recompute_passes(plan),
              plan.compiles)
        got = self._stage_times.get(at)
        if got is None:
            got = self._stage_times[at] = self._cheap(plan)
        if not isinstance(got, tuple):
            return got  # without pp: `busy` itself
        total, paired_total, forward, units = got
        m, pp = plan.micro_batches, plan.size("pp")
        if plan.schedule in PAIRED:
            return m * paired_total / pp
        # a rank does at least its largest stage's share, whatever the layout (`_partition`)
        at = ("partition", units, pp * plan.virtual_stages)
        most = self._stage_times.get(at)
        if most is None:
            most = self._stage_times[at] = _partition(units, pp * plan.virtual_stages)
        if plan.virtual_stages == 1:  # drained: the earlier stages' backwards after the last too (`busy`)
            drained = plan.schedule not in choices.SPLIT_BACKWARD
            return max(m * total / pp, m * most, _chained(total, m, pp, 1.0 if drained else forward))
        return max(m * total / pp, m * most)

    def _cheap(self, plan):
        """`busy` itself without pp; under pp, the whole model's one micro-batch (forward and backward) without
        and with what overlapped pairs could hide (dualpipev's), each a little below the exact sums, and the least
        share of the forward in any piece's forward and backward (so in any stage's: `_chained`)."""
        cm = self.cands.cost_model(plan)
        env = env_of(plan)
        pieces = self.sim.pieces(cm, plan, env, links(plan, self.cluster))
        if not cm.piped:
            return self.busy(plan)
        got = self._stage_times.get(("whole", id(pieces)))
        if got is None:
            parts = [(c, pieces[("block", name)]) for name, (_, c) in cm.counts.items()]
            parts += [(1, pieces[k]) for k in ("prologue", "epilogue", "loss")]
            total = sum(c * (p.forward + p.backward) for c, p in parts)
            # an overlapped pair hides at most the lesser of its communication and its compute (`pair_seconds`),
            # so a step's pairs hide at most the lesser of the whole model's hideable communication and the rest
            hide = sum(c * sum(p.hideable) for c, p in parts)
            paired = total - min(hide, total - hide)
            # below the exact sums by more than their rounding, so never above the bound it stands for
            forward = min((p.forward / (p.forward + p.backward) for _, p in parts if p.forward + p.backward > 0),
                          default=0.0)
            # one repeat's blocks between the first layers and the last (with the loss): what a stage can hold
            units = None
            if len(cm.counts) == 1:
                (count, block), first, last, loss = parts[0], pieces["prologue"], pieces["epilogue"], pieces["loss"]
                units = (first.forward + first.backward, block.forward + block.backward,
                         last.forward + last.backward + loss.forward + loss.backward, count)
            got = self._stage_times[("whole", id(pieces))] = (total * (1 - 1e-9), paired * (1 - 1e-9), forward, units)
        return got


def _partition(units: tuple | None, stages: int) -> float:
    """A lower bound, a little below it, of the largest stage of any cut of one repeat's blocks into `stages`
    pipeline stages (`units`: one micro-batch's forward and backward of the first layers p, of a block b, and of
    the last layers with the loss e, and the B blocks; the first stage holds p and its blocks, the last its blocks
    and e, each other stage blocks alone). The least largest stage P* is the least X at which the stages can hold
    every block: ⌊(X − p)/b⌋ + ⌊(X − e)/b⌋ + (stages − 2)·⌊X/b⌋ ≥ B (`holds`, which rounds each quotient up by a
    relative 1e-9). That count only steps up at a stage's possible sum, p + i·b, e + j·b or k·b, so P* is one of
    them: the least of each sequence that holds, by bisection over its index (the test is monotone), and the
    least of the three. 0 where the model has more than one repeat or a block costs nothing. Under one stage per
    rank the busiest rank's micro-batch is at least P* (`Bounds.busy`: the sum of a rank's stages); with several,
    at least its largest stage's. GPT-3 175B at pp 96 puts a block and the logits on the last stage: the whole
    model's share per rank is a quarter below P* there."""
    if units is None or stages < 2:
        return 0.0
    p, b, e, blocks = units
    if b <= 0:
        return 0.0
    up = 1 + 1e-9
    mid_stages = stages - 2

    def holds(x: float) -> bool:
        if p > x * up or e > x * up:
            return False
        return (math.floor((x - p) / b * up) + math.floor((x - e) / b * up)
                + mid_stages * math.floor(x / b * up)) >= blocks

    top = max(p, e) + blocks * b  # every block on one stage: holds
    best = top
    for start in (p, e, 0.0):
        lo, hi = 0, math.ceil((top - start) / b)  # the sequence start + i·b below `best`, by its index
        while lo < hi:
            mid = (lo + hi) // 2
            x = start + mid * b
            if x >= best:
                hi = mid
            elif holds(x):
                best, hi = x, mid
            else:
                lo = mid + 1
    return best * (1 - 1e-9)  # the stages' sums are added in another order


def _chained(total: float, m: int, pp: int, share: float = 1.0) -> float:
    """The least busiest rank, fill (and drain) included, of a pipeline of one stage per rank whose stages' one
    micro-batch forward and backward a_q sum to `total`: rank r's is m·a_r plus what of the earlier stages it waits
    for (`busy`): their forwards of the first micro-batch, and where it drains (1f1b, gpipe) their backwards of the
    last, at least `share`·a_q each (`share` 1 where it drains; else the least share of the forward in a stage,
    which `_cheap` finds over the pieces, since a stage's sums are theirs). Were every rank's below X, each
    a_r < (X - share·S_r)/m with S_r the earlier stages' sum, so S_{r+1} < S_r·(1 - share/m) + X/m and, by
    induction from S_0 = 0, total = S_pp < X/share·(1 - (1 - share/m)^pp): the busiest rank is at least
    share·total / (1 - (1 - share/m)^pp), whatever the layout. `total` is a little below the exact sums already
    (`_cheap`), more than this expression's rounding; with no share (0) only the per-rank share is left."""
    if share <= 0:
        return m * total / pp
    return share * total / (1 - (1 - share / m) ** pp)
