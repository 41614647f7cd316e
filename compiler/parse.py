"""Parse .scale text into the frozen AST of compiler/ast.py, or raise a located ScaleError.

lark parses with positions on; a Transformer turns each aliased rule into a dataclass. Syntax errors are converted at
this boundary into diagnostics that name the expected tokens in words.
"""
from __future__ import annotations

import decimal
import functools
import math
import re
import unicodedata

import lark
from lark import Lark, Token, Transformer, v_args

from compiler import ast
from compiler.diagnostics import Diagnostic, ScaleError, Span
from grammar import GRAMMAR_PATH

# How lark's terminal names read to a user.
_TOKEN_WORDS = {
    "NAME": "a name", "NUMBER": "a number", "STRING": "a string", "LBRACE": "`{`", "RBRACE": "`}`",
    "LPAR": "`(`", "RPAR": "`)`", "EQUAL": "`=`", "COMMA": "`,`", "PLUS": "`+`", "MINUS": "`-`", "STAR": "`*`",
    "SLASH": "`/`", "AXIS": "`axis`", "REPEAT": "`repeat`", "$END": "the end of the file",
}

# How deep blocks and expressions may nest. Far beyond any real model (a `repeat` holds `residual`s, which hold
# layers), and shallow enough that every phase after parsing (they recurse over the tree) stays well inside
# Python's recursion limit.
MAX_BLOCK_DEPTH = 32
MAX_EXPR_DEPTH = 100
_EXPRS = {"add", "sub", "mul", "div", "neg", "tuple", "call"}

# Number literals hold at most what a double holds: beyond it nothing is meaningful, and exact arithmetic on
# literals of thousands of digits is where time goes (Python refuses int() of more than 4300 digits).
MAX_NUMBER_DIGITS = 308


@functools.cache
def _parser() -> Lark:
    return Lark(GRAMMAR_PATH.read_text(), parser="lalr", propagate_positions=True, maybe_placeholders=True)


def _words(expected) -> str:
    names = sorted({_TOKEN_WORDS.get(e, e) for e in expected})
    if len(names) == 1:
        return names[0]
    return ", ".join(names[:-1]) + " or " + names[-1]


# The escapes a .scale string knows; `\\` then `n` is a backslash and an `n`: one pass, left to right.
ESCAPES = {"\\": "\\", '"': '"', "n": "\n", "t": "\t"}
_ESCAPE = re.compile(r"\\(.)", re.DOTALL)


class _Build(Transformer):
    def __init__(self, path: str):
        super().__init__()
        self.path = path
        self.diags: list[Diagnostic] = []  # numbers out of range, reported together once the tree is built

    def _span(self, meta) -> Span:
        return Span(self.path, meta.line, meta.column, meta.end_line, meta.end_column)

    def _tok(self, tok: Token) -> Span:
        return Span(self.path, tok.line, tok.column, tok.end_line, tok.end_column)

    def _name(self, tok: Token) -> ast.Name:
        return ast.Name(str(tok), self._tok(tok))

    @v_args(meta=True)
    def start(self, meta, sections):
        return ast.File(self.path, tuple(sections))

    @v_args(meta=True)
    def section(self, meta, items):
        kind, name, *stmts = items
        return ast.Section(self._name(kind), self._name(name) if name is not None else None, tuple(stmts),
                           self._span(meta))

    @v_args(meta=True)
    def assign(self, meta, items):
        key, value = items
        return ast.Assign(self._name(key), value, self._span(meta))

    @v_args(meta=True)
    def axis(self, meta, items):
        name, value = items
        return ast.Axis(self._name(name), value, self._span(meta))

    @v_args(meta=True)
    def repeat(self, meta, items):
        count, body = items
        return ast.Repeat(count, body, self._span(meta))

    @v_args(meta=True)
    def layer(self, meta, items):
        kind, args, body = items
        return ast.Layer(self._name(kind), args if args is not None else (), body, self._span(meta))

    def body(self, stmts):
        return tuple(stmts)

    def call_args(self, args):
        return tuple(a for a in args if a is not None)

    @v_args(meta=True)
    def kwarg(self, meta, items):
        name, value = items
        return ast.Arg(self._name(name), value, self._span(meta))

    @v_args(meta=True)
    def posarg(self, meta, items):
        return ast.Arg(None, items[0], self._span(meta))

    def _binop(op):  # noqa: N805 - a factory used at class creation
        @v_args(meta=True)
        def build(self, meta, items):
            return ast.BinOp(op, items[0], items[1], self._span(meta))
        return build

    add, sub, mul, div = _binop("+"), _binop("-"), _binop("*"), _binop("/")

    @v_args(meta=True)
    def neg(self, meta, items):
        return ast.Neg(items[0], self._span(meta))

    @v_args(meta=True)
    def tuple(self, meta, items):
        return ast.Tuple(tuple(items), self._span(meta))

    def number(self, items):
        (tok,) = items
        text = str(tok)
        value = _number_value(text)
        if value is None:
            self.diags.append(Diagnostic(
                "E0002", "number out of range", self._tok(tok),
                label="too small to tell from 0" if _underflows(text) else "too large",
                help=f"numbers lie between about 1e-308 and 1e308 (at most {MAX_NUMBER_DIGITS} digits); sizes are "
                     "at most 2147483647"))
            value = 0
        return ast.Number(value, text, self._tok(tok))

    def string(self, items):
        (tok,) = items
        raw = str(tok)[1:-1]

        def decode(m: re.Match) -> str:
            if m[1] in ESCAPES:
                return ESCAPES[m[1]]
            col = tok.column + 1 + m.start()  # the token has no newline: its text is on one line
            shown = f"`\\{m[1]}`" if m[1].isprintable() else f"`\\` before U+{ord(m[1]):04X}"
            self.diags.append(Diagnostic(
                "E0004", f"unknown escape {shown} in a string", Span(self.path, tok.line, col, tok.line, col + 2),
                label="not an escape", help='strings know `\\\\`, `\\"`, `\\n` and `\\t`; write `\\\\` for a backslash'))
            return m[0]
        return ast.String(_ESCAPE.sub(decode, raw), self._tok(tok))

    def name(self, items):
        return self._name(items[0])

    @v_args(meta=True)
    def call(self, meta, items):
        func, args = items
        return ast.Call(self._name(func), args, self._span(meta))


