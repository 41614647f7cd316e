"""The cost model: parameters, FLOPs, memory per rank and the communication ledger of a plan, as one `Estimate`.

    params.py   parameters of the model and of each traced segment after the passes
    flops.py    forward FLOPs from the trace, backward from a rule per node
    formulas.py every formula of one pass structure, compiled once, as a typed object (`Formulas`)
    ledger.py   the collectives the passes inserted (read once), pipeline sends, data parallelism's
    ledger_parts.py  CostModel's ledger of one plan and rank, entry by entry (a mixin of CostModel)
    memory.py   model state, activations in flight per schedule, per-stage rows, the "does not fit" checks
    step_time.py  the step-time model: one optimizer step's time per rank, from a CostModel and a Plan (it reads
                the CostModel's `formulas`, `stages_for`, `spec` and `traced` only)

`CostModel(spec, traced, plan)` reads the graphs after the passes once (they are symbolic in dp, tp, ep, pp and the
micro-batch size µb) and compiles each formula to a function of those (`CostModel.formulas`, formulas.py);
`.estimate(plan)` evaluates them for one
`compiler.plan.Plan` with the same structure (`structure`: which axes are > 1, sequence parallelism, what tp shards,
the cp variant, the residual stream's precision): axis sizes (cp's too, but where a `moe` layer binds it),
micro-batches, schedule, virtual stages and the stage layout may differ. `estimate(spec, plan, traced)`
is the same path, so what `compile` prints is what a search ranks.

Every formula is derived from what the plan stores and sends, node by node or tensor by tensor; the published
formulas in ../shared/reference/ are what the tests check these against, not what is computed here.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields

import sympy

from compiler import spec as S
from compiler import trace as T
from compiler.cost import fp8 as FP8
from compiler.cost import memory as MEM
from compiler.cost import rank_memory
from compiler.cost.formulas import ARGS, AXES, RECOMPUTE, SAVED_MODES, Formula, Formulas, env_of  # noqa: F401
from compiler.cost.ledger import Collective, Ledger  # noqa: F401  (the ledger's types, re-exported)
from compiler.cost.formulas import recompute_mode as _recompute, recompute_passes, reruns  # noqa: F401
from compiler.cost.formulas import saved_mode as _saved_mode
from compiler.cost.ledger_parts import BYTES, LedgerParts  # noqa: F401  (BYTES re-exported)
from compiler.cost.memory import ModelState, Stage, moe_held_elements, rank_peaks, zero_model_state  # noqa: F401
from compiler.cost.structures import other_structure, binds_cp, structure, structure_of  # noqa: F401
from compiler.symbols import MICRO_BATCH, size
from runtime import choices  # torch-free: the schedules whose backwards split (SPLIT_BACKWARD)



@dataclass(frozen=True)
class StepInputs:
    """What follows a rank's pipeline phase reads of its estimate (CostModel.step_inputs): the same names."""

    params_rank: int
    expert_params_rank: int
    step_entries: tuple
    ledger_of: object = field(default=None, compare=False, repr=False)

    @functools.cached_property
    def ledger(self) -> Ledger:
        """The rank's ledger, built once, when first read (as `Estimate.ledger`)."""
        return self.ledger_of()


