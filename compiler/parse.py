"""Parse .scale text into the frozen AST of compiler/ast.py, or raise a located ScaleError.

lark parses with positions on; a Transformer turns each aliased rule into a dataclass. Syntax errors are converted at
this boundary into diagnostics that name the expected tokens in words.
"""
from __future__ import annotations

import functools
import re

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
        self.errors: list[Diagnostic] = []  # found while building; raised together after the whole tree

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
        value = int(text) if text.isdigit() else float(text)
        return ast.Number(value, text, self._tok(tok))

    def string(self, items):
        (tok,) = items
        raw = str(tok)[1:-1]

        def decode(m: re.Match) -> str:
            if m[1] in ESCAPES:
                return ESCAPES[m[1]]
            col = tok.column + 1 + m.start()  # the token has no newline: its text is on one line
            shown = f"`\\{m[1]}`" if m[1].isprintable() else f"`\\` before U+{ord(m[1]):04X}"
            self.errors.append(Diagnostic(
                "E0002", f"unknown escape {shown} in a string", Span(self.path, tok.line, col, tok.line, col + 2),
                label="not an escape", help='strings know `\\\\`, `\\"`, `\\n` and `\\t`; write `\\\\` for a backslash'))
            return m[0]
        return ast.String(_ESCAPE.sub(decode, raw), self._tok(tok))

    def name(self, items):
        return self._name(items[0])

    @v_args(meta=True)
    def call(self, meta, items):
        func, args = items
        return ast.Call(self._name(func), args, self._span(meta))


def parse(text: str, path: str = "<input>") -> ast.File:
    """Parse `text` (the contents of `path`) into an ast.File; raise ScaleError on a syntax error."""
    try:
        tree = _parser().parse(text)
    except lark.UnexpectedInput as exc:
        raise ScaleError([_syntax_diagnostic(exc, text, path)], {path: text}) from None
    build = _Build(path)
    file = build.transform(tree)
    if build.errors:
        raise ScaleError(build.errors, {path: text})
    return file


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
        hint = "strings use double quotes" if ch == "'" else "names are letters, digits and `_`; numbers are decimal"
        return Diagnostic("E0001", f"unexpected character `{ch}`", span, label="not part of the language",
                          help=hint)
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
