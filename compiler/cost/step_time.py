"""The step-time model: how long one optimizer step of a plan takes, per rank, from what the compiler knows.

    compute        every op of the traced graphs the program runs, per micro-batch: a matmul at the device's
                   achievable rate for its shape (tile and wave quantisation), never faster than its operands stream
                   from memory; any other op (norms, activations, casts, the loss) moves its bytes at the memory
                   bandwidth; no op faster than the device's per-op overhead. Backward: one gradient matmul per
                   operand that needs one (compiler/cost/flops.py's rule), other ops twice their forward bytes.
                   Recomputation adds its forward again (full: the block; selective: the attention core and the
                   memory-bound ops).
    communication  every collective the passes inserted (the ledger's sites), costed with an alpha-beta model of its
                   algorithm on the link its group uses: the tier the Layout says the group crosses
                   (compiler/layout/groups.py: the mesh is placed on the nodes innermost axis first, so an axis's
                   group stays inside a node when it and the axes inside it fit in one; `Link`).
                   Tensor- and expert-parallel collectives sit on the critical path of the stage that issues them;
                   pipeline sends delay the receiving stage; data parallelism's traffic overlaps the last
                   micro-batch's backward under DDP, each micro-batch's compute under FSDP, and nothing under pp
                   (one coalesced all-reduce after the pipeline step). Ring attention's sends over cp overlap its
                   blocks' compute step by step: each step costs max(transfer, compute) (`ring_steps`).
    the pipeline   each stage's forward, backward (and under zero-bubble input- and weight-gradient) time goes into
                   the compiler's own schedule simulation (compiler/schedule.py `verify`, the lists the runtime runs):
                   interleaving and zero-bubble are costed as they run, not by a bubble formula. Under dualpipev
                   (DeepSeek's DualPipeV: two stages per rank in a V) a forward and a backward of two micro-batches
                   run as one overlapped pair, each side's ep and tp collectives hidden behind the other side's
                   compute, not its own (which waits for them): a pair costs both computes plus, per side,
                   max(0, its communication - the other side's compute) (runtime/schedule_time.py
                   `pair_seconds`); what the pairs hide leaves the rank's busy time and its exposed ep and tp.
                   Not charged: the compute the communication kernels take meanwhile (DeepSeek-V3 gives its
                   all-to-alls 20 of 132 SMs): optimistic in that, until a GPU measures a pair.
    the step       the last rank's end of the pipeline, plus its exposed data-parallel traffic, plus AdamW, plus
                   the runtime's own cost per step (measured where a device's figures say so). Under offload
                   (compiler/cost/offload.py) AdamW's part is the host's (parameters), or the slower of the device's
                   share and the host's chain of copies and step (optimizer); parameter and activation copies run
                   under the compute up to the host link, what it cannot hold exposed ("host").

Every device figure lives in compiler/layout/devices.py with its source; the constants of this module (and of the
compute and communication parts, compiler/cost/op_times.py and compiler/cost/links.py) each with its reason.
`Simulator` costs candidate plans of one model from one trace (compiler/candidates.py); `predict` costs a compiled
program.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from compiler import trace as T
from compiler.cost import fp8 as FP8
from compiler.cost.formulas import env_of
from compiler.cost.ledger import site_width
from compiler.cost.links import collective_s, links
from compiler.cost.op_times import MEMORY_EFFICIENCY, Segment, ring_exposed, ring_steps
from compiler.cost.step_tail import data_parallel_exposed
# the schedule's timing with per-stage durations (re-exported: tests and bench read them here)
from compiler.cost.pipeline_time import OVERLAPPED, PAIRED, STEADY, pipeline_ends, pipeline_hidden  # noqa: F401

# AdamW moves, per parameter it updates, fp32 reads of the parameter, gradient and both moments and writes of the
# parameter and moments: 28 bytes, what the fused kernel the runtime uses on CUDA moves (one pass; torch's foreach
# implementation, used before, ran each arithmetic step as its own pass, about twice that). Gradient clipping reads
# every gradient once more.
ADAMW_BYTES_PER_PARAM = 28
ADAMW_FOREACH_BYTES_PER_PARAM = 56  # what the runtime's AdamW moved before it was fused (reference measurements)
CLIP_BYTES_PER_PARAM = 4
# DDP's bucket and FSDP2's prefetch depth are the Plan's (plan.ddp_bucket_bytes, plan.fsdp_prefetch): the last
# bucket's all-reduce starts when backward ends; with a prefetch of at least one unit only the first unit's gather
# is exposed, the others running under the previous unit's compute. Codegen writes the same two figures into the
# program, so what this model overlaps is what the runtime does.


# -- a structure's compiled segments --------------------------------------------------------------------------


class _Model:
    """The segments and collective sites of one cost.CostModel (one pass structure)."""

    def __init__(self, cm):
        from compiler.cost import ARGS
        traced = cm.traced
        prec = cm.precision
        self.cm = cm
        self.act = 2 if prec.startswith("bf16") else 4
        sub = cm.formulas.sub

        def seg(gm):
            return Segment(gm, sub, ARGS, prec)
        self.segments: dict = {}
        # a block per `repeat`, by name: ("block", name)
        if cm.formulas.piped:
            top = traced.top
            for name, gm in traced.blocks.items():
                self.segments[("block", name)] = seg(gm)
            for k, key in (("prologue", T.PROLOGUE), ("epilogue", T.EPILOGUE), ("loss", T.LOSS)):
                self.segments[k] = seg(top.meta[key])
        else:
            self.segments["all"] = seg(traced.top)
            for name, gm in traced.blocks.items():
                self.segments[("block", name)] = seg(gm)
        # the collectives the passes inserted, per segment: (site, its elements' function)
        self.sites = cm.formulas.sites
        # what the pieces read of env (ARGS' positions) and which axes' links: Simulator.pieces' key
        free = set().union(*(sympy.sympify(f.expr).xreplace(sub).free_symbols for _, f in self.sites))
        self.reads = tuple(sorted(set().union(*(s.reads for s in self.segments.values()))
                                  | {i for i, a in enumerate(ARGS) if a in free}))
        self.axes = tuple(sorted({site.axis for site, _ in self.sites}))

    def where_key(self, site):
        kind, name = site.where
        if kind == "block":
            return ("block", name)
        return name


@dataclass(frozen=True)
class Piece:
    """One micro-batch through one piece of the model (a block, the first or last layers, or the whole model)."""

    forward: float         # compute + the collectives on its critical path
    backward: float        # input and weight gradients + collectives + recomputation
    weight: float          # of which the weight gradients (zero-bubble's W)
    comm: dict             # axis -> seconds of collectives inside forward + backward
    ops: int = 0           # ops run (forward, backward, recomputation), each at least the device's op overhead
    hideable: tuple = (0.0, 0.0)  # of forward and of backward, the seconds of collectives an overlapped partner's
                                  # compute can hide (OVERLAPPED axes; dualpipev's pairs, `pair_seconds`)


# -- the prediction --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankTime:
    """One kind of rank (every rank without pp; each pp rank with pp)."""

    who: str
    compute_s: float       # busy computing (its collectives on the critical path included)
    idle_s: float          # waiting in the pipeline schedule
    exposed_comm_s: dict   # axis -> seconds of communication on this rank's critical path
    end_s: float           # when its step ends
    sync_s: float = 0.0    # of exposed_comm_s, the once-per-step collectives after the pipeline (dp's, sp's)
    tail_s: float = 0.0    # the optimizer and the runtime's own cost per step, after those
    hidden_comm_s: dict = field(default_factory=dict)  # axis -> seconds its overlapped pairs hid (dualpipev)

    def as_json(self) -> dict:
        return {"who": self.who, "compute_s": self.compute_s, "idle_s": self.idle_s,
                "exposed_comm_s": dict(self.exposed_comm_s), "end_s": self.end_s}


@dataclass(frozen=True)
class Prediction:
    step_time_s: float
    tokens_per_s: float
    model_tflops_per_device: float
    hardware_tflops_per_device: float
    mfu: float
    bubble_fraction: float
    exposed_comm_s: dict          # axis -> seconds, on the rank that ends the step last
    optimizer_s: float
    ranks: tuple                  # RankTime per kind of rank
    links: tuple                  # Link per axis
    device: str = ""
    pieces: dict = field(default_factory=dict, compare=False)
    ops_per_step: int = 0         # ops the slowest rank runs per step (what the per-op overhead multiplies)
    runtime_s: float = 0.0        # the runtime's own cost per step (devices.py `step_overhead_ms`)
    offload: str = "none"         # the plan's offload (compiler/cost/offload.py): what the next two price
    host_step_s: float = 0.0      # of optimizer_s, the host's AdamW (optimizer or parameter offload)
    host_copy_s: float = 0.0      # host<->device copies the slowest rank waits for outside optimizer_s (exposed_comm_s
                                  # "host"): parameter and activation offload's

    def as_json(self) -> dict:
        return {"step_time_s": self.step_time_s, "tokens_per_s": self.tokens_per_s,
                "model_tflops_per_device": self.model_tflops_per_device,
                "hardware_tflops_per_device": self.hardware_tflops_per_device, "mfu": self.mfu,
                "bubble_fraction": self.bubble_fraction, "exposed_comm_s": dict(self.exposed_comm_s),
                "optimizer_s": self.optimizer_s, "ranks": [r.as_json() for r in self.ranks],
                "links": [{"axis": k.axis, "size": k.size, "crosses_nodes": k.crosses_nodes, "gbps": k.gbps,
                           "latency_us": k.latency_us} for k in self.links],
                **({"offload": self.offload, "host_step_s": self.host_step_s, "host_copy_s": self.host_copy_s}
                   if self.offload != "none" else {})}


def slowest_rank(ranks) -> RankTime:
    """The rank whose step ends last: it sets the step time (the first of equals)."""
    return max(ranks, key=lambda r: r.end_s)


def bubble_fraction(ranks) -> float:
    """The pipeline bubble: the one figure `plan`, `search` and `--json` show. The fraction of the step that the
    slowest rank (`slowest_rank`: its end is the step time) spends idle in the simulated pipeline schedule, waiting for
    another stage's activations or gradients: its `idle_s` / `end_s`. 0 without pp (no schedule to wait in), and 0 in
    a lower-bound prediction (`exact=False`, no schedule simulated). The published (p-1)/(v·m+p-1)
    (compiler/schedule.py `bubble_fraction`) assumes equal stages and free sends; it is shown beside this one in
    `plan`, labelled, for comparison only."""
    r = slowest_rank(ranks)
    return r.idle_s / r.end_s if r.end_s > 0 else 0.0


def _figures(link) -> tuple | None:
    """What a Link is, as a tuple (cheaper to hash than the dataclass, which hashes its fields each time)."""
    if link is None:
        return None
    net = link.network
    return (link.size, link.crosses_nodes, link.gbps, link.latency_us,
            None if net is None else (net[0], id(net[1]), str(net[2])))


class Simulator:
    """Step times of plans of one model: one compiled `_Model` per cost model (pass structure)."""

    def __init__(self, cluster, attention: str = "fused"):
        """`cluster`: the machines (compiler/layout/cluster.py Cluster: the device's figures, the links' tiers).
        `attention`: "fused" (SDPA, what our programs run) or "materialised" (scores written to memory, as
        Megatron-LM 2021 ran it: only to compare with published figures)."""
        if attention not in ("fused", "materialised"):
            raise ValueError(f"attention must be fused or materialised, not {attention!r}")
        self.cluster = cluster
        self.device = cluster.device
        self.materialised = attention == "materialised"
        self._models: dict = {}
        self._pieces: dict = {}  # `pieces` per what it reads
        self._stages: dict = {}  # id of pieces -> stage_times' sums per (blocks, first stage, last stage)
        self._params: dict = {}  # (id of a cost model, env, layout) -> _stage_params

    def model(self, cm) -> _Model:
        got = self._models.get(id(cm))
        if got is None:
            got = self._models[id(cm)] = (_Model(cm), cm)
        return got[0]

    # -- pieces ------------------------------------------------------------------------------------------------

    def pieces(self, cm, plan, env, lk: dict) -> dict:
        """Piece per segment key for one micro-batch (`lk`: links(plan, self.cluster)). Kept per what it reads of
        `plan` (a search's bound and its exact prediction ask for the same); the dict returned is not to be
        changed."""
        from compiler.cost import recompute_passes
        mdl = self.model(cm)  # held, so that cm's id is not reused while the entry lives
        # the plans of one structure that differ only in what no piece reads (dp and pp, usually) share them
        key = (id(cm), tuple(env[i] for i in mdl.reads), tuple(_figures(lk.get(a)) for a in mdl.axes),
               getattr(plan, "recompute", "none"), recompute_passes(plan), getattr(plan, "compiles", False))
        got = self._pieces.get(key)
        if got is None:
            got = self._pieces[key] = self._pieces_of(cm, plan, env, lk)
        return got

    def _pieces_of(self, cm, plan, env, lk: dict) -> dict:
        mdl = self.model(cm)
        dev = self.device
        recompute = getattr(plan, "recompute", "none")
        from compiler.cost import recompute_passes, reruns
        passes = recompute_passes(plan)
        comm = {}
        times = {key: segment.times(env, dev, mdl.act, self.materialised, getattr(plan, "compiles", False))
                 for key, segment in mdl.segments.items()}
        for site, f in mdl.sites:
            key = mdl.where_key(site)
            dtype = 4 if site.fp32 else mdl.act
            if site.fp8:  # the node dispatch's FP8 rows and scales (compiler/cost/ledger.py site_width)
                dtype = site_width(site, mdl.act, mdl.act, cm.spec.train.fp8 is not None)
                if dtype is None:
                    continue
            link = lk.get(site.axis)
            if link is None:
                continue
            if site.op == "send_recv" and site.axis == "cp" and link.size > 1:
                # the ring's sends (context_parallel = ring): only what its steps' compute does not hide
                cp, ot = link.size, times[key]
                per = {"forward": 2 * (cp - 1), "backward": 4 * cp - 2}[site.direction]  # key-sized blocks
                steps = ring_steps(cp, f(env) * dtype / per, ot.ring_forward, ot.ring_backward, link)
                t = ring_exposed(steps[site.direction])
            else:
                t = collective_s(site.op, f(env) * dtype, link)
            c = comm.setdefault(key, {"forward": {}, "backward": {}})
            c[site.direction][site.axis] = c[site.direction].get(site.axis, 0.0) + t
            again = reruns(plan, site) if key != "all" else 0
            if again:
                c["backward"][site.axis] = c["backward"].get(site.axis, 0.0) + t * again
        out = {}
        for key, segment in mdl.segments.items():
            ot = times[key]
            c = comm.get(key, {"forward": {}, "backward": {}})
            cf, cb = sum(c["forward"].values()), sum(c["backward"].values())
            is_block = key == "block" or (isinstance(key, tuple) and key[0] == "block")
            extra = 0.0
            # precision = fp8: the chosen linears' faster matmuls and their casts (compiler/cost/fp8.py)
            df, db = FP8.piece_seconds(cm, key[1], env, dev, getattr(plan, "compiles", False)) if is_block and isinstance(key, tuple) else (0.0, 0.0)
            if is_block and recompute == "full":  # its collectives before the last saving op are in cb already
                extra = (ot.forward + df) * passes
            elif is_block and recompute == "selective":
                extra = ot.selective
            axes = {}
            for d in ("forward", "backward"):
                for a, t in c[d].items():
                    axes[a] = axes.get(a, 0.0) + t
            ops = ot.ops + (sum(1 for op in segment.ops) if extra else 0)
            hide = tuple(sum(t for a, t in c[d].items() if a in OVERLAPPED) for d in ("forward", "backward"))
            out[key] = Piece(ot.forward + cf + df, ot.backward + cb + extra + db, ot.weight, axes, ops, hide)
        return out

    # -- one plan ------------------------------------------------------------------------------------------------

    def predict(self, cm, plan, est, exact: bool = True, detail: bool = True) -> Prediction:
        """The step time of `plan` (decided, of `cm`'s structure) with `est` its cost.Estimate (pp rank 0).

        `exact=False` skips the schedule simulation: each pp rank's pipeline time is its busy time alone, so the
        step time is a lower bound of the exact one (a search ranks by it first and simulates only the plans whose
        bound can still win). `detail=False` leaves out the pipeline's exposed send time (a second simulation with
        instant sends); the step time is the same."""
        dev = self.device
        env = env_of(plan)
        pp = env[3]
        lk = links(plan, self.cluster, (lambda: est.ledger) if plan.placement == "auto" else None)
        pieces = self.pieces(cm, plan, env, lk)
        m = plan.micro_batches
        mdl = self.model(cm)
        fo = cm.formulas
        if fo.piped:
            ends, busy, stage_comm, hid = self._pipeline(cm, plan, env, pieces, lk, exact, detail)
            ranks_end = dict(busy) if ends is None else ends
            makespan = max(ranks_end.values())
            stage_params = self._stage_params(cm, plan, env)
            per, last_backward = None, 0.0
            layout = cm.stages_for(plan, env)
            lay = plan.stage_layout
            ops = m * self._rank_ops(fo, pieces, tuple(layout), lay, pp)
        else:
            tops = [k for k in mdl.segments if not isinstance(k, tuple)]
            blocks = [k for k in mdl.segments if isinstance(k, tuple)]
            counts = {("block", name): c.n for name, c in fo.counts.items()}
            fwd = sum(pieces[k].forward for k in tops) + sum(counts[k] * pieces[k].forward for k in blocks)
            bwd = sum(pieces[k].backward for k in tops) + sum(counts[k] * pieces[k].backward for k in blocks)
            comm: dict = {}
            for k in tops + blocks:
                for a, t in pieces[k].comm.items():
                    comm[a] = comm.get(a, 0.0) + t * (counts.get(k, 1))
            per = Piece(fwd, bwd, 0.0, comm)
            ranks_end = {0: m * (fwd + bwd)}
            busy = dict(ranks_end)
            makespan = ranks_end[0]
            stage_comm = {0: {a: m * t for a, t in comm.items()}}
            hid = {}
            stage_params = {0: est.params_rank}
            last_backward = bwd
            ops = m * (sum(pieces[k].ops for k in tops) + sum(counts[k] * pieces[k].ops for k in blocks))
        # data parallelism's traffic and the optimizer, per rank kind
        step_entries = est.step_entries
        params0 = max(est.params_rank, 1)
        shard = _optimizer_shard(plan, est)
        ranks, worst = [], None
        runtime = dev.step_overhead_ms * 1e-3
        dp_exposed: dict = {}  # scale -> `data_parallel_exposed`: the pp ranks of equal parameters share it
        for r in sorted(ranks_end):
            scale = stage_params[r] / params0
            sync = 0.0
            exposed = dict(stage_comm.get(r, {}))
            at_scale = dp_exposed.get(scale)
            if at_scale is None:
                at_scale = dp_exposed[scale] = data_parallel_exposed(cm, plan, step_entries, lk, scale, per,
                                                                     last_backward)
            for axis, hidden in at_scale:
                exposed[axis] = exposed.get(axis, 0.0) + hidden
                sync += hidden
            opt = self._optimizer_s(stage_params[r], shard)
            host = copies = 0.0
            if plan.offload != "none":  # the host's step and the copies (compiler/cost/offload.py)
                from compiler.cost import offload as OFF
                # the units a copy is cut into: FSDP's (each block and the root), or the rank's blocks
                blocks = (sum(k for s in lay.stages_of(r) for _, k in fo.held(*layout[s])) if fo.piped
                          else sum(c.n for c in fo.counts.values()))
                units = blocks + 1 if plan.offload == "params" else max(blocks, 1)
                opt, host, copies = OFF.step_part(plan, dev, est.ledger.entries, scale, stage_params[r] / shard,
                                                  opt, busy[r], units)
                if copies:
                    exposed["host"] = copies
            end = ranks_end[r] + sync + opt + runtime + copies
            rt = RankTime(f"pp rank {r}" if fo.piped else "every rank", busy[r], makespan - busy[r], exposed, end,
                          sync, opt + runtime, hid.get(r, {}))
            ranks.append(rt)
            if worst is None or end > worst[0]:
                worst = (end, rt, opt, host, copies)
        step, slowest, opt, host, copies = worst
        world = plan.world_size
        return Prediction(step_time_s=step, tokens_per_s=est.tokens_step / step,
                          model_tflops_per_device=est.flops_step_n / world / step / 1e12,
                          hardware_tflops_per_device=est.flops_step_hw_n / world / step / 1e12,
                          mfu=est.flops_step_n / world / step / (dev.peak_tflops * 1e12),
                          bubble_fraction=bubble_fraction(ranks), exposed_comm_s=dict(slowest.exposed_comm_s),
                          optimizer_s=opt,
                          ranks=tuple(ranks), links=tuple(lk[a] for a, _ in plan.axes), device=dev.kind,
                          pieces=pieces, ops_per_step=int(ops), runtime_s=runtime, offload=plan.offload,
                          host_step_s=host, host_copy_s=copies)

    def _optimizer_s(self, params: float, shard: float) -> float:
        """AdamW's step and the clipping's read on a rank updating `params` parameters, its state `shard`-ways
        sharded: memory-bound (ADAMW_BYTES_PER_PARAM and CLIP_BYTES_PER_PARAM per parameter at the HBM's speed)."""
        return (params / shard * (ADAMW_BYTES_PER_PARAM + CLIP_BYTES_PER_PARAM)
                / (self.device.hbm_gbps * 1e9 * MEMORY_EFFICIENCY))

    def after_pipeline(self, cm, plan, est) -> float:
        """For a pipelined plan without offload, the least over its pp ranks of what `predict` adds to a rank's
        pipeline end: the once-per-step collectives (all exposed under pp), the optimizer's step and the runtime's
        own cost. Every rank ends at least that long after its pipeline phase, so the step time is at least the
        pipeline's makespan plus this (the search's family bound, compiler/search/bounds.py). `est`: pp rank 0's
        estimate, or what this reads of it (cost.CostModel.step_inputs)."""
        if not cm.formulas.piped or plan.offload != "none":
            raise ValueError("after_pipeline: a pipelined plan without offload only")
        env = env_of(plan)
        lk = links(plan, self.cluster, (lambda: est.ledger) if plan.placement == "auto" else None)
        params0 = max(est.params_rank, 1)
        shard = _optimizer_shard(plan, est)
        entries = est.step_entries
        return min(sum(t for _, t in data_parallel_exposed(cm, plan, entries, lk, p / params0, None, 0.0))
                   + self._optimizer_s(p, shard) for p in set(self._stage_params(cm, plan, env).values())) \
            + self.device.step_overhead_ms * 1e-3

    def _rank_ops(self, fo, pieces, layout: tuple, lay, pp: int) -> int:
        """The most ops one micro-batch runs on a pp rank (its stages' blocks, the first layers on stage 0, the last
        layers and loss on the last), kept per pieces and layout: what the per-op overhead multiplies."""
        known = self._stages.setdefault(id(pieces), {})
        at = ("ops", layout, lay.style, pp)
        got = known.get(at)
        if got is None:
            blocks = [pieces[("block", name)] for name, _, _ in fo.edges]
            stage_ops = [sum(c * blocks[i].ops for i, c in fo.held(lo, hi)) + (pieces["prologue"].ops if k == 0 else 0)
                         + (pieces["epilogue"].ops + pieces["loss"].ops if k == len(layout) - 1 else 0)
                         for k, (lo, hi) in enumerate(layout)]
            got = known[at] = max(sum(stage_ops[s] for s in lay.stages_of(r)) for r in range(pp))
        return got

    def _stage_params(self, cm, plan, env) -> dict:
        """Each pp rank's parameters (its stages'), kept per model, sizes and layout; not to be changed."""
        layout = cm.stages_for(plan, env)
        lay = plan.stage_layout
        key = (id(cm), env, tuple(layout), lay.style)  # cm held by self._models: its id is not reused
        got = self._params.get(key)
        if got is None:
            got = self._params[key] = self._stage_params_of(cm, plan, env, layout, lay)
        return got

    def _stage_params_of(self, cm, plan, env, layout, lay) -> dict:
        pp, n = plan.size("pp"), len(layout)
        params = cm.formulas.params
        out = {}
        for r in range(pp):
            mine = lay.stages_of(r)
            fo = cm.formulas
            out[r] = (params.prologue(env) * (0 in mine) + sum(fo.within(params.block, *layout[k], env) for k in mine)
                      + params.epilogue(env) * (n - 1 in mine))
        return out

    def stage_times(self, cm, plan, env, pieces) -> tuple:
        """Per pipeline stage of `plan`'s layout, one micro-batch's (forward, backward, weight-gradient part of the
        backward, {axis: seconds of its collectives}) as lists indexed by stage: its blocks, plus the first
        layers on stage 0 and the last layers and loss on the last stage. Each stage's sums are kept per pieces
        and blocks (a search's layouts share most of their stages); the lists and dicts are not to be changed."""
        return self._stage_columns(cm, plan, env, pieces)[:4]

    def stage_hideable(self, cm, plan, env, pieces) -> tuple:
        """Per pipeline stage, one micro-batch's seconds of collectives inside its forward and inside its backward
        that an overlapped partner's compute can hide (`Piece.hideable`), as two lists indexed by stage; not to be
        changed."""
        return self._stage_columns(cm, plan, env, pieces)[4:]

    def _stage_columns(self, cm, plan, env, pieces) -> tuple:
        """`_stage_sums` as six lists indexed by stage, kept per pieces and layout."""
        layout = tuple(cm.stages_for(plan, env))
        known = self._stages.setdefault(id(pieces), {})
        got = known.get(layout)
        if got is None:
            got = known[layout] = tuple(list(col) for col in zip(*self._stage_sums(cm, layout, pieces, known)))
        return got

    def _stage_sums(self, cm, layout, pieces, known) -> list:
        """Per stage, (forward, backward, weight part, {axis: seconds}, hideable forward, hideable backward), each
        kept in `known` (the pieces' own) per its blocks and whether it is first or last."""
        n = len(layout)
        fo = cm.formulas
        out = []
        for s, (lo, hi) in enumerate(layout):
            at = (lo, hi, s == 0, s == n - 1)
            got = known.get(at)
            if got is None:
                fs = bs = ws = hf = hb = 0.0
                cs: dict = {}
                for i, nb in fo.held(lo, hi):
                    blk = pieces[("block", fo.edges[i][0])]
                    fs, bs, ws = fs + nb * blk.forward, bs + nb * blk.backward, ws + nb * blk.weight
                    hf, hb = hf + nb * blk.hideable[0], hb + nb * blk.hideable[1]
                    for a, t in blk.comm.items():
                        cs[a] = cs.get(a, 0.0) + nb * t
                extra = (["prologue"] if s == 0 else []) + (["epilogue", "loss"] if s == n - 1 else [])
                for k in extra:
                    pc = pieces[k]
                    fs, bs, ws = fs + pc.forward, bs + pc.backward, ws + pc.weight
                    hf, hb = hf + pc.hideable[0], hb + pc.hideable[1]
                    for a, t in pc.comm.items():
                        cs[a] = cs.get(a, 0.0) + t
                got = known[at] = (fs, bs, ws, cs, hf, hb)
            out.append(got)
        return out

    def _pipeline_cost(self, cm, plan, env, pieces) -> dict:
        """The per-stage durations the schedule is timed with (runtime/schedule_time.py `timed`'s `cost`)."""
        f, b, w, _ = self.stage_times(cm, plan, env, pieces)
        cost = {"F": f, "B": b, "I": [x - y for x, y in zip(b, w)], "W": w}
        if plan.schedule in PAIRED:
            cost["F_comm"], cost["B_comm"] = self.stage_hideable(cm, plan, env, pieces)
        return cost

    def hidden(self, cm, plan, env, pieces) -> dict:
        """Per pp rank, the seconds of collectives its overlapped pairs hide in a step (`pipeline_hidden`); 0
        under a schedule without pairs. What the rank's busy time leaves out, here and in the search's bound
        (compiler/search/bounds.py)."""
        pp = plan.size("pp")
        if plan.schedule not in PAIRED:
            return dict.fromkeys(range(pp), 0.0)
        return pipeline_hidden(plan.schedule, pp, plan.micro_batches, plan.virtual_stages,
                               self._pipeline_cost(cm, plan, env, pieces))

    def _pipeline(self, cm, plan, env, pieces, lk, exact=True, detail=True):
        pp, m = plan.size("pp"), plan.micro_batches
        lay = plan.stage_layout
        f, b, w, comm = self.stage_times(cm, plan, env, pieces)
        ends = None
        cost = self._pipeline_cost(cm, plan, env, pieces)
        hidden = self.hidden(cm, plan, env, pieces)  # what the overlapped pairs hide, off each rank's busy time
        busy = {r: m * sum(f[s] + b[s] for s in lay.stages_of(r)) - hidden[r] for r in range(pp)}
        if exact:
            send = collective_s("send_recv", cm.formulas.send(env) * 4, lk["pp"])
            ends = pipeline_ends(plan.schedule, pp, m, plan.virtual_stages, cost, send)
            # what the sends cost the step: the same schedule with instant sends
            pp_exposed = (max(ends.values()) - max(pipeline_ends(plan.schedule, pp, m, plan.virtual_stages, cost,
                                                                 0.0).values())) if send > 0 and detail else 0.0
        stage_comm, hid = {}, {}
        for r in range(pp):
            acc: dict = {}
            for s in lay.stages_of(r):
                for a, t in comm[s].items():
                    acc[a] = acc.get(a, 0.0) + m * t
            if hidden[r] > 0:  # the hidden seconds leave the overlapped axes' exposed time, each by its share
                over = sum(t for a, t in acc.items() if a in OVERLAPPED)
                hid[r] = {a: hidden[r] * acc[a] / over for a in OVERLAPPED if a in acc}
                for a, t in hid[r].items():
                    acc[a] -= t
            if ends is not None and detail:
                acc["pp"] = pp_exposed
            stage_comm[r] = acc
        return ends, busy, stage_comm, hid


def step_of(cm, plan):
    """The maker of a compiled plan's step time (cost.Estimate.step_of): its prediction on the spec's device, from
    its estimate of pp rank 0 (what compiler/pipeline.py attaches to the Estimate it compiles)."""
    return lambda est: Simulator(cm.spec.cluster).predict(cm, plan, est)


def unplaced(compiled) -> Prediction:
    """The compiled plan's step time with no placement (the mesh's own order): its cost model's prediction with
    only the links changed, what `plan`'s naive-placement line and W0323 compare the plan with."""
    from compiler import plan as PL
    return Simulator(compiled.spec.cluster).predict(compiled.model, PL.evolve(compiled.plan, placement=None),
                                                    compiled.costs)


def predict(compiled, attention: str = "fused") -> Prediction | None:
    """The step time of a compiled program (compiler.pipeline.Compiled): its estimate's (`Estimate.step`, made
    once), or with `attention` "materialised" (only to compare with published figures) its cost model's under that
    assumption."""
    if compiled.plan is None:
        return None
    if attention == "fused":
        return compiled.costs.step
    return Simulator(compiled.spec.cluster, attention).predict(compiled.model, compiled.plan, compiled.costs)


def _optimizer_shard(plan, est) -> float:
    """How many ways a rank's optimizer state is sharded (`predict`'s optimizer step): dp under ZeRO and FSDP2;
    FSDP2 with ep shards the dense weights' state over dp × ep and the experts' over dp (the memory model's)."""
    dp, ep = plan.size("dp"), plan.size("ep")
    params0 = max(est.params_rank, 1)
    shard = dp if plan.shards_optimizer else 1
    if plan.shards_grads and ep > 1:
        dense = params0 - est.expert_params_rank
        shard = params0 / (dense / (dp * ep) + est.expert_params_rank / dp)
    return shard
