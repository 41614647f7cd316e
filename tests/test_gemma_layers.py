"""Gemma 2's and Gemma 3's pieces, written in the language, compute what transformers' own Gemma2ForCausalLM and
Gemma3ForCausalLM compute (fp32, loss and every gradient to 1e-5): embeddings scaled by √hidden, zero-centred norms
before and after each sub-layer, GeGLU, a head_dim of its own with GQA, query_pre_attn_scalar, a sliding window on
one layer of each pair, soft-capped scores and logits (Gemma 2), q/k norms and a rope base per kind of layer
(Gemma 3). The weights are copied by name here; `init = from(...)` reads the same checkpoints in test_hf_weights."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from compiler import model as M
from compiler.check import check_text

transformers = pytest.importorskip("transformers")

WINDOW, SEQ = 8, 32
NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")
LEAVES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
          "q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
          "down": "mlp.down_proj"}


def _config(family: str):
    common = dict(vocab_size=128, hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=24, max_position_embeddings=SEQ, sliding_window=WINDOW,
                  attn_implementation="eager")
    if family == "gemma2":
        return transformers.Gemma2Config(**common, query_pre_attn_scalar=16, attn_logit_softcapping=50.0,
                                         final_logit_softcapping=30.0, rope_theta=10000.0)
    return transformers.Gemma3TextConfig(**common, query_pre_attn_scalar=24, rope_theta=1e6,
                                         rope_local_base_freq=10000.0,
                                         layer_types=["sliding_attention", "full_attention"])


def _scale(family: str) -> str:
    """One repeat of a (sliding, full) pair of layers, as transformers lays them out."""
    norm = "rmsnorm(hidden, zero_centered = true)"
    if family == "gemma2":
        att = [f"attention(hidden, heads, kv_heads = 2, bias = false, head_dim = 24, rope_theta = 10000, {w}"
               "softcap = 50, query_scale = 16)" for w in (f"window = {WINDOW}, ", "")]
        head = "lm_head(vocab, hidden, tied = true, softcap = 30)"
    else:
        att = [f"attention(hidden, heads, kv_heads = 2, bias = false, head_dim = 24, rope_theta = {theta}, {w}"
               "qk_norm = zero_centered_rmsnorm)" for w, theta in ((f"window = {WINDOW}, ", 10000), ("", 1000000))]
        head = "lm_head(vocab, hidden, tied = true)"
    body = "".join(f"    residual {{ {norm}  {a}  {norm} }}\n"
                   f"    residual {{ {norm}  mlp(hidden, 256, act = geglu, bias = false)  {norm} }}\n" for a in att)
    return (f"model {family} {{\n  vocab = 128  hidden = 64  heads = 4  seq = {SEQ}\n"
            f"  embedding(vocab, hidden, scaled = true)\n  repeat 1 {{\n{body}  }}\n  {norm}  {head}  cross_entropy\n}}\n"
            "mesh { axis dp = 1  nodes = 1  devices_per_node = 1 }\n"
            "train { global_batch = 2  seq_len = seq  steps = 1  optimizer = adamw(lr = 1e-3) }\n")


def _theirs(name: str) -> str:
    """transformers' name of our parameter: a block holds two of its layers (`attn_1`, `attn_2`; four norms each)."""
    if name == "embed.weight":
        return "model.embed_tokens.weight"
    if name == "norm.weight":
        return "model.norm.weight"
    _, _, leaf, what = name.split(".")
    kind, j, *rest = leaf.split("_")
    if kind == "norm":
        k = int(j) - 1
        return f"model.layers.{k // 4}.{NORMS[k % 4]}.{what}"
    return f"model.layers.{int(j) - 1}.{LEAVES['_'.join(rest)]}.{what}"


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_gemma_layers_compute_what_transformers_computes(family):
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(_config(family)).float()
    with torch.no_grad():  # norms away from zero, so that (1 + weight) is tested
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    ours = M.build(check_text(_scale(family), f"{family}.scale"), device="cpu")
    theirs = dict(hf.named_parameters())
    assert {_theirs(n) for n, _ in ours.named_parameters()} == set(theirs)  # tied: no lm_head of its own
    with torch.no_grad():
        for n, p in ours.named_parameters():
            p.copy_(theirs[_theirs(n)])
    tokens, targets = torch.randint(0, 128, (2, SEQ)), torch.randint(0, 128, (2, SEQ))
    loss = ours(tokens, targets)
    loss.backward()
    ref = F.cross_entropy(hf(input_ids=tokens).logits.flatten(0, 1).float(), targets.flatten())
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    for n, p in ours.named_parameters():
        want = theirs[_theirs(n)].grad
        assert torch.allclose(p.grad, want, rtol=1e-5, atol=1e-5 * want.abs().max().item()), n


def test_softcapped_attention_is_flex_attention_with_the_cap_as_score_mod():
    """The CPU path (scores written out) equals FlexAttention's eager reference with the cap as its score_mod and
    the window's block mask: what CUDA runs (runtime/attention.softcapped)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from runtime.attention import softcapped
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 4, SEQ, 16), torch.randn(2, 2, SEQ, 16), torch.randn(2, 2, SEQ, 16)
    for window in (None, WINDOW):
        def keep(b, h, i, j, window=window):
            return (j <= i) if window is None else (j <= i) & (i - j < window)
        mask = create_block_mask(keep, B=None, H=None, Q_LEN=SEQ, KV_LEN=SEQ, device="cpu")
        want = flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: 20.0 * torch.tanh(s / 20.0),
                              block_mask=mask, enable_gqa=True, scale=0.3)
        got = softcapped(q, k, v, 20.0, window, True, scale=0.3)
        assert torch.allclose(got, want, atol=1e-5), window
