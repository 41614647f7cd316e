"""`scalec reshard OLD.scale NEW.scale`: what moving a checkpoint from one plan to another reads, before doing it.

A checkpoint holds every parameter whole under its single-device name, with its AdamW moments (runtime/checkpoint.py);
a plan reads back its own pieces. This prints, from the two compiled plans alone (each parameter's placements,
compiler/layout/placements.py's, which plan.json writes, and the Plan's pipeline stages), each tensor's pieces under
both plans (axis, dim, number of pieces, pipeline stage) and the bytes each rank of NEW reads. Two plans of different models (other parameter names or shapes) are refused with a diagnostic located in NEW.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from compiler import trace as T
from compiler.diagnostics import Diagnostic, ScaleError
from compiler.layout import placements as PL

MOMENTS = 2  # AdamW's exp_avg and exp_avg_sq, each shaped and sharded like its parameter
BYTES = 4    # fp32: weights and optimizer state stay fp32 under every precision


@dataclass(frozen=True)
class Piece:
    axis: str
    dim: int
    n: int


@dataclass(frozen=True)
class Placement:
    shape: tuple
    pieces: tuple   # Piece, outermost first (tp or ep, then FSDP's dp)
    stages: tuple   # pipeline stages holding it; () without pp


def _shape_text(shape) -> str:
    return "×".join(str(d) for d in shape) or "scalar"


def _chunk(size: int, n: int, i: int) -> int:
    """DTensor's (and torch.chunk's) piece i of n along a dim of `size`: ceil-sized, the last ones shorter."""
    c = -(-size // n)
    return max(0, min(size - i * c, c))


class Layout:
    """Where each parameter of a compiled plan lives."""

    def __init__(self, compiled):
        self.compiled = compiled
        traced, plan = compiled.traced, compiled.plan
        self.axes = tuple(plan.axes)
        self.size = dict(self.axes)
        # each parameter's pieces as compiler/layout/placements.py places it (what plan.json writes): the tp or ep
        # split of the passes, then FSDP2's dp pieces (over dp × ep, dp × cp for the dense weights: runtime/mesh.py's
        # folding). zero1 reads whole weights; its AdamW moments are partitioned by whole parameters (counted here as
        # whole: an upper bound).
        table = {pl.name: pl for pl in PL.placements(traced, plan)}
        top = traced.top
        stages = compiled.plan.stages  # the Plan's layout: () without pp
        self.rank_of = compiled.plan.stage_layout.rank_of  # the pp rank each stage lives on
        from compiler.trace import repeat_edges
        offset = {name: a for name, a, _ in repeat_edges(traced, compiled.spec.value)}  # blocks across the repeats
        first = {n for n, _ in top.meta[T.PROLOGUE].named_children()} if stages else set()
        last = {n for n, _ in top.meta[T.EPILOGUE].named_children()} if stages else set()
        self.params: dict[str, Placement] = {}
        for name, p in traced.model.named_parameters():
            parts = name.split(".")
            pl = table.get(name) if parts[0] not in traced.blocks else table.get(".".join([parts[0], "*", *parts[2:]]))
            if pl is None:
                raise ValueError(f"{name}: no placement (compiler/layout/placements.py lists every parameter of the "
                                 "lowered graphs)")
            pieces = [Piece(axis, dim, self.size[axis]) for axis, dim in pl.pieces]
            held: tuple = ()
            if stages:
                leaf = name.split(".")[0]
                if leaf in offset:
                    block = offset[leaf] + int(name.split(".")[1])
                    held = tuple(s for s, (a, b) in enumerate(stages) if a <= block < b)
                else:
                    held = tuple(s for s, on in ((0, leaf in first), (len(stages) - 1, leaf in last)) if on)
            self.params[name] = Placement(tuple(p.shape), tuple(pieces), held)

    def describe(self, name: str) -> str:
        pl = self.params[name]
        parts = []
        for piece in pl.pieces:
            sizes = sorted({_chunk(pl.shape[piece.dim], piece.n, i) for i in range(piece.n)}, reverse=True)
            parts.append(f"{piece.axis} dim {piece.dim} in {piece.n} ({'/'.join(map(str, sizes))})")
        text = ", ".join(parts) or "whole"
        if pl.stages:
            text += f"; stage{'s' if len(pl.stages) > 1 else ''} {','.join(map(str, pl.stages))}"
        return text

    def ranks(self):
        """(rank, {axis: coordinate}) in torch's row-major order of the mesh."""
        sizes = [n for _, n in self.axes]
        for rank in range(math.prod(sizes)):
            coords, rest = {}, rank
            for (axis, n), stride in zip(self.axes, [math.prod(sizes[i + 1:]) for i in range(len(sizes))]):
                coords[axis], rest = rest // stride, rest % stride
            yield rank, coords

    def reads(self, coords: dict) -> tuple[int, int]:
        """(tensors, bytes) a rank at `coords` reads: its piece of each parameter it holds and of its moments."""
        tensors = total = 0
        for pl in self.params.values():
            if pl.stages and not any(self.rank_of(s) == coords.get("pp", 0) for s in pl.stages):
                continue
            shape = list(pl.shape)
            for piece in pl.pieces:
                shape[piece.dim] = _chunk(shape[piece.dim], piece.n, coords[piece.axis])
            tensors += 1
            total += math.prod(shape) * BYTES * (1 + MOMENTS)
        return tensors, total


