"""The predicted peak of each kind of rank (memory.RankMemory), read from the model state's rows
(compiler/layout/state.py) and the working sets of a step: every rank alike without pp, else each pp rank with all
the stages it holds.

Two instants compete (state.BACKWARD_PEAK, state.STEP_PEAK): the start of the backward of the last micro-batch
(every activation in flight kept, the loss's logits and their gradients alive; under pp, the schedule's fullest
moment) and the optimizer step (every gradient and moment alive). At each, the rows alive then (their bytes
in the weights, gradients and optimizer columns) plus the activations and the working sets of that instant: FSDP's
gathered units (the rows alive during a gather), each unit's whole gradient before its reduce-scatter, DDP's
buckets, the logits, the block being recomputed, a pipeline's kept outputs and receive buffers."""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from compiler.cost import fp8 as FP8
from compiler.cost import memory as MEM
from compiler.cost.memory import rank_peaks
from compiler.layout import state as ST
from runtime import choices

TIED = "embed.weight"  # a tied lm_head's weight: the embedding's (compiler.model; runtime.pipeline.TIED)


def logits_alive(schedule: str, alive: int) -> int:
    """How many micro-batches' logits the last stage holds at its rank's peak, with `alive` micro-batches of it in
    flight there (memory.rank_peaks). torch keeps a stage output from its forward to its backward (fwd_cache; the
    runtime asks for no outputs back). GPipe runs every forward first: all alive. In 1F1B and interleaved 1F1B the
    last stage's backward of a micro-batch is the action right after its forward (runtime/schedule.py), so at most
    one is alive. Under zero-bubble the peak is read after an input-gradient half (I), which frees them; what stays
    alive there waits for its weight half (W) only."""
    if schedule == "gpipe":
        return alive
    return 0 if schedule == "zero-bubble" else min(alive, 1)


@dataclass(frozen=True, slots=True)
class Rank:
    """What the rows and the working sets of one kind of rank read: its parameters (all, and the dense ones of
    them) and what its backward holds besides."""

    who: str
    pp_rank: int | None
    params: float
    dense: float
    acts: float              # what its forwards keep for their backward at its fullest moment
    last: bool               # it runs the loss (its logits and their gradients are a working set)
    grads_at_peak: bool      # gradients already accumulate at its backward instant (not a first micro-batch's)
    flight: str
    ddp_buckets: bool
    flat_sync: bool          # a pipeline's gradient all-reduce after the schedule
    shapes: tuple            # (elements, dims) of its parameters, for ZeroRedundancyOptimizer's partition
    kept: float = 0
    recv: float = 0
    pending_w: float = 0
    staged: float = 0        # activation offload: what the host holds of its activations (acts: the device's)


