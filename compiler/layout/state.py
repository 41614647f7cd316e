"""The model state one rank holds, as rows: one per kind of state × class of parameter, each with its dtype, the
group it is sharded over, where it lies and when in a step it is alive. Torch-free: a Plan's properties only.

A rank's memory peak (compiler/cost/rank_memory.py) is the largest, over the moments of a step, of the rows alive
then plus the activations and working sets (FSDP's gathered units, buckets, the logits, ...). What each row says
is what the program holds (runtime/train.py, runtime/precision.py), by the data-parallel mode's ZeRO stage
(runtime/choices.py: `plan.zero_stage`, `shards_optimizer`, `shards_grads`, `shards_params`) and precision:

fp32 programs hold fp32 weights, gradients and AdamW moments; zero1 shards the moments (ZeroRedundancyOptimizer,
whole tensors to a rank), zero2 the gradients too and fsdp the weights too (FSDP2). bf16 programs (Megatron's
policy) compute on a bf16 copy of the weights and keep an fp32 master with the moments: under ddp and zero1 (the
distributed optimizer) the optimizer owns the master; under FSDP2 (zero2, fsdp) the sharded fp32 parameter is the
master and the gathered bf16 units are its compute copy. Gradients are accumulated in G bytes (grad_bytes: fp32
main gradients, or bf16 with `grad_reduce = bf16`); FSDP2 accumulates a unit's whole gradient until its
reduce-scatter, whose output, cast to the fp32 parameter, is the sharded main gradient the step reads.

Under FSDP2 with ep the dense weights shard over dp × ep and the experts over dp (both × cp under cp:
runtime.mesh's dense_mesh); every other sharding is over dp (× cp), the dense and the expert rows alike.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

# kinds of state
WEIGHTS = "weights"                # the parameters the program holds (fp32; under bf16 FSDP2 the master itself)
COMPUTE = "compute copy"           # bf16 weights the forward and backward compute with (or gathered whole)
GRADS = "gradients"                # accumulated over micro-batches, in G bytes, whole
MAIN_GRADS = "main gradients"      # the fp32 gradient shard FSDP2's reduce-scatter leaves for the step
MASTER = "master weights"          # the fp32 master an optimizer keeps beside bf16 weights (ddp, zero1)
MOMENTS = "moments"                # AdamW's two fp32 moments
HOST_GRADS = "host gradients"      # optimizer offload: the pinned fp32 buffer the offloaded gradients are copied to
HOST_PARAMS = "host parameters"    # optimizer offload without a master (fp32, FSDP2): the fp32 parameters it steps
KINDS = (WEIGHTS, COMPUTE, GRADS, MAIN_GRADS, MASTER, MOMENTS, HOST_GRADS, HOST_PARAMS)

# classes of parameter
DENSE, EXPERT, TIED = "dense", "expert", "tied"
"""`tied`: the last pipeline stage's copy of a tied embedding (runtime.pipeline.TIED), held like a dense weight
(the formulas count its elements with the dense ones) and written to a checkpoint by the first stage's rank."""

# where a row lies
DEVICE, HOST = "device", "host"
"""A plan's `offload` puts rows on the host (`offloaded`): their bytes leave the device peak and make the host's."""

# when a row is alive: the vocabulary of moments
WHOLE_STEP = "whole step"
UNIT = "forward..backward of a unit"   # gathered weights kept from a unit's forward to its backward
ACCUMULATING = "backward"              # gradients accumulated whole, until the reduce-scatter of the last one
TO_STEP = "backward..optimizer step"   # gradients from the first backward through the optimizer step
AFTER_BACKWARD = "after backward / optimizer step"
GATHER = "during a gather"             # FSDP's gathered units in flight (a working set: units, not the rank's all)
MOMENTS_OF_STEP = (WHOLE_STEP, UNIT, ACCUMULATING, TO_STEP, AFTER_BACKWARD, GATHER)

# the two instants the memory model compares, and which moments are alive at each
BACKWARD_PEAK, STEP_PEAK = "backward", "step"
ALIVE_AT = {BACKWARD_PEAK: (WHOLE_STEP, UNIT, ACCUMULATING, TO_STEP, GATHER),
            STEP_PEAK: (WHOLE_STEP, TO_STEP, AFTER_BACKWARD)}

# RankMemory's columns (compiler/cost/memory.py) a row is counted in
COLUMN = {WEIGHTS: "weights", COMPUTE: "weights", GRADS: "grads", MAIN_GRADS: "grads", MASTER: "optimizer",
          MOMENTS: "optimizer", HOST_GRADS: "grads", HOST_PARAMS: "weights"}