SUFFIXES = {"K": 3, "M": 6, "B": 9, "G": 9, "T": 12}
"""A number's decimal suffix (grammar/scale.lark): the power of ten it multiplies by (`15.6T` = 15.6e12)."""


def _number_value(text: str) -> int | float | None:
    """The value of a NUMBER token (ASCII digits, grammar/scale.lark), or None when a double cannot hold it. With a
    suffix (`16M`, `15.6T`) the value is exact: an integer where the product is whole."""
    if text and text[-1] in SUFFIXES:
        base = _number_value(text[:-1])
        if base is None:
            return None
        exact = decimal.Decimal(text[:-1]).scaleb(SUFFIXES[text[-1]])
        if exact == exact.to_integral_value() and abs(exact) < 10 ** MAX_NUMBER_DIGITS:
            return int(exact)
        value = float(exact)
        return value if math.isfinite(value) else None
    if text.isdigit():
        digits = text.lstrip("0")
        return int(digits or "0") if len(digits) <= MAX_NUMBER_DIGITS else None
    value = float(text)
    if not math.isfinite(value) or _underflows(text):
        return None
    return value


def _underflows(text: str) -> bool:
    """A literal with a non-zero digit that a double rounds to 0 (`1e-400`)."""
    mantissa = text.rstrip("".join(SUFFIXES)).lower().split("e")[0]
    return float(text) == 0 and any(ch in "123456789" for ch in mantissa)


def parse(text: str, path: str = "<input>") -> ast.File:
    """Parse `text` (the contents of `path`) into an ast.File; raise ScaleError on a syntax error."""
    try:
        tree = _parser().parse(text)
    except lark.UnexpectedInput as exc:
        raise ScaleError([_syntax_diagnostic(exc, text, path)], {path: text}) from None
    deep = _too_deep(tree, path)
    if deep is not None:
        raise ScaleError([deep], {path: text})
    build = _Build(path)
    try:
        file = build.transform(tree)
    except lark.exceptions.VisitError as exc:  # lark wraps what a rule raised: raise that instead
        raise exc.orig_exc from None
    if build.diags:
        raise ScaleError(build.diags, {path: text})
    return file


def _too_deep(tree: lark.Tree, path: str) -> Diagnostic | None:
    """The first block or expression, in source order, nested beyond MAX_BLOCK_DEPTH or MAX_EXPR_DEPTH.

    Walked with an explicit stack: the tree can be deeper than Python's recursion limit."""
    stack = [(tree, 0, 0)]
    while stack:
        node, blocks, exprs = stack.pop()
        for child in reversed(node.children):  # popped in source order
            if not isinstance(child, lark.Tree):
                continue
            b, e = blocks + (child.data == "body"), exprs + (child.data in _EXPRS)
            if b > MAX_BLOCK_DEPTH:
                # Point at the statement that opens the block: `repeat`, or the layer's name.
                word = "repeat" if node.data == "repeat" else str(node.children[0])
                m = node.meta
                return Diagnostic("E0003", "blocks nested too deeply",
                                  Span(path, m.line, m.column, m.line, m.column + len(word)),
                                  label=f"this block would be nested {b} deep",
                                  help=f"blocks nest at most {MAX_BLOCK_DEPTH} deep; a model needs two: `repeat` "
                                       "holds `residual` blocks, which hold layers")
            if e > MAX_EXPR_DEPTH:
                m = child.meta
                return Diagnostic("E0003", "expression nested too deeply",
                                  Span(path, m.line, m.column, m.end_line, m.end_column),
                                  label=f"more than {MAX_EXPR_DEPTH} levels deep",
                                  help=f"operators, signs, tuples and calls nest at most {MAX_EXPR_DEPTH} deep; "
                                       "write it with fewer")
            stack.append((child, b, e))
    return None


