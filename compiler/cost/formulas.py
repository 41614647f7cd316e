"""The cost formulas of one pass structure, as one typed object: what `CostModel` (estimate, memory, ledger) and the
step-time model (step_time.py) read.

`Formulas.build(spec, traced, precision)` reads the graphs after the passes once. Every formula that depends on
the plan is symbolic in the axis sizes and the micro-batch size, and is compiled (`Formula`) to exact arithmetic over
`env = (dp, tp, ep, pp, µb, cp)` (`env_of(plan)`): µb is the sequences per micro-batch on one rank
(plan.micro_batch_size), cp the context-parallel degree, which the graphs' shapes divide the sequence by. The spec's
own sizes (hidden, layers, ...) are bound at build time, so the plans of one structure at every cp degree share one
build. What does not depend on the plan (the model's parameters and FLOPs per step) stays a sympy expression of the
spec's sizes, as the user reads it.

Under pp (`piped`) the trace is cut into segments: a prologue (the layers before the first block: stage 0's), one
block per `repeat` (a stage holding k blocks of a repeat runs its block k times; `Formulas.held` says which a stage
holds, its per-block fields are tuples in the repeats' order), an epilogue (the layers after the last block: the last stage's) and
the loss (also the last stage's). Without pp there is one segment, the whole model (`Segments.whole`). A field's
docstring says its unit, per what (micro-batch, rank, step) and whether it takes `env`.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Generic, Literal, Mapping, NamedTuple, TypeVar

import sympy

from compiler import ops as O
from compiler import trace as T
from compiler.cost import flops as F
from compiler.cost import ledger as L
from compiler.cost import params as PA
from compiler.symbols import MICRO_BATCH, integer_polynomial, size
from runtime import choices

AXES = ("dp", "tp", "ep", "pp")
ARGS = tuple(size(a) for a in AXES) + (MICRO_BATCH, size("cp"))
"""The symbols of `env`, in its order: the axis sizes dp, tp, ep, pp, then µb, then the cp degree."""


def env_of(plan) -> tuple:
    """A plan's `env`: the values of ARGS, in their order (what every compiled formula takes)."""
    return (plan.size("dp"), plan.size("tp"), plan.size("ep"), plan.size("pp"), plan.micro_batch_size,
            plan.size("cp"))
RECOMPUTE = choices.RECOMPUTE
SAVED_MODES = RECOMPUTE + ("selective/compiled",)
"""What a block keeps under each recomputation mode; compiled selective recomputation keeps less (activations)."""

V = TypeVar("V")
Segment = Literal["whole", "block", "prologue", "epilogue"]
"""The name of a traced segment, as Segments' fields name them."""


class Formula:
    """A formula compiled to exact integer arithmetic over env = (dp, tp, ep, pp, µb, cp): numerator and denominator
    polynomials with integer coefficients, so a value is exact however large (an int where it divides, else a
    float). `expr` is the formula in the user's sizes (hidden, layers, ...), for printing (ledger formulas).
    Values are kept per env (a tuple): a search costs many plans of the same axis sizes and micro-batch size."""

    __slots__ = ("expr", "num", "den", "const", "_values")

    def __init__(self, expr: sympy.Expr, sub: Mapping):
        self.expr = expr
        seen = _SEEN.get((expr, id(sub)))
        if seen is not None and seen[0] is sub:  # the same formula of the same sizes: compiled already
            self.const, self.num, self.den, self._values = seen[1]
            return
        e = sympy.sympify(expr).xreplace(sub)
        extra = e.free_symbols - set(ARGS)
        if extra:
            raise ValueError(f"cost formula {expr} has symbols the spec does not bind: {sorted(map(str, extra))}")
        got = _COMPILED.get(e)
        if got is None:  # a search's pass structures share most formulas: each is compiled once
            num, den = sympy.fraction(sympy.together(sympy.expand(e)))
            const = _exact(int(num), int(den)) if not num.free_symbols and not den.free_symbols else None
            got = _COMPILED[e] = (const, integer_polynomial(num, ARGS) or sympy.lambdify(ARGS, num, modules="math"),
                                  integer_polynomial(den, ARGS) or sympy.lambdify(ARGS, den, modules="math"), {})
        # the values too: the same bound formula takes the same value at an env, whichever structure reads it
        self.const, self.num, self.den, self._values = got
        _SEEN[(expr, id(sub))] = (sub, got)  # sub kept: its id is not reused while the entry lives

    def __call__(self, env: tuple):
        if self.const is not None:
            return self.const
        got = self._values.get(env)
        if got is None:
            got = self._values[env] = _exact(self.num(*env), self.den(*env))
        return got