GRAD_REDUCE = "fp32"  # `grad_reduce` when a plan has none: gradients accumulated and reduced in fp32 (Megatron's)


def grad_bytes(precision: str, grad_reduce: str = GRAD_REDUCE) -> int:
    """G: bytes of one accumulated, reduced gradient element. fp32 programs: 4. bf16 (Megatron's policy): 4 with
    `grad_reduce = fp32` (Megatron's main_grad; FSDP2's reduce_dtype), 2 with `grad_reduce = bf16`."""
    return 4 if precision != "bf16" or grad_reduce != "bf16" else 2


@dataclass(frozen=True, slots=True)
class Row:
    """One kind of state of one class of parameter on a rank."""

    kind: str             # KINDS
    params: str           # DENSE, EXPERT or TIED
    dtype_bytes: int      # bytes per element
    group: str            # the process group it is sharded over ("dp", "dp×cp", "dp×ep", "dp×cp×ep"), "" if whole
    size: int             # that group's size (1: whole on every rank)
    alive: str            # MOMENTS_OF_STEP
    location: str = DEVICE
    partition: str = "elements"  # "tensors": whole tensors to a rank (ZeroRedundancyOptimizer), the fullest rank's
    share: float = 1.0    # of the class's elements on the rank (over `size`), this row's: optimizer offload splits

    @property
    def column(self) -> str:
        return COLUMN[self.kind]

    def alive_at(self, instant: str) -> bool:
        return self.alive in ALIVE_AT[instant]


class Rows(tuple):
    """A rank's rows (a tuple of Row), with what is alive at each instant summed up once: the same rows serve the
    thousands of plans of one shape a search costs."""

    def terms(self, instant: str | None, grads: bool = True, location: str = DEVICE) -> tuple:
        """The rows alive at `instant` on the device (or at `location`; instant None: every row there, as the
        host holds its rows, pinned, through the run), but FSDP's gathered units (a working set) and, without
        `grads`, the gradients (none yet on a first micro-batch): per kind in row order, the kinds of one column
        with the same groups and partition together, as ((column, dense group size, expert group size,
        partition), bytes per element of the class's elements: dtype bytes × share)."""
        memo = self.__dict__.setdefault("_terms", {})
        key = (instant, grads, location)
        if key not in memo:
            kinds: dict = {}
            for row in self:
                if (row.location == location and (instant is None or row.alive_at(instant)) and row.alive != GATHER
                        and (grads or row.column != "grads")):
                    kinds.setdefault(row.kind, {})[row.params] = row
            out: dict = {}
            for by_class in kinds.values():
                first = next(iter(by_class.values()))
                sizes = tuple(by_class[c].size if c in by_class else 1 for c in (DENSE, EXPERT))
                at = (first.column, *sizes, first.partition)
                out[at] = out.get(at, 0) + first.dtype_bytes * first.share
            memo[key] = tuple(out.items())
        return memo[key]


def groups(plan) -> dict:
    """(name, size) of the group each class's sharded state lies over: dp, or dp × cp under context parallelism
    (cp shards no weight, so torchtitan folds it into FSDP's mesh); under FSDP2 with ep the dense weights over
    dp × ep (× cp). Whole ("", 1) where the mode shards nothing (dp = 1: every mode is ddp)."""
    if not plan.shards_optimizer:
        return {DENSE: ("", 1), EXPERT: ("", 1), TIED: ("", 1)}
    layout = plan.groups  # compiler/layout/groups.py: the names and sizes of the folded groups
    name = "dp×cp" if plan.size("cp") > 1 else "dp"
    expert = (name, layout[name].size)
    dense = expert
    if plan.shards_grads and plan.size("ep") > 1:
        folded = f"{name}×ep"
        dense = (folded, layout[folded].size)
    return {DENSE: dense, EXPERT: expert, TIED: dense}


def classes(plan, tied: bool = False) -> tuple:
    """The parameter classes of a rank's rows: dense and expert (a model without experts has no expert elements:
    its expert rows count nothing), and the tied embedding's copy under pp with a tied head."""
    return (DENSE, EXPERT) + ((TIED,) if tied and plan.size("pp") > 1 else ())