class Peaks:
    """The peaks of one plan's ranks under one CostModel (`model`) at sizes `env`."""

    def __init__(self, model, plan, env, layout):
        self.model, self.plan, self.env, self.layout = model, plan, env, layout
        self.prec = model.spec.train.precision
        self.rows = ST.rows(plan, self.prec, tied=model.spec.model.head.tied)
        self.zero = ST.groups(plan)[ST.EXPERT][1]  # the ZeRO stages' group: dp, or dp × cp (1: nothing sharded)
        self.g = ST.grad_bytes(self.prec, plan.grad_reduce)
        recompute = getattr(plan, "recompute", "none") != "none"
        (self.loss, self.root, self.block, self.recomputed, self.expert_unit, self.seg_ws,
         self.block_ws) = _sizes(model, env, recompute, bool(layout))
        self.opt_what = MEM.optimizer_label(self.prec, plan.data_parallel, self.zero)
        self.gathers = any(row.alive == ST.GATHER for row in self.rows)
        self.gathered = self._gathered() if self.gathers else 0

    # -- the rows ----------------------------------------------------------------------------------------------------

    def state(self, r: Rank, instant: str | None, location: str = ST.DEVICE) -> dict:
        """Bytes of each column (weights, grads, optimizer) of the rows alive at `instant`, on the device
        (state.Rows.terms: the kinds of one column over the same groups are one term; at `location` ST.HOST with
        instant None, every row the host holds). The optimizer's (and the
        step's gradients) under bf16 are bytes per element × elements, as memory.state_per_param gives them to
        the plan's model state, so the two agree to the byte."""
        out = {"weights": 0, "grads": 0, "optimizer": 0}
        n = r.params
        grads = instant != ST.BACKWARD_PEAK or r.grads_at_peak
        for column, dense, expert, how, k in _terms(self.rows, instant, grads, self.prec == "bf16", location):
            # over how many ranks the term splits the rank's parameters: its group's size, or, where the dense and
            # the expert rows lie over different groups (FSDP2 with ep), the rank's parameters over its share
            z = expert if dense == expert or not n else n / (r.dense / dense + (n - r.dense) / expert)
            if how == _TENSORS and z > 1:
                b = k * self.zero1_largest(r.shapes)
            elif how == _PER_ELEMENT:
                b = k / z * n
            elif how == _OPTIMIZER:
                b = k * (n / z)
            else:
                b = k * n / z
            out[column] += b
        return out

    def _gathered(self) -> float:
        """FSDP's gathered units while a unit computes (fsdp without pp): the root and a block with the next
        ones (plan.fsdp_prefetch), whole, from the rows alive during a gather: bf16 a whole bf16 buffer beside the
        fp32 shard; fp32 the other ranks' pieces (experts over their group, the dense units over theirs)."""
        rows = [row for row in self.rows if row.alive == ST.GATHER]
        units = self.root + (1 + self.plan.fsdp_prefetch) * self.block
        if rows[0].dtype_bytes == 2:  # precision = fp8: the chosen weights gathered in 1 byte (compiler/cost/fp8.py)
            return 2 * units - (1 + self.plan.fsdp_prefetch) * FP8.gathered_saving(self.model, self.plan)
        sizes = ST.groups(self.plan)
        dn, en = sizes[ST.DENSE][1], sizes[ST.EXPERT][1]
        e = (1 + self.plan.fsdp_prefetch) * self.expert_unit
        return 4 * ((units - e) * (dn - 1) / dn + e * (en - 1) / en)

    def zero1_largest(self, shapes) -> int:
        """ZeroRedundancyOptimizer's partition (torch 2.13 _partition_parameters): whole parameters, group by
        group (decayed matrices, then vectors), largest first, each to the dp rank with the least so far; the
        fullest rank's parameter count (at least the largest tensor, so not Ψ/dp)."""
        totals = [0] * self.zero
        for group in (sorted((n for n, nd in shapes if nd >= 2), reverse=True),
                      sorted((n for n, nd in shapes if nd < 2), reverse=True)):
            for n in group:
                k = totals.index(min(totals))
                totals[k] += n
        return max(totals)

    # -- the working sets and the two instants --------------------------------------------------------------------

    def bwd_ws(self, pp_rank) -> float:
        """The largest gradients one backward step holds, over the segments the rank runs."""
        fo, layout = self.model.formulas, self.layout
        if pp_rank is None:
            return max((f(self.env) for f in fo.backward.whole), default=0)
        lay = self.plan.stage_layout
        key = ("bwd_ws", self.env, layout, pp_rank, self.plan.size("pp"), lay.style)
        got = self.model._rank_parts.get(key)
        if got is None:
            n_st = len(layout)
            mine = lay.stages_of(pp_rank)
            repeats = {i for k in mine for i, _ in fo.held(*layout[k])}
            ws = ([self.block_ws[i] for i in sorted(repeats)]
                  + [w for w, on in zip(self.seg_ws, (0 in mine, n_st - 1 in mine)) if on])
            got = self.model._rank_parts[key] = max((w for w in ws if w is not None), default=0)
        return got

    def backward_work(self, r: Rank, buckets: float) -> tuple:
        """(bytes, what) of the backward instant's working sets besides the rows."""
        fsdp2 = self.plan.shards_grads
        grads_ws = self.bwd_ws(r.pp_rank) + FP8.cast_bytes(self.model, self.env)  # precision = fp8's casts
        work = buckets + max(self.loss if r.last else 0, grads_ws) + (self.g * self.block if fsdp2 else 0)
        logits = bool(r.last and self.loss and self.loss >= grads_ws)
        for n in (self.recomputed, r.kept, r.recv, r.pending_w):
            if n:
                work += n
        return work, _working_what(logits, bool(grads_ws), self.gathers and 1 + self.plan.fsdp_prefetch, fsdp2,
                                   bool(buckets), bool(self.recomputed), bool(r.kept), bool(r.recv),
                                   bool(r.pending_w))

    def peak(self, r: Rank) -> MEM.RankMemory:
        """The larger of the rank's two instants."""
        plan, bf16 = self.plan, self.prec == "bf16"
        buckets = self.g * r.dense if r.ddp_buckets else 0
        host = self.host(r)
        at = self.state(r, ST.BACKWARD_PEAK)
        work, what = self.backward_work(r, buckets)
        backward = MEM.RankMemory(who=r.who, pp_rank=r.pp_rank, weights=at["weights"] + self.gathered,
                                  grads=at["grads"], optimizer=at["optimizer"], activations=r.acts, working=work,
                                  moment="the start of the last micro-batch's backward" if r.pp_rank is None
                                  else "the schedule's fullest moment (most activations in flight)",
                                  working_what=what, in_flight=r.flight, optimizer_what=self.opt_what,
                                  forward_bytes=r.acts + r.kept, host=host)
        # pipeline stages' gradient all-reduce after the schedule: fp32 flattens one DDP-sized bucket at a time
        # (runtime.train._average_dense_grads); bf16 reduces the main gradients' own buckets in place
        # (no receive buffer is left after the backwards: runtime.pipeline.InFlight drops each after its own)
        flat = min(plan.ddp_bucket_bytes, self.g * r.dense) if r.flat_sync and not bf16 else 0
        # AdamW is fused on CUDA (runtime/train.py): it updates in place, no temporaries
        step_what = ", ".join(w for w, on in (("DDP's gradient buckets", buckets),
                                              ("a bucket of the gradient all-reduce", flat)) if on)
        at = self.state(r, ST.STEP_PEAK)
        step = MEM.RankMemory(who=r.who, pp_rank=r.pp_rank, weights=at["weights"], grads=at["grads"],
                              optimizer=at["optimizer"], activations=0, working=buckets + flat,
                              moment="the optimizer step", working_what=step_what, optimizer_what=self.opt_what,
                              forward_bytes=r.acts + r.kept, host=host)
        # whichever moment is the peak, forward_bytes is the forwards' fullest moment (RankMemory)
        return max((backward, step), key=lambda m: m.peak)

    def host(self, r: Rank) -> float | None:
        """The rank's host bytes under offload (None without: the plan has no host side): every row located
        there (state.offloaded: the offloaded state and its pinned buffers) and the activations staged there at
        its fullest moment (`r.staged`)."""
        if getattr(self.plan, "offload", "none") == "none":
            return None
        return sum(self.state(r, None, ST.HOST).values()) + r.staged

    def staged(self, peak: MEM.RankMemory, tensors) -> MEM.RankMemory:
        """checkpoint_async: the rank's staging copy (memory.checkpoint_staging), beside its device peak."""
        if not self.model.spec.train.checkpoint_async:
            return peak
        host, device = MEM.checkpoint_staging(tensors, self.prec, self.plan.data_parallel, self.zero)
        return replace(peak, checkpoint_host=host, checkpoint_device=device)