_COMPILED: dict = {}
_SEEN: dict = {}
"""(formula, id of its substitution) -> (the substitution, _COMPILED's entry): a structure's formulas are mostly
those of the structures before it, with the same sizes bound (`_sub`: one substitution per spec)."""
_SUBS: dict = {}
"""id of a spec -> (the spec, its substitution): `_sub`'s, so that equal substitutions are one object."""


def _sub(spec) -> Mapping:
    """The sizes a structure's formulas bind: the spec's (not the axes, µb and cp: ARGS)."""
    got = _SUBS.get(id(spec))
    if got is None or got[0] is not spec:
        if len(_SUBS) > 64:  # a process checking many files (the tests): keep the recent ones
            _SUBS.clear()
            _SEEN.clear()
        got = _SUBS[id(spec)] = (spec, MappingProxyType(
            {k: sympy.Integer(v) for k, v in spec.values.items() if k not in ARGS}))
    return got[1]
"""A bound formula (its spec's sizes substituted) -> (constant or None, numerator, denominator, values per env): what
`Formula` compiles, kept for every Formula of the same expression (they are pure functions of env)."""


def _exact(n, d):
    return n // d if n % d == 0 else n / d


@dataclass(frozen=True)
class Segments(Generic[V]):
    """One value per traced segment. Without pp only `whole` is set; under pp `block`, `prologue` and `epilogue`
    (a formula that has none for a segment leaves it None)."""

    whole: V | None = None
    """The whole model: the top graph and every block times its repeat count (no pp)."""
    block: tuple | None = None
    """One block per `repeat`, in their order (pp): a stage holding k blocks of a repeat counts its block k times
    (Formulas.within)."""
    prologue: V | None = None
    """The layers before the first block (pp): stage 0's."""
    epilogue: V | None = None
    """The layers after the last block (pp): the last stage's."""


@dataclass(frozen=True)
class Saved:
    """Bytes a segment's forward keeps for its backward, per micro-batch, on one rank; each a Formula of env."""

    whole: Mapping[str, Formula] = field(default_factory=dict)
    """The whole model, per recomputation mode (SAVED_MODES), no pp."""
    block: Mapping[str, tuple] = field(default_factory=dict)
    """One block per `repeat` (a tuple in their order), per recomputation mode (SAVED_MODES), pp."""
    prologue: Formula | None = None
    """The prologue, pp."""
    epilogue: Formula | None = None
    """The epilogue, pp."""
    loss: Formula | None = None
    """The loss, pp."""
    logits: Formula | None = None
    """The last stage's output (the logits) torch keeps from a micro-batch's forward to its backward, pp."""
    sent: Formula | None = None
    """One stage output sent to the next stage (the residual stream at a boundary, in its dtype), pp: kept until
    its backward, and the size of one receive buffer."""
    recomputed: Formula | None = None
    """The working set of recomputation: the largest block rematerialised for its backward (one at a time)."""
    wgrad: Segments[Formula] = field(default_factory=Segments)
    """zero-bubble (pp): the output gradients a micro-batch's pending weight half keeps besides its activations, per
    segment (block, prologue, epilogue)."""


@dataclass(frozen=True)
class Units:
    """FSDP's units, parameters (elements) one rank holds of each before gathering: Formulas of env."""

    root: Formula
    """The root unit: every parameter outside the blocks."""
    block: Formula
    """One block (the largest)."""


class SiteFormula(NamedTuple):
    """A collective the passes inserted (ledger.Site) with its elements per occurrence (per micro-batch, unsharded
    along its axis) compiled: a Formula of env."""

    site: L.Site
    elements: Formula


class PartialFormula(NamedTuple):
    """Elements (a Formula of env) of the gradients sequence parallelism leaves partial per tp rank in one segment,
    `where` as ledger.Site.where: ("block", repeat name) or ("top", piece); all-reduced over tp once per step."""

    where: tuple
    elements: Formula


