"""Resolve and check a parsed .scale file into a Spec, collecting every problem before reporting any.

The grammar only knows structure; this module knows the vocabulary: which sections, settings, layer kinds and
arguments exist, what type each takes, and the cross-checks (divisibility, widths, world size) that can be decided
before any process starts. Each problem becomes a Diagnostic pointing at the offending text, with a remedy.
"""
from __future__ import annotations

import difflib
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Callable

import sympy

from compiler import ast
from compiler import spec as S
from compiler.cost.devices import DEVICES
from compiler.diagnostics import Diagnostic, ScaleError, Span, did_you_mean, divisors
from compiler.parse import parse
from compiler.plan import from_spec
from compiler.rules import check_plan
from compiler.symbols import capacity
from compiler.symbols import size as size_symbol

_MISSING = object()

# Bounds that keep planning in seconds and every size a valid tensor dimension.
MAX_SIZE = 2**31 - 1
MAX_REPEAT = 4096
MAX_SEED = 2**31 - 1

# Names the train section turns into size symbols (so formulas read `global_batch`): a model size cannot take them.
TRAIN_SIZE_NAMES = ("global_batch", "seq_len")

# What the tp axis can shard (plan setting `tp_layers`).
TP_LAYERS = ("attention", "mlp", "vocab")

# Axes a plan can use. `ep` is folded out of data parallelism: the batch is split over dp × ep ranks, dense
# weights are replicated over both, experts are sharded over ep and replicated over dp.
KNOWN_AXES = ("dp", "pp", "tp", "ep")

# Names of the size symbols the checker binds for each `moe` layer (its capacity per sequence).
CAPACITY = "capacity"