def memory(model, plan, env, layout, stages, params_rank, experts_rank, kept_whole=0) -> tuple:
    """The predicted peak of each kind of rank (memory.RankMemory): every rank alike without pp (`kept_whole`: what
    one micro-batch's forward keeps for its backward), else each pp rank with all the stages it holds (`stages`:
    CostModel._stages)."""
    rm = Peaks(model, plan, env, layout)
    fo, staging = model.formulas, model.spec.train.checkpoint_async
    batch_ranks = plan.size("dp") * plan.size("ep")
    # DDP's buckets (or a pipeline's flattened all-reduce) unless the mode is FSDP2's by name: with dp = 1 and
    # ep > 1, zero2 and fsdp run DDP over the batch ranks (runtime.train._dp_kind) with no bucket counted here
    ddp = choices.ZERO_STAGE[plan.data_parallel] < 2 and batch_ranks > 1
    tensors_rows = any(row.partition == "tensors" for row in rm.rows)
    if not layout:
        shapes = model._shapes(env, "whole") if tensors_rows else ()
        acts, staged = _offload_acts(model, plan, env, (), kept_whole, 1)
        r = Rank("every rank", None, params_rank, params_rank - experts_rank, acts, True,
                 plan.micro_batches > 1, "", ddp, False, shapes, staged=staged)
        return (rm.staged(rm.peak(r), fo.param_shapes.staged("whole", env) if staging else ()),)
    return tuple(_pipelined(model, rm, plan, env, layout, stages, ddp, tensors_rows))


