"""Deterministic training data, split across dp ranks and micro-batches.

Sample `i` of step `t` is a function of (seed, t, i) only, so that any dp × micro-batch layout of the same global
batch sees the same sequences: the single-device run is the reference for every plan.
"""
from __future__ import annotations

import json
import os

import numpy as np
import torch

from runtime.errors import FatalError
from runtime.indexed import index_dtype
from runtime.split import split_windows  # noqa: F401  (data.split_windows: the split a TokenFile reads)


class Synthetic:
    """Arithmetic sequences modulo the vocabulary: each sequence starts at a random token and steps by a random
    stride in 1..4. A model first learns that tokens step forward, then infers each sequence's stride from its
    context, so the loss falls visibly from ln(vocab) within a few dozen steps."""

    def __init__(self, vocab: int, seq_len: int, seed: int):
        self.vocab, self.seq_len, self.seed = vocab, seq_len, seed

    def samples(self, step: int, global_batch: int, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._draw(self.seed * 1_000_003 + step, global_batch, lo, hi)

    def eval_samples(self, batch: int, global_batch: int, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples lo..hi-1 of held-out batch `batch` (0..eval_batches-1): a seed stream of its own, the same at
        every evaluation. The seed is hashed from (seed, batch, a tag) by numpy's SeedSequence to the 32 bits the
        CPU generator reads (an offset above 2^32 would be lost: torch's mt19937 keeps the seed's low 32 bits), so
        it meets a training step's seed by chance alone."""
        hashed = int(np.random.SeedSequence([self.seed % 2**63, batch, 0xE7A1]).generate_state(1)[0])
        return self._draw(hashed, global_batch, lo, hi)

    def _draw(self, seed: int, global_batch: int, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, self.vocab, (global_batch,), generator=g)[lo:hi]
        stride = torch.randint(1, 5, (global_batch,), generator=g)[lo:hi]
        pos = torch.arange(self.seq_len + 1)
        seq = (start[:, None] + stride[:, None] * pos[None, :]) % self.vocab
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def resolve(path: str, program: str | None) -> str:
    """A data path as the program holds it: relative to the program's directory (the compiler wrote it so, from
    the .scale file's directory), absolute as written."""
    if not path or os.path.isabs(path) or program is None:
        return path
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(program)), path))


# Ids checked per slice of the file: a bounded temporary, however large the file.
CHUNK = 1 << 24

# The sidecar of a token file: FILE.json beside FILE, recording what a flat file cannot say (its dtype, the
# vocabulary its ids come from, its length). `scalec check` reads it too (compiler/files.py, the same format).
SIDECAR_FORMAT = "scalec-tokens/1"
DTYPES = ("uint16", "uint32", "int32", "int64")
NPY_MAGIC = b"\x93NUMPY"  # what every .npy file (np.save's) starts with


def sidecar_path(path: str) -> str:
    return path + ".json"


