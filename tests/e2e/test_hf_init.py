"""A tiny Hugging Face model imported whole: its config.json through `scalec import` (compiler/importer.py), its
weights through `init = from(...)` (runtime/hf.py), trained under parallel plans. Every rank reads its own part (tp
slices, Phi-3's as rows of its fused tensors, Gemma's layers several to a block, pp stages, ep experts), the first step's loss is the one transformers computes on the same batch, and the
run trains like the single-device run from the same weights (fp32, 1e-5). The runs of EXPORTED also write a
checkpoint, which `scalec export` writes back as a Hugging Face checkpoint: transformers loads it with no missing or
unexpected key, every tensor (each expert's of every layer) the checkpoint's, each moved by the steps from the
start."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from compiler import export as X
from compiler.importer import import_config
from runtime import data
from tests.e2e.runner import ROOT, assert_same_training, launch, single_device
from tests.test_hf_weights import gemma_model, hf_model

pytestmark = pytest.mark.e2e

MESHES = {
    "dp2_tp2": ("llama", "axis dp = 2\n  axis tp = 2\n  devices_per_node = 4", 4, ()),
    "pp2": ("llama", "axis pp = 2\n  devices_per_node = 2", 2, (("micro_batches = 1", "micro_batches = 2"),)),
    "ep2_mixtral": ("mixtral", "axis ep = 2\n  devices_per_node = 2", 2, ()),
    # Qwen2-MoE: each tp rank reads its column and row slices of the shared expert, each ep rank its experts
    "tp2_ep2_qwen2_moe": ("qwen2_moe", "axis tp = 2\n  axis ep = 2\n  devices_per_node = 4", 4, ()),
    # Qwen3-MoE: each pp rank reads its stage's layers, each ep rank its experts of them; then exported (EXPORTED)
    "ep2_pp2_qwen3_moe": ("qwen3_moe", "axis pp = 2\n  axis ep = 2\n  devices_per_node = 4", 4,
                          (("micro_batches = 1", "micro_batches = 2"),)),
    # Phi-3: each tp rank reads its column shard of q, k, v as rows of the fused qkv_proj, of gate and up as rows of
    # gate_up_proj; its 8-token window of the 32
    "tp2_phi3": ("phi3", "axis tp = 2\n  devices_per_node = 2", 2, ()),
    # Gemma 2: pairs of layers a block, each tp rank its heads' and vocabulary's share of the soft-capped scores and
    # logits; Gemma 3: two blocks of three layers (the stack runtime/hf_names.py reads by), a block a stage (a
    # pipeline cuts the blocks of consecutive repeats: Gemma-3-1B's two, 4 × 6 + 2 layers, are one sequence of 5)
    "dp2_tp2_gemma2": ("gemma2", "axis dp = 2\n  axis tp = 2\n  devices_per_node = 4", 4, ()),
    "pp2_gemma3": ("gemma3_whole", "axis pp = 2\n  devices_per_node = 2", 2,
                   (("micro_batches = 1", "micro_batches = 2"),)),
}

# Cases whose run writes a checkpoint (its last step) and exports it: an export under ep (× pp) keeps every expert of
# every stage (Megatron-Bridge#1716 lost the expert shards of EP > 1; Megatron-LM#5844 dropped every expert weight),
# in Mixtral's layout and in Qwen-MoE's
EXPORTED = {"ep2_mixtral", "ep2_pp2_qwen3_moe"}


# The slow tier (`pytest --slow -m slow`, docs/testing.md): Gemma 2 under dp × tp, Gemma 3 under pp and Qwen2-MoE
# under tp × ep (77 s of a loaded full run); their names and layouts are read in CI by tests/test_hf_weights.py and
# the gemma2 export round trip, sharded weights read by dp2_tp2, tp2_phi3 and ep2_pp2_qwen3_moe.
SLOW_MESHES = {"dp2_tp2_gemma2", "pp2_gemma3", "tp2_ep2_qwen2_moe",
               # 22 s: a pipeline's stages reading their shards of a checkpoint, which ep2_pp2_qwen3_moe does in CI
               "pp2",
               # 37 s loaded: experts' shards read and exported under ep, which ep2_pp2_qwen3_moe does in CI (Mixtral's
               # names and layout: tests/test_hf_weights.py and the import tests)
               "ep2_mixtral"}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_MESHES else c
                                  for c in sorted(MESHES)])
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
    ref_text = single_device(text)
    if case in EXPORTED:
        text = text.replace("steps        = 3", f'steps        = 3\n  checkpoint_dir = "{tmp_path / "ckpt"}"')
    run = launch(text, case, tmp_path, steps=3, timeout=300, nproc=nproc, memory_report=False)
    ref = launch(ref_text, "single", tmp_path, steps=3, timeout=300, nproc=1, memory_report=False)
    assert_same_training(run, ref)
    said = [line for line in run.output.splitlines() if line.startswith("scalec: weights from ")]
    assert said and f"weights from {tmp_path / 'hf'}:" in said[0] and "this rank read" in said[0], run.output[-2000:]
    tokens, targets = data.Synthetic(128, 32, 1234).samples(0, 8, 0, 8)
    with torch.no_grad():
        want = torch.nn.functional.cross_entropy(ref_model(input_ids=tokens).logits.flatten(0, 1),
                                                 targets.flatten()).item()
    assert run.losses[0] == pytest.approx(want, rel=1e-5)
    if case in EXPORTED:
        _export_round_trips(tmp_path, text, kind)


# Where a layout's files hold expert e's gate, up and down projections and the router: {layer}.{where}.{e}.{leaf}
EXPERT_FILES = {"mixtral": ("block_sparse_moe", "experts", ("w1", "w3", "w2")),
                "qwen_moe": ("mlp", "experts", ("gate_proj", "up_proj", "down_proj"))}


def _export_round_trips(tmp_path, text: str, kind: str) -> None:
    """`scalec export` of the run's checkpoint: the source checkpoint's tensor names exactly, each the checkpoint's
    bit for bit and moved from the source's; transformers loads it with no missing or unexpected key and holds those
    tensors (transformers 5 fuses a layer's experts in memory, `mlp.experts.gate_up_proj[e]` expert e's gate rows
    then its up rows, `mlp.experts.down_proj[e]` its down projection, and names Mixtral's router `mlp.gate`)."""
    from safetensors.torch import load_file
    transformers = pytest.importorskip("transformers")
    (step,) = sorted((tmp_path / "ckpt").glob("step_*"))
    (tmp_path / "m.scale").write_text(text)
    out = subprocess.run([sys.executable, "-m", "compiler.cli", "export", str(tmp_path / "m.scale"), str(step), "-o",
                          str(tmp_path / "exported")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    layout = "mixtral" if kind == "mixtral" else "qwen_moe"
    ours = X.hf_tensors(X.read_checkpoint(str(step)), layout)
    written = load_file(tmp_path / "exported" / "model.safetensors")
    started = load_file(tmp_path / "hf" / "model.safetensors")
    assert written.keys() == started.keys(), written.keys() ^ started.keys()  # no tensor lost, none added
    assert ours.keys() == written.keys(), ours.keys() ^ written.keys()
    module, experts, (gate, up, down) = EXPERT_FILES[layout]
    assert sum(f".{module}.{experts}." in name for name in written) == 4 * 4 * 3  # layers × experts × gate, up, down
    for name, t in ours.items():
        assert torch.equal(written[name], t), name
        assert not torch.equal(t, started[name]), f"{name} is the starting weight: the steps did not move it"
    back, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "exported", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    params = {name: p.detach() for name, p in back.named_parameters()}
    fused = 0
    for name, p in params.items():
        layer = name.partition(".mlp.")[0]
        if name.endswith(".mlp.experts.gate_up_proj"):
            for e in range(p.shape[0]):
                stem = f"{layer}.{module}.{experts}.{e}."
                assert torch.equal(p[e], torch.cat([written[f"{stem}{gate}.weight"],
                                                    written[f"{stem}{up}.weight"]])), (name, e)
            fused += p.shape[0]
        elif name.endswith(".mlp.experts.down_proj"):
            for e in range(p.shape[0]):
                assert torch.equal(p[e], written[f"{layer}.{module}.{experts}.{e}.{down}.weight"]), (name, e)
            fused += p.shape[0]
        else:
            stored = f"{layer}.{module}.gate.weight" if name.endswith(".mlp.gate.weight") else name
            assert torch.equal(p, written[stored]), f"transformers read {name} otherwise"
    assert fused == 4 * 4 * 2  # every expert of every layer, in transformers' gate_up_proj and down_proj
