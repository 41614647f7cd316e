"""Memory per rank: model state (weights, gradients, optimizer) and the activations a pipeline stage holds while
its micro-batches are in flight; the checks that turn them into diagnostics ("does not fit", E0501, an error; a
stage over the device, W0502, a warning: activations are an estimate)."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from compiler import spec as S
from compiler.diagnostics import Diagnostic
# G, the bytes of an accumulated gradient element, and the default `grad_reduce`: the model state rows' own
from compiler.layout.state import GRAD_REDUCE, grad_bytes  # noqa: F401
from runtime import choices  # torch-free: what each data-parallel mode means (ZERO_STAGE)


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




def state_per_param(precision: str, data_parallel: str, dp: int, grad_reduce: str = GRAD_REDUCE) -> ModelState:
    """Bytes per parameter of a rank's model part that its model states take through a step (weights, gradients,
    optimizer), by dp mode and precision, from what the program holds (Nd = dp; with dp = 1 every mode is ddp):

    fp32 (today's programs, the equivalence reference): fp32 weights 4 + gradients 4 + AdamW's moments 8; zero1
    shards the moments (ZeroRedundancyOptimizer), zero2 also the gradients, fsdp also the weights.

    bf16, Megatron's policy (G = grad_bytes: 4, or 2 with `grad_reduce = bf16`):
    - ddp: bf16 weights 2 + accumulated gradients G + optimizer 12 (fp32 master 4 + moments 8): 16 + G - 2.
    - zero1 (Megatron's distributed optimizer): 2 + G + 12/Nd (master and moments sharded).
    - zero2 (FSDP2, MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=G's dtype), reshard_after_forward=False):
      the fp32 sharded parameter is the master (4/Nd, counted with the weights: it is the module's parameter) and
      its gradient is fp32 and sharded (4/Nd: FSDP2 casts the reduce-scatter's output to the parameter's dtype,
      torch _fsdp_collectives.foreach_reduce); at the step's peak every unit's whole bf16 weights (2), gathered in
      the forward and kept to the backward. Each unit's whole gradient awaiting its reduce-scatter is transient:
      the peak's working set (and accumulated whole over micro-batches under `fsdp_grad_sync = step`: _memory).
    - fsdp: 4/Nd + 4/Nd + 8/Nd; the gathered bf16 weights of the units in flight are the peak's working set.
    ZeRO (Rajbhandari et al. 2020) counts 2 + 2 + 12 for ddp, 2 + 2 + 12/Nd, 2 + (2 + 12)/Nd, 16/Nd: zero2 here
    holds 2/Nd more (the fp32 gradient shard), tests/test_memory.py itemises it."""
    nd = max(1, dp)
    stage = choices.zero_stage(data_parallel, nd)
    if precision != "bf16":
        sh = shard_of(data_parallel, nd)
        return ModelState(params=4 / sh["weights"], grads=4 / sh["grads"], optimizer=8 / sh["optimizer"])
    g = grad_bytes(precision, grad_reduce)
    if stage < 2:
        return ModelState(params=2, grads=g, optimizer=12 / (nd if stage == 1 else 1))
    # FSDP2: the sharded fp32 parameter is the weight and the master; zero2 keeps the bf16 units gathered to backward
    return ModelState(params=(2 if stage == 2 else 0) + 4 / nd, grads=4 / nd, optimizer=8 / nd)


def model_state(psi: float, precision: str, data_parallel: str, dp: int,
                grad_reduce: str = GRAD_REDUCE) -> ModelState:
    """Bytes per rank of the model states of Ψ = `psi` parameters (state_per_param × Ψ)."""
    per = state_per_param(precision, data_parallel, dp, grad_reduce)
    return ModelState(params=float(per.params * psi), grads=float(per.grads * psi),
                      optimizer=float(per.optimizer * psi))


def optimizer_label(precision: str, data_parallel: str, dp: int) -> str:
    """What the optimizer column holds: AdamW's moments; with them the fp32 master weights under bf16 when the
    optimizer keeps it (ddp, zero1; FSDP2's master is the sharded parameter itself, with the weights)."""
    fsdp2 = choices.zero_stage(data_parallel, dp) >= 2
    return "fp32 master + AdamW moments" if precision == "bf16" and not fsdp2 else "AdamW moments"


def moe_held_elements(spec: S.Spec, layer: S.MoE, b) -> tuple[int, int]:
    """What one `moe` layer holds for one micro-batch of `b` sequences on one rank, in elements: each padded buffer
    (the experts' input, or their output: E·b·C·hidden), and the experts' hidden activations kept for backward
    (E·b·C·ffn, twice for GELU: before and after it; three times for SwiGLU: up, gate and their product). Under
    `dispatch = grouped` the rows sorted by expert instead of the buffers: b·S·top_k of them, expected under
    balanced routing on an ep rank's experts."""
    slots = (b * spec.value(spec.train.seq_len) * layer.top_k if layer.dispatch == "grouped" else
             spec.value(layer.experts) * b * spec.value(layer.capacity))
    hidden = slots * spec.value(layer.ffn) * (3 if layer.act == "swiglu" else 2)
    return slots * spec.value(layer.hidden), hidden


@functools.lru_cache(maxsize=4096)
def rank_peaks(schedule: str, p: int, m: int, v: int, layout: tuple, weights: tuple | None = None) -> tuple:
    """For each pp rank, how many micro-batches of each of its stages hold their activations at the rank's peak,
    read from the runtime's own action lists (runtime/schedule.py, the order the program executes): a forward (F)
    keeps its stage's activations until its backward (B) or, with a split backward (zero-bubble: I then W), until
    the weight half (W), for which torch's split backward keeps the graph and the gradients of the weights'
    outputs. `weights` gives each stage's (kept bytes per micro-batch, bytes its pending W holds besides); without
    it stages weigh by their blocks. The peak is the moment the rank holds the most. For 1F1B this is p - rank
    micro-batches of the stage, for GPipe all m; interleaved, what the interleaving really keeps (for 175B on
    8 × 3 chunks of 4 layers and 64 micro-batches, 31 chunks on rank 0: 1.29·L). Returns per rank the dict of
    micro-batches alive per stage; with `weights`, (alive, pending W) dicts."""
    kept = [w[0] for w in weights] if weights else [hi - lo for lo, hi in layout]
    extra = [w[1] for w in weights] if weights else [0] * len(layout)
    import numpy as np
    out = []
    from compiler.schedule import Layout
    lay = Layout.of(schedule, p, v, m)
    for r, (states, counts) in enumerate(_moments(schedule, p, _steady(schedule, p, m), v)):
        # each state's load: micro-batches alive (and pending W) per stage of the rank (its Layout's: r, r + p, ...,
        # or r and 2p-1-r in dualpipev's V), weighed; the first state at the most
        mine = lay.stages_of(r)
        weigh = np.array([kept[s] for s in mine] + [extra[s] for s in mine], dtype=np.float64)
        at = states[int(np.argmax(counts @ weigh))] if states else ((), ())
        out.append((dict(at[0]), dict(at[1])) if weights else dict(at[0]))
    return tuple(out)


def _steady(schedule: str, p: int, m: int) -> int:
    """The micro-batch count whose states stand for `m`'s: after a warm-up of fewer than 2p micro-batches, 1F1B,
    interleaved 1F1B and zero-bubble repeat one steady state, so every m >= 2p has the states (in the same order) of
    m = 2p (tests/test_memory.py checks this over a grid); GPipe keeps all m and is walked whole."""
    return m if schedule == "gpipe" or m <= 2 * p else 2 * p


@functools.lru_cache(maxsize=256)
def _moments(schedule: str, p: int, m: int, v: int) -> tuple:
    """Per pp rank, the distinct states ((stage, micro-batches alive), ...), ((stage, pending W), ...) at each local
    maximum of what the rank holds (after the last F or I before a B or W, or the end), in the order they first occur
    (with weights >= 0 a rank's peak is first reached at one of them), and the same as a matrix of counts (alive per stage of the rank, then pending W).
    One walk of the action lists per schedule shape; a search costs many weightings of the same shape."""
    import numpy as np

    from compiler.schedule import Layout, compute_order
    lay = Layout.of(schedule, p, v, m)
    order = compute_order(schedule, lay)
    out = []
    for r in range(p):
        # the rank's stages (its Layout's, in chunk order): counts by local index, the state a tuple of them; an
        # overlapped pair (dualpipev's OVERLAP_F_B) counted as its two computations, in the order they run
        mine = lay.stages_of(r)
        local = {s: i for i, s in enumerate(mine)}
        alive = [0] * v
        pending = [0] * v
        seen: dict = {}
        rising = False  # an F or I since the last B or W: the state before the next B or W is a local maximum
        for a in (x for act in order[r] for x in act.parts):
            kind = a.kind
            if kind == "F":
                alive[local[a.stage]] += 1
                rising = True
            elif kind == "I":
                pending[local[a.stage]] += 1
                rising = True
            elif kind in ("W", "B"):
                if rising:
                    seen.setdefault((tuple(alive), tuple(pending)), None)
                    rising = False
                alive[local[a.stage]] -= 1
                if kind == "W":
                    pending[local[a.stage]] -= 1
        if rising:
            seen.setdefault((tuple(alive), tuple(pending)), None)
        states, rows = [], []
        for al, pe in seen:
            states.append((tuple((mine[i], n) for i, n in enumerate(al) if n),
                           tuple((mine[i], n) for i, n in enumerate(pe) if n)))
            rows.append(al + pe)
        out.append((tuple(states), np.array(rows, dtype=np.float64).reshape(len(rows), 2 * v)))
    return tuple(out)


@dataclass(frozen=True)
class Stage:
    """One pipeline stage as costed: which blocks, on which pp rank, what it holds."""

    stage: int
    rank: int
    blocks: tuple          # (first block, end block)
    params: int            # parameters one rank of the stage holds
    state: float           # model-state bytes per rank
    activations: float     # bytes its micro-batches in flight keep for backward at its rank's peak
    pending_w: float = 0.0  # zero-bubble: the output gradients its pending weight halves keep then

    @property
    def total(self) -> float:
        return self.state + self.activations


MARGIN = 0.10  # a plan within 10% of the device fits, with a warning: allocator fragmentation, CUDA context, NCCL


def breakdown(r) -> str:
    """`weights 1.2 GB + gradients ... = peak` of one RankMemory."""
    from compiler.report.units import nbytes
    parts = [("weights", r.weights), ("gradients", r.grads), (r.optimizer_what, r.optimizer),
             ("activations", r.activations), ("working set", r.working)]
    return " + ".join(f"{name} {nbytes(v)}" for name, v in parts if v) + f" = {nbytes(r.peak)}"


def over_memory(spec: S.Spec, memory: tuple, fixes=None) -> list[Diagnostic]:
    """E0501 when the fullest rank's predicted peak exceeds one device (compile and run refuse it unless
    --force); W0502 when it fits with less than MARGIN to spare. `fixes()` lists what would make it fit (computed
    only when needed: it costs other plans)."""
    if not memory:
        return []
    from compiler.report.units import nbytes
    worst = max(memory, key=lambda r: (r.peak, -(r.pp_rank or 0)))
    dev = spec.cluster.device
    limit = dev.memory_gb * 1e9
    if worst.peak <= limit * (1 - MARGIN):
        return []
    what = f"{worst.who}: {breakdown(worst)} at {worst.moment}"
    if worst.peak <= limit:
        return [Diagnostic("W0502", f"the predicted peak of {worst.who}, {nbytes(worst.peak)}, leaves less than "
                           f"{MARGIN:.0%} of the {dev.memory_gb:g} GB of one {dev.kind}", spec.mesh.span,
                           label="this mesh", help=what, severity="warning")]
    found = fixes() if fixes else []
    fit = [f for f in found if f.fits]
    hint = ("; it would fit with " + ", or ".join(f"`{f.change}` ({nbytes(f.peak)})" for f in fit[:4])
            if fit else "; no single change tried (recompute, micro-batches, ZeRO stage, more tp or pp, offload) "
            "makes it fit" if fixes else "")
    return [Diagnostic("E0501", f"the predicted peak of {worst.who}, {nbytes(worst.peak)}, does not fit in the "
                       f"{dev.memory_gb:g} GB of one {dev.kind}", spec.mesh.span, label="this mesh",
                       help=what + hint + "; or set `memory_gb` if the device has more (--force runs it anyway)")]


@dataclass(frozen=True)
class RankMemory:
    """The predicted peak of one kind of rank (all ranks alike, or one pp rank with the stages it holds): what is
    allocated at the moment of the step when the most is, by what holds it."""

    who: str               # "every rank", "pp rank 0 (stages 0, 8, 16)"
    pp_rank: int | None
    weights: float         # parameters held at that moment (sharded ones at their share, gathered ones whole)
    grads: float
    optimizer: float       # AdamW's two moments (and under bf16 the fp32 master weights: state_per_param)
    activations: float     # what forwards keep for their backward (every micro-batch in flight)
    working: float         # transient: the loss's logits and their gradients, communication buffers, ...
    moment: str            # when the peak happens
    working_what: str = ""
    in_flight: str = ""    # which micro-batches keep activations at that moment (pipelines)
    forward_bytes: float = 0.0  # at the fullest moment of the forwards, whichever moment is the peak: what the
                                # forwards made and still hold (kept for backward + outputs the schedule keeps)
    optimizer_what: str = "AdamW moments"  # optimizer_label: what `optimizer` holds
    checkpoint_host: float | None = None  # checkpoint_async only: HOST bytes of the staging copy, held from a save
                                          # until its files are written (checkpoint_staging); not in `peak`
    checkpoint_device: float = 0.0  # checkpoint_async only: device bytes the save gathers while it copies (FSDP
                                    # with tp: full_tensor over dp); transient, after the step, not in `peak`
    host: float | None = None  # offload only: the rank's host bytes (its rows located on the host: offloaded state
                               # and pinned buffers, and the activations staged there); not in `peak`

    @property
    def peak(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.working

    def as_json(self) -> dict:
        return {"who": self.who, "pp_rank": self.pp_rank, "peak_bytes": int(self.peak), "moment": self.moment,
                "weights": int(self.weights), "gradients": int(self.grads), "optimizer": int(self.optimizer),
                "activations": int(self.activations), "working": int(self.working),
                "working_what": self.working_what, "in_flight": self.in_flight,
                "forward_bytes": int(self.forward_bytes),
                **({"checkpoint_host": int(self.checkpoint_host), "checkpoint_device": int(self.checkpoint_device)}
                   if self.checkpoint_host is not None else {}),
                **({"host_peak_bytes": int(self.host)} if self.host is not None else {})}


PROGRESS_BYTES = 3 * 8  # runtime.checkpoint's `progress`: step, scheduler epoch, total steps (int64 scalars)
STEP_BYTES = 4  # AdamW's `step` per parameter tensor: an fp32 scalar (torch's _get_scalar_dtype; MasterAdamW's too)


def checkpoint_staging(tensors, precision: str, data_parallel: str, dp: int) -> tuple[int, int]:
    """(host, device) bytes of one asynchronous save on the fullest rank of a kind, from the parameters the rank
    holds and writes: `tensors` as ParamShapes.staged gives them, (name, elements, rows, dims, sharded), without
    the ones another rank writes (a pipeline's second copy of a tied embedding).

    Host: DCP's async_save copies the rank's whole state dict into CPU memory before it returns and keeps the copy
    until the files are written (runtime.checkpoint.staging_bytes says what torch 2.13's default stager copies:
    every tensor's whole storage, once, DTensors by their local tensor, nothing deduplicated across replicas). What
    runtime.checkpoint._Entries puts in it, by dp mode (Nd = dp; dp = 1 is ddp), 4 bytes an element:
    - ddp: the parameter (bf16: the fp32 master, not the bf16 weight) and AdamW's two moments, whole: 12 a
      parameter element, plus a 4-byte `step` per tensor.
    - zero1, fp32: every parameter (replicated), the moments and `step` of this rank's partition only
      (ZeroRedundancyOptimizer, torch 2.13 _partition_parameters: group by group, decayed matrices then vectors,
      largest first, each to the least loaded rank, ties to the lower); the fullest rank.
    - zero1, bf16: master, moments and `step` of the parameters the rank owns (runtime.precision.partition, by
      elements over all parameters); the others are written by their owners.
    - zero2, fsdp (FSDP2): the sharded parameter (fp32: the master too) is a view of its padded chunk of
      ceil(rows / Nd) rows, which is copied whole; the moments are its unpadded piece. Rank 0's is the fullest.
      Under tp (or ep) a sharded parameter and its moments are gathered over dp (`full_tensor`) and stored as the
      tp piece: 12 bytes an element of the rank's piece, and as many device bytes while the save copies them.
    - `progress`: three int64 scalars.
    Device: the gathered pieces above (nothing else: the other entries are views of what the rank holds)."""
    nd = max(1, dp)
    stage = choices.zero_stage(data_parallel, nd)
    if stage >= 2:
        host = device = 0
        for _, e, rows, _, sharded in tensors:
            if sharded:
                host += 12 * e + STEP_BYTES
                device += 12 * e
            else:
                chunk = -(-rows // nd) * (e // rows) if rows else 0
                host += 4 * chunk + 8 * chunk + STEP_BYTES
        return host + PROGRESS_BYTES, device
    if stage != 1:
        return sum(12 * e + STEP_BYTES for _, e, *_ in tensors) + PROGRESS_BYTES, 0
    totals, host = [0] * nd, [0] * nd
    if precision == "bf16":
        groups = [sorted((t[1] for t in tensors), reverse=True)]
        per, base = (lambda e: 12 * e + STEP_BYTES), 0
    else:
        groups = [sorted((t[1] for t in tensors if t[3] >= 2), reverse=True),
                  sorted((t[1] for t in tensors if t[3] < 2), reverse=True)]
        per, base = (lambda e: 8 * e + STEP_BYTES), sum(4 * t[1] for t in tensors)
    for group in groups:
        for e in group:
            r = totals.index(min(totals))
            totals[r] += e
            host[r] += per(e)
    return base + max(host) + PROGRESS_BYTES, 0


def shard_of(data_parallel: str, dp: int) -> dict:
    """Over how many ranks each kind of model state is split, by ZeRO stage (dp ranks holding the same layers)."""
    n = max(1, dp)
    stage = choices.ZERO_STAGE.get(data_parallel, 0)
    return {"weights": n if stage >= 3 else 1, "grads": n if stage >= 2 else 1, "optimizer": n if stage >= 1 else 1,
            "stage": stage}


def peak_bytes(memory: tuple) -> float:
    """The largest rank's predicted peak."""
    return max(r.peak for r in memory) if memory else 0.0


def predicted_peak_bytes(costs) -> int:
    """The largest rank's predicted peak bytes in one step (what `torch.cuda.max_memory_allocated` should read on
    the fullest rank): the figure a generated program prints against what it measured."""
    return int(peak_bytes(costs.memory))


def korthikanti_layer_bytes(s, b, h, a, t: int = 1, sp: bool = False, recompute: str = "none") -> float:
    """Korthikanti et al. 2022 (arXiv:2205.05198), Table 2: activation bytes of one transformer layer in Megatron-LM
    (16-bit activations, 1-byte dropout masks, the s×s scores kept): sbh(34 + 5as/h); with tensor parallelism
    sbh(10 + 24/t + 5as/(ht)); with sequence parallelism too sbh/t(34 + 5as/h); selective recomputation drops the
    5as/h term; full recomputation keeps the layer's input, 2sbh. The published reference, not what our programs
    keep (activations.py is): tests/test_memory.py itemises the difference."""
    if recompute == "full":
        return 2 * s * b * h / (t if sp else 1)
    scores = 0 if recompute == "selective" else 5 * a * s / h
    if t == 1:
        return s * b * h * (34 + scores)
    if sp:
        return s * b * h / t * (34 + scores)
    return s * b * h * (10 + 24 / t + scores / t)


def korthikanti_first_stage_bytes(layer_bytes: float, layers: int, p: int, v: int) -> float:
    """Their eq. 5 and its interleaved form: the first pipeline stage keeps about the whole model's L layers
    (p micro-batches of L/p layers) whatever p, times (1 + (p-1)/(p·v)) with v model chunks per device."""
    return layer_bytes * layers * (1 + (p - 1) / (p * v) if v > 1 else 1)
