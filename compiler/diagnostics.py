"""One diagnostic type, rendered like rustc.

A `Span` locates text in a `.scale` file; a `Diagnostic` is a code, a message, a span, an optional label under the
caret and an optional help line. `render` is pure: it needs the diagnostic and the source text, nothing else.
`ScaleError` carries every diagnostic collected by a phase; it is picklable so it crosses process boundaries.
"""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Span:
    """A region of a source file: 1-based line and column of the first character, and of the one after the last."""

    file: str
    line: int
    col: int
    end_line: int
    end_col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


@dataclass(frozen=True, slots=True)
class Diagnostic:
    code: str
    message: str
    span: Span | None
    label: str = ""
    help: str = ""
    severity: str = "error"
    key: str = ""     # about a plan setting: which (`axis tp`, `micro_batches`, ...), for code that reads it
    brief: str = ""   # the message without the plan named in words (a candidate's), for code that groups them
    # Structured fields, for code that reads a refusal (the search: compiler/search/prune.py), never printed: the
    # mesh axis whose rules raised it ("tp", "pp", "ep", "cp"; None for a rule of the whole mesh or a diagnostic
    # of the file), and the rule or check that raised it, a stable name ("tensor_parallel.heads"). Codes may be
    # renumbered; these are what code keys on. Not compared: a diagnostic is its text.
    axis: str | None = field(default=None, compare=False)
    rule: str | None = field(default=None, compare=False)


@dataclass
class ScaleError(Exception):
    """Every diagnostic a phase found, with the source text needed to render them."""

    diagnostics: list[Diagnostic]
    sources: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        Exception.__init__(self, self.diagnostics[0].message if self.diagnostics else "")

    def __reduce__(self):
        return (ScaleError, (self.diagnostics, self.sources))

    def render(self) -> str:
        return render_all(self.diagnostics, self.sources)


def render(diag: Diagnostic, source: str | None) -> str:
    """rustc-style text for one diagnostic: header, location, source line with a caret, help."""
    out = [f"{diag.severity}[{diag.code}]: {diag.message}"]
    span = diag.span
    if span is None:
        if diag.help:
            out.append(f"  = help: {diag.help}")
        return "\n".join(out)
    lines = source.split("\n") if source is not None else []
    gutter = " " * len(str(span.line))
    out.append(f"{gutter}--> {span}")
    if 1 <= span.line <= len(lines):
        text = lines[span.line - 1].expandtabs(1)
        width = max(1, (span.end_col - span.col) if span.end_line == span.line else len(text) - span.col + 1)
        marker = " " * (span.col - 1) + "^" * width
        out.append(f"{gutter} |")
        out.append(f"{span.line} | {text}")
        out.append(f"{gutter} | {marker}" + (f" {diag.label}" if diag.label else ""))
    if diag.help:
        out.append(f"{gutter} = help: {diag.help}")
    return "\n".join(out)


def render_all(diags: list[Diagnostic], sources: dict[str, str]) -> str:
    parts = [render(d, sources.get(d.span.file) if d.span else None) for d in diags]
    errors = sum(d.severity == "error" for d in diags)
    if errors:
        parts.append(f"error: aborting due to {errors} previous error{'s' if errors != 1 else ''}")
    return "\n\n".join(parts) + "\n"


def did_you_mean(word: str, choices) -> str:
    """A 'did you mean' help line, or a list of the valid choices when nothing is close."""
    choices = sorted(choices)
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if close:
        return f"did you mean `{close[0]}`?"
    return "expected one of: " + ", ".join(f"`{c}`" for c in choices)


def plan_error(plan, key: str, code: str, message: str, label: str = "", help: str = "", *, axis: str | None,
               rule: str) -> Diagnostic:
    """A diagnostic about a plan setting: at the text of `key` (`axis tp`, `micro_batches`, ...) when the plan came
    from a file, or, for a generated candidate (no spans), naming the plan in words with the label folded into the
    help, since there is no caret to hang it on. `axis` and `rule`: the structured fields (Diagnostic), which every
    rule gives."""
    span = plan.span(key)
    if span is not None:
        return Diagnostic(code, message, span, label=label, help=help, key=key, brief=message, axis=axis, rule=rule)
    return Diagnostic(code, f"{message}, in the plan {plan.describe()}", None,
                      help="; ".join(x for x in (label, help) if x), key=key, brief=message, axis=axis, rule=rule)


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))
