"""The closed sets of names the compiler and the runtime share: mesh axes, data parallelism, pipeline schedules and
recomputation modes. One definition, read by the language's checker (compiler/check.py: the choices a setting
takes), the Plan, the search's space, and the runtime (runtime/config.py validates a program's Config against it,
runtime.schedule and runtime.recompute their arguments).

Plain tuples of strings, in the order the language lists them, and nothing imported: `scalec check` reads this
module without torch, and the runtime without the compiler.
"""
from __future__ import annotations

AXES = ("dp", "pp", "tp", "ep", "cp")
"""Mesh axes, in the order plans list them (`cp`, context parallelism, last: added after the others)."""

DATA_PARALLEL = ("ddp", "zero1", "zero2", "fsdp")
"""How dp holds model state: replicated, then ZeRO's stages 1-3 (runtime/config.py's Parallel.data_parallel)."""

SHARDED = ("zero1", "zero2", "fsdp")
"""The data-parallel modes that shard model state over dp (at least the optimizer's)."""

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble")
"""Pipeline schedules (runtime/schedule.py builds each one's action lists)."""

RECOMPUTE = ("none", "selective", "full")
"""Activation recomputation of each block (runtime/recompute.py)."""

CONTEXT_PARALLEL = ("all_gather", "ring", "all_to_all")
"""How attention runs over a sequence sharded over `cp` (runtime/context_parallel.py): `all_gather` (the keys and
values gathered once per layer), `ring` (passed around the group), `all_to_all` (Ulysses: heads scattered, the heads
and key/value heads dividing by cp: compiler/rules/context_parallel.py)."""
