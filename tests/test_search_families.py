"""`scalec search` on released families beyond Llama (issue 26): Qwen3-8B (imported: q/k norms, heads of their own
width) and Gemma-2-9B (written by hand: scaled embeddings, zero-centred norms before and after each sub-layer, GeGLU,
soft-capped scores and logits, a sliding window on every other layer), each on one node of 8 H100s. Search finds
plans that fit, each with its reasons; the sample's own plan is one of the first it ranks; the parameters are
transformers' own count of the same config (built on the meta device, nothing allocated). No process is launched."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from compiler import search as SE
from compiler.check import check_path
from compiler.pipeline import compile_spec

ROOT = Path(__file__).resolve().parents[1]
H100_BYTES = 80e9

# Qwen/Qwen3-8B's config.json as published on the Hugging Face Hub (Qwen team, 2025).
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 12288, "max_position_embeddings": 40960,
    "max_window_layers": 36, "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936}
# google/gemma-2-9b's config.json (Gemma Team, 2024), the keys that shape the model.
GEMMA2_9B = {
    "model_type": "gemma2", "vocab_size": 256000, "hidden_size": 3584, "intermediate_size": 14336,
    "num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
    "max_position_embeddings": 8192, "sliding_window": 4096, "query_pre_attn_scalar": 256,
    "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True}

# sample -> (the config it writes, its parameters: the model cards' 8.2B and 9B, transformers' exact count)
FAMILIES = {"qwen3_8b": (QWEN3_8B, 8_190_735_360), "gemma2_9b": (GEMMA2_9B, 9_241_705_984)}
NEAR = 3  # the sample's plan is among the search's first NEAR


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def searched(request):
    spec = check_path(str(ROOT / "samples" / f"{request.param}.scale"))
    return request.param, spec, SE.search(spec, top=5)


def test_search_finds_plans_that_fit_with_reasons(searched):
    name, spec, result = searched
    assert spec.cluster.device.kind == "h100" and spec.cluster.device.memory_gb * 1e9 == H100_BYTES
    assert spec.plan.world_size == spec.cluster.world_size == 8 and spec.cluster.nodes == 1
    assert result.winners, f"{name}: no plan fits"
    best = result.winners[0]
    assert best.peak_bytes < H100_BYTES
    assert all(w.peak_bytes < H100_BYTES and w.reasons for w in result.winners)
    times = [w.prediction.step_time_s for w in result.winners]
    assert times == sorted(times) and 0 < times[0]
    assert 0 < best.prediction.mfu < 1
    assert any(r.startswith("peak ") and "of 80 GB" in r for r in best.reasons), best.reasons
    printed = SE.text(result)
    assert best.plan.describe() in printed and all(f"- {r}" in printed for r in best.reasons)


def test_the_samples_plan_is_one_search_ranks_first_or_near(searched):
    name, spec, result = searched
    written = compile_spec(spec).plan

    def settings(p):
        return (p.axes, p.micro_batches, p.schedule, p.virtual_stages, p.data_parallel, p.recompute,
                p.sequence_parallel, p.fsdp_grad_sync)
    ranked = [settings(w.plan) for w in result.winners]
    assert settings(written) in ranked[:NEAR], (name, written.describe(), [w.plan.describe() for w in result.winners])


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_parameters_are_transformers_count(name):
    config, count = FAMILIES[name]
    spec = check_path(str(ROOT / "samples" / f"{name}.scale"))
    assert compile_spec(spec).costs.params_n == count
    transformers = pytest.importorskip("transformers")  # the test-only extra (pyproject `dev`)
    import torch
    cfg = dict(config)
    built = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(built)
    assert sum(p.numel() for p in model.parameters()) == count


def test_qwen3_model_section_is_what_import_prints():
    """The sample's model section is `scalec import`'s output for the published config.json, line for line."""
    from compiler.importer import import_config
    imported = import_config(json.dumps(QWEN3_8B), "Qwen3-8B/config.json")
    model = imported[imported.index("model qwen3 {"):].rstrip()
    assert model in (ROOT / "samples" / "qwen3_8b.scale").read_text()