class _Checker:
    def __init__(self, file: ast.File, source: str):
        self.file = file
        self.source = source
        self.diags: list[Diagnostic] = []
        self.env: dict[str, sympy.Expr] = {}      # named size -> expression
        self.values: dict[sympy.Symbol, int] = {}  # symbol -> number
        self.name_spans: dict[str, Span] = {}
        self.poisoned: set[sympy.Symbol] = set()  # sizes already reported as invalid: later uses stay silent
        self.moe_layers = 0

    # -- reporting ------------------------------------------------------------------------------------------------

    def error(self, code: str, message: str, span: Span | None, label: str = "", help: str = "") -> None:
        self.diags.append(Diagnostic(code, message, span, label=label, help=help))

    # -- expressions ----------------------------------------------------------------------------------------------

    def expr(self, e: ast.Expr) -> sympy.Expr | None:
        """A numeric expression as sympy, names resolved against the sizes defined so far."""
        match e:
            case ast.Number(value=v, text=t):
                # sympy's precision follows the digits written: capped, so a literal of thousands of digits
                # does not make every later operation slow (parse keeps literals within a double's range).
                return sympy.Integer(v) if isinstance(v, int) else sympy.Float(t, max(15, min(50, len(t))))
            case ast.Name(id=n, span=sp):
                if n in self.env:
                    return self.env[n]
                self.error("E0110", f"unknown size `{n}`", sp, label="not defined before this line",
                           help=did_you_mean(n, self.env) if self.env else "define it first: `" + n + " = 64`")
                return None
            case ast.BinOp(op=op, left=l, right=r):
                a, b = self.expr(l), self.expr(r)
                if a is None or b is None:
                    return None
                if op == "/":
                    if self.number(b) == 0:
                        self.error("E0120", "division by zero", _span(r), label="this is 0",
                                   help="divide by a number that is not 0")
                        return None
                    return a / b
                return {"+": a + b, "-": a - b, "*": a * b}[op]
            case ast.Neg(operand=o):
                a = self.expr(o)
                return None if a is None else -a
            case _:
                self.error("E0112", f"expected a number, found {_describe(e)}", _span(e))
                return None

    def number(self, expr: sympy.Expr) -> sympy.Expr:
        return sympy.sympify(expr).xreplace({k: sympy.Integer(v) for k, v in self.values.items()})

    # -- typed values ---------------------------------------------------------------------------------------------

    def as_size(self, e: ast.Expr, what: str) -> sympy.Expr | None:
        """A positive integer, kept symbolic."""
        x = self.expr(e)
        if x is None or x.free_symbols & self.poisoned:
            return None
        n = self.number(x)
        if not (n.is_integer and n > 0):
            shown = _show_number(n)
            self.error("E0120", f"{what} must be a positive integer, not {shown}", _span(e),
                       label=f"this is {shown}", help=_integer_help(e, n))
            return None
        if n > MAX_SIZE:
            self.error("E0120", f"{what} is {_show_number(n)}, larger than any tensor dimension this compiler "
                       "plans for",
                       _span(e), label="too large", help=f"sizes are at most {MAX_SIZE}")
            return None
        return x

    def as_int(self, e: ast.Expr, what: str, minimum: int = 0) -> int | None:
        x = self.expr(e)
        if x is None:
            return None
        n = self.number(x)
        if not (n.is_integer and n >= minimum):
            self.error("E0120", f"{what} must be an integer ≥ {minimum}, not {_show_number(n)}", _span(e),
                       label=f"this is {_show_number(n)}")
            return None
        return int(n)

    def as_float(self, e: ast.Expr, what: str, minimum: float | None = None) -> float | None:
        x = self.expr(e)
        if x is None:
            return None
        n = self.number(x)
        v = float(n) if n.is_real else math.nan
        if not math.isfinite(v):
            self.error("E0120", f"{what} must be a finite number, not {v}", _span(e))
            return None
        if minimum is not None and v < minimum:
            self.error("E0120", f"{what} must be ≥ {minimum}, not {v}", _span(e))
            return None
        return v

    def as_choice(self, e: ast.Expr, what: str, choices: tuple[str, ...]) -> str | None:
        if isinstance(e, ast.Name) and e.id in choices:
            return e.id
        if isinstance(e, ast.String):  # for choices that are not names: "1f1b", "interleaved-1f1b"
            if e.value in choices:
                return e.value
            self.error("E0111", f"unknown {what} \"{e.value}\"", e.span, label="not one of the choices",
                       help=did_you_mean(e.value, choices))
            return None
        if isinstance(e, ast.Name):
            self.error("E0111", f"unknown {what} `{e.id}`", e.span, label="not one of the choices",
                       help=did_you_mean(e.id, choices))
        else:
            self.error("E0112", f"expected a {what}, found {_describe(e)}", _span(e),
                       help="one of: " + ", ".join(f"`{c}`" for c in choices))
        return None

    def as_bool(self, e: ast.Expr, what: str) -> bool | None:
        c = self.as_choice(e, "boolean", ("true", "false"))
        return None if c is None else c == "true"

    def as_string(self, e: ast.Expr, what: str) -> str | None:
        if isinstance(e, ast.String):
            return e.value
        self.error("E0112", f"{what} must be a string, found {_describe(e)}", _span(e),
                   help='strings are written in double quotes: "..."')
        return None

    def as_names(self, e: ast.Expr, what: str, choices: tuple[str, ...]) -> tuple | None:
        """A name or a tuple of names, each one of `choices`; `()` is not writable, so `none` means empty."""
        if isinstance(e, ast.Name) and e.id == "none":
            return ()
        items = e.items if isinstance(e, ast.Tuple) else (e,)
        out = [self.as_choice(i, what.strip("`"), choices) for i in items]
        return None if None in out else tuple(dict.fromkeys(out))

    def as_ranges(self, e: ast.Expr, what: str) -> tuple | None:
        """((first, end), ...): a tuple of pairs of non-negative integers, with the span of each pair."""
        items = e.items if isinstance(e, ast.Tuple) else ()
        if not items or not all(isinstance(i, ast.Tuple) and len(i.items) == 2 for i in items):
            self.error("E0112", f"{what} must be a tuple of (first block, end block) pairs", _span(e),
                       help="e.g. `layout = ((0, 3), (3, 4))`: blocks 0-2 on stage 0, block 3 on stage 1")
            return None
        out = []
        for i in items:
            a, b = (self.as_int(x, what, 0) for x in i.items)
            if a is None or b is None:
                return None
            out.append((a, b, i.span))
        return tuple(out)

    def as_floats(self, e: ast.Expr, what: str, n: int) -> tuple | None:
        if not (isinstance(e, ast.Tuple) and len(e.items) == n):
            self.error("E0112", f"{what} must be a tuple of {n} numbers, found {_describe(e)}", _span(e),
                       help="write it like `(0.9, 0.95)`")
            return None
        vals = [self.as_float(i, what) for i in e.items]
        return None if None in vals else tuple(vals)

    # -- argument binding -----------------------------------------------------------------------------------------

    def bind(self, args: tuple[ast.Arg, ...], params: dict[str, "Param"], what: str, span: Span) -> dict | None:
        """Bind call arguments to a signature: positional in order, then by name; convert each."""
        raw: dict[str, ast.Expr] = {}
        order = list(params)
        ok = True
        for i, arg in enumerate(args):
            if arg.name is None:
                if i >= len(order):
                    self.error("E0113", f"{what} takes at most {len(order)} arguments", arg.span,
                               label="one too many", help="arguments in order: " + ", ".join(order))
                    ok = False
                    continue
                key = order[i]
            else:
                key = arg.name.id
                if key not in params:
                    self.error("E0111", f"unknown argument `{key}` of {what}", arg.name.span,
                               label="not an argument here", help=did_you_mean(key, params))
                    ok = False
                    continue
            if key in raw:
                self.error("E0102", f"argument `{key}` of {what} given twice", arg.span)
                ok = False
                continue
            raw[key] = arg.value
        out: dict[str, Any] = {}
        for key, p in params.items():
            if key in raw:
                v = p.convert(self, raw[key], f"`{key}`")
                if v is None:
                    ok = False
                out[key] = v
            elif p.default is _MISSING:
                self.error("E0113", f"{what} needs the argument `{key}`", span, label=f"`{key}` missing",
                           help=f"{p.doc}; write it as `{key} = ...`")
                ok = False
            elif callable(p.default):  # computed from the arguments before it: only when they all bound
                out[key] = p.default(out) if ok else None
            else:
                out[key] = p.default
        return out if ok else None


@dataclass(frozen=True)
class Param:
    """One argument or setting: how to convert it, its default (a value, a function of the earlier ones, or
    _MISSING when required) and what it means."""

    convert: Callable
    default: Any = _MISSING
    doc: str = ""


def _size(c, e, w):
    return c.as_size(e, w)


def _bool(c, e, w):
    return c.as_bool(e, w)


def _float(c, e, w):
    return c.as_float(e, w, minimum=0.0)


def _int(c, e, w):
    return c.as_int(e, w, 0)


def _pos_int(c, e, w):
    return c.as_int(e, w, 1)


def _string(c, e, w):
    return c.as_string(e, w)


_UNITS = {"s": 1, "sec": 1, "second": 1, "seconds": 1, "min": 60, "minute": 60, "minutes": 60, "h": 3600,
          "hour": 3600, "hours": 3600}


