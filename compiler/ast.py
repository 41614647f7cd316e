"""The syntax tree of a .scale file: frozen dataclasses, each carrying the Span it was parsed from."""
from __future__ import annotations

from dataclasses import dataclass

from compiler.diagnostics import Span


@dataclass(frozen=True, slots=True)
class Number:
    value: int | float
    text: str
    span: Span


@dataclass(frozen=True, slots=True)
class String:
    value: str
    span: Span


@dataclass(frozen=True, slots=True)
class Name:
    id: str
    span: Span


@dataclass(frozen=True, slots=True)
class BinOp:
    op: str  # one of + - * /
    left: "Expr"
    right: "Expr"
    span: Span


@dataclass(frozen=True, slots=True)
class Neg:
    operand: "Expr"
    span: Span


@dataclass(frozen=True, slots=True)
class Tuple:
    items: tuple["Expr", ...]
    span: Span


@dataclass(frozen=True, slots=True)
class Arg:
    """One call argument; `name` is None for a positional one."""

    name: Name | None
    value: "Expr"
    span: Span


@dataclass(frozen=True, slots=True)
class Call:
    func: Name
    args: tuple[Arg, ...]
    span: Span


Expr = Number | String | Name | BinOp | Neg | Tuple | Call


@dataclass(frozen=True, slots=True)
class Assign:
    """`key = value` inside a section."""

    key: Name
    value: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class Axis:
    """`axis dp = 2` inside a mesh."""

    name: Name
    size: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class Layer:
    """A layer of the model: `kind(args) { body }`, the arguments and the body optional."""

    kind: Name
    args: tuple[Arg, ...]
    body: tuple["Stmt", ...] | None
    span: Span


@dataclass(frozen=True, slots=True)
class Repeat:
    """`repeat N { ... }`: N copies of a block, each with its own weights."""

    count: Expr
    body: tuple["Stmt", ...]
    span: Span


Stmt = Assign | Axis | Layer | Repeat


@dataclass(frozen=True, slots=True)
class Section:
    """A top-level section: `model NAME { ... }`, `mesh { ... }`, `plan { ... }`, `train { ... }`."""

    kind: Name
    name: Name | None
    body: tuple[Stmt, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class File:
    path: str
    sections: tuple[Section, ...]
