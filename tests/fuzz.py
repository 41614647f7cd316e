"""Mutation fuzzing of .scale files, shared by tests/test_fuzz.py (a few hundred inputs per sample) and
bench/fuzz.py (as many as asked).

`mutants(sample_text, seed, n)` yields n reproducible mutants of a sample: each is 1 to 3 mutations, token-level
(delete, duplicate or swap tokens; a number made huge, zero, negative, fractional, out of a double's range or written
in non-ASCII digits; a name swapped for another word of the language or of the file; a stray character; deep
nesting of expressions and blocks) or line-level (drop, duplicate or swap lines; drop or duplicate a `{ ... }`
block). Input i of a sample depends only on (seed, sample name, i), so a failure is replayed from its id alone.

`run(text, path)` puts one input through what `scalec check`, `plan` and `compile` do, in this process, and says
how it ended: "ok", "diagnostic" (a ScaleError whose every diagnostic renders with file:line:col), or "crash" (any
other exception, or a diagnostic without a location), with its wall time. A watchdog interrupts an input after
`hard_limit` seconds ("stall") so that one stall cannot hang the run.
"""
from __future__ import annotations

import cProfile
import dataclasses
import random
import re
import signal
import tempfile
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from compiler import check as CHECK
from compiler.check import check_text
from compiler.report.plan import plan_text
from compiler.diagnostics import ScaleError

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = sorted((ROOT / "samples").glob("*.scale"))

# -- the vocabulary a mutation draws names from -------------------------------------------------------------------

_CHOICES = ("gelu", "swiglu", "residual", "identity", "true", "false", "ddp", "zero1", "zero2", "fsdp", "fp32", "bf16", "none",
            "uint16", "uint32", "int32", "gpipe", "synthetic", "tokens", "cosine", "constant", "adamw", "axis",
            "repeat", "model", "mesh", "plan", "train", "capacity", "capacity_2", "x")


def vocabulary() -> tuple[str, ...]:
    """Every word of the language (from compiler/language.py's tables, so it follows them) and a few strangers."""
    words = set(_CHOICES) | set(CHECK.SECTIONS) | set(CHECK.KNOWN_AXES) | set(CHECK.DEVICES) | set(CHECK.TP_LAYERS)
    words |= set(CHECK.FABRICS) | {"auto", "order"}  # the mesh's network: fabric = ib, placement = order(tp, dp)
    for table in (CHECK.LAYERS, CHECK.OPTIMIZERS, CHECK.SCHEDULES, CHECK.DATASETS, CHECK.TOPOLOGIES, CHECK.STRAGGLERS,
                  CHECK.ON_STRAGGLER, CHECK.INTERRUPTIONS):
        for name, params in table.items():
            words.add(name)
            words.update(params)
    for table in (CHECK.MESH_SETTINGS, CHECK.PLAN_SETTINGS, CHECK.TRAIN_SETTINGS, CHECK.RESILIENCE_SETTINGS):
        words.update(table)
    return tuple(sorted(words))


# -- tokens -------------------------------------------------------------------------------------------------------

_TOKEN = re.compile(r'(?P<ws>\s+)|(?P<comment>#[^\n]*)|(?P<string>"(?:[^"\\\n]|\\.)*")|'
                    r"(?P<number>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)|(?P<name>[A-Za-z_]\w*)|(?P<punct>.)", re.S)


def tokens(text: str) -> list[tuple[str, str]]:
    """(kind, text) pieces that concatenate back to `text`: ws, comment, string, number, name, punct."""
    return [(m.lastgroup, m.group()) for m in _TOKEN.finditer(text)]


def _join(toks) -> str:
    return "".join(t for _, t in toks)


def _pick(rng: random.Random, toks, kinds) -> int | None:
    idx = [i for i, (k, _) in enumerate(toks) if k in kinds]
    return rng.choice(idx) if idx else None


# Non-ASCII decimal digit zeros: full-width, Arabic-Indic, Devanagari, mathematical bold.
_DIGIT_ZEROS = (0xFF10, 0x0660, 0x0966, 0x1D7CE)
_STRANGE = ("\u00a0", "\u200b", "\ufeff", "\x00", "\t", "\r", "\\", '"', "'", "{", "}", "(", ")", ",", "=", "#",
            "é", "²", "½", "\u2212", "\U0001f600", ";", "*", "/", "-", "+", ".", "e")
_DEPTHS = (1, 2, 3, 31, 32, 33, 99, 100, 101, 245, 1000, 5000)


