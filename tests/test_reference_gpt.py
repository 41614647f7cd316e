"""The model scalec builds from a spec computes what an independent, plain-PyTorch GPT computes.

The reference GPT below is written from scratch (own norms, explicit causal attention with matmul + mask + softmax,
key/value heads repeated for grouped-query attention). Each test builds the scalec model from a spec text on the
CPU, initialises it with `runtime.layers.init_parameters`, copies every weight into the reference through an
explicit name mapping, and compares the logits, the loss and every parameter gradient.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import compiler.model
from compiler.check import check_text
from compiler.model import build
from runtime.layers import Repeat, init_parameters

RTOL, ATOL = 1e-5, 1e-6


# ---------------------------------------------------------------------------------------------------------------
# Spec texts.


def spec_text(*, vocab=128, hidden=64, heads=4, layers=2, seq=32, ffn="4 * hidden", norm="layernorm",
              attn_args="", mlp_args=", act = gelu", head_args=", tied = true", positional=True) -> str:
    pos_line = "  positional(seq, hidden)\n" if positional else ""
    return f"""
model ref_gpt {{
  vocab  = {vocab}
  hidden = {hidden}
  heads  = {heads}
  layers = {layers}
  seq    = {seq}
  ffn    = {ffn}

  embedding(vocab, hidden)
{pos_line}  repeat layers {{
    residual {{ {norm}(hidden)  attention(hidden, heads{attn_args}) }}
    residual {{ {norm}(hidden)  mlp(hidden, ffn{mlp_args}) }}
  }}
  {norm}(hidden)
  lm_head(vocab, hidden{head_args})
  cross_entropy
}}

mesh {{
  axis dp = 1
  devices_per_node = 1
}}