def write_tokens(path: str, ids, dtype: str, vocab_size: int, tokenizer: str | None = None) -> dict:
    """Write token ids `ids` as a flat file of `dtype` at `path`, and its sidecar; returns the sidecar. Refuses ids
    outside 0..vocab_size - 1 or past what `dtype` holds, so that the file is what its sidecar says."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if not isinstance(vocab_size, (int, np.integer)) or vocab_size < 1 or vocab_size > np.iinfo(dtype).max + 1:
        raise ValueError(f"vocab_size {vocab_size!r} does not fit {dtype} ids (at most {np.iinfo(dtype).max + 1})")
    arr = np.asarray(ids)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise ValueError("ids must be a flat sequence of integers")
    if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
        bad = int(np.flatnonzero((arr < 0) | (arr >= vocab_size))[0])
        raise ValueError(f"token id {int(arr[bad])} at position {bad} is outside the vocabulary of {vocab_size}")
    arr.astype(np.dtype(dtype).newbyteorder("<")).tofile(path)
    side = {"format": SIDECAR_FORMAT, "dtype": dtype, "vocab_size": int(vocab_size), "tokens": int(arr.size)}
    if tokenizer is not None:
        side["tokenizer"] = tokenizer
    with open(sidecar_path(path), "w", encoding="utf-8") as f:
        json.dump(side, f, indent=2)
        f.write("\n")
    return side


def _check_sidecar(path: str, dtype: str, vocab: int, size: int) -> None:
    """FatalError (no restart can fix it) when the file's sidecar disagrees with the program: another dtype, a larger vocabulary, or
    another length than the file's (`scalec check` says the same, located; the program is its last guard)."""
    side_path = sidecar_path(path)
    if not os.path.isfile(side_path):
        return
    try:
        with open(side_path, encoding="utf-8") as f:
            side = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FatalError(f"scalec: data file {path}: its sidecar {side_path} is not readable JSON ({exc})") from None
    if not isinstance(side, dict) or side.get("format") != SIDECAR_FORMAT or side.get("dtype") not in DTYPES:
        raise FatalError(f"scalec: data file {path}: {side_path} is not a token-file sidecar ({SIDECAR_FORMAT})")
    if side["dtype"] != dtype:
        raise FatalError(f"scalec: data file {path} holds {side['dtype']} ids (its sidecar says so), but the program "
                         f"reads {dtype}")
    if not isinstance(side.get("vocab_size"), int) or side["vocab_size"] > vocab:
        raise FatalError(f"scalec: data file {path} has a vocabulary of {side.get('vocab_size')!r} tokens (its "
                         f"sidecar says so), the model {vocab}")
    if not isinstance(side.get("tokens"), int) or side["tokens"] * np.dtype(dtype).itemsize != size:
        raise FatalError(f"scalec: data file {path} holds {size} bytes, but its sidecar says "
                         f"{side.get('tokens')!r} {dtype} ids")


def _npy_tokens(path: str, dtype: str) -> np.ndarray:
    """A .npy token file memory-mapped by its header (np.load), held to what `scalec check` read: a flat array of
    little-endian `dtype` ids; FatalError naming what differs."""
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise FatalError(f"scalec: data file {path}: its .npy header cannot be read "
                         f"({str(exc).splitlines()[0][:120]})") from None
    got = arr.dtype.newbyteorder("<").name if arr.dtype.kind in "iu" else arr.dtype.name
    if got != dtype or arr.dtype.byteorder == ">":
        raise FatalError(f"scalec: data file {path} holds {arr.dtype.str} values (its .npy header says so), but the "
                         f"program reads {dtype} ids, as `scalec check` found it: it changed since; compile again")
    if arr.ndim != 1:
        raise FatalError(f"scalec: data file {path} holds an array of shape {arr.shape}, not a flat sequence of ids")
    return arr


def open_tokens(path: str, dtype: str, vocab: int, format: str = "raw") -> np.ndarray:
    """The file as a flat array of token ids, or FatalError (no restart can fix it) with one line naming the file and what is wrong with
    it: missing, a directory, a sidecar that disagrees (its dtype, vocabulary or length), empty, a size that is no
    whole number of ids, or an id outside the vocabulary
    (checked in chunks with numpy, so a large file costs one read and little memory). The same check on every
    rank of every plan: an id past the vocabulary is an error, not something a sharded lookup may mask.

    `format` is what `scalec check` found the file to be: "raw" (a flat file of `dtype` ids) or "npy" (np.save's
    file, read by its header, which must still say `dtype`). A raw file that has become a .npy file since is
    refused: read flat, its header's bytes would be ids."""
    dt = np.dtype(dtype)
    if format not in ("raw", "npy"):
        raise FatalError(f"scalec: data file {path}: unknown format {format!r} (raw or npy)")
    if not os.path.exists(path):
        raise FatalError(f"scalec: data file {path}: no such file")
    if os.path.isdir(path):
        raise FatalError(f"scalec: data file {path} is a directory, not a file of token ids")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        npy = f.read(len(NPY_MAGIC)) == NPY_MAGIC
    if npy != (format == "npy"):
        raise FatalError(f"scalec: data file {path} " + (
            "is a .npy file, but the program reads it as a flat file of ids (its header would be read as ids): it "
            "changed since `scalec check`; compile again" if npy else
            "has no .npy header, but the program was compiled for a .npy file: it changed since; compile again"))
    if npy:
        tokens = _npy_tokens(path, dtype)
        size = tokens.size * dt.itemsize  # the ids' bytes, after the header
    elif not os.path.isfile(sidecar_path(path)):  # a Megatron dataset: its index says the dtype
        try:
            indexed = index_dtype(path)
        except ValueError as exc:
            raise FatalError(f"scalec: data file {path}: {exc}") from None
        if indexed is not None and indexed != dtype:
            raise FatalError(f"scalec: data file {path} holds {indexed} ids (its index {path[:-4]}.idx says so), "
                             f"but the program reads {dtype}")
    _check_sidecar(path, dtype, vocab, size)
    if size == 0:
        raise FatalError(f"scalec: data file {path} is empty")
    if size % dt.itemsize:
        raise FatalError(f"scalec: data file {path} holds {size} bytes, not a whole number of {dtype} token ids "
                         f"({dt.itemsize} bytes each)")
    if not npy:
        try:
            tokens = np.memmap(path, dtype=dt, mode="r")
        except OSError as exc:
            raise FatalError(f"scalec: data file {path}: {exc.strerror or exc}") from None
    for lo in range(0, len(tokens), CHUNK):
        chunk = tokens[lo:lo + CHUNK]
        if chunk.max() >= vocab or (dt.kind == "i" and chunk.min() < 0):
            at = int(np.flatnonzero((chunk >= vocab) | (chunk < 0))[0])
            raise FatalError(f"scalec: data file {path}: token id {int(chunk[at])} at position {lo + at} is outside "
                             f"the vocabulary of {vocab} (ids 0..{vocab - 1})")
    return tokens


