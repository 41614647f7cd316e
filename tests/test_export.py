"""`scalec export FILE CHECKPOINT -o DIR` (compiler/export.py): a run's checkpoint as a Hugging Face checkpoint.
A tiny Llama, a tiny Qwen 3 (head_dim of its own, q/k norms), a tiny Phi-3 (q/k/v and gate/up fused in its files),
a tiny Mixtral, a tiny Qwen2-MoE and a tiny Qwen3-MoE from transformers are trained one step from their weights (so the checkpoint is not the file they started from), saved, exported;
transformers loads the export and holds bit for bit the checkpoint's tensors, and so does `init = from(export)`
read back by the runtime."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from compiler import export as X
from compiler.check import check_text
from tests.e2e.runner import ROOT, launch
from tests.test_hf_weights import hf_model, scale_text

transformers = pytest.importorskip("transformers")


# The round trips of the families whose names and layouts another test in CI already reads (qwen3: llama's with q/k
# norms; phi3's fused rows: test_a_phi3_export_fuses_q_k_v_and_gate_up; Mixtral's and Qwen3-MoE's experts:
# tests/e2e/test_hf_init.py exports both from ep runs and transformers loads them; Qwen2-MoE: Qwen3-MoE's experts and a
# shared expert; Gemma 3: gemma2's block; DeepSeek-V2: V3's): the slow tier (`pytest --slow -m slow`,
# docs/testing.md), for the suite's time budget.
def _slow(*kinds):
    return [pytest.param(k, marks=pytest.mark.slow) for k in kinds]


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["llama", *_slow("phi3", "mixtral", "qwen3", "qwen2_moe", "qwen3_moe")])
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
    ours = X.hf_tensors(saved, "qwen_moe" if kind in ("qwen2_moe", "qwen3_moe") else
                        "phi3" if kind == "phi3" else "mixtral")
    from safetensors.torch import load_file
    written = load_file(tmp_path / "exported" / "model.safetensors")
    assert written.keys() == ours.keys()
    for name, t in ours.items():
        assert torch.equal(written[name], t), name
    matched = 0
    for name, p in back.named_parameters():
        if name in ours:  # all of Llama's and Phi-3's (fused in memory as in its files); Mixtral's but the experts and router (fused in memory by transformers 5);
            # Qwen2-MoE's and Qwen3-MoE's but the experts (their router and Qwen2-MoE's shared expert are named in
            # memory as in the files)
            assert torch.equal(p.detach(), ours[name]), f"transformers read {name} otherwise"
            assert not torch.equal(p, started[name]), f"{name} is the starting weight: the step did not move it"
            matched += 1
    # per layer: Mixtral 2 norms and q, k, v, o; Qwen2-MoE those, q, k, v biases, the router, the shared expert's
    # 3 projections and its gate; Qwen3-MoE Mixtral's, q_norm, k_norm and the router; then the embedding, the final
    # norm and the head
    assert matched == {"llama": len(ours), "qwen3": len(ours), "phi3": len(ours), "mixtral": 4 * 6 + 3, "qwen2_moe": 4 * 14 + 3,
                       "qwen3_moe": 4 * 9 + 3}[kind]
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
    # sliding windows of 32 tokens, shorter than the 64 trained on: Mistral 7B's, Qwen 2's over every layer
    "mistral_window": ("MistralConfig", dict(sliding_window=32)),
    "qwen2_window": ("Qwen2Config", dict(use_sliding_window=True, sliding_window=32, max_window_layers=0)),
    "qwen2_moe": ("Qwen2MoeConfig", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                                         shared_expert_intermediate_size=48, router_aux_loss_coef=0.02)),
    # transformers 5 writes its expert count as num_local_experts: the export keeps that spelling
    "qwen3_moe": ("Qwen3MoeConfig", dict(head_dim=24, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                                         norm_topk_prob=True, router_aux_loss_coef=0.02)),
    # Phi-3 with and without a window: its partial_rotary_factor (1.0, in rope_parameters), dropouts (0) and
    # original_max_position_embeddings (4096, the longrope base, not the model's 128 positions) come back as they were
    "phi3": ("Phi3Config", dict()),
    "phi3_window": ("Phi3Config", dict(sliding_window=32)),
    # Gemma 2 (its three layers: a repeat of a (sliding, full) pair, then one of the sliding layer) and Gemma 3 (its
    # layer kinds listed, two rotary bases, the full layer's linearly scaled), in transformers 5's nested form
    "gemma2": ("Gemma2Config", dict(head_dim=24, sliding_window=32, query_pre_attn_scalar=16)),
    "gemma3": ("Gemma3TextConfig", dict(head_dim=24, sliding_window=32, layer_types=[
        "sliding_attention", "full_attention", "sliding_attention"], rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})),
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


@pytest.mark.parametrize("case,family", [("mistral_window", "mistral"), ("qwen2_window", "qwen2")])
def test_a_window_is_written_back_without_the_source(case, family):
    """A model with `window` exports its sliding window without the config it came from: a Llama-shaped model as
    Mistral (Llama has no window), Qwen 2 with use_sliding_window and max_window_layers 0 (every layer); transformers
    reads the config back to the same window."""
    original, scale = _imported(case)
    spec = check_text(scale, "imported.scale")
    got = X.hf_config(spec)
    assert got["model_type"] == family and got["sliding_window"] == 32
    hf = transformers.AutoConfig.for_model(got["model_type"], **{k: v for k, v in got.items() if k != "model_type"})
    assert hf.sliding_window == 32
    if family == "qwen2":
        assert got["use_sliding_window"] is True and got["max_window_layers"] == 0
        assert set(hf.layer_types) == {"sliding_attention"}
    # and without the window, none
    plain = check_text(scale.replace("window = window,", ""), "plain.scale")
    again = X.hf_config(plain)
    assert again.get("sliding_window") is None and again.get("use_sliding_window") in (None, False)


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


def test_a_qwen3_moe_without_a_source_is_written_as_the_released_configs_are():
    """Without the config.json it came from: `num_experts` as the released Qwen3-MoE configs name it, and their
    dense width (which the model has none of) as top_k × the experts' width (Qwen3-30B-A3B: 6144 = 8 × 768), and
    transformers builds the model of exactly our parameters from it; q/k norms beside a shared expert are neither
    Qwen2-MoE nor Qwen3-MoE."""
    from compiler.importer import complete, import_config
    from compiler.pipeline import compile_spec
    from tests.test_published_models import QWEN3_30B_A3B
    spec = check_text(complete(import_config(QWEN3_30B_A3B, "config.json")), "q.scale")
    got = X.hf_config(spec)
    released = json.loads(QWEN3_30B_A3B)
    for key in ("num_experts", "intermediate_size", "moe_intermediate_size", "norm_topk_prob", "head_dim",
                "num_experts_per_tok", "decoder_sparse_step", "mlp_only_layers", "attention_bias"):
        assert got[key] == released[key], key
    assert got["architectures"] == ["Qwen3MoeForCausalLM"] and "num_local_experts" not in got
    _, scale = _imported("qwen3_moe")
    spec = check_text(scale, "tiny.scale")
    config = transformers.AutoConfig.for_model(**{k: v for k, v in X.hf_config(spec).items() if k != "architectures"})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == compile_spec(spec).costs.params_n
    shared = scale.replace("renormalize = true, aux_loss = 0.02)", "renormalize = true, aux_loss = 0.02, "
                           "shared_ffn = 32, shared_gate = sigmoid)")
    assert shared != scale
    with pytest.raises(X.ExportError, match="Qwen2-MoE has no q/k norms and Qwen3-MoE no shared expert"):
        X.hf_config(check_text(shared, "shared.scale"))


def test_a_phi3_export_fuses_q_k_v_and_gate_up(tmp_path):
    """A model imported from a Phi-3 config is written as Phi-3: each layer's q, k, v rows concatenated into
    qkv_proj and its gate and up rows into gate_up_proj, bit for bit the checkpoint's; transformers' Phi3ForCausalLM
    loads them, and `init = from(...)` reads each of our tensors back from its rows. Without the Phi-3 config the same
    model is Llama-shaped with a window: Mistral, q, k, v apart."""
    from safetensors.torch import load_file

    from runtime import hf
    from tests.test_memory import _program
    original, scale = _imported("phi3_window")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "config.json").write_text(json.dumps(original, indent=2))
    step = _checkpoint(tmp_path, scale)
    spec = check_text(scale, str(tmp_path / "m.scale"))
    X.export(spec, step, str(tmp_path / "out"), config_from=str(tmp_path / "src"))
    saved = X.read_checkpoint(step)
    written = load_file(tmp_path / "out" / "model.safetensors")
    for i in range(3):
        ours = {leaf: saved[f"blocks.{i}.{leaf}.weight"] for leaf in ("attn_q", "attn_k", "attn_v", "mlp_gate",
                                                                       "mlp_up")}
        assert torch.equal(written[f"model.layers.{i}.self_attn.qkv_proj.weight"],
                           torch.cat([ours["attn_q"], ours["attn_k"], ours["attn_v"]]))
        assert torch.equal(written[f"model.layers.{i}.mlp.gate_up_proj.weight"],
                           torch.cat([ours["mlp_gate"], ours["mlp_up"]]))
    assert not [n for n in written if n.endswith(("q_proj.weight", "k_proj.weight", "gate_proj.weight"))]
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["Phi3ForCausalLM"] and config["sliding_window"] == 32
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert type(back).__name__ == "Phi3ForCausalLM" and back.config.sliding_window == 32
    params = dict(back.named_parameters())
    assert params.keys() == written.keys()
    for name, t in written.items():
        assert torch.equal(params[name].detach(), t), name
    _, prog = _program(tmp_path / "again", scale)
    model = prog.Model()
    model.to_empty(device="cpu")
    hf.load(model, str(tmp_path / "out"))
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), saved[name]), name
    bare = X.hf_config(spec)
    assert bare["model_type"] == "mistral" and bare["sliding_window"] == 32


@pytest.mark.parametrize("case", ["gemma2", "gemma3"])
def test_a_gemma_model_is_written_as_its_family_without_the_source(case):
    """Without the source config (a model written by hand), a Gemma model's config.json says what the model is:
    its layer kinds one per layer, its window, caps and rotary bases; what is written imports back to the same model
    (the same tensors and figures, compiler/export._gemma_reads_back), and a change of the model (a wider window)
    is the config's."""
    original, scale = _imported(case)
    spec = check_text(scale, "imported.scale")
    got = X.hf_config(spec)
    assert got["model_type"] == original["model_type"] and got["layer_types"] == original["layer_types"]
    assert got["sliding_window"] == 32 and got["num_hidden_layers"] == 3 and got["head_dim"] == 24
    if case == "gemma2":
        assert got["attn_logit_softcapping"] == 50.0 and got["final_logit_softcapping"] == 30.0
        assert got["query_pre_attn_scalar"] == 16 and got["rope_theta"] == 10000.0
    else:
        assert got["rope_scaling"] == {"rope_type": "linear", "factor": 4.0} and got["rope_local_base_freq"] == 1e4
    wider = check_text(scale.replace("window   = 32", "window   = 48"), "wider.scale")
    assert X.hf_config(wider, original)["sliding_window"] == 48