class Count(NamedTuple):
    """How many times a repeated block runs in one forward: `expr` in the spec's sizes (e.g. `layers`), `n` its
    value."""

    expr: sympy.Expr
    n: int


class ParamShape(NamedTuple):
    """One parameter one rank holds: its elements (a Formula of env), its number of dims, and how many times the
    segment holds it (a block's repeat count in the whole model, else 1)."""

    elements: Formula
    dims: int
    count: int


class ParamShapes:
    """Every parameter one rank holds of a segment ("whole", "block", "prologue", "epilogue"), compiled on first
    use (only ZeRO-1's partition reads them: torch places whole tensors)."""

    def __init__(self, traced, sub: Mapping, values):
        self._traced, self._sub, self._values = traced, sub, values
        self._compiled: dict = {}
        self._at: dict = {}

    def of(self, segment: Segment) -> tuple[ParamShape, ...]:
        """The parameters of `segment`, compiled (once)."""
        got = self._compiled.get(segment)
        if got is None:
            traced, out = self._traced, []
            if segment == "whole":
                out += [(e, 1) for e in _param_exprs(traced.top)]
                for gm in traced.blocks.values():
                    out += [(e, gm.meta[T.REPEAT].count) for e in _param_exprs(gm)]
            else:
                out += [(e, 1) for e in _param_exprs(_segment_graph(traced, segment))]
            got = self._compiled[segment] = tuple(ParamShape(Formula(n, self._sub), nd, int(self._values(count)))
                                                  for (n, nd), count in out)
        return got

    def at(self, segment: Segment, env: tuple) -> tuple:
        """(elements, dims) of each parameter one rank holds of `segment` at env, numbers, each repeated as many
        times as the segment holds it."""
        key = (segment, env)
        got = self._at.get(key)
        if got is None:
            out = []
            for p in self.of(segment):
                out += [(int(p.elements(env)), p.dims)] * p.count
            got = self._at[key] = tuple(out)
        return got


    def staged(self, segment: Segment, env: tuple) -> tuple:
        """(name, elements, rows, dims, sharded) of each parameter one rank holds of `segment` at env, numbers,
        repeated as many times as the segment holds it; `sharded`: split over an axis (tp, ep) of size > 1 at env
        (a runtime.tensor_parallel.Shards entry). What a checkpoint's staging copy is counted from
        (memory.checkpoint_staging: FSDP2 pads its pieces by rows; under tp it gathers the sharded ones over dp)."""
        key = ("staged", segment, env)
        got = self._at.get(key)
        if got is None:
            compiled = self._compiled.get(key[:2])
            if compiled is None:
                traced, gms = self._traced, []
                if segment == "whole":
                    gms = [(traced.top, 1)] + [(gm, gm.meta[T.REPEAT].count) for gm in traced.blocks.values()]
                else:
                    gms = [(_segment_graph(traced, segment), 1)]
                split = [(AXES.index(a), size(a)) for a in ("tp", "ep")]
                compiled = self._compiled[key[:2]] = tuple(
                    (name, Formula(sympy.Mul(*shape), self._sub), Formula(shape[0] if shape else 1, self._sub),
                     len(shape), tuple(i for i, sym in split if sym in sympy.sympify(sympy.Mul(*shape)).free_symbols),
                     int(self._values(count)))
                    for gm, count in gms for name, shape in gm.meta[T.PARAM_SHAPES].items())
            out = []
            for name, elements, rows, dims, axes, count in compiled:
                out += [(name, int(elements(env)), int(rows(env)), dims, any(env[i] > 1 for i in axes))] * count
            got = self._at[key] = tuple(out)
        return got


def _segment_graph(traced, segment):
    """The graph of a pp segment: ("block", i) the i-th repeat's block, "prologue", "epilogue"."""
    if isinstance(segment, tuple):
        return list(traced.blocks.values())[segment[1]]
    return traced.top.meta[T.PROLOGUE if segment == "prologue" else T.EPILOGUE]


def _param_exprs(gm) -> list:
    return [(sympy.Mul(*shape), len(shape)) for shape in gm.meta[T.PARAM_SHAPES].values()]