def _duration(c, e, w):
    """Seconds: a number (`timeout = 600`) or a string with a unit (`timeout = "10 min"`, "30 s", "2 h")."""
    if not isinstance(e, ast.String):
        return c.as_float(e, w, minimum=0.0)
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([a-z]*)\s*", e.value)
    if not m or (m.group(2) and m.group(2) not in _UNITS):
        c.error("E0120", f"{w} must be a duration, not \"{e.value}\"", e.span, label="not a duration",
                help='a number of seconds, or a number and a unit: "30 s", "10 min", "2 h"')
        return None
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def _choice(*choices):
    return lambda c, e, w: c.as_choice(e, w.strip("`"), choices)


# -- the layer vocabulary ----------------------------------------------------------------------------------------

LAYERS: dict[str, dict[str, Param]] = {
    "embedding": {"vocab": Param(_size, doc="vocabulary size"), "hidden": Param(_size, doc="model width")},
    "positional": {"positions": Param(_size, doc="number of learned positions"),
                   "hidden": Param(_size, doc="model width")},
    "layernorm": {"hidden": Param(_size, doc="model width"), "eps": Param(_float, 1e-5, "epsilon")},
    "rmsnorm": {"hidden": Param(_size, doc="model width"), "eps": Param(_float, 1e-6, "epsilon")},
    "attention": {"hidden": Param(_size, doc="model width"), "heads": Param(_size, doc="attention heads"),
                  "kv_heads": Param(_size, lambda a: a["heads"], "key/value heads (grouped-query attention)"),
                  "bias": Param(_bool, True, "biases on the projections")},
    "mlp": {"hidden": Param(_size, doc="model width"), "ffn": Param(_size, doc="inner width"),
            "act": Param(_choice("gelu", "swiglu"), "gelu", "activation"),
            "bias": Param(_bool, True, "biases on the projections")},
    "moe": {"hidden": Param(_size, doc="model width"), "ffn": Param(_size, doc="inner width of each expert"),
            "experts": Param(_size, doc="number of experts"),
            "top_k": Param(_pos_int, 2, "experts per token"),
            "capacity_factor": Param(lambda c, e, w: c.as_float(e, w), 1.25,
                                     "slots per expert as a multiple of a balanced share of the tokens"),
            "act": Param(_choice("gelu", "swiglu"), "gelu", "activation of the expert MLPs"),
            "aux_loss": Param(_float, 0.01, "weight of the load-balancing loss"),
            "dropped": Param(_choice("residual", "identity"), "residual",
                             "what a choice over capacity contributes: nothing (residual) or the token (identity)")},
    "residual": {},
    "lm_head": {"vocab": Param(_size, doc="vocabulary size"), "hidden": Param(_size, doc="model width"),
                "tied": Param(_bool, False, "reuse the token embedding's weight"),
                "bias": Param(_bool, False, "bias on the projection")},
    "cross_entropy": {},
}
_CONTAINERS = {"residual"}

# -- section settings ---------------------------------------------------------------------------------------------

MESH_SETTINGS: dict[str, Param] = {
    "nodes": Param(_pos_int, 1, "machines"),
    "devices_per_node": Param(_pos_int, _MISSING, "devices (processes) per machine"),
    "device": Param(_choice(*DEVICES), "cpu", "device kind, for the cost model"),
    "peak_tflops": Param(_float, None, "dense bf16 peak TFLOP/s of one device"),
    "memory_gb": Param(_float, None, "memory of one device, GB"),
    "intra_node_gbps": Param(_float, None, "per-device bandwidth inside a node, GB/s"),
    "inter_node_gbps": Param(_float, None, "per-device bandwidth between nodes, GB/s"),
}

PLAN_SETTINGS: dict[str, Param] = {
    "data_parallel": Param(_choice("ddp", "fsdp"), "ddp", "how dp holds model state"),
    "micro_batches": Param(_pos_int, 1, "gradient-accumulation micro-batches per step"),
    "tp_layers": Param(lambda c, e, w: c.as_names(e, w, TP_LAYERS), TP_LAYERS, "what tp shards"),
    "sequence_parallel": Param(_bool, False, "shard norms and residuals along the sequence over tp"),
    "pad_vocab": Param(_bool, False, "pad the vocabulary to a multiple of tp (padded logits masked)"),
    "schedule": Param(_choice("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble"), "1f1b", "pipeline schedule"),
    "virtual_stages": Param(_pos_int, 1, "pipeline stages per pp rank (interleaved-1f1b)"),
    "layout": Param(lambda c, e, w: c.as_ranges(e, w), (), "manual stage layout: ((first, end), ...) blocks"),
}

OPTIMIZERS = {"adamw": {"lr": Param(_float, doc="peak learning rate"),
                        "betas": Param(lambda c, e, w: c.as_floats(e, w, 2), (0.9, 0.95), "Adam betas"),
                        "weight_decay": Param(_float, 0.1, "decoupled weight decay"),
                        "eps": Param(_float, 1e-8, "Adam epsilon")}}
SCHEDULES = {"cosine": {"warmup": Param(_int, 0, "linear warm-up steps"),
                        "min_lr": Param(_float, 0.0, "learning rate at the last step")},
             "constant": {"warmup": Param(_int, 0, "linear warm-up steps")}}
DATASETS = {"synthetic": {},
            "tokens": {"path": Param(_string, doc="binary file of token ids"),
                       "dtype": Param(_choice("uint16", "uint32", "int32"), "uint16", "token id type")}}