def test_a_zero_centred_model_outside_gemma_is_refused():
    """Zero-centred norms make a model Gemma's; one Gemma cannot be (a window per layer of its own) is refused
    with what does not fit, never written as something else."""
    _, scale = _imported("gemma2")
    spec = check_text(scale.replace("window = window,", "window = 16,", 1), "two_windows.scale")
    with pytest.raises(X.ExportError, match="share one window"):
        X.hf_config(spec)



@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["gemma2", *_slow("gemma3")])
def test_gemma_export_round_trips_bit_exactly(tmp_path, kind):
    """A tiny Gemma 2 (pairs of layers a block) and Gemma 3 (a block of three layers, then a repeat of one) from
    transformers, imported, trained one step `from(...)` it, exported: transformers loads the export with no missing
    or unexpected key, every tensor the checkpoint's (moved by the step), the config the source's; the runtime reads
    the export back to the same tensors."""
    from safetensors.torch import load_file

    from compiler.importer import import_config
    from runtime import hf
    from tests.test_hf_weights import gemma_model
    gemma_model(kind, tmp_path / "hf")
    section = import_config((tmp_path / "hf" / "config.json").read_text(), "config.json")
    text = section + ("mesh { axis dp = 1  devices_per_node = 1 }\n"
                      "train { global_batch = 4  seq_len = seq  steps = 1  optimizer = adamw(lr = 1e-3)\n"
                      f"        init = from(\"{tmp_path / 'hf'}\")  checkpoint_dir = \"{tmp_path / 'ckpt'}\" }}\n")
    launch(text, "one_step", tmp_path, steps=1, timeout=240, nproc=1, dump_grads=False, count_bytes=False)
    (step,) = sorted((tmp_path / "ckpt").glob("step_*"))
    (tmp_path / "m.scale").write_text(text)
    out = subprocess.run([sys.executable, "-m", "compiler.cli", "export", str(tmp_path / "m.scale"), str(step), "-o",
                          str(tmp_path / "exported")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    source = json.loads((tmp_path / "hf" / "config.json").read_text())
    config = json.loads((tmp_path / "exported" / "config.json").read_text())
    own = ("dtype", "torch_dtype")
    assert {k: v for k, v in config.items() if k not in own} == {k: v for k, v in source.items() if k not in own}
    saved = X.read_checkpoint(str(step))
    spec = check_text(text, "m.scale")
    from compiler.hf_header import stack
    layers = stack(spec.model, spec.value)
    ours = X.hf_tensors(saved, "mixtral", layers)
    written = load_file(tmp_path / "exported" / "model.safetensors")
    assert written.keys() == ours.keys()
    back, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "exported", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    started = dict(transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").named_parameters())
    for name, p in back.named_parameters():
        assert torch.equal(p.detach(), ours[name]), f"transformers read {name} otherwise"
        assert not torch.equal(p, started[name]), f"{name} is the starting weight: the step did not move it"
    model = __import__("tests.test_memory", fromlist=["_program"])._program(tmp_path / "again", text)[1].Model()
    model.to_empty(device="cpu")
    hf.load(model, str(tmp_path / "exported"), stack=layers)
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), saved[name]), name


def test_a_deepseek_router_is_not_exported_as_mixtral():
    """A `moe` routed as DeepSeek-V3 routes (sigmoid scores, groups, a routed scale, an expert bias) written as
    Mixtral's config would route otherwise in transformers: refused, naming it."""
    from compiler.importer import complete, import_config
    text = transformers.MixtralConfig(**TINY, num_local_experts=4, num_experts_per_tok=2).to_json_string()
    scale = complete(import_config(text, "config.json"))
    assert X.hf_config(check_text(scale, "mixtral.scale"))["model_type"] == "mixtral"
    for extra in ("scoring = sigmoid", "routed_scale = 2.5", "bias_update = 0.001", "groups = 2"):
        spec = check_text(scale.replace("aux_loss = ", f"{extra}, aux_loss = "), "deepseek.scale")
        with pytest.raises(X.ExportError, match="DeepSeek-V3's router"):
            X.hf_config(spec)



@pytest.mark.parametrize("kind", ["deepseek_v3", *_slow("deepseek_v2")])
def test_deepseek_export_round_trips_bit_exactly(tmp_path, kind):
    """A tiny DeepSeek-V3 (q through its bottleneck, a dense first layer, sigmoid-routed experts with the expert
    bias) and V2 (q direct, softmax-routed) from transformers, imported, trained one step `from(...)` it, exported:
    transformers loads the export with no missing or unexpected key, every tensor the checkpoint's (the experts fused
    in memory as transformers 5 keeps them), the expert bias the one the step moved, the config the source's."""
    from safetensors.torch import load_file

    from compiler.hf_header import stack
    from compiler.importer import import_config
    from runtime import hf
    from tests.test_hf_weights import deepseek_model
    deepseek_model(kind, tmp_path / "hf")
    section = import_config((tmp_path / "hf" / "config.json").read_text(), "config.json")
    text = section + ("mesh { axis dp = 1  devices_per_node = 1 }\n"
                      "train { global_batch = 4  seq_len = seq  steps = 1  optimizer = adamw(lr = 1e-3)\n"
                      f"        init = from(\"{tmp_path / 'hf'}\")  checkpoint_dir = \"{tmp_path / 'ckpt'}\" }}\n")
    launch(text, "one_step", tmp_path, steps=1, timeout=240, nproc=1, dump_grads=False, count_bytes=False)
    (step,) = sorted((tmp_path / "ckpt").glob("step_*"))
    (tmp_path / "m.scale").write_text(text)
    out = subprocess.run([sys.executable, "-m", "compiler.cli", "export", str(tmp_path / "m.scale"), str(step), "-o",
                          str(tmp_path / "exported")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    source = json.loads((tmp_path / "hf" / "config.json").read_text())
    config = json.loads((tmp_path / "exported" / "config.json").read_text())
    own = ("dtype", "torch_dtype")
    assert {k: v for k, v in config.items() if k not in own} == {k: v for k, v in source.items() if k not in own}
    saved = X.read_checkpoint(str(step))
    spec = check_text(text, "m.scale")
    layers = stack(spec.model, spec.value)
    ours = X.hf_tensors(saved, hf.DEEPSEEK, layers)
    written = load_file(tmp_path / "exported" / "model.safetensors")
    assert written.keys() == ours.keys()
    assert any(k.endswith("e_score_correction_bias") for k in ours) == (kind == "deepseek_v3")
    back, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "exported", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    started = dict(transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").named_parameters())
    for name, p in [*back.named_parameters(), *back.named_buffers()]:
        if name.endswith(".experts.gate_up_proj"):  # transformers 5 fuses each expert's gate and up in memory
            pre = name.removesuffix("gate_up_proj")
            want = torch.stack([torch.cat([ours[f"{pre}{e}.gate_proj.weight"], ours[f"{pre}{e}.up_proj.weight"]])
                                for e in range(p.shape[0])])
        elif name.endswith(".experts.down_proj"):
            pre = name.removesuffix("down_proj")
            want = torch.stack([ours[f"{pre}{e}.down_proj.weight"] for e in range(p.shape[0])])
        elif name in ours:
            want = ours[name]
        else:
            continue  # rotary frequencies
        assert torch.equal(p.detach(), want), f"transformers read {name} otherwise"
        if name in started:
            assert not torch.equal(p, started[name]), f"{name} is the starting weight: the step did not move it"
    model = __import__("tests.test_memory", fromlist=["_program"])._program(tmp_path / "again", text)[1].Model()
    model.to_empty(device="cpu")
    hf.load(model, str(tmp_path / "exported"), stack=layers)
    for name, p in [*model.named_parameters(), *((n, b) for n, b in model.named_buffers() if n.endswith("_bias.bias"))]:
        assert torch.equal(p.detach(), saved[name]), name


MISTAKES = Path(__file__).parent / "mistakes"


def test_export_refuses_another_models_checkpoint_before_writing_anything(tmp_path, capsys):
    """E0901 as the run gives it, located in the .scale file, and no directory made: by the manifest's fingerprint
    (the fixture files_llama_run is files_llama.scale's model, as its program saves it), and for a checkpoint
    written before manifests, by DCP's .metadata."""
    from compiler.cli import main
    run = MISTAKES / "files" / "files_llama_run"
    good = MISTAKES / "files" / "files_llama.scale"
    wider = tmp_path / "wider.scale"
    wider.write_text(good.read_text().replace("hidden = 8 ", "hidden = 16 ").replace(
        'init = from("files_llama")', ""))
    out = tmp_path / "out"
    assert main(["export", str(wider), str(run), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "error[E0901]: the models differ: `embed.weight` is 16×16 here and 16×8 in " in err
    assert f"--> {wider}:4:3" in err and "export a checkpoint with the .scale file of the run that saved it" in err
    assert not out.exists()
    # the same model: exported (the fingerprint agrees)
    assert main(["export", str(good), str(run), "-o", str(out)]) == 0, capsys.readouterr().err
    assert (out / "config.json").exists()
    # a checkpoint without a manifest: its .metadata says which model it holds
    plain = _checkpoint(tmp_path / "plain", good.read_text().replace('init = from("files_llama")', ""))
    assert not (Path(plain) / "scalec.json").exists()
    assert main(["export", str(wider), plain, "-o", str(tmp_path / "out2")]) == 1
    assert "the models differ: `embed.weight` is 16×16 here and 16×8 in" in capsys.readouterr().err
    assert not (tmp_path / "out2").exists()
