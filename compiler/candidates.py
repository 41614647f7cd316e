"""Many plans of one model from one trace: decide, check and cost a candidate without re-reading text or tracing.

The graphs the passes produce depend on a plan's *structure* only: whether tp shards (and which layer kinds, with
or without sequence parallelism), whether ep shards experts, whether pp cuts the top level, and under cp its size
and attention variant (the formulas bind cp as a constant: one structure per cp size). Their shapes, FLOPs
and collectives stay sympy expressions of the axis sizes (`tp`, `ep`, `dp`) and the micro-batch size, so one
sharded trace per structure serves every candidate of that structure: the sizes are numbers given at the end.
The same functions decide and lower the plan that `compile` runs (compiler/lower.py: `decide_parallel`, `lower`,
the stage policy through `stages_of`), so a candidate ranked here is the program that would be emitted.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import sympy

from compiler import lower as L
from compiler import plan as P
from compiler import spec as S
from compiler.symbols import size


def structure(plan: P.Plan, cp_bound: bool = False) -> tuple:
    """The plan's structure, as the cost model keys it (compiler.cost.structure: the pass structure, under cp its
    attention variant, the residual stream's precision, the cp degree where `cp_bound`): one lowering and one
    CostModel each."""
    from compiler.cost import structure as of
    return of(plan, cp_bound)


_SPLIT: dict = {}
"""A stage-cost expression -> its compiled function of the axis sizes: structures share them (issue 37)."""


def _lambdify(expr):
    got = _SPLIT.get(expr)
    if got is None:  # not numpy's or scipy's modules: ~0.3 s of imports
        got = _SPLIT[expr] = sympy.lambdify([size(a) for a in P.AXES], expr, modules="math")
    return got


@dataclass
class _Structure:
    plan: P.Plan           # a plan of this structure, with its tp/ep decisions
    sharded: object        # trace.Traced lowered (tp, ep, and the cut when pp > 1), symbolic in sizes
    split: tuple           # lower.split_costs: per-block, first and last FLOPs per sequence, as functions
    blocks: int
    cost: object           # cost.CostModel of this structure
    layouts: dict = field(default_factory=dict)  # (axis sizes, stages, manual layout) -> stage layout
    per_rank: dict = field(default_factory=dict)  # ep -> the ep decisions with each rank's expert count


class Candidates:
    """Plans of `spec`'s model: `decide(plan)` fills the policies' decisions, `requires(plan)` lists what a rule
    rejects, `sharded(plan)` is the graphs the program would run. With `cluster` (compiler/layout/cluster.py), the
    plans are costed on those machines instead of the Spec's (`Spec.on`); `unsharded` (the trace) is the same on
    any cluster."""

    def __init__(self, spec: S.Spec, unsharded=None, cluster=None):
        self.spec = spec if cluster is None else spec.on(cluster)
        self.unsharded = unsharded or L.trace(spec)
        self._structures: dict = {}
        self._keys: dict = {}  # what `structure` reads of a plan -> the structure's key (`_structure`)
        from compiler.cost import binds_cp
        self._cp_bound = binds_cp(spec)  # a `moe` layer's capacity binds the cp degree in the graphs
        self._rules = None  # rules.Checker of this spec, made on first use
        self._grouped = S.node_dispatched(self.spec)  # whether a plan's ep split by node lowers anything

    def _structure(self, plan: P.Plan) -> _Structure:
        plan = P.with_ep_nodes(plan, self.spec, self._grouped)  # the pass reads it: part of the structure
        # what `structure` reads of a plan -> its key: a search asks ~80,000 times for a few dozen structures
        at = (plan.axes, plan.sequence_parallel, plan.tp_layers, plan.context_parallel, plan.fp32_residual,
              plan.ep_nodes)
        key = self._keys.get(at)
        if key is None:
            key = structure(plan, self._cp_bound)
            if self.spec.train.fp8 is not None:
                # FP8's linears are read from the sharded modules, whose features are the lowering plan's tp shard
                # (compiler/cost/fp8.py `chosen`: the filter and the matmul sizes): one structure per tp degree
                key += (plan.size("tp"),)
            self._keys[at] = key
        got = self._structures.get(key)
        if got is None:
            from compiler import cost as C
            decided = L.decide_parallel(self.unsharded, plan)
            sharded = L.lower(self.unsharded, decided)  # the cut is the same for every layout: the Plan says
            split, blocks = (), 0                        # which blocks each stage holds
            if plan.size("pp") > 1:
                blocks = L.blocks_of(sharded, self.spec.value)
                fixed = {k: sympy.Integer(v) for k, v in self.spec.values.items()}  # the Spec binds no axis
                split = tuple(_lambdify(sympy.sympify(f).xreplace(fixed)) for f in L.split_costs(sharded))
            got = _Structure(decided, sharded, split, blocks, C.CostModel(self.spec, sharded, decided))
            self._structures[key] = got
        return got

    @property
    def structures_built(self) -> int:
        """Pass structures lowered and compiled so far (one CostModel each)."""
        return len(self._structures)

    def decide(self, plan: P.Plan) -> P.Plan:
        """`plan` with its tp/ep decisions (shared by every plan of its structure) and its stage layout."""
        plan = P.with_ep_nodes(plan, self.spec, self._grouped)
        st = self._structure(plan)
        ep = plan.size("ep")  # placements are per layer and count; how many experts a rank holds is this plan's
        eps = st.per_rank.get(ep)
        if eps is None:
            eps = st.per_rank[ep] = tuple((cls, tuple(replace(p, per_rank=p.count // ep) for p in ps))
                                          for cls, ps in st.plan.ep)
        if plan.size("pp") == 1:
            return P.evolve(plan, tp=st.plan.tp, ep=eps, stages=())
        sizes = tuple(plan.size(a) for a in P.AXES)
        key = (sizes, plan.pipeline_stages, plan.layout)
        stages = st.layouts.get(key)
        if stages is None:  # many candidates share their stage costs: balance each once
            per_block, first, last = (int(f(*sizes)) for f in st.split)
            stages = st.layouts[key] = L.stages_of(P.evolve(plan, tp=st.plan.tp, ep=eps), st.blocks, per_block,
                                                   first, last)
        return P.evolve(plan, tp=st.plan.tp, ep=eps, stages=stages)

    def requires(self, plan: P.Plan, reuse: bool = False) -> list:
        """What every rule says of `plan` (compiler/rules/: each pass's `requires`, the mesh's), the same as
        `check_plan` (rules.Checker remembers which rule passed which settings); with `reuse`, a refusal's message
        may name another plan of the same settings (rules.REUSABLE: for a search, which prints none)."""
        if self._rules is None:
            from compiler import rules as R
            self._rules = R.Checker(self.spec)
        return self._rules(plan, reuse)

    def passes_in_micro_batches(self, plan: P.Plan) -> bool:
        """rules.Checker.passes_in_micro_batches: `plan` is legal, known without running a rule, where a plan that
        differs from it in the micro-batch count alone passed every rule (`requires` returned nothing)."""
        return self._rules is not None and self._rules.passes_in_micro_batches(plan)

    def estimate(self, plan: P.Plan, pp_rank: int = 0, memory: bool = True):
        """The cost.Estimate of a decided plan (`decide` first), from its structure's cost model (`memory=False`:
        without the memory model, CostModel.estimate)."""
        return self._structure(plan).cost.estimate(plan, pp_rank, memory)

    def cost_model(self, plan: P.Plan):
        """The cost.CostModel of `plan`'s structure (what compiler/cost/step_time.py costs step times from)."""
        return self._structure(plan).cost

    def sharded(self, plan: P.Plan):
        """The lowered graphs (symbolic in sizes) for `plan`'s structure."""
        return self._structure(plan).sharded