def _pipelined(model, rm, plan, env, layout, stages, flat, tensors_rows):
    """Each pp rank's peak, with every stage it holds."""
    fo = model.formulas
    p, v, m = plan.size("pp"), plan.virtual_stages, plan.micro_batches
    n = len(layout)
    peaks = rank_peaks(plan.schedule, p, m, v, tuple(layout))
    expert_first = fo.experts.prologue(env)
    sent, logits = fo.saved.sent(env), fo.saved.logits(env)
    by_rank = [[] for _ in range(p)]
    for st in stages:
        by_rank[st.rank].append(st)
    for r, mine in enumerate(by_rank):
        held = [st.stage for st in mine]
        params = sum(st.params for st in mine)
        key = ("experts", env, tuple(layout), r, p, plan.schedule)
        experts = model._rank_parts.get(key)
        if experts is None:
            experts = model._rank_parts[key] = sum(fo.within(fo.experts.block, *st.blocks, env)
                                                   + (expert_first if st.stage == 0 else 0) for st in mine)
        acts = sum(st.activations for st in mine)
        kept_w = sum(st.pending_w for st in mine)  # zero-bubble: gradients its pending weight halves keep
        # the last stage's logits of the micro-batches in flight; the others' outputs, until their backward
        # (torch's fwd_cache; runtime.pipeline.InFlight waits on their sends there, not at the step's end)
        kept = sum(logits_alive(plan.schedule, peaks[r].get(st.stage, 0)) * logits
                   if st.stage == n - 1 else model._sent_kept(peaks[r].get(st.stage, 0)) * sent for st in mine)
        # receive buffers (runtime.pipeline.InFlight: allocated by each recv, dropped after that micro-batch's
        # backward): a stage after the first holds the input of each micro-batch in flight, a stage before
        # the last the gradient its running backward consumes
        recv = sum(sent * (peaks[r].get(st.stage, 0) * (st.stage > 0) + (st.stage < n - 1)) for st in mine)
        flight = "micro-batches in flight: " + ", ".join(f"{peaks[r].get(st.stage, 0)} of stage {st.stage}"
                                                         for st in mine)
        who = f"pp rank {r} (stage{'s' if len(mine) > 1 else ''} {', '.join(str(k) for k in held)})"
        shapes = _segments(mine, n, lambda seg: model._shapes(env, seg), fo) if tensors_rows else ()
        tensors = ()
        if model.spec.train.checkpoint_async:
            # the last stage's copy of a tied embedding is written by the first stage's rank (skip_on_save)
            tied = model.spec.model.head.tied and 0 not in held
            tensors = _segments(mine, n, lambda seg: tuple(t for t in fo.param_shapes.staged(seg, env)
                                                           if not (tied and seg == "epilogue" and t[0] == TIED)),
                                fo)
        staged = 0
        if plan.offload == "activations":
            acts, staged = 0, 0
            for st in mine:
                alive = peaks[r].get(st.stage, 0)
                a, s_ = _offload_acts(model, plan, env, (st.blocks,), st.activations, alive)
                acts, staged = acts + a, staged + s_
        rank = Rank(who, r, params, params - experts, acts, (n - 1) in held, plan.schedule != "gpipe", flight,
                    False, flat, shapes, kept, recv, kept_w, staged)
        yield rm.staged(rm.peak(rank), tensors)


def _offload_acts(model, plan, env, stages, acts: float, alive: int) -> tuple:
    """(device, host) bytes of activations `acts` (`alive` micro-batches' of the blocks of `stages`, or of the whole
    model) under activation offload (compiler/cost/offload.py); (acts, 0) without it."""
    if getattr(plan, "offload", "none") != "activations" or not acts:
        return acts, 0
    from compiler.cost import offload as OFF
    copied, per, largest = OFF.activation_bytes(model, plan, env, OFF.blocks_held(model, plan, env, stages))
    moved = min(acts, alive * per)
    # the host holds a copy of each save (a tensor two ops save, twice: the ledger's bytes), the device is relieved
    # of each storage once
    return OFF.device_kept(acts, moved, largest), moved * copied / per if per else 0


