"""Weights in Hugging Face's layout (Llama, Mistral, Qwen 2, Qwen 3, Mixtral, Qwen2-MoE, Qwen3-MoE): names, and
reading each rank's slices.

`train { init = from("DIR or FILE.safetensors") }` starts a run from a released checkpoint: every parameter of this
rank's modules is read from the safetensors files (the `safetensors` library, memory-mapped) with only the part
this rank holds: its tensor-parallel slice of a sharded weight, its experts under expert parallelism, its rows of
an FSDP shard, its pipeline stages' parameters. No rank reads a whole tensor it does not hold.

Names: ours are the single-device model's (`blocks.7.attn_q.weight`), Hugging Face's are `model.layers.7.self_attn.
q_proj.weight`; `hf_name` (runtime/hf_names.py, torch-free: `scalec check` reads it too) maps one to the other.
Mixtral's experts are separate (ffn × hidden) matrices per expert (`block_sparse_moe.experts.j.w1|w2|w3`; Qwen-MoE's
`mlp.experts.j.gate_proj|down_proj|up_proj`, the layout read off the checkpoint's names); ours are stacked and transposed (experts × hidden × ffn for
`w_gate` = w1ᵀ and `w_up` = w3ᵀ, experts × ffn × hidden for `w_down` = w2ᵀ). Rotary embeddings need no permutation:
runtime/rotary.py turns vectors in Hugging Face's own layout (its conversion from Meta's checkpoints permuted the q
and k rows once, and its files hold the permuted rows).
"""
from __future__ import annotations

import glob
import json
import math
import os
from dataclasses import dataclass

import torch

from runtime.errors import FatalError
from runtime.hf_names import MIXTRAL, QWEN_MOE, hf_name, moe_layout  # noqa: F401 (layouts: for callers)

class Files:
    """The tensors of a checkpoint: a directory (with `model.safetensors.index.json`, or its *.safetensors files)
    or one .safetensors file; opened lazily, memory-mapped."""

    def __init__(self, path: str):
        if os.path.isdir(path):
            index = os.path.join(path, "model.safetensors.index.json")
            if os.path.exists(index):
                with open(index) as f:
                    where = json.load(f)["weight_map"]
                self.where = {k: os.path.join(path, v) for k, v in where.items()}
            else:
                self.where = {}
                for file in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
                    for k in self._open(file).keys():
                        self.where[k] = file
        elif os.path.isfile(path):
            self.where = {k: path for k in self._open(path).keys()}
        else:
            raise FatalError(f"scalec: init from {path}: no such file or directory")
        if not self.where:
            raise FatalError(f"scalec: init from {path}: no .safetensors tensors found")
        self.path = path
        self.bytes_read = 0      # what read() returned, in the checkpoint's dtypes: this rank's parts
        self.tensors_read: set = set()

    _handles: dict = {}

    _DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8,
                    "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}

    def total_bytes(self) -> int:
        """The bytes of every tensor of the checkpoint, from the files' headers (nothing is read)."""
        total = 0
        for name, file in self.where.items():
            sl = self._open(file).get_slice(name)
            dtype = sl.get_dtype()
            if dtype not in self._DTYPE_BYTES:  # a log figure, but not a guessed one
                raise FatalError(f"scalec: init from {self.path}: `{name}` has dtype {dtype}, which scalec does "
                                 "not read")
            total += math.prod(sl.get_shape()) * self._DTYPE_BYTES[dtype]
        return total

    def _open(self, file: str):
        from safetensors import safe_open
        if file not in self._handles:
            self._handles[file] = safe_open(file, framework="pt", device="cpu")
        return self._handles[file]

    def shape(self, name: str) -> tuple:
        return tuple(self._open(self._file(name)).get_slice(name).get_shape())

    def _file(self, name: str) -> str:
        if name not in self.where:
            raise FatalError(f"scalec: init from {self.path}: the checkpoint has no tensor `{name}`")
        return self.where[name]

    def read(self, name: str, ranges: dict | None = None) -> torch.Tensor:
        """Tensor `name`, only the index ranges {dim: (lo, hi)} given (the rest whole)."""
        sl = self._open(self._file(name)).get_slice(name)
        n = len(sl.get_shape())
        index = tuple(slice(*ranges[d]) if ranges and d in ranges else slice(None) for d in range(n))
        got = sl[index]
        self.bytes_read += got.numel() * got.element_size()
        self.tensors_read.add(name)
        return got


