"""The resolved specification: what the user wrote, checked and typed (the output of compiler/check.py).

Sizes stay sympy expressions of the user's named sizes (`Spec.values` gives each symbol its number), so that the
cost model can print formulas; everything else is a plain Python value. All classes are frozen.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from compiler.diagnostics import Span
from compiler.symbols import evaluate, size

Size = sympy.Expr


# ---------------------------------------------------------------------------------------------------------------
# Model layers. Each takes the residual stream of width `hidden` and returns one of the same width, except the
# embedding (tokens in), the LM head (logits out) and the loss (a scalar out).


@dataclass(frozen=True, kw_only=True)
class Embedding:
    """Token embedding: `vocab` rows of width `hidden`."""
    vocab: Size
    hidden: Size
    span: Span
    scaled: bool = False
    """The looked-up rows are multiplied by √hidden, in the activations' dtype (Gemma's normalizer); the weight a
    tied head reads is not."""


@dataclass(frozen=True, kw_only=True)
class Positional:
    """Learned absolute position embedding, added to the token embedding."""
    positions: Size
    hidden: Size
    span: Span


@dataclass(frozen=True, kw_only=True)
class Norm:
    """LayerNorm (with bias) or RMSNorm (scale only) over the last dim."""
    kind: str  # "layernorm" | "rmsnorm"
    hidden: Size
    eps: float
    span: Span
    zero_centered: bool = False
    """RMSNorm scaled by (1 + weight), the weight starting at zero, computed in fp32 (Gemma's RMSNorm;
    Megatron-Core's zero-centred gamma)."""


@dataclass(frozen=True, kw_only=True)
class Attention:
    """Causal multi-head self-attention; `kv_heads` < `heads` gives grouped-query attention."""
    hidden: Size
    heads: Size
    kv_heads: Size
    bias: bool
    span: Span
    qkv_bias: bool | None = None
    """Biases on q, k and v (Qwen 2: true with `bias = false`); None: as `bias`."""
    rope_theta: float = 0.0
    """Rotary position embeddings' base (runtime/rotary.py); 0: none."""
    rope_scaling: tuple | None = None
    """Llama 3's frequency scaling: (factor, low_freq_factor, high_freq_factor, original_seq); linear scaling (every
    frequency divided by factor, Gemma 3's global layers): (factor,); YaRN's: ("yarn", factor, original_seq,
    beta_fast, beta_slow, mscale, mscale_all_dim, attention_factor, truncate); or None."""
    head_dim: Size | None = None
    """Each head's width D (Qwen 3, Mistral-Nemo, Gemma: not hidden / heads); None: hidden / heads."""
    qk_norm: str = "none"
    """"rmsnorm": each head's query and key normalised over D before the rotation (Qwen 3, OLMo 2), one scale of D
    shared by every head; "zero_centered_rmsnorm": the same scaled by (1 + weight) (Gemma 3); "none"."""
    qk_norm_eps: float = 1e-6
    """The q/k norm's epsilon (Qwen 3: its rms_norm_eps)."""
    window: Size | None = None
    """Sliding-window attention (Mistral 7B, Qwen 2's upper layers): each query sees itself and the window - 1
    keys before it; None: every earlier key (full causal)."""
    window_span: Span | None = field(default=None, compare=False, repr=False)
    """Where `window` is written (a warning that it has no effect points there)."""
    softcap: float | None = None
    """Attention scores soft-capped to (-C, C) before the softmax, C·tanh(s / C) (Gemma 2's
    attn_logit_softcapping); None: not capped."""
    query_scale: Size | None = None
    """Scores are q·k / √query_scale instead of / √D (Gemma's query_pre_attn_scalar); None: D."""

    @property
    def head_width(self):
        """D: `head_dim` when written, else hidden / heads (the expression every model before head_dim had, so
        their formulas and generated programs are unchanged)."""
        return self.hidden / self.heads if self.head_dim is None else self.head_dim


@dataclass(frozen=True, kw_only=True)
class MLA:
    """Multi-head latent attention (DeepSeek-V2/V3): queries through a low-rank bottleneck (q_a, its norm, q_b; or
    one q projection without `q_lora_rank`), keys and values from a shared latent (kv_a to kv_lora_rank plus one
    rotary key of qk_rope_head_dim shared by every head, the latent normed, then kv_b to heads × (qk_nope_head_dim +
    v_head_dim)), causal attention scaled by 1/√(qk_nope_head_dim + qk_rope_head_dim), o from heads × v_head_dim."""
    hidden: Size
    heads: Size
    kv_lora_rank: Size
    qk_nope_head_dim: Size
    qk_rope_head_dim: Size
    v_head_dim: Size
    span: Span
    q_lora_rank: Size | None = None
    """The queries' bottleneck (DeepSeek-V3: 1536); None: q projected from hidden directly (DeepSeek-V2-Lite)."""
    rope_theta: float = 10000.0
    """The rotary base of the shared key and each query's rotary part."""
    rope_interleave: bool = True
    """Rotary pairs are adjacent dimensions (2i, 2i + 1), as DeepSeek's weights lay them out (transformers'
    rope_interleave); false: the halves (i, i + R/2)."""
    norm_eps: float = 1e-6
    """The epsilon of the q and kv latents' RMS norms."""
    rope_scaling: tuple | None = None
    """YaRN's scaling of the rotation, ("yarn", factor, original_seq, beta_fast, beta_slow, mscale, mscale_all_dim,
    attention_factor, truncate) (runtime/rotary.py); None: unscaled."""


@dataclass(frozen=True, kw_only=True)
class MLP:
    """Two-layer MLP: GELU (`up`, `down`), or gated, SwiGLU or GeGLU (`gate`, `up`, `down`)."""
    hidden: Size
    ffn: Size
    act: str  # "gelu" | "swiglu" | "geglu" (gelu with tanh approximation of the gate, times up: Gemma)
    bias: bool
    span: Span


@dataclass(frozen=True, kw_only=True)
class MoE:
    """Mixture of experts in place of an MLP: a router picks `top_k` of `experts` MLPs for each token; each expert
    takes at most `capacity` tokens of each sequence, the others' choices are dropped."""
    hidden: Size
    ffn: Size
    experts: Size
    top_k: int
    capacity_factor: float | str
    """A multiple of a balanced share, or "none": dropless, capacity = seq (compiler/layers/moe.py DROPLESS)."""
    act: str  # "gelu" | "swiglu"
    aux_loss: float
    """Weight of the auxiliary load-balancing loss (Switch/GShard); 0 turns it off."""
    dropped: str
    """`residual`: a dropped choice adds nothing, the token goes on through the enclosing residual (Switch);
    `identity`: it adds the gate-weighted token itself."""
    capacity: Size
    """Slots per expert per sequence, a size symbol (`capacity`, `capacity_2`, ...) whose value the checker sets
    from the sequence length: min(seq_len, ceil(capacity_factor · top_k · seq_len / experts))."""
    span: Span
    renormalize: bool | None = None
    """Whether the gates of a token's top_k choices are renormalised to sum to 1 (else each is its softmax
    probability over all the experts); None: as before the setting existed, renormalised when top_k > 1."""
    capacity_span: Span | None = field(default=None, compare=False)
    """Where `capacity_factor` is written (None when defaulted): what a warning on the capacity points at."""
    shared_ffn: Size | None = None
    """Inner width of the shared expert, an always-on MLP (the experts' act, no biases) whose output every token
    adds to the routed experts' (Qwen-MoE, DeepSeekMoE); None: no shared expert."""
    shared_gate: str = "none"
    """`none`: the shared expert's output is added as is; `sigmoid`: scaled per token by sigmoid(x · w), w a
    hidden-wide vector (Qwen2-MoE's shared_expert_gate)."""
    scoring: str = "softmax"
    """An expert's score: `softmax` over the experts, or `sigmoid` of its own logit (DeepSeek-V3)."""
    groups: int = 1
    """Group-limited routing (DeepSeek-V3's n_group): the experts cut into this many groups..."""
    topk_groups: int = 1
    """...of which a token chooses its experts within the best this many (a group's score: its two best experts')."""
    routed_scale: float = 1.0
    """The routed gates multiplied by it (DeepSeek-V3's routed_scaling_factor)."""
    bias_update: float = 0.0
    """Auxiliary-loss-free balancing (DeepSeek-V3): a per-expert bias on the scores a token chooses by, moved by this
    much after each step against the step's load (runtime.moe.ExpertBias); 0: none."""
    dispatch: str = "padded"
    """Dropless routing's way to the experts: `padded`, every expert a buffer of `capacity` (= seq) slots per
    sequence; `grouped`, the tokens sorted by expert, variable all-to-alls over ep, grouped matmuls (issue 25)."""


@dataclass(frozen=True, kw_only=True)
class Residual:
    """x + body(x)."""
    body: tuple
    span: Span


@dataclass(frozen=True, kw_only=True)
class Repeat:
    """`count` copies of `body` in sequence, each with its own weights (the transformer layers)."""
    count: Size
    body: tuple
    span: Span


@dataclass(frozen=True, kw_only=True)
class LMHead:
    """Projection to the vocabulary; `tied` reuses the token embedding's weight."""
    vocab: Size
    hidden: Size
    tied: bool
    bias: bool
    span: Span
    softcap: float | None = None
    """Logits soft-capped to (-C, C), C·tanh(logits / C) (Gemma 2's final_logit_softcapping); None: not capped."""


@dataclass(frozen=True, kw_only=True)
class CrossEntropy:
    """Mean next-token cross-entropy over all tokens of the batch."""
    span: Span


def walk(layers):
    """Every layer of a body, in order, inside residuals and repeats too (a repeat's body once)."""
    for x in layers:
        if isinstance(x, (Residual, Repeat)):
            yield from walk(x.body)
        else:
            yield x


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


@dataclass(frozen=True, kw_only=True)
class Mesh:
    """The machines behind the mesh: the device and its figures. The axes, nodes and devices per node are decisions
    the search may change: they are the Plan's (compiler/plan.py), as written in `Spec.plan`."""
    device: Device
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
    checkpoint_every: int
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
    spans: tuple = field(default=(), compare=False)
    """((setting, Span), ...) of the settings written, for the rules' diagnostics."""


@dataclass(frozen=True, kw_only=True)
class Spec:
    path: str
    source: str
    model: Model
    mesh: Mesh
    plan: "compiler.plan.Plan"
    """The plan as written: the mesh's axes and machines and the plan section's settings, every default resolved
    (compiler.plan.Plan, the one carrier of decisions). What the compiler runs is a Plan derived from it (its
    policies' decisions added, or a search's candidate): code after the check reads that Plan, never this one."""
    train: Train
    values: dict
    """sympy Symbol -> int, for every named size of the model and train sections; not the mesh axes, which are the
    Plan's (`value(expr, plan)` binds them)."""
    warnings: tuple = field(default=(), compare=False)
    """Diagnostics of severity "warning" the check found (settings with no effect, ...); the commands print them."""

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
