"""Korthikanti et al. 2022 (arXiv:2205.05198), Table 2, from the plan's memory model.

Per-layer activation bytes as `scalec plan` holds them (compiler/cost: what one micro-batch of a middle pipeline
stage keeps, divided by its layers; the figure the e2e memory checks hold against measurements) equal the paper's
formulas for tp, tp + sp, selective and full recomputation within 5%, once each documented difference between
Megatron's layer and ours is added back. The differences are data (DIFFERENCES: a named row, the modes it applies
to, and its bytes as a function of s, b, h, a, t and sp) and the test prints the table, so a reader sees each one.

What the rows say (16-bit activations, bf16 programs under Megatron's policy, runtime/precision.py):
- Megatron's layer has three dropouts; ours none (the language has no dropout): no 1-byte masks (attention
  probabilities a·s²·b, attention output s·b·h, MLP output s·b·h).
- Megatron keeps the s×s softmax output and its dropout's output (2 bytes each per score); scaled_dot_product_
  attention (flash / efficient) keeps its output and a log-sum-exp per row and head in fp32 instead.
- Our norms keep their mean and reciprocal std per row (fp32 on CUDA), which the paper leaves out.
- With sequence parallelism Megatron keeps each norm's output sharded and all-gathers it again in backward. So does
  our selective recomputation (it recomputes the all-gather, from the norm it recomputes too); without
  recomputation our linears keep the all-gathered input whole (autograd saves the gathered tensor):
  2·s·b·h·(1 - 1/t) more per norm.
- Selective recomputation in our runtime (torch's selective checkpoint, compiled on GPUs: runtime.recompute) also
  recomputes the attention core's output (the output projection's input), GeLU's output and the norms' outputs
  from the kept q, k, v, the first MLP matmul's output and the residual stream, where Megatron keeps them (it
  recomputes only the s² part); under sp it also gathers the norms' outputs again.
"""
from __future__ import annotations

import pytest
import sympy

from compiler.check import check_text
from compiler.pipeline import compile_spec

TEXT = """
model gpt {{
  vocab  = 51200
  hidden = {h}
  heads  = {a}
  layers = 8
  seq    = {s}
  ffn    = 4 * hidden

  embedding(vocab, hidden)
  positional(seq, hidden)
  repeat layers {{
    residual {{ layernorm(hidden)  attention(hidden, heads) }}
    residual {{ layernorm(hidden)  mlp(hidden, ffn, act = gelu) }}
  }}
  layernorm(hidden)
  lm_head(vocab, hidden, tied = true)
  cross_entropy
}}

mesh {{
  axis pp = 4
  axis tp = {t}
  nodes = {nodes}
  devices_per_node = 8
  device = a100
}}

plan {{
  micro_batches = 8
  schedule = "1f1b"
  sequence_parallel = {sp}
  recompute = {recompute}
}}

train {{
  global_batch = {B}
  seq_len      = seq
  steps        = 10
  precision    = bf16
  optimizer    = adamw(lr = 6e-5)
}}
"""

# Two layer shapes: GPT-3 175B's (their Table 3) and a narrower one with more heads per width and b = 2.
SHAPES = {"gpt3": dict(s=2048, b=1, h=12288, a=96, t=8), "narrow": dict(s=2048, b=2, h=4096, a=64, t=4)}

# The paper's recomputation modes -> the cases: (recompute, sequence parallel).
CASES = {"tp": ("none", False), "tp+sp": ("none", True), "tp+sp+selective": ("selective", True),
         "tp+selective": ("selective", False), "full": ("full", False), "full+sp": ("full", True)}

# The itemised differences, ours minus theirs, in bytes of one layer on one tp rank: (name, applies(mode, sp),
# bytes(s, b, h, a, t, sp)). Each applies only where the paper's formula counts (or we keep) the tensor.
DIFFERENCES = [
    ("no dropout mask on the attention probabilities (1 byte per score)",
     lambda mode, sp: mode == "none", lambda s, b, h, a, t, sp: -a * s * s * b / t),
    ("no dropout masks after attention and MLP (1 byte each)",
     lambda mode, sp: mode != "full", lambda s, b, h, a, t, sp: -2 * s * b * h / (t if sp else 1)),
    ("no s×s softmax output nor its dropout's output (2 + 2 bytes per score): SDPA keeps none",
     lambda mode, sp: mode == "none", lambda s, b, h, a, t, sp: -4 * a * s * s * b / t),
    ("SDPA's log-sum-exp per row and head (fp32)",
     lambda mode, sp: mode == "none", lambda s, b, h, a, t, sp: 4 * a * s * b / t),
    ("the two norms' mean and reciprocal std per row (fp32)",
     lambda mode, sp: mode == "none", lambda s, b, h, a, t, sp: 2 * 2 * 4 * s * b / (t if sp else 1)),
    ("sp without recomputation: the linears keep the all-gathered norm outputs whole (2 norms), Megatron "
     "re-gathers in backward (selective recomputation here does: runtime.recompute.RECOMPUTE)",
     lambda mode, sp: sp and mode == "none", lambda s, b, h, a, t, sp: 2 * 2 * s * b * h * (1 - 1 / t)),
    ("selective: the attention core's output (output projection's input) recomputed, not kept",
     lambda mode, sp: mode == "selective", lambda s, b, h, a, t, sp: -2 * s * b * h / t),
    ("selective: GeLU's output (the second MLP matmul's input) recomputed, not kept",
     lambda mode, sp: mode == "selective", lambda s, b, h, a, t, sp: -8 * s * b * h / t),
    ("selective: the norms' outputs (QKV's and the MLP's inputs; sharded under sp, where the all-gather after each "
     "is recomputed too) recomputed from the stream, not kept",
     lambda mode, sp: mode == "selective", lambda s, b, h, a, t, sp: -2 * 2 * s * b * h / (t if sp else 1)),
]