def _number(rng: random.Random, old: str) -> str:
    choice = rng.randrange(14)
    if choice == 0:
        return "9" * rng.choice((19, 308, 309, 4300, 4301, 20000))
    if choice == 1:
        return rng.choice(("1e999999999", "1e308", "1e309", "1e-400", "1e-999999999", "0.0000000001", "1e400000"))
    if choice == 2:
        return "0"
    if choice == 3:
        return "-" + old
    if choice == 4:
        return rng.choice(("0.5", "1.5", old + ".5", "2.0", ".5", "1."))
    if choice == 5:  # an old value in other digits, whole or one digit of it
        zero = rng.choice(_DIGIT_ZEROS)
        digits = [chr(zero + int(c)) if c.isdigit() and (rng.random() < 0.5 or len(old) == 1) else c for c in old]
        return "".join(digits)
    if choice == 6:
        return rng.choice(("2147483647", "2147483648", "4096", "4097", "1073741824", "65536"))
    if choice == 7:
        return rng.choice(("1/0", "0/0", "(1 - 1)", old + " / 0", old + " * 0"))
    if choice == 8:
        return rng.choice(("1", "2", "3", "7", "8", "16", "64", "128"))
    if choice == 9:
        return old + rng.choice(("0", "00", "000"))
    if choice == 10:
        return " * ".join([old] * rng.choice((2, 8, 40, 200)))
    if choice == 11:
        return str(rng.randrange(0, 10 ** rng.randrange(1, 12)))
    if choice == 12:
        return old + rng.choice((" + 1", " - 1", " * 2", " / 2", " / 3"))
    return rng.choice(('"x"', "(1, 2)", "true", "none", "adamw()"))


def _nest_expression(rng: random.Random, toks) -> str | None:
    i = _pick(rng, toks, {"number", "name"})
    if i is None:
        return None
    n, tok = rng.choice(_DEPTHS), toks[i][1]
    form = rng.randrange(4)
    toks = list(toks)
    if form == 0:
        toks[i] = ("x", "(" * n + tok + ")" * n)
    elif form == 1:
        toks[i] = ("x", "-" * n + tok)  # as n nested negations: `- - x` reads as -(-x)
    elif form == 2:
        toks[i] = ("x", tok + " + 0" * n)
    else:
        toks[i] = ("x", "(" * n + tok + ", 1)" * n)
    return _join(toks)


def _nest_block(rng: random.Random, text: str) -> str | None:
    lines = text.split("\n")
    layer_lines = [i for i, ln in enumerate(lines) if re.match(r"\s+[a-z_]+\(|\s+residual\b|\s+repeat\b", ln)]
    if not layer_lines:
        return None
    i = rng.choice(layer_lines)
    n = rng.choice(_DEPTHS)
    opener = rng.choice(("residual { ", "repeat 1 { "))
    body, comment = (lines[i].split("#", 1) + [""])[:2]
    if body.rstrip().endswith("{"):  # a block header: close the nesting after its block
        depth, j = 0, i
        for j in range(i, len(lines)):
            depth += lines[j].split("#", 1)[0].count("{") - lines[j].split("#", 1)[0].count("}")
            if depth <= 0:
                break
        lines[j] = lines[j] + " }" * n
        lines[i] = opener * n + lines[i]
    else:
        lines[i] = opener * n + body + " }" * n + (" #" + comment if comment else "")
    return "\n".join(lines)


def _blocks(lines) -> list[tuple[int, int]]:
    """(first, last) line of every `{ ... }` opened at the end of a line and closed on a later line."""
    out, stack = [], []
    for i, ln in enumerate(lines):
        code = ln.split("#", 1)[0]
        for ch in code:
            if ch == "{":
                stack.append(i)
            elif ch == "}" and stack:
                j = stack.pop()
                if j != i:
                    out.append((j, i))
    return out


def mutate(rng: random.Random, text: str, words: tuple[str, ...]) -> tuple[str, str]:
    """One mutation of `text`: (what was done, the new text)."""
    toks = tokens(text)
    lines = text.split("\n")
    kind = rng.choice(("delete", "duplicate", "swap", "number", "number", "number", "name", "name", "char",
                       "nest_expr", "nest_block", "drop_line", "dup_line", "swap_lines", "drop_block",
                       "dup_block"))
    significant = {"string", "number", "name", "punct"}
    if kind in ("delete", "duplicate", "swap"):
        i = _pick(rng, toks, significant)
        if i is None:
            return "none", text
        toks = list(toks)
        if kind == "delete":
            del toks[i]
        elif kind == "duplicate":
            toks.insert(i, toks[i])
        else:
            j = next((j for j in range(i + 1, len(toks)) if toks[j][0] in significant), None)
            if j is None:
                return "none", text
            toks[i], toks[j] = toks[j], toks[i]
        return f"{kind} token {i}", _join(toks)
    if kind == "number":
        i = _pick(rng, toks, {"number"})
        if i is None:
            return "none", text
        toks = list(toks)
        toks[i] = ("x", _number(rng, toks[i][1]))
        return f"number {i} -> {toks[i][1][:40]}", _join(toks)
    if kind == "name":
        i = _pick(rng, toks, {"name"})
        if i is None:
            return "none", text
        names = sorted({t for k, t in toks if k == "name"} | set(words))
        toks = list(toks)
        toks[i] = ("name", rng.choice(names))
        return f"name {i} -> {toks[i][1]}", _join(toks)
    if kind == "char":
        pos = rng.randrange(len(text) + 1)
        ch = rng.choice(_STRANGE)
        return f"char {ch!r} at {pos}", text[:pos] + ch + text[pos:]
    if kind == "nest_expr":
        new = _nest_expression(rng, toks)
        return ("nest expression", new) if new is not None else ("none", text)
    if kind == "nest_block":
        new = _nest_block(rng, text)
        return ("nest block", new) if new is not None else ("none", text)
    if kind in ("drop_line", "dup_line", "swap_lines"):
        i = rng.randrange(len(lines))
        lines = list(lines)
        if kind == "drop_line":
            del lines[i]
        elif kind == "dup_line":
            lines.insert(i, lines[i])
        else:
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        return f"{kind} {i + 1}", "\n".join(lines)
    blocks = _blocks(lines)
    if not blocks:
        return "none", text
    a, b = rng.choice(blocks)
    if kind == "drop_block":
        return f"drop block {a + 1}-{b + 1}", "\n".join(lines[:a] + lines[b + 1:])
    return f"dup block {a + 1}-{b + 1}", "\n".join(lines[:b + 1] + lines[a:b + 1] + lines[b + 1:])