def _call_of(table: dict, what: str):
    """A setting whose value is a call such as `adamw(lr = 3e-4)`; a bare name means the call with no arguments."""
    def convert(c: _Checker, e: ast.Expr, w: str):
        if isinstance(e, ast.Name):
            e = ast.Call(e, (), e.span)
        if not isinstance(e, ast.Call):
            c.error("E0112", f"{w} must be one of {', '.join(table)}, found {_describe(e)}", _span(e),
                    help=f"for example `{next(iter(table))}(...)`")
            return None
        if e.func.id not in table:
            c.error("E0111", f"unknown {what} `{e.func.id}`", e.func.span, label=f"not a {what}",
                    help=did_you_mean(e.func.id, table))
            return None
        args = c.bind(e.args, table[e.func.id], f"{what} `{e.func.id}`", e.span)
        return None if args is None else (e.func.id, args)
    return convert


TRAIN_SETTINGS: dict[str, Param] = {
    "global_batch": Param(_size, doc="sequences per optimizer step, over all dp ranks"),
    "seq_len": Param(_size, doc="tokens per sequence"),
    "steps": Param(_pos_int, doc="optimizer steps"),
    "seed": Param(_int, 1234, "seed of initialisation and data"),
    "precision": Param(_choice("fp32", "bf16"), "fp32", "compute precision"),
    "optimizer": Param(_call_of(OPTIMIZERS, "optimizer"), ("adamw", None), "the optimizer"),
    "lr_schedule": Param(_call_of(SCHEDULES, "schedule"), ("constant", {"warmup": 0}), "learning-rate schedule"),
    "grad_clip": Param(_float, 1.0, "global gradient-norm clip; 0 turns it off"),
    "data": Param(_call_of(DATASETS, "dataset"), ("synthetic", {}), "training data"),
    "log_every": Param(_pos_int, 1, "steps between progress lines"),
    "checkpoint_dir": Param(_string, "", "where checkpoints go; empty for none"),
    "checkpoint_every": Param(_int, 0, "steps between checkpoints; 0 for only the last"),
    "restarts": Param(_int, None, "times torchrun restarts a failed job (from the last checkpoint); default 3 "
                                  "with checkpoint_dir, 0 without"),
    "timeout": Param(_duration, 600.0, "a collective that has not completed after this long ends the job, naming "
                                       "the ranks and the operation; 0 turns the watchdog off"),
}

SECTIONS = ("model", "mesh", "plan", "train")


# ---------------------------------------------------------------------------------------------------------------


def check_text(text: str, path: str) -> S.Spec:
    """Parse and check; raise ScaleError with every diagnostic found."""
    try:
        return check_file(parse(text, path), text)
    except RecursionError:
        raise ScaleError([Diagnostic("E0001", "an expression is nested too deeply", Span(path, 1, 1, 1, 2),
                                     help="write it with fewer nested parentheses, signs or terms")],
                         {path: text}) from None


def check_path(path: str) -> S.Spec:
    with open(path, encoding="utf-8-sig") as f:  # a leading byte-order mark is not part of the text
        text = f.read()
    return check_text(text, path)


def check_file(file: ast.File, source: str) -> S.Spec:
    c = _Checker(file, source)
    sections: dict[str, ast.Section] = {}
    for sec in file.sections:
        k = sec.kind.id
        if k not in SECTIONS:
            c.error("E0101", f"unknown section `{k}`", sec.kind.span, label="not a section",
                    help=did_you_mean(k, SECTIONS))
        elif k in sections:
            c.error("E0102", f"section `{k}` is written twice", sec.kind.span, label="second one here",
                    help=f"the first is at {sections[k].kind.span}; merge them")
        else:
            sections[k] = sec
            if sec.name is not None and k != "model":
                c.error("E0111", f"`{k}` takes no name", sec.name.span, label="not expected here",
                        help=f"write `{k} {{ ... }}`")
    end = _end_span(file, source)
    for k in ("model", "mesh", "train"):
        if k not in sections:
            c.error("E0103", f"the file has no `{k}` section", end,
                    help=f"add `{k} {{ ... }}`; see samples/tiny_gpt.scale")
    model = _model(c, sections["model"]) if "model" in sections else None
    mesh = _mesh(c, sections["mesh"]) if "mesh" in sections else None
    plan = _plan(c, sections.get("plan"))
    train, train_values = _train(c, sections["train"]) if "train" in sections else (None, {})
    spec = None
    if model and mesh and plan and train:
        _bind_capacities(c, model, train)
        spec = S.Spec(path=file.path, source=source, model=model, mesh=mesh, plan=plan, train=train,
                      values=dict(c.values))
        c.diags += check_plan(spec, from_spec(spec))  # the rules beside the passes (compiler/rules.py)
        _file_checks(c, model, train, train_values)
    if c.diags:
        raise ScaleError(c.diags, {file.path: source})
    return spec


def _settings(c: _Checker, sec: ast.Section | None, table: dict[str, Param], what: str,
              allowed_other=()) -> dict | None:
    """Read `key = value` statements of a section against its table."""
    raw: dict[str, ast.Assign] = {}
    misspelt: set[str] = set()  # known keys that an unknown key was close to: not reported again as missing
    ok = True
    for st in (sec.body if sec else ()):
        if type(st) in allowed_other:
            continue
        if not isinstance(st, ast.Assign):
            c.error("E0111", f"`{what}` holds only `key = value` settings", _span(st),
                    label="not a setting", help="settings here: " + ", ".join(table))
            ok = False
            continue
        key = st.key.id
        if key not in table:
            c.error("E0111", f"unknown setting `{key}` in `{what}`", st.key.span, label="not a setting here",
                    help=did_you_mean(key, table))
            misspelt.update(difflib.get_close_matches(key, list(table), n=1, cutoff=0.6))
            ok = False
        elif key in raw:
            c.error("E0102", f"`{key}` is set twice", st.key.span, label="second time here",
                    help=f"the first is at {raw[key].key.span}")
            ok = False
        else:
            raw[key] = st
    out: dict[str, Any] = {}
    for key, p in table.items():
        if key in raw:
            v = p.convert(c, raw[key].value, f"`{key}`")
            ok = ok and v is not None
            out[key] = v
        elif p.default is _MISSING:
            ok = False
            if key not in misspelt:
                c.error("E0113", f"`{what}` needs the setting `{key}`", sec.kind.span if sec else None,
                        label=f"`{key}` missing", help=f"{p.doc}; add `{key} = ...`")
        else:
            out[key] = p.default
    out["_spans"] = {k: st.value for k, st in raw.items()}
    return out if ok else None


