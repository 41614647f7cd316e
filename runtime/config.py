"""The runtime contract: what the compiler decided that a generated program's run needs, as frozen nested configs.

The groups mirror the .scale file's sections and the compiler's Plan: `Parallel` (the mesh and the plan section:
how the model and the batch are split), `Optim` (the optimizer, its learning-rate schedule, clipping), `Data` (the
token source and the batch), `Checkpoint`, and `Init` (how weights start); the run itself (steps, seed, precision,
logging) stays at the top. The generated program writes one `Config(...)` literally (compiler/codegen builds it
from the Plan: the micro-batch size and the batch ranks are the Plan's, not re-derived here). Plain values only, no
torch: a program's CONFIG can be read without starting anything.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from runtime import choices


@dataclass(frozen=True, kw_only=True)
class Parallel(choices.DataParallelMode):
    """How the model and the batch are split over the mesh (the `mesh` and `plan` sections, as the Plan has them)."""

    axes: tuple
    """Mesh axes ((name, size), ...), outermost first; the product is the world size."""
    groups: tuple = ()
    """The process groups the program builds, as the compiler listed them (compiler/layout/groups.py):
    ((name, ((stride, size), ...)), ...), every axis of `axes` and the folded groups `batch` (the ranks the step's
    tokens are split over), `dense` (FSDP's mesh of the dense weights) and `experts` (the experts' replicas under
    cp). A group's ranks are base + Σ i·stride over the mesh's row-major ranks (runtime.mesh.expand);
    runtime.mesh.setup builds exactly these, in this order (empty: a program compiled before the field, which
    setup refuses)."""
    placement: tuple = ()
    """Where the mesh's `placement` put each mesh coordinate, as its generator: ((axis, ((size, stride), ...)),
    ...) for every axis of `axes` in their order, each axis's coordinate cut into factors of those sizes (outermost
    first, mixed radix) and a coordinate's rank the sum over every axis of each factor's digit × its stride
    (`placed_ranks`; compiler/layout/rank_order.py `generator` writes it). An axis order is one factor per axis,
    `order(tp, pp, dp)` strides 1, tp, tp·pp. Empty: coordinate i runs on rank i. It grows with the axes, not the
    world: 16,384 ranks are 3 pairs or a few more."""
    data_parallel: str = "ddp"
    """How dp holds model state (ZeRO's stages, each from torch's own pieces):
    - `ddp`: replicated; DDP all-reduces the gradients (pipeline stages: one coalesced all-reduce).
    - `zero1`: as ddp, with torch.distributed.optim.ZeroRedundancyOptimizer over dp: AdamW's state partitioned (by
      whole parameters) over the dp ranks, each updating its partition and broadcasting it.
    - `zero2`: FSDP2 (`fully_shard`, each block and the root) with `reshard_after_forward=False`: weights stay
      gathered from a unit's forward to its backward, gradients are reduce-scattered, optimizer state sharded.
    - `fsdp`: ZeRO-3, FSDP2 with the weights freed after each unit's forward and gathered again for its backward.
    With dp = 1 all four are the same (nothing to shard). Under `precision = bf16` (runtime.precision): ddp and zero1
    have no DDP (it would reduce the bf16 `.grad`): fp32 main gradients, one coalesced all-reduce after the last
    micro-batch, and MasterAdamW's fp32 masters and moments, whole (ddp) or sharded over dp by whole parameters
    (zero1); zero2 and fsdp take FSDP2's MixedPrecisionPolicy over their fp32 shards."""
    micro_batches: int = 1
    """Micro-batches per optimizer step on each batch rank: gradient accumulation, or the pipeline's micro-batches
    under pp."""
    micro_batch_size: int = 1
    """Sequences in one micro-batch on one batch rank: global_batch / (batch_ranks × micro_batches) (Plan)."""
    batch_ranks: int = 1
    """Ranks the global batch is split over: dp × ep (ep is folded out of data parallelism) (Plan)."""
    schedule: str = "1f1b"
    """Pipeline schedule over pp: gpipe, 1f1b, interleaved-1f1b, zero-bubble, dualpipev."""
    virtual_stages: int = 1
    """Pipeline stages per pp rank (more than one: interleaved; two, folded in a V: dualpipev)."""
    sequence_parallel: bool = False
    """Activations outside attention and MLP are split over tp along the sequence; the replicated parameters they
    meet get partial gradients (`tp_partial_grads`)."""
    recompute: str = "none"
    """Activation recomputation of each block of a `repeat` (runtime.recompute): `none`, `selective` (matmul and
    collective outputs kept, the attention core and cheap ops recomputed) or `full` (recomputed from the block's
    input)."""
    compile: bool = False
    """torch.compile each block of a `repeat` and the code around the repeats (runtime.compile)."""
    tp_shards: tuple = ()
    """Parameters sharded over tp: (name pattern, dim, full size of that dim)."""
    tp_partial_grads: tuple = ()
    """Parameters whose gradients are partial over tp (sequence parallelism): summed after backward."""
    ep_shards: tuple = ()
    """Expert weights sharded over ep: (name pattern, dim, full size); their gradients are summed over dp only (the
    all-to-all backward already brought every ep rank's tokens' contributions), then divided by dp × ep."""
    tied_embedding: bool = False
    """The LM head reuses the embedding: under pp its two copies (first and last stage) have their gradients summed
    and the last stage's copy is not saved twice."""
    ddp_bucket_mb: float = 25.0
    """The gradient all-reduce's bucket, MiB: DDP's `bucket_cap_mb`, bf16's main-gradient buckets
    (runtime.precision.MainGrads) and pipeline stages' buckets after the schedule; the compiler's figure
    (compiler.plan.Plan.ddp_bucket_bytes), the same bucket its step-time and memory models assume."""
    fsdp_grad_sync: str = "step"
    """FSDP2 (fsdp, zero2) with several micro-batches and no pipeline: `step` reduce-scatters the gradients in the
    last micro-batch's backward only (the ones before accumulate whole, unsharded gradients), `micro_batch` in
    every micro-batch's backward (they stay sharded between micro-batches: less memory, m× the reduce-scatters)."""
    fsdp_prefetch: int = 1
    """FSDP2 (fsdp, zero2): how many blocks ahead each block's forward and backward issue their all-gathers
    (`set_modules_to_forward_prefetch` / `set_modules_to_backward_prefetch`); 0 leaves FSDP2's own order (the
    compiler's figure: compiler.plan.Plan.fsdp_prefetch)."""
    grad_reduce: str = "fp32"
    """Under `precision = bf16`: the dtype gradients are accumulated and reduced in over the batch ranks, `fp32`
    (Megatron's main gradients; FSDP2's `reduce_dtype`) or `bf16` (half the bytes, bf16 rounding in the sum)
    (runtime.precision)."""
    fp32_residual: bool = False
    """Under `precision = bf16`: keep the residual stream fp32 (Megatron's `--fp32-residual-connection`); the
    blocks still compute in bf16 (runtime.precision)."""
    offload: str = "none"
    """What leaves the device for the host (runtime.offload): `none`; `optimizer` (`offload_fraction` of the
    optimizer's state kept and stepped on the host: ddp, zero1); `params` (FSDP2's CPUOffloadPolicy: fsdp, zero2);
    `activations` (the blocks' saved tensors of `offload_modules`)."""
    offload_fraction: float = 1.0
    """offload = optimizer: the share of this rank's optimizer state, by parameter count, on the host (0 to 1;
    runtime.offload.host_share says which parameters)."""
    offload_modules: tuple = ()
    """offload = activations: the block modules whose saved tensors go to the host, of runtime.choices.
    OFFLOAD_MODULES; empty: every saved tensor of a block."""

    def __post_init__(self):
        """A Config names only what the runtime knows (runtime/choices.py, the sets the compiler checked the file
        against): a hand-edited program fails here, before any process group starts, not deep in a step."""
        for field_name, allowed in (("data_parallel", choices.DATA_PARALLEL), ("schedule", choices.SCHEDULES),
                                    ("recompute", choices.RECOMPUTE), ("offload", choices.OFFLOAD)):
            value = getattr(self, field_name)
            if value not in allowed:
                raise ValueError(f"Parallel.{field_name} = {value!r}: not one of {', '.join(allowed)}")
        if not 0 <= self.offload_fraction <= 1 or not set(self.offload_modules) <= set(choices.OFFLOAD_MODULES):
            raise ValueError(f"Parallel.offload_fraction = {self.offload_fraction!r} (0 to 1), offload_modules = "
                             f"{self.offload_modules!r} (of {', '.join(choices.OFFLOAD_MODULES)})")
        unknown = [name for name, _ in self.axes if name not in choices.AXES]
        if unknown:
            raise ValueError(f"Parallel.axes: unknown axis {', '.join(unknown)}; the axes are "
                             f"{', '.join(choices.AXES)}")
        world = 1
        for _, n in self.axes:
            world *= n
        if self.placement:
            ranks = placed_ranks(self.axes, self.placement)  # ValueError where it does not fit the axes
            if sorted(ranks) != list(range(world)):
                raise ValueError(f"Parallel.placement: its {len(ranks)} ranks are not each of 0..{world - 1} once")
        known = {name for name, _ in self.axes} | set(choices.GROUPS)
        strange = [name for name, _ in self.groups if name not in known]
        if strange:
            raise ValueError(f"Parallel.groups: unknown group {', '.join(strange)}; the groups are the axes "
                             f"and {', '.join(choices.GROUPS)}")

    @property
    def ranks(self) -> tuple:
        """The global rank of each mesh coordinate, row-major (the innermost axis fastest), from `placement`; empty
        without one. The DeviceMesh is built from this rank tensor as it is, and every group's rows are mapped
        through it (runtime.mesh.planned)."""
        return placed_ranks(self.axes, self.placement) if self.placement else ()

    @property
    def _zero_dp(self) -> int:
        """The dp size the data-parallel mode's properties (choices.DataParallelMode: zero_stage, shards_*) read."""
        return dict(self.axes).get("dp", 1)


