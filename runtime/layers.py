"""Module containers and deterministic initialisation shared by every generated program."""
from __future__ import annotations

import contextlib
import math
import zlib

import torch
from torch import nn

from runtime import collectives, recompute


class Repeat(nn.ModuleDict):
    """`repeat N { ... }`: blocks applied in sequence, each with its own weights.

    Blocks keep their global index as their name (`blocks.7`), also when a pipeline stage holds only some of them
    (`Repeat(blocks, first=6)`), so that parameter names, and therefore checkpoints, do not depend on the layout.
    """

    recompute = "none"
    """Activation recomputation of each block (runtime.recompute): none, selective or full; set by the runtime."""
    compiled = False
    """Each block (with its recomputation) is one torch.compile region (runtime.compile); set by the runtime."""
    fp32_residual = False
    """The residual stream is cast to fp32 on entry (bf16 plans with `fp32_residual`, runtime.precision)."""
    offload = None
    """runtime.offload.ActivationOffload whose hooks each block runs under (`offload = activations`), or None."""

    def __init__(self, blocks, first: int = 0):
        super().__init__({str(first + i): b for i, b in enumerate(blocks)})

    @classmethod
    def part(cls, make, first_block: int, end_block: int, start: int, end: int) -> "Repeat":
        """What a pipeline stage holding blocks [first_block, end_block) of the model's `repeat`s, numbered across
        them all, holds of the repeat that is blocks [start, end) of them: its blocks in both ranges, named by their
        index within the repeat (`blocks_2.0`, whatever the stage), so that names do not depend on the layout. Empty
        when the stage holds none of them (its forward then passes the stream on)."""
        lo, hi = max(first_block, start), min(end_block, end)
        return cls((make() for _ in range(lo, hi)), first=max(lo - start, 0))

    def __getitem__(self, key):
        """By global index (int or str), as the parameter names have it."""
        return super().__getitem__(str(key))

    def forward(self, x_BSH: torch.Tensor) -> torch.Tensor:
        if self.fp32_residual:
            x_BSH = x_BSH.float()
        for block in self.values():
            with self.offload.around() if self.offload is not None else contextlib.nullcontext():
                x_BSH = recompute.run_block(block, x_BSH, self.recompute, self.compiled)
        return x_BSH


def _is_dtensor(p) -> bool:
    return hasattr(p, "device_mesh") and hasattr(p, "to_local")


class Bias(nn.Module):
    """A bias added to logits computed with a tied (embedding) weight."""

    def __init__(self, n: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bias


class ZeroCenteredRMSNorm(nn.RMSNorm):
    """RMSNorm scaled by (1 + weight), the weight starting at zero, computed in fp32 and cast back to the input's
    dtype (Gemma's RMSNorm: `rmsnorm(hidden, zero_centered = true)`). An nn.RMSNorm by type, so every rule for norms
    (replicated under tp, fp32 under bf16, gradients summed under sequence parallelism) holds for it; its weight is
    Hugging Face's `weight` as stored, and runtime.layers.init_parameters starts it at zero (a scale of one)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = torch.nn.functional.rms_norm(x.float(), self.normalized_shape, None, self.eps)
        return (normed * (1.0 + self.weight.float())).type_as(x)


def parameter_generator(seed: int, name: str) -> torch.Generator:
    """A generator seeded by the run's seed and the parameter's name, so that a parameter's initial value does not
    depend on the order of construction, the device, or how the model is split across ranks."""
    g = torch.Generator(device="cpu")
    g.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63 - 1))
    return g


@torch.no_grad()
def init_parameters(model: nn.Module, *, seed: int, std: float, residual_out: tuple[str, ...], layers: int,
                    shard_of=None, local_slice=None) -> None:
    """GPT-2 initialisation, reproducible by name.

    Linear and embedding weights: normal(0, std); the output projections that write into the residual stream
    (`residual_out`, module names without the block prefix) use std / sqrt(2 * layers); biases zero; norm scales one
    (a zero-centred norm's weight zero: its scale is 1 + weight).
    Each full tensor is drawn on the CPU from its own generator, then copied to the parameter's device. A parameter
    sharded over an axis (`shard_of(name)` gives (dim, full size, axis)) is drawn whole and sliced
    (`local_slice(value, dim, local size, axis)`), so every tp and ep degree starts from the same weights.
    A module with `init_per_expert` (runtime.moe.Experts) draws each expert's slice of dim 0 from its own generator
    (`name.index`), and only this rank's experts; its `residual_out` names the weights scaled like an output
    projection.
    """
    scaled = std / math.sqrt(2 * layers)
    for module_name, module in model.named_modules():
        leaf = module_name.rsplit(".", 1)[-1]
        for pname, p in module.named_parameters(recurse=False):
            name = f"{module_name}.{pname}" if module_name else pname
            shard = shard_of(name) if shard_of else None
            shape = list(p.shape)
            if shard is not None:
                shape[shard[0]] = shard[1]
            if isinstance(module, ZeroCenteredRMSNorm):  # (1 + weight): a scale of one
                value = torch.zeros(shape)
            elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
                value = torch.ones(shape) if pname == "weight" else torch.zeros(shape)
            elif pname == "bias":
                value = torch.zeros(shape)
            elif getattr(module, "init_per_expert", False):
                experts = torch.arange(shape[0])
                if shard is not None:  # this rank's experts only: a 1T model's tensors are never drawn whole
                    # re-placed experts (runtime.rebalance) start in the canonical placement: this rank's E/ep
                    # experts, then its replica slots (copies of its first ones: no row reaches them before an
                    # expert moves in)
                    own = min(p.shape[shard[0]], shard[1] // collectives.axis_size(shard[2]))
                    experts = local_slice(experts, shard[0], own, shard[2])
                    experts, shard = experts[torch.arange(p.shape[shard[0]]) % own], None
                sigma = scaled if pname in module.residual_out else std
                value = torch.stack([torch.empty(shape[1:]).normal_(
                    0.0, sigma, generator=parameter_generator(seed, f"{name}.{int(e)}")) for e in experts])
            else:
                sigma = scaled if leaf in residual_out else std
                value = torch.empty(shape).normal_(0.0, sigma, generator=parameter_generator(seed, name))
            if shard is not None:
                # p.shape is this tp rank's shape (for an FSDP DTensor, its global shape over dp).
                value = local_slice(value, shard[0], p.shape[shard[0]], shard[2])
            if _is_dtensor(p):  # sharded over dp by FSDP: keep this rank's piece (each rank drew the same tensor)
                from torch.distributed.tensor import distribute_tensor
                piece = distribute_tensor(value.to(p.device, p.dtype), p.device_mesh, p.placements,
                                          src_data_rank=None)
                p.to_local().copy_(piece.to_local())
            else:
                p.copy_(value.to(dtype=p.dtype))