train {{
  global_batch = 4
  seq_len      = seq
  steps        = 1
  optimizer    = adamw(lr = 1e-3)
}}
"""


# name -> (spec keyword arguments, reference config)
VARIANTS = {
    # (a) like samples/tiny_gpt.scale: LayerNorm, GELU, tied head, multi-head attention, biases (the default).
    "layernorm_gelu_tied_mha": (
        dict(vocab=128, hidden=64, heads=4, seq=32),
        dict(vocab=128, hidden=64, heads=4, kv_heads=4, layers=2, seq=32, ffn=256, norm="layernorm", eps=1e-5,
             act="gelu", bias=True, tied=True, head_bias=False, positional=True),
    ),
    # (b) RMSNorm, SwiGLU, untied head, grouped-query attention, no biases on attention and mlp.
    "rmsnorm_swiglu_untied_gqa_nobias": (
        dict(vocab=96, hidden=64, heads=4, seq=24, ffn="2 * hidden", norm="rmsnorm",
             attn_args=", kv_heads = 2, bias = false", mlp_args=", act = swiglu, bias = false",
             head_args=", tied = false"),
        dict(vocab=96, hidden=64, heads=4, kv_heads=2, layers=2, seq=24, ffn=128, norm="rmsnorm", eps=1e-6,
             act="swiglu", bias=False, tied=False, head_bias=False, positional=True),
    ),
    # (c) no positional embedding.
    "no_positional": (
        dict(vocab=64, hidden=32, heads=4, seq=16, positional=False),
        dict(vocab=64, hidden=32, heads=4, kv_heads=4, layers=2, seq=16, ffn=128, norm="layernorm", eps=1e-5,
             act="gelu", bias=True, tied=True, head_bias=False, positional=False),
    ),
    # (d) multi-query attention (one kv head), SwiGLU with biases, tied head with a bias.
    "layernorm_swiglu_mqa_tied_head_bias": (
        dict(vocab=80, hidden=48, heads=4, seq=20, ffn="2 * hidden", attn_args=", kv_heads = 1",
             mlp_args=", act = swiglu", head_args=", tied = true, bias = true"),
        dict(vocab=80, hidden=48, heads=4, kv_heads=1, layers=2, seq=20, ffn=96, norm="layernorm", eps=1e-5,
             act="swiglu", bias=True, tied=True, head_bias=True, positional=True),
    ),
    # (e) untied head with a bias, RMSNorm + GELU, three layers, no positional embedding.
    "rmsnorm_gelu_untied_head_bias_3_layers": (
        dict(vocab=64, hidden=32, heads=2, layers=3, seq=16, ffn="3 * hidden", norm="rmsnorm",
             head_args=", bias = true", positional=False),
        dict(vocab=64, hidden=32, heads=2, kv_heads=2, layers=3, seq=16, ffn=96, norm="rmsnorm", eps=1e-6,
             act="gelu", bias=True, tied=False, head_bias=True, positional=False),
    ),
}


# ---------------------------------------------------------------------------------------------------------------
# The reference GPT, plain PyTorch.


class RefLayerNorm(nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n))
        self.bias = nn.Parameter(torch.zeros(n))

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class RefRMSNorm(nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + self.eps) * self.weight


def ref_norm(cfg):
    return RefLayerNorm(cfg["hidden"], cfg["eps"]) if cfg["norm"] == "layernorm" else RefRMSNorm(cfg["hidden"],
                                                                                                  cfg["eps"])


class RefAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, self.n_head, self.n_kv = cfg["hidden"], cfg["heads"], cfg["kv_heads"]
        self.head_dim = h // self.n_head
        self.wq = nn.Linear(h, self.n_head * self.head_dim, bias=cfg["bias"])
        self.wk = nn.Linear(h, self.n_kv * self.head_dim, bias=cfg["bias"])
        self.wv = nn.Linear(h, self.n_kv * self.head_dim, bias=cfg["bias"])
        self.wo = nn.Linear(self.n_head * self.head_dim, h, bias=cfg["bias"])

    def forward(self, x):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_head, self.head_dim).permute(0, 2, 1, 3)  # (B, H, T, D)
        k = self.wk(x).view(B, T, self.n_kv, self.head_dim).permute(0, 2, 1, 3)  # (B, K, T, D)
        v = self.wv(x).view(B, T, self.n_kv, self.head_dim).permute(0, 2, 1, 3)
        group = self.n_head // self.n_kv
        # Query head i reads kv head i // group.
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # (B, H, T, T)
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
        scores = scores.masked_fill(~causal, float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v  # (B, H, T, D)
        return self.wo(y.permute(0, 2, 1, 3).reshape(B, T, self.n_head * self.head_dim))


class RefMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, f = cfg["hidden"], cfg["ffn"]
        self.act = cfg["act"]
        self.fc_in = nn.Linear(h, f, bias=cfg["bias"])
        if self.act == "swiglu":
            self.fc_gate = nn.Linear(h, f, bias=cfg["bias"])
        self.fc_out = nn.Linear(f, h, bias=cfg["bias"])

    def forward(self, x):
        if self.act == "gelu":
            u = self.fc_in(x)
            return self.fc_out(0.5 * u * (1.0 + torch.erf(u / math.sqrt(2.0))))
        return self.fc_out(F.silu(self.fc_gate(x)) * self.fc_in(x))


class RefBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_attn = ref_norm(cfg)
        self.attn = RefAttention(cfg)
        self.ln_mlp = ref_norm(cfg)
        self.mlp = RefMLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_attn(x))
        return x + self.mlp(self.ln_mlp(x))


class RefGPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg["vocab"], cfg["hidden"])
        self.pos_emb = nn.Embedding(cfg["seq"], cfg["hidden"]) if cfg["positional"] else None
        self.layers = nn.ModuleList(RefBlock(cfg) for _ in range(cfg["layers"]))
        self.ln_f = ref_norm(cfg)
        self.head = None if cfg["tied"] else nn.Linear(cfg["hidden"], cfg["vocab"], bias=cfg["head_bias"])
        self.tied_head_bias = nn.Parameter(torch.zeros(cfg["vocab"])) if cfg["tied"] and cfg["head_bias"] else None

    def logits(self, tokens):
        T = tokens.shape[1]
        x = self.tok_emb(tokens)
        if self.pos_emb is not None:
            x = x + self.pos_emb(torch.arange(T))[None]
        for block in self.layers:
            x = block(x)
        x = self.ln_f(x)
        if self.head is not None:
            return self.head(x)
        logits = x @ self.tok_emb.weight.t()
        return logits if self.tied_head_bias is None else logits + self.tied_head_bias

    def forward(self, tokens, targets):
        logits = self.logits(tokens)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)), logits


# ---------------------------------------------------------------------------------------------------------------
# Weight mapping: scalec parameter name -> reference parameter name, written out.


def name_mapping(cfg) -> dict[str, str]:
    m = {"embed.weight": "tok_emb.weight"}
    if cfg["positional"]:
        m["pos.weight"] = "pos_emb.weight"
    linears = {"attn_q": "attn.wq", "attn_k": "attn.wk", "attn_v": "attn.wv", "attn_o": "attn.wo",
               "mlp_up": "mlp.fc_in", "mlp_down": "mlp.fc_out"}
    if cfg["act"] == "swiglu":
        linears["mlp_gate"] = "mlp.fc_gate"
    for i in range(cfg["layers"]):
        m[f"blocks.{i}.norm_1.weight"] = f"layers.{i}.ln_attn.weight"
        m[f"blocks.{i}.norm_2.weight"] = f"layers.{i}.ln_mlp.weight"
        if cfg["norm"] == "layernorm":
            m[f"blocks.{i}.norm_1.bias"] = f"layers.{i}.ln_attn.bias"
            m[f"blocks.{i}.norm_2.bias"] = f"layers.{i}.ln_mlp.bias"
        for ours, theirs in linears.items():
            m[f"blocks.{i}.{ours}.weight"] = f"layers.{i}.{theirs}.weight"
            if cfg["bias"]:
                m[f"blocks.{i}.{ours}.bias"] = f"layers.{i}.{theirs}.bias"
    m["norm.weight"] = "ln_f.weight"
    if cfg["norm"] == "layernorm":
        m["norm.bias"] = "ln_f.bias"
    if not cfg["tied"]:
        m["lm_head.weight"] = "head.weight"
        if cfg["head_bias"]:
            m["lm_head.bias"] = "head.bias"
    elif cfg["head_bias"]:
        m["lm_head_bias.bias"] = "tied_head_bias"
    return m


def build_pair(variant: str, *, seed: int = 1234, perturb: bool = True):
    kwargs, cfg = VARIANTS[variant]
    spec = check_text(spec_text(**kwargs), "ref.scale")
    model = build(spec, device="cpu")
    init_parameters(model, seed=seed, std=0.02, residual_out=("attn_o", "mlp_down"), layers=cfg["layers"])
    if perturb:
        # init_parameters sets biases to zero and norm scales to one; move them off those values so that a wrong
        # bias or norm mapping (or a bias the forward pass ignores) cannot go unnoticed.
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("bias") or ".norm" in f".{name}":
                    p.add_(0.1 * torch.randn(p.shape, generator=g))
    ref = RefGPT(cfg)
    mapping = name_mapping(cfg)
    ours = dict(model.named_parameters())
    theirs = dict(ref.named_parameters())
    assert set(mapping) == set(ours), "mapping does not cover exactly the scalec parameters"
    assert set(mapping.values()) == set(theirs), "mapping does not cover exactly the reference parameters"
    with torch.no_grad():
        for a, b in mapping.items():
            assert ours[a].shape == theirs[b].shape, (a, b)
            theirs[b].copy_(ours[a])
    return spec, cfg, model, ref, mapping


def scalec_logits_and_loss(model, cfg, tokens, targets):
    """Run the scalec model; its logits are rebuilt from the final norm's output (captured by a hook)."""
    captured = {}
    handle = model.norm.register_forward_hook(lambda mod, inp, out: captured.__setitem__("h", out))
    try:
        loss = model(tokens, targets)
    finally:
        handle.remove()
    h = captured["h"]
    if cfg["tied"]:
        logits = F.linear(h, model.embed.weight)
        if cfg["head_bias"]:
            logits = logits + model.lm_head_bias.bias
    else:
        logits = model.lm_head(h)
    return logits, loss


