"""The Plan: every decision the compiler makes, as one frozen value.

A `Spec` is what the user wrote, resolved. A `Plan` is what the compiler will do with it: the mesh's axes, the
settings of the plan section (the user's, or a search's), the micro-batch size, and, once the policies have read the
unsharded trace, the stage layout and the tensor- and expert-parallel decisions of every traced segment. The checker
builds the Plan as written (`Spec.plan`); the Spec mirrors none of its fields (its values bind no axis). The Plan
holds no machine: its axes multiply to the world size of the Spec's Cluster (compiler/layout/cluster.py: nodes,
devices per node, the device), which says which link tier each of the Plan's groups crosses. Everything downstream
reads the Plan it is given, never `Spec.plan`: the rules (`requires(spec, plan)` of each pass module and of the
driver), the passes (`(graph, plan) -> graph`), the cost package (`estimate(...)`), the code generator and
`plan.json`.

A candidate plan is `dataclasses.replace(plan, axes=..., micro_batches=...)` on the same trace; it carries no spans
(`spans` is empty), so a rule that rejects it describes the setting in words instead of pointing at a line.

This module imports no torch: `scalec check` builds and checks a Plan without it.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from compiler.diagnostics import Span
from compiler.layout import groups as layout_groups
from runtime import choices  # torch-free: the names the language shares with the runtime

AXES = choices.AXES
WRAPPER_TUNING = ("ddp_bucket_bytes", "fsdp_prefetch")
"""The Plan's fields that tune torch's data-parallel wrappers: decided by the compiler, never written in a .scale."""


@dataclass(frozen=True, kw_only=True)
class Plan(choices.DataParallelMode):
    # -- the mesh ----------------------------------------------------------------------------------------------------
    axes: tuple
    """((axis, size), ...) outermost first, as the mesh declares them. They multiply to the world size of the
    machines the plan is for (compiler/layout/cluster.py `Cluster`, the Spec's: the Plan holds no machine)."""
    placement: str | tuple | None = None
    """Which rank each coordinate of the mesh gets, as the mesh section's `placement` writes it: None (not written)
    the mesh's own order, the last axis fastest over the ranks; `"auto"`; or a tuple of axis names innermost first
    (`order(tp, pp, dp)`), checked against `axes` (compiler/layout/placement.py `order`, `auto` turn it into a
    RankMap). Held and reported (`describe`, plan.json); the groups, their pricing and the program do not read it
    yet."""
    # -- the settings of the plan section ----------------------------------------------------------------------------
    data_parallel: str
    """`ddp` (replicated state, gradients all-reduced), `zero1` (AdamW state sharded over dp), `zero2` (and the
    gradients) or `fsdp` (ZeRO-3: the weights too)."""
    micro_batches: int
    """Gradient-accumulation micro-batches per optimizer step on each batch rank (pipeline micro-batches under pp)."""
    global_batch: int
    """Sequences per optimizer step, over all ranks."""
    seq_len: int
    tp_layers: tuple = ("attention", "mlp", "vocab")
    """What the `tp` axis shards: attention heads, MLP inner width, the vocabulary (embedding, head, loss)."""
    sequence_parallel: bool = False
    """Shard norms, residuals and dropout-free elementwise work along the sequence over `tp` (Korthikanti et al.)."""
    pad_vocab: bool = False
    """Pad the vocabulary to a multiple of `tp`; the padded logits are masked out of the loss."""
    schedule: str = "1f1b"
    """Pipeline schedule over `pp`: gpipe, 1f1b, interleaved-1f1b, zero-bubble (ZB-H1) or dualpipev (DeepSeek's
    DualPipeV, two stages per rank in a V)."""
    virtual_stages: int = 1
    """Stages per pp rank: interleaved-1f1b's choice; 2 under dualpipev; 1 otherwise."""
    layout: tuple = ()
    """The manual stage layout as written, ((first block, end block), ...); empty: cost-balanced."""
    recompute: str = "none"
    """Activation recomputation of each `repeat` block in backward: `none`, `selective` (Megatron's: the attention
    core and the other cheap, memory-heavy ops are recomputed; matmul and collective outputs are kept) or `full`
    (each block recomputed from its input)."""
    compile: bool = False
    """torch.compile the program's regions (runtime.compile); as written or, if not, on on GPUs (`compiles`)."""
    grad_reduce: str = "fp32"
    """Under bf16: gradients accumulated and reduced in fp32 (main gradients) or bf16 (runtime.precision)."""
    fp32_residual: bool = False
    """Under bf16: the residual stream stays fp32; every other activation is bf16 (runtime.precision)."""
    fsdp_grad_sync: str = "step"
    """FSDP2 (fsdp, zero2), several micro-batches, no pp: reduce-scatter once per `step` or every `micro_batch`."""
    context_parallel: str = "all_gather"
    """Attention over a sequence sharded over `cp`: `all_gather` (keys and values gathered over cp once per layer,
    their gradient reduce-scattered), `ring` (passed around the cp group, cp − 1 steps) or `all_to_all` (Ulysses:
    heads scattered over cp, the sequence gathered). Each cp rank holds chunks i and
    2·cp − 1 − i of every sequence (load-balanced for the causal mask)."""
    offload: str = "none"
    """Where model state or activations leave the device for the host: `none`, `optimizer` (Megatron's fractional
    optimizer offload: `offload_fraction` of the optimizer's state kept and stepped on the host, its gradients
    copied device -> host each step and its updated parameters back), `params` (FSDP2's CPUOffloadPolicy, fsdp
    only: parameters, gradients and optimizer state sharded on the host, each unit's shard copied to the device
    before its all-gather, gradients to the host after the reduce-scatter, the optimizer step on the host) or
    `activations` (the saved activations of `offload_modules` copied to the host in forward and back in
    backward)."""
    offload_fraction: float = 1.0
    """offload = optimizer: the share of the optimizer's state (the fp32 master where the optimizer keeps one, and
    AdamW's moments), by parameter count, kept and stepped on the host; 0..1."""
    offload_modules: tuple = ()
    """offload = activations: which block module kinds' saved activations go to the host ("attention", "mlp");
    empty: every block module."""
    ep_dispatch: str = "nodes"
    """How a grouped MoE (`dispatch = grouped`) sends tokens to experts on other nodes: `nodes` (each token crosses
    to a node once, to the rank of its own local index there, and fans out inside the node; the combine sums on the
    node first: runtime/moe_nodes.py, DeepSeek-V3's node-limited routing) or `direct` (each choice to its expert's
    rank). Takes effect where the ep group spans nodes (`ep_nodes`)."""
    # -- the data-parallel wrappers' tuning: the compiler's, not the user's ------------------------------------------
    ddp_bucket_bytes: int = 25 * 2 ** 20
    """The gradient all-reduce's bucket, bytes: DDP's `bucket_cap_mb`, bf16's main-gradient buckets and pipeline
    stages' buckets after the schedule (runtime.config.Parallel.ddp_bucket_mb, written by compiler/codegen). One
    figure for the three that must agree: the step-time model (compiler/cost/step_time.py) leaves only the last
    bucket's all-reduce after the backward, the memory model holds one bucket of the pipeline stages' flattened
    all-reduce, and the program buckets by it. 25 MiB: torch's default `bucket_cap_mb`; another value would have to
    be measured on GPUs first (bench/). Not a keyword of the .scale language: the compiler decides it (a search may
    vary it); plan.json leaves it out (`to_json`), the program's Parallel records it."""
    fsdp_prefetch: int = 1
    """FSDP2 (fsdp, zero2 over dp > 1): how many blocks ahead each block's forward and backward issue their
    all-gathers (runtime.config.Parallel.fsdp_prefetch, written by compiler/codegen). The memory model holds the
    root and 1 + this many blocks gathered; the step-time model exposes only the first unit's gather, the others
    running under the previous unit's compute, which takes at least 1. Not a keyword of the .scale language: the
    compiler decides it (a search may vary it); plan.json leaves it out (`to_json`), the program's Parallel records
    it. At least 1: 0 (FSDP2's own order, which the runtime accepts) is not what either model costs."""
    # -- what the policies decided from the unsharded trace (empty until `decide`) ----------------------------------
    stages: tuple = ()
    """((first block, end block), ...) per pipeline stage, on the pp rank `stage_layout` puts it. Empty without
    pp."""
    tp: tuple = ()
    """((segment name, passes.tensor_parallel.Decision), ...): regions, vocabulary nodes."""
    ep: tuple = ()
    """((segment name, (passes.expert_parallel.Placement, ...)), ...)."""
    ep_nodes: tuple = ()
    """(nodes, local): the nodes each ep group spans and its ranks on each, where `ep_dispatch = nodes` takes effect
    on the Cluster (`with_ep_nodes`: compiler/layout/groups.py `ep_split`); empty: direct dispatch."""
    # -- where each setting came from ------------------------------------------------------------------------------
    spans: tuple = field(default=(), compare=False)
    """((key, Span), ...): `axis tp`, `micro_batches`, `global_batch`, ... as written; empty for a candidate."""

    def __post_init__(self):
        """Refuse wrapper tuning the cost models cannot cost (a search that varies it meets this, not a user)."""
        if self.ddp_bucket_bytes <= 0:
            raise ValueError(f"plan ddp_bucket_bytes must be positive, not {self.ddp_bucket_bytes}")
        if self.fsdp_prefetch < 1:
            raise ValueError(f"plan fsdp_prefetch must be at least 1 (the depth the memory and step-time models "
                             f"cost), not {self.fsdp_prefetch}")

    # -- derived, in one place ---------------------------------------------------------------------------------------

    def size(self, axis: str) -> int:
        for name, n in self.axes:  # at most four pairs: a scan, not a dict per call (a search makes 300k calls)
            if name == axis:
                return n
        return 1

    @property
    def _zero_dp(self) -> int:
        """The dp size the data-parallel mode's properties (choices.DataParallelMode: zero_stage, shards_*) read."""
        return self.size("dp")

    @property
    def world_size(self) -> int:
        """The ranks of the mesh: the product of its axes."""
        return math.prod(n for _, n in self.axes)

    @property
    def groups(self) -> layout_groups.Groups:
        """Every process group of this plan's mesh (compiler/layout/groups.py); which tier each crosses is the
        Cluster's to say (compiler/layout/cluster.py `Cluster.tier`)."""
        return layout_groups.groups(self.axes, self.ep_nodes)

    @property
    def batch_ranks(self) -> int:
        """Ranks the global batch is split over: the data group, dp × ep (ep is folded out of data parallelism)."""
        return self.groups["data"].size

    @property
    def grad_ranks(self) -> int:
        """Ranks the dense gradients are averaged over: the batch group, dp × ep × cp (each holds an equal share of
        the step's tokens: whole sequences over dp and ep, 1/cp of every sequence over cp)."""
        return self.groups["batch"].size

    @property
    def micro_batch_size(self) -> int:
        """Sequences in one micro-batch on one rank: global_batch / (dp · ep · micro_batches)."""
        return self.global_batch // (self.batch_ranks * self.micro_batches)

    @property
    def pipeline_stages(self) -> int:
        return self.size("pp") * self.virtual_stages

    @property
    def stage_layout(self):
        """Where the pipeline's stages live and how many micro-batches pass them (runtime.schedule.Layout): stage s
        on pp rank s mod pp, or folded in a V under dualpipev. What the schedule, its proof, the program's stages,
        checkpoints and the reports by stage read. (Imported here: `scalec check` reads no schedule module.)"""
        from runtime import schedule as runtime_schedule
        return runtime_schedule.Layout.of(self.schedule, self.size("pp"), self.virtual_stages, self.micro_batches)

    def stages_of(self, pp_rank: int) -> tuple:
        """The stage indices pp rank `pp_rank` runs (several under interleaving and dualpipev), in chunk order."""
        if not self.stages:
            return ()
        return tuple(self.stage_layout.stages_of(pp_rank))

    def decision(self, field_name: str, segment: str):
        """The tp or ep decision of one traced segment, or None."""
        return dict(getattr(self, field_name)).get(segment)

    @property
    def compiles(self) -> bool:
        """Whether the program is compiled: `compile`, except under a zero-bubble or dualpipev pipeline, whose split
        backward would run each compiled region's backward (one autograd node) twice; written there, it is an error
        (E0611); and under activation offload, whose hooks choosing the modules would not run inside a compiled
        block (written there: E0333)."""
        return (self.compile and not (self.schedule in choices.SPLIT_BACKWARD and self.size("pp") > 1)
                and self.offload != "activations")

    @property
    def syncs_each_micro_batch(self) -> bool:
        """Whether FSDP2 reduce-scatters every micro-batch's gradients: `fsdp_grad_sync = micro_batch` where it has
        an effect (fsdp or zero2 over dp > 1, several micro-batches, no pp; elsewhere the check warns, W0306)."""
        return (self.fsdp_grad_sync == "micro_batch" and self.shards_grads
                and self.micro_batches > 1 and self.size("pp") == 1)

    def span(self, key: str) -> Span | None:
        """Where `key` was written (`axis tp`, `micro_batches`, ...), or None for a generated candidate."""
        for k, span in reversed(self.spans):  # the last written, as a dict of them; a candidate has none
            if k == key:
                return span
        return None

    def describe(self) -> str:
        """One line naming the plan, for diagnostics about a candidate that has no source."""
        mesh = " × ".join(f"{a}={n}" for a, n in self.axes)
        return f"{mesh} ({', '.join(self.settings_words().values())})"

    def settings_words(self) -> dict:
        """The plan's settings as `describe` words them, by the setting (one that is off is absent): what
        compiler/search/written.py compares, setting by setting, between two plans of one mesh."""
        m = self.micro_batches
        out = {"micro_batches": f"{m} micro-batch{'es' if m != 1 else ''}", "data_parallel": self.data_parallel}
        if self.size("pp") > 1:
            out["schedule"] = self.schedule + (f" v={self.virtual_stages}" if self.virtual_stages > 1 else "")
        if self.sequence_parallel:
            out["sequence_parallel"] = "sequence parallel"
        if self.size("cp") > 1:
            out["context_parallel"] = f"context parallel {self.context_parallel}"
        if self.recompute != "none":
            out["recompute"] = f"{self.recompute} recompute"
        if self.offload != "none":
            out["offload"] = offload_text(self)
        if self.syncs_each_micro_batch:
            out["grad_sync"] = "reduce-scatter every micro-batch"
        if self.compiles:
            out["compiled"] = "compiled"
        if self.placement is not None:
            out["placement"] = "placement " + placement_text(self.placement)
        return out

    def to_json(self, cluster=None) -> dict:
        """The plan as plan.json records it: every setting and decision, no spans, and not the data-parallel
        wrappers' tuning (`ddp_bucket_bytes`, `fsdp_prefetch`: program.py's Parallel records the values the run
        uses, and plan.json's keys stay those of the language's settings and the policies' decisions). With
        `cluster` (compiler/layout/cluster.py, the machines the plan is for), its `nodes` and `devices_per_node`
        follow `axes`, as the mesh section writes them (plan.json's keys as they were when the Plan held them)."""
        def plain(x):
            if dataclasses.is_dataclass(x):
                return {k: plain(v) for k, v in dataclasses.asdict(x).items()}
            if isinstance(x, (tuple, list)):
                return [plain(v) for v in x]
            if isinstance(x, dict):
                return {k: plain(v) for k, v in x.items()}
            return x
        out = {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self)
               if f.name not in ("spans", "tp", "ep", *WRAPPER_TUNING)
               and (f.name != "context_parallel" or self.size("cp") > 1)  # plan.json without cp: as before
               and (not f.name.startswith("offload") or self.offload != "none")  # and without offload
               and (f.name != "placement" or self.placement is not None)  # and without a placement written
               and (not f.name.startswith("ep_") or self.ep_nodes or self.ep_dispatch != "nodes")}  # ep by node
        out["axes"] = {a: n for a, n in self.axes}
        if cluster is not None:
            rest = {k: out.pop(k) for k in list(out) if k != "axes"}
            out.update(nodes=cluster.nodes, devices_per_node=cluster.devices_per_node, **rest)
        out["micro_batch_size"] = self.micro_batch_size
        out["tp"] = {seg: plain(d) for seg, d in self.tp}
        out["ep"] = {seg: plain(list(ps)) for seg, ps in self.ep}
        return out


