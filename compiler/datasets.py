"""`scalec data`: text files and JSONL into an indexed token dataset (runtime/indexed.py: Megatron's .bin/.idx and our
sidecar), with a Hugging Face tokenizer read from a local tokenizer.json or a model directory (no hub access).

Each .txt or .md file is one document; each line of a .jsonl file is one, its text under `text_key`. With `separator` (a
token of the tokenizer, e.g. "</s>" or "<|endoftext|>"), its id ends every document, so the flat PREFIX.bin keeps the
boundaries for a loader that reads it as one stream (`tokens(path = "PREFIX.bin")`), as PREFIX.idx keeps them for
one that reads documents. Deterministic: the same inputs, in the order given, make the same bytes.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass


class DataError(Exception):
    """A problem with the inputs or the tokenizer, said in one line (the command exits 1)."""


@dataclass(frozen=True)
class Written:
    prefix: str
    documents: int
    tokens: int
    dtype: str
    vocab_size: int
    separator: int | None


def tokenizer_file(path: str) -> str:
    """The tokenizer.json of `path`: the file itself, or the one in a model directory."""
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(path):
        raise DataError(f"no tokenizer at {path}: name a tokenizer.json or a directory holding one")
    return path


def documents(paths: list, text_key: str):
    """(where, text) of every document of the inputs, in order: `where` is FILE or FILE:LINE."""
    for path in paths:
        if not os.path.isfile(path):
            raise DataError(f"{path}: no such file")
        if path.endswith(".jsonl"):
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise DataError(f"{path}:{n}: not a JSON line ({exc.msg})") from None
                    text = record.get(text_key) if isinstance(record, dict) else None
                    if not isinstance(text, str):
                        raise DataError(f"{path}:{n}: no string under \"{text_key}\" (--text-key names the field)")
                    yield f"{path}:{n}", text
        elif path.endswith((".txt", ".md")):
            with open(path, encoding="utf-8") as f:
                yield path, f.read()
        else:
            raise DataError(f"{path}: not a .txt or .md (one document) or .jsonl (one a line) file")


def build(paths: list, tokenizer: str, prefix: str, text_key: str = "text", separator: str | None = None,
          progress: bool = True) -> Written:
    """Tokenize every document of `paths` into PREFIX.bin, PREFIX.idx and PREFIX.bin.json."""
    try:
        from tokenizers import Tokenizer
    except ImportError:  # an optional dependency (pyproject.toml's `data` extra): say what to install, in one line
        raise DataError("scalec data needs the tokenizers library, which is not installed: "
                        "pip install 'scalec[data]' (or: pip install tokenizers)") from None

    from runtime import indexed
    source = tokenizer_file(tokenizer)
    try:
        tok = Tokenizer.from_file(source)
    except Exception as exc:  # noqa: BLE001 - tokenizers raises its own exception types
        raise DataError(f"{source}: not a tokenizer.json the tokenizers library reads ({exc})") from None
    vocab = tok.get_vocab_size(with_added_tokens=True)
    sep = None
    if separator is not None:
        sep = tok.token_to_id(separator)
        if sep is None:
            raise DataError(f"the tokenizer has no token {separator!r} to end documents with")
    if not paths:
        raise DataError("no input files")
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    writer = indexed.Writer(prefix, vocab, tokenizer=os.path.abspath(source), separator=sep)
    bar = _bar(progress)
    try:
        for _, text in documents(paths, text_key):
            ids = tok.encode(text, add_special_tokens=False).ids
            writer.add(ids + ([sep] if sep is not None else []))
            bar.update(1)
        if not writer.lengths:
            raise DataError("the inputs hold no document")
    except BaseException:
        writer.abort()  # no partial dataset left behind with a sidecar that vouches for it
        raise
    finally:
        bar.close()
    side = writer.close()
    return Written(prefix, side["documents"], side["tokens"], side["dtype"], vocab, sep)


def _bar(progress: bool):
    """tqdm's bar over documents on stderr, when asked and installed; else one that does nothing."""
    if progress:
        try:
            from tqdm import tqdm
            return tqdm(unit=" documents", file=sys.stderr, mininterval=0.5)
        except ImportError:
            pass

    class _Quiet:
        def update(self, n):
            pass

        def close(self):
            pass
    return _Quiet()