# -- model --------------------------------------------------------------------------------------------------------


def _model(c: _Checker, sec: ast.Section) -> S.Model | None:
    if sec.name is None:
        c.error("E0113", "a model needs a name", sec.kind.span, help="write `model NAME { ... }`")
    layers: list = []
    before = len(c.diags)
    for st in sec.body:
        if isinstance(st, ast.Assign):
            _define_size(c, st)
        elif isinstance(st, ast.Axis):
            c.error("E0111", "`axis` belongs in the `mesh` section", st.span)
        else:
            layer = _layer(c, st)
            if layer is not None:
                layers.append(layer)
    if len(c.diags) > before:
        return None  # the structure check would only repeat what is already reported
    _model_structure(c, sec, layers)
    if len(c.diags) > before:
        return None
    return S.Model(name=sec.name.id if sec.name else "model", sizes=dict(c.env), layers=tuple(layers),
                   span=sec.span)


def _define_size(c: _Checker, st: ast.Assign) -> None:
    name = st.key.id
    if name in c.env:
        c.error("E0102", f"size `{name}` is defined twice", st.key.span, label="redefined here",
                help=f"the first definition is at {c.name_spans[name]}; give this one another name")
        return
    if name in KNOWN_AXES or name in TRAIN_SIZE_NAMES or re.fullmatch(rf"{CAPACITY}(_\d+)?", name):
        what = ("a mesh axis" if name in KNOWN_AXES else "a training setting" if name in TRAIN_SIZE_NAMES
                else "the capacity of a `moe` layer")
        c.error("E0102", f"`{name}` names {what} and cannot name a model size", st.key.span,
                help="formulas use that name already; call this size something else")
        return
    if name in LAYERS or name in ("repeat", "axis"):
        c.error("E0102", f"`{name}` is a layer kind and cannot name a size", st.key.span)
        return
    x = c.as_size(st.value, f"size `{name}`")
    if x is None:
        c.env[name] = size_symbol(name)  # keep going: later uses are neither unknown nor reported again
        c.values[size_symbol(name)] = 1
        c.poisoned.add(size_symbol(name))
        c.name_spans[name] = st.key.span
        return
    if x.free_symbols:
        c.env[name] = x                  # derived: `ffn = 4 * hidden` stays a formula in `hidden`
    else:
        sym = size_symbol(name)
        c.env[name] = sym
        c.values[sym] = int(x)
    c.name_spans[name] = st.key.span


def _layer(c: _Checker, st, top: bool = True) -> Any:
    if isinstance(st, ast.Repeat):
        if not top:
            c.error("E0204", "`repeat` can only stand at the top level of the model", st.span,
                    help="blocks repeat whole: put residuals inside `repeat`, not `repeat` inside a block")
            return None
        count = c.as_size(st.count, "the repeat count")
        if count is not None and c.number(count) > MAX_REPEAT:
            c.error("E0120", f"{c.number(count)} repeats are more than this compiler plans for", _span(st.count),
                    help=f"at most {MAX_REPEAT} blocks")
            return None
        body = [b for b in (_layer(c, x, False) for x in st.body if not _stray(c, x)) if b is not None]
        if not body:
            c.error("E0204", "`repeat` needs at least one layer in its body", st.span)
            return None
        return None if count is None else S.Repeat(count=count, body=tuple(body), span=st.span)
    if not isinstance(st, ast.Layer):
        _stray(c, st)
        return None
    kind = st.kind.id
    if kind not in LAYERS:
        c.error("E0111", f"unknown layer `{kind}`", st.kind.span, label="not a layer kind",
                help=did_you_mean(kind, LAYERS))
        return None
    if kind in _CONTAINERS:
        if st.body is None:
            c.error("E0204", f"`{kind}` needs a body: `{kind} {{ ... }}`", st.span)
            return None
        body = [b for b in (_layer(c, x, False) for x in st.body if not _stray(c, x)) if b is not None]
        if not st.body:
            c.error("E0204", f"`{kind}` needs at least one layer in its body", st.span,
                    help="an empty residual would compute x + x")
            return None
        return S.Residual(body=tuple(body), span=st.span)
    if st.body is not None:
        c.error("E0204", f"`{kind}` takes no body", st.span, help="only `residual` and `repeat` hold layers")
    a = c.bind(st.args, LAYERS[kind], f"`{kind}`", st.span)
    if a is None:
        return None
    sp = st.span
    match kind:
        case "embedding":
            return S.Embedding(vocab=a["vocab"], hidden=a["hidden"], span=sp)
        case "positional":
            return S.Positional(positions=a["positions"], hidden=a["hidden"], span=sp)
        case "layernorm" | "rmsnorm":
            return S.Norm(kind=kind, hidden=a["hidden"], eps=a["eps"], span=sp)
        case "attention":
            return _attention(c, st, a)
        case "mlp":
            return S.MLP(hidden=a["hidden"], ffn=a["ffn"], act=a["act"], bias=a["bias"], span=sp)
        case "moe":
            return _moe(c, st, a)
        case "lm_head":
            return S.LMHead(vocab=a["vocab"], hidden=a["hidden"], tied=a["tied"], bias=a["bias"], span=sp)
        case "cross_entropy":
            return S.CrossEntropy(span=sp)