@dataclass(frozen=True, kw_only=True)
class Optim:
    """AdamW, its learning-rate schedule and gradient clipping (`train { optimizer, schedule, grad_clip }`)."""

    lr: float
    """Peak learning rate."""
    betas: tuple = (0.9, 0.95)
    """AdamW's (beta1, beta2)."""
    weight_decay: float = 0.0
    """Decoupled weight decay of the matrices (biases and norm scales, the 1-D parameters, get none)."""
    eps: float = 1e-8
    """AdamW's epsilon."""
    lr_schedule: str = "cosine"
    """`cosine` (to `min_lr` at the last step) or `constant`, after `warmup` linear steps."""
    warmup: int = 0
    """Steps of linear warm-up from lr / (warmup + 1) to lr."""
    min_lr: float = 0.0
    """The cosine's floor."""
    grad_clip: float = 0.0
    """Clip the global gradient norm to this; 0 turns clipping off."""


@dataclass(frozen=True, kw_only=True)
class Data:
    """The token source and the batch (`train { data, global_batch, seq_len }`, the model's vocabulary)."""

    kind: str = "synthetic"
    """`synthetic` (a deterministic stride task) or `tokens` (a file of token ids)."""
    path: str = ""
    """The token file: relative to the program's directory (main's `program`), or absolute; empty for synthetic."""
    dtype: str = "uint16"
    """Element type of the token file (`uint16`, `uint32`, `int32` or `int64`); of a .npy file, its header's."""
    format: str = "raw"
    """How the token file is laid out, as `scalec check` found it: `raw` (a flat file of ids) or `npy` (np.save's
    file, read by its header, which must still give `dtype`)."""
    global_batch: int
    """Sequences per optimizer step over all batch ranks."""
    seq_len: int
    """Tokens per sequence."""
    vocab: int
    """Vocabulary size: the synthetic task's range, the bound token ids of a file are checked against."""
    document_separator: int | None = None
    """Packed documents (runtime.packed): the id ending each document of the token file; None: one stream."""


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """Distributed checkpoints of the single-device model's tensors (runtime.checkpoint)."""

    dir: str = ""
    """Directory of the checkpoints: relative to the program's directory (main's `program`; the compiler wrote it so,
    from the .scale file's directory), or absolute; empty: none saved or resumed from."""
    as_written: str = ""
    """`checkpoint_dir` as the .scale file spells it, when relative. Programs compiled before it was read from the
    .scale file's directory read it from the current one: a run that finds checkpoints only there stops with one
    line (runtime.startup.legacy_checkpoints) rather than starting again at step 1 beside them."""
    every: int = 0
    """Save every this many steps (and always at the last step of a run and on SIGTERM); 0: only then."""
    asynchronous: bool = False
    """Write each checkpoint but the last (and one forced by SIGTERM) in the background: DCP's async_save over a
    gloo group of its own, finished (manifest, rename) at the next save or at the end (runtime.checkpoint.begin)."""


