"""A tiny Hugging Face model imported whole: its config.json through `scalec import` (compiler/importer.py), its
weights through `init = from(...)` (runtime/hf.py), trained under parallel plans. Every rank reads its own part (tp
slices, Phi-3's as rows of its fused tensors, Gemma's layers several to a block, pp stages, ep experts), the first step's loss is the one transformers computes on the same batch, and the
run trains like the single-device run from the same weights (fp32, 1e-5)."""
from __future__ import annotations

import pytest
import torch

from compiler.importer import import_config
from runtime import data
from tests.e2e.runner import assert_same_training, launch, single_device
from tests.test_hf_weights import gemma_model, hf_model

pytestmark = pytest.mark.e2e

MESHES = {
    "dp2_tp2": ("llama", "axis dp = 2\n  axis tp = 2\n  devices_per_node = 4", 4, ()),
    "pp2": ("llama", "axis pp = 2\n  devices_per_node = 2", 2, (("micro_batches = 1", "micro_batches = 2"),)),
    "ep2_mixtral": ("mixtral", "axis ep = 2\n  devices_per_node = 2", 2, ()),
    # Qwen2-MoE: each tp rank reads its column and row slices of the shared expert, each ep rank its experts
    "tp2_ep2_qwen2_moe": ("qwen2_moe", "axis tp = 2\n  axis ep = 2\n  devices_per_node = 4", 4, ()),
    # Phi-3: each tp rank reads its column shard of q, k, v as rows of the fused qkv_proj, of gate and up as rows of
    # gate_up_proj; its 8-token window of the 32
    "tp2_phi3": ("phi3", "axis tp = 2\n  devices_per_node = 2", 2, ()),
    # Gemma 2: pairs of layers a block, each tp rank its heads' and vocabulary's share of the soft-capped scores and
    # logits; Gemma 3: two blocks of three layers (the stack runtime/hf_names.py reads by), a block a stage (a
    # pipeline cuts one repeat: Gemma-3-1B's two, 4 × 6 + 2 layers, are refused under pp, E0605)
    "dp2_tp2_gemma2": ("gemma2", "axis dp = 2\n  axis tp = 2\n  devices_per_node = 4", 4, ()),
    "pp2_gemma3": ("gemma3_whole", "axis pp = 2\n  devices_per_node = 2", 2,
                   (("micro_batches = 1", "micro_batches = 2"),)),
}


@pytest.mark.parametrize("case", sorted(MESHES))
def test_parallel_run_starts_from_the_checkpoint(tmp_path, case):
    kind, mesh, nproc, edits = MESHES[case]
    ref_model = (gemma_model if kind.startswith("gemma") else hf_model)(kind, tmp_path / "hf")
    config = tmp_path / "hf" / "config.json"
    text = import_config(config.read_text(), str(config)) + f"""
mesh {{
  {mesh}
}}
plan {{
  micro_batches = 1
}}
train {{
  global_batch = 8
  seq_len      = seq
  steps        = 3
  optimizer    = adamw(lr = 1e-3)
  init         = from("{tmp_path / 'hf'}")
}}
"""
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    run = launch(text, case, tmp_path, steps=3, timeout=300, nproc=nproc, memory_report=False)
    ref = launch(single_device(text), "single", tmp_path, steps=3, timeout=300, nproc=1, memory_report=False)
    assert_same_training(run, ref)
    said = [line for line in run.output.splitlines() if line.startswith("scalec: weights from ")]
    assert said and f"weights from {tmp_path / 'hf'}:" in said[0] and "this rank read" in said[0], run.output[-2000:]
    tokens, targets = data.Synthetic(128, 32, 1234).samples(0, 8, 0, 8)
    with torch.no_grad():
        want = torch.nn.functional.cross_entropy(ref_model(input_ids=tokens).logits.flatten(0, 1),
                                                 targets.flatten()).item()
    assert run.losses[0] == pytest.approx(want, rel=1e-5)