@dataclass(frozen=True)
class Loaded:
    """What `load` filled from a checkpoint on this rank, for the log line that says where the weights came from."""
    path: str
    names: tuple        # our parameters, every one of the module's
    tensors_read: int   # the checkpoint's tensors this rank read a part of (experts: one per expert)
    tensors: int        # the checkpoint's tensors
    bytes_read: int     # bytes this rank read, in the checkpoint's dtypes: its parts only (tp, ep, pp, FSDP)
    bytes: int          # bytes of the whole checkpoint

    def describe(self) -> str:
        gb = lambda n: f"{n / 1e9:.3g} GB" if n >= 1e8 else f"{n / 1e6:.3g} MB"  # noqa: E731
        return (f"weights from {self.path}: {len(self.names):,} parameters filled from {self.tensors_read:,} of "
                f"its {self.tensors:,} tensors; this rank read {gb(self.bytes_read)} of {gb(self.bytes)}")


def _local_range(p, shard, axis_rank) -> tuple[int, int]:
    """Rows [lo, hi) of the full tensor's sharded dim that this rank's parameter `p` holds over its tp/ep axis (an
    FSDP DTensor's shape is its tp-local shape over dp, so the same size)."""
    dim, _, axis = shard
    n = p.shape[dim]
    r = axis_rank(axis)
    return r * n, (r + 1) * n


def load(module: torch.nn.Module, path: str, shard_of=None, axis_rank=None) -> Loaded:
    """Copy every parameter of `module` from the checkpoint at `path`, this rank's part only (module docstring);
    returns what it loaded (`Loaded`: the names, the tensors and bytes this rank read). `shard_of(name)` gives
    (dim, full size, axis) of a parameter sharded over tp or ep (runtime.tensor_parallel.Shards.of), `axis_rank(axis)`
    this rank's index on it."""
    files = Files(path)
    layout = moe_layout(files.where)  # Mixtral's or Qwen-MoE's names of the experts (runtime/hf_names.py)
    axis_rank = axis_rank or (lambda axis: 0)
    loaded: list = []
    with torch.no_grad():
        for name, p in module.named_parameters():
            name = name.removeprefix("module.")
            shard = shard_of(name) if shard_of else None
            dtensor = hasattr(p, "device_mesh") and hasattr(p, "to_local")
            local = p.to_local() if dtensor else p
            # the rows of dim 0 an FSDP shard holds (over dp), within this rank's tp/ep part
            offset = 0
            if dtensor:
                from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
                _, global_offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
                offset = global_offset[0]
            value = _read_param(files, name, p, local, shard, axis_rank, offset, layout)
            local.copy_(value.to(local.dtype))
            loaded.append(name)
    return Loaded(path=path, names=tuple(loaded), tensors_read=len(files.tensors_read), tensors=len(files.where),
                  bytes_read=files.bytes_read, bytes=files.total_bytes())


def _read_param(files: Files, name: str, p, local, shard, axis_rank, offset: int, layout: str) -> torch.Tensor:
    rows = local.shape[0]
    if ".moe_experts." in name:  # stacked experts: this rank's experts (ep), each transposed
        lo = axis_rank(shard[2]) * p.shape[0] if shard is not None else 0
        experts = range(lo + offset, lo + offset + rows)
        return torch.stack([files.read(hf_name(name, e, layout)).t() for e in experts])
    hf = hf_name(name, layout=layout)
    full = files.shape(hf)
    ranges: dict = {}
    if shard is not None:
        ranges[shard[0]] = _local_range(p, shard, axis_rank)
    # FSDP's dp shard of dim 0, inside the tp part when tp shards dim 0 too
    base = ranges.get(0, (0, full[0]))[0]
    lo0, hi0 = base + offset, base + offset + rows
    ranges[0] = (lo0, hi0)
    # rows past the checkpoint's (a vocabulary padded for tp, pad_vocab) are zero
    real = (min(lo0, full[0]), min(hi0, full[0]))
    got = files.read(hf, {**ranges, 0: real}) if real[1] > real[0] else None
    if got is None or real[1] - real[0] < rows:
        pad = torch.zeros((rows,) + tuple(local.shape[1:]), dtype=got.dtype if got is not None else local.dtype)
        if got is not None:
            pad[:got.shape[0]] = got
        got = pad
    if tuple(got.shape) != tuple(local.shape):
        raise FatalError(f"scalec: init from {files.path}: `{hf}` gives {tuple(got.shape)} for {name}, whose part "
                         f"on this rank is {tuple(local.shape)}")
    return got