class TokenFile:
    """A flat binary file of token ids read in epochs: the file is cut into W = (tokens - 1) // seq_len windows of
    seq_len + 1 tokens (each overlapping the next by the one token its last target needs), and every epoch visits
    each window once, in an order shuffled afresh for each epoch (`Shuffle`, a function of (seed, epoch)). Sample j
    of step t is the global sample k = t·global_batch + j: epoch k // W, its (k mod W)-th window in that epoch's
    order. So the data is a function of (seed, step), as the module promises, and a run resumed from a checkpoint
    (which holds the step) continues where it stopped, on any plan.

    With `eval_split` F > 0 the file's tail is held out (runtime.split: the last floor(W · F) windows' tokens): the
    epochs permute only the windows before it, and `eval_samples` reads the held-out windows in order, the first
    `eval_sequences` of them (eval_batches × global_batch), the same ones at every evaluation."""

    def __init__(self, path: str, dtype: str, seq_len: int, seed: int, vocab: int, eval_split: float = 0.0,
                 eval_sequences: int = 0, format: str = "raw"):
        self.tokens = open_tokens(path, dtype, vocab, format)
        if len(self.tokens) <= seq_len + 1:
            raise FatalError(f"scalec: data file {path} holds {len(self.tokens)} tokens, fewer than one sequence of "
                             f"{seq_len} (and its next token)")
        self.seq_len, self.seed = seq_len, seed
        split = split_windows(len(self.tokens), seq_len, eval_split)
        if eval_split and split.eval_windows < eval_sequences:
            raise FatalError(f"scalec: data file {path}: eval_split = {eval_split:g} holds out "
                             f"{split.eval_windows} sequence(s) of {seq_len}, fewer than the {eval_sequences} of "
                             f"eval_batches × global_batch (`scalec check` refuses that: was the file changed since?)")
        if split.train_windows < 1:
            raise FatalError(f"scalec: data file {path}: eval_split = {eval_split:g} leaves no sequence of {seq_len} "
                             "to train on")
        self.windows, self.eval_first = split.train_windows, split.eval_first
        self.eval_windows = split.eval_windows
        self._orders: dict = {}

    def _order(self, epoch: int) -> "Shuffle":
        got = self._orders.get(epoch)
        if got is None:
            if len(self._orders) > 4:  # a step spans at most two epochs; keep a few
                self._orders.clear()
            got = self._orders[epoch] = Shuffle(self.windows, self.seed, epoch)
        return got

    def samples(self, step: int, global_batch: int, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        first = step * global_batch
        rows = []
        for k in range(first + lo, first + hi):
            epoch, pos = divmod(k, self.windows)
            s = self._order(epoch)[pos] * self.seq_len
            rows.append(np.asarray(self.tokens[s:s + self.seq_len + 1], dtype=np.int64))
        seq = torch.from_numpy(np.stack(rows))
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    def eval_samples(self, batch: int, global_batch: int, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples lo..hi-1 of held-out batch `batch`: held-out windows batch · global_batch + lo .. + hi - 1."""
        if not self.eval_windows:
            raise FatalError("scalec: evaluation of a token file needs `eval_split` (recompile the program)")
        rows = []
        for k in range(batch * global_batch + lo, batch * global_batch + hi):
            if k >= self.eval_windows:
                raise FatalError(f"scalec: held-out sequence {k} asked for, but eval_split holds out "
                                 f"{self.eval_windows}")
            s = self.eval_first + k * self.seq_len
            rows.append(np.asarray(self.tokens[s:s + self.seq_len + 1], dtype=np.int64))
        seq = torch.from_numpy(np.stack(rows))
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


class Shuffle:
    """A pseudo-random permutation of 0..n-1 keyed by (seed, epoch), evaluated one index at a time in O(1) memory
    (a file of a trillion tokens has billions of windows: no array of them is built): a four-round Feistel network
    over the smallest even power of two at least n, walking the cycle until it lands below n."""

    def __init__(self, n: int, seed: int, epoch: int):
        self.n = n
        bits = max(2, (n - 1).bit_length())
        bits += bits % 2
        self.half = bits // 2
        self.mask = (1 << self.half) - 1
        g = np.random.default_rng([seed, epoch, 0x5CA1EC])
        self.keys = [int(x) for x in g.integers(0, 1 << 32, size=4)]

    def _round(self, x: int, key: int) -> int:
        x = (x * 0x9E3779B1 + key) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x85EBCA77) & 0xFFFFFFFF
        x ^= x >> 13
        return x & self.mask

    def _permute(self, i: int) -> int:
        left, right = i >> self.half, i & self.mask
        for key in self.keys:
            left, right = right, left ^ self._round(right, key)
        return (left << self.half) | right

    def __getitem__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(i)
        x = self._permute(i)
        while x >= self.n:  # cycle-walking: the network permutes 2^bits values; follow i's cycle back into 0..n-1
            x = self._permute(x)
        return x


def micro_batch(source, step: int, global_batch: int, dp_rank: int, dp: int, index: int, micro_batches: int,
                held_out: bool = False):
    """Micro-batch `index` of this dp rank's share of step `step`'s global batch; `held_out`: of held-out batch
    `step` (evaluation's, `source.eval_samples`), split over the ranks and micro-batches the same way."""
    per_rank = global_batch // dp
    per_micro = per_rank // micro_batches
    lo = dp_rank * per_rank + index * per_micro
    return (source.eval_samples if held_out else source.samples)(step, global_batch, lo, lo + per_micro)


class Prefetcher:
    """This rank's micro-batches of each step, on the device, prepared one step ahead.

    `fetch(step)` gives the host tensors of a step ((tokens, targets) per micro-batch, from `micro_batch`: a
    function of (seed, step, sample) only, so prefetching changes no value). While step t runs, a worker thread
    builds step t + 1's (reading a token file included); on CUDA into pinned memory, copied with
    `non_blocking=True` so the copy queues behind the step's work instead of waiting for it. `get(step)` returns
    the step's device tensors and starts the next one's preparation."""

    def __init__(self, fetch, device: torch.device, stop: int):
        from concurrent.futures import ThreadPoolExecutor
        self.fetch, self.device, self.stop = fetch, device, stop
        self.pin = device.type == "cuda"
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scalec-data")
        self.pending = None  # (step, future) of the step being prepared

    def _host(self, step: int) -> list:
        batches = self.fetch(step)
        return [tuple(t.pin_memory() for t in pair) for pair in batches] if self.pin else batches

    def get(self, step: int) -> list:
        if self.pending is not None and self.pending[0] == step:
            batches = self.pending[1].result()
        else:  # the first step, or a step out of order: built now
            batches = self._host(step)
        self.pending = (step + 1, self.pool.submit(self._host, step + 1)) if step + 1 < self.stop else None
        return [tuple(t.to(self.device, non_blocking=self.pin) for t in pair) for pair in batches]

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
