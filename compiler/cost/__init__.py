"""The cost model: parameters, FLOPs, memory per rank and the communication ledger, as sympy formulas.

Every formula is derived from what the plan stores and sends, node by node or tensor by tensor; the published
formulas in ../shared/reference/ are what the tests check these against, not what is computed here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from compiler import spec as S
from compiler.diagnostics import Span
from compiler.lazy import lazy
from compiler.symbols import MICRO_BATCH, size

M = lazy("compiler.model")  # both import torch: loaded on first use, so compiler.cost.devices (read by the checker)
T = lazy("compiler.trace")  # and the front door stay torch-free

BYTES = {"fp32": 4, "bf16": 2}


@dataclass(frozen=True, kw_only=True)
class Collective:
    """One collective the plan issues: what, over which axis, how much, and why."""

    op: str              # all_reduce | all_gather | reduce_scatter | all_to_all | send_recv
    axis: str
    elements: sympy.Expr  # elements of the full (unsharded along `axis`) tensor, per occurrence
    dtype_bytes: int
    per_step: sympy.Expr  # occurrences per optimizer step on one rank
    span: Span | None
    reason: str
    direction: str = "step"  # "forward", "backward", or "step" (once per optimizer step)
    measured: bool = True    # issued through runtime.collectives, so the runtime can count its bytes

    def bytes_per_step(self) -> sympy.Expr:
        return sympy.expand(self.elements * self.dtype_bytes * self.per_step)

    def wire_elements(self, n) -> sympy.Expr:
        """Elements each rank sends per occurrence with ring algorithms over `n` ranks: an all-reduce is a
        reduce-scatter then an all-gather, 2(n-1)/n of the tensor; either half alone (n-1)/n (Patarasuk & Yuan)."""
        factor = {"all_reduce": 2 * (n - 1) / sympy.Integer(n)}.get(self.op, (n - 1) / sympy.Integer(n))
        return self.elements * factor


@dataclass
class Ledger:
    entries: list = field(default_factory=list)

    def add(self, c: Collective) -> None:
        self.entries.append(c)


@dataclass(frozen=True)
class ModelState:
    """Bytes per rank of parameters, gradients and optimizer states."""

    params: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def zero_model_state(psi: float, nd: int, stage: int, *, param_bytes: int = 2, grad_bytes: int = 2,
                     k: int = 12) -> ModelState:
    """Rajbhandari et al. 2020 (ZeRO), from its definitions: every replica holds `param_bytes`·Ψ of weights,
    `grad_bytes`·Ψ of gradients and K·Ψ of optimizer state; stage 1 shards the optimizer state over Nd ranks,
    stage 2 also the gradients, stage 3 also the weights."""
    return ModelState(params=param_bytes * psi / (nd if stage >= 3 else 1),
                      grads=grad_bytes * psi / (nd if stage >= 2 else 1),
                      optimizer=k * psi / (nd if stage >= 1 else 1))


@dataclass(frozen=True)
class Costs:
    params: sympy.Expr            # formula of the spec's sizes
    params_n: int
    flops_fwd: sympy.Expr          # one forward pass of one micro-batch of b sequences
    flops_step: sympy.Expr         # fwd + bwd over the global batch (model FLOPs, no recomputation)
    flops_step_n: int
    flops_rank_step_n: int         # what one rank computes per step
    model_state: ModelState        # per rank
    ledger: Ledger
    tokens_step: int
    params_local: sympy.Expr      # parameters held by one rank (after tp sharding, before dp sharding)


def batch_ranks(spec: S.Spec) -> sympy.Expr:
    """dp × ep as symbols (those the mesh declares): the ranks the global batch is split over."""
    axes = dict(spec.mesh.axes)
    return sympy.Mul(*[size(a) for a in ("dp", "ep") if a in axes])


def moe_held_elements(spec: S.Spec, layer: S.MoE, b) -> tuple[int, int]:
    """What one `moe` layer holds for one micro-batch of `b` sequences on one rank, in elements: each padded buffer
    (the experts' input, or their output: E·b·C·hidden), and the experts' hidden activations kept for backward
    (E·b·C·ffn, twice for GELU: before and after it; three times for SwiGLU: up, gate and their product)."""
    slots = spec.value(layer.experts) * b * spec.value(layer.capacity)
    hidden = slots * spec.value(layer.ffn) * (3 if layer.act == "swiglu" else 2)
    return slots * spec.value(layer.hidden), hidden


def _rank0_blocks(top, pp: int) -> int:
    """Blocks pp rank 0 holds: those of every stage s with s % pp == 0 (with interleaving, several)."""
    from compiler.passes import pipeline_split as P
    return sum(hi - lo for s, (lo, hi) in enumerate(top.meta[P.STAGES]) if s % pp == 0)


def expert_params_per_rank(traced: T.Traced, pp: int = 1) -> sympy.Expr:
    """Expert weights one rank holds (sharded over ep; under pp, a rank holding the first stage)."""
    from compiler.passes import pipeline_split as P
    top = traced.top
    mine = top.meta[P.PROLOGUE] if P.STAGES in top.meta else top  # top-level layers the (first) stage runs
    total = sum((sympy.Mul(*top.meta[T.PARAM_SHAPES][p]) for p in top.meta.get(T.EP_SHARDS, {})
                 if hasattr(mine, p.split(".")[0])), sympy.Integer(0))
    for name, gm in traced.blocks.items():
        shapes = gm.meta[T.PARAM_SHAPES]
        n = sum((sympy.Mul(*shapes[p]) for p in gm.meta.get(T.EP_SHARDS, {})), sympy.Integer(0))
        if P.STAGES in traced.top.meta:
            total += _rank0_blocks(traced.top, pp) * n
        else:
            total += gm.meta[T.REPEAT].count * n
    return sympy.expand(total)


def params_per_rank(traced: T.Traced, pp: int = 1) -> sympy.Expr:
    """Parameters one rank holds once the passes have run (tp shards counted at their local size; under pp, a
    rank holding the first stage, and with interleaving its other stages too)."""
    from compiler.passes import pipeline_split as P
    top = traced.top
    if P.STAGES in top.meta:
        (gm,) = traced.blocks.values()
        block = sum((sympy.Mul(*s) for s in gm.meta[T.PARAM_SHAPES].values()), sympy.Integer(0))
        first = sum((sympy.Mul(*s) for s in top.meta[P.PROLOGUE].meta[T.PARAM_SHAPES].values()), sympy.Integer(0))
        return sympy.expand(first + _rank0_blocks(top, pp) * block)
    total = sympy.Integer(0)
    for name, gm in [("", traced.top)] + list(traced.blocks.items()):
        n = sum((sympy.Mul(*s) for s in gm.meta[T.PARAM_SHAPES].values()), sympy.Integer(0))
        total += n * (gm.meta[T.REPEAT].count if name else 1)
    return sympy.expand(total)


def _rank_flops_fwd(spec: S.Spec, traced: T.Traced) -> sympy.Expr:
    """Forward FLOPs of one micro-batch on one rank: the graphs after the passes (tp shards them, ep gives each
    rank its experts' share); under pp, the busiest pp rank: the blocks of its stages, plus the embedding on the
    first stage and the head and loss on the last."""
    from compiler.passes import pipeline_split as P
    top = traced.top
    if P.STAGES not in top.meta:
        return T.graph_flops(top)
    (gm,) = traced.blocks.values()
    stages = top.meta[P.STAGES]
    block = T.graph_flops(gm)
    per_stage = [(hi - lo) * block for lo, hi in stages]
    per_stage[0] += T.graph_flops(top.meta[P.PROLOGUE])
    per_stage[-1] += T.graph_flops(top.meta[P.EPILOGUE]) + T.graph_flops(top.meta[P.LOSS])
    pp = spec.mesh.size("pp")
    per_rank = [sum(per_stage[r::pp], sympy.Integer(0)) for r in range(pp)]
    one = {MICRO_BATCH: sympy.Integer(1)}
    return max(per_rank, key=lambda f: spec.value(f.xreplace(one)))


def costs(spec: S.Spec, traced: T.Traced) -> Costs:
    params = M.symbolic_param_count(traced.model)
    fwd = traced.model_flops_fwd
    # Backward of a matmul is two matmuls of the same size (input and weight gradients): 2× forward.
    step = sympy.expand(3 * fwd.xreplace({MICRO_BATCH: spec.train.global_batch}))
    # One rank: its graphs' FLOPs (tp shards them) over its share of the batch.
    m = spec.plan.micro_batches
    rank_step = sympy.expand(3 * m * _rank_flops_fwd(spec, traced).xreplace(
        {MICRO_BATCH: spec.train.global_batch / (spec.mesh.batch_ranks * m)}))
    psi = spec.value(params)
    local = params_per_rank(traced, spec.mesh.size("pp"))
    dp = spec.mesh.size("dp")
    # What our runtime holds: fp32 master weights and gradients (bf16 runs autocast them), AdamW's two moments.
    stage = 3 if spec.plan.data_parallel == "fsdp" else 0
    state = zero_model_state(spec.value(local), dp, stage, param_bytes=4, grad_bytes=4, k=8)
    return Costs(params=params, params_n=psi, flops_fwd=fwd, flops_step=step, flops_step_n=spec.value(step),
                 flops_rank_step_n=spec.value(rank_step),
                 model_state=state, ledger=ledger(spec, traced, local),
                 tokens_step=spec.value(spec.train.global_batch * spec.train.seq_len), params_local=local)


def ledger(spec: S.Spec, traced: T.Traced, params: sympy.Expr, pp_rank: int = 0) -> Ledger:
    """The collectives of one optimizer step on one rank: those the passes inserted, then data parallelism's.
    Under pp the rank is pp rank `pp_rank` (0 by default: global rank 0, whose bytes the runtime's counter
    writes), with every stage it holds."""
    led = Ledger()
    _pass_collectives(spec, traced, led, pp_rank)
    _pipeline_transfers(spec, traced, led, pp_rank)
    dp, ep = spec.mesh.size("dp"), spec.mesh.size("ep")
    span = spec.mesh.axis_spans.get("dp")
    experts = expert_params_per_rank(traced, spec.mesh.size("pp"))
    # Pipeline stages are not wrapped in DDP: one coalesced all-reduce follows the pipeline step.
    how = "one coalesced all-reduce after the pipeline step" if spec.mesh.size("pp") > 1 else "DDP, bucketed"
    if ep > 1:
        led.add(Collective(op="all_reduce", axis="dp×ep", elements=sympy.expand(params - experts), dtype_bytes=4,
                           per_step=sympy.Integer(1), span=spec.mesh.axis_spans["ep"],
                           reason=f"average the dense gradients over every batch shard, dp × ep ({how})",
                           measured=False))
        if dp > 1:
            led.add(Collective(op="all_reduce", axis="dp", elements=experts, dtype_bytes=4,
                               per_step=sympy.Integer(1), span=span,
                               reason="sum the expert gradients over the dp ranks holding the same experts",
                               measured=False))
    elif dp > 1:
        if spec.plan.data_parallel == "ddp":
            led.add(Collective(op="all_reduce", axis="dp", elements=params, dtype_bytes=4, per_step=sympy.Integer(1),
                               span=span, reason=f"average the gradients of the dp replicas ({how})",
                               measured=False))
        else:
            led.add(Collective(op="all_gather", axis="dp", elements=params, dtype_bytes=4,
                               per_step=sympy.Integer(2 * spec.plan.micro_batches), span=span,
                               reason="FSDP: gather each block's weights for forward and again for backward, every "
                                      "micro-batch", measured=False))
            led.add(Collective(op="reduce_scatter", axis="dp", elements=params, dtype_bytes=4,
                               per_step=sympy.Integer(1), span=span,
                               reason="FSDP: reduce and shard the gradients", measured=False))
    return led


def _rank_view(spec: S.Spec, traced: T.Traced, pp_rank: int):
    """Under pp, what pp rank `pp_rank` runs over all the stages it holds (r, r + pp, ...: several under
    interleaving): its block count, and which top-level nodes (by name) are its own (the prologue on the rank of
    stage 0, the epilogue and loss on the rank of the last stage). Without pp: (None, None), everything."""
    from compiler.passes import pipeline_split as P
    top = traced.top
    if P.STAGES not in top.meta:
        return None, None
    stages = top.meta[P.STAGES]
    pp = spec.mesh.size("pp")
    mine = range(pp_rank, len(stages), pp)
    blocks = sum(stages[k][1] - stages[k][0] for k in mine)
    own = set()
    if 0 in mine:
        own |= {n.name for n in top.meta[P.PROLOGUE].graph.nodes}
    if len(stages) - 1 in mine:
        own |= {n.name for n in top.meta[P.EPILOGUE].graph.nodes} | {n.name for n in top.meta[P.LOSS].graph.nodes}
    return blocks, own


def _pass_collectives(spec: S.Spec, traced: T.Traced, led: Ledger, pp_rank: int = 0) -> None:
    """One ledger entry per direction of each collective call the passes inserted into the graphs, for one rank
    (under pp: pp rank `pp_rank`, every stage it holds)."""
    m = spec.plan.micro_batches
    # Sequences in one micro-batch on one rank.
    b_local = spec.train.global_batch / (batch_ranks(spec) * m)
    act_bytes = BYTES[spec.train.precision]
    stage_blocks, own = _rank_view(spec, traced, pp_rank)
    for name, gm in list(traced.blocks.items()) + [("", traced.top)]:
        times = m * ((gm.meta[T.REPEAT].count if stage_blocks is None else stage_blocks) if name else 1)
        for node in gm.graph.nodes:
            note = node.meta.get(T.COLLECTIVE)
            if note is None or (not name and own is not None and node.name not in own):
                continue
            tensor = {"input": node.args[0], "output": node, "targets": node.args[1]}[note.payload]
            elements = note.count * sympy.Mul(*tensor.meta[T.SHAPE]).xreplace({MICRO_BATCH: b_local})
            # A gradient has its tensor's dtype: an fp32 tensor (the residual stream, a norm's output) moves 4 bytes
            # per element also under bf16 autocast.
            fp32 = note.dtype == "fp32" or tensor.meta.get(T.DTYPE) == "fp32"
            for direction, op in (("forward", note.forward), ("backward", note.backward)):
                if op:
                    led.add(Collective(op=op, axis=note.axis, elements=sympy.expand(elements),
                                       dtype_bytes=4 if fp32 else act_bytes, per_step=times,
                                       span=node.meta.get(T.SPAN), reason=note.reason, direction=direction))
    partial = sympy.Integer(0)
    for name, gm in [("", traced.top)] + list(traced.blocks.items()):
        shapes = gm.meta[T.PARAM_SHAPES]
        mine = [p for p in gm.meta.get(T.TP_PARTIAL_GRADS, ())
                if name or own is None or any(n.startswith(p.split(".")[0]) for n in own)]
        n = sum((sympy.Mul(*shapes[p]) for p in mine), sympy.Integer(0))
        partial += n * ((gm.meta[T.REPEAT].count if stage_blocks is None else stage_blocks) if name else 1)
    if partial != 0:
        if spec.plan.data_parallel == "fsdp" and spec.mesh.size("dp") > 1:
            partial = partial / size("dp")  # FSDP holds 1/dp of each gradient: only that shard is summed over tp
        led.add(Collective(op="all_reduce", axis="tp", elements=sympy.expand(partial), dtype_bytes=4,
                           per_step=sympy.Integer(1), span=spec.mesh.axis_spans.get("tp"),
                           reason="sequence parallelism: each rank's norm and row-bias gradients cover only its "
                                  "sequence chunk", direction="step"))


def _pipeline_transfers(spec: S.Spec, traced: T.Traced, led: Ledger, pp_rank: int = 0) -> None:
    """Stage boundaries of the stages a rank holds (pp rank r holds stages r, r + pp, ...: several under
    interleaving): the residual stream of each micro-batch goes forward, its gradient backward (b·s·h elements;
    sequence-sharded under SP), carried by torch.distributed.pipelining's send/recv, which the runtime counts."""
    from compiler.passes import pipeline_split as P
    if P.STAGES not in traced.top.meta:
        return
    (gm,) = traced.blocks.values()
    x = gm.meta[T.INPUTS]["x"]
    elements = sympy.expand(sympy.Mul(*x).xreplace({MICRO_BATCH: spec.train.global_batch /
                                                    (batch_ranks(spec) * spec.plan.micro_batches)}))
    span = spec.mesh.axis_spans.get("pp")
    n = len(traced.top.meta[P.STAGES])
    m = sympy.Integer(spec.plan.micro_batches)
    for stage in range(pp_rank, n, spec.mesh.size("pp")):
        for direction, what, cond in (("forward", "activations to the next stage", stage < n - 1),
                                      ("forward", "activations from the previous stage", stage > 0),
                                      ("backward", "gradients to the previous stage", stage > 0),
                                      ("backward", "gradients from the next stage", stage < n - 1)):
            if cond:
                # The residual stream stays fp32 under autocast (its adds promote), so the boundary sends fp32.
                led.add(Collective(op="send_recv", axis="pp", elements=elements, dtype_bytes=4,
                                   per_step=m, span=span, reason=f"pipeline stage {stage}: {what}, per micro-batch",
                                   direction=direction))


# -- formatting ---------------------------------------------------------------------------------------------------


def human(n: float, unit: str = "") -> str:
    for scale, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.4g} {suffix}{unit}"
    return f"{n:.4g} {unit}".rstrip()


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
