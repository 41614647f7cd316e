"""A run that starts from a Hugging Face checkpoint (`init = from(...)`, runtime/hf.py) under parallel plans: every
rank reads its own part (tp slices, pp stages, ep experts), the first step's loss is the one transformers computes
on the same batch, and the run trains like the single-device run from the same weights (fp32, 1e-5)."""
from __future__ import annotations

import pytest
import torch

from runtime import data
from tests.e2e.runner import assert_same_training, launch, single_device
from tests.test_hf_weights import hf_model, scale_text

pytestmark = pytest.mark.e2e

MESHES = {
    "dp2_tp2": ("llama", "axis dp = 2\n  axis tp = 2\n  devices_per_node = 4", 4, ()),
    "pp2": ("llama", "axis pp = 2\n  devices_per_node = 2", 2, (("micro_batches = 1", "micro_batches = 2"),)),
    "ep2_mixtral": ("mixtral", "axis ep = 2\n  devices_per_node = 2", 2, ()),
}


@pytest.mark.parametrize("case", sorted(MESHES))
def test_parallel_run_starts_from_the_checkpoint(tmp_path, case):
    kind, mesh, nproc, edits = MESHES[case]
    ref_model = hf_model(kind, tmp_path / "hf")
    text = scale_text(kind, tmp_path / "hf").replace("axis dp = 1\n  devices_per_node = 1", mesh)
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    run = launch(text, case, tmp_path, steps=3, timeout=300, nproc=nproc, memory_report=False)
    ref = launch(single_device(text), "single", tmp_path, steps=3, timeout=300, nproc=1, memory_report=False)
    assert_same_training(run, ref)
    tokens, targets = data.Synthetic(128, 32, 1234).samples(0, 8, 0, 8)
    with torch.no_grad():
        want = torch.nn.functional.cross_entropy(ref_model(input_ids=tokens).logits.flatten(0, 1),
                                                 targets.flatten()).item()
    assert run.losses[0] == pytest.approx(want, rel=1e-5)