@dataclass(frozen=True, kw_only=True)
class Eval:
    """Evaluation on held-out data (`train { eval_every, eval_batches, eval_split }`;
    runtime.trainer.Trainer.evaluate): the model's forward only, the token-mean cross entropy (no MoE auxiliary
    loss) over the same batches each time."""

    every: int = 0
    """Evaluate after every this many steps and after the last; 0: never."""
    batches: int = 8
    """Global batches (of Data.global_batch sequences) each evaluation reads: the same ones every time."""
    split: float = 0.0
    """The share of a token file held out for evaluation and never trained on (runtime.split); 0 for synthetic data,
    whose held-out batches are a seed stream of their own (runtime.data.Synthetic.eval_samples)."""

    def __post_init__(self):
        """The bounds `scalec check` holds the file to: a hand-edited program fails here, not mid-run."""
        if self.every < 0 or self.batches < 1 or not 0 <= self.split <= 0.5:
            raise ValueError(f"Eval(every={self.every}, batches={self.batches}, split={self.split}): every >= 0, "
                             "batches >= 1 and 0 <= split <= 0.5")


@dataclass(frozen=True, kw_only=True)
class Init:
    """Weight initialisation, by parameter name so that every layout starts from the same weights."""

    path: str = ""
    """A Hugging Face checkpoint to start from (runtime/hf.py): relative to the program's directory, or absolute;
    empty: GPT-2's initialisation below."""
    std: float = 0.02
    """Standard deviation of the weights' normal initialisation."""
    residual_out: tuple = ()
    """Linears writing into the residual stream; their initialisation is scaled by 1/sqrt(2·layers)."""
    layers: int = 1
    """Number of blocks (for that scaling)."""
    stack: tuple = ()
    """How the checkpoint's decoder layers lie in the repeats (runtime/hf_names.py): (repeat, first layer, layers per
    block, norms per layer) each; empty: one layer of two norms a block of `blocks` (every family before Gemma)."""


