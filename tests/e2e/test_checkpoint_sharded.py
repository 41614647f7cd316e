"""Checkpoints of sharded state resume on other layouts (tests/e2e/test_checkpoint.py's module docstring): experts
over ep, FSDP over dp with tp, ep or cp, ZeRO-1's partitions, bf16's fp32 masters."""
from __future__ import annotations

import pytest
import torch

from tests.e2e.checkpointing import ONE, STEPS, STOP, TIMEOUT, _interrupt, _resume, _same, _sample
from tests.e2e.checkpointing import reference  # noqa: F401 (the fixture its tests name)
from tests.e2e.runner import launch, on_plan

pytestmark = pytest.mark.e2e


# In CI again (8 s with the forked launches of tests/e2e/zygote.py; it was in the slow tier for the suite's budget,
# while test_moe_fsdp_ep_resumes_on_one_device, also slow, named it as CI's): CI's one resume of the experts'
# DTensors and their AdamW state on another plan
def test_moe_ep2_resumes_on_ep4_with_tp(reference, tmp_path):
    """Experts as DTensors over ep (with their AdamW state), dense weights over tp: ep = 2 to tp = 2 × ep = 4."""
    text = _sample("moe_gpt")
    first, ckpt = _interrupt(text, "ep2", tmp_path)
    target = on_plan(text, axes=(("tp", 2), ("ep", 4)), devices_per_node=8, micro_batches=2)
    second = _resume(target, "ep2_to_tp2_ep4", tmp_path, ckpt, nproc=8)
    _same(first.losses + second.losses, reference(text))


# The slow tier (`pytest --slow -m slow`; 68 s of a loaded full run): FSDP's DTensors resume on one device in CI
# (test_fsdp_tp_resumes_on_one_device), experts over ep on another ep (test_moe_ep2_resumes_on_ep4_with_tp)
@pytest.mark.slow
def test_moe_fsdp_ep_resumes_on_one_device(reference, tmp_path):
    """FSDP with ep (dense weights sharded over dp × ep, experts over ep then dp) and DeepSeek-V3's expert bias,
    moved after each step: saved on dp 2 × ep 2, resumed on one device (no ep), the bias and every expert whole."""
    text = _sample("moe_gpt", ("dropped = residual)", "dropped = residual, bias_update = 0.05)"),
                   axes=(("dp", 2), ("ep", 2)), devices_per_node=4, data_parallel="fsdp")
    first, ckpt = _interrupt(text, "dp2_ep2_fsdp", tmp_path)
    second = _resume(on_plan(text, **ONE), "dp2_ep2_fsdp_to_one", tmp_path, ckpt, nproc=1)
    _same(first.losses + second.losses, reference(text))


def test_fsdp_tp_resumes_on_one_device(reference, tmp_path):
    """FSDP over dp with tp: each piece is gathered over dp and stored as a tp shard, scattered back after a load."""
    text = _sample("gpt_2d", data_parallel="fsdp")
    first, ckpt = _interrupt(text, "dp2_tp2_fsdp", tmp_path)
    second = _resume(on_plan(text, **ONE), "fsdp_tp_to_one", tmp_path, ckpt, nproc=1)
    _same(first.losses + second.losses, reference(text))


# The slow tier (`pytest --slow -m slow`, docs/testing.md; 65 s of a loaded full run): FSDP's DTensors resume on one
# device in CI from dp × tp and dp × ep; FSDP over dp × cp trains in CI (e2e dp2_cp2_fsdp).
@pytest.mark.slow
def test_fsdp_over_dp_cp_resumes_on_one_device(reference, tmp_path):
    """FSDP over dp × cp (the weights and AdamW's state sharded over all four ranks, the flattened mesh's DTensors):
    saved whole, resumed on one device as the single device continues."""
    text = _sample("gpt_dp", axes=(("dp", 2), ("cp", 2)), devices_per_node=4, data_parallel="fsdp")
    first, ckpt = _interrupt(text, "dp2_cp2_fsdp", tmp_path, nproc=4)
    second = _resume(on_plan(text, **ONE), "dp2_cp2_fsdp_to_one", tmp_path, ckpt, nproc=1)
    _same(first.losses + second.losses, reference(text))


# The slow tier (`pytest --slow -m slow`; 44 s of a loaded full run): zero1's partitions resume in CI in bf16
# (test_bf16_zero1_resumes_bitwise_and_its_masters_load_into_fp32: the same plan bitwise, and fp32 on one device)
@pytest.mark.slow
def test_zero1_resumes_on_zero1(reference, tmp_path):
    """zero1 (ZeroRedundancyOptimizer): each dp rank writes and reads the AdamW state of its own partition only;
    read back by zero1 (each rank its partition again), training continues as the single-device run does, which
    it could not if a partition's state were missing from the checkpoint (AdamW restarted on those parameters)."""
    text = _sample("gpt_dp", data_parallel="zero1")
    first, ckpt = _interrupt(text, "dp2_zero1", tmp_path)
    again = _resume(text, "dp2_zero1_again", tmp_path, ckpt)
    _same(first.losses + again.losses, reference(text))


def test_bf16_zero1_resumes_bitwise_and_its_masters_load_into_fp32(tmp_path):
    """bf16 (runtime/precision.py): the checkpoint holds the fp32 masters (each zero1 rank its partition's) and
    AdamW's moments, not the bf16 weights, so the same plan resumes bitwise (the bf16 weights recast from the
    masters and broadcast by their owners), and an fp32 plan on one device resumes from it."""
    text = _sample("gpt_dp", ("precision    = fp32", "precision    = bf16"), data_parallel="zero1")
    first, ckpt = _interrupt(text, "dp2_zero1_bf16", tmp_path)
    import torch.distributed.checkpoint as dcp
    meta = dcp.FileSystemReader(str(ckpt / f"step_{STOP:08d}")).read_metadata().state_dict_metadata
    model = {k: v.properties.dtype for k, v in meta.items() if k.startswith("model.")}
    assert model and set(model.values()) == {torch.float32}, model  # the masters, every parameter once
    assert not [k for k in meta if k.endswith(".master")]  # stored as the parameter, not as optimizer state
    again = _resume(text, "dp2_zero1_bf16_again", tmp_path, ckpt)
    whole = launch(text, "dp2_zero1_bf16_whole", tmp_path, steps=STEPS, timeout=TIMEOUT, dump_grads=False)
    assert first.losses + again.losses == whole.losses  # bitwise
    fp32 = _resume(on_plan(text.replace("precision    = bf16", "precision    = fp32"), **ONE), "bf16_to_fp32_one",
                   tmp_path, ckpt, nproc=1)
    _same(fp32.losses, again.losses, rtol=2e-3)  # the same model state, continued in fp32 rather than bf16
