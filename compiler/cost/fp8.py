"""What `precision = fp8(recipe, filter)` changes in the models: which linears compute in FP8, how much faster
their matmuls run and what their casts cost (step time), and the bytes FSDP2 gathers for them (ledger, memory).

The linears are the runtime's (runtime/fp8.py): each block's `call_module` nn.Linear (under tp the
column-parallel ones: a row-parallel linear's matmul is split from its bias around the all-reduce, `F.linear`)
whose local shape the one rule takes (runtime.choices.fp8_chosen: torchao's thresholds under `filter = auto`).

Per chosen linear and micro-batch, M tokens (rows of its input), K = in_features, N = out_features:
- **matmuls.** Forward (output), backward (input gradient, weight gradient): 3 × 2MNK FLOPs that run at the
  device's FP8 rate instead of its bf16 one: `FP8_SPEEDUP` × faster where the device has FP8 tensor cores, none
  elsewhere (cpu: no FP8 rate, `FP8_SPEEDUP`).
- **casts.** torchao casts both operands of each matmul with a dynamic scale (tensorwise: one amax reduction, then
  the scaled cast; rowwise: the same per row): forward the input (M·K) and the weight (N·K); backward the output's
  gradient twice (M·N, once per operand layout) and the weight and the input again, transposed (N·K, M·K): 2·(MK +
  NK + MN) elements, each read twice (the amax, then the cast) in bf16 and written once in FP8: `CAST_BYTES` = 5
  bytes per element at the memory bandwidth, as every memory-bound op here (compiler/cost/op_times.py), and no
  faster than the device's op overhead for each of its ops (`CAST_OPS` eager, one kernel compiled).
- **FSDP.** With the tensorwise recipe under FSDP2 (dp > 1) the chosen weights are gathered in FP8: 1 byte per
  element instead of bf16's 2, and one fp32 amax all-reduce per chosen weight per gather (torchao's
  WeightWithDynamicFloat8CastTensor reduces the shard's amax over the mesh before casting).
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy
from torch import nn

from compiler import graph_meta as T
from runtime import choices

FP8_SPEEDUP = {"h100": 2.0, "h800": 2.0, "h200": 2.0, "b200": 2.0, "gb200": 2.0}
"""FP8 dense matmul peak over bf16's, by device kind (datasheets: H100/H800/H200 SXM 1,979 vs 989 TFLOP/s dense;
B200 4.5 vs 2.25 PFLOP/s dense, GB200 5 vs 2.5 PFLOP/s dense: NVIDIA's spec sheets, sparsity figures halved).
A100 (Ampere, no FP8 tensor cores: torch._scaled_mm needs compute capability 8.9) is refused at check (E0392);
cpu has no FP8 rate: FP8 there is casts only (measured here: the e2e's tiny model took about 5 s for 200 steps
under fp8 against about 1 s in bf16, tests/e2e/test_fp8.py)."""

CAST_BYTES = 5
"""Bytes moved per element cast to FP8: the amax's bf16 read (2), the cast's bf16 read (2) and FP8 write (1)."""

CAST_OPS = 6
"""Eager ops of one dynamic cast, about six (torch's profiler on a Float8Linear here: the absolute value, its max,
the scale, the multiply, the clamp to the format's range, the conversion); compiled, inductor fuses them into one
kernel (torchao's README states its speedups with torch.compile on)."""

FP8_BYTES = 1
"""float8_e4m3fn's bytes per element: what an FP8 all-gather moves per weight element."""


@dataclass(frozen=True)
class Linear:
    """One chosen linear of a block graph: its module name, local out (N) and in (K) features, and M: the rows of
    its input per micro-batch (a sympy expression of the spec's sizes and µb)."""

    name: str
    n: int
    k: int
    m: sympy.Expr


def chosen(gm, fp8) -> tuple[Linear, ...]:
    """The linears of block graph `gm` that `fp8` (spec.FP8, or None) computes in FP8, in graph order."""
    if fp8 is None:
        return ()
    out = []
    for node in gm.graph.nodes:
        if node.op != "call_module":
            continue
        mod = gm.get_submodule(node.target)
        if type(mod) is not nn.Linear:
            continue
        n, k = int(mod.out_features), int(mod.in_features)
        if not choices.fp8_chosen(fp8.recipe, fp8.filter, n, k):
            continue
        shape = node.meta.get(T.SHAPE)
        m = sympy.Mul(*shape[:-1]) if isinstance(shape, tuple) else sympy.Integer(0)
        out.append(Linear(str(node.target), n, k, m))
    return tuple(out)


def linears(traced, fp8) -> dict[str, tuple[Linear, ...]]:
    """Per repeat name: its block's chosen linears (one block; every block of a repeat alike)."""
    return {name: chosen(gm, fp8) for name, gm in traced.blocks.items()}


def weight_elements(traced, fp8) -> dict[str, int]:
    """Per repeat name: the elements of one block's chosen weights (as one rank holds them, tp-sharded)."""
    return {name: sum(x.n * x.k for x in xs) for name, xs in linears(traced, fp8).items()}


def gathers_fp8(fp8, plan) -> bool:
    """Whether FSDP2 gathers the chosen weights in FP8 (runtime.fp8.gathers_fp8): tensorwise, FSDP2, dp > 1."""
    return fp8 is not None and fp8.recipe == "tensorwise" and plan.shards_grads and plan.batch_ranks > 1


def gathered_saving(cm, plan) -> int:
    """Bytes one gathered block holds less when its chosen weights are gathered in FP8 (1 byte instead of bf16's
    2): the fewest of any repeat's block, so that the gathered units' peak is never under-counted."""
    if not gathers_fp8(cm.spec.train.fp8, plan):
        return 0
    per = weight_elements(cm.traced, cm.spec.train.fp8)
    return min(per.values(), default=0) * (2 - FP8_BYTES)


def _pass_seconds(xs, m_values, device, compiled: bool) -> tuple:
    """((forward saved, forward casts), (backward saved, backward casts)) in seconds, one micro-batch of one block:
    each chosen linear's matmuls (one forward, two backward) `FP8_SPEEDUP` × faster, and its casts (two forward:
    input, weight; four backward: the output's gradient in two layouts, the weight, the input), each at least the
    device's op overhead per op it takes (`CAST_OPS`)."""
    speedup = FP8_SPEEDUP.get(device.kind, 1.0)
    rate = device.peak_tflops * 1e12 * device.matmul_efficiency
    hbm = device.hbm_gbps * 1e9
    least = device.op_overhead_us * 1e-6 * (1 if compiled else CAST_OPS)

    def cast(elements):
        return max(elements * CAST_BYTES / hbm, least)
    fs = fc = bs = bc = 0.0
    for x, m in zip(xs, m_values):
        saved = 2 * m * x.n * x.k / rate * (1 - 1 / speedup)  # one matmul's
        fs += saved
        fc += cast(m * x.k) + cast(x.n * x.k)
        bs += 2 * saved
        bc += 2 * cast(m * x.n) + cast(x.n * x.k) + cast(m * x.k)
    return (fs, fc), (bs, bc)


def parts_seconds(xs, m_values, device, compiled: bool = True) -> tuple[float, float]:
    """(seconds the chosen linears' matmuls save, seconds their casts cost) in one micro-batch's forward and
    backward of one block."""
    (fs, fc), (bs, bc) = _pass_seconds(xs, m_values, device, compiled)
    return fs + bs, fc + bc


def block_seconds(xs, m_values, device, compiled: bool = True) -> tuple[float, float]:
    """(forward, backward) seconds FP8 adds to one micro-batch of one block, negative where it saves: `xs` its
    chosen linears, `m_values` their M at the plan's sizes, `device` a spec.Device (a kind in FP8_SPEEDUP or not),
    `compiled`: torch.compile fuses each cast's ops into one kernel."""
    (fs, fc), (bs, bc) = _pass_seconds(xs, m_values, device, compiled)
    return fc - fs, bc - bs


def per_block(compiled) -> dict:
    """Per repeat name: (seconds its chosen linears' matmuls save, seconds their casts cost) for one micro-batch of
    one block at the plan's sizes (`parts_seconds`)."""
    from compiler.cost.formulas import Formula, env_of
    cm, env, dev = compiled.model, env_of(compiled.plan), compiled.spec.cluster.device
    return {name: parts_seconds(xs, [float(Formula(x.m, cm.formulas.sub)(env)) for x in xs], dev,
                                compiled.plan.compiles)
            for name, xs in linears(compiled.traced, compiled.spec.train.fp8).items()}


def chosen_count(traced, counts: dict, fp8) -> tuple[int, int]:
    """(linears `fp8` chooses, every linear of the blocks) over the whole model: `counts` is each repeat's block
    count. Every linear counts, the row-parallel ones under tp too (their matmuls run as F.linear, in bf16)."""
    total = sum(counts[name] * sum(1 for m in gm.modules() if type(m) is nn.Linear)
                for name, gm in traced.blocks.items())
    return sum(counts[name] * len(xs) for name, xs in linears(traced, fp8).items()), total


def describe(compiled) -> list[str]:
    """`plan`'s lines on fp8: the linears chosen of the blocks', and what they save and cost per block."""
    fp8 = compiled.spec.train.fp8
    if fp8 is None:
        return []
    traced, cm, dev = compiled.traced, compiled.model, compiled.spec.cluster.device
    chosen_n, total = chosen_count(traced, {name: c.n for name, c in cm.formulas.counts.items()}, fp8)
    per = linears(traced, fp8)
    name = max(per, key=lambda k: len(per[k]))
    saved, casts = per_block(compiled)[name]
    rate = (f"{FP8_SPEEDUP[dev.kind]:g}× bf16's matmul rate on {dev.kind}" if dev.kind in FP8_SPEEDUP else
            f"no FP8 rate on {dev.kind}: the casts alone")
    gathered = "; FSDP gathers their weights in FP8" if gathers_fp8(fp8, compiled.plan) else ""
    return [f"fp8         {fp8.recipe}, filter = {fp8.filter}: {chosen_n} of the blocks' {total} linears in FP8 "
            f"({rate}){gathered}",
            f"            a block's micro-batch: matmuls {saved * 1e3:.3g} ms faster, casts {casts * 1e3:.3g} ms "
            "(compiler/cost/fp8.py)"]


def cast_bytes(cm, env: tuple) -> float:
    """The FP8 copies one chosen linear's backward holds at once, the largest of any block's: the output's gradient
    in both layouts (2·M·N), the weight (N·K) and the input (M·K), 1 byte each (the scales: one fp32 per tensor or
    per row, not counted). The memory model adds it to the backward's working set (compiler/cost/rank_memory.py)."""
    from compiler.cost.formulas import Formula
    fp8 = cm.spec.train.fp8
    if fp8 is None:
        return 0
    sizes = [(float(Formula(x.m, cm.formulas.sub)(env)), x) for xs in linears(cm.traced, fp8).values() for x in xs]
    return max((FP8_BYTES * (2 * m * x.n + x.n * x.k + m * x.k) for m, x in sizes), default=0)


def piece_seconds(cm, name: str, env: tuple, device, compiled: bool) -> tuple[float, float]:
    """(forward, backward) seconds FP8 adds to one micro-batch of a block of repeat `name` under cost model `cm`'s
    structure at `env` (compiler/cost/step_time.py adds them to the block's piece); (0, 0) without fp8."""
    from compiler.cost.formulas import Formula
    fp8 = cm.spec.train.fp8
    if fp8 is None:
        return 0.0, 0.0
    xs = chosen(cm.traced.blocks[name], fp8)
    return block_seconds(xs, [float(Formula(x.m, cm.formulas.sub)(env)) for x in xs], device, compiled)


def no_linear(traced, fp8) -> bool:
    """Whether `fp8` chooses no linear at all (a warning: the program trains in bf16)."""
    return fp8 is not None and not any(linears(traced, fp8).values())