@dataclass(frozen=True, kw_only=True)
class Formulas:
    """Every cost formula of one pass structure (see the module's docstring for `env` and the segments)."""

    piped: bool
    """Whether the trace is cut into pipeline segments (pp > 1): then the Segments fields are per segment."""
    sub: Mapping
    """The spec's sizes (not the axis sizes nor µb) bound into every Formula."""
    counts: Mapping[str, Count]
    """Per repeated block's name: how many times it runs in one forward."""
    edges: tuple = ()
    """(repeat name, first block, end block) of each `repeat` in order, under pp: a stage's blocks are numbered across
    the repeats (trace.repeat_edges)."""

    # -- the model, per step: sympy, no env ----------------------------------------------------------------------
    model_params: sympy.Expr
    """Parameters (elements) of the whole model, unsharded, in the spec's sizes."""
    model_params_n: int
    """model_params' value."""
    flops_fwd: sympy.Expr
    """FLOPs of one forward of one micro-batch of µb sequences, whole model (a formula of µb and the spec's sizes)."""
    flops_step: sympy.Expr
    """Model FLOPs of one step: forward + backward over the global batch, whole model, no recomputation."""
    flops_step_n: int
    """flops_step's value."""
    padding_step: sympy.Expr
    """Hardware FLOPs per step the experts' empty slots add (not model FLOPs), whole model."""
    recompute_step: Mapping[str, sympy.Expr]
    """Per recomputation mode (RECOMPUTE): the extra forward FLOPs recomputation adds per step, whole model (full:
    every block's forward; selective: the attention cores); "none" is 0."""
    tokens_step: int
    """Tokens per step: global batch × sequence length."""

    # -- per rank: Formulas of env ---------------------------------------------------------------------------------
    params: Segments[Formula]
    """Parameters (elements) one rank holds of each segment after the passes (tp shards at their size, experts at
    their ep share), before data-parallel sharding."""
    experts: Segments[Formula]
    """Of `params`, the expert weights (elements, sharded over ep): whole, or block and prologue under pp (the
    epilogue holds none)."""
    flops: Segments[Formula]
    """Forward + backward FLOPs of one micro-batch on one rank per segment; under pp `epilogue` includes the loss."""
    recompute: Mapping[str, Formula]
    """Per recomputation mode (RECOMPUTE): recomputation's extra forward FLOPs per micro-batch on one rank, for one
    block of each `repeat` under pp (a tuple: Formulas.within sums a stage's), for every block without."""
    units: Units
    """FSDP's units (elements per rank)."""
    send: Formula | None
    """Elements of one pipeline send: one micro-batch's residual stream at a stage boundary (sequence-sharded under
    SP), per micro-batch; None without pp."""
    send_expr: sympy.Expr | None
    """`send`'s formula in µb and the spec's sizes, for printing."""
    frees_sent: bool
    """Whether the runtime frees a sent stage output once its send completed (runtime.pipeline._freeable: the
    block ends with a residual add, whose backward reads no data), so a stage keeps only the one under way."""
    memory_of: Callable[[], tuple] = field(compare=False, repr=False)
    """() -> (saved, loss, backward): the memory model's own formulas, compiled on first use (the properties of
    those names). A search bounds and times the plans of every pass structure and asks the memory of few: the 175B
    search's tp 3 and wide cp structures are never costed for memory, and a structure without pp compiles its
    activations over the whole model, four recomputation modes of it."""

    @functools.cached_property
    def _memory_formulas(self) -> tuple:
        return self.memory_of()

    @property
    def saved(self) -> "Saved":
        """Bytes kept for backward per micro-batch on one rank (see Saved)."""
        return self._memory_formulas[0]

    @property
    def loss(self) -> tuple:
        """Bytes of each moment of the loss's working set (the logits and their gradients), per micro-batch, on the
        rank that runs the loss: the largest is the loss's peak (Formulas of env)."""
        return self._memory_formulas[1]

    @property
    def backward(self) -> "Segments":
        """Bytes of each moment of a segment's backward working set (the gradients in flight), per micro-batch, per
        rank: the largest over the segments a rank runs is its backward's peak (a tuple of Formulas per segment)."""
        return self._memory_formulas[2]

    sites: tuple[SiteFormula, ...]
    """Every collective the passes inserted, in graph order, with its elements per occurrence."""
    partial: tuple[PartialFormula, ...]
    """Gradients (elements per rank) left partial over tp by sequence parallelism, per segment."""
    param_shapes: ParamShapes = field(compare=False)
    """Every parameter one rank holds per segment (ZeRO-1's partition), compiled on first use."""
    _held: dict = field(default_factory=dict, compare=False, repr=False)
    """(lo, hi) -> `held(lo, hi)`: a search asks for the same stages' blocks a million times."""
    _at: dict = field(default_factory=dict, compare=False, repr=False)
    """(id of a per-repeat tuple, env) -> its values there (`within`)."""

    def held(self, lo: int, hi: int) -> tuple:
        """(repeat index, blocks) of each repeat with blocks in the global range [lo, hi) (a stage's), pp."""
        got = self._held.get((lo, hi))
        if got is None:
            got = self._held[(lo, hi)] = tuple((i, min(hi, b) - max(lo, a)) for i, (_, a, b) in enumerate(self.edges)
                                               if max(lo, a) < min(hi, b))
        return got

    def within(self, per_repeat: tuple, lo: int, hi: int, env: tuple):
        """The sum over the blocks [lo, hi) of a per-block quantity (one Formula per repeat), at env, pp. Each
        repeat's value at env is kept (`_at`): a layout's stages ask for the same ones again and again."""
        at = (id(per_repeat), env)
        got = self._at.get(at)
        if got is None:
            got = self._at[at] = (tuple(f(env) for f in per_repeat), per_repeat)  # held: its id is not reused
        values = got[0]
        return sum(k * values[i] for i, k in self.held(lo, hi))

    @classmethod
    def build(cls, spec, traced, precision: str) -> "Formulas":
        """Read the graphs `traced` (after the passes) of `spec` once and compile every formula; `precision`: the
        activations' precision key (activations.precision_key: the train section's and the plan's fp32 residual).
        The graphs keep the cp degree as the symbol `cp`: an argument of every formula (env's last)."""
        return _build(spec, traced, precision)


