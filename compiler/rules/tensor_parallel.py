"""What the tensor-parallel degree must divide (the rules of compiler/passes/tensor_parallel.py's plans).

Torch-free: `scalec check` runs these on the plan as written, the search on every candidate.
"""
from __future__ import annotations

from compiler import spec as S
from compiler.diagnostics import divisors, plan_error

AXIS = "tp"
# The rule names (Diagnostic.rule) this module gives.
VOCAB = "tensor_parallel.vocab"  # the vocabulary, which `pad_vocab` pads (the search tries that alone)


def requires(spec, plan) -> list:
    """Everything the tensor-parallel degree must divide, reported at the `axis tp` line with the layer named (or,
    for a generated candidate, with the plan described)."""
    out: list = []
    tp = plan.size(AXIS)
    if tp == 1:
        return out
    at = "axis tp"

    def need(code: str, rule: str, what: str, value, layer_span, remedy: str) -> None:
        n = int(spec.value(value))
        if n % tp:
            ok = [d for d in divisors(n) if d <= max(tp * 4, 8)]
            out.append(plan_error(plan, at, code, f"tensor-parallel degree {tp} does not divide {what} ({n})",
                                  label=f"{n} % {tp} == {n % tp}",
                                  help=f"{remedy} (the layer is at {layer_span}); tp sizes that divide {n}: "
                                       + ", ".join(map(str, ok[-6:])), axis=AXIS, rule=rule))

    for x in S.walk(spec.model.layers):
        if isinstance(x, S.Attention) and "attention" in plan.tp_layers:
            need("E0401", "tensor_parallel.heads", "the attention heads", x.heads, x.span,
                 "each rank computes whole heads")
            if int(spec.value(x.heads)) % tp == 0:
                need("E0402", "tensor_parallel.kv_heads", "the key/value heads", x.kv_heads, x.span,
                     "each rank needs whole key/value heads for its query heads")
        if isinstance(x, S.MLA) and "attention" in plan.tp_layers:  # its latents are whole on every rank
            need("E0401", "tensor_parallel.heads", "the attention heads", x.heads, x.span,
                 "each rank computes whole heads")
        if isinstance(x, S.MLP) and "mlp" in plan.tp_layers:
            need("E0404", "tensor_parallel.ffn", "the MLP width `ffn`", x.ffn, x.span,
                 "each rank holds a slice of the MLP's inner width")
        if isinstance(x, S.MoE) and x.shared_ffn is not None and "mlp" in plan.tp_layers:  # sharded as an mlp
            need("E0404", "tensor_parallel.ffn", "the shared expert's width `shared_ffn`", x.shared_ffn, x.span,
                 "each rank holds a slice of the shared expert's inner width")
    emb = next(x for x in spec.model.layers if isinstance(x, S.Embedding))
    if "vocab" in plan.tp_layers and not plan.pad_vocab:
        need("E0403", VOCAB, "the vocabulary", emb.vocab, emb.span,
             "add `pad_vocab = true` to the plan (padded logits are masked out, the loss is unchanged), or exclude "
             "the vocabulary: `tp_layers = (attention, mlp)`")
    if plan.sequence_parallel:
        cp = plan.size("cp")
        if plan.seq_len % tp:
            out.append(plan_error(plan, at, "E0405", f"sequence parallelism over tp = {tp} needs the sequence length "
                                  f"({plan.seq_len}) to divide", label=f"{plan.seq_len} % {tp} == {plan.seq_len % tp}",
                                  help="choose a seq_len that tp divides, or turn `sequence_parallel` off",
                                  axis=AXIS, rule="tensor_parallel.sequence"))
        elif cp > 1 and plan.seq_len % cp == 0 and (plan.seq_len // cp) % tp:
            local = plan.seq_len // cp  # each cp rank's chunk is the sequence sp splits over tp
            out.append(plan_error(plan, at, "E0405", f"sequence parallelism over tp = {tp} needs each cp rank's "
                                  f"{local} tokens (seq_len {plan.seq_len} / cp {cp}) to divide",
                                  label=f"{local} % {tp} == {local % tp}",
                                  help=f"choose a seq_len that cp × tp = {cp * tp} divides (and 2 × cp), or turn "
                                       "`sequence_parallel` off", axis=AXIS, rule="tensor_parallel.sequence"))
        missing = [k for k in ("attention", "mlp", "vocab") if k not in plan.tp_layers]
        if missing:
            out.append(plan_error(plan, at, "E0406", "sequence parallelism needs attention, MLP and vocabulary all "
                                  "sharded over tp", help=f"add {', '.join(missing)} to `tp_layers`, or turn "
                                  "`sequence_parallel` off", axis=AXIS, rule="tensor_parallel.sequence_layers"))
    return out
