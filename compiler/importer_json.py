"""A config.json read as `json.loads` reads it, with where each key is (compiler/importer.py locates its
diagnostics at the JSON keys: file:line:col, the line, a caret)."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from compiler.diagnostics import Span


@dataclass
class Json:
    """A parsed JSON document with the offsets of every key: path -> (key start, key end, value start, value end)."""

    text: str
    value: object = None
    where: dict = field(default_factory=dict)
    duplicates: list = field(default_factory=list)

    def span(self, path: tuple, value: bool = False) -> Span | None:
        """The key at `path` (with `value`, the key through its value when both are on one line)."""
        if path not in self.where:
            return None
        ks, ke, vs, ve = self.where[path]
        end = ve if value and "\n" not in self.text[ks:ve] else ke
        return Span(self.path, *self.position(ks), *self.position(end))

    def start(self) -> Span:
        """The document's first character (its opening brace): where a diagnostic about an absent key points."""
        line, col = self.position(_WS.match(self.text).end())
        return Span(self.path, line, col, line, col + 1)

    def position(self, offset: int) -> tuple[int, int]:
        """(line, column) of character `offset`, both from 1."""
        line = self.text.count("\n", 0, offset) + 1
        return line, offset - (self.text.rfind("\n", 0, offset) + 1) + 1

    path: str = ""


class BadJson(Exception):
    def __init__(self, offset: int, message: str):
        super().__init__(message)
        self.offset, self.message = offset, message


_WS = re.compile(r"[ \t\n\r]*")


def parse(text: str, path: str) -> Json:
    """JSON as `json.loads` reads it, and where each object key (and array element) is: json's hooks give no
    positions, so objects and arrays are walked here and scalars left to json's own scanner."""
    doc = Json(text=text, path=path)
    decoder = json.JSONDecoder()

    def ws(i: int) -> int:
        return _WS.match(text, i).end()

    def value(i: int, at: tuple):
        if i >= len(text):
            raise BadJson(i, "the text ends where a value was expected")
        if text[i] == "{":
            obj: dict = {}
            i = ws(i + 1)
            if text.startswith("}", i):
                return obj, i + 1
            while True:
                if not text.startswith('"', i):
                    raise BadJson(i, "expected a key in double quotes")
                try:
                    key, kend = json.decoder.scanstring(text, i + 1)
                except json.JSONDecodeError as e:
                    raise BadJson(e.pos, e.msg) from None
                kstart, i = i, ws(kend)
                if not text.startswith(":", i):
                    raise BadJson(i, "expected `:` after the key")
                vstart = ws(i + 1)
                v, vend = value(vstart, at + (key,))
                if key in obj:
                    doc.duplicates.append((at + (key,), (kstart, kend, vstart, vend)))
                else:
                    doc.where[at + (key,)] = (kstart, kend, vstart, vend)
                obj[key] = v
                i = ws(vend)
                if text.startswith(",", i):
                    i = ws(i + 1)
                    continue
                if text.startswith("}", i):
                    return obj, i + 1
                raise BadJson(i, "expected `,` or `}`")
        if text[i] == "[":
            arr: list = []
            i = ws(i + 1)
            if text.startswith("]", i):
                return arr, i + 1
            while True:
                vstart = i
                v, i = value(i, at + (len(arr),))
                doc.where[at + (len(arr),)] = (vstart, i, vstart, i)
                arr.append(v)
                i = ws(i)
                if text.startswith(",", i):
                    i = ws(i + 1)
                    continue
                if text.startswith("]", i):
                    return arr, i + 1
                raise BadJson(i, "expected `,` or `]`")
        try:
            return decoder.raw_decode(text, i)
        except json.JSONDecodeError as e:
            raise BadJson(e.pos, e.msg) from None

    try:
        doc.value, end = value(ws(0), ())
    except RecursionError:
        raise BadJson(0, "nested too deeply") from None
    end = ws(end)
    if end != len(text):
        raise BadJson(end, "extra text after the JSON value")
    return doc
