"""Memory per rank: model state (weights, gradients, optimizer) and the activations a pipeline stage holds while
its micro-batches are in flight; the checks that turn them into diagnostics ("does not fit", E0501, an error; a
stage over the device, W0502, a warning: activations are an estimate)."""
from __future__ import annotations

import functools
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


@functools.lru_cache(maxsize=4096)
def rank_peaks(schedule: str, p: int, m: int, v: int, layout: tuple) -> tuple:
    """For each pp rank, how many micro-batches of each of its stages hold their activations at the rank's peak,
    read from the runtime's own action lists (runtime/schedule.py, the order the program executes): a forward (F)
    keeps its stage's activations until its backward (B) or, with a split backward (zero-bubble), until the weight
    half (W), for which torch's split backward keeps the graph. Stages weigh by their blocks, so the peak is the
    moment the rank holds the most blocks' activations. For 1F1B this is p - rank micro-batches of the stage, for
    GPipe all m; interleaved, it is what the interleaving really keeps (for 175B on 8 × 3 chunks of 4 layers and
    64 micro-batches, 31 chunks on rank 0: 1.29·L)."""
    from compiler.schedule import Layout, compute_order
    order = compute_order(schedule, Layout(p, v, m))
    blocks = [hi - lo for lo, hi in layout]
    out = []
    for r in range(p):
        alive: dict = {}
        load, best, at = 0, -1, {}
        for a in order[r]:
            if a.kind == "F":
                alive[a.stage] = alive.get(a.stage, 0) + 1
                load += blocks[a.stage]
            elif a.kind in ("B", "W"):
                alive[a.stage] -= 1
                load -= blocks[a.stage]
            if load > best:
                best, at = load, dict(alive)
        out.append(at)
    return tuple(out)


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
        """Activations of one block and micro-batch of `b` sequences, 16-bit (Korthikanti et al. 2022) without
        their 5as/h term: sbh·34, with tp sbh(10 + 24/t), with tp and sequence parallelism sbh·34/t. That term is
        the s×s attention scores, their softmax and its dropout mask, which our attention never stores:
        scaled_dot_product_attention's flash kernels (CUDA, and CPU: tests/test_cost.py counts what it saves)
        keep q, k, v, the output and a log-sum-exp per row, O(s) per head. An MoE layer also holds its padded
        buffers (the experts' input and output) and the experts' hidden."""
        s, h = self.s, self.h
        if t == 1:
            act = s * b * h * 34
        elif sp:
            act = s * b * h / t * 34
        else:
            act = s * b * h * (10 + 24 / t)
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
    """A warning when the fullest pp rank (model state + activations in flight of every stage it holds: several
    under interleaving) exceeds one device."""
    if not stages:
        return []
    ranks: dict = {}
    for st in stages:
        ranks.setdefault(st.rank, []).append(st)
    rank, held = max(ranks.items(), key=lambda kv: (sum(st.total for st in kv[1]), -kv[0]))
    total = sum(st.total for st in held)
    mem = spec.mesh.device.memory_gb * 1e9
    if total <= mem:
        return []
    from compiler.cost import human
    which = f"stage {held[0].stage}" if len(held) == 1 else "stages " + ", ".join(str(st.stage) for st in held)
    return [Diagnostic("W0502", f"pp rank {rank} ({which}) needs {human(total, 'B')} (model state + activations) of "
                       f"the {spec.mesh.device.memory_gb:g} GB of one {spec.mesh.device.kind}", spec.mesh.span,
                       label="this mesh", help="more micro-batches in fewer sequences, more stages or tp, or shorter "
                       "sequences", severity="warning")]


def predicted_peak_bytes(costs) -> int:
    """The largest rank's predicted peak bytes in one step (what `torch.cuda.max_memory_allocated` should read on
    the fullest rank): the figure a generated program prints against what it measured."""
    ranks: dict = {}
    for st in costs.stages:
        ranks[st.rank] = ranks.get(st.rank, 0) + st.total
    return int(max(ranks.values()) if ranks else costs.model_state.total)