def _stray(c: _Checker, st) -> bool:
    """Report a setting or axis written among layers; True if `st` is one."""
    if isinstance(st, ast.Assign):
        c.error("E0111", "sizes are defined at the top of the model, not inside a block", st.span,
                help=f"move `{st.key.id} = ...` out of the block")
        return True
    if isinstance(st, ast.Axis):
        c.error("E0111", "`axis` belongs in the `mesh` section", st.span)
        return True
    return False


def _arg_span(st: ast.Layer, index: int, name: str) -> Span:
    for i, arg in enumerate(st.args):
        if (arg.name is not None and arg.name.id == name) or (arg.name is None and i == index):
            return arg.value.span if hasattr(arg.value, "span") else arg.span
    return st.span


def _attention(c: _Checker, st: ast.Layer, a: dict) -> S.Attention | None:
    h, n, kv = (c.number(a[k]) for k in ("hidden", "heads", "kv_heads"))
    ok = True
    if h % n:
        c.error("E0201", f"{n} heads do not divide hidden size {h}", _arg_span(st, 1, "heads"),
                label=f"{h} % {n} == {h % n}",
                help="heads must divide hidden; divisors near it: " + _divisors_near(int(h), int(n)))
        ok = False
    if n % kv:
        c.error("E0202", f"{kv} key/value heads do not divide {n} heads", _arg_span(st, 2, "kv_heads"),
                label=f"{n} % {kv} == {n % kv}",
                help="each key/value head serves a whole group of query heads; choose one of: "
                     + _divisors_near(int(n), int(kv)))
        ok = False
    if not ok:
        return None
    return S.Attention(hidden=a["hidden"], heads=a["heads"], kv_heads=a["kv_heads"], bias=a["bias"], span=st.span)


def _moe(c: _Checker, st: ast.Layer, a: dict) -> S.MoE | None:
    experts = int(c.number(a["experts"]))
    ok = True
    if a["top_k"] > experts:
        c.error("E0702", f"top_k = {a['top_k']} is more than the {experts} experts", _arg_span(st, 3, "top_k"),
                label=f"{a['top_k']} > {experts}", help="each token picks distinct experts: use top_k ≤ experts "
                "(Switch routes to 1, GShard to 2)")
        ok = False
    if a["capacity_factor"] is not None and a["capacity_factor"] <= 0:
        c.error("E0703", f"capacity_factor must be positive, not {a['capacity_factor']:g}",
                _arg_span(st, 4, "capacity_factor"), label="no expert could take a token",
                help="1.0 gives each expert exactly a balanced share of the tokens; 1.25 leaves room for imbalance")
        ok = False
    if not ok:
        return None
    c.moe_layers += 1
    name = CAPACITY if c.moe_layers == 1 else f"{CAPACITY}_{c.moe_layers}"
    return S.MoE(hidden=a["hidden"], ffn=a["ffn"], experts=a["experts"], top_k=a["top_k"],
                 capacity_factor=a["capacity_factor"], act=a["act"], aux_loss=a["aux_loss"], dropped=a["dropped"],
                 capacity=size_symbol(name), span=st.span)


def _model_structure(c: _Checker, sec: ast.Section, layers: list) -> None:
    """The layer sequence: embedding first, lm_head then cross_entropy last, one width throughout."""
    top = [type(x) for x in layers]
    if not layers or top[0] is not S.Embedding:
        c.error("E0204", "a model starts with `embedding(vocab, hidden)`",
                layers[0].span if layers else sec.kind.span, help="put the token embedding first")
        return
    if top[-2:] != [S.LMHead, S.CrossEntropy]:
        c.error("E0204", "a model ends with `lm_head(...)` then `cross_entropy`", layers[-1].span,
                help="end the model with `lm_head(vocab, hidden)` and `cross_entropy`")
        return
    emb, head = layers[0], layers[-2]
    width = emb.hidden

    def walk(items, top_level, in_residual=False):
        for i, x in enumerate(items):
            if isinstance(x, S.MoE) and x.dropped == "residual" and not in_residual:
                c.error("E0705", "this `moe` drops tokens to the residual, but it is not inside a `residual`", x.span,
                        label="dropped tokens would vanish here",
                        help="wrap it: `residual { rmsnorm(hidden)  moe(...) }`, or write `dropped = identity` to pass "
                             "a dropped token on through the layer itself")
            if top_level and isinstance(x, (S.Embedding, S.LMHead, S.CrossEntropy)) and i not in (0, len(items) - 2,
                                                                                            len(items) - 1):
                c.error("E0204", f"`{_kind(x)}` may appear only once, at its place", x.span)
            if not top_level and isinstance(x, (S.Embedding, S.LMHead, S.CrossEntropy, S.Positional)):
                c.error("E0204", f"`{_kind(x)}` cannot sit inside a block", x.span)
            if isinstance(x, S.Positional) and top_level and i != 1:
                c.error("E0204", "`positional` comes right after `embedding`", x.span)
            w = getattr(x, "hidden", None)
            if w is not None and c.number(w) != c.number(width):
                c.error("E0203", f"width mismatch: `{_kind(x)}` works on width {c.number(w)}, the model's is "
                        f"{c.number(width)}", x.span, help="every layer of the residual stream has the embedding's "
                        "width; use the same size name")
            if isinstance(x, (S.Residual, S.Repeat)):
                walk(x.body, False, in_residual or isinstance(x, S.Residual))

    walk(layers, True)
    if c.number(head.vocab) != c.number(emb.vocab):
        c.error("E0203", f"the LM head predicts {c.number(head.vocab)} tokens but the embedding has "
                f"{c.number(emb.vocab)}", head.span, help="use the same vocabulary size for both")