_FIELDS = frozenset(f.name for f in dataclasses.fields(Plan))


def placement_text(placement: str | tuple) -> str:
    """A written placement as the mesh section writes it: `auto`, or `order(tp, pp, dp)`."""
    return placement if isinstance(placement, str) else f"order({', '.join(placement)})"


def offload_text(plan) -> str:
    """The plan's offload in words: `optimizer offload 50%`, `parameter offload`, `activation offload (mlp)`."""
    if plan.offload == "optimizer":
        return f"optimizer offload {plan.offload_fraction:.0%}"
    if plan.offload == "activations":
        return "activation offload" + (f" ({', '.join(plan.offload_modules)})" if plan.offload_modules else "")
    return "parameter offload" if plan.offload == "params" else "no offload"


def ep_nodes_of(plan: Plan, spec, grouped: bool) -> tuple:
    """`Plan.ep_nodes` of `plan` for `spec` (its model and Cluster): the ep split by node (compiler/layout/groups.py
    `ep_split`) where the plan dispatches by node, its mesh keeps its own rank order (a written `placement` moves
    ranks between nodes: direct there) and some `moe` dispatches grouped without `rebalance` (the only layers the
    node dispatch runs: a padded or re-placed one is sent directly, and a plan without one builds no ep halves);
    else (). `grouped`: `spec.node_dispatched(spec)`, which the caller holds (a search asks once, not per
    candidate; and this module imports no spec)."""
    if plan.ep_dispatch != "nodes" or plan.placement is not None or spec.cluster is None:
        return ()
    if not grouped:
        return ()
    return layout_groups.ep_split(tuple(plan.axes), spec.cluster.devices_per_node)


