"""Indexed token datasets in Megatron-LM's layout: PREFIX.bin (every document's token ids, one after another) and
PREFIX.idx (where each document starts and how long it is), the ecosystem's format, written by `scalec data` and
readable by Megatron's own IndexedDataset; and our sidecar, PREFIX.bin.json, so that PREFIX.bin is also a plain token
file (`tokens(path = "PREFIX.bin")`, runtime/data.py) that records its dtype, vocabulary and tokenizer.

PREFIX.idx, all little-endian (Megatron-Core's _IndexWriter/_IndexReader):
    b"MMIDIDX\\x00\\x00"            9 bytes
    version                        uint64, 1
    dtype code                     uint8: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16
    sequence count S               uint64
    document index count D         uint64 (documents + 1)
    sequence lengths               int32 × S      (tokens of each sequence; here one sequence per document)
    sequence pointers              int64 × S      (byte offset of each sequence in PREFIX.bin)
    document indices               int64 × D      (0, then the sequence index that ends each document)

numpy only: no torch, no compiler.
"""
from __future__ import annotations

import json
import os
import struct

import numpy as np

HEADER = b"MMIDIDX\x00\x00"
VERSION = 1
CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float64": 6, "float32": 7, "uint16": 8}
DTYPES = ("uint16", "int32")
"""What ids are written as: uint16 when the vocabulary fits, else int32 (Megatron's choice; it has no uint32)."""


