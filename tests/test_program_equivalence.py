"""The generated program.py of a single-device plan computes exactly what the model built from the spec computes:
same parameters, loss and gradients, for every layer variant of the vocabulary."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from compiler import codegen
from compiler.check import check_text
from compiler.model import build
from compiler.pipeline import compile_spec
from runtime.layers import init_parameters

VARIANTS = {
    "layernorm_gelu_tied": dict(norm="layernorm", act="gelu", attn="", head="tied = true", pos=True),
    "rmsnorm_swiglu_gqa_untied": dict(norm="rmsnorm", act="swiglu", attn=", kv_heads = 2, bias = false",
                                      head="tied = false", pos=False),
    "tied_head_with_bias": dict(norm="layernorm", act="gelu", attn="", head="tied = true, bias = true", pos=True),
    "untied_head_with_bias": dict(norm="rmsnorm", act="gelu", attn=", kv_heads = 1", head="bias = true", pos=True),
    "two_attentions_per_block": dict(norm="layernorm", act="swiglu", attn="", head="tied = false", pos=True,
                                     extra=True),
}


def _text(v) -> str:
    extra = f"    residual {{ {v['norm']}(hidden)  attention(hidden, heads{v['attn']}) }}\n" if v.get("extra") else ""
    return f"""
model m {{
  vocab = 96  hidden = 32  heads = 4  layers = 2  seq = 16
  embedding(vocab, hidden)
  {"positional(seq, hidden)" if v["pos"] else ""}
  repeat layers {{
    residual {{ {v['norm']}(hidden)  attention(hidden, heads{v['attn']}) }}
{extra}    residual {{ {v['norm']}(hidden)  mlp(hidden, 3 * hidden, act = {v['act']}) }}
  }}
  {v['norm']}(hidden)
  lm_head(vocab, hidden, {v['head']})
  cross_entropy
}}
mesh {{ axis dp = 1  devices_per_node = 1 }}
train {{ global_batch = 3  seq_len = seq  steps = 1  optimizer = adamw(lr = 1e-3) }}
"""


@pytest.mark.parametrize("name", VARIANTS)
def test_program_matches_model_built_from_spec(name, tmp_path):
    text = _text(VARIANTS[name])
    compiled = compile_spec(check_text(text, f"{name}.scale"))
    codegen.emit(compiled, str(tmp_path))
    mod_spec = importlib.util.spec_from_file_location(f"program_{name}", tmp_path / "program.py")
    program = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(program)
    cfg = program.CONFIG
    generated = program.Model()
    reference = build(compiled.spec, device="cpu")
    for m in (generated, reference):
        init_parameters(m, seed=cfg.seed, std=cfg.init.std, residual_out=cfg.init.residual_out, layers=cfg.init.layers)
    # Every linear writing into the residual stream gets the scaled initialisation, numbered ones too.
    from compiler.model import residual_out
    expected = {"attn_o", "mlp_down"} if not VARIANTS[name].get("extra") else {"attn_1_o", "attn_2_o", "mlp_down"}
    assert set(cfg.init.residual_out) == set(residual_out(reference)) == expected
    gen_params, ref_params = dict(generated.named_parameters()), dict(reference.named_parameters())
    assert gen_params.keys() == ref_params.keys()
    for k in ref_params:
        assert torch.equal(gen_params[k], ref_params[k]), k
    torch.manual_seed(0)
    tokens = torch.randint(0, 96, (3, 16))
    targets = torch.randint(0, 96, (3, 16))
    loss_gen, loss_ref = generated(tokens, targets), reference(tokens, targets)
    assert torch.equal(loss_gen, loss_ref)
    loss_gen.backward()
    loss_ref.backward()
    for k in ref_params:
        assert torch.equal(gen_params[k].grad, ref_params[k].grad), k