# -- mesh, plan, train --------------------------------------------------------------------------------------------


def _mesh(c: _Checker, sec: ast.Section) -> S.Mesh | None:
    axes: list[tuple[str, int]] = []
    spans: dict[str, Span] = {}
    for st in sec.body:
        if not isinstance(st, ast.Axis):
            continue
        name = st.name.id
        if name not in KNOWN_AXES:
            c.error("E0111", f"unknown axis `{name}`", st.name.span, label="not a parallelism axis",
                    help=did_you_mean(name, KNOWN_AXES))
            continue
        if name in spans:
            c.error("E0102", f"axis `{name}` is declared twice", st.name.span,
                    help=f"the first is at {spans[name]}")
            continue
        n = c.as_int(st.size, f"axis `{name}`", 1)
        if n is None:
            continue
        axes.append((name, n))
        spans[name] = st.span
        c.values[size_symbol(name)] = n  # per-rank formulas read `hidden/tp`
    s = _settings(c, sec, MESH_SETTINGS, "mesh", allowed_other=(ast.Axis,))
    if s is None:
        return None
    kind = s["device"]
    peak, mem, intra, inter = DEVICES[kind]
    def given(key, default):
        return default if s[key] is None else s[key]
    for key in ("peak_tflops", "memory_gb", "intra_node_gbps", "inter_node_gbps"):
        if s[key] is not None and s[key] <= 0:
            c.error("E0120", f"`{key}` must be positive", _span(s["_spans"][key]), help="or leave it out to use "
                    f"the figures of `{kind}`")
            return None
    device = S.Device(kind=kind, peak_tflops=given("peak_tflops", peak), memory_gb=given("memory_gb", mem),
                      intra_node_gbps=given("intra_node_gbps", intra), inter_node_gbps=given("inter_node_gbps", inter))
    mesh = S.Mesh(axes=tuple(axes), nodes=s["nodes"], devices_per_node=s["devices_per_node"], device=device,
                  span=sec.span, axis_spans=spans)
    if not axes and not any(isinstance(st, ast.Axis) for st in sec.body):
        c.error("E0113", "the mesh declares no axis", sec.kind.span, help="declare at least one, e.g. `axis dp = 1`")
        return None
    product = math.prod(n for _, n in axes)
    if product != mesh.world_size:
        shown = " × ".join(f"{a}={n}" for a, n in axes) or "no axes"
        target = spans[axes[-1][0]] if axes else sec.kind.span
        folded = (" (`ep` counts like `dp`: the batch is split over dp × ep ranks, each holding 1/ep of the "
                  "experts; to fold ep out of existing dp ranks, divide dp by ep)") if "ep" in spans else ""
        c.error("E0301", f"the mesh axes hold {product} devices but the machines have {mesh.world_size}", target,
                label=f"{shown} = {product}",
                help=f"nodes × devices_per_node = {mesh.nodes} × {mesh.devices_per_node} = {mesh.world_size}; "
                     f"make the product of the axes equal it{folded}")
        return None
    return mesh


def _plan(c: _Checker, sec: ast.Section | None) -> S.Plan | None:
    s = _settings(c, sec, PLAN_SETTINGS, "plan")
    if s is None:
        return None
    if s["virtual_stages"] > 1 and s["schedule"] != "interleaved-1f1b":
        c.error("E0604", f"virtual_stages = {s['virtual_stages']} needs the interleaved-1f1b schedule",
                _span(s["_spans"]["virtual_stages"]), help='set `schedule = "interleaved-1f1b"`, or `virtual_stages = 1`')
        return None
    spans = _spans_of(s) + tuple((f"layout {i}", sp) for i, (_, _, sp) in enumerate(s["layout"]))
    return S.Plan(**{k: s[k] for k in PLAN_SETTINGS}, spans=spans)  # a new setting: its PLAN_SETTINGS row, its field


def _train(c: _Checker, sec: ast.Section) -> tuple[S.Train | None, dict]:
    """The training settings, and the value expressions as written (to locate cross-check diagnostics)."""
    s = _settings(c, sec, TRAIN_SETTINGS, "train")
    if s is None:
        return None, {}
    opt_kind, opt = s["optimizer"]
    if opt is None:
        c.error("E0113", "`train` needs an optimizer with a learning rate", sec.kind.span,
                help="add `optimizer = adamw(lr = 3e-4)`")
        return None, {}
    at = _span(s["_spans"]["optimizer"])
    if opt["lr"] <= 0:
        c.error("E0120", "the learning rate must be positive", at, help="e.g. `lr = 3e-4`")
    if not all(0 <= b < 1 for b in opt["betas"]):
        c.error("E0120", f"Adam's betas must lie in [0, 1), not {tuple(opt['betas'])}", at,
                help="the usual values are `betas = (0.9, 0.95)`")
    if s["seed"] > MAX_SEED:
        c.error("E0120", f"the seed must be at most {MAX_SEED}", _span(s["_spans"]["seed"]))
    if any(d.code == "E0120" and d.span in (at, _span(s["_spans"].get("seed"))) for d in c.diags):
        return None, {}
    for key in ("global_batch", "seq_len"):  # a literal becomes a named size, so formulas read in these words
        if not s[key].free_symbols:
            c.values[size_symbol(key)] = int(s[key])
            s[key] = size_symbol(key)
    sched_kind, sched = s["lr_schedule"]
    data_kind, data = s["data"]
    return S.Train(
        global_batch=s["global_batch"], seq_len=s["seq_len"], steps=s["steps"], seed=s["seed"],
        precision=s["precision"],
        optimizer=S.Optimizer(kind=opt_kind, lr=opt["lr"], betas=tuple(opt["betas"]),
                              weight_decay=opt["weight_decay"], eps=opt["eps"]),
        schedule=S.LRSchedule(kind=sched_kind, warmup=sched["warmup"], min_lr=sched.get("min_lr", 0.0)),
        grad_clip=s["grad_clip"], data=S.Data(kind=data_kind, **data), log_every=s["log_every"],
        checkpoint_dir=s["checkpoint_dir"], checkpoint_every=s["checkpoint_every"],
        restarts=(3 if s["checkpoint_dir"] else 0) if s["restarts"] is None else s["restarts"], timeout=s["timeout"],
        spans=_spans_of(s)), s["_spans"]


