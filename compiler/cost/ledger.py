"""The communication ledger: every collective one rank issues in one optimizer step, with its reason and where it
comes from. The collectives the passes inserted are read off the graphs once (`sites`); which rank, how many
blocks it holds and how many micro-batches run are the plan's, applied per estimate (compiler/cost/__init__.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

import sympy

from compiler import trace as T
from compiler.diagnostics import Span


@dataclass(frozen=True, kw_only=True)
class Collective:
    """One collective the plan issues: what, over which axis, how much, and why.

    `times` and `bytes` are numbers for the plan costed; `elements` and `per_step` are the formulas of the same
    (in the user's sizes: `layers`, `global_batch`, `dp`, ...), built only when asked for (printing, plan.json)."""

    op: str              # all_reduce | all_gather | reduce_scatter | all_to_all | send_recv
    axis: str
    dtype_bytes: int
    span: Span | None
    reason: str
    direction: str = "step"  # "forward", "backward", or "step" (once per optimizer step)
    measured: bool = True    # issued through runtime.collectives, so the runtime can count its bytes
    times: int = 1           # occurrences per optimizer step on one rank
    bytes: int = 0           # bytes per step on one rank: elements · dtype_bytes · times
    worst_bytes: int | None = None  # a variable-split all-to-all: `bytes` is the expectation under balanced routing,
                                    # this the most it can move (expert_parallel's grouped dispatch)
    element_formula: Callable = field(default=None, compare=False, repr=False)
    per_step_formula: Callable = field(default=None, compare=False, repr=False)

    @cached_property
    def elements(self) -> sympy.Expr:
        """Elements of the full (unsharded along `axis`) tensor, per occurrence."""
        return sympy.expand(self.element_formula())

    @cached_property
    def per_step(self) -> sympy.Expr:
        return self.per_step_formula() if self.per_step_formula else sympy.Integer(self.times)

    def bytes_per_step(self) -> sympy.Expr:
        return sympy.expand(self.elements * self.dtype_bytes * self.per_step)

    def wire_elements(self, n) -> sympy.Expr:
        """Elements each rank sends per occurrence with ring algorithms over `n` ranks: an all-reduce is a
        reduce-scatter then an all-gather, 2(n-1)/n of the tensor; either half alone (n-1)/n (Patarasuk & Yuan)."""
        factor = {"all_reduce": 2 * (n - 1) / sympy.Integer(n)}.get(self.op, (n - 1) / sympy.Integer(n))
        return self.elements * factor


@dataclass(frozen=True)
class Ledger:
    entries: tuple = ()

    def bytes(self, op: str | None = None, axis: str | None = None, measured: bool | None = None) -> int:
        return sum(c.bytes for c in self.entries if (op is None or c.op == op) and (axis is None or c.axis == axis)
                   and (measured is None or c.measured == measured))


@dataclass(frozen=True)
class Site:
    """One direction of one collective call the passes inserted into a graph (per micro-batch, per occurrence)."""

    op: str
    axis: str
    elements: sympy.Expr    # in µb (the symbol MICRO_BATCH: sequences per micro-batch on one rank)
    fp32: bool              # moves 4 bytes per element whatever the precision
    span: Span | None
    reason: str
    direction: str
    where: tuple            # ("block", repeat name) or ("top", piece): piece "all" without pp, else
                            # "prologue" | "epilogue" | "loss"
    rerun: bool = False     # full recomputation runs it again in backward (in a block, before its last saving op)
    residual: bool = False  # moves the residual stream: fp32 under bf16 with the plan's fp32_residual
    dtype_bytes: int | None = None  # bytes per element whatever the precision (the int64 counts of a grouped MoE)
    worst: sympy.Expr | None = None  # variable splits: `elements` is an expectation, at most `worst` × it
    fp8: str = ""           # precision = fp8 only: "rows" in float8 (1 byte each), "scales" moved (passes' Collective)


def pieces(traced: T.Traced) -> dict | None:
    """Under pp, top-level node name -> the pipeline piece that runs it; None without pp."""
    top = traced.top
    if T.PROLOGUE not in top.meta:
        return None
    out = {}
    for piece, key in (("prologue", T.PROLOGUE), ("epilogue", T.EPILOGUE), ("loss", T.LOSS)):
        for n in top.meta[key].graph.nodes:
            out.setdefault(n.name, piece)
    return out


def sites(traced: T.Traced) -> list[Site]:
    """Every collective the passes inserted, per segment and direction, in graph order (blocks, then the top)."""
    from compiler.cost.activations import last_saving_node
    owner = pieces(traced)
    out = []
    for name, gm in list(traced.blocks.items()) + [("", traced.top)]:
        # torch's non-reentrant checkpoint stops a recomputation once the last tensor the backward needs exists:
        # a block's collectives after its last saving op (those that only feed its output) are not re-run
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        last = order[last_saving_node(gm)] if name else -1
        for node in gm.graph.nodes:
            notes = node.meta.get(T.COLLECTIVE)
            if notes is None:
                continue
            if name:
                where = ("block", name)
            elif owner is None:
                where = ("top", "all")
            elif node.name in owner:
                where = ("top", owner[node.name])
            else:
                continue
            for note in notes if isinstance(notes, tuple) else (notes,):  # a call may move several things
                out += _sites_of(node, note, where, rerun=order[node] < last)
    return out


def _sites_of(node, note, where: tuple, rerun: bool) -> list:
    """The forward and backward Sites of one note (passes.tensor_parallel.Collective) of an inserted call."""
    if note.elements is not None:  # moves a number of its own (the node dispatch's rows), in the note's dtype
        numel, fp32, residual = note.elements, note.dtype == "fp32", False
    else:
        # "keys": the second argument (context parallelism's ring sends its keys' blocks)
        tensor = {"input": node.args[0], "output": node, "targets": node.args[1],
                  "keys": node.args[1]}[note.payload]
        numel = sympy.Mul(*tensor.meta[T.SHAPE])
        # A gradient has its tensor's dtype: an fp32 tensor moves 4 bytes per element also under bf16, the
        # residual stream its own dtype (trace.DTYPE).
        fp32 = note.dtype == "fp32" or tensor.meta.get(T.DTYPE) == "fp32"
        residual = tensor.meta.get(T.DTYPE) == "res"
    counts = dict(getattr(note, "counts", ()))
    worst = dict(getattr(note, "worst", ()))
    out = []
    for direction, op in (("forward", note.forward), ("backward", note.backward)):
        if op:
            elements = sympy.expand(counts.get(direction, note.count) * numel)
            out.append(Site(op, note.axis, elements, fp32, node.meta.get(T.SPAN), note.reason, direction, where,
                            rerun=rerun, residual=residual, dtype_bytes=8 if note.dtype == "int64" else None,
                            worst=worst.get(direction), fp8=note.fp8))
    return out


def site_width(site: Site, act: int, res: int, fp8: bool) -> int | None:
    """Bytes per element a site moves at a compute width `act` (the residual stream's `res`), or None where it moves
    nothing under this precision: a count's 8, an fp32 tensor's 4, under `fp8` (precision = fp8) the node
    dispatch's float8 rows' 1 (runtime/moe_nodes.py), their scales only then."""
    if site.fp8 == "scales" and not fp8:
        return None
    if site.fp8 == "rows" and fp8:
        return 1
    return site.dtype_bytes or (4 if site.fp32 else res if site.residual else act)


def partial_grads(traced: T.Traced) -> dict:
    """Elements of the gradients sequence parallelism leaves partial per tp rank (norms, row biases), per segment
    ("block", name) or ("top", piece), to be all-reduced over tp once per step."""
    owner = pieces(traced)
    out: dict = {}
    for name, gm in [("", traced.top)] + list(traced.blocks.items()):
        shapes = gm.meta[T.PARAM_SHAPES]
        for p in gm.meta.get(T.TP_PARTIAL_GRADS, ()):
            if name:
                where = ("block", name)
            elif owner is None:
                where = ("top", "all")
            else:
                piece = next((pc for n, pc in owner.items() if n.startswith(p.split(".")[0])), None)
                if piece is None:
                    continue
                where = ("top", piece)
            out[where] = out.get(where, sympy.Integer(0)) + sympy.Mul(*shapes[p])
    return {k: sympy.expand(v) for k, v in out.items()}
