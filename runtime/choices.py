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

EP_NODE_GROUPS = ("ep_rail", "ep_node")
"""The two halves of an ep group that spans nodes, where experts are dispatched by node (`plan { ep_dispatch =
"nodes" }`, runtime/moe_nodes.py): the ep ranks of one local index, one per node (the rail), and the ep ranks of one
node."""

GROUPS = ("batch", "dense", "experts") + EP_NODE_GROUPS
"""The process groups beside each axis's a program builds (runtime/config.py's Parallel.groups, runtime.mesh.Context's
batch_group, dense_mesh and expert_mesh, runtime.collectives' ep_rail and ep_node; compiler/layout/groups.py lists
them)."""

EP_DISPATCH = ("nodes", "direct")
"""How a grouped MoE's tokens reach experts on other nodes (`plan { ep_dispatch = ... }`): `nodes` (each token
crosses to a node once, then fans out inside it: runtime/moe_nodes.py) or `direct` (each choice to its expert's rank:
runtime.moe's grouped all-to-alls)."""

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

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble", "dualpipev")
"""Pipeline schedules (runtime/schedule.py builds each one's action lists)."""

SPLIT_BACKWARD = ("zero-bubble", "dualpipev")
"""The schedules that split backwards into their input and weight halves (I, then W: zero-bubble's every one,
dualpipev's some), each half a pass over the stage's graph: no compiled regions (one autograd node each) and no
selective recomputation under them (compiler/rules/pipeline_split.py, E0610, E0611)."""

V_SHAPED = ("dualpipev",)
"""The schedules whose stages fold in a V over the pp ranks (runtime.schedule.Layout's style "v"), two per rank:
rank r holds stages r and 2·pp-1-r. The others loop: stage s on rank s mod pp."""

PAIRED = ("dualpipev",)
"""The schedules whose lists overlap a forward with a backward (runtime/schedule.py's OVERLAP_F_B pairs, which
runtime/overlap.py runs on two CUDA streams and the compiler's timing prices with `pair_seconds`)."""

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

FP8_RECIPES = ("tensorwise", "rowwise")
"""`precision = fp8(recipe = ...)`: torchao's float8 training recipes (torchao.float8.Float8LinearRecipeName):
one scale per tensor (its amax, dynamic), or one per row of each matmul operand (finer, slower kernels)."""

FP8_FILTERS = ("auto", "all")
"""`precision = fp8(filter = ...)`: which of the blocks' linears compute in FP8: `auto`, those the shape rule
(`fp8_pays`) says gain; `all`, every one whose dims FP8 kernels take (multiples of 16; small models, tests)."""


def fp8_takes(out_features: int, in_features: int) -> bool:
    """Whether an FP8 matmul can run a linear of this (local) shape at all: torch._scaled_mm's kernels need both
    dims multiples of 16 (torchao's float8_linear_utils._auto_filter_for_tensorwise, "hardware requirement")."""
    return out_features % 16 == 0 and in_features % 16 == 0


def fp8_pays(recipe: str, out_features: int, in_features: int) -> bool:
    """The shape rule of `filter = auto`: whether a linear of this local shape (N = out_features, K =
    in_features; under tp the shard's) is faster in FP8 than in bf16, casts included. The thresholds are
    torchao 0.18's, from its H100 microbenchmarks of a linear's forward and backward (torchao/float8/README.md,
    "Performance"; float8_linear_utils._auto_filter_for_tensorwise / _for_rowwise): tensorwise loses where
    K <= 4096 and N <= 1024; rowwise, whose casts cost more, where N <= 2048, K <= 1024, or N <= 4096 and
    K <= 2048. Small matmuls lose because the casts read and write the operands once more while the matmul's
    time shrinks with its FLOPs (torchtitan#1207: FP8 made small models slower)."""
    if not fp8_takes(out_features, in_features):
        return False
    n, k = out_features, in_features
    if recipe == "tensorwise":
        return not (k <= 4096 and n <= 1024)
    if recipe == "rowwise":
        return not (n <= 2048 or k <= 1024 or (n <= 4096 and k <= 2048))
    raise ValueError(f"FP8 recipe must be one of {', '.join(FP8_RECIPES)}, not {recipe!r}")


def fp8_chosen(recipe: str, filter: str, out_features: int, in_features: int) -> bool:
    """Whether `precision = fp8(recipe, filter)` computes a block's linear of this local shape in FP8: the one
    rule the runtime converts by (runtime.fp8) and the compiler's models price (compiler/cost/fp8.py)."""
    if filter == "all":
        return fp8_takes(out_features, in_features)
    if filter == "auto":
        return fp8_pays(recipe, out_features, in_features)
    raise ValueError(f"FP8 filter must be one of {', '.join(FP8_FILTERS)}, not {filter!r}")