@dataclass(frozen=True)
class Estimate:
    """What one plan costs, for one rank (under pp: pp rank `pp_rank`, every stage it holds)."""

    params: sympy.Expr             # the model's parameters, a formula of the spec's sizes
    params_n: int
    params_rank: int               # parameters the rank holds (tp shards at their size; before dp sharding)
    expert_params_rank: int        # of which expert weights (sharded over ep)
    flops_fwd: sympy.Expr          # one forward pass of one micro-batch of µb sequences, whole model
    flops_step: sympy.Expr         # forward + backward over the global batch (model FLOPs, no recomputation)
    flops_step_n: int
    flops_rank_step_n: int         # what the busiest rank computes per step
    model_state: ModelState        # bytes per rank
    stages: tuple                  # memory.Stage per pipeline stage; empty without pp
    tokens_step: int
    micro_batch_size: int          # sequences per micro-batch on one rank (plan.micro_batch_size)
    pp_rank: int = 0
    flops_step_hw: sympy.Expr = sympy.Integer(0)  # hardware FLOPs: model FLOPs + recomputation's forward
    flops_step_hw_n: int = 0
    flops_rank_step_hw_n: int = 0
    memory: tuple = ()             # memory.RankMemory per kind of rank: the predicted peak and what holds it
    ledger_of: object = field(default=None, compare=False, repr=False)
    """() -> Ledger: the collectives of one step on the rank (`ledger`, built on first read: a search reads the
    ledgers of only the plans it times). Two estimates are equal when their fields and their ledgers are."""
    step_entries_of: object = field(default=None, compare=False, repr=False)
    """() -> tuple: the ledger's once-per-step entries alone (`step_entries`, where the ledger is not built)."""
    step_of: object = field(default=None, compare=False, repr=False)
    """(this estimate) -> step_time.Prediction: one optimizer step's predicted time (`step`, made on first read).
    A compiled plan's estimate has it (compiler/pipeline.py: step_time.step_of); a search's candidates have none
    (it times the plans it ranks with its own Simulator, bound first)."""

    def __eq__(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        return (all(getattr(self, f.name) == getattr(other, f.name) for f in fields(self) if f.compare)
                and self.ledger == other.ledger)

    __hash__ = None  # equal by their ledgers too, which are built on first read: not a dictionary key

    @property
    def ledger(self) -> Ledger:
        """The collectives of one step on the rank, built once, when first read."""
        got = self.__dict__.get("_ledger")
        if got is None:
            got = self.ledger_of()
            object.__setattr__(self, "_ledger", got)  # a frozen value's cache: the same ledger every read
        return got

    @property
    def step_entries(self) -> tuple:
        """The ledger's entries of direction "step" (data parallelism's, tp's partial gradients), in its order:
        all the step-time model reads of the ledger where placement is not auto. Taken from the ledger where it
        is built; otherwise built alone (a search's time bounds read only these, and the whole ledger, every site
        of the graphs, was two fifths of a bound)."""
        got = self.__dict__.get("_ledger")
        if got is not None or self.step_entries_of is None:
            return tuple(c for c in self.ledger.entries if c.direction == "step")
        got = self.__dict__.get("_step_entries")
        if got is None:
            got = self.step_entries_of()
            object.__setattr__(self, "_step_entries", got)  # a frozen value's cache, as the ledger's
        return got

    @property
    def step(self):
        """The step-time model's prediction of the plan (compiler/cost/step_time.py: time, throughput, MFU, where
        the time goes), made once, when first read: what `plan` prints, plan.json's and the program's figures."""
        got = self.__dict__.get("_step")
        if got is None:
            if self.step_of is None:
                raise ValueError("this estimate carries no step time: a compiled plan's does "
                                 "(compiler.pipeline.compile_spec); time a candidate with step_time.Simulator")
            got = self.step_of(self)
            object.__setattr__(self, "_step", got)  # a frozen value's cache, as the ledger's
        return got

    @property
    def peak_bytes(self) -> float:
        return MEM.peak_bytes(self.memory)

    @property
    def worst_stage(self) -> Stage | None:
        return max(self.stages, key=lambda st: (st.total, st.stage)) if self.stages else None


Costs = Estimate  # the name codegen's annotations use


class CostModel(LedgerParts):
    """The cost of every plan with the pass structure of `traced` (see the module's docstring)."""

    def __init__(self, spec: S.Spec, traced: T.Traced, plan):
        """`plan`: the Plan `traced` was lowered for; only the decisions the formulas bind are read (`structure`:
        its pass structure, cp variant (and degree, where a `moe` layer binds it), residual precision), which every
        plan this model estimates must share."""
        self.spec, self.traced = spec, traced
        self.cp_bound = binds_cp(spec)
        self.structure = structure(plan, self.cp_bound)
        """Every decision of the Plan that the graphs and the formulas bind (`structure`): every plan this model
        estimates has the same."""
        from compiler.cost import activations as A
        self.precision = A.precision_key(spec, plan)
        """The activations' precision key (activations.precision_key): the train section's, with the plan's fp32
        residual stream."""
        self.formulas = Formulas.build(spec, traced, self.precision)
        """Every formula of this pass structure (formulas.py): what estimate, memory, ledger and step time read."""
        self._hw: dict = {}
        self._stage_parts: dict = {}  # _stages' parts that no dp sharding changes, per sizes, stages and schedule
        self._rank_parts: dict = {}   # what no dp sharding or recomputation changes, by tagged key: what a pp rank
                                      # holds (`_rank_holds`), its FLOPs, and rank_memory's sizes, experts per rank
                                      # and backward working sets

    # The search's pruning (compiler/search/prune.py) reads these two of the formulas through the model.
    @property
    def piped(self) -> bool:
        """Whether the trace is cut into pipeline segments (Formulas.piped)."""
        return self.formulas.piped

    @property
    def counts(self):
        """Per repeated block's name: formulas.Count (its count in the spec's sizes, its value)."""
        return self.formulas.counts

    # -- one plan -------------------------------------------------------------------------------------------------

    def stages_for(self, plan, env=None) -> tuple:
        """The stage layout, as the Plan carries it: decided once, by compile or by the search's candidates
        (compiler/lower.py), or written by the user. The cost model decides nothing: a pipelined plan without its
        layout is refused rather than costed on a layout of the cost model's own choosing."""
        if plan.stages:
            return tuple(plan.stages)
        if plan.layout:
            return tuple(plan.layout)
        raise ValueError(f"plan {plan.describe()} has pp = {plan.size('pp')} but no stage layout: decide it first "
                         "(compiler.candidates.Candidates.decide, or compile)")

    def estimate(self, plan, pp_rank: int = 0, memory: bool = True) -> Estimate:
        """What `plan` costs on pp rank `pp_rank`. With `memory=False` the memory model is left out (no `stages`, no
        `memory`: not a plan to print or fit, only what the step-time model reads: the ledger, the parameters and
        FLOPs), for the search's time bound before a variant's memory is costed."""
        if structure(plan, self.cp_bound) != self.structure:
            raise ValueError(other_structure(plan, self.structure))
        spec = self.spec
        env = env_of(plan)
        dp, tp, ep, pp, mb = env[:5]
        m = plan.micro_batches
        fo = self.formulas
        if fo.piped:
            layout = self.stages_for(plan, env)
            lay = plan.stage_layout
            key, (nb, on_rank, params_rank, experts_rank) = self._rank_holds(plan, env, layout, pp_rank)
            nb, on_rank = dict(nb), dict(on_rank)  # the ledger's own copies
            # zero-bubble's split backward (input gradients, then weight gradients) recomputes a checkpointed
            # block once for each half: two extra forwards under full recomputation
            at = ("busiest", key, _recompute(plan), recompute_passes(plan))  # every dp sharding's the same
            flops = self._rank_parts.get(at)
            if flops is None:
                per_stage = self._rank_parts.get(("flops", env, tuple(layout)))  # every recomputation's the same
                if per_stage is None:
                    per_stage = [fo.within(fo.flops.block, lo, hi, env) for lo, hi in layout]
                    per_stage[0] += fo.flops.prologue(env)
                    per_stage[-1] += fo.flops.epilogue(env)
                    self._rank_parts[("flops", env, tuple(layout))] = per_stage
                rec = fo.recompute[_recompute(plan)]
                rec_stage = [fo.within(rec, lo, hi, env) * recompute_passes(plan) for lo, hi in layout]
                flops = self._rank_parts[at] = (max(sum(per_stage[s] for s in lay.stages_of(r)) for r in range(pp)),
                                                max(sum(per_stage[s] + rec_stage[s] for s in lay.stages_of(r))
                                                    for r in range(pp)))
            rank_flops, rank_hw = flops
        else:
            layout, nb, on_rank = (), None, {"all": True}
            params_rank = fo.params.whole(env)
            experts_rank = fo.experts.whole(env)
            rank_flops = fo.flops.whole(env)
            rank_hw = rank_flops + fo.recompute[_recompute(plan)](env)
        hw, hw_n = self._hardware_flops(_recompute(plan), recompute_passes(plan))
        state = MEM.model_state(params_rank, spec.train.precision, plan.data_parallel, dp, plan.grad_reduce)
        stages = self._stages(plan, env, layout) if layout and memory else ()
        memory = self._memory(plan, env, layout, stages, params_rank, experts_rank) if memory else ()
        led = lambda: self._ledger(plan, env, pp_rank, nb, on_rank, params_rank, experts_rank)  # noqa: E731
        steps = lambda: self._step_entries(plan, env, nb, on_rank, params_rank, experts_rank)  # noqa: E731
        return Estimate(params=fo.model_params, params_n=fo.model_params_n, params_rank=int(params_rank),
                        expert_params_rank=int(experts_rank), flops_fwd=fo.flops_fwd, flops_step=fo.flops_step,
                        flops_step_n=fo.flops_step_n, flops_rank_step_n=int(m * rank_flops), model_state=state,
                        flops_step_hw=hw, flops_step_hw_n=hw_n, flops_rank_step_hw_n=int(m * rank_hw),
                        stages=stages, ledger_of=led, step_entries_of=steps, tokens_step=fo.tokens_step, micro_batch_size=mb, pp_rank=pp_rank,
                        memory=memory)

    def _rank_holds(self, plan, env, layout, pp_rank: int) -> tuple:
        """(key, (blocks of each repeat, segments, parameters, expert parameters)) that pipelined `plan`'s pp rank
        `pp_rank` holds in `layout`, the same for every dp sharding and recomputation of a family: kept per key,
        not to be changed."""
        fo = self.formulas
        lay = plan.stage_layout
        key = (env, tuple(layout), pp_rank, lay.style)
        got = self._rank_parts.get(key)
        if got is None:
            n = len(layout)
            mine = lay.stages_of(pp_rank)
            nb = {name: 0 for name, _, _ in fo.edges}  # blocks of each repeat (by name) the rank's stages hold
            for k in mine:
                for i, c in fo.held(*layout[k]):
                    nb[fo.edges[i][0]] += c
            on_rank = {"prologue": 0 in mine, "epilogue": n - 1 in mine, "loss": n - 1 in mine}
            params_rank = (fo.params.prologue(env) + sum(fo.within(fo.params.block, *layout[k], env) for k in mine)
                           + (fo.params.epilogue(env) if n - 1 in mine else 0))  # the V's last stage on rank 0
            experts_rank = fo.experts.prologue(env) + sum(fo.within(fo.experts.block, *layout[k], env) for k in mine)
            got = self._rank_parts[key] = (nb, on_rank, params_rank, experts_rank)
        return key, got

    def step_inputs(self, plan, pp_rank: int = 0) -> "StepInputs":
        """What compiler/cost/step_time.py's `after_pipeline` reads of pipelined `plan`'s estimate on pp rank
        `pp_rank` (its parameters, its once-per-step collectives, the ledger where placement is auto), without
        the rest of `estimate` (the FLOPs, the model state): the same figures, for the search's bounds."""
        if structure(plan, self.cp_bound) != self.structure:
            raise ValueError(other_structure(plan, self.structure))
        if not self.formulas.piped:
            raise ValueError("step_inputs: a pipelined plan only")
        env = env_of(plan)
        _, (nb, on_rank, params_rank, experts_rank) = self._rank_holds(plan, env, self.stages_for(plan, env), pp_rank)
        entries = self._step_entries(plan, env, dict(nb), dict(on_rank), params_rank, experts_rank)
        return StepInputs(params_rank=int(params_rank), expert_params_rank=int(experts_rank), step_entries=entries,
                          ledger_of=lambda: self._ledger(plan, env, pp_rank, dict(nb), dict(on_rank), params_rank,
                                                         experts_rank))

    def _hardware_flops(self, recompute: str, passes: int) -> tuple:
        """Hardware FLOPs per step (the model's, the experts' padding, recomputation's forward `passes` times) as a
        formula and its value: the same for every plan with this recomputation, so computed once, not again in each
        of the thousands of estimates a search makes."""
        key = (recompute, passes)
        got = self._hw.get(key)
        if got is None:
            fo = self.formulas
            hw = sympy.expand(fo.flops_step + fo.padding_step + fo.recompute_step[recompute] * passes)
            got = self._hw[key] = (hw, int(self.spec.value(hw)))
        return got

    def _shapes(self, env, segment: str) -> tuple:
        """(elements, dims) of each parameter one rank holds of a segment ("whole": the whole model), numbers."""
        return self.formulas.param_shapes.at(segment, env)

    def _sent_kept(self, alive: int) -> int:
        """How many sent outputs a stage before the last keeps with `alive` micro-batches in flight: all of them
        (torch's fwd_cache, until their backwards), or at most the one whose send is under way where the runtime
        frees the others (Formulas.frees_sent). Compiled or not: a compiled block's backward node stashes only what its
        backward reads, and nothing in the block reads the residual add that ends it (runtime.pipeline._freeable
        checks the stash)."""
        return min(alive, 1) if self.formulas.frees_sent else alive

    def kept_per_micro_batch(self, plan, stage: int | None = None) -> float:
        """Bytes one micro-batch's forward keeps for its backward on one rank: the whole model's, or pipeline
        stage `stage`'s (its layout decided); what tests/test_memory.py counts with saved_tensors_hooks."""
        env = env_of(plan)
        if stage is None:
            return self.formulas.saved.whole[_saved_mode(plan)](env)
        layout = self.stages_for(plan, env)
        return self._stage_bytes(self._saved_parts(env, _saved_mode(plan)), stage, layout, env)

    def _saved_parts(self, env, recompute: str) -> tuple:
        """What one block of each repeat, the prologue, the epilogue and the loss keep per micro-batch at `env`
        (bytes): a stage's is a sum of them (_stage_bytes)."""
        sv = self.formulas.saved
        return sv.block[recompute], sv.prologue(env), sv.epilogue(env) + sv.loss(env)

    def _stage_bytes(self, parts: tuple, k: int, layout: tuple, env):
        """Bytes stage k of `layout` keeps per micro-batch, from `parts` = (one block's per repeat, the prologue's,
        the epilogue's): its blocks', the prologue's on the first stage, the epilogue's on the last."""
        block, first, last = parts
        lo, hi = layout[k]
        return (self.formulas.within(block, lo, hi, env) + (first if k == 0 else 0)
                + (last if k == len(layout) - 1 else 0))

    def _stages(self, plan, env, layout) -> tuple:
        p, v, m = plan.size("pp"), plan.virtual_stages, plan.micro_batches
        per_param = MEM.state_per_param(self.spec.train.precision, plan.data_parallel, zero_ranks(plan),
                                        plan.grad_reduce).total
        fo = self.formulas
        pro, epi = fo.params.prologue(env), fo.params.epilogue(env)
        n_st = len(layout)
        # A stage after the first keeps its input in the schedule's receive buffer (counted there, not here).
        recv = fo.saved.sent(env)
        # what every dp sharding of the same sizes, stages, schedule and recomputation shares (a search costs each)
        key = (env, tuple(layout), _saved_mode(plan), plan.schedule, p, m, v)
        got = self._stage_parts.get(key)
        if got is None:
            parts = self._saved_parts(env, _saved_mode(plan))
            kept = [max(0, self._stage_bytes(parts, k, layout, env) - (recv if k else 0)) for k in range(n_st)]
            if plan.schedule in choices.SPLIT_BACKWARD:  # a pending weight half keeps its output gradients
                wg = fo.saved.wgrad
                parts = (wg.block, wg.prologue(env), wg.epilogue(env))
                wgrad = [self._stage_bytes(parts, k, layout, env) for k in range(n_st)]
            else:
                wgrad = [0] * n_st
            peaks = rank_peaks(plan.schedule, p, m, v, tuple(layout),
                               tuple((int(a), int(b)) for a, b in zip(kept, wgrad)))
            params = [fo.within(fo.params.block, lo, hi, env) + (pro if k == 0 else 0) + (epi if k == n_st - 1 else 0)
                      for k, (lo, hi) in enumerate(layout)]
            got = self._stage_parts[key] = (kept, wgrad, peaks, params)
        kept, wgrad, peaks, params = got
        out = []
        lay = plan.stage_layout
        for k, (lo, hi) in enumerate(layout):
            n = params[k]
            r = lay.rank_of(k)
            alive, pending = peaks[r]
            out.append(Stage(stage=k, rank=r, blocks=(lo, hi), params=int(n), state=n * per_param,
                             activations=kept[k] * alive.get(k, 0), pending_w=wgrad[k] * pending.get(k, 0)))
        return tuple(out)

    def _memory(self, plan, env, layout, stages, params_rank, experts_rank) -> tuple:
        """The predicted peak of each kind of rank (MEM.RankMemory), from the model state's rows
        (compiler/layout/state.py) and the step's working sets: compiler/cost/rank_memory.py."""
        kept = self.formulas.saved.whole[_saved_mode(plan)](env) if not layout else 0  # a micro-batch's, unpiped
        return rank_memory.memory(self, plan, env, layout, stages, params_rank, experts_rank, kept)


def zero_ranks(plan) -> int:
    """The ranks zero1, zero2 and fsdp shard a rank's model state over (runtime.mesh's dense_mesh, runtime.train's
    _zero1_group): dp, or dp × cp under context parallelism (cp shards no weight: every cp rank holds the whole
    model, so torchtitan folds cp into FSDP's mesh); 1 when dp is (the ZeRO stages are then ddp). With ep the
    experts complicate it: the callers fold ep themselves."""
    if plan.size("dp") == 1:
        return 1
    groups = plan.groups
    return groups["dp×cp" if "dp×cp" in groups else "dp"].size


def estimate(spec: S.Spec, plan, traced: T.Traced, pp_rank: int = 0) -> Estimate:
    """The cost of `plan` (a compiler.plan.Plan) from the graphs `traced` after its passes."""
    return CostModel(spec, traced, plan).estimate(plan, pp_rank)


# -- formatting ---------------------------------------------------------------------------------------------------


def formula(expr: sympy.Expr, values: dict | None = None) -> str:
    """A formula as a user reads it: `12·hidden²·layers + ...`; with `values`, the largest term first, else by
    decreasing degree."""
    poly_terms = sympy.Add.make_args(sympy.expand(expr))
    if values:
        subs = {k: sympy.Integer(v) for k, v in values.items()}
        terms = sorted(poly_terms, key=lambda t: (-abs(float(t.xreplace(subs))), str(t)))
    else:
        terms = sorted(poly_terms, key=lambda t: (-sympy.Poly(t).total_degree() if t.free_symbols else 0, str(t)))
    def power(base, e) -> str:
        return str(base) + ("" if e == 1 else "²" if e == 2 else "³" if e == 3 else f"^{e}")

    out = []
    for t in terms:
        coeff, rest = t.as_coeff_Mul()
        num, den = [], []
        for base, e in sorted(rest.as_powers_dict().items(), key=lambda be: str(be[0])):
            if base != 1:
                (num if e > 0 else den).append(power(base, abs(e)))
        if coeff.is_Rational and coeff.q != 1:
            den.insert(0, str(coeff.q))
            coeff = sympy.Integer(coeff.p)
        body = "·".join(num)
        c = "" if coeff == 1 and body else str(coeff)
        text = c + ("·" if c and body else "") + body
        if den:
            text += "/" + (den[0] if len(den) == 1 else "(" + "·".join(den) + ")")
        out.append(text)
    return " + ".join(out).replace("+ -", "- ")
