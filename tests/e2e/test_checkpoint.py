"""Checkpoints are one layout-independent form: a run interrupted on one plan and resumed on another continues as
it would have (the losses of the resumed steps are the uninterrupted run's, fp32, relative 1e-5; on the same plan,
bitwise), and broken checkpoints, kills during a save and bad directories are handled (module docstring of
runtime/checkpoint.py).

Each run is STEPS = 4 steps, interrupted after 2 (warm-up 1 step, so the resumed steps are on the cosine part of
the schedule). The reference is the single-device run of the same model, which every plan of the e2e table
matches to 1e-5: the uninterrupted run on the original plan.

This file: dense layouts (tp, tp + sp, cp, a padded vocabulary, dp × pp × tp, interleaved and zero-bubble
pipelines); test_checkpoint_sharded.py: sharded state (ep, FSDP, ZeRO-1, bf16 masters); test_checkpoint_drills.py:
kills during a save, asynchronous saves, broken checkpoints and directories. The helpers: tests/e2e/checkpointing.py."""
from __future__ import annotations

import pytest

from tests.e2e.checkpointing import DP2, ONE, PP4, STEPS, TIMEOUT, TP2, _interrupt, _resume, _same, _sample
from tests.e2e.checkpointing import reference  # noqa: F401 (the fixture its tests name)
from tests.e2e.runner import launch, on_plan

pytestmark = pytest.mark.e2e


# The slow tier (`pytest --slow -m slow`; 51 s of a loaded full run): a tp 2 checkpoint is read in CI by
# test_padded_vocab_resumes_on_one_device (each shard under its piece's name), a same-plan resume is bitwise in CI
# in test_bf16_zero1_resumes_bitwise_and_its_masters_load_into_fp32
@pytest.mark.slow
def test_tp2_resumes_on_tp2_bitwise(tmp_path):
    """The defect: each tp rank saved its shard under the whole tensor's name. Now the same plan resumes bitwise
    (one device loading a tp2 checkpoint: test_padded_vocab_resumes_on_one_device)."""
    text = _sample("gpt_tp")
    first, ckpt = _interrupt(text, "tp2", tmp_path)
    again = _resume(text, "tp2_again", tmp_path, ckpt)
    whole = launch(text, "tp2_whole", tmp_path, steps=STEPS, timeout=TIMEOUT, dump_grads=False)
    assert first.losses + again.losses == whole.losses  # bitwise


# The slow tier (`pytest --slow -m slow`, docs/testing.md; 95 s of a loaded full run): a tp + sp checkpoint is
# resumed on another layout in CI by test_3d_resumes_on_pp4 (gpt_3d's tp runs sp), dp 2 resumes by the zero1 tests.
@pytest.mark.slow
def test_tp2_sp_resumes_on_dp2(reference, tmp_path):
    text = _sample("gpt_tp", sequence_parallel=True)
    first, ckpt = _interrupt(text, "tp2_sp", tmp_path)
    second = _resume(on_plan(text, **DP2), "tp2_sp_to_dp2", tmp_path, ckpt, nproc=2)
    _same(first.losses + second.losses, reference(text))


def test_cp2_resumes_on_one_device(reference, tmp_path):
    """cp shards no weight (issue 24): a cp 2 checkpoint (written by cp rank 0, every weight and moment whole) is
    the layout-independent form as it stands; one device reads it and continues as the single device does."""
    text = _sample("gpt_tp", axes=(("cp", 2),), devices_per_node=2, context_parallel="all_gather")
    first, ckpt = _interrupt(text, "cp2", tmp_path, nproc=2)
    one = _resume(on_plan(text, **ONE), "cp2_to_one", tmp_path, ckpt, nproc=1)
    _same(first.losses + one.losses, reference(text))


# Slow tier (the suite's 15-minute budget): tp 2 reading a checkpoint whose weights are whole is what the padded
# vocabulary's and fsdp × tp's resumes prove in the other direction, and tests/test_reshard.py cuts the pieces
@pytest.mark.slow
def test_cp2_resumes_on_tp2(reference, tmp_path):
    text = _sample("gpt_tp", axes=(("cp", 2),), devices_per_node=2, context_parallel="all_gather")
    first, ckpt = _interrupt(text, "cp2", tmp_path, nproc=2)
    tp2 = _resume(on_plan(text, **TP2), "cp2_to_tp2", tmp_path, ckpt, nproc=2)
    _same(first.losses + tp2.losses, reference(text))


def test_padded_vocab_resumes_on_one_device(reference, tmp_path):
    """Vocabulary 127 on tp = 2, padded to 128: the last rank's padding row is not stored; one device reads a
    [127, 64] embedding."""
    text = _sample("gpt_tp", ("vocab  = 128", "vocab  = 127"), pad_vocab=True)
    first, ckpt = _interrupt(text, "tp2_pad", tmp_path)
    second = _resume(on_plan(text, **ONE), "tp2_pad_to_one", tmp_path, ckpt, nproc=1)
    _same(first.losses + second.losses, reference(text))


# In CI again (9 s with the forked launches of tests/e2e/zygote.py; it was in the slow tier for the suite's
# budget): the other resumes across stages and tp in the slow tier name it as CI's
def test_3d_resumes_on_pp4(reference, tmp_path):
    """dp × pp × tp (+ sp), 8 ranks: replicas over dp written once, stages merged, the tied embedding written by
    the first stage only; read back as four stages of one block."""
    text = _sample("gpt_3d")
    first, ckpt = _interrupt(text, "dp2_pp2_tp2", tmp_path)
    second = _resume(on_plan(text, **PP4), "3d_to_pp4", tmp_path, ckpt, nproc=4)
    _same(first.losses + second.losses, reference(text))


@pytest.mark.slow  # the slow tier (121 s of a loaded full run): stages resume on another layout in CI by
# test_3d_resumes_on_pp4 (two stages merged, read back as four)
@pytest.mark.parametrize("schedule", [dict(schedule="interleaved-1f1b", virtual_stages=2),
                                      dict(schedule="zero-bubble"), dict(schedule="dualpipev")],
                         ids=["interleaved", "zero_bubble", "dualpipev"])
def test_pp2_resumes_on_tp2(schedule, reference, tmp_path):
    """Two stages per rank (interleaved), the split backward (zero-bubble), and dualpipev's V (stages 0 and 3 on pp
    rank 0, a tied embedding's two copies there, written once); GPipe and 1F1B hold their stages as zero-bubble does
    (one per rank), and a 1F1B checkpoint is resumed by test_3d_resumes_on_pp4."""
    text = _sample("gpt_pp", **schedule)
    first, ckpt = _interrupt(text, "pp2", tmp_path)
    second = _resume(on_plan(text, **TP2), "pp2_to_tp2", tmp_path, ckpt, nproc=2)
    _same(first.losses + second.losses, reference(text))