def _recompute_step(traced, gb) -> dict:
    """Recomputation's extra forward, per step: full re-runs each block's forward, selective its attention cores
    (its other recomputed ops, norms and elementwise, are not matmuls: 0 by the FLOPs convention)."""
    out = {"none": sympy.Integer(0)}
    for mode in ("selective", "full"):
        per = sum((c * F.recomputed_forward(g, mode) for c, g in
                   ((gm.meta[T.REPEAT].count, gm) for gm in traced.blocks.values())), sympy.Integer(0))
        # the whole model's: the sharded graphs' shapes at axis sizes 1 are the unsharded ones (cp's too: a cp
        # rank's S/cp queries against its keys are at cp = 1 the whole sequence's, as flops_step counts them)
        out[mode] = sympy.expand(per.xreplace({MICRO_BATCH: gb, size("cp"): 1, **{size(a): 1 for a in AXES}}))
    return out


def _compiled(segs: Segments, fn) -> Segments:
    """Each segment's expression as a Formula (`fn`)."""
    return Segments(whole=None if segs.whole is None else fn(segs.whole),
                    block=None if segs.block is None else tuple(fn(v) for v in segs.block),
                    prologue=None if segs.prologue is None else fn(segs.prologue),
                    epilogue=None if segs.epilogue is None else fn(segs.epilogue))


def _moments(segs: Segments, fn) -> Segments:
    """Each segment's working sets (a list of expressions, one per moment), deduplicated, as Formulas."""
    def of(v):
        return None if v is None else tuple(fn(e) for e in set(v))
    return Segments(whole=of(segs.whole), block=None if segs.block is None else tuple(of(v) for v in segs.block),
                    prologue=of(segs.prologue), epilogue=of(segs.epilogue))


