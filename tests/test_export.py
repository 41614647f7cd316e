"""`scalec export FILE CHECKPOINT -o DIR` (compiler/export.py): a run's checkpoint as a Hugging Face checkpoint.
A tiny Llama, a tiny Qwen 3 (head_dim of its own, q/k norms) and a tiny Mixtral from transformers are trained one
step from their weights (so the checkpoint is not the file they started from), saved, exported; transformers loads
the export and holds bit for bit the checkpoint's tensors, and so does `init = from(export)` read back by the
runtime."""
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


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["llama", "qwen3", "mixtral"])
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
    assert config["model_type"] == kind
    # what `init = from` started from, but the model's own: the dtype written, and Mixtral's aux_loss = 0 here
    source = json.loads((tmp_path / "hf" / "config.json").read_text())
    own = ("dtype", "torch_dtype", "router_aux_loss_coef")
    assert {k: config[k] for k in source if k not in own} == {k: v for k, v in source.items() if k not in own}
    assert config.get("router_aux_loss_coef", 0.0) == 0.0
    assert (tmp_path / "exported" / "generation_config.json").read_text() == \
        (tmp_path / "hf" / "generation_config.json").read_text()
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
    assert matched == (len(ours) if kind != "mixtral" else 4 * 6 + 3)
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


# One config per family, as transformers writes it, with what the importer does not read: token ids, the saved
# dtype, transformers' initialization scale. The model's positions (128) are longer than what train's seq_len uses.
TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=80, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0,
            initializer_range=0.01, torch_dtype="bfloat16")
FAMILIES = {
    "llama": ("LlamaConfig", dict(rms_norm_eps=1e-5)),
    "llama3": ("LlamaConfig", dict(rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                                                        low_freq_factor=1.0, high_freq_factor=4.0,
                                                        original_max_position_embeddings=16))),
    "mistral": ("MistralConfig", dict(sliding_window=None)),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(head_dim=24)),  # heads of 24 where hidden / heads is 16
    "mistral_nemo": ("MistralConfig", dict(sliding_window=None, head_dim=24)),
    "mixtral": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.02)),
}


def _imported(case: str, directory=None) -> tuple[dict, str]:
    """(a tiny config.json of `case` as transformers writes it, a whole .scale file imported from it, training on
    sequences of 64 of its 128 positions; with `directory`, starting from the checkpoint there)."""
    from compiler.importer import complete, import_config
    cls, extra = FAMILIES[case]
    text = getattr(transformers, cls)(**TINY, **extra).to_json_string()
    scale = complete(import_config(text, "config.json")).replace("seq_len      = seq", "seq_len      = 64")
    if directory is not None:
        scale = scale.replace("steps        = 100", f'steps        = 100\n  init         = from("{directory}")')
    return json.loads(text), scale


@pytest.mark.parametrize("case", sorted(FAMILIES))
def test_import_then_export_gives_back_the_config(case):
    """import → export: every key the importer reads comes back with the file's value (max_position_embeddings
    the model's 128, not train's seq_len 64), the keys it does not read are kept, and what is written imports
    back to the same model."""
    from compiler.importer import IRRELEVANT, USED
    original, scale = _imported(case)
    spec = check_text(scale, "imported.scale")
    got = X.hf_config(spec, original)
    for key, value in original.items():
        assert key in USED[original["model_type"]] or key in IRRELEVANT, key
        assert got[key] == value and type(got[key]) is type(value), (key, got.get(key), value)
    assert got["bos_token_id"] == 1 and got["eos_token_id"] == 2 and got["initializer_range"] == 0.01
    assert X.hf_config(spec)["max_position_embeddings"] == 128  # without the source too


def _checkpoint(tmp_path, scale: str) -> str:
    """A checkpoint of the model of `scale` as the program saves one (torch.distributed.checkpoint, by our names),
    random weights, without a run."""
    import torch.distributed.checkpoint as dcp
    from tests.test_memory import _program
    _, prog = _program(tmp_path / "prog", scale)
    model = prog.Model()
    model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    step = tmp_path / "ckpt" / "step_1"
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(step))
    return str(step)


def test_export_keeps_the_source_checkpoints_keys_and_files(tmp_path, capsys):
    """A model started `from(DIR)`: the export's config.json is DIR's with the model's keys, its generation config
    and tokenizer files are copied; `--config` names the source of a file that does not start from it."""
    from compiler.cli import main
    from safetensors.torch import save_file
    src = tmp_path / "hf"
    src.mkdir()
    original, scale = _imported("mistral", src)
    (src / "config.json").write_text(json.dumps(original, indent=2))
    generation = json.dumps({"bos_token_id": 1, "eos_token_id": 2, "temperature": 0.7})
    (src / "generation_config.json").write_text(generation)
    (src / "tokenizer_config.json").write_text('{"model_max_length": 128}')
    # weights the model fits: check reads their names and shapes against it
    cls, extra = FAMILIES["mistral"]
    model_cls = getattr(transformers, cls.replace("Config", "ForCausalLM"))
    save_file(model_cls(getattr(transformers, cls)(**TINY, **extra)).state_dict(), src / "model.safetensors")
    (tmp_path / "m.scale").write_text(scale)
    step = _checkpoint(tmp_path, scale)
    out = tmp_path / "exported"
    assert main(["export", str(tmp_path / "m.scale"), step, "-o", str(out)]) == 0, capsys.readouterr().err
    config = json.loads((out / "config.json").read_text())
    for key, value in original.items():
        if key not in ("torch_dtype", "dtype"):  # transformers 5 writes `dtype`
            assert config[key] == value, key
    assert config["architectures"] == ["MistralForCausalLM"] and config["sliding_window"] is None
    for key in {"torch_dtype", "dtype"} & set(original):
        assert config[key] == "float32"  # what the files hold, not what the source's held
    assert set(config) <= set(original) | {"head_dim", "architectures"}, set(config) - set(original)
    assert (out / "generation_config.json").read_text() == generation
    assert (out / "tokenizer_config.json").read_text() == '{"model_max_length": 128}'
    assert "generation_config.json" in capsys.readouterr().out
    # a file that does not start from the source: --config names it (the config.json or its directory)
    plain = scale.replace(f'\n  init         = from("{src}")', "")
    (tmp_path / "plain.scale").write_text(plain)
    for given in (src, src / "config.json"):
        again = tmp_path / f"again_{given.name}"
        assert main(["export", str(tmp_path / "plain.scale"), step, "-o", str(again), "--config", str(given)]) == 0
        assert (again / "config.json").read_text() == (out / "config.json").read_text()
        assert (again / "generation_config.json").exists()
    # without a source: the model's keys only, as Llama (the same function), and nothing copied
    assert main(["export", str(tmp_path / "plain.scale"), step, "-o", str(tmp_path / "bare")]) == 0
    bare = json.loads((tmp_path / "bare" / "config.json").read_text())
    assert bare["model_type"] == "llama" and bare["max_position_embeddings"] == 128 and "bos_token_id" not in bare
    assert not (tmp_path / "bare" / "generation_config.json").exists()
    assert main(["export", str(tmp_path / "plain.scale"), step, "-o", str(again), "--config",
                 str(tmp_path / "nowhere")]) == 1
    assert "--config" in capsys.readouterr().err
