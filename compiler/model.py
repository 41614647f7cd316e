"""Build the single-device model of a Spec as torch modules, on the meta device unless asked otherwise.

The model is cut into *segments*: the top level (embedding, anything outside `repeat`, final norm, head, loss) and
one block per `repeat`. A segment's children are leaf torch modules with flat, stable names (`attn_q`, `mlp_down`,
`norm_1`), so that its traced graph reads as straight-line code and every parameter has a short name. A `repeat` is
a `runtime.layers.Repeat` of identical blocks; the block is traced once, whatever the layer count.

While building, each leaf records the symbolic shape of its parameters (sympy expressions of the user's sizes), and
the forward code marks which .scale layer each traced operation comes from (see compiler/trace.py).

This module is the model's frame: the embeddings, the head and the loss by their roles, `residual` and `repeat`. A
layer of the body is built by its kind's own builder (compiler/layers/<kind>.py `build`), through the Segment's
construction helpers (`number`, `leaf`, `linear`, `residual_out`, `spec`).
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

from compiler import layers as L
from compiler import spec as S
from compiler.diagnostics import Span
# Packed documents (runtime/packed.py), traced as calls (compiler/trace.py wraps them)
from runtime.packed import cross_entropy as packed_cross_entropy, positions as packed_positions
from runtime.layers import Bias, Repeat

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

    # -- construction helpers (the layer kinds' builders call them) ---------------------------------------------

    @property
    def spec(self) -> S.Spec:
        """The resolved specification the segment is built from."""
        return self._spec

    def number(self, expr) -> int:
        """The number a size expression takes under the spec's sizes."""
        return int(self._spec.value(expr))

    def leaf(self, name: str, module: nn.Module, shapes: dict[str, tuple], span: Span) -> str:
        """Add leaf module `module` as child `name`, recording its parameters' symbolic shapes (parameter name ->
        shape as sympy expressions; a parameter the module lacks, such as an absent bias, is skipped) and the span
        of its .scale layer."""
        self.add_module(name, module.to(self._device))
        for pname, shape in shapes.items():
            if getattr(module, pname, None) is not None:
                self.param_shapes[f"{name}.{pname}"] = tuple(sympy.sympify(d) for d in shape)
        self.spans[name] = span
        return name

    def linear(self, name: str, d_in, d_out, bias: bool, span: Span) -> str:
        """A linear leaf from `d_in` to `d_out` (size expressions)."""
        mod = nn.Linear(self.number(d_in), self.number(d_out), bias=bias)
        return self.leaf(name, mod, {"weight": (d_out, d_in), "bias": (d_out,)}, span)

    def _name(self, base: str, total: int) -> str:
        self._counts[base] = self._counts.get(base, 0) + 1
        return base if total == 1 else f"{base}_{self._counts[base]}"

    def _steps(self, layers, totals) -> tuple:
        return tuple(self._step(x, totals) for x in layers)

    def _step(self, x, totals) -> _Step:
        if isinstance(x, S.Residual):
            inner = self._steps(x.body, totals)
            return _Step(x, lambda seg, h, inner=inner: h + seg._run(inner, h), inner)
        kind = L.of(x)
        if not hasattr(kind, "build"):  # a kind of the model's frame (embedding, head, ...) or a nested repeat
            raise AssertionError(f"no builder for {type(x).__name__} in the body (compiler/layers/)")
        return _Step(x, kind.build(self, x, self._name(kind.LEAF, totals[kind.LEAF])))

    def _run(self, steps, x):
        for st in steps:
            with _at(st.layer):
                x = st.run(self, x)
        return x


def _totals(layers) -> dict[str, int]:
    """How many leaves of each base name (a kind's LEAF) a segment will hold (to number them only when there are
    several)."""
    counts: dict[str, int] = {}

    def walk(items):
        for x in items:
            if isinstance(x, S.Residual):
                walk(x.body)
            elif hasattr(kind := L.of(x), "build"):  # None (a repeat) has no builder
                counts[kind.LEAF] = counts.get(kind.LEAF, 0) + 1
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
        self.leaf("embed", _embedding(self.number(emb.vocab), self.number(emb.hidden)),
                  {"weight": (emb.vocab, emb.hidden)}, emb.span)
        self._emb_scale = _embedding_scale(self.number(emb.hidden), spec.train.precision) if emb.scaled else None
        self._pos = model.positional
        self._packed = spec.train.data.document_separator is not None
        if self._pos is not None:
            self.leaf("pos", _embedding(self.number(self._pos.positions), self.number(self._pos.hidden)),
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
                blocks = Repeat([first, *(again() for _ in range(self.number(x.count) - 1))])
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
            self.linear("lm_head", self._head.hidden, self._head.vocab, self._head.bias, self._head.span)
        elif self._head.bias:
            self.leaf("lm_head_bias", Bias(self.number(self._head.vocab)), {"bias": (self._head.vocab,)},
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