def _segments(mine, n, of, fo) -> tuple:
    """`of(segment)` concatenated over the segments of the stages `mine`: each stage's blocks (as many times as it
    holds each), the prologue on the first stage, the epilogue on the last."""
    out = ()
    for st in mine:
        for i, c in fo.held(*st.blocks):
            out += of(("block", i)) * c
        out += of("prologue") if st.stage == 0 else ()
        out += of("epilogue") if st.stage == n - 1 else ()
    return out


# how Peaks.state counts a term's bytes (state.Rows.terms' partition and the column at the instant)
_TENSORS, _PER_ELEMENT, _OPTIMIZER, _ELEMENTS = range(4)


def _terms(rows, instant: str | None, grads: bool, bf16: bool, location: str = ST.DEVICE) -> tuple:
    """rows.terms(instant, grads) as (column, dense group size, expert group size, how, bytes per element): which
    of Peaks.state's formulas counts each, decided once per shape of rows (kept on the Rows, which state.rows
    shares between the plans of one shape), not once per rank."""
    memo = rows.__dict__.setdefault("_peak_terms", {})
    key = (instant, grads, bf16, location)
    got = memo.get(key)
    if got is None:
        out = []
        for (column, dense, expert, partition), k in rows.terms(instant, grads, location):
            if partition == "tensors":
                how = _TENSORS
            elif bf16 and (column == "optimizer" or column == "grads" and instant == ST.STEP_PEAK):
                how = _PER_ELEMENT
            else:
                how = _OPTIMIZER if column == "optimizer" else _ELEMENTS
            out.append((column, dense, expert, how, k))
        got = memo[key] = tuple(out)
    return got


def _sizes(model, env, recompute: bool, piped: bool) -> tuple:
    """What Peaks reads of the formulas at sizes `env`, the same for every plan of those sizes (a search costs
    thousands): the loss's working set, FSDP's root and largest block, the block being recomputed, the experts of
    the largest block, and each pipeline segment's largest backward moment (None: it has none)."""
    key = ("peak sizes", env, recompute, piped)
    got = model._rank_parts.get(key)
    if got is None:
        fo = model.formulas
        largest = lambda moments: max((f(env) for f in moments), default=None)  # noqa: E731
        got = model._rank_parts[key] = (
            max(f(env) for f in fo.loss) if fo.loss else 0,
            fo.units.root(env), fo.units.block(env),
            fo.saved.recomputed(env) if recompute else 0,
            # the experts of the largest block (the FSDP unit `block` is the largest of any repeat's)
            max((f(env) for f in fo.experts.block), default=0) if fo.experts.block is not None else 0,
            [largest(seg) for seg in (fo.backward.prologue, fo.backward.epilogue)] if piped else (),
            [largest(seg) for seg in fo.backward.block] if piped else ())
    return got


@functools.lru_cache(maxsize=256)
def _working_what(logits: bool, grads: bool, gathered: int, fsdp2: bool, buckets: bool, recomputed: bool,
                  kept: bool, recv: bool, pending_w: bool) -> str:
    """What the backward instant's working sets are, in words (`gathered`: the FSDP units gathered at once, 0 if
    none)."""
    what = []
    if logits:
        what.append("the logits and their gradients (fp32)")
    elif grads:
        what.append("the backward's gradients in flight")
    if gathered:
        what.append(f"FSDP's gathered units (root + {gathered} blocks)")
    if fsdp2:
        what.append("a unit's whole gradient before its reduce-scatter")
    if buckets:
        what.append("DDP's gradient buckets")
    for on, said in ((recomputed, "the block being recomputed"),
                     (kept, "the schedule's kept outputs (the logits of the last stage's micro-batches in "
                            "flight, the others' sent outputs until their backward)"),
                     (recv, "the receive buffers of the micro-batches in flight"),
                     (pending_w, "the output gradients pending weight halves keep")):
        if on:
            what.append(said)
    return ", ".join(what)
