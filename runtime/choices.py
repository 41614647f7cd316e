"""The closed sets of names the compiler and the runtime share: mesh axes, the folded process groups, data
parallelism, pipeline schedules and recomputation modes. One definition, read by the language's checker
(compiler/check.py: the choices a setting takes), the Plan, the search's space, and the runtime (runtime/config.py
validates a program's Config against it, runtime.schedule and runtime.recompute their arguments).

Plain tuples of strings, in the order the language lists them, and nothing imported: `scalec check` reads this
module without torch, and the runtime without the compiler.
"""
from __future__ import annotations

AXES = ("dp", "pp", "tp", "ep", "cp")
"""Mesh axes, in the order plans list them (`cp`, context parallelism, last: added after the others)."""

GROUPS = ("batch", "dense", "experts")
"""The process groups over several axes a program builds beside each axis's (runtime/config.py's Parallel.groups,
runtime.mesh.Context's batch_group, dense_mesh and expert_mesh; compiler/layout/groups.py lists them)."""

DATA_PARALLEL = ("ddp", "zero1", "zero2", "fsdp")
"""How dp holds model state: replicated, then ZeRO's stages 1-3 (runtime/config.py's Parallel.data_parallel)."""

SHARDED = ("zero1", "zero2", "fsdp")
"""The data-parallel modes that shard model state over dp (at least the optimizer's)."""

ZERO_STAGE = {"ddp": 0, "zero1": 1, "zero2": 2, "fsdp": 3}
"""What each data-parallel mode means, as ZeRO's stage (Rajbhandari et al. 2020): 1 shards the optimizer's state,
2 the gradients too (FSDP2 with the weights kept gathered from a unit's forward to its backward), 3 the weights too
(FSDP2, freed after each forward). The one table every property below reads: no other module tests the names."""


def zero_stage(data_parallel: str, dp: int) -> int:
    """The ZeRO stage in effect: the mode's, over dp > 1; 0 over one dp rank (nothing to shard, every mode is ddp)."""
    return ZERO_STAGE[data_parallel] if dp > 1 else 0


class DataParallelMode:
    """What a data-parallel mode means, as properties of its ZeRO stage in effect (`zero_stage`): the compiler's
    Plan and the runtime's Parallel mix this in, each giving `data_parallel` and its dp size (`_zero_dp`)."""

    __slots__ = ()

    @property
    def zero_stage(self) -> int:
        return zero_stage(self.data_parallel, self._zero_dp)

    @property
    def shards_optimizer(self) -> bool:
        """AdamW's moments (and bf16's fp32 masters) sharded over dp: zero1, zero2, fsdp."""
        return self.zero_stage >= 1

    @property
    def shards_grads(self) -> bool:
        """Gradients reduce-scattered and sharded over dp, by FSDP2 (`fully_shard`): zero2, fsdp."""
        return self.zero_stage >= 2

    @property
    def shards_params(self) -> bool:
        """Weights sharded over dp and gathered for each unit's forward and again for its backward: fsdp (ZeRO-3)."""
        return self.zero_stage >= 3

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble")
"""Pipeline schedules (runtime/schedule.py builds each one's action lists)."""

RECOMPUTE = ("none", "selective", "full")
"""Activation recomputation of each block (runtime/recompute.py)."""

CONTEXT_PARALLEL = ("all_gather", "ring", "all_to_all")
"""How attention runs over a sequence sharded over `cp` (runtime/context_parallel.py): `all_gather` (the keys and
values gathered once per layer), `ring` (passed around the group), `all_to_all` (Ulysses: heads scattered, the heads
and key/value heads dividing by cp: compiler/rules/context_parallel.py)."""

STRAGGLER_THRESHOLD = 0.8
"""A rank whose straggler score falls below this is named (runtime.config.Resilience, the language's default). Not
NVRx's 0.7: a rank 30% slower scores 1/1.3 = 0.77, which 0.7 never names; at 0.8 the onset drill
(bench/straggler_drill.py) names it, and clean ranks score above 0.8 in most windows."""

STRAGGLER_WINDOW = 10
"""Steps between the ranks' gathers and scores on rank 0: a slowdown from a window's first step is named at its end,
10 steps later."""

OFFLOAD = ("none", "optimizer", "params", "activations")
"""What leaves the device for the host (`plan { offload }`; runtime/offload.py): nothing, the optimizer's state (a
fraction of it), the parameters (FSDP2's CPUOffloadPolicy) or the saved activations of the blocks."""

OFFLOAD_MODULES = ("attention", "mlp")
"""The block modules whose saved activations `offload = activations(modules = ...)` can send to the host, by the
prefix of their leaves' names in a generated program (runtime/offload.py `KIND_PREFIX`)."""
