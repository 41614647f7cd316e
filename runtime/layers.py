"""Module containers and deterministic initialisation shared by every generated program."""
from __future__ import annotations

import math
import zlib

import torch
from torch import nn


class Repeat(nn.ModuleList):
    """`repeat N { ... }`: blocks applied in sequence, each with its own weights.

    Blocks keep their global index as their name (`blocks.7`), also when a stage holds only some of them, so that
    parameter names, and therefore checkpoints, do not depend on the parallel layout.
    """

    def forward(self, x_BSH: torch.Tensor) -> torch.Tensor:
        for block in self:
            x_BSH = block(x_BSH)
        return x_BSH


class Bias(nn.Module):
    """A bias added to logits computed with a tied (embedding) weight."""

    def __init__(self, n: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bias


def parameter_generator(seed: int, name: str) -> torch.Generator:
    """A generator seeded by the run's seed and the parameter's name, so that a parameter's initial value does not
    depend on the order of construction, the device, or how the model is split across ranks."""
    g = torch.Generator(device="cpu")
    g.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63 - 1))
    return g


@torch.no_grad()
def init_parameters(model: nn.Module, *, seed: int, std: float, residual_out: tuple[str, ...], layers: int) -> None:
    """GPT-2 initialisation, reproducible by name.

    Linear and embedding weights: normal(0, std); the output projections that write into the residual stream
    (`residual_out`, module names without the block prefix) use std / sqrt(2 * layers); biases zero; norm scales one.
    Each full tensor is drawn on the CPU from its own generator, then copied to the parameter's device.
    """
    scaled = std / math.sqrt(2 * layers)
    for module_name, module in model.named_modules():
        leaf = module_name.rsplit(".", 1)[-1]
        for pname, p in module.named_parameters(recurse=False):
            full = f"{module_name}.{pname}" if module_name else pname
            if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
                value = torch.ones(p.shape) if pname == "weight" else torch.zeros(p.shape)
            elif pname == "bias":
                value = torch.zeros(p.shape)
            else:
                sigma = scaled if leaf in residual_out else std
                value = torch.empty(p.shape).normal_(0.0, sigma, generator=parameter_generator(seed, full))
            p.copy_(value.to(dtype=p.dtype))
