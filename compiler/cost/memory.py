"""Memory per rank: model state (weights, gradients, optimizer) and the activations a pipeline stage holds while
its micro-batches are in flight; the checks that turn them into diagnostics ("does not fit", E0501, an error; a
stage over the device, W0502, a warning: activations are an estimate)."""
from __future__ import annotations

from dataclasses import dataclass

from compiler import spec as S
from compiler.diagnostics import Diagnostic


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


# What our runtime holds per parameter: fp32 master weights and gradients (bf16 runs autocast them), AdamW's two
# fp32 moments.
STATE_BYTES = 4 + 4 + 8


def moe_held_elements(spec: S.Spec, layer: S.MoE, b) -> tuple[int, int]:
    """What one `moe` layer holds for one micro-batch of `b` sequences on one rank, in elements: each padded buffer
    (the experts' input, or their output: E·b·C·hidden), and the experts' hidden activations kept for backward
    (E·b·C·ffn, twice for GELU: before and after it; three times for SwiGLU: up, gate and their product)."""
    slots = spec.value(layer.experts) * b * spec.value(layer.capacity)
    hidden = slots * spec.value(layer.ffn) * (3 if layer.act == "swiglu" else 2)
    return slots * spec.value(layer.hidden), hidden


def in_flight(schedule: str, p: int, m: int, v: int, stage_rank: int) -> float:
    """Micro-batches whose activations a pp rank holds at its peak: GPipe all m; 1F1B and ZB-H1 p - rank (the
    first rank p); interleaved 1F1B about p·(1 + (p-1)/(p·m)) of a whole model's layers (Narayanan et al. 2021)."""
    if schedule == "gpipe":
        return m
    if schedule == "interleaved-1f1b":
        return min(m, p - stage_rank) * (1 + (p - 1) / (p * m))
    return min(m, p - stage_rank)


@dataclass(frozen=True)
class BlockActivations:
    """What one block holds per sequence, read from the spec once: the plan only picks b, t and sequence
    parallelism."""

    s: int
    h: int
    a: int
    layers: int            # transformer layers (attentions) per block
    moe_per_sequence: int  # elements an MoE layer holds per sequence (buffers and experts' hidden), all of them

    def bytes(self, b: int, t: int, sp: bool) -> float:
        """Activations of one block and micro-batch of `b` sequences, 16-bit (Korthikanti et al. 2022): sbh(34 +
        5as/h), with tp sbh(10 + 24/t + 5as/(ht)), with tp and sequence parallelism sbh/t(34 + 5as/h); an MoE
        layer also holds its padded buffers (the experts' input and output) and the experts' hidden."""
        s, h, a = self.s, self.h, self.a
        if t == 1:
            act = s * b * h * (34 + 5 * a * s / h)
        elif sp:
            act = s * b * h / t * (34 + 5 * a * s / h)
        else:
            act = s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
        act *= max(1, self.layers)
        return act + 2 * self.moe_per_sequence * b  # 16-bit, like the estimate above


def block_activations(spec: S.Spec, body) -> BlockActivations:
    body = list(S.walk(body))
    att = next((x for x in body if isinstance(x, S.Attention)), None)
    moe = 0
    for x in body:
        if isinstance(x, S.MoE):
            buffer, hidden = moe_held_elements(spec, x, 1)
            moe += 2 * buffer + hidden
    return BlockActivations(s=spec.value(spec.train.seq_len), h=spec.value(spec.model.embedding.hidden),
                            a=spec.value(att.heads) if att is not None else 1,
                            layers=sum(isinstance(x, S.Attention) for x in body), moe_per_sequence=moe)


@dataclass(frozen=True)
class Stage:
    """One pipeline stage as costed: which blocks, on which pp rank, what it holds."""

    stage: int
    rank: int
    blocks: tuple          # (first block, end block)
    params: int            # parameters one rank of the stage holds
    state: float           # model-state bytes per rank
    activations: float     # bytes of activations in flight at the stage's peak (16-bit estimate)

    @property
    def total(self) -> float:
        return self.state + self.activations


def does_not_fit(spec: S.Spec, state: ModelState, data_parallel: str, dp: int) -> list[Diagnostic]:
    """What cannot fit: model state per rank (weights, gradients, optimizer) beyond one device's memory. Activations
    come on top of this, so passing is necessary, not sufficient."""
    limit = spec.mesh.device.memory_gb * 1e9
    if state.total <= limit:
        return []
    fix = ("shard it over dp with `data_parallel = fsdp`" if data_parallel == "ddp" and dp > 1
           else "add devices along dp or tp")
    return [Diagnostic("E0501", f"the model state of each rank, {state.total / 1e9:.4g} GB, does not fit in the "
                       f"{spec.mesh.device.memory_gb:g} GB of one {spec.mesh.device.kind}", spec.mesh.span,
                       label="this mesh", help=f"weights {state.params / 1e9:.4g} GB + gradients {state.grads / 1e9:.4g}"
                       f" GB + AdamW {state.optimizer / 1e9:.4g} GB per rank; {fix}, or set `memory_gb` if the device "
                       "has more")]


def stage_over_memory(spec: S.Spec, stages: tuple) -> list[Diagnostic]:
    """A warning when the fullest stage (model state + activations in flight) exceeds one device."""
    if not stages:
        return []
    worst = max(stages, key=lambda st: (st.total, st.stage))
    mem = spec.mesh.device.memory_gb * 1e9
    if worst.total <= mem:
        return []
    from compiler.cost import human
    return [Diagnostic("W0502", f"stage {worst.stage} needs {human(worst.total, 'B')} (model state + activations) of "
                       f"the {spec.mesh.device.memory_gb:g} GB of one {spec.mesh.device.kind}", spec.mesh.span,
                       label="this mesh", help="more micro-batches in fewer sequences, more stages or tp, or shorter "
                       "sequences", severity="warning")]
