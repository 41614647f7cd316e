"""FP8 training (`precision = fp8(recipe, filter)`): bf16 training (runtime.precision) whose blocks' linears chosen
by the shape rule (runtime.choices.fp8_chosen) compute their three matmuls (output, input gradient, weight
gradient) in FP8, by torchao's float8 training (torchao 0.18: `convert_to_float8_training`, each chosen nn.Linear
becoming a Float8Linear that casts its operands to float8_e4m3fn with dynamic scales and calls torch._scaled_mm;
torch 2.13 runs it on CPU too).

- **Which linears.** Those inside the `repeat` blocks (runtime.layers.Repeat) whose local shape the rule takes;
  the embedding, the head and MoE experts stay bf16. Under tp, a row-parallel linear's module is not called (the
  program splits its matmul from its bias around the all-reduce: `F.linear(x, self.attn_o.weight)`), so it stays
  bf16 and is not converted (`Parallel.tp_shards` says which: sharded along its input dim, 1); the
  column-parallel ones are each rank's own linear, with scales of the rank's shard.
- **FSDP.** Under FSDP2 (zero2, fsdp) with dp > 1 and the tensorwise recipe, the chosen linears' weights are
  all-gathered in FP8 (`enable_fsdp_float8_all_gather`: each rank casts its fp32 shard with the scale of the
  whole weight, one amax all-reduce, and gathers 1 byte per element instead of bf16's 2); rowwise gathers bf16
  (torchao casts rows after the gather). gloo has no float8 dtypes: there the gather moves the same bytes viewed
  as uint8 (`ByteAllGather`).
- **Absent torchao.** `scalec check` refuses fp8 where torchao does not import (E0390); a program run elsewhere
  ends with a FatalError that says so (`_float8`).
"""
from __future__ import annotations

import logging

import torch
import torch.distributed as dist
from torch import nn

from runtime import choices, collectives
from runtime.errors import FatalError

# torchao logs a warning for each optional kernel library it cannot load (its MX and CUTLASS builds, CUDA-only) and
# torch's pytree one for an enum torchao registers: noise on every rank of every CPU run, and the e2e tests fail
# on printed warnings. Errors still print.
_QUIET = ("torchao", "torch.utils._pytree")


def _float8():
    """torchao.float8, imported quietly; a FatalError naming the fix where it is not installed."""
    levels = {name: logging.getLogger(name).level for name in _QUIET}
    for name in _QUIET:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        import torchao.float8 as float8
    except ImportError as e:
        raise FatalError(f"scalec: `precision = fp8(...)` trains with torchao's float8 training, which does not "
                         f"import here ({e}); install it: pip install 'scalec[fp8]' (torchao>=0.18)") from None
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
    return float8


def chosen(module: nn.Module, recipe: str, filter: str, row_parallel=lambda fqn: False) -> list[str]:
    """The names (in `module`) of the linears `precision = fp8(recipe, filter)` computes in FP8: inside a
    runtime.layers.Repeat, not row-parallel (`row_parallel(name of its weight)`), of a local shape the rule
    takes."""
    from runtime.layers import Repeat
    names = []
    for prefix, repeat in module.named_modules():
        if not isinstance(repeat, Repeat):
            continue
        for name, m in repeat.named_modules():
            fqn = f"{prefix}.{name}" if prefix else name
            if (type(m) is nn.Linear and not row_parallel(f"{fqn}.weight")
                    and choices.fp8_chosen(recipe, filter, m.out_features, m.in_features)):
                names.append(fqn)
    return names


def convert(module: nn.Module, recipe: str, filter: str, fsdp_all_gather: bool,
            row_parallel=lambda fqn: False) -> list[str]:
    """Turn the linears of `module` that `chosen` names into torchao Float8Linears of `recipe` (in place, on any
    device, the meta device included: parameters keep their names and objects); `fsdp_all_gather`: their weights
    are gathered in FP8 under FSDP2 (tensorwise only). Returns the names converted."""
    names = set(chosen(module, recipe, filter, row_parallel))
    if not names:
        return []
    float8 = _float8()
    config = float8.Float8LinearConfig.from_recipe_name(recipe)
    if fsdp_all_gather:
        if recipe != "tensorwise":
            raise ValueError("FP8 all-gather under FSDP2 takes the tensorwise recipe only")
        from dataclasses import replace
        config = replace(config, enable_fsdp_float8_all_gather=True)
    float8.convert_to_float8_training(module, config=config, module_filter_fn=lambda m, fqn: fqn in names)
    return sorted(names)


def summary(recipe: str, filter: str, names: list, gathered: bool) -> str:
    """The log's line: how many linears compute in FP8 (a few named), and how FSDP gathers them."""
    shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
    return (f"scalec: fp8 ({recipe}, filter = {filter}): {len(names)} linear(s) compute in FP8"
            + (f" ({shown})" if names else ": every matmul stays bf16")
            + ("; FSDP gathers their weights in FP8" if gathered else ""))


def gathers_fp8(recipe: str, fsdp: bool) -> bool:
    """Whether the chosen linears' weights are all-gathered in FP8: under FSDP2 (dp > 1), with tensorwise scales."""
    return fsdp and recipe == "tensorwise"


class ByteAllGather:
    """FSDP2's all-gather (torch.distributed.fsdp's AllGather) for gloo, which has no float8 dtypes: a 1-byte
    buffer is gathered viewed as uint8 (the same bytes; other dtypes as they are). Built by `byte_all_gather`.
    Under --count-bytes each gather's bytes are counted as `all_gather` over `axis` (runtime.collectives), which
    the ledger's FSDP gathers (FP8 and bf16 parts) are held against (tests/e2e/test_fp8.py)."""

    axis = "dp"

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group, async_op: bool = False):
        collectives.count_moved("all_gather", self.axis, input_tensor, dist.get_world_size(group))
        if input_tensor.dtype.itemsize == 1 and input_tensor.dtype not in (torch.uint8, torch.int8, torch.bool):
            output_tensor, input_tensor = output_tensor.view(torch.uint8), input_tensor.view(torch.uint8)
        return dist.all_gather_single(output_tensor, input_tensor, group=group, async_op=async_op)


def byte_all_gather(axis: str):
    """A ByteAllGather over `axis` (its name in the ledger) that is an instance of FSDP2's AllGather interface
    (torch >= 2.8)."""
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather

    class _Gather(ByteAllGather, AllGather):
        pass
    gather = _Gather()
    gather.axis = axis
    return gather


def on_gloo(units: list, axis: str) -> None:
    """Give each FSDP2 unit of `units` (gathered over `axis`, its ledger name) the ByteAllGather where the job's
    backend is gloo (FP8 all-gather on CPU)."""
    if dist.get_backend() != "gloo":
        return
    gather = byte_all_gather(axis)
    for unit in units:
        unit.set_custom_all_gather(gather)