def rows(plan, precision: str, tied: bool = False) -> Rows:
    """Every row of a rank's model state under `plan` and `precision`, in the order the memory model sums them
    (compute copy before the master, as the peak's weights column reads)."""
    got = _rows(plan.zero_stage, precision == "bf16", grad_bytes(precision, plan.grad_reduce),
                plan.size("pp") > 1, tuple(groups(plan).items()), plan.syncs_each_micro_batch, classes(plan, tied))
    offload = getattr(plan, "offload", "none")
    if offload in ("optimizer", "params"):
        got = offloaded(got, offload, float(plan.offload_fraction) if offload == "optimizer" else 1.0)
    return got


@functools.lru_cache(maxsize=256)
def offloaded(rows: Rows, offload: str, fraction: float) -> Rows:
    """`rows` under a plan's `offload` (compiler/cost/offload.py prices the copies):

    - `optimizer`, fraction f: of the optimizer's rows (the fp32 master where the optimizer keeps one, the
      moments), f of the elements on the host and 1 - f on the device; beside them on the host two pinned fp32
      buffers of f: the gradients copied down, and where the optimizer keeps no master (fp32, FSDP2's sharded
      parameter is it) the parameters the host steps.
    - `params` (FSDP2's CPUOffloadPolicy, fsdp): the sharded parameter, its sharded gradient and the moments on the
      host (pinned there by the policy); the gathered units and the unit gradients before their reduce-scatter
      stay on the device."""
    out = []
    for row in rows:
        if offload == "params":
            moved = row.kind in (MOMENTS, MAIN_GRADS) or (row.kind == WEIGHTS and row.size > 1)
            out.append(_located(row, HOST) if moved else row)
            continue
        if row.kind not in (MASTER, MOMENTS) or fraction <= 0:
            out.append(row)
            continue
        if fraction < 1:
            out.append(_located(row, DEVICE, row.share * (1 - fraction)))
        out.append(_located(row, HOST, row.share * fraction))
        if row.kind == MOMENTS:
            masters = any(r.kind == MASTER and r.params == row.params for r in rows)
            out.append(_located(row, HOST, row.share * fraction, HOST_GRADS, 4))
            if not masters:
                out.append(_located(row, HOST, row.share * fraction, HOST_PARAMS, 4))
    return Rows(out)


def _located(row: Row, location: str, share: float | None = None, kind: str | None = None,
             dtype_bytes: int | None = None) -> Row:
    return Row(kind or row.kind, row.params, dtype_bytes or row.dtype_bytes, row.group, row.size, row.alive,
               location, row.partition, row.share if share is None else share)


@functools.lru_cache(maxsize=1024)
def _rows(stage: int, bf16: bool, g: int, piped: bool, where: tuple, sync_each: bool, held: tuple) -> Rows:
    """`rows` of what it reads of a plan (a search costs thousands of plans of a few such shapes)."""
    where = dict(where)
    out = []
    for cls in held:
        name, size = where[cls]

        def row(kind, dtype, alive, sharded=True, partition="elements"):
            out.append(Row(kind, cls, dtype, name if sharded else "", size if sharded else 1, alive,
                           partition=partition))
        # weights: FSDP2 keeps a unit gathered from its forward to its backward under zero2 and under pp (torch's
        # pipelining reshards only after the last backward); fsdp without pp gathers a few units at a time
        if stage >= 2:
            kept = stage == 2 or piped
            if bf16:
                row(COMPUTE, 2, UNIT if kept else GATHER, sharded=False)
                row(WEIGHTS, 4, WHOLE_STEP)
            elif stage == 2:  # fp32 zero2: the weights counted whole through the step (the gathered units)
                row(WEIGHTS, 4, WHOLE_STEP, sharded=False)
            else:
                row(COMPUTE, 4, UNIT if kept else GATHER, sharded=False)
                row(WEIGHTS, 4, AFTER_BACKWARD if kept else WHOLE_STEP)
        else:
            row(COMPUTE if bf16 else WEIGHTS, 2 if bf16 else 4, WHOLE_STEP, sharded=False)
        # gradients
        if stage >= 2:
            if sync_each:  # reduce-scattered every micro-batch: sharded from the first backward
                row(MAIN_GRADS, 4, TO_STEP)
            else:
                row(GRADS, g, ACCUMULATING, sharded=False)
                row(MAIN_GRADS, 4, AFTER_BACKWARD)
        else:
            row(GRADS, g, TO_STEP, sharded=False)
        # the optimizer's
        tensors = "tensors" if stage == 1 and not bf16 else "elements"
        if bf16 and stage < 2:
            row(MASTER, 4, WHOLE_STEP, sharded=stage == 1)
        row(MOMENTS, 8, WHOLE_STEP, sharded=stage >= 1, partition=tensors)
    return Rows(out)

