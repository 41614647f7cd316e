"""Expert parallelism over the `ep` mesh axis (GShard, Lepikhin et al. 2020).

Policy, `ep_policy`: the experts of each MoE layer in a segment (its `runtime.moe.Experts` leaf) are split evenly
over the ep ranks, in order: rank r holds experts [r·E/ep, (r+1)·E/ep). The router stays replicated, like every
dense weight.
Mechanism, `expert_parallel_pass`: swaps each Experts leaf for its local E/ep experts and wraps it in the two
explicit all-to-alls of runtime/moe.py:
  - dispatch, on the experts' input: forward all-to-all of the capacity slots to the ranks holding their experts,
    backward the reverse all-to-all of their gradients;
  - combine, on the experts' output: forward all-to-all of the results back to the tokens' ranks, backward the
    reverse.
Each moves E·(b·C)·d elements per micro-batch and direction (b sequences, C slots per expert per sequence).
Expert weights are recorded in gm.meta[EP_SHARDS]; their gradients are synchronised over dp only (the ranks that
hold the same experts), by the runtime.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from compiler import spec as S
from compiler.diagnostics import divisors, plan_error
from compiler.symbols import size

if TYPE_CHECKING:  # torch, the tracer and runtime.moe load where a graph is sharded: `requires` needs none of them
    from torch import fx

    from compiler import trace as T

AXIS = "ep"


@dataclass(frozen=True)
class Placement:
    experts: str      # call_module node of the Experts leaf
    count: int        # experts of the layer
    per_rank: int     # experts each ep rank holds


def ep_policy(gm: fx.GraphModule, ep: int) -> tuple:
    from runtime import moe
    out = []
    for node in gm.graph.nodes:
        if node.op == "call_module" and isinstance(gm.get_submodule(node.target), moe.Experts):
            n = gm.get_submodule(node.target).w_up.shape[0]
            if n % ep:  # the checker reports this (E0701) before any pass runs
                raise AssertionError(f"{n} experts of {node.target} do not divide over ep = {ep}")
            out.append(Placement(node.name, n, n // ep))
    return tuple(out)


def _shard(gm: fx.GraphModule, p: Placement, meta: dict) -> None:
    import torch

    from compiler import trace as T
    from compiler.passes.tensor_parallel import Collective, _insert
    from runtime import moe
    node = next(n for n in gm.graph.nodes if n.name == p.experts)
    old = gm.get_submodule(node.target)
    _, hidden, ffn = old.w_up.shape
    with torch.device("meta"):  # built there: on the CPU first, a large MoE would allocate every expert
        setattr(gm, node.target, moe.Experts(p.per_rank, hidden, ffn, old.act))
    shapes = gm.meta[T.PARAM_SHAPES]
    for pname, _ in old.named_parameters():
        key = f"{node.target}.{pname}"
        shapes[key] = (shapes[key][0] / size(AXIS),) + tuple(shapes[key][1:])
        meta[key] = (0, p.count)
    layer = node.meta.get(T.LAYER)
    what = f"`moe` with {p.count} experts, {p.per_rank} per ep rank"
    if isinstance(layer, S.MoE):
        what += f", top-{layer.top_k}, `{layer.capacity}` slots per expert per sequence"
        if layer.capacity_factor == "none":
            what += " (dropless: buffers sized for the worst case, every token of a sequence to one expert)"
    to = Collective("all_to_all", "all_to_all", AXIS, f"dispatch of {what}: each rank sends every expert's slots to "
                    "the rank holding that expert")
    back = Collective("all_to_all", "all_to_all", AXIS, f"combine of {what}: the experts' outputs return to their "
                      "tokens' ranks")
    (x,) = node.args
    sent = _insert(gm, x, moe.all_to_all_dispatch, (x, AXIS), node, to, f"{node.name}_in")
    node.args = (sent,)
    users = list(node.users)
    got = _insert(gm, node, moe.all_to_all_combine, (node, AXIS), node, back, f"{node.name}_out")
    for u in users:
        u.replace_input_with(node, got)


def expert_parallel_pass(traced: T.Traced, plan) -> T.Traced:
    """Carry out `plan.ep`, the policy's placement of each segment's experts (compiler/pipeline.decide)."""
    from compiler import trace as T
    if plan.size(AXIS) == 1:
        return traced
    for cls, gm in traced.segments():
        meta: dict = {}
        for placement in plan.decision("ep", cls):
            _shard(gm, placement, meta)
        gm.meta[T.EP_SHARDS] = meta
        gm.graph.lint()
        gm.recompile()
    traced.annotate()
    return traced


# -- what expert parallelism requires ------------------------------------------------------------------------------


def requires(spec: S.Spec, plan) -> list:
    """Experts that divide over ep, and what ep and `moe` layers cannot yet combine with. (Each `moe` layer's
    capacity is bound when the model is resolved, in compiler/check.py.)"""
    out: list = []
    moes = [x for x in S.walk(spec.model.layers) if isinstance(x, S.MoE)]
    if moes and plan.sequence_parallel and plan.size("tp") > 1:
        out.append(plan_error(plan, "axis tp", "E0707", "`moe` layers under sequence parallelism are not supported "
                              f"yet", help=f"the `moe` at {moes[0].span} would route sequence chunks, not sequences; "
                              "turn `sequence_parallel` off (tp still shards attention, the dense MLPs and the "
                              "vocabulary)"))
    ep = plan.size(AXIS)
    if ep == 1:
        return out
    at = "axis ep"
    if not moes:
        out.append(plan_error(plan, at, "E0704", f"ep = {ep} but the model has no `moe` layer to shard over it",
                              label="nothing to shard", help="add `moe(...)` layers (e.g. in place of an `mlp`), or "
                              "remove the axis and give its ranks to dp"))
    for m in moes:
        n = int(spec.value(m.experts))
        if n % ep:
            ok = [d for d in divisors(n) if d <= max(4 * ep, 8)]
            out.append(plan_error(plan, at, "E0701", f"expert-parallel degree {ep} does not divide the {n} experts",
                                  label=f"{n} % {ep} == {n % ep}",
                                  help=f"each ep rank holds a whole number of experts (the `moe` at {m.span}); ep "
                                       "sizes that divide " + f"{n}: " + ", ".join(map(str, ok[-6:]))))
    if plan.data_parallel == "fsdp" and plan.size("dp") > 1:
        out.append(plan_error(plan, at, "E0706", "FSDP over dp together with ep is not supported yet",
                              help="use `data_parallel = ddp`: experts are already sharded over ep"))
    if plan.data_parallel in ("zero1", "zero2") and plan.size("dp") > 1:
        out.append(plan_error(plan, "data_parallel", "E0708", f"{plan.data_parallel} over dp together with ep is not "
                              "supported yet", label=f"ep = {ep}",
                              help="use `data_parallel = ddp` (experts are already sharded over ep); "
                                   "`scalec explain E0708` says why"))
    return out
