"""Build the single-device model of a Spec as torch modules, on the meta device unless asked otherwise.

The model is cut into *segments*: the top level (embedding, anything outside `repeat`, final norm, head, loss) and
one block per `repeat`. A segment's children are leaf torch modules with flat, stable names (`attn_q`, `mlp_down`,
`norm_1`), so that its traced graph reads as straight-line code and every parameter has a short name. A `repeat` is
a `runtime.layers.Repeat` of identical blocks; the block is traced once, whatever the layer count.

While building, each leaf records the symbolic shape of its parameters (sympy expressions of the user's sizes), and
the forward code marks which .scale layer each traced operation comes from (see compiler/trace.py).
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Callable

import sympy
import torch
import torch.nn.functional as F
from torch import nn

from compiler import spec as S
from compiler.diagnostics import Span
# Packed documents (runtime/packed.py), traced as calls like the ones below
from runtime.packed import attention as packed_attention, cross_entropy as packed_cross_entropy, \
    positions as packed_positions, rotate as packed_rotate
from runtime.attention import latent, sliding_window, softcapped
from runtime.rotary import rotate
from runtime.layers import Bias, Repeat, ZeroCenteredRMSNorm
# Traced as calls (compiler/trace.py wraps them): the router's data-dependent choices never reach Python control
# flow, and the emitted program calls the same functions.
from runtime.moe import Experts, ExpertBias, combine, dispatch, route, sort_tokens, unsort_combine

# The .scale layer being run while tracing; compiler/trace.py copies it into node.meta.
CURRENT_LAYER: contextvars.ContextVar = contextvars.ContextVar("scalec_layer", default=None)



@contextlib.contextmanager
def _at(layer) -> None:
    token = CURRENT_LAYER.set(layer)
    try:
        yield
    finally:
        CURRENT_LAYER.reset(token)


@dataclass(frozen=True)
class _Step:
    """One layer of a segment: what it is in the spec, and how it transforms the residual stream."""

    layer: object
    run: Callable  # (segment, x) -> x
    body: tuple = ()


class Segment(nn.Module):
    """A run of layers whose leaf modules are direct, flatly named children.

    `param_shapes` maps each parameter name to its shape as sympy expressions of the spec's sizes.
    """

    def __init__(self, spec: S.Spec, device):
        super().__init__()
        self._spec = spec
        self._device = device
        self._counts: dict[str, int] = {}
        self._names: dict[int, dict] = {}
        self.param_shapes: dict[str, tuple] = {}
        self.spans: dict[str, Span] = {}
        self.residual_out: list[str] = []  # linears writing into the residual stream (GPT-2 scales their init)

    # -- construction helpers -----------------------------------------------------------------------------------

    def _n(self, expr) -> int:
        return int(self._spec.value(expr))

    def _leaf(self, name: str, module: nn.Module, shapes: dict[str, tuple], span: Span) -> str:
        self.add_module(name, module.to(self._device))
        for pname, shape in shapes.items():
            if getattr(module, pname, None) is not None:
                self.param_shapes[f"{name}.{pname}"] = tuple(sympy.sympify(d) for d in shape)
        self.spans[name] = span
        return name

    def _name(self, base: str, total: int) -> str:
        self._counts[base] = self._counts.get(base, 0) + 1
        return base if total == 1 else f"{base}_{self._counts[base]}"

    def _steps(self, layers, totals) -> tuple:
        return tuple(self._step(x, totals) for x in layers)

    def _step(self, x, totals) -> _Step:
        match x:
            case S.Residual(body=body):
                inner = self._steps(body, totals)
                return _Step(x, lambda seg, h, inner=inner: h + seg._run(inner, h), inner)
            case S.Norm(kind=kind, hidden=h, eps=eps):
                n = self._n(h)
                mod = (nn.LayerNorm(n, eps=eps) if kind == "layernorm" else
                       ZeroCenteredRMSNorm(n, eps=eps) if x.zero_centered else nn.RMSNorm(n, eps=eps))
                name = self._leaf(self._name("norm", totals["norm"]), mod, {"weight": (h,), "bias": (h,)}, x.span)
                return _Step(x, lambda seg, t, name=name: getattr(seg, name)(t))
            case S.Attention():
                return self._attention(x, self._name("attn", totals["attn"]))
            case S.MLA():
                return self._mla(x, self._name("attn", totals["attn"]))
            case S.MLP():
                return self._mlp(x, self._name("mlp", totals["mlp"]))
            case S.MoE():
                return self._moe(x, self._name("moe", totals["moe"]))
        raise AssertionError(f"no step for {type(x).__name__}")

    def _linear(self, name: str, d_in, d_out, bias: bool, span: Span) -> str:
        mod = nn.Linear(self._n(d_in), self._n(d_out), bias=bias)
        return self._leaf(name, mod, {"weight": (d_out, d_in), "bias": (d_out,)}, span)

    def _attention(self, a: S.Attention, p: str) -> _Step:
        hd = a.head_width  # D: hidden / heads unless the attention gives its heads their own width
        head_dim = self._n(hd)
        qkv_bias = a.bias if a.qkv_bias is None else a.qkv_bias
        q = self._linear(f"{p}_q", a.hidden, a.heads * hd, qkv_bias, a.span)
        k = self._linear(f"{p}_k", a.hidden, a.kv_heads * hd, qkv_bias, a.span)
        v = self._linear(f"{p}_v", a.hidden, a.kv_heads * hd, qkv_bias, a.span)
        o = self._linear(f"{p}_o", a.heads * hd, a.hidden, a.bias, a.span)
        self.residual_out.append(o)
        qn = kn = None
        if a.qk_norm != "none":  # one scale of D, shared by every head (Qwen 3's q_norm, k_norm; Gemma 3's (1 + w))
            norm = ZeroCenteredRMSNorm if a.qk_norm == "zero_centered_rmsnorm" else nn.RMSNorm
            qn, kn = (self._leaf(f"{p}_{w}_norm", norm(head_dim, eps=a.qk_norm_eps), {"weight": (hd,)}, a.span)
                      for w in ("q", "k"))
        gqa = self._n(a.kv_heads) != self._n(a.heads)
        theta, scaling = a.rope_theta, a.rope_scaling
        # A window at least as long as the sequences masks nothing the causal mask keeps (check's W0207): the plain
        # causal kernel, so the program is the one without it.
        window = None if a.window is None or self._n(a.window) >= self._n(self._spec.train.seq_len) \
            else self._n(a.window)
        # Scores over √query_scale instead of √D (Gemma): written into the call only where it differs from D.
        scale = {} if a.query_scale is None or self._n(a.query_scale) == head_dim else \
            {"scale": self._n(a.query_scale) ** -0.5}
        softcap = a.softcap
        # Packed documents (runtime/packed.py): block-diagonal causal attention, rotary positions restarting at each
        # document; windows and soft caps are refused with them (compiler/rules/packed.py).
        packed = self._spec.train.data.document_separator is not None

        def heads(seg, x_BSH, linear, norm):
            # Heads are split off the last dim: (B, S, H*D) -> (B, S, H, D), normalised per head, -> (B, H, S, D).
            t_BSHD = getattr(seg, linear)(x_BSH).unflatten(-1, (-1, head_dim))
            if norm is not None:
                t_BSHD = getattr(seg, norm)(t_BSHD)
            return t_BSHD.transpose(1, 2)

        def run(seg, x_BSH):
            q_BHSD, k_BKSD, v_BKSD = heads(seg, x_BSH, q, qn), heads(seg, x_BSH, k, kn), heads(seg, x_BSH, v, None)
            if theta:
                q_BHSD, k_BKSD = (packed_rotate if packed else rotate)(q_BHSD, k_BKSD, theta, scaling)
            if packed:
                y_BHSD = packed_attention(q_BHSD, k_BKSD, v_BKSD, gqa, **scale)
            elif softcap is not None:  # scores capped before the mask and softmax (one traced call: runtime/attention.py)
                y_BHSD = softcapped(q_BHSD, k_BKSD, v_BKSD, softcap, window, gqa, **scale)
            elif window is None:
                y_BHSD = F.scaled_dot_product_attention(q_BHSD, k_BKSD, v_BKSD, is_causal=True, enable_gqa=gqa,
                                                        **scale)
            else:  # the token itself and the window - 1 before it (one traced call: runtime/attention.py)
                y_BHSD = sliding_window(q_BHSD, k_BKSD, v_BKSD, window, gqa, **scale)
            return getattr(seg, o)(y_BHSD.transpose(1, 2).flatten(2))
        return _Step(a, run)

    def _mla(self, a: S.MLA, p: str) -> _Step:
        """Multi-head latent attention (compiler/layers/mla.py): leaves `{p}_qa`, `{p}_qa_norm`, `{p}_qb` (or `{p}_q`),
        `{p}_kva`, `{p}_kva_norm`, `{p}_kvb`, `{p}_o`, Hugging Face's q_a_proj, q_a_layernorm, q_b_proj (q_proj),
        kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj; the heads' attention one traced call
        (runtime.attention.latent)."""
        nope, rope, vd = a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim
        q_width, kv_width = self._n(nope + rope), self._n(nope + vd)
        if a.q_lora_rank is None:
            q = self._linear(f"{p}_q", a.hidden, a.heads * (nope + rope), False, a.span)
            qa = qn = None
        else:
            qa = self._linear(f"{p}_qa", a.hidden, a.q_lora_rank, False, a.span)
            qn = self._leaf(f"{p}_qa_norm", nn.RMSNorm(self._n(a.q_lora_rank), eps=a.norm_eps),
                            {"weight": (a.q_lora_rank,)}, a.span)
            q = self._linear(f"{p}_qb", a.q_lora_rank, a.heads * (nope + rope), False, a.span)
        kva = self._linear(f"{p}_kva", a.hidden, a.kv_lora_rank + rope, False, a.span)
        kvn = self._leaf(f"{p}_kva_norm", nn.RMSNorm(self._n(a.kv_lora_rank), eps=a.norm_eps),
                         {"weight": (a.kv_lora_rank,)}, a.span)
        kvb = self._linear(f"{p}_kvb", a.kv_lora_rank, a.heads * (nope + vd), False, a.span)
        o = self._linear(f"{p}_o", a.heads * vd, a.hidden, False, a.span)
        self.residual_out.append(o)
        n_nope, n_rope, rank = self._n(nope), self._n(rope), self._n(a.kv_lora_rank)
        theta, interleaved = a.rope_theta, a.rope_interleave
        kw = ({} if interleaved else {"interleaved": False}) | ({} if a.rope_scaling is None else
                                                                {"scaling": a.rope_scaling})

        def run(seg, x_BSH):
            h_BSX = x_BSH if qa is None else getattr(seg, qn)(getattr(seg, qa)(x_BSH))
            q_BHSQ = getattr(seg, q)(h_BSX).unflatten(-1, (-1, q_width)).transpose(1, 2)
            c_BSL, kr_BSR = getattr(seg, kva)(x_BSH).split([rank, n_rope], dim=-1)
            kv_BHSW = getattr(seg, kvb)(getattr(seg, kvn)(c_BSL)).unflatten(-1, (-1, kv_width)).transpose(1, 2)
            y_BHSV = latent(q_BHSQ, kv_BHSW, kr_BSR, n_nope, theta, **kw)
            return getattr(seg, o)(y_BHSV.transpose(1, 2).flatten(2))
        return _Step(a, run)

    def _mlp(self, m: S.MLP, p: str) -> _Step:
        up = self._linear(f"{p}_up", m.hidden, m.ffn, m.bias, m.span)
        if m.act in ("swiglu", "geglu"):
            gate = self._linear(f"{p}_gate", m.hidden, m.ffn, m.bias, m.span)
        down = self._linear(f"{p}_down", m.ffn, m.hidden, m.bias, m.span)
        self.residual_out.append(down)

        if m.act == "gelu":
            def run(seg, x_BSH):
                return getattr(seg, down)(F.gelu(getattr(seg, up)(x_BSH)))
        elif m.act == "geglu":  # gelu's tanh approximation, as Gemma's gelu_pytorch_tanh
            def run(seg, x_BSH):
                return getattr(seg, down)(F.gelu(getattr(seg, gate)(x_BSH), approximate="tanh")
                                          * getattr(seg, up)(x_BSH))
        else:
            def run(seg, x_BSH):
                return getattr(seg, down)(F.silu(getattr(seg, gate)(x_BSH)) * getattr(seg, up)(x_BSH))
        return _Step(m, run)

    def _moe(self, m: S.MoE, p: str) -> _Step:
        router = self._linear(f"{p}_router", m.hidden, m.experts, False, m.span)
        shapes = {"w_up": (m.experts, m.hidden, m.ffn), "w_gate": (m.experts, m.hidden, m.ffn),
                  "w_down": (m.experts, m.ffn, m.hidden)}
        n_experts, capacity = self._n(m.experts), self._n(m.capacity)
        experts = self._leaf(f"{p}_experts", Experts(n_experts, self._n(m.hidden), self._n(m.ffn), m.act), shapes,
                             m.span)
        top_k, aux, identity = m.top_k, m.aux_loss, m.dropped == "identity"
        shared = self._shared_expert(m, p) if m.shared_ffn is not None else None
        # written into the call only where it differs from route's default (renormalised when top_k > 1)
        renorm = {} if m.renormalize is None or m.renormalize == (top_k > 1) else {"renormalize": m.renormalize}
        # DeepSeek-V3's router, likewise written only where it is not Mixtral's
        renorm.update({k: v for k, v, default in (("scoring", m.scoring, "softmax"), ("groups", m.groups, 1),
                                                  ("topk_groups", m.topk_groups, 1),
                                                  ("scale", m.routed_scale, 1.0)) if v != default})

        # DeepSeek-V3's expert bias: a leaf holding it and the step's load, handed to the router by a call
        bias = self._leaf(f"{p}_bias", ExpertBias(n_experts, m.bias_update), {}, m.span) if m.bias_update else None

        if m.dispatch == "grouped":  # dropless without padding: capacity = seq, so route drops no choice
            def run(seg, x_BSH):
                kw = renorm if bias is None else {**renorm, "bias": getattr(seg, bias)()}
                slot_BSK, gate_BSK = route(getattr(seg, router)(x_BSH), top_k, capacity, aux, **kw)
                rows_TH, counts_E = sort_tokens(x_BSH, slot_BSK, n_experts, capacity)
                y_TH = getattr(seg, experts)(rows_TH, counts_E)
                y_BSH = unsort_combine(y_TH, slot_BSK, gate_BSK, capacity)
                return y_BSH if shared is None else y_BSH + shared(seg, x_BSH)
            return _Step(m, run)

        def run(seg, x_BSH):
            kw = renorm if bias is None else {**renorm, "bias": getattr(seg, bias)()}
            slot_BSK, gate_BSK = route(getattr(seg, router)(x_BSH), top_k, capacity, aux, **kw)
            y_ENH = getattr(seg, experts)(dispatch(x_BSH, slot_BSK, n_experts, capacity))
            # dropped = identity: combine also passes a dropped choice's token itself on.
            y_BSH = combine(y_ENH, slot_BSK, gate_BSK, *((x_BSH,) if identity else ()))
            return y_BSH if shared is None else y_BSH + shared(seg, x_BSH)
        return _Step(m, run)

    def _shared_expert(self, m: S.MoE, p: str) -> Callable:
        """The shared expert: an MLP of width `shared_ffn` without biases, in the experts' act, that every token
        passes through (leaves `{p}_shared_up`, `_gate`, `_down`, which tp shards as an MLP's), its output scaled per
        token by sigmoid(x · w) under `shared_gate = sigmoid` (leaf `{p}_shared_sigmoid`, hidden → 1)."""
        up = self._linear(f"{p}_shared_up", m.hidden, m.shared_ffn, False, m.span)
        gate = self._linear(f"{p}_shared_gate", m.hidden, m.shared_ffn, False, m.span) if m.act == "swiglu" else None
        down = self._linear(f"{p}_shared_down", m.shared_ffn, m.hidden, False, m.span)
        self.residual_out.append(down)
        weigh = self._linear(f"{p}_shared_sigmoid", m.hidden, 1, False, m.span) if m.shared_gate == "sigmoid" else None

        def shared(seg, x_BSH):
            h_BSF = getattr(seg, up)(x_BSH)
            h_BSF = F.silu(getattr(seg, gate)(x_BSH)) * h_BSF if gate is not None else F.gelu(h_BSF)
            y_BSH = getattr(seg, down)(h_BSF)
            return y_BSH if weigh is None else torch.sigmoid(getattr(seg, weigh)(x_BSH)) * y_BSH
        return shared

    def _run(self, steps, x):
        for st in steps:
            with _at(st.layer):
                x = st.run(self, x)
        return x


def _totals(layers) -> dict[str, int]:
    """How many leaves of each base name a segment will hold (to number them only when there are several)."""
    counts = {"norm": 0, "attn": 0, "mlp": 0, "moe": 0}

    def walk(items):
        for x in items:
            if isinstance(x, S.Residual):
                walk(x.body)
            elif isinstance(x, S.Norm):
                counts["norm"] += 1
            elif isinstance(x, (S.Attention, S.MLA)):
                counts["attn"] += 1
            elif isinstance(x, S.MLP):
                counts["mlp"] += 1
            elif isinstance(x, S.MoE):
                counts["moe"] += 1
    walk(layers)
    return counts


class Block(Segment):
    """The body of one `repeat`: the residual stream in, the residual stream out."""

    def __init__(self, spec: S.Spec, repeat: S.Repeat, device):
        super().__init__(spec, device)
        self.repeat = repeat
        self._program = self._steps(repeat.body, _totals(repeat.body))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(self._program, x)


def _embedding_scale(hidden: int, precision: str) -> float:
    """√hidden as the activations' dtype holds it: transformers' Gemma multiplies by a tensor of that dtype, so under
    bf16 the factor itself is rounded (√3584 = 59.87 is 59.75 in bf16)."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    return float(torch.tensor(hidden ** 0.5, dtype=dtype, device="cpu"))


def _embedding(rows: int, width: int) -> nn.Module:
    """An embedding with an uninitialised weight (runtime.layers.init_parameters initialises every weight): its own
    normal_ init would cost nothing but, on the meta device, loads torch's Python reference kernels, a second of
    `scalec plan`."""
    return nn.Embedding(rows, width, _weight=torch.empty(rows, width))


class ScaleModel(Segment):
    """The whole single-device model: tokens and targets in, the mean cross-entropy out."""

    def __init__(self, spec: S.Spec, device="meta"):
        super().__init__(spec, device)
        model = spec.model  # by role: embedding, positional, body, head, loss
        emb = model.embedding
        self._emb = emb
        self._leaf("embed", _embedding(self._n(emb.vocab), self._n(emb.hidden)),
                   {"weight": (emb.vocab, emb.hidden)}, emb.span)
        self._emb_scale = _embedding_scale(self._n(emb.hidden), spec.train.precision) if emb.scaled else None
        self._pos = model.positional
        self._packed = spec.train.data.document_separator is not None
        if self._pos is not None:
            self._leaf("pos", _embedding(self._n(self._pos.positions), self._n(self._pos.hidden)),
                       {"weight": (self._pos.positions, self._pos.hidden)}, self._pos.span)
        middle = list(model.body)
        totals = _totals([x for x in middle if not isinstance(x, S.Repeat)])
        self.repeats: list[tuple[str, S.Repeat]] = []
        program = []
        for x in middle:
            if isinstance(x, S.Repeat):
                name = "blocks" if not self.repeats else f"blocks_{len(self.repeats) + 1}"
                first = Block(spec, x, device)
                again = (_meta_copier(first) if torch.device(device).type == "meta"
                         else lambda x=x: Block(spec, x, device))
                blocks = Repeat([first, *(again() for _ in range(self._n(x.count) - 1))])
                self.add_module(name, blocks)
                self.spans[name] = x.span
                self.repeats.append((name, x))
                program.append(_Step(x, lambda seg, h, name=name: getattr(seg, name)(h)))
            else:
                program.append(self._step(x, totals))
        self._program = tuple(program)
        self._head = model.head
        self._loss = model.loss
        if not self._head.tied:
            self._linear("lm_head", self._head.hidden, self._head.vocab, self._head.bias, self._head.span)
        elif self._head.bias:
            self._leaf("lm_head_bias", Bias(self._n(self._head.vocab)), {"bias": (self._head.vocab,)},
                       self._head.span)

    def has_moe(self) -> bool:
        return any(isinstance(x, S.MoE) for x in S.walk(self._spec.model.layers))

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # tokens, targets: (batch, seq) token ids; returns the mean loss over every token.
        with _at(self._emb):
            x_BSH = self.embed(tokens)
            if self._emb_scale is not None:  # Gemma: × √hidden, a constant of the activations' dtype
                x_BSH = x_BSH * self._emb_scale
        if self._pos is not None:
            with _at(self._pos):
                if self._packed:  # each token's position within its document, (B, S)
                    x_BSH = x_BSH + self.pos(packed_positions(tokens))
                else:
                    x_BSH = x_BSH + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        x_BSH = self._run(self._program, x_BSH)
        with _at(self._head):
            if self._head.tied:
                logits_BSV = F.linear(x_BSH, self.embed.weight)
                if self._head.bias:
                    logits_BSV = self.lm_head_bias(logits_BSV)
            else:
                logits_BSV = self.lm_head(x_BSH)
            if self._head.softcap is not None:  # Gemma 2: capped to (-C, C)
                logits_BSV = torch.tanh(logits_BSV * (1.0 / self._head.softcap)) * self._head.softcap
        with _at(self._loss):
            # The loss is computed in fp32 whatever the compute precision.
            if self._packed:  # the targets after a separator not predicted (runtime.packed's convention)
                return packed_cross_entropy(logits_BSV.flatten(0, 1).float(), targets.flatten())
            return F.cross_entropy(logits_BSV.flatten(0, 1).float(), targets.flatten())


def _meta_copier(module: nn.Module) -> Callable[[], nn.Module]:
    """A function making modules like `module`, on the meta device: the same class, attributes and children, each with
    its own parameters and buffers. What building it again would give without running the initialisers, which do
    nothing on meta but cost about 2 ms per block (a 4096-block model took 8 s to build)."""
    def recipe(t):
        return None if t is None else (tuple(t.shape), tuple(t.stride()), t.dtype, t.requires_grad)

    params = {k: recipe(p) for k, p in module._parameters.items()}
    buffers = {k: recipe(b) for k, b in module._buffers.items()}
    children = {k: None if m is None else _meta_copier(m) for k, m in module._modules.items()}
    cls = module.__class__
    own = ("_parameters", "_buffers", "_modules")
    # Containers are copied (a block's bookkeeping is its own: hooks, names, shapes); other values are shared.
    containers = {k: v for k, v in module.__dict__.items() if isinstance(v, (dict, list, set)) and k not in own}
    shared = {k: v for k, v in module.__dict__.items() if k not in containers and k not in own}

    def empty(r):
        return None if r is None else torch.empty_strided(r[0], r[1], dtype=r[2], device="meta")

    def make() -> nn.Module:
        new = cls.__new__(cls)
        d = new.__dict__  # set directly: nn.Module.__setattr__ is slow, and these are its own bookkeeping
        d.update(shared)
        for key, value in containers.items():
            d[key] = value.copy()
        d["_parameters"] = {k: None if r is None else nn.Parameter(empty(r), r[3]) for k, r in params.items()}
        d["_buffers"] = {k: empty(r) for k, r in buffers.items()}
        d["_modules"] = {k: None if c is None else c() for k, c in children.items()}
        return new
    return make


def build(spec: S.Spec, device="meta") -> ScaleModel:
    """The single-device model. On the meta device it allocates nothing; elsewhere its weights are uninitialised:
    call runtime.layers.init_parameters for the reproducible initialisation."""
    with torch.device(device):
        return ScaleModel(spec, device)


def residual_out(model: ScaleModel) -> tuple[str, ...]:
    """Leaf names (without block prefix) of every linear that writes into the residual stream."""
    names = set(model.residual_out)
    for name, _ in model.repeats:
        names.update(getattr(model, name)[0].residual_out)
    return tuple(sorted(names))


def symbolic_param_count(model: ScaleModel) -> sympy.Expr:
    """Parameters of the model as a formula of the spec's sizes (blocks counted once, times the repeat count)."""
    top = sum((sympy.Mul(*s) for s in model.param_shapes.values()), sympy.Integer(0))
    for name, rep in model.repeats:
        block = getattr(model, name)[0]
        top += rep.count * sum((sympy.Mul(*s) for s in block.param_shapes.values()), sympy.Integer(0))
    return sympy.expand(top)