def dtype_for(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 65536 else "int32"


class Writer:
    """Append documents (arrays of ids) to PREFIX.bin; `close` writes PREFIX.idx and the sidecar. Ids outside the
    vocabulary are refused, so the files are what the sidecar says."""

    def __init__(self, prefix: str, vocab_size: int, tokenizer: str | None = None, separator: int | None = None):
        self.prefix, self.vocab, self.tokenizer, self.separator = prefix, int(vocab_size), tokenizer, separator
        self.dtype = dtype_for(self.vocab)
        self.lengths: list[int] = []
        self._bin = open(prefix + ".bin", "wb")

    def add(self, ids) -> None:
        arr = np.asarray(ids, dtype=np.int64)
        if arr.ndim != 1:
            raise ValueError("a document is a flat sequence of ids")
        if arr.size and (arr.min() < 0 or arr.max() >= self.vocab):
            bad = int(arr[(arr < 0) | (arr >= self.vocab)][0])
            raise ValueError(f"token id {bad} is outside the vocabulary of {self.vocab}")
        self._bin.write(arr.astype(np.dtype(self.dtype).newbyteorder("<")).tobytes())
        self.lengths.append(int(arr.size))

    def abort(self) -> None:
        """Remove what was written: a dataset cut short by an error must not pass for a whole one."""
        self._bin.close()
        for suffix in (".bin", ".idx", ".bin.json"):
            if os.path.exists(self.prefix + suffix):
                os.remove(self.prefix + suffix)

    def close(self) -> dict:
        """Write the index and the sidecar; returns the sidecar."""
        self._bin.close()
        lengths = np.asarray(self.lengths, dtype=np.int32)
        size = np.dtype(self.dtype).itemsize
        pointers = np.concatenate([[0], np.cumsum(lengths.astype(np.int64) * size)[:-1]]).astype(np.int64) \
            if len(lengths) else np.zeros(0, dtype=np.int64)
        documents = np.arange(len(lengths) + 1, dtype=np.int64)  # one sequence per document
        with open(self.prefix + ".idx", "wb") as f:
            f.write(HEADER)
            f.write(struct.pack("<Q", VERSION))
            f.write(struct.pack("<B", CODES[self.dtype]))
            f.write(struct.pack("<Q", len(lengths)))
            f.write(struct.pack("<Q", len(documents)))
            f.write(lengths.astype("<i4").tobytes())
            f.write(pointers.astype("<i8").tobytes())
            f.write(documents.astype("<i8").tobytes())
        side = {"format": "scalec-tokens/1", "dtype": self.dtype, "vocab_size": self.vocab,
                "tokens": int(lengths.sum()), "documents": len(lengths), "index": os.path.basename(self.prefix) + ".idx"}
        if self.tokenizer is not None:
            side["tokenizer"] = self.tokenizer
        if self.separator is not None:
            side["document_separator"] = int(self.separator)
        with open(self.prefix + ".bin.json", "w", encoding="utf-8") as f:
            json.dump(side, f, indent=2)
            f.write("\n")
        return side


def index_dtype(path: str) -> str | None:
    """The dtype PREFIX.idx gives the ids of token file `path` (PREFIX.bin), None when there is no such index (no
    PREFIX.idx, or one without the MMIDIDX header: not Megatron's); ValueError (one line) for an index whose version
    or dtype code is not one we read. A Megatron dataset has no sidecar: its index is what says its dtype, which
    `scalec check` and the run both read here."""
    if not path.endswith(".bin"):
        return None
    index = path[:-len(".bin")] + ".idx"
    if not os.path.isfile(index):
        return None
    with open(index, "rb") as f:
        head = f.read(18)
    if len(head) < 18 or head[:9] != HEADER:
        return None
    version, = struct.unpack("<Q", head[9:17])
    if version != VERSION:
        raise ValueError(f"its index {index} is version {version}, not {VERSION}")
    code = head[17]
    names = {v: k for k, v in CODES.items()}
    if names.get(code) not in TOKEN_DTYPES:
        what = names.get(code, f"the unknown code {code}")
        raise ValueError(f"its index {index} gives its ids as {what}, which is not read as token ids (uint16, "
                         f"int32, int64)")
    return names[code]


# The dtypes of an index's ids that are token ids the run reads (runtime/data.py DTYPES; Megatron has no uint32).
TOKEN_DTYPES = ("uint16", "int32", "int64")


class Reader:
    """PREFIX.idx and PREFIX.bin, memory-mapped: `len()` documents, `[i]` the ids of document i."""

    def __init__(self, prefix: str):
        with open(prefix + ".idx", "rb") as f:
            head = f.read(34)
        if len(head) < 34 or head[:9] != HEADER:
            raise ValueError(f"{prefix}.idx is not an indexed dataset (no MMIDIDX header)")
        version, = struct.unpack("<Q", head[9:17])
        if version != VERSION:
            raise ValueError(f"{prefix}.idx is version {version}, not {VERSION}")
        code, = struct.unpack("<B", head[17:18])
        names = {v: k for k, v in CODES.items()}
        if code not in names:
            raise ValueError(f"{prefix}.idx names dtype code {code}, which is not one of {sorted(names)}")
        self.dtype = names[code]
        sequences, documents = struct.unpack("<QQ", head[18:34])
        index = np.memmap(prefix + ".idx", mode="r", dtype=np.uint8)
        at = 34
        self.lengths = np.frombuffer(index, dtype="<i4", count=sequences, offset=at)
        at += 4 * sequences
        self.pointers = np.frombuffer(index, dtype="<i8", count=sequences, offset=at)
        at += 8 * sequences
        self.documents = np.frombuffer(index, dtype="<i8", count=documents, offset=at)
        self.tokens = np.memmap(prefix + ".bin", mode="r", dtype=np.dtype(self.dtype).newbyteorder("<"))

    def __len__(self) -> int:
        return len(self.documents) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        """The ids of document i (its sequences, one after another)."""
        lo, hi = int(self.documents[i]), int(self.documents[i + 1])
        if hi <= lo:
            return np.zeros(0, dtype=self.tokens.dtype)
        start = int(self.pointers[lo]) // self.tokens.itemsize
        end = int(self.pointers[hi - 1]) // self.tokens.itemsize + int(self.lengths[hi - 1])
        return np.asarray(self.tokens[start:end])
