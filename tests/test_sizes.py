"""Modules and functions of one job each: no file of compiler/ or runtime/ over 600 lines and no function over 120
(the Layout issue), but the few listed here, each with the reason it must be."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 120

# path -> why it may be longer
LONG_FILES: dict = {}
# "path::qualified name" -> why it may be longer
LONG_FUNCTIONS: dict = {}


def _sources():
    for package in ("compiler", "runtime"):
        yield from sorted(p for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)


def _functions(tree: ast.AST, prefix: str = ""):
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield f"{prefix}{node.name}", node.end_lineno - node.lineno + 1
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")


def test_no_module_over_600_lines():
    long = {}
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        n = len(path.read_text().splitlines())
        if n > MAX_FILE_LINES and rel not in LONG_FILES:
            long[rel] = n
    assert not long, f"split these by job (or list one in LONG_FILES with why it must be long): {long}"


def test_no_function_over_120_lines():
    long = {}
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        for name, n in _functions(ast.parse(path.read_text())):
            if n > MAX_FUNCTION_LINES and f"{rel}::{name}" not in LONG_FUNCTIONS:
                long[f"{rel}::{name}"] = n
    assert not long, f"split these (or list one in LONG_FUNCTIONS with why it must be long): {long}"


def test_the_exceptions_are_still_needed():
    """An entry for a file or function that has since become short (or gone) is dropped."""
    stale = [rel for rel in LONG_FILES if not (ROOT / rel).exists()
             or len((ROOT / rel).read_text().splitlines()) <= MAX_FILE_LINES]
    lengths = {}
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        lengths.update({f"{rel}::{name}": n for name, n in _functions(ast.parse(path.read_text()))})
    stale += [key for key in LONG_FUNCTIONS if lengths.get(key, 0) <= MAX_FUNCTION_LINES]
    assert not stale, stale
