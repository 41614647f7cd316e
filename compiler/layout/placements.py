"""Where each parameter of a compiled plan lies over each group of the mesh, in DTensor's vocabulary: `Replicate()`,
`Shard(dim)`, and for a gradient that a group leaves to be summed, `Partial(sum)`.

One table, read by everyone that says where a weight is: plan.json's `parameters` (compiler/codegen) writes it, and
`scalec reshard` (compiler/reshard.py) reads each rank's pieces from it. It is derived from what the passes recorded
in the sharded graphs (graph_meta's TP_SHARDS, EP_SHARDS, TP_PARTIAL_GRADS: which parameter a pass sharded, along
which dim) and from the Plan's data-parallel mode (`shards_grads`: FSDP2, zero2 and fsdp over dp > 1):

  tp   Shard(dim) for a parameter tensor parallelism splits; Replicate() for the others, with a Partial(sum)
       gradient where tp leaves it partial (sequence parallelism's norms and row biases, per-head q/k norms).
  ep   Shard(dim) for an expert weight; the dense weights Replicate().
  dp   Replicate() (ddp, zero1: zero1 partitions AdamW's state by whole parameters, not the weights), or under
       FSDP2 Shard(0) at rest (zero2 gathers a unit from its forward to its backward, fsdp for each).
  cp   cp shards no weight: Replicate(), except under FSDP2.

Under FSDP2 a dense weight is sharded over dp folded with the batch axes beside it, ep and cp (runtime/mesh.py's
dense_mesh, torchtitan's folding), and an expert weight over dp and cp (expert_mesh): dim 0 split over each of
those axes in the mesh's order, Shard(0) on each, as DTensor writes a dim split over a flattened submesh, after the
tp or ep split of the pass. Torch-free: it reads the graphs' metadata dictionaries and the Plan only.
"""
from __future__ import annotations

from dataclasses import dataclass

from compiler import graph_meta as K

GROUPS = ("dp", "ep", "tp", "cp")
"""The groups a placement is given over, in the order plan.json writes them (pp cuts the model into stages; it
places no piece of a weight)."""


@dataclass(frozen=True, slots=True)
class Replicate:
    """Every rank of the group holds the whole tensor."""

    def __str__(self) -> str:
        return "Replicate()"


@dataclass(frozen=True, slots=True)
class Shard:
    """Each rank of the group holds one piece of `dim` (torch.chunk's: ceil-sized, the last ones shorter)."""
    dim: int

    def __str__(self) -> str:
        return f"Shard({self.dim})"


@dataclass(frozen=True, slots=True)
class Partial:
    """Each rank holds a partial value; the group's `reduce_op` over them is the tensor."""
    reduce_op: str = "sum"

    def __str__(self) -> str:
        return f"Partial({self.reduce_op})"


@dataclass(frozen=True, slots=True)
class Placed:
    """A parameter's placement over one group, with its gradient's where that differs (a Partial)."""
    value: Replicate | Shard
    grad: Partial | None = None

    def __str__(self) -> str:
        return str(self.value) + (f", gradient {self.grad}" if self.grad is not None else "")


@dataclass(frozen=True, slots=True)
class ParamPlacement:
    """One parameter of the program (a block's as `repeat.*.name`: every block alike)."""
    name: str
    local_shape: tuple      # as one rank holds it after the passes (tp, ep), sympy; before FSDP's dp pieces
    groups: tuple           # (group, Placed) for dp, then each of ep, tp, cp above 1, in GROUPS' order
    pieces: tuple           # (group, dim) of each Shard, in the order they split the whole tensor: the pass's
                            # (tp or ep), then FSDP2's in the mesh's order
    expert: bool = False

    def on(self, group: str) -> Placed | None:
        """The placement over `group`, None where the plan has no such group above 1 (dp is always given)."""
        return dict(self.groups).get(group)


def placements(traced, plan) -> tuple[ParamPlacement, ...]:
    """Every parameter of the lowered graphs `traced` (compiler.trace.Traced after the passes) under `plan`, the top
    level's first, then each repeat's block's, in the graphs' order."""
    sizes = {a: plan.size(a) for a in GROUPS}
    order = [a for a, _ in plan.axes]
    fsdp = plan.shards_grads  # FSDP2 (zero2, fsdp) over dp > 1: runtime/train.py's fully_shard
    # the axes FSDP2 shards over, in the mesh's order (runtime/mesh.py: dense_mesh, expert_mesh)
    folded = {kind: tuple(a for a in order if a in over and sizes[a] > 1) if fsdp else ()
              for kind, over in (("dense", ("dp", "ep", "cp")), ("expert", ("dp", "cp")))}
    out = []
    for prefix, gm in [("", traced.top)] + [(f"{name}.*.", gm) for name, gm in traced.blocks.items()]:
        tp_shards = gm.meta.get(K.TP_SHARDS, {})
        ep_shards = gm.meta.get(K.EP_SHARDS, {})
        partial = gm.meta.get(K.TP_PARTIAL_GRADS, ())
        for pname, shape in gm.meta[K.PARAM_SHAPES].items():
            expert = pname in ep_shards
            mine = folded["expert" if expert else "dense"]
            pieces = [(a, got[pname][0]) for a, got in (("tp", tp_shards), ("ep", ep_shards))
                      if pname in got and sizes[a] > 1]  # the pass's split first: FSDP2 shards what it left
            pieces += [(a, 0) for a in mine]
            split = dict(pieces)
            groups = []
            for a in GROUPS:
                if a != "dp" and sizes[a] == 1:
                    continue
                grad = Partial() if a == "tp" and a not in split and pname in partial else None
                groups.append((a, Placed(Shard(split[a]) if a in split else Replicate(), grad)))
            out.append(ParamPlacement(prefix + pname, tuple(shape), tuple(groups), tuple(pieces), expert))
    return tuple(out)
