"""What `check` reads of a token file without reading it all: its sidecar and a bounded sample of its ids.

A flat file of token ids cannot say its dtype: a file written as uint32 and read as uint16 gives ids that stay
inside the vocabulary (the high halves read as token 0) and trains on garbage without a word. So a token file may
carry a sidecar, `FILE.json` beside `FILE` (runtime.data.write_tokens writes both), recording its dtype, vocabulary
size and token count; `check` compares it with the .scale file, and the program does again when it opens the file
(runtime/data.py). Without one, `check` reads the first SAMPLE_BYTES of the file (whatever its size: a 100 GB
file costs the same) and says what they look like.

The sidecar is a file format with two readers, this module (torch- and runtime-free: `scalec check` imports
neither) and runtime/data.py; tests/test_data.py holds them to the same files.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

ITEMSIZE = {"uint16": 2, "uint32": 4, "int32": 4}
SIDECAR_FORMAT = "scalec-tokens/1"
SAMPLE_BYTES = 1 << 20  # what check reads of a token file: 1 MiB, however large the file
MIN_PAIRS = 32          # the least sample a dtype guess is made from


class SidecarError(Exception):
    """The sidecar exists but cannot be used (one line)."""


@dataclass(frozen=True)
class Sidecar:
    dtype: str
    vocab_size: int
    tokens: int
    tokenizer: str | None
    path: str


def sidecar_path(path: str) -> str:
    return path + ".json"


def read_sidecar(path: str) -> Sidecar | None:
    """The sidecar of token file `path`, None when it has none, SidecarError when it is not one we can read."""
    side = sidecar_path(path)
    if not os.path.isfile(side):
        return None
    try:
        with open(side, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SidecarError(f"{side} is not readable JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != SIDECAR_FORMAT:
        raise SidecarError(f"{side} is not a token-file sidecar (its \"format\" should be \"{SIDECAR_FORMAT}\")")
    dtype, vocab, tokens, tok = doc.get("dtype"), doc.get("vocab_size"), doc.get("tokens"), doc.get("tokenizer")
    if dtype not in ITEMSIZE:
        raise SidecarError(f"{side}: \"dtype\" is {dtype!r}, not one of {', '.join(ITEMSIZE)}")
    for key, value in (("vocab_size", vocab), ("tokens", tokens)):
        if not isinstance(value, int) or isinstance(value, bool) or value < (1 if key == "vocab_size" else 0):
            what = "a positive whole number" if key == "vocab_size" else "a whole number"
            raise SidecarError(f"{side}: \"{key}\" is {value!r}, not {what}")
    if tok is not None and not isinstance(tok, str):
        raise SidecarError(f"{side}: \"tokenizer\" is {tok!r}, not a string")
    return Sidecar(dtype=dtype, vocab_size=vocab, tokens=tokens, tokenizer=tok, path=side)


@dataclass(frozen=True)
class Sample:
    """What the first bytes of a bare token file say."""
    nbytes: int                           # bytes read
    outside: tuple[int, int] | None       # (position, id) of the first id outside the vocabulary, as declared
    fits_as: str | None                   # another dtype under which every sampled id is inside the vocabulary
    looks_like: str | None                # the dtype the bytes look like, when not the declared one
    high: int                             # the largest odd uint16 (a uint32's high half) of the sample


def sample(path: str, dtype: str, vocab: int, nbytes: int = SAMPLE_BYTES) -> Sample:
    """Read at most `nbytes` from the start of `path` (a whole number of 4-byte items when it can) and judge them.

    A little-endian uint32 file of ids below 65536 read as uint16 has every odd item 0 (below the vocabulary's
    high half in general): real uint16 token data does not. A uint16 file read as uint32 pairs neighbouring ids
    into numbers far past any vocabulary below 65536, so its ids fall outside, and read as uint16 they fit."""
    import numpy as np  # not torch: numpy alone reads the sample

    size = os.path.getsize(path)
    n = min(size, nbytes)
    n -= n % 4 if size % 4 == 0 else n % ITEMSIZE[dtype]
    with open(path, "rb") as f:
        raw = f.read(n)
    ids = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<"))
    bad = np.flatnonzero((ids >= vocab) | (ids < 0)) if len(ids) else np.array([], dtype=np.int64)
    outside = (int(bad[0]), int(ids[bad[0]])) if len(bad) else None
    fits_as = None
    if outside is not None:
        for other in ITEMSIZE:
            if other != dtype and len(raw) % ITEMSIZE[other] == 0:
                alt = np.frombuffer(raw, dtype=np.dtype(other).newbyteorder("<"))
                if len(alt) and alt.min() >= 0 and alt.max() < vocab:
                    fits_as = other
                    break
    looks_like, high = None, 0
    if ITEMSIZE[dtype] == 2 and size % 4 == 0 and len(raw) >= 4 * MIN_PAIRS:
        halves = np.frombuffer(raw, dtype="<u2").reshape(-1, 2)
        high = int(halves[:, 1].max())
        if high <= (vocab - 1) >> 16 and halves[:, 0].any():
            looks_like = "uint32"
    return Sample(nbytes=len(raw), outside=outside, fits_as=fits_as, looks_like=looks_like, high=high)


def shown_bytes(n: int) -> str:
    """1048576 -> '1 MiB', 800 -> '800 bytes'."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"
