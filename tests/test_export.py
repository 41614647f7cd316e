"""`scalec export FILE CHECKPOINT -o DIR` (compiler/export.py): a run's checkpoint as a Hugging Face checkpoint.
A tiny Llama and a tiny Mixtral from transformers are trained one step from their weights (so the checkpoint is not
the file they started from), saved, exported; transformers loads the export and holds bit for bit the
checkpoint's tensors, and so does `init = from(export)` read back by the runtime."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from compiler import export as X
from compiler.check import check_text
from tests.e2e.runner import ROOT, launch
from tests.test_hf_weights import hf_model, scale_text

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("kind", ["llama", "mixtral"])
def test_export_round_trips_bit_exactly(tmp_path, kind):
    hf_model(kind, tmp_path / "hf")
    text = scale_text(kind, tmp_path / "hf").replace("steps        = 3", f'steps        = 1\n  checkpoint_dir = "{tmp_path / "ckpt"}"')
    launch(text, "one_step", tmp_path, steps=1, timeout=240, nproc=1, dump_grads=False, count_bytes=False)
    (step,) = sorted((tmp_path / "ckpt").glob("step_*"))
    (tmp_path / "m.scale").write_text(text)
    out = subprocess.run([sys.executable, "-m", "compiler.cli", "export", str(tmp_path / "m.scale"), str(step), "-o",
                          str(tmp_path / "exported")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    saved = X.read_checkpoint(str(step))
    started = dict(transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").named_parameters())
    # transformers reads the export: its tensors are the checkpoint's, which one step moved from the start
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "exported")
    config = json.loads((tmp_path / "exported" / "config.json").read_text())
    assert config["model_type"] == ("mixtral" if kind == "mixtral" else "llama")
    ours = X.hf_tensors(saved)
    from safetensors.torch import load_file
    written = load_file(tmp_path / "exported" / "model.safetensors")
    assert written.keys() == ours.keys()
    for name, t in ours.items():
        assert torch.equal(written[name], t), name
    matched = 0
    for name, p in back.named_parameters():
        if name in ours:  # all of Llama's; Mixtral's but the experts and router (fused in memory by transformers 5)
            assert torch.equal(p.detach(), ours[name]), f"transformers read {name} otherwise"
            assert not torch.equal(p, started[name]), f"{name} is the starting weight: the step did not move it"
            matched += 1
    assert matched == (len(ours) if kind == "llama" else 4 * 6 + 3)
    # and the runtime reads the export back to the checkpoint's tensors
    from runtime import hf
    _, prog = __import__("tests.test_memory", fromlist=["_program"])._program(
        tmp_path / "again", scale_text(kind, tmp_path / "exported"))
    model = prog.Model()
    model.to_empty(device="cpu")
    hf.load(model, str(tmp_path / "exported"))
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), saved[name]), name


def test_a_model_without_a_counterpart_is_refused():
    spec = check_text((ROOT / "samples" / "tiny_gpt.scale").read_text(), "tiny_gpt.scale")
    with pytest.raises(X.ExportError, match="learned positions"):
        X.hf_config(spec)
