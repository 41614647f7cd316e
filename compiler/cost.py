"""The cost model: parameters, FLOPs, memory per rank and the communication ledger, as sympy formulas.

Every formula is derived from what the plan stores and sends, node by node or tensor by tensor; the published
formulas in ../shared/reference/ are what the tests check these against, not what is computed here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from compiler import model as M
from compiler import spec as S
from compiler import trace as T
from compiler.diagnostics import Span
from compiler.symbols import MICRO_BATCH

BYTES = {"fp32": 4, "bf16": 2}


@dataclass(frozen=True, kw_only=True)
class Collective:
    """One collective the plan issues: what, over which axis, how much, and why."""

    op: str              # all_reduce | all_gather | reduce_scatter | all_to_all | send_recv
    axis: str
    elements: sympy.Expr  # elements of the full tensor each rank contributes, per occurrence
    dtype_bytes: int
    per_step: sympy.Expr  # occurrences per optimizer step
    span: Span | None
    reason: str

    def bytes_per_step(self) -> sympy.Expr:
        return sympy.expand(self.elements * self.dtype_bytes * self.per_step)


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
    model_state: ModelState        # per rank
    ledger: Ledger
    tokens_step: int


def costs(spec: S.Spec, traced: T.Traced) -> Costs:
    params = M.symbolic_param_count(traced.model)
    fwd = T.graph_flops(traced.top)
    # Backward of a matmul is two matmuls of the same size (input and weight gradients): 2× forward.
    step = sympy.expand(3 * fwd.xreplace({MICRO_BATCH: spec.train.global_batch}))
    psi = spec.value(params)
    dp = spec.mesh.size("dp")
    # What our runtime holds: fp32 master weights and gradients (bf16 runs autocast them), AdamW's two moments.
    stage = 3 if spec.plan.data_parallel == "fsdp" else 0
    state = zero_model_state(psi, dp, stage, param_bytes=4, grad_bytes=4, k=8)
    return Costs(params=params, params_n=psi, flops_fwd=fwd, flops_step=step, flops_step_n=spec.value(step),
                 model_state=state, ledger=ledger(spec, params),
                 tokens_step=spec.value(spec.train.global_batch * spec.train.seq_len))


def ledger(spec: S.Spec, params: sympy.Expr) -> Ledger:
    """The collectives of one optimizer step."""
    led = Ledger()
    dp = spec.mesh.size("dp")
    span = spec.mesh.axis_spans.get("dp")
    if dp > 1:
        if spec.plan.data_parallel == "ddp":
            led.add(Collective(op="all_reduce", axis="dp", elements=params, dtype_bytes=4, per_step=sympy.Integer(1),
                               span=span, reason="average the gradients of the dp replicas (DDP, bucketed)"))
        else:
            led.add(Collective(op="all_gather", axis="dp", elements=params, dtype_bytes=4, per_step=sympy.Integer(2),
                               span=span, reason="FSDP: gather each block's weights for forward and again for "
                                                 "backward"))
            led.add(Collective(op="reduce_scatter", axis="dp", elements=params, dtype_bytes=4,
                               per_step=sympy.Integer(1), span=span,
                               reason="FSDP: reduce and shard the gradients"))
    return led


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
    out = []
    for t in terms:
        coeff, rest = t.as_coeff_Mul()
        factors = []
        for base, e in sorted(rest.as_powers_dict().items(), key=lambda be: str(be[0])):
            if base == 1:
                continue
            factors.append(str(base) + ("" if e == 1 else "²" if e == 2 else "³" if e == 3 else f"^{e}"))
        body = "·".join(factors)
        c = "" if coeff == 1 and body else str(coeff)
        out.append(c + ("·" if c and body else "") + body)
    return " + ".join(out).replace("+ -", "- ")
