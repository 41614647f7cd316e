"""What context parallelism requires (the rules of compiler/passes/context_parallel.py's plans): a sequence that cuts
into 2·cp equal chunks, heads that divide over cp under `context_parallel = all_to_all` (Ulysses), attention the
pass can run (a `moe` only dropless), and none of the combinations not built yet (selective recomputation with ring
and compiled ring among them). Each combination not built is refused here, at the setting that asks for it, never
run some other way.

Torch-free: `scalec check` runs these on the plan as written, the search on every candidate.
"""
from __future__ import annotations

import math

from compiler import spec as S
from compiler.diagnostics import Diagnostic, divisors, plan_error

AXIS = "cp"
# The rules (Diagnostic.rule) whose verdict reads only cp's size, seq_len, the model's layers, `compile` and the
# variant: one check refuses all of a mesh shape's families of one variant in the search (compiler/search/prune.py
# `_cp_shape_refused`). A rule that starts reading another setting the search varies within a shape (tp, pp,
# schedule, sequence parallelism, recomputation, dp sharding, micro-batches) leaves.
SHAPE_RULES = frozenset({"context_parallel.chunks", "context_parallel.layers", "context_parallel.compiled_ring"})


def _attention_refusal(x) -> str | None:
    """Why the pass cannot run layer `x` under cp (None: it can)."""
    if isinstance(x, S.MLA):
        return "multi-head latent attention (`mla`)"
    if isinstance(x, S.Attention) and x.window is not None:
        return "sliding-window attention (`window`)"
    if isinstance(x, S.Attention) and x.softcap is not None:
        return "soft-capped attention (`softcap`)"
    if isinstance(x, S.MoE) and x.capacity_factor != "none":
        return ("a `moe` layer with a capacity (which choices it drops depends on the whole sequence; a rank holds "
                "1/cp of each)")
    return None


def requires(spec: S.Spec, plan) -> list:
    out: list = []
    cp = plan.size(AXIS)
    if cp == 1:
        return out
    at = "axis cp"
    if plan.seq_len % (2 * cp):
        ok = [d for d in divisors(plan.seq_len) if d % 2 == 0 and d // 2 > 1][:6]
        out.append(plan_error(plan, at, "E0310", f"seq_len {plan.seq_len} does not cut into 2 × cp = {2 * cp} equal "
                              "chunks", label=f"{plan.seq_len} % {2 * cp} == {plan.seq_len % (2 * cp)}",
                              help="each cp rank holds chunks i and 2·cp − 1 − i of every sequence (balanced for "
                                   "the causal mask); cp sizes that fit: "
                                   + (", ".join(str(d // 2) for d in ok) or "none"),
                              axis=AXIS, rule="context_parallel.chunks"))
    if plan.context_parallel == "all_to_all":
        tp = plan.size("tp") if "attention" in plan.tp_layers else 1  # Ulysses splits each tp rank's heads
        for x in S.walk(spec.model.layers):
            if not isinstance(x, S.Attention):
                continue
            heads, kv = int(spec.value(x.heads)), int(spec.value(x.kv_heads))
            if heads % tp or kv % tp:
                continue  # E0401 / E0402 (the tp rules) say so
            h, k = heads // tp, kv // tp
            if h % cp or k % cp:
                ok = [d for d in divisors(math.gcd(h, k)) if d > 1 and plan.seq_len % (2 * d) == 0]
                per = f" per tp rank (of {heads} and {kv} over tp = {tp})" if tp > 1 else ""
                out.append(plan_error(plan, "context_parallel", "E0317", f"context_parallel = all_to_all over cp = "
                                      f"{cp} needs the heads ({h}) and key/value heads ({k}){per} to divide by cp "
                                      f"(the layer at {x.span})",
                                      label=f"{h} heads, {k} key/value heads{' per tp rank' if tp > 1 else ''} over "
                                            f"cp = {cp}",
                                      help="each cp rank computes whole heads over the whole sequence; cp sizes that "
                                           "fit: " + (", ".join(map(str, ok)) or "none")
                                           + ", or `context_parallel = ring` or `all_gather`",
                                      axis=AXIS, rule="context_parallel.heads"))
                break
    for x in S.walk(spec.model.layers):
        why = _attention_refusal(x)
        if why:
            moe = isinstance(x, S.MoE)
            out.append(plan_error(plan, at, "E0312", f"context parallelism over {why} is not built yet (the layer at "
                                  f"{x.span})", label="cp shards the sequence this layer mixes",
                                  help="write `capacity_factor = none` (dropless: each token's route is its own), "
                                       "or remove the axis and give its ranks to dp" if moe else
                                       "remove the axis and give its ranks to dp, or use causal `attention` "
                                       "without a window or soft cap", axis=AXIS, rule="context_parallel.layers"))
            break
    if plan.compile and plan.context_parallel == "ring":
        # measured: dynamo cannot trace the ring's P2P sends, so it breaks each block's region inside the ring's
        # autograd function and compiles the pieces of its loop as frames of their own; exact without recomputation,
        # but a block is no longer one region, and recomputation with it is untried (compiler/codes.py E0315)
        written = plan.span("compile") is not None
        out.append(plan_error(plan, "compile" if written else "context_parallel", "E0315",
                              "compiling ring attention (`context_parallel = ring`) is not built yet",
                              label="compile = true" if written else "compiled by default on GPUs",
                              help="set `compile = false`, or use `context_parallel = all_gather` or `all_to_all`, "
                                   "which compile", axis=AXIS, rule="context_parallel.compiled_ring"))
    return out
