"""The resolved specification: what the user wrote, checked and typed (the output of compiler/check.py).

Sizes stay sympy expressions of the user's named sizes (`Spec.values` gives each symbol its number), so that the
cost model can print formulas; everything else is a plain Python value. All classes are frozen.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from compiler.diagnostics import Span
from compiler.layout import failures as FAIL
from compiler.layout.cluster import Cluster
from compiler.layers.attention import Attention
from compiler.layers.cross_entropy import CrossEntropy
from compiler.layers.embedding import Embedding
from compiler.layers.lm_head import LMHead
from compiler.layers.mla import MLA
from compiler.layers.mlp import MLP
from compiler.layers.moe import MoE
from compiler.layers.norm import Norm
from compiler.layers.positional import Positional
from compiler.layers.residual import Residual
from compiler.symbols import Size, evaluate, size
from runtime import choices  # torch-free: the defaults the language shares with the runtime

__all__ = ("Attention", "CrossEntropy", "Embedding", "LMHead", "MLA", "MLP", "MoE", "Norm", "Positional", "Residual",
           "Repeat", "Size", "Model", "Device", "Mesh", "Optimizer", "LRSchedule", "Data", "Train", "Spec", "walk",
           "axis_values")


# ---------------------------------------------------------------------------------------------------------------
# Model layers. Each takes the residual stream of width `hidden` and returns one of the same width, except the
# embedding (tokens in), the LM head (logits out) and the loss (a scalar out). Each kind's resolved class is its own
# module's (compiler/layers/<kind>.py, with its schema and its builder), imported above for the Spec's readers;
# `repeat` is the language's, not a layer kind.


@dataclass(frozen=True, kw_only=True)
class Repeat:
    """`count` copies of `body` in sequence, each with its own weights (the transformer layers)."""
    count: Size
    body: tuple
    span: Span


def walk(layers):
    """Every layer of a body, in order, inside residuals and repeats too (a repeat's body once)."""
    for x in layers:
        if isinstance(x, (Residual, Repeat)):
            yield from walk(x.body)
        else:
            yield x


def node_dispatched(spec) -> bool:
    """Whether some `moe` of `spec` dispatches grouped without `rebalance`: the layers the node dispatch
    (runtime/moe_nodes.py) runs."""
    return any(isinstance(x, MoE) and x.dispatch == "grouped" and x.rebalance is None for x in walk(spec.model.layers))


# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Model:
    name: str
    sizes: dict  # name -> sympy expression, in the order written
    layers: tuple
    span: Span

    # The model's named roles (the checker guarantees each exists once, in this order: embedding, [positional],
    # body, head, loss). Code reads these, never positions in `layers`.
    @property
    def embedding(self) -> Embedding:
        return next(x for x in self.layers if isinstance(x, Embedding))

    @property
    def positional(self) -> Positional | None:
        return next((x for x in self.layers if isinstance(x, Positional)), None)

    @property
    def head(self) -> LMHead:
        return next(x for x in self.layers if isinstance(x, LMHead))

    @property
    def loss(self) -> CrossEntropy:
        return next(x for x in self.layers if isinstance(x, CrossEntropy))

    @property
    def body(self) -> tuple:
        """The layers between the embeddings and the head: the blocks (`repeat`s) and any layer around them."""
        return tuple(x for x in self.layers if not isinstance(x, (Embedding, Positional, LMHead, CrossEntropy)))

    @property
    def blocks(self) -> tuple:
        """The `repeat`s of the body."""
        return tuple(x for x in self.layers if isinstance(x, Repeat))


@dataclass(frozen=True, kw_only=True)
class Device:
    """The hardware behind each mesh position, for the cost model."""
    kind: str
    """`cpu`, `a100`, `h100`, `h200` or any name with explicit figures."""
    peak_tflops: float
    """Dense bf16 peak, TFLOP/s."""
    memory_gb: float
    """Device memory, GB (1e9 bytes)."""
    intra_node_gbps: float
    """Per-device bandwidth inside a node, GB/s."""
    inter_node_gbps: float
    """Per-device bandwidth between nodes, GB/s."""
    hbm_gbps: float = 0.0
    """Memory bandwidth, GB/s (compiler/layout/devices.py documents these figures and their sources)."""
    matmul_efficiency: float = 1.0
    """Fraction of the peak a large matmul reaches."""
    attention_efficiency: float = 1.0
    """Fraction of the peak fused attention reaches."""
    intra_node_latency_us: float = 0.0
    """Latency of one step of a collective inside a node, µs."""
    inter_node_latency_us: float = 0.0
    """Latency of one step of a collective between nodes, µs."""
    op_overhead_us: float = 0.0
    """The least time one eager op takes, µs."""
    intra_node_efficiency: float = 1.0
    """Fraction of `intra_node_gbps` a training step's collectives reach (compiler/layout/devices.py)."""
    step_overhead_ms: float = 0.0
    """The runtime's own cost per step, ms."""
    units: int = 1
    """Multiprocessors a matmul's tiles spread over."""
    tile: int = 1
    """Side of a matmul's output tile."""
    host_gbps: float = 0.0
    """The device's link to its host memory, one direction, GB/s (offload's copies)."""
    host_adam_params_per_s: float = 0.0
    """Parameters per second the device's share of its host steps with AdamW (offload's host step)."""


@dataclass(frozen=True, kw_only=True)
class Mesh:
    """Where the mesh section is written (diagnostics about the machines point at it). The machines it names
    (nodes, devices per node, the device and its figures) are `Spec.cluster`; its axes are the Plan's
    (compiler/plan.py), as written in `Spec.plan`."""
    span: Span


@dataclass(frozen=True, kw_only=True)
class Optimizer:
    kind: str
    lr: float
    betas: tuple
    weight_decay: float
    eps: float


@dataclass(frozen=True, kw_only=True)
class LRSchedule:
    kind: str  # "cosine" | "constant"
    warmup: int
    min_lr: float


@dataclass(frozen=True, kw_only=True)
class Data:
    kind: str  # "synthetic" | "tokens"
    path: str = ""
    dtype: str = "uint16"
    # packed documents: the id that ends each document of a token file (runtime/packed.py), None: one stream
    document_separator: int | None = None
    # "raw" (a flat file of ids) or "npy" (np.save's file, read by its header): what check found the file to be
    format: str = "raw"
    # how check read the token file (compiler.files.Reading: dtype and where it came from, tokens, ids seen)
    reading: object = None


@dataclass(frozen=True, kw_only=True)
class FP8:
    """`precision = fp8(recipe, filter)`: bf16 training (Train.precision is "bf16") whose blocks' linears chosen by
    `filter` compute their matmuls in FP8 (runtime.fp8; runtime.choices.fp8_chosen is the rule)."""
    recipe: str = "tensorwise"
    filter: str = "auto"


@dataclass(frozen=True, kw_only=True)
class Train:
    global_batch: Size
    seq_len: Size
    steps: int
    seed: int
    precision: str
    optimizer: Optimizer
    schedule: LRSchedule
    grad_clip: float
    data: Data
    log_every: int
    checkpoint_dir: str
    checkpoint_every: int | str
    """Steps between checkpoints (0: only the last), or "auto": the Young–Daly interval of the failure model, which
    compiler/cost/goodput.py resolves to steps once the plan's step time is predicted (`checkpoint_steps`)."""
    checkpoint_async: bool = False
    """Write each checkpoint but the last in the background (runtime.checkpoint.begin with a group of its own)."""
    restarts: int = 0
    """torchrun's --max-restarts."""
    timeout: float = 600.0
    """Seconds a collective may take before the watchdog ends the job; 0: no watchdog."""
    eval_every: int = 0
    """Evaluate on held-out data after every this many steps and after the last; 0: never (runtime.config.Eval)."""
    eval_batches: int = 8
    """Global batches each evaluation reads, the same ones every time."""
    eval_split: float | None = None
    """The share of a token file's windows held out for evaluation (runtime.split); None: not written."""
    init_from: str = ""
    """A Hugging Face checkpoint (directory or .safetensors file) the run starts from; empty: initialised."""
    fp8: FP8 | None = None
    """`precision = fp8(...)`: its recipe and filter (then `precision` is "bf16", which it computes in); None: no
    FP8."""
    tokens: int | None = None
    """`tokens` as written, which set `steps` (tokens / (global_batch × seq_len), rounded up); None: `steps` was."""
    spans: tuple = field(default=(), compare=False)
    """((setting, Span), ...) of the settings written, for the rules' diagnostics."""


@dataclass(frozen=True, kw_only=True)
class Resilience:
    """The `resilience` section as written and checked, every default filled in (compiler/language.py
    RESILIENCE_SETTINGS): straggler detection and what to do about one (runtime.config.Resilience), and the failure
    model goodput is priced with (compiler/cost/goodput.py)."""

    detect: bool = True
    threshold: float = choices.STRAGGLER_THRESHOLD
    window: int = choices.STRAGGLER_WINDOW
    on_straggler: str = "report"
    """report | restart | replan."""
    exclude: str = "node"
    """What `restart` leaves out."""
    rate_per_gpu_hour: float = FAIL.DEFAULT_RATE
    """Interruptions per device-hour."""
    rate_source: str = FAIL.LLAMA3_SOURCE
    """Where the rate comes from, in words (the default's citation, or the setting as written)."""
    restart_s: float | None = None
    """One restart's seconds as written; None: predicted (start-up + checkpoint load + compile)."""
    storage_write_gbps: float | None = None
    """GB/s per node a checkpoint is written at; None: failures.STORAGE_GBPS_PER_NODE."""
    storage_read_gbps: float | None = None
    """GB/s per node it is read at; None: the write figure."""
    written: bool = False
    """Whether the file has a `resilience` section (codegen writes runtime.config.Resilience only then)."""
    spans: tuple = field(default=(), compare=False)
    """((setting, Span), ...) of the settings written."""


@dataclass(frozen=True, kw_only=True)
class Spec:
    path: str
    source: str
    model: Model
    mesh: Mesh
    cluster: Cluster
    """The machines the plan runs on (compiler/layout/cluster.py): the mesh section's nodes, devices_per_node and
    device (its figures, the mesh's overrides applied). The one place they are held: the Plan has none of them."""
    plan: "compiler.plan.Plan"
    """The plan as written: the mesh's axes and the plan section's settings, every default resolved
    (compiler.plan.Plan, the one carrier of decisions). What the compiler runs is a Plan derived from it (its
    policies' decisions added, or a search's candidate): code after the check reads that Plan, never this one."""
    train: Train
    values: dict
    """sympy Symbol -> int, for every named size of the model and train sections; not the mesh axes, which are the
    Plan's (`value(expr, plan)` binds them)."""
    resilience: Resilience = field(default_factory=Resilience)
    """The `resilience` section (its defaults where none is written)."""
    warnings: tuple = field(default=(), compare=False)
    """Diagnostics of severity "warning" the check found (settings with no effect, ...); the commands print them."""

    def on(self, cluster: Cluster) -> "Spec":
        """The same model, training and plan settings planned on other machines (a search or an elastic re-plan on
        `cluster`). The written plan keeps its axes where they multiply to the new world size, else it becomes
        `dp` over every device (as `check(cluster_only=True)` reads a mesh whose axes are the search's to choose);
        its other settings are as written (compile's default was resolved for this Spec's device)."""
        plan = self.plan
        if plan.world_size != cluster.world_size:
            plan = dataclasses.replace(plan, axes=(("dp", cluster.world_size),),
                                       spans=tuple((k, sp) for k, sp in plan.spans if not k.startswith("axis ")))
        return dataclasses.replace(self, cluster=cluster, plan=plan)

    def value(self, expr, plan=None) -> int | float:
        """The number `expr` takes: its named sizes from `values`, the axis sizes (`tp`, `dp`, ...) from `plan`."""
        if plan is None:
            return evaluate(expr, self.values)
        return evaluate(expr, {**self.values, **axis_values(plan)})


def axis_values(plan) -> dict:
    """The axis symbols' values of a Plan: every axis of compiler.plan.AXES, 1 where the plan has none (per-rank
    formulas read `hidden/tp` whether or not tp is an axis)."""
    from compiler.plan import AXES
    return {size(a): plan.size(a) for a in AXES}