def _build(spec, traced, precision: str) -> Formulas:
    from compiler.cost import activations as A
    sub = _sub(spec)

    def fn(expr) -> Formula:
        return Formula(expr, sub)

    top = traced.top
    piped = T.PROLOGUE in top.meta  # cut by passes.pipeline_split
    model_params = PA.model_params(traced)
    flops_fwd = traced.model_flops_fwd
    bwd = traced.model_flops_bwd if traced.model_flops_bwd != 0 else F.graph_backward(top, traced.repeats())
    gb = spec.train.global_batch
    flops_step = sympy.expand((flops_fwd + bwd).xreplace({MICRO_BATCH: gb}))
    recompute_step = _recompute_step(traced, gb)
    sites = tuple(SiteFormula(site, fn(site.elements)) for site in L.sites(traced))
    partial = tuple(PartialFormula(k, fn(v)) for k, v in L.partial_grads(traced).items())
    counts = {name: Count(gm.meta[T.REPEAT].count, int(spec.value(gm.meta[T.REPEAT].count)))
              for name, gm in traced.blocks.items()}

    prec = precision
    device = "cpu" if spec.cluster.device.kind == "cpu" else "cuda"
    blocks = list(traced.blocks.values())

    def recomputed():  # recomputation's working set: the block whose backward runs, rematerialised (one at a time)
        return fn(sympy.Max(*[A.saved_bytes(g, prec, device) for g in blocks]) if blocks else sympy.Integer(0))
    if piped:
        gm = blocks[0]
        pro, epi, loss = top.meta[T.PROLOGUE], top.meta[T.EPILOGUE], top.meta[T.LOSS]
        seg_params = Segments(block=tuple(PA.segment_params(g) for g in blocks), prologue=PA.segment_params(pro),
                              epilogue=PA.segment_params(epi))
        seg_experts = Segments(block=tuple(PA.segment_expert_params(g) for g in blocks),
                               prologue=PA.segment_expert_params(top, mine=pro))
        fb = {k: F.graph_forward(g) + F.graph_backward(g) for k, g in (("prologue", pro), ("epilogue", epi),
                                                                     ("loss", loss))}
        flops = Segments(block=tuple(fn(F.graph_forward(g) + F.graph_backward(g)) for g in blocks),
                         prologue=fn(fb["prologue"]), epilogue=fn(fb["epilogue"] + fb["loss"]))
        send_expr = sympy.expand(sympy.Mul(*gm.meta[T.INPUTS]["x"]))
        # What torch.distributed.pipelining keeps besides: each micro-batch's stage output until its backward
        # (every stage but the last: fwd_cache; runtime.pipeline.InFlight waits on its send there), and on the
        # last stage the output (the logits) of each micro-batch in flight, until its backward (the runtime asks
        # for no outputs back, so none is kept longer; measured with runtime/memory.py's tracker)
        out = next(n for n in epi.graph.nodes if n.op == "output").args[0]
        # runtime.pipeline.InFlight frees a sent output once its send completed when it is a residual add (its
        # backward reads no data; runtime.pipeline._freeable): the block's last op, which ends every stage
        # before the last (whichever repeat's block ends it: each must).
        def freed(g) -> bool:
            last = next(n for n in g.graph.nodes if n.op == "output").args[0]
            last = last[0] if isinstance(last, (tuple, list)) and len(last) == 1 else last
            op = O.find(last, g) if getattr(last, "op", None) == "call_function" else None
            return op is not None and op.freed_when_sent
        frees_sent = all(freed(g) for g in blocks)

        def saved():
            return Saved(
                block=MappingProxyType({mode: tuple(fn(A.block_saved_bytes(g, prec, device, mode)) for g in blocks)
                                        for mode in SAVED_MODES}),
                prologue=fn(A.saved_bytes(pro, prec, device)), epilogue=fn(A.saved_bytes(epi, prec, device)),
                loss=fn(A.saved_bytes(loss, prec, device)),
                logits=fn(A._numel(out.meta[T.SHAPE]) * A.width_of(out, prec)),
                sent=fn(send_expr * A.widths(prec)["res"]), recomputed=recomputed(),
                # zero-bubble: what a micro-batch's pending weight half keeps besides its activations
                wgrad=Segments(block=tuple(fn(A.weight_output_grads(g, prec)) for g in blocks),
                               prologue=fn(A.weight_output_grads(pro, prec)),
                               epilogue=fn(A.weight_output_grads(epi, prec))))

        def backward_ws():
            return Segments(block=tuple(A.backward_working_set(g, prec) for g in blocks),
                            prologue=A.backward_working_set(pro, prec), epilogue=A.backward_working_set(epi, prec))
        block_params = seg_params.block
        units = Units(root=fn(seg_params.prologue + seg_params.epilogue),
                      block=fn(block_params[0] if len(block_params) == 1 else sympy.Max(*block_params)))
        loss_graph = loss
        recompute = {mode: tuple(fn(F.recomputed_forward(g, mode)) for g in blocks) for mode in RECOMPUTE}  # a block
        edges = T.repeat_edges(traced, spec.value)
    else:
        total = PA.segment_params(top)
        experts = PA.segment_expert_params(top)
        for name, g in traced.blocks.items():
            total += counts[name].expr * PA.segment_params(g)
            experts += counts[name].expr * PA.segment_expert_params(g)
        seg_params = Segments(whole=sympy.expand(total))
        # each repeat's block too: FSDP with ep gathers a block's experts over dp alone (CostModel._memory)
        seg_experts = Segments(whole=sympy.expand(experts),
                               block=tuple(PA.segment_expert_params(g) for g in blocks))
        flops = Segments(whole=fn(F.graph_forward(top) + F.graph_backward(top, traced.repeats())))
        send_expr, frees_sent = None, False

        def saved():
            return Saved(whole=MappingProxyType({mode: fn(A.saved_bytes(top, prec, device, traced.repeats(), mode))
                                                 for mode in SAVED_MODES}), recomputed=recomputed())

        def backward_ws():
            return Segments(whole=A.backward_working_set(top, prec)
                            + [e for g in blocks for e in A.backward_working_set(g, prec)])
        block_params = [PA.segment_params(g) for g in blocks]
        units = Units(root=fn(PA.segment_params(top)),
                      block=fn(block_params[0] if len(block_params) == 1 else sympy.Max(*block_params)
                               if block_params else 0))
        loss_graph = top
        recompute = {mode: fn(sum((gm.meta[T.REPEAT].count * F.recomputed_forward(gm, mode) for gm in blocks),
                                  sympy.Integer(0)))
                     for mode in RECOMPUTE}  # every block
        edges = ()

    return Formulas(
        piped=piped, sub=sub, counts=MappingProxyType(counts), edges=edges,
        model_params=model_params, model_params_n=spec.value(model_params), flops_fwd=flops_fwd,
        flops_step=flops_step, flops_step_n=spec.value(flops_step),
        # the experts' empty slots (trace_model): hardware FLOPs, not model FLOPs
        padding_step=sympy.expand(traced.padding_flops.xreplace({MICRO_BATCH: gb})),
        recompute_step=MappingProxyType(recompute_step), tokens_step=spec.value(gb * spec.train.seq_len),
        params=_compiled(seg_params, fn), experts=_compiled(seg_experts, fn),
        flops=flops, recompute=MappingProxyType(recompute), units=units,
        send=fn(send_expr) if piped else None, send_expr=send_expr, frees_sent=frees_sent,
        memory_of=lambda: (saved(), tuple(fn(e) for e in A.loss_working_set(loss_graph, prec)),
                           _moments(backward_ws(), fn)),
        sites=sites, partial=partial, param_shapes=ParamShapes(traced, sub, spec.value))


