"""The end-to-end table: each case is a sample (possibly edited), run under torchrun and compared with the
single-device run of the same model and global batch."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Case:
    id: str
    sample: str
    """Path of the .scale file, relative to the repository root."""
    nproc: int
    """Processes the case starts (checked against the compiled mesh)."""
    description: str
    edits: tuple = ()
    """(old, new) text replacements applied to the sample."""
    steps: int = 5
    timeout: int = 240


CASES = (
    Case(id="dp2_ddp", sample="samples/gpt_dp.scale", nproc=2,
         description="data parallel over 2 ranks with DDP: the README's main job"),
    Case(id="dp2_fsdp", sample="samples/gpt_dp.scale", nproc=2,
         edits=(("data_parallel = ddp", "data_parallel = fsdp"),),
         description="ZeRO-3 sharding of weights, gradients and optimizer state with FSDP2"),
    Case(id="dp2_ddp_accumulate2", sample="samples/gpt_dp.scale", nproc=2,
         edits=(("micro_batches = 1", "micro_batches = 2"),),
         description="two gradient-accumulation micro-batches per rank (DDP no_sync on the first)"),
    Case(id="two_nodes_ddp", sample="samples/gpt_dp.scale", nproc=2,
         edits=(("nodes = 1", "nodes = 2"), ("devices_per_node = 2", "devices_per_node = 1")),
         description="two torchrun agents on loopback with c10d rendezvous: the multi-node launch form"),
)