def batch(cfg, B=3, seed=0):
    torch.manual_seed(seed)
    tokens = torch.randint(0, cfg["vocab"], (B, cfg["seq"]))
    targets = torch.randint(0, cfg["vocab"], (B, cfg["seq"]))
    return tokens, targets


# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("perturb", [False, True], ids=["init", "perturbed"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_matches_reference_gpt(variant, perturb):
    torch.manual_seed(0)
    _, cfg, model, ref, mapping = build_pair(variant, perturb=perturb)
    assert isinstance(model.blocks, Repeat) and len(model.blocks) == cfg["layers"]
    assert hasattr(model, "pos") == cfg["positional"]
    tokens, targets = batch(cfg)

    logits, loss = scalec_logits_and_loss(model, cfg, tokens, targets)
    ref_loss, ref_logits = ref(tokens, targets)

    assert logits.shape == (tokens.shape[0], cfg["seq"], cfg["vocab"])
    assert loss.dtype == torch.float32 and loss.dim() == 0
    torch.testing.assert_close(logits, ref_logits, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(loss, ref_loss, rtol=RTOL, atol=ATOL)
    # The model's loss is the mean cross-entropy of the logits we rebuilt from the final norm.
    torch.testing.assert_close(loss, F.cross_entropy(logits.flatten(0, 1), targets.flatten()), rtol=RTOL, atol=ATOL)

    model.zero_grad(set_to_none=True)
    ref.zero_grad(set_to_none=True)
    loss.backward()
    ref_loss.backward()
    ours = dict(model.named_parameters())
    theirs = dict(ref.named_parameters())
    for a, b in mapping.items():
        assert ours[a].grad is not None, f"{a} got no gradient"
        assert theirs[b].grad is not None, f"{b} got no gradient"
        torch.testing.assert_close(ours[a].grad, theirs[b].grad, rtol=RTOL, atol=ATOL, msg=lambda m, a=a: f"{a}: {m}")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_attention_is_causal(variant):
    """Changing the last token changes no logit at an earlier position (in both models)."""
    _, cfg, model, ref, _ = build_pair(variant)
    tokens, targets = batch(cfg, B=2, seed=3)
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % cfg["vocab"]
    with torch.no_grad():
        before, _ = scalec_logits_and_loss(model, cfg, tokens, targets)
        after, _ = scalec_logits_and_loss(model, cfg, changed, targets)
    torch.testing.assert_close(before[:, :-1], after[:, :-1], rtol=0, atol=0)
    assert not torch.allclose(before[:, -1], after[:, -1])


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_param_count_matches_symbolic_formula(variant):
    spec, _, model, ref, _ = build_pair(variant, perturb=False)
    n = sum(p.numel() for p in model.parameters())
    assert n == spec.value(compiler.model.symbolic_param_count(model))
    assert n == sum(p.numel() for p in ref.parameters())