@dataclass(frozen=True, kw_only=True)
class Memory:
    """What the compiler predicts one step allocates (compiler.cost.memory), printed beside what the run measures."""

    predicted_peak_bytes: int = 0
    """The largest rank's predicted peak bytes in one step (compiler.cost.memory.predicted_peak_bytes); 0: none."""
    device_bytes: int = 0
    """Memory of one device of the mesh's kind (`memory_gb` × 1e9); 0: unknown."""


@dataclass(frozen=True, kw_only=True)
class Speed:
    """What the log measures the run's speed against (compiler.cost and compiler.cost.step_time): model TFLOP/s per
    device and MFU on every logged line."""

    flops_per_step: float = 0.0
    """Model FLOPs of one optimizer step over the whole job (compiler.cost: 6·N·tokens-style forward + backward of
    the model, without recomputation's extra forward); 0: unknown, no TFLOP/s or MFU logged."""
    peak_flops: float = 0.0
    """Peak FLOP/s of one device of the mesh's kind (the `.scale` file's `device` / `peak_tflops` × 1e12): MFU is
    model FLOP/s per device over this, whatever device the run happens to be on (the start-up line names it)."""
    device: str = ""
    """The mesh's device kind the peak belongs to (`h100`, `cpu`, ...)."""
    predicted_step_s: float = 0.0
    """The step time compiler.cost.step_time predicts for this plan on that device, seconds; 0: no prediction."""


@dataclass(frozen=True, kw_only=True)
class Resilience:
    """What the run does about slow and failing hardware (the `resilience` section; runtime.stragglers).

    Each rank times its step's sections (data, forward, backward, the waits in each collective kind, optimizer,
    checkpoint); every `window` steps rank 0 gathers them and scores each rank as NVIDIA's resiliency extension does:
    relative (the fastest rank doing the same work over this rank, per section) and individual (this rank's own best
    over its current); 1.0 is as fast as the reference, and a rank scoring below `threshold` is named a straggler."""

    detect: bool = True
    """Time the sections and score the ranks (cheap enough to stay on); False: neither."""
    threshold: float = choices.STRAGGLER_THRESHOLD
    """A rank whose relative or individual score falls below this is named (runtime.choices says why 0.8, not NVRx's
    0.7)."""
    window: int = choices.STRAGGLER_WINDOW
    """Steps between gathers (and scores) on rank 0 (the scores compare each rank's fastest step of the window,
    which a slowdown that began mid-window has not yet moved)."""
    on_straggler: str = "report"
    """`report` (name it in the log and the metrics), `restart` (end the attempt cleanly and rejoin without the
    named straggler's `exclude` unit) or `replan` (search again on the machines left and resume on the new plan)."""
    exclude: str = "node"
    """What `restart` leaves out: the straggler's `node`."""