def _syntax_diagnostic(exc: lark.UnexpectedInput, text: str, path: str) -> Diagnostic:
    line, col = exc.line, exc.column
    if isinstance(exc, lark.UnexpectedToken) and exc.token.type == "$END":
        # Point just past the last character of the file.
        lines = text.rstrip("\n").split("\n")
        line, col = len(lines), len(lines[-1]) + 1
        span = Span(path, line, col, line, col + 1)
        return Diagnostic("E0001", "unexpected end of file", span, label="the file ends here",
                          help="is a `}` missing?")
    if isinstance(exc, lark.UnexpectedToken) and exc.token.type == "EQUAL" and exc.token_history \
            and exc.token_history[-1] is not None:
        dangling = _dangling_equal(text, exc.token_history[-1])
        if dangling is not None:
            ln, cl = dangling
            return Diagnostic("E0001", "missing value after `=`", Span(path, ln, cl, ln, cl + 1),
                              label="nothing follows on this line",
                              help="write a value after `=`; the next line was read as this setting's value")
    if isinstance(exc, lark.UnexpectedToken):
        tok = exc.token
        span = Span(path, line, col, tok.end_line or line, tok.end_column or col + 1)
        shown = str(tok)
        expected = {e for e in exc.expected if not e.startswith("__")}
        return Diagnostic("E0001", f"unexpected `{shown}`", span, label=f"expected {_words(expected)}",
                          help=_syntax_hint(tok, expected))
    if isinstance(exc, lark.UnexpectedCharacters):
        lines = text.split("\n")
        ch = lines[line - 1][col - 1] if line - 1 < len(lines) and col - 1 < len(lines[line - 1]) else "?"
        span = Span(path, line, col, line, col + 1)
        label, hint = "not part of the language", "names are letters, digits and `_`; numbers are decimal"
        if ch == "'":
            hint = "strings use double quotes"
        elif ch in "[]":  # a list, as other languages write one (`oversubscription = [1, 7]`)
            hint = "a list of values is a tuple in parentheses: `(1, 7)`"
        elif not ch.isascii() and ch.isdecimal():  # `６４`: lark's `\d` would have read it as a number
            line_text = lines[line - 1]
            lo, hi = col - 1, col
            while lo > 0 and (line_text[lo - 1].isdecimal() or line_text[lo - 1] == "."):
                lo -= 1
            while hi < len(line_text) and (line_text[hi].isdecimal() or line_text[hi] == "."):
                hi += 1
            ascii_text = "".join(str(unicodedata.decimal(c)) if c.isdecimal() else c for c in line_text[lo:hi])
            label = f"{unicodedata.name(ch, 'a non-ASCII digit').lower()}, not an ASCII digit"
            hint = f"numbers are written with the ASCII digits 0-9: `{ascii_text}`"
        elif not ch.isascii() and ch.isalpha():
            hint = "names are ASCII letters, digits and `_`"
        elif not ch.isascii() and ch.isspace():
            label, hint = f"{unicodedata.name(ch, 'a non-ASCII space').lower()}", "use an ordinary space"
        return Diagnostic("E0001", f"unexpected character `{ch}`", span, label=label, help=hint)
    span = Span(path, line or 1, col or 1, line or 1, (col or 1) + 1)
    return Diagnostic("E0001", "syntax error", span)


def _dangling_equal(text: str, name: Token) -> tuple[int, int] | None:
    """If the text before `name` ends, on an earlier line, with `=`, the line and column of that `=`."""
    lines = text.split("\n")
    for ln in range(name.line - 1, 0, -1):
        code = lines[ln - 1].split("#", 1)[0].rstrip()
        if code:
            return (ln, len(code)) if code.endswith("=") else None
    return None


def _syntax_hint(tok: Token, expected: set[str]) -> str:
    if "EQUAL" in expected and tok.type in {"NUMBER", "STRING"}:
        return "a setting is written `key = value`"
    if tok.type == "RBRACE" and "EQUAL" not in expected:
        return "a value is missing before `}`"
    if tok.type == "EQUAL":
        return "a setting is written `key = value`, one name on the left"
    return f"expected {_words(expected)} here"