# -- recomputation: what a plan re-runs (the FLOPs, the ledger, the memory and step-time models read these) ----------


def recompute_mode(plan) -> str:
    """A plan's `recompute` (none where it has no such setting)."""
    return getattr(plan, "recompute", "none")


def saved_mode(plan) -> str:
    """The key of what a block keeps (SAVED_MODES): the recomputation, and for selective whether it is compiled."""
    mode = recompute_mode(plan)
    return "selective/compiled" if mode == "selective" and getattr(plan, "compiles", False) else mode


def reruns(plan, site) -> int:
    """How many times a forward collective `site` of a block runs again in its backward per micro-batch: every one
    before the block's last saving op under full recomputation (the block's forward re-run), the all-gathers under
    selective recomputation (runtime.recompute.RECOMPUTE: a sequence-parallel input gathered again, not kept)."""
    if site.direction != "forward" or site.where[0] != "block":
        return 0
    mode = recompute_mode(plan)
    if mode == "full" and site.rerun:
        return recompute_passes(plan)
    return 1 if mode == "selective" and site.op == "all_gather" else 0


def recompute_passes(plan) -> int:
    """How many times a recomputed block's forward runs again per micro-batch: twice under zero-bubble's split
    backward with full recomputation (measured by counting the block's forward calls), else once. Public: the
    FLOPs, the ledger (`reruns`) and the step-time model (step_time.py) count the same re-runs."""
    return 2 if plan.schedule == "zero-bubble" and plan.size("pp") > 1 and recompute_mode(plan) == "full" else 1