def _span(compiled, name: str):
    """The layer of `name` in the .scale file: its line in a block, else its top-level layer, else the model."""
    traced, parts = compiled.traced, name.split(".")
    spans = traced.model.spans
    if parts[0] in traced.blocks and len(parts) > 2:
        inner = traced.blocks[parts[0]].meta.get(T.SPANS, {})
        if parts[2] in inner:
            return inner[parts[2]]
    return spans.get(parts[0], compiled.spec.model.span)


SAME_MODEL = "a checkpoint moves between plans of one model: change the mesh and plan, not the model"


def check_same_model(old, new, old_path: str) -> None:
    """Refuse plans of different models: the first parameter NEW lacks, adds or shapes differently, located in NEW."""
    olds = {n: tuple(p.shape) for n, p in old.traced.model.named_parameters()}
    diag = model_difference(new, {n: tuple(p.shape) for n, p in new.traced.model.named_parameters()}, olds, old_path)
    if diag:
        raise ScaleError([diag], {new.spec.path: new.spec.source})


def model_difference(new, news: dict, olds: dict, old_path: str, help: str = SAME_MODEL) -> Diagnostic | None:
    """E0901 for the first name of `news` (NEW's name -> shape) that `olds` lacks or shapes differently, else for
    the first of `olds` that `news` lacks, located in NEW; None when they are the same model."""
    for name, shape in news.items():
        if name not in olds:
            return Diagnostic("E0901", f"the models differ: `{name}` is not a parameter of {old_path}",
                              _span(new, name), label=f"makes `{name}` ({_shape_text(shape)})",
                              help=help)
        if tuple(olds[name]) != tuple(shape):
            return Diagnostic("E0901", f"the models differ: `{name}` is {_shape_text(shape)} here and "
                              f"{_shape_text(olds[name])} in {old_path}", _span(new, name),
                              label=f"makes `{name}` {_shape_text(shape)}",
                              help=help)
    missing = [n for n in olds if n not in news]
    if missing:
        at = new.traced.model.spans.get(missing[0].split(".")[0])
        return Diagnostic("E0901", f"the models differ: {old_path} has `{missing[0]}`"
                          + (f" and {len(missing) - 1} more parameters" if len(missing) > 1 else "")
                          + " that this model lacks", at or new.spec.model.span,
                          help=help)
    return None


def model_state(model) -> dict:
    """What a checkpoint of `model` holds, as the program saves it (runtime.checkpoint: each parameter once, tied
    ones under their first name, and the persistent buffers): name -> whole shape."""
    got = {n: tuple(p.shape) for n, p in model.named_parameters()}
    for where, m in model.named_modules():
        for name, b in m.named_buffers(recurse=False):
            if name not in m._non_persistent_buffers_set:
                got[f"{where}.{name}" if where else name] = tuple(b.shape)
    return got


def _mesh(layout: Layout) -> str:
    return " × ".join(f"{a}={n}" for a, n in layout.axes) or "one device"


def report(old, new, old_path: str, new_path: str) -> str:
    check_same_model(old, new, old_path)
    lo, ln = Layout(old), Layout(new)
    names = list(lo.params)
    rows = [(n, _shape_text(lo.params[n].shape), lo.describe(n), ln.describe(n)) for n in names]
    head = ("tensor", "shape", f"OLD ({_mesh(lo)})", f"NEW ({_mesh(ln)})")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(3)]
    elements = sum(math.prod(p.shape) for p in lo.params.values())
    out = [f"reshard {old_path} -> {new_path}: the same model, {len(names)} tensors, {elements:,} parameters; "
           f"each stored whole with its {MOMENTS} AdamW moments (fp32)", ""]
    for r in [head] + rows:
        out.append("  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3])
    out += ["", "bytes each rank of NEW reads (its pieces of the parameters it holds and of their moments):"]
    groups: dict = {}
    for rank, coords in ln.ranks():
        key = ln.reads(coords)
        what = tuple((a, c) for a, c in coords.items() if not (a == "dp" and not any(
            p.axis == "dp" for pl in ln.params.values() for p in pl.pieces)))
        groups.setdefault((what, key), []).append(rank)
    for (what, (tensors, total)), ranks in groups.items():
        where = " ".join(f"{a} {c}" for a, c in what) or "the one device"
        span = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        out.append(f"  {span} ({where}): {tensors} tensors, {total:,} B")
    return "\n".join(out) + "\n"