def paper(s, b, h, a, t, mode, sp) -> float:
    """Their Table 2, as /work/shared/reference/README.md states it, restated independently of
    compiler/cost/memory.py's korthikanti_layer_bytes (which the test checks against it too)."""
    if mode == "full":
        return 2 * s * b * h / (t if sp else 1)
    scores = 0 if mode == "selective" else 5 * a * s / h
    return s * b * h / t * (34 + scores) if sp else s * b * h * (10 + 24 / t + scores / t)


def _layer_bytes(shape: dict, mode: str, sp: bool) -> float:
    """One layer's activation bytes on one rank as the plan's memory model has them: a middle pipeline stage's
    bytes per micro-batch (CostModel.kept_per_micro_batch: what `scalec plan` multiplies by the micro-batches in
    flight), over its layers."""
    s, b, h, a, t = (shape[k] for k in "sbhat")
    text = TEXT.format(s=s, h=h, a=a, t=t, nodes=4 * t // 8 or 1, sp=str(sp).lower(), recompute=mode, B=8 * b)
    compiled = compile_spec(check_text(text, "korthikanti_table2.scale"))
    assert compiled.plan.micro_batch_size == b and compiled.plan.size("tp") == t
    stage = 1
    lo, hi = compiled.costs.stages[stage].blocks
    return compiled.model.kept_per_micro_batch(compiled.plan, stage) / (hi - lo)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_layer_activations_equal_korthikanti_table2(shape, case):
    from compiler.cost.memory import korthikanti_layer_bytes
    mode, sp = CASES[case]
    dims = SHAPES[shape]
    s, b, h, a, t = (dims[k] for k in "sbhat")
    theirs = paper(s, b, h, a, t, mode, sp)
    assert korthikanti_layer_bytes(s, b, h, a, t, sp=sp, recompute=mode) == pytest.approx(theirs, rel=1e-12)
    ours = _layer_bytes(dims, mode, sp)
    rows = [(name, size(s, b, h, a, t, sp)) for name, applies, size in DIFFERENCES if applies(mode, sp)]
    print(f"\n{shape} {case}: Korthikanti {theirs / 2**20:,.1f} MiB per layer")
    for name, size in rows:
        print(f"  {size / 2**20:+12,.2f} MiB  {name}")
    expected = theirs + sum(size for _, size in rows)
    print(f"  = {expected / 2**20:,.1f} MiB itemised; the plan's model: {ours / 2**20:,.1f} MiB "
          f"({ours / expected - 1:+.3%})")
    assert ours == pytest.approx(expected, rel=0.05)
    # the rows are what closes the gap: without them the model and the paper disagree by more (except where the rows
    # cancel out: full recomputation has none, the narrow shape's tp+sp+selective rows sum to 0)
    if abs(expected - theirs) > 0.05 * theirs:
        assert abs(ours - theirs) > 0.05 * theirs


def _sample(recompute: str, sp: bool = True):
    """samples/gpt3_175b.scale with `recompute` and sequence parallelism on or off (compiled: the A100 default)."""
    from pathlib import Path
    text = (Path(__file__).resolve().parents[1] / "samples" / "gpt3_175b.scale").read_text()
    text = text.replace("recompute = full", f"recompute = {recompute}")
    text = text.replace("sequence_parallel = true", f"sequence_parallel = {str(sp).lower()}")
    return compile_spec(check_text(text, "gpt3_175b.scale"))


@pytest.mark.parametrize("sp", [True, False], ids=["sp", "no-sp"])
def test_selective_never_keeps_more_than_none(sp):
    """GPT-3 175B (the sample, compiled on its A100s as the default has it): selective recomputation keeps less
    per layer, per stage and at every pp rank's peak than no recomputation, and full less than selective. It once
    predicted more (25.65 GB against 23.32 GB on pp rank 0): a row-parallel matmul's partial sum was counted as
    kept because the stream it joins is read in backward, though its reduce-scatter's (saved) output is what the
    recomputation starts from."""
    plans = {mode: _sample(mode, sp) for mode in ("none", "selective", "full")}
    assert all(c.plan.compiles for c in plans.values())
    kept = {mode: [c.model.kept_per_micro_batch(c.plan, k) for k in range(len(c.costs.stages))]
            for mode, c in plans.items()}
    for k in range(len(kept["none"])):
        assert kept["full"][k] < kept["selective"][k] < kept["none"][k], k
    acts = {mode: [r.activations for r in c.costs.memory] for mode, c in plans.items()}
    for r in range(len(acts["none"])):
        assert acts["full"][r] < acts["selective"][r] < acts["none"][r], r
