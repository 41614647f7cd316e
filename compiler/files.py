"""What `check` reads of a token file without reading it all: its sidecar and a bounded sample of its ids.

A flat file of token ids cannot say its dtype: a file written as uint32 and read as uint16 gives ids that stay
inside the vocabulary (the high halves read as token 0) and trains on garbage without a word. So a token file may
carry a sidecar, `FILE.json` beside `FILE` (runtime.data.write_tokens writes both), recording its dtype, vocabulary
size and token count; `check` compares it with the .scale file, and the program does again when it opens the file
(runtime/data.py). Without one, `check` reads the first SAMPLE_BYTES of the file (whatever its size: a 100 GB
file costs the same) and says what they look like.

A `.npy` file (`np.save`'s output) does say its dtype and shape, in its header: it is read by that header (the
ids start after it), never as a flat file whose first ids would be the header's bytes. It is recognised by its
magic string, whatever its name; a file named .npy without one is refused.

The sidecar is a file format with two readers, this module (torch- and runtime-free: `scalec check` imports
neither) and runtime/data.py; tests/test_data.py holds them to the same files.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

ITEMSIZE = {"uint16": 2, "uint32": 4, "int32": 4, "int64": 8}
NPY_MAGIC = b"\x93NUMPY"  # what every .npy file starts with (numpy.lib.format)
SIDECAR_FORMAT = "scalec-tokens/1"
SAMPLE_BYTES = 1 << 20  # what check reads of a token file: 1 MiB, however large the file
MIN_PAIRS = 32          # the least sample a dtype guess is made from


class SidecarError(Exception):
    """The sidecar exists but cannot be used (one line)."""


class NpyError(Exception):
    """The file is a .npy file (or is named one) but not a flat array of token ids we can read (one line)."""


@dataclass(frozen=True)
class NpyHeader:
    """What a .npy file's header says: the ids' dtype (one of ITEMSIZE), their count, where they start."""
    dtype: str
    tokens: int
    offset: int


def npy_header(start: bytes, size: int, named_npy: bool = False) -> NpyHeader | None:
    """The header of the file whose first bytes are `start` (its size `size`): None when it is no .npy file,
    NpyError when it is one (or is named `.npy`: `named_npy`) that does not hold a flat array of token ids of a
    dtype we read, little-endian, whole (the runtime reads the same with np.load; runtime/data.py)."""
    import io

    import numpy as np
    from numpy.lib import format as npy

    if not start.startswith(NPY_MAGIC):
        if named_npy:
            raise NpyError("is named .npy but has no .npy header (it does not start with \\x93NUMPY): write it "
                           "with np.save, or rename it and declare its dtype")
        return None
    f = io.BytesIO(start)
    try:
        version = npy.read_magic(f)
        if version == (1, 0):
            shape, fortran, dt = npy.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dt = npy.read_array_header_2_0(f)
        else:
            raise NpyError(f"has a .npy header of version {version[0]}.{version[1]}, which we do not read (1.0, "
                           "2.0: what np.save writes for token ids)")
    except (ValueError, EOFError, OSError) as exc:  # numpy's own words for a header it cannot parse
        raise NpyError(f"has a .npy header that cannot be read ({str(exc).splitlines()[0][:120]})") from None
    offset = f.tell()
    name = dt.newbyteorder("<").name if dt.kind in "iu" else dt.name
    if dt.kind not in "iu" or name not in ITEMSIZE:
        raise NpyError(f"holds {dt.name} values, not token ids of {', '.join(ITEMSIZE)} (convert it: "
                       "np.save(path, ids.astype(np.int64)))")
    if dt.byteorder == ">" or (dt.byteorder == "=" and np.little_endian is False):
        raise NpyError(f"holds big-endian {name} ids (descr {dt.str!r}); write them little-endian: "
                       f"np.save(path, ids.astype('<{dt.str[1:]}'))")
    if len(shape) != 1:
        raise NpyError(f"holds an array of shape {tuple(shape)}, not a flat sequence of ids (one stream: "
                       "np.save(path, ids.reshape(-1)))")
    tokens = int(shape[0])
    if offset + tokens * ITEMSIZE[name] != size:
        raise NpyError(f"holds {size - offset} bytes after its header, but its header says {tokens} {name} ids "
                       f"({tokens * ITEMSIZE[name]} bytes): the file is cut short or was changed")
    return NpyHeader(dtype=name, tokens=tokens, offset=offset)


# Megatron's indexed dataset: PREFIX.idx starts with MMIDIDX, a uint64 version 1 and a uint8 dtype code
# (runtime/indexed.py writes and reads it).
class IndexFileError(Exception):
    """A Megatron index beside the token file gives its ids in a dtype we do not read (one line)."""


def index_dtype(path: str) -> str | None:
    """The dtype PREFIX.idx gives the ids of `path` (PREFIX.bin): None without such an index (no PREFIX.idx, or one
    without the MMIDIDX header), IndexFileError for a version or a dtype code we do not read. It is the program's own
    reader (runtime.indexed.index_dtype, torch-free), so check and the run read the header alike by construction."""
    from runtime import indexed

    try:
        return indexed.index_dtype(path)
    except ValueError as exc:
        raise IndexFileError(str(exc)) from None


def read_start(path: str, nbytes: int = SAMPLE_BYTES) -> bytes:
    """The first `nbytes` of `path` (all of it when shorter): the one read `check` makes of a token file."""
    with open(path, "rb") as f:
        return f.read(min(os.path.getsize(path), nbytes))


@dataclass(frozen=True)
class Reading:
    """How the file will be read, as `check` prints it and the program reads it: its format ("raw", a flat file of
    ids, or "npy"), the dtype and where that came from, its ids, and the ids seen in the sample."""
    path: str
    format: str
    dtype: str
    dtype_from: str           # "its .npy header", "its sidecar", "declared", "the default"
    tokens: int
    seen: tuple[int, int] | None   # the least and the largest id of the sample
    sampled: int              # the bytes of ids that sample is of
    vocab: int | None         # the vocabulary the sidecar records


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
    high: int                             # the largest high part (of a looks_like id) of the sample
    seen: tuple[int, int] | None = None   # the least and the largest id of the sample, read as declared
    parts: int = 2                        # items of the declared dtype per id of looks_like


# The wider dtypes a file may be written in, widest first: int64 ids read as uint16 are [id, 0, 0, 0], which the
# uint32 test ([id, 0] pairs) would take for uint32 too.
WIDER = ("int64", "uint32")


def sample(path: str, dtype: str, vocab: int, nbytes: int = SAMPLE_BYTES, start: bytes | None = None,
           offset: int = 0) -> Sample:
    """Read at most `nbytes` from the start of `path` (a whole number of 4-byte items when it can) and judge them;
    `start`: those bytes, already read (read_start); `offset`: where the ids begin (after a .npy header).

    A little-endian uint32 file of ids below 65536 read as uint16 has every odd item 0 (below the vocabulary's
    high half in general): real uint16 token data does not. An int64 file read as uint16 has three items of every
    four 0, read as uint32 every odd one. A uint16 file read as uint32 pairs neighbouring ids into numbers far
    past any vocabulary below 65536, so its ids fall outside, and read as uint16 they fit."""
    import numpy as np  # not torch: numpy alone reads the sample

    size = os.path.getsize(path) - offset
    if start is None:
        start = read_start(path, nbytes + offset)
    raw = start[offset:offset + nbytes]
    n = len(raw)
    n -= n % 4 if size % 4 == 0 else n % ITEMSIZE[dtype]
    raw = raw[:n]
    ids = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<"))
    bad = np.flatnonzero((ids >= vocab) | (ids < 0)) if len(ids) else np.array([], dtype=np.int64)
    outside = (int(bad[0]), int(ids[bad[0]])) if len(bad) else None
    seen = (int(ids.min()), int(ids.max())) if len(ids) else None
    fits_as = None
    if outside is not None:
        for other in ITEMSIZE:
            if other != dtype and len(raw) % ITEMSIZE[other] == 0:
                alt = np.frombuffer(raw, dtype=np.dtype(other).newbyteorder("<"))
                if len(alt) and alt.min() >= 0 and alt.max() < vocab:
                    fits_as = other
                    break
    looks_like, high, parts = None, 0, 2
    item = ITEMSIZE[dtype]
    for wider in WIDER:
        width = ITEMSIZE[wider]
        if width <= item or size % width or len(raw) < width * MIN_PAIRS:
            continue
        cut = len(raw) - len(raw) % width
        split = np.frombuffer(raw[:cut], dtype=f"<u{item}").reshape(-1, width // item)
        top = int(split[:, 1:].max())
        if top <= (vocab - 1) >> (8 * item) and split[:, 0].any():
            looks_like, high, parts = wider, top, width // item
            break
    return Sample(nbytes=len(raw), outside=outside, fits_as=fits_as, looks_like=looks_like, high=high, seen=seen,
                  parts=parts)


def shown_bytes(n: int) -> str:
    """1048576 -> '1 MiB', 800 -> '800 bytes'."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"