def with_ep_nodes(plan: Plan, spec, grouped: bool) -> Plan:
    """`plan` with its `ep_nodes` for `spec` (the decided fields' kind: compile and the search's candidates set it
    before lowering, since the expert-parallel pass reads it)."""
    nodes = ep_nodes_of(plan, spec, grouped)
    return plan if nodes == plan.ep_nodes else evolve(plan, ep_nodes=nodes)


def evolve(plan: Plan, **changes) -> Plan:
    """`dataclasses.replace(plan, **changes)` without re-running the constructor: a search makes tens of thousands
    of candidates, and `replace` (which calls `__init__` with every field) was a tenth of its time. The same value:
    every field copied, the changed ones set; `__post_init__`'s checks read only the wrapper tuning, so a change to
    it goes through `replace`."""
    if not changes.keys() <= _FIELDS:
        raise TypeError(f"Plan has no field {', '.join(sorted(changes.keys() - _FIELDS))}")
    if any(k in changes for k in WRAPPER_TUNING):
        return dataclasses.replace(plan, **changes)
    new = object.__new__(Plan)
    new.__dict__.update(plan.__dict__)
    new.__dict__.update(changes)
    return new


def compiles(setting: bool | None, device_kind: str) -> bool:
    """`plan { compile }` as written, or its default for the device: on on GPUs, off on cpu, where compiling a
    small model costs more than it saves."""
    return setting if setting is not None else device_kind != "cpu"