def mutants(sample: Path, seed: int, n: int, start: int = 0):
    """(input id, what was done, text) for inputs start .. start+n-1 of `sample`."""
    text = sample.read_text(encoding="utf-8")
    words = vocabulary()
    for i in range(start, start + n):
        rng = random.Random(f"{seed}:{sample.name}:{i}")
        done, new = [], text
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            what, new = mutate(rng, new, words)
            done.append(what)
        yield f"{seed}:{sample.name}:{i}", "; ".join(done), new


# -- running one input --------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    kind: str       # "ok" | "diagnostic" | "crash" | "stall"
    phase: str      # how far it got: "check", "plan" or "compile"
    seconds: float
    detail: str = ""  # the codes of a diagnostic, or the traceback of a crash
    calls: int = 0  # function calls made (Python and builtin, counted by cProfile): the work, whatever the load


@contextmanager
def counting(into: list):
    """Count the function calls made inside the block (cProfile's call counts, summed) and append the total to
    `into`. A measure of work that does not depend on how loaded the machine is: the fuzz tests bound it instead
    of seconds (wall-clock claims belong in bench/)."""
    profile = cProfile.Profile()
    profile.enable()
    try:
        yield
    finally:
        profile.disable()
        into.append(sum(entry.callcount for entry in profile.getstats()))


class Stall(BaseException):
    """Raised by the watchdog in the middle of whatever was running (BaseException: no `except Exception` eats it)."""


@contextmanager
def _watchdog(seconds: float):
    def fire(signum, frame):
        raise Stall()
    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _located(err: ScaleError, path: str) -> str | None:
    """None if every diagnostic renders located (file:line:col, source line, caret); else what is missing."""
    text = err.render()
    if not err.diagnostics:
        return "a ScaleError without diagnostics"
    for d in err.diagnostics:
        if d.span is None:
            return f"{d.code} has no location"
        if f"--> {d.span.file}:{d.span.line}:{d.span.col}" not in text:
            return f"{d.code} does not render its location"
    if "^" not in text:
        return "no caret in the rendering"
    return None


def run(text: str, path: str = "fuzz.scale", out_dir: str | None = None, hard_limit: float = 60.0,
        check_only: bool = False) -> Outcome:
    """`scalec check`, then (unless `check_only`) `plan` and `compile` (on the meta device; program.py must be
    valid Python); `calls` counts the work done. `hard_limit` seconds only turns a hang into a "stall" outcome
    instead of hanging the run: a failsafe, not a bound on speed."""
    calls: list[int] = []
    with counting(calls):
        out = _run(text, path, out_dir, hard_limit, check_only)
    return dataclasses.replace(out, calls=calls[0])


def _run(text: str, path: str, out_dir: str | None, hard_limit: float, check_only: bool) -> Outcome:
    from compiler import codegen
    from compiler.fit import budget
    from compiler.pipeline import compile_spec
    phase = "check"
    t0 = time.perf_counter()
    try:
        with _watchdog(hard_limit):
            try:
                spec = check_text(text, path)
                if check_only:
                    return Outcome("ok", phase, time.perf_counter() - t0)
                phase = "plan"
                compiled = compile_spec(spec)
                plan_text(compiled)
                phase = "compile"
                problems = budget(compiled)
                if problems:
                    raise ScaleError(problems, {spec.path: spec.source})
                with tempfile.TemporaryDirectory() if out_dir is None else _nothing(out_dir) as out:
                    codegen.emit(compiled, out)
                    program = Path(out, "program.py").read_text(encoding="utf-8")
                compile(program, "program.py", "exec")
            except ScaleError as err:
                missing = _located(err, path)
                seconds = time.perf_counter() - t0
                if missing is not None:
                    return Outcome("crash", phase, seconds, f"unlocated diagnostic: {missing}\n{err.render()}")
                return Outcome("diagnostic", phase, seconds, ",".join(d.code for d in err.diagnostics))
            except Exception:  # noqa: BLE001 - what the fuzzer is looking for
                return Outcome("crash", phase, time.perf_counter() - t0, traceback.format_exc())
    except Stall:
        return Outcome("stall", phase, time.perf_counter() - t0, f"interrupted after {hard_limit:g} s")
    return Outcome("ok", phase, time.perf_counter() - t0)


@contextmanager
def _nothing(value):
    yield value
