"""The memory model against what a compiled program keeps for backward (`plan { compile = true }`).

A compiled region's saved tensors are what AOTAutograd's partitioner chose, not what each eager op saves; autograd
still packs them through torch.autograd.graph.saved_tensors_hooks, so they are counted on CPU in the generated
program itself, as tests/test_memory.py counts the eager program (runtime.memory's tracker, a dispatch mode, would
make the regions run eagerly and measure the eager program instead). Without recomputation the partitioner keeps
what eager autograd keeps; under selective recomputation it keeps only the policy's saved outputs that the
backward reads (compiler/cost/activations.py, `selective/compiled`); under full, each block's input.
"""
from __future__ import annotations

import sys

import pytest
import torch

from tests.test_memory import ROOT, _program, count_saved


@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_compiled_program_keeps_what_the_formula_says(tmp_path, mode):
    from runtime import compile as compiled_regions, recompute
    text = (ROOT / "samples" / "tiny_gpt.scale").read_text()
    text = text.replace("mesh {", f"plan {{\n  recompute = {mode}\n  compile = true\n}}\n\nmesh {{", 1)
    compiled, prog = _program(tmp_path, text)
    sys.modules[prog.__name__] = prog  # dynamo looks the program's module up by name
    assert prog.CONFIG.parallel.compile
    torch.manual_seed(0)
    model = compiled_regions.apply(recompute.apply(prog.Model(), mode))
    b, cfg = compiled.plan.micro_batch_size, prog.CONFIG
    tokens, targets = (torch.randint(0, cfg.data.vocab, (b, cfg.data.seq_len)) for _ in range(2))
    model(tokens, targets).backward()  # compiles (outside the count)
    holder = {}
    got = count_saved(model, lambda: holder.setdefault("loss", model(tokens, targets)), "fp32")
    holder["loss"].backward()
    predicted = compiled.costs.memory[0].activations
    print(f"{mode}: kept {got:,}, predicted {predicted:,.0f}, ratio {got / predicted:.4f}")
    assert got == pytest.approx(predicted, rel=0.03), f"{mode}: kept {got:,}, predicted {predicted:,.0f}"