def _bind_capacities(c: _Checker, model: S.Model, train: S.Train) -> None:
    """Each `moe` layer's capacity (slots per expert per sequence), from the sequence length."""
    seq = int(c.number(train.seq_len))
    for m in (x for x in S.walk(model.layers) if isinstance(x, S.MoE)):
        c.values[m.capacity] = capacity(seq, int(c.number(m.experts)), m.top_k, m.capacity_factor)


def _file_checks(c: _Checker, model: S.Model, train: S.Train, spans: dict) -> None:
    """What the training settings need of the files and the model, whatever the plan."""
    if train.data.kind == "tokens":
        _data_checks(c, train, spans["data"])
    if train.data.kind == "synthetic" and int(c.number(model.layers[0].vocab)) < 4:
        c.error("E0120", "the synthetic task needs a vocabulary of at least 4 tokens", model.layers[0].span)


def _data_checks(c: _Checker, train: S.Train, call: ast.Call) -> None:
    """The token file exists and its size fits `dtype`, found where the program will look: a relative path is
    relative to this .scale file's directory (ids against the vocabulary are checked when the run opens it)."""
    arg = next((a for a in call.args if (a.name.id if a.name else "path") == "path"), None)
    at = _span(arg.value) if arg is not None else call.span
    shown = os.path.join(os.path.dirname(c.file.path), train.data.path)
    where = f"a relative path is relative to the .scale file's directory ({os.path.dirname(c.file.path) or '.'})"
    item = {"uint16": 2, "uint32": 4, "int32": 4}[train.data.dtype]
    if not os.path.exists(shown):
        c.error("E0801", f"data file {shown} does not exist", at, label="no such file", help=where)
    elif os.path.isdir(shown):
        c.error("E0801", f"data file {shown} is a directory", at, label="not a file of token ids",
                help="name the binary file of token ids itself")
    elif (size := os.path.getsize(shown)) == 0:
        c.error("E0801", f"data file {shown} is empty", at, label="no tokens")
    elif size % item:
        c.error("E0801", f"data file {shown} holds {size} bytes, not a whole number of {train.data.dtype} ids", at,
                label=f"{size} % {item} == {size % item}",
                help=f"`dtype = {train.data.dtype}` reads {item} bytes per id: is it the file's dtype (uint16, "
                     "uint32 or int32), and is the file whole?")
    elif size // item <= (seq := int(c.number(train.seq_len))) + 1:
        c.error("E0801", f"data file {shown} holds {size // item} tokens, too few for one sequence of {seq}", at,
                help=f"a training window is seq_len + 1 tokens; the file needs more than {seq + 1}")


# -- helpers ------------------------------------------------------------------------------------------------------


def _span(node) -> Span | None:
    return getattr(node, "span", None)


def _spans_of(settings: dict) -> tuple:
    """((setting, Span of its value), ...) of the settings written in a section, for compiler.plan.from_spec."""
    return tuple((k, _span(e)) for k, e in settings["_spans"].items() if _span(e) is not None)


def _end_span(file: ast.File, source: str) -> Span:
    lines = source.rstrip("\n").split("\n")
    return Span(file.path, len(lines), 1, len(lines), len(lines[-1]) + 1)


def _kind(layer) -> str:
    return {S.Embedding: "embedding", S.Positional: "positional", S.Attention: "attention", S.MLP: "mlp",
            S.Residual: "residual", S.Repeat: "repeat", S.MoE: "moe", S.LMHead: "lm_head",
            S.CrossEntropy: "cross_entropy"}.get(type(layer), getattr(layer, "kind", "layer"))


def _describe(e) -> str:
    return {ast.String: "a string", ast.Tuple: "a tuple", ast.Call: "a call", ast.Name: "a name"}.get(
        type(e), "a number")


def _show_number(n) -> str:
    if n.is_Rational and max(abs(n.p), n.q) >= 10**30:  # str() of an int refuses more than 4300 digits
        return f"about 10^{math.floor(math.log10(abs(n.p)) - math.log10(n.q))}" if n.p else "0"
    if n.is_Rational and not n.is_integer:
        return f"{n} (= {float(n):g})"
    return str(float(n)) if n.is_Float else str(n)


def _integer_help(e, n) -> str:
    if n.is_Rational and not n.is_integer:
        return "the division leaves a remainder; sizes are whole numbers"
    if n.is_Float:
        return "sizes are whole numbers; drop the fraction"
    return "sizes count things: use a number ≥ 1"


def _divisors_near(n: int, near: int) -> str:
    divs = divisors(n)
    divs.sort(key=lambda d: (abs(d - near), d))
    return ", ".join(str(d) for d in sorted(divs[:4]))
