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

from runtime.compile import PARTITIONER
from tests.test_memory import ROOT, _program, count_saved

# PARTITIONER: what decides a compiled region's saved tensors is AOTAutograd's min-cut partitioner over inductor's
# decompositions; this backend runs that and not inductor's code generation, whose C++ kernels take 40 s to build on
# a cold cache here. Measured on torch 2.13: the three modes below keep the same bytes under both backends (4,768,260,
# 2,910,596 and 813,444); the slow tier holds inductor's own to the same figures.


@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_compiled_program_keeps_what_the_formula_says(tmp_path, mode):
    """What the partitioner keeps, decided as inductor decides it (PARTITIONER)."""
    _kept_against_formula(tmp_path, mode, PARTITIONER)


# The slow tier (40 s on a cold inductor cache, as CI's always is): the same under inductor itself; inductor's
# programs against the single device: the e2e table's compiled cases (CI: tp2_sp_recompute_selective_compile; the
# other three in the slow tier)
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_inductor_keeps_what_the_partitioner_keeps(tmp_path, mode):
    """Inductor's program keeps the model's figure too (and so what PARTITIONER keeps: both within the same 3%)."""
    _kept_against_formula(tmp_path, mode, "inductor")


def _kept_against_formula(tmp_path, mode: str, backend: str) -> None:
    from runtime import compile as compiled_regions
    from runtime.parallelize import apply_recompute
    text = (ROOT / "samples" / "tiny_gpt.scale").read_text()
    text = text.replace("mesh {", f"plan {{\n  recompute = {mode}\n  compile = true\n}}\n\nmesh {{", 1)
    compiled, prog = _program(tmp_path, text)
    sys.modules[prog.__name__] = prog  # dynamo looks the program's module up by name
    assert prog.CONFIG.parallel.compile
    torch.manual_seed(0)
    model = compiled_regions.apply(apply_recompute(prog.Model(), mode), backend)
    b, cfg = compiled.plan.micro_batch_size, prog.CONFIG
    tokens, targets = (torch.randint(0, cfg.data.vocab, (b, cfg.data.seq_len)) for _ in range(2))
    model(tokens, targets).backward()  # compiles (outside the count)
    holder = {}
    got = count_saved(model, lambda: holder.setdefault("loss", model(tokens, targets)), "fp32")
    holder["loss"].backward()
    predicted = compiled.costs.memory[0].activations
    print(f"{mode}: kept {got:,}, predicted {predicted:,.0f}, ratio {got / predicted:.4f}")
    assert got == pytest.approx(predicted, rel=0.03), f"{mode}: kept {got:,}, predicted {predicted:,.0f}"


def _tp_sp_selective(path: str, predicted: float, rank: int, C, cp: int = 1) -> None:
    """One rank of a tp = 2 program with sequence parallelism (or of a cp = `cp` program: its S/cp tokens),
    compiled under selective recomputation: what its regions keep for backward, counted as above, against the
    model's figure for that rank (within 3%)."""
    import importlib.util
    from runtime import compile as compiled_regions
    from runtime.parallelize import apply_recompute
    spec = importlib.util.spec_from_file_location("prog_tp_sp_selective", path)
    prog = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = prog
    spec.loader.exec_module(prog)
    torch.manual_seed(0)
    model = compiled_regions.apply(apply_recompute(prog.Model(), "selective"))
    cfg = prog.CONFIG
    tokens, targets = (torch.randint(0, cfg.data.vocab, (cfg.parallel.micro_batch_size, cfg.data.seq_len // cp))
                       for _ in range(2))
    model(tokens, targets).backward()  # compiles (outside the count)
    holder = {}
    got = count_saved(model, lambda: holder.setdefault("loss", model(tokens, targets)), "fp32")
    holder["loss"].backward()
    print(f"rank {rank}: kept {got:,}, predicted {predicted:,.0f}, ratio {got / predicted:.4f}")
    assert got == pytest.approx(predicted, rel=0.03), f"rank {rank}: kept {got:,}, predicted {predicted:,.0f}"


# The slow tier (21 s of a quiet full run): the e2e table's tp2_sp_recompute_selective_compile runs the same compiled
# plan (gpt_tp, tp 2, sp, selective) against the single device with its memory checked against the same prediction
@pytest.mark.slow
@pytest.mark.e2e
def test_compiled_sequence_parallel_selective_keeps_the_gathered_inputs_sharded(tmp_path):
    """tp = 2 with sequence parallelism under selective recomputation, compiled: the partitioner gathers each
    block's sequence-parallel inputs again in backward (runtime.recompute.RECOMPUTE marks the all-gather and its wait
    MUST_RECOMPUTE, which exempts them from its rule that saves every collective) instead of keeping them whole, as
    the model says (compiler/cost/activations.py: the all-gathers are not among what selective keeps). Kept whole,
    the two gathered norm outputs of each block would be 35% over the figure (measured before the policy)."""
    import functools
    from tests import multirank
    from tests.test_memory import _program
    text = (ROOT / "samples" / "gpt_tp.scale").read_text().replace(
        "sequence_parallel = false", "sequence_parallel = true  recompute = selective  compile = true")
    compiled, _ = _program(tmp_path, text)
    multirank.spawn(functools.partial(_tp_sp_selective, str(tmp_path / "build" / "program.py"),
                                      compiled.costs.memory[0].activations))


# The slow tier (`pytest --slow -m slow`, docs/testing.md): compiled cp (86 s of a loaded full run, both variants
# in the slow tier's e2e cases too); compiled regions' memory in CI: the three modes above and sequence parallelism.
@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("variant", ["all_gather", "all_to_all"])
def test_compiled_context_parallel_selective_keeps_what_the_formula_says(tmp_path, variant):
    """cp = 2 (GQA, rotary, RMSNorm, SwiGLU), compiled under selective recomputation: each rank's regions keep
    the model's figure for its S/cp tokens. all_gather: the keys and values gathered again in backward, so their
    projections (before the gather) are kept. all_to_all: the all-to-alls' outputs kept, and nothing before them,
    since a rotation's backward reads only its angles (compiler/ops.py `passes_grad`): counted before that, the
    model was 12% over (measured 1,983,492 bytes kept a rank against 2,233,472 predicted)."""
    import functools
    from tests import multirank
    from tests.e2e.cases import GQA
    from tests.e2e.runner import with_plan
    text = (ROOT / "samples" / "gpt_tp.scale").read_text()
    for old, new in GQA:
        text = text.replace(old, new)
    text = with_plan(text, axes=(("cp", 2),), context_parallel=variant, recompute="selective", compile=True)
    compiled, _ = _program(tmp_path, text)
    multirank.spawn(functools.partial(_tp_sp_selective, str(tmp_path / "build" / "program.py"),
                                      compiled.costs.memory[0].activations, cp=2), axes=("cp",))
