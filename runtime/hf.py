"""Weights in Hugging Face's layout (Llama, Mistral, Qwen 2, Qwen 3, Phi-3, Mixtral, Qwen2-MoE, Qwen3-MoE): names,
and reading each rank's slices.

`train { init = from("DIR or FILE.safetensors") }` starts a run from a released checkpoint: every parameter of this
rank's modules is read from the safetensors files (the `safetensors` library, memory-mapped) with only the part
this rank holds: its tensor-parallel slice of a sharded weight, its experts under expert parallelism, its rows of
an FSDP shard, its pipeline stages' parameters. No rank reads a whole tensor it does not hold.

Names: ours are the single-device model's (`blocks.7.attn_q.weight`), Hugging Face's are `model.layers.7.self_attn.
q_proj.weight`; `hf_name` (runtime/hf_names.py, torch-free: `scalec check` reads it too) maps one to the other.
Mixtral's experts are separate (ffn × hidden) matrices per expert (`block_sparse_moe.experts.j.w1|w2|w3`; Qwen-MoE's
`mlp.experts.j.gate_proj|down_proj|up_proj`, the layout read off the checkpoint's names); ours are stacked and
transposed (experts × hidden × ffn for `w_gate` = w1ᵀ and `w_up` = w3ᵀ, experts × ffn × hidden for `w_down` = w2ᵀ).
Phi-3's fused `qkv_proj` and `gate_up_proj` each hold several of ours (`fused_rows`): a rank reads the rows of its
part only, its tp shard of q a row range inside q's rows of qkv_proj, its FSDP rows inside that. Rotary embeddings
need no permutation: runtime/rotary.py turns vectors in Hugging Face's own layout (its conversion from Meta's
checkpoints permuted the q and k rows once, and its files hold the permuted rows).
"""
from __future__ import annotations

import glob
import json
import math
import os
import re
from dataclasses import dataclass

import torch

from runtime.errors import FatalError
from runtime.hf_names import DEEPSEEK, MIXTRAL, PHI3, QWEN_MOE, fused_rows, hf_name, layout as layout_of  # noqa: F401

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


def load(module: torch.nn.Module, path: str, shard_of=None, axis_rank=None, stack=()) -> Loaded:
    """Copy every parameter of `module` from the checkpoint at `path`, this rank's part only (module docstring);
    returns what it loaded (`Loaded`: the names, the tensors and bytes this rank read). `shard_of(name)` gives
    (dim, full size, axis) of a parameter sharded over tp or ep (runtime.tensor_parallel.Shards.of), `axis_rank(axis)`
    this rank's index on it; `stack` how the checkpoint's layers lie in the repeats (runtime/hf_names.py; empty: one
    layer a block)."""
    files = Files(path)
    layout = layout_of(files.where)  # Phi-3's fused tensors, Mixtral's or Qwen-MoE's experts (runtime/hf_names.py)
    axis_rank = axis_rank or (lambda axis: 0)
    loaded: list = []
    params = {n.removeprefix("module."): p for n, p in module.named_parameters()}

    def rows(name: str) -> int:
        """The whole row count of our parameter `name` (a part of a fused tensor): tp's full size where tp shards
        its dim 0, else its shape (an FSDP DTensor's is its tp-local shape, whole over dp)."""
        shard = shard_of(name) if shard_of else None
        return shard[1] if shard is not None and shard[0] == 0 else params[name].shape[0]

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
            part = fused_rows(name, rows, layout)
            value = _read_param(files, name, p, local, shard, axis_rank, offset, layout, part, stack)
            local.copy_(value.to(local.dtype))
            loaded.append(name)
        # DeepSeek-V3's expert bias (runtime.moe.ExpertBias): model state kept as a buffer, whole on every rank
        for name, b in module.named_buffers():
            name = name.removeprefix("module.")
            if name.endswith(".moe_bias.bias") or re.search(r"\.moe_\d+_bias\.bias$", name):
                b.copy_(files.read(hf_name(name, layout=layout, stack=stack)).to(b.dtype))
    return Loaded(path=path, names=tuple(loaded), tensors_read=len(files.tensors_read), tensors=len(files.where),
                  bytes_read=files.bytes_read, bytes=files.total_bytes())


def _read_param(files: Files, name: str, p, local, shard, axis_rank, offset: int, layout: str,
                part: tuple[int, int, int] | None = None, stack=()) -> torch.Tensor:
    """This rank's part of our parameter `name`: its tp/ep slice, its FSDP rows (from `offset`) inside that, within
    rows [lo, hi) of a fused tensor where `part` is (lo, hi, total) (runtime/hf_names.py fused_rows)."""
    rows = local.shape[0]
    if ".moe_experts." in name:  # stacked experts: this rank's experts (ep), each transposed
        lo = axis_rank(shard[2]) * p.shape[0] if shard is not None else 0
        experts = range(lo + offset, lo + offset + rows)
        return torch.stack([files.read(hf_name(name, e, layout, stack)).t() for e in experts])
    hf = hf_name(name, layout=layout, stack=stack)
    full = files.shape(hf)
    start, end = 0, full[0]  # the rows of dim 0 that are `name`'s: all, or its part of a fused tensor
    if part is not None:
        if part[2] != full[0]:
            raise FatalError(f"scalec: init from {files.path}: `{hf}` has {full[0]} rows, not the {part[2]} of the "
                             f"parts the model fuses in it (rows {part[0]}..{part[1]} for {name})")
        start, end = part[0], part[1]
    ranges: dict = {}
    if shard is not None:
        ranges[shard[0]] = _local_range(p, shard, axis_rank)
    # FSDP's dp shard of dim 0, inside the tp part when tp shards dim 0 too
    base = start + ranges.get(0, (0, end - start))[0]
    lo0, hi0 = base + offset, base + offset + rows
    ranges[0] = (lo0, hi0)
    # rows past the checkpoint's (a vocabulary padded for tp, pad_vocab) are zero
    real = (min(lo0, end), min(hi0, end))
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
