"""The binder: a `.scale` expression to a typed value, and a section's `key = value` statements to a table of Params.

`Checker` holds what resolution has learnt so far (the named sizes, their numbers, the diagnostics collected) and
turns expressions into sizes, integers, floats, choices, names, ranges; `Param` describes one setting or argument
(its converter, default and doc) and `bind`/`bind_settings` read arguments and settings against a table of them. The
vocabulary itself (which sections, settings and layers exist) lives in compiler/language.py; no rule about a plan does
(compiler/rules/).
"""
from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from typing import Any, Callable

import sympy

from compiler import ast
from compiler.diagnostics import Diagnostic, Span, did_you_mean, divisors

MISSING = object()


class _NoneValue:
    """What a converter returns for a written `none` that means "absent" (`shared_ffn = none`): the argument's value
    is None. A converter's own None always means failure, with an error reported (`bind` and `bind_settings` check)."""

    def __repr__(self) -> str:
        return "NONE"


NONE = _NoneValue()

# The largest size planned for: every size stays a valid tensor dimension.
MAX_SIZE = 2**31 - 1


class Checker:
    def __init__(self, file: ast.File, source: str):
        self.file = file
        self.source = source
        self.diags: list[Diagnostic] = []
        self.env: dict[str, sympy.Expr] = {}      # named size -> expression
        self.values: dict[sympy.Symbol, int] = {}  # symbol -> number
        self.name_spans: dict[str, Span] = {}
        self.poisoned: set[sympy.Symbol] = set()  # sizes already reported as invalid: later uses stay silent
        self.moe_layers = 0
        # (key, section) -> (help, the setting meant): where a setting unknown in its section belongs instead (set by
        # compiler/check.py, which knows every section's table).
        self.placement: Callable[[str, str], tuple[str, str | None]] = lambda key, section: ("", None)

    # -- reporting ------------------------------------------------------------------------------------------------

    def error(self, code: str, message: str, span: Span | None, label: str = "", help: str = "") -> None:
        self.diags.append(Diagnostic(code, message, span, label=label, help=help))

    def warn(self, code: str, message: str, span: Span | None, label: str = "", help: str = "") -> None:
        """A setting that is legal but has no effect (or an effect the user surely did not mean): the file still
        checks, and every command that reads it prints the warning."""
        self.diags.append(Diagnostic(code, message, span, label=label, help=help, severity="warning"))

    def errors(self) -> int:
        return sum(d.severity == "error" for d in self.diags)

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
                        self.error("E0120", "division by zero", span_of(r), label="this is 0",
                                   help="divide by a number that is not 0")
                        return None
                    return a / b
                return {"+": a + b, "-": a - b, "*": a * b}[op]
            case ast.Neg(operand=o):
                a = self.expr(o)
                return None if a is None else -a
            case _:
                self.error("E0112", f"expected a number, found {_describe(e)}", span_of(e))
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
            self.error("E0120", f"{what} must be a positive integer, not {shown}", span_of(e),
                       label=f"this is {shown}", help=_integer_help(e, n))
            return None
        if n > MAX_SIZE:
            self.error("E0120", f"{what} is {_show_number(n)}, larger than any tensor dimension this compiler "
                       "plans for",
                       span_of(e), label="too large", help=f"sizes are at most {MAX_SIZE}")
            return None
        return x

    def as_int(self, e: ast.Expr, what: str, minimum: int = 0) -> int | None:
        x = self.expr(e)
        if x is None:
            return None
        n = self.number(x)
        if not (n.is_integer and n >= minimum):
            self.error("E0120", f"{what} must be an integer ≥ {minimum}, not {_show_number(n)}", span_of(e),
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
            self.error("E0120", f"{what} must be a finite number, not {v}", span_of(e))
            return None
        if minimum is not None and v < minimum:
            self.error("E0120", f"{what} must be ≥ {minimum}, not {v}", span_of(e))
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
            self.error("E0112", f"expected a {what}, found {_describe(e)}", span_of(e),
                       help="one of: " + ", ".join(f"`{c}`" for c in choices))
        return None

    def as_bool(self, e: ast.Expr, what: str) -> bool | None:
        c = self.as_choice(e, "boolean", ("true", "false"))
        return None if c is None else c == "true"

    def as_string(self, e: ast.Expr, what: str) -> str | None:
        if isinstance(e, ast.String):
            return e.value
        self.error("E0112", f"{what} must be a string, found {_describe(e)}", span_of(e),
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
            self.error("E0112", f"{what} must be a tuple of (first block, end block) pairs", span_of(e),
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
            self.error("E0112", f"{what} must be a tuple of {n} numbers, found {_describe(e)}", span_of(e),
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
                v = self.converted(p, raw[key], f"`{key}`", what)
                ok = ok and v is not _FAILED
                out[key] = None if v is _FAILED else v
            elif p.default is MISSING:
                self.error("E0113", f"{what} needs the argument `{key}`", span, label=f"`{key}` missing",
                           help=f"{p.doc}; write it as `{key} = ...`")
                ok = False
            elif callable(p.default):  # computed from the arguments before it: only when they all bound
                out[key] = p.default(out) if ok else None
            else:
                out[key] = p.default
        if not ok and not self.errors():
            raise _Unreported(f"{what} failed to bind without reporting an error")
        return out if ok else None

    def converted(self, p: "Param", e: ast.Expr, w: str, what: str):
        """`p`'s converter applied to `e`: its value (None for a written `none` that means absent), or _FAILED. A
        converter fails by returning None after reporting an error (or on a size already reported as invalid); a
        failure with no error anywhere would drop the layer or setting silently, so it is an internal error."""
        v = p.convert(self, e, w)
        if v is NONE:
            return None
        if v is None:
            if not self.errors():
                raise _Unreported(f"the argument {w} of {what} failed to convert without reporting an error (a "
                                  "converter that accepts `none` must return binder.NONE)")
            return _FAILED
        return v


_FAILED = object()


class _Unreported(AssertionError):
    """A conversion or binding failed and no error says why: a bug in a converter, never the user's mistake."""


def or_none(convert: Callable) -> Callable:
    """`convert`, or NONE (the value None: absent) for a written `none`."""
    def convert_or_none(c: Checker, e: ast.Expr, w: str):
        return NONE if isinstance(e, ast.Name) and e.id == "none" else convert(c, e, w)
    return convert_or_none


@dataclass(frozen=True)
class Param:
    """One argument or setting: how to convert it, its default (a value, a function of the earlier ones, or
    MISSING when required) and what it means."""

    convert: Callable
    default: Any = MISSING
    doc: str = ""


def to_size(c, e, w):
    return c.as_size(e, w)


def to_bool(c, e, w):
    return c.as_bool(e, w)


def to_float(c, e, w):
    return c.as_float(e, w, minimum=0.0)


def to_int(c, e, w):
    return c.as_int(e, w, 0)


def to_pos_int(c, e, w):
    return c.as_int(e, w, 1)


def to_count_or_auto(c, e, w):
    """A count ≥ 0, or `auto` (the string "auto": resolved when the plan is costed)."""
    if isinstance(e, ast.Name) and e.id == "auto":
        return "auto"
    if isinstance(e, ast.Name):
        c.error("E0111", f"unknown value `{e.id}` of {w}", e.span, label="not a count",
                help="a number of steps, or `auto` (the interval that loses the least time to saves and failures)")
        return None
    return c.as_int(e, w, 0)


def to_string(c, e, w):
    return c.as_string(e, w)


_UNITS = {"s": 1, "sec": 1, "second": 1, "seconds": 1, "min": 60, "minute": 60, "minutes": 60, "h": 3600,
          "hour": 3600, "hours": 3600, "d": 86400, "day": 86400, "days": 86400}


def to_duration(c, e, w):
    """Seconds: a number (`timeout = 600`) or a string with a unit (`timeout = "10 min"`, "30 s", "2 h")."""
    if not isinstance(e, ast.String):
        return c.as_float(e, w, minimum=0.0)
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([a-z]*)\s*", e.value)
    if not m or (m.group(2) and m.group(2) not in _UNITS):
        c.error("E0120", f"{w} must be a duration, not \"{e.value}\"", e.span, label="not a duration",
                help='a number of seconds, or a number and a unit: "30 s", "10 min", "2 h", "1 day"')
        return None
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def to_ratio(c: Checker, e: ast.Expr, w: str):
    """A finite number; whether it is at least 1 is the topology's to say (`problems`), at its text."""
    return c.as_float(e, w)


def to_ratios(c: Checker, e: ast.Expr, w: str):
    """A ratio, or a tuple of them, one per uplink level (lowest first)."""
    if not isinstance(e, ast.Tuple):
        return c.as_float(e, w)
    values = [c.as_float(i, w) for i in e.items]
    return None if None in values else tuple(values)


def to_placement(c: Checker, e: ast.Expr, w: str):
    """`auto`, or `order(tp, pp, dp)` as the tuple of its axis names (innermost first); whether they are the mesh's
    axes is checked with the mesh (compiler/network_checks.py)."""
    if isinstance(e, ast.Name):
        if e.id == "auto":
            return "auto"
        c.error("E0111", f"unknown placement `{e.id}`", e.span, label="not a placement",
                help="write `placement = auto` or `placement = order(tp, pp, dp)` (innermost axis first)")
        return None
    if not isinstance(e, ast.Call):
        c.error("E0112", f"{w} must be `auto` or `order(...)`", span_of(e),
                help="e.g. `placement = order(tp, pp, dp)`: tp varies fastest over the ranks")
        return None
    if e.func.id == "auto":  # `auto()`, as a call with no arguments is a bare name elsewhere (`optimizer = adamw`)
        if e.args:
            c.error("E0113", "`auto` takes no arguments", e.args[0].span, label="not expected here",
                    help="`placement = auto` chooses the order from the traffic and the topology")
            return None
        return "auto"
    if e.func.id != "order":
        c.error("E0111", f"unknown placement `{e.func.id}`", e.func.span, label="not a placement",
                help=did_you_mean(e.func.id, ("auto", "order")))
        return None
    bad = next((a for a in e.args if a.name is not None or not isinstance(a.value, ast.Name)), None)
    if bad is not None or not e.args:
        c.error("E0112", "`order(...)` takes the mesh's axis names, innermost first", span_of(bad) or e.span,
                help="e.g. `order(tp, pp, dp)`")
        return None
    return tuple(a.value.id for a in e.args)


def one_of(*choices):
    return lambda c, e, w: c.as_choice(e, w.strip("`"), choices)


def call_of(table: dict, what: str, none_is_absent: bool = False):
    """A setting whose value is a call such as `adamw(lr = 3e-4)`; a bare name means the call with no arguments.
    `none_is_absent`: `none` is the value None (`rope_scaling = none`: no scaling)."""
    def convert(c: Checker, e: ast.Expr, w: str):
        if none_is_absent and isinstance(e, ast.Name) and e.id == "none":
            return NONE
        if isinstance(e, ast.Name):
            e = ast.Call(e, (), e.span)
        if not isinstance(e, ast.Call):
            c.error("E0112", f"{w} must be one of {', '.join(table)}, found {_describe(e)}", span_of(e),
                    help=f"for example `{next(iter(table))}(...)`")
            return None
        if e.func.id not in table:
            c.error("E0111", f"unknown {what} `{e.func.id}`", e.func.span, label=f"not a {what}",
                    help=did_you_mean(e.func.id, table))
            return None
        args = c.bind(e.args, table[e.func.id], f"{what} `{e.func.id}`", e.span)
        return None if args is None else (e.func.id, args)
    return convert


def bind_settings(c: Checker, sec: ast.Section | None, table: dict[str, Param], what: str,
              allowed_other=()) -> dict | None:
    """Read `key = value` statements of a section against its table."""
    raw: dict[str, ast.Assign] = {}
    misspelt: set[str] = set()  # known keys that an unknown key was close to: not reported again as missing
    ok = True
    for st in (sec.body if sec else ()):
        if type(st) in allowed_other:
            continue
        if not isinstance(st, ast.Assign):
            c.error("E0111", f"`{what}` holds only `key = value` settings", span_of(st),
                    label="not a setting", help="settings here: " + ", ".join(table))
            ok = False
            continue
        key = st.key.id
        if key not in table:
            placed, meant = c.placement(key, what)
            c.error("E0111", f"unknown setting `{key}` in `{what}`", st.key.span, label="not a setting here",
                    help=placed or did_you_mean(key, table))
            misspelt.update([meant] if meant else difflib.get_close_matches(key, list(table), n=1, cutoff=0.6))
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
            v = c.converted(p, raw[key].value, f"`{key}`", f"`{what}`")
            ok = ok and v is not _FAILED
            out[key] = None if v is _FAILED else v
        elif p.default is MISSING:
            ok = False
            if key not in misspelt:
                c.error("E0113", f"`{what}` needs the setting `{key}`", sec.kind.span if sec else None,
                        label=f"`{key}` missing", help=f"{p.doc}; add `{key} = ...`")
        else:
            out[key] = p.default
    out["_spans"] = {k: st.value for k, st in raw.items()}
    if not ok and not c.errors():
        raise _Unreported(f"`{what}` failed to bind without reporting an error")
    return out if ok else None


def arg_span(st: ast.Layer, index: int, name: str) -> Span:
    """Where argument `name` (or the `index`-th positional one) of a layer is written; the layer if absent."""
    for i, arg in enumerate(st.args):
        if (arg.name is not None and arg.name.id == name) or (arg.name is None and i == index):
            return arg.value.span if hasattr(arg.value, "span") else arg.span
    return st.span


def span_of(node) -> Span | None:
    return getattr(node, "span", None)


def spans_of(settings: dict) -> tuple:
    """((setting, Span of its value), ...) of the settings written in a section, for the Plan as written (compiler/check.py)."""
    return tuple((k, span_of(e)) for k, e in settings["_spans"].items() if span_of(e) is not None)


def end_span(file: ast.File, source: str) -> Span:
    lines = source.rstrip("\n").split("\n")
    return Span(file.path, len(lines), 1, len(lines), len(lines[-1]) + 1)


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


def divisors_near(n: int, near: int) -> str:
    divs = divisors(n)
    divs.sort(key=lambda d: (abs(d - near), d))
    return ", ".join(str(d) for d in sorted(divs[:4]))