@dataclass(frozen=True, kw_only=True)
class Config:
    """Everything the compiler decided that the runtime needs; written out literally in the generated program."""

    name: str
    """Model name, from `model NAME` in the .scale file."""
    source: str
    """The .scale file this program was generated from (its base name)."""
    steps: int
    """Optimizer steps of the whole run (`--steps` overrides)."""
    seed: int
    """Seed of initialisation and data (`--seed` overrides)."""
    precision: str = "fp32"
    """`fp32` or `bf16`: Megatron's mixed precision (runtime.precision): bf16 weights and activations, fp32 main
    gradients (`Parallel.grad_reduce`), fp32 master weights and moments in the optimizer."""
    fp8: str = ""
    """Under `precision = bf16`: the FP8 recipe (runtime.choices.FP8_RECIPES) the blocks' linears chosen by
    `fp8_filter` train with (runtime.fp8, torchao's float8 training); empty: none."""
    fp8_filter: str = "auto"
    """Which linears `fp8` converts (runtime.choices.FP8_FILTERS, the shape rule `choices.fp8_chosen`)."""
    log_every: int = 1
    """Print a line every this many steps (and at the first and last)."""
    predicted_joules_per_step: tuple = ()
    """The compiler's energy model's prediction: ((pp rank, joules per device per step), ...), one pair per pipeline
    stage (pp rank 0 alone without pp); the log's energy line puts each rank's measurement beside its pp rank's
    (runtime.energy). Empty: no prediction, the measurement alone."""
    timeout: float = 600.0
    """Seconds a collective may take before the watchdog ends the job naming it (runtime.faults); 0: no watchdog."""
    moe: bool = False
    """The model has Mixture-of-Experts layers: log dropped tokens, expert load and the auxiliary loss."""
    sources: tuple = ()
    """((what, "file.scale:LINE", the line's text), ...): the .scale lines behind the runtime's blocking operations,
    `mesh` (the mesh section), `axis dp` (each axis), and the settings written among data_parallel, schedule,
    grad_clip, checkpoint_dir and checkpoint_every; the watchdog names them (runtime.faults.scale)."""
    parallel: Parallel
    optim: Optim
    data: Data
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    eval: Eval = field(default_factory=Eval)
    init: Init = field(default_factory=Init)
    memory: Memory = field(default_factory=Memory)
    speed: Speed = field(default_factory=Speed)
    resilience: Resilience = field(default_factory=Resilience)


    def __post_init__(self):
        if self.fp8 and (self.fp8 not in choices.FP8_RECIPES or self.fp8_filter not in choices.FP8_FILTERS
                         or self.precision != "bf16"):
            raise ValueError(f"Config.fp8 = {self.fp8!r}, fp8_filter = {self.fp8_filter!r} under precision "
                             f"{self.precision!r}: recipes {', '.join(choices.FP8_RECIPES)}, filters "
                             f"{', '.join(choices.FP8_FILTERS)}, under bf16")


GROUPS = (("parallel", Parallel), ("optim", Optim), ("data", Data), ("checkpoint", Checkpoint), ("eval", Eval),
          ("init", Init), ("memory", Memory), ("speed", Speed), ("resilience", Resilience))
"""The nested groups of `Config`: (field name, class)."""


def placed_ranks(axes: tuple, placement: tuple) -> tuple:
    """The rank of each coordinate of the mesh `axes` ((name, size), ... outermost first), row-major, from
    Parallel.placement's generator: per axis, factors (size, stride) outermost first; the coordinate c of an axis is
    written in those sizes' mixed radix, and a coordinate's rank is Σ digit × stride over every factor of every
    axis. Pure: the compiler's rank map and this expansion are held equal by tests/test_placement_contract.py."""
    given = dict(placement)
    if [a for a, _ in axes] != [a for a, _ in placement]:
        raise ValueError(f"Parallel.placement names the axes {[a for a, _ in placement]}, the mesh "
                         f"{[a for a, _ in axes]}")
    ranks = [0]
    for axis, n in axes:
        factors = given[axis]
        size = 1
        for k, _ in factors:
            size *= k
        if size != n:
            raise ValueError(f"Parallel.placement: axis {axis}'s factors multiply to {size}, not its size {n}")
        offsets = [0]
        for k, stride in factors:  # outermost factor first: each next factor varies faster
            offsets = [o + d * stride for o in offsets for d in range(k)]
        ranks = [r + o for r in ranks for o in offsets]
    return tuple(ranks)
