"""Starting from a Hugging Face checkpoint (`train { init = from("DIR") }`, runtime/hf.py): tiny random
LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM with a head_dim of its own (as
Mistral-Nemo), MistralForCausalLM with Mistral 7B's sliding window (shorter than the sequence),
Phi3ForCausalLM (its q/k/v and gate/up fused in the checkpoint, a sliding window),
MixtralForCausalLM, Qwen2MoeForCausalLM and Qwen3MoeForCausalLM built in-process (no download) and saved with
`save_pretrained` (safetensors); the generated Model loads them by name and computes Hugging Face's loss (fp32,
1e-5) and gradients; each rank of a parallel plan reads only its part and the run trains exactly like the single
device from the same weights (dp 2 × tp 2, pp 2, ep 2 for Mixtral)."""
from __future__ import annotations

import sys

import pytest
import torch

from compiler.check import check_text
from compiler.diagnostics import ScaleError
from tests.test_memory import _program

transformers = pytest.importorskip("transformers")  # the test-only extra (pyproject `dev`)

BLOCK = {
    "llama": "attention(hidden, heads, kv_heads = 2, bias = false, rope_theta = 10000) }}\n"
             "    residual {{ rmsnorm(hidden, eps = 1e-6)  mlp(hidden, 4 * hidden, act = swiglu, bias = false) }}",
    "qwen2": "attention(hidden, heads, kv_heads = 2, bias = false, qkv_bias = true, rope_theta = 1000000) }}\n"
             "    residual {{ rmsnorm(hidden, eps = 1e-6)  mlp(hidden, 4 * hidden, act = swiglu, bias = false) }}",
    # heads of 24 where hidden / heads is 16; Qwen 3's per-head q/k RMSNorm
    "qwen3": "attention(hidden, heads, kv_heads = 2, bias = false, head_dim = 24, qk_norm = rmsnorm, "
             "rope_theta = 1000000) }}\n"
             "    residual {{ rmsnorm(hidden, eps = 1e-6)  mlp(hidden, 4 * hidden, act = swiglu, bias = false) }}",
    "mistral_head_dim": "attention(hidden, heads, kv_heads = 2, bias = false, head_dim = 24, rope_theta = 1000000) }}\n"
                        "    residual {{ rmsnorm(hidden, eps = 1e-6)  mlp(hidden, 4 * hidden, act = swiglu, "
                        "bias = false) }}",
    # Mistral 7B's sliding window, 8 tokens of the 32: each query sees itself and the 7 before it
    "mistral_window": "attention(hidden, heads, kv_heads = 2, bias = false, window = 8, rope_theta = 1000000) }}\n"
                      "    residual {{ rmsnorm(hidden, eps = 1e-6)  mlp(hidden, 4 * hidden, act = swiglu, "
                      "bias = false) }}",
    # Phi-3: Llama's block with Phi-3-mini's kind of window (here 8 of the 32 tokens); its checkpoint holds q, k, v
    # in one qkv_proj and gate, up in one gate_up_proj, which each parameter reads its rows of
    "phi3": "attention(hidden, heads, kv_heads = 2, bias = false, window = 8, rope_theta = 10000) }}\n"
            "    residual {{ rmsnorm(hidden, eps = 1e-6)  mlp(hidden, 4 * hidden, act = swiglu, bias = false) }}",
    "mixtral": "attention(hidden, heads, kv_heads = 2, bias = false, rope_theta = 1000000) }}\n"
               "    residual {{ rmsnorm(hidden, eps = 1e-6)  moe(hidden, 4 * hidden, 4, top_k = 2, "
               "capacity_factor = none, act = swiglu, aux_loss = 0) }}",
    # Qwen2-MoE: experts of their own width, gates not renormalised, a sigmoid-gated shared expert; q, k, v biases
    "qwen2_moe": "attention(hidden, heads, kv_heads = 2, bias = false, qkv_bias = true, rope_theta = 1000000) }}\n"
                 "    residual {{ rmsnorm(hidden, eps = 1e-6)  moe(hidden, 2 * hidden, 4, top_k = 2, "
                 "capacity_factor = none, act = swiglu, aux_loss = 0, renormalize = false,\n"
                 "                                              shared_ffn = 3 * hidden, shared_gate = sigmoid) }}",
    # Qwen3-MoE: Qwen 3's attention (q/k norms, heads of 24), experts of their own width, gates renormalised over the
    # top_k, no shared expert
    "qwen3_moe": "attention(hidden, heads, kv_heads = 2, bias = false, head_dim = 24, qk_norm = rmsnorm, "
                 "rope_theta = 1000000) }}\n"
                 "    residual {{ rmsnorm(hidden, eps = 1e-6)  moe(hidden, 2 * hidden, 4, top_k = 2, "
                 "capacity_factor = none, act = swiglu, aux_loss = 0, renormalize = true) }}",
}

SCALE = """
model tiny {{
  vocab = 128  hidden = 64  heads = 4  layers = 4  seq = 32
  embedding(vocab, hidden)
  repeat layers {{
    residual {{ rmsnorm(hidden, eps = 1e-6)  """ + "{block}" + """
  }}
  rmsnorm(hidden, eps = 1e-6)
  lm_head(vocab, hidden, tied = false)
  cross_entropy
}}
mesh {{
  axis dp = 1
  devices_per_node = 1
}}
plan {{
  micro_batches = 1
}}
train {{
  global_batch = 8
  seq_len      = seq
  steps        = 3
  optimizer    = adamw(lr = 1e-3)
  init         = from("{path}")
}}
"""


def hf_model(kind: str, path):
    """A tiny random model of `kind`, saved to `path` (model.safetensors and config.json)."""
    kw = dict(vocab_size=128, hidden_size=64, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=32, rms_norm_eps=1e-6, tie_word_embeddings=False)
    if kind == "llama":
        config = transformers.LlamaConfig(**kw, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        cls = transformers.LlamaForCausalLM
    elif kind == "qwen2":
        config = transformers.Qwen2Config(**kw, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
        cls = transformers.Qwen2ForCausalLM
    elif kind == "qwen3":
        config = transformers.Qwen3Config(**kw, head_dim=24,
                                          rope_parameters={"rope_type": "default", "rope_theta": 1e6})
        cls = transformers.Qwen3ForCausalLM
    elif kind == "mistral_head_dim":
        config = transformers.MistralConfig(**kw, head_dim=24, sliding_window=None,
                                            rope_parameters={"rope_type": "default", "rope_theta": 1e6})
        cls = transformers.MistralForCausalLM
    elif kind == "mistral_window":
        config = transformers.MistralConfig(**kw, sliding_window=8,
                                            rope_parameters={"rope_type": "default", "rope_theta": 1e6})
        cls = transformers.MistralForCausalLM
    elif kind == "phi3":  # no pad_token_id: transformers' embedding gives that row no gradient (nn.Embedding's
        # padding_idx), ours trains it as any other; Phi3Config's own (32000) is past this vocabulary anyway
        config = transformers.Phi3Config(**kw, sliding_window=8, pad_token_id=None,
                                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        cls = transformers.Phi3ForCausalLM
    elif kind == "qwen2_moe":
        config = transformers.Qwen2MoeConfig(**kw, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128,
                                             shared_expert_intermediate_size=192, norm_topk_prob=False,
                                             rope_parameters={"rope_type": "default", "rope_theta": 1e6})
        cls = transformers.Qwen2MoeForCausalLM
    elif kind == "qwen3_moe":
        config = transformers.Qwen3MoeConfig(**kw, head_dim=24, num_experts=4, num_experts_per_tok=2,
                                             moe_intermediate_size=128, norm_topk_prob=True,
                                             rope_parameters={"rope_type": "default", "rope_theta": 1e6})
        cls = transformers.Qwen3MoeForCausalLM
    else:
        config = transformers.MixtralConfig(**kw, num_local_experts=4, num_experts_per_tok=2,
                                            rope_parameters={"rope_type": "default", "rope_theta": 1e6})
        cls = transformers.MixtralForCausalLM
    torch.manual_seed(0)
    model = cls(config).float()
    with torch.no_grad():  # Qwen 2's q, k, v biases start at zero: make them count
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.02)
            elif kind in ("qwen3", "qwen3_moe") and name.endswith(("q_norm.weight", "k_norm.weight")):  # not all ones either
                p.normal_(1, 0.1)
            elif kind in ("qwen2_moe", "qwen3_moe") and name.endswith((".mlp.gate.weight",
                                                                       "shared_expert_gate.weight")):
                p.normal_(0, 0.3)  # decisive routing (no near-ties for rounding to flip; Qwen3-MoE's router starts
                #                    at zero, every expert tied) and a shared expert's gate far from 1/2
    model.save_pretrained(path, safe_serialization=True)
    return model


def scale_text(kind: str, path) -> str:
    return SCALE.format(block=BLOCK[kind].format(), path=path)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "mistral_head_dim", "mistral_window", "phi3",
                                  "mixtral", "qwen2_moe", "qwen3_moe"])
def test_loaded_model_computes_what_transformers_computes(tmp_path, kind):
    from runtime import hf
    ref = hf_model(kind, tmp_path / "hf")
    compiled, prog = _program(tmp_path, scale_text(kind, tmp_path / "hf"))
    sys.modules[prog.__name__] = prog
    assert prog.CONFIG.init.path  # the program carries where it starts from
    model = prog.Model()
    model.to_empty(device="cpu")
    loaded = hf.load(model, str(tmp_path / "hf"))
    assert sorted(loaded.names) == sorted(n for n, _ in model.named_parameters())
    # one process reads every tensor whole: what the log line reports is the checkpoint itself
    assert loaded.tensors_read == loaded.tensors and loaded.bytes_read == loaded.bytes > 0
    g = torch.Generator().manual_seed(3)
    tokens, targets = torch.randint(0, 128, (4, 32), generator=g), torch.randint(0, 128, (4, 32), generator=g)
    loss = model(tokens, targets)
    want = torch.nn.functional.cross_entropy(ref(input_ids=tokens).logits.flatten(0, 1), targets.flatten())
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=0)
    if kind in ("mistral_window", "phi3"):  # transformers' window is in force: without it, another loss
        ref.config.sliding_window = None
        with torch.no_grad():
            full = torch.nn.functional.cross_entropy(ref(input_ids=tokens).logits.flatten(0, 1), targets.flatten())
        ref.config.sliding_window = 8
        assert abs(full.item() - want.item()) > 1e-4
    loss.backward()
    want.backward()
    params = dict(ref.named_parameters())
    layout = hf.layout_of(params)  # Phi-3's fused qkv_proj and gate_up_proj, in memory as in its files
    for name, p in model.named_parameters():
        want_g = _hf_grad(params, name, hf, layout, dict(model.named_parameters()))
        err = (p.grad - want_g).norm() / want_g.norm()
        assert err <= 1e-5, f"{name}: gradient off by {err:.2e}"


def _hf_grad(params: dict, name: str, hf, layout: str = "mixtral", ours: dict | None = None) -> torch.Tensor:
    """The gradient Hugging Face's in-memory model holds for our parameter `name`. transformers 5 keeps Mixtral's
    router as `mlp.gate` and its experts fused (`gate_up_proj`: experts × 2·ffn × hidden, gate rows first;
    `down_proj`: experts × hidden × ffn), as it does Qwen3-MoE's; its files keep the released layout runtime/hf.py
    reads. Qwen2-MoE's router and shared expert are named in memory as in its files. Phi-3's fused tensors are fused
    in memory too: our part's gradient is its rows (runtime/hf_names.py fused_rows)."""
    part = hf.fused_rows(name, lambda n: ours[n].shape[0], layout)
    if part is not None:
        return params[hf.hf_name(name, layout=layout)].grad[part[0]:part[1]]
    if "moe_shared_" in name:
        return params[hf.hf_name(name, layout=hf.QWEN_MOE)].grad
    if "moe_" not in name:
        return params[hf.hf_name(name)].grad
    layer, leaf, what = name.split(".")[1:]
    if leaf == "moe_router":
        return params[f"model.layers.{layer}.mlp.gate.weight"].grad
    gate_up = params[f"model.layers.{layer}.mlp.experts.gate_up_proj"].grad
    f = gate_up.shape[1] // 2
    return {"w_gate": lambda: gate_up[:, :f].transpose(1, 2), "w_up": lambda: gate_up[:, f:].transpose(1, 2),
            "w_down": lambda: params[f"model.layers.{layer}.mlp.experts.down_proj"].grad.transpose(1, 2)}[what]()


def test_a_missing_tensor_is_one_line(tmp_path):
    """`check` refuses a checkpoint without the model's tensors (tests/test_hf_header.py); the runtime, given one
    all the same (the program built for a Qwen 2 checkpoint, loading a Llama's), says so in one line."""
    from runtime import hf
    hf_model("llama", tmp_path / "hf")
    with pytest.raises(ScaleError) as info:  # Qwen 2 has q/k/v biases, Llama none
        check_text(scale_text("qwen2", tmp_path / "hf"), str(tmp_path / "q.scale"))
    (d,) = info.value.diagnostics
    assert d.code == "E0807" and "the model has biases the checkpoint lacks" in d.help
    hf_model("qwen2", tmp_path / "qwen2")
    _, prog = _program(tmp_path, scale_text("qwen2", tmp_path / "qwen2"))
    model = prog.Model()
    model.to_empty(device="cpu")
    with pytest.raises(SystemExit, match="has no tensor `model.layers.0.self_attn.q_proj.bias`"):
        hf.load(model, str(tmp_path / "hf"))


@pytest.mark.parametrize("rank", [0, 1])
def test_a_tp_rank_reads_its_rows_of_phi3s_fused_tensors(tmp_path, rank):
    """Under tp 2 each column-parallel parameter holds half its rows: tp rank r's q is rows [32r, 32r + 32) of q's
    64 rows of qkv_proj, its k rows 64 + [16r, 16r + 16), its v rows 96 + [16r, 16r + 16); its gate and up halves
    of gate_up_proj's 256-row parts. The module here has the names and tp-local shapes a tp rank's has (the e2e
    tp2_phi3 case runs it under torchrun); nothing but those rows is read."""
    from runtime import hf
    ref = hf_model("phi3", tmp_path / "hf")
    full = {"attn_q": 64, "attn_k": 32, "attn_v": 32, "mlp_gate": 256, "mlp_up": 256}
    root = torch.nn.Module()
    root.blocks = torch.nn.ModuleList([torch.nn.Module()])
    for leaf, rows in full.items():
        linear = torch.nn.Module()
        linear.weight = torch.nn.Parameter(torch.empty(rows // 2, 64))
        setattr(root.blocks[0], leaf, linear)
    shard_of = lambda name: (0, full[name.split(".")[2]], "tp")  # noqa: E731 (Shards.of: dim, full size, axis)
    loaded = hf.load(root, str(tmp_path / "hf"), shard_of=shard_of, axis_rank=lambda axis: rank)
    assert loaded.tensors_read == 2  # qkv_proj and gate_up_proj of layer 0, in parts
    assert loaded.bytes_read == sum(full.values()) // 2 * 64 * 4
    qkv = ref.model.layers[0].self_attn.qkv_proj.weight.detach()
    gate_up = ref.model.layers[0].mlp.gate_up_proj.weight.detach()
    b = root.blocks[0]
    r = rank
    assert torch.equal(b.attn_q.weight, qkv[32 * r:32 * r + 32])
    assert torch.equal(b.attn_k.weight, qkv[64 + 16 * r:64 + 16 * r + 16])
    assert torch.equal(b.attn_v.weight, qkv[96 + 16 * r:96 + 16 * r + 16])
    assert torch.equal(b.mlp_gate.weight, gate_up[128 * r:128 * r + 128])
    assert torch.equal(b.mlp_up.weight, gate_up[256 + 128 * r:256 + 128 * r + 128])


def gemma_model(kind: str, path):
    """A tiny random Gemma 2 (4 layers: sliding, full, ...; soft caps; scores over √16 where heads are 24 wide) or
    Gemma 3 (5 layers, sliding, sliding, full, sliding, sliding: a repeat of the three, then one of a sliding layer
    twice; q/k norms; a linearly scaled base on the full layer; `gemma3_whole`: 6 layers, two blocks of three, one
    repeat, which a pipeline can cut), saved to `path`; its norms away from zero."""
    kw = dict(vocab_size=128, hidden_size=64, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
              head_dim=24, max_position_embeddings=32, sliding_window=8, rms_norm_eps=1e-6, pad_token_id=None,
              attn_implementation="eager")
    if kind == "gemma2":
        config = transformers.Gemma2Config(**kw, num_hidden_layers=4, query_pre_attn_scalar=16,
                                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    else:
        kinds = ["sliding_attention", "sliding_attention", "full_attention"] * 2
        kinds = kinds if kind == "gemma3_whole" else kinds[:5]
        config = transformers.Gemma3TextConfig(
            **kw, num_hidden_layers=len(kinds), layer_types=kinds,
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # (1 + weight): zero is a scale of one
                p.normal_(0, 0.1)
    model.save_pretrained(path, safe_serialization=True)
    return model


@pytest.mark.parametrize("kind", ["gemma2", "gemma3"])
def test_imported_gemma_loads_and_computes_what_transformers_computes(tmp_path, kind):
    """`scalec import` of the checkpoint's config.json, started `from(...)` it: its layers lie several to a block
    (Gemma 2's pairs; Gemma 3's three, then one) and in two repeats, which the program reads by the stack it
    carries (runtime/hf_names.py); loss and gradients are transformers' (fp32, 1e-5)."""
    from compiler.importer import import_config
    from runtime import hf
    ref = gemma_model(kind, tmp_path / "hf")
    section = import_config((tmp_path / "hf" / "config.json").read_text(), str(tmp_path / "hf" / "config.json"))
    text = section + ("mesh { axis dp = 1  devices_per_node = 1 }\n"
                      "train { global_batch = 8  seq_len = seq  steps = 3  optimizer = adamw(lr = 1e-3)\n"
                      f"        init = from(\"{tmp_path / 'hf'}\") }}\n")
    compiled, prog = _program(tmp_path, text)
    sys.modules[prog.__name__] = prog
    stack = prog.CONFIG.init.stack
    assert stack == ((("blocks", 0, 2, 4),) if kind == "gemma2" else (("blocks", 0, 3, 4), ("blocks_2", 3, 1, 4)))
    model = prog.Model()
    model.to_empty(device="cpu")
    loaded = hf.load(model, str(tmp_path / "hf"), stack=stack)
    assert sorted(loaded.names) == sorted(n for n, _ in model.named_parameters())
    assert loaded.tensors_read == loaded.tensors  # every tensor of the checkpoint, none left over
    g = torch.Generator().manual_seed(3)
    tokens, targets = torch.randint(0, 128, (4, 32), generator=g), torch.randint(0, 128, (4, 32), generator=g)
    loss = model(tokens, targets)
    want = torch.nn.functional.cross_entropy(ref(input_ids=tokens).logits.flatten(0, 1), targets.flatten())
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=0)
    loss.backward()
    want.backward()
    params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        want_g = params[hf.hf_name(name, stack=stack)].grad
        err = (p.grad - want_g).norm() / want_g.norm()
        assert err <= 1e-5, f"{name}: gradient off by {err:.2e}"


# YaRN as DeepSeek's releases scale their rotary embeddings, over 8 of the test's 32 positions (the ramp keeps one
# of the 4 frequencies): mscale ≠ mscale_all_dim, so the cos/sin factor and the softmax scale both change
DEEPSEEK_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 8,
                 "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 1.0}


def deepseek_model(kind: str, path, yarn: bool = False):
    """A tiny random DeepseekV3ForCausalLM (q through its bottleneck, a dense first layer, then sigmoid-routed,
    group-limited experts beside a shared one, a random expert bias) or DeepseekV2ForCausalLM (q projected directly,
    softmax-routed experts, two shared), saved with save_pretrained; fp32."""
    transformers = pytest.importorskip("transformers")
    kw = dict(vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
              v_head_dim=12, n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1,
              max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False,
              rope_parameters=dict(DEEPSEEK_YARN) if yarn else {"rope_type": "default", "rope_theta": 10000.0})
    if kind == "deepseek_v3":
        config = transformers.DeepseekV3Config(**kw, q_lora_rank=24, n_shared_experts=1, n_group=2, topk_group=1,
                                               routed_scaling_factor=2.5, norm_topk_prob=True)
        cls = transformers.DeepseekV3ForCausalLM
    else:
        config = transformers.DeepseekV2Config(**kw, q_lora_rank=None, n_shared_experts=2, routed_scaling_factor=1.5)
        cls = transformers.DeepseekV2ForCausalLM
    torch.manual_seed(0)
    model = cls(config).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".mlp.gate.weight"):
                p.normal_(0, 0.3)  # decisive routing: the router starts at zero, every expert tied
            elif "layernorm" in name:
                p.normal_(1, 0.2)  # norms away from one, so a misplaced one shows
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0, 0.1)  # a bias that changes choices, so one not loaded shows
    model.save_pretrained(path, safe_serialization=True)
    return model


@pytest.mark.parametrize("kind,yarn", [("deepseek_v3", False), ("deepseek_v2", False), ("deepseek_v3", True),
                                       ("deepseek_v2", True)])
def test_imported_deepseek_loads_and_computes_what_transformers_computes(tmp_path, kind, yarn):
    """`scalec import` of the checkpoint's config.json (a dense repeat, then a mixture repeat), started `from(...)`
    it: the multi-head latent attention's leaves, the experts (transposed, one tensor each), the shared experts and
    V3's e_score_correction_bias (into the ExpertBias buffer) read from their Hugging Face names; loss and gradients
    are transformers' (fp32, 1e-5)."""
    from compiler.importer import import_config
    from runtime import hf
    ref = deepseek_model(kind, tmp_path / "hf", yarn)
    section = import_config((tmp_path / "hf" / "config.json").read_text(), str(tmp_path / "hf" / "config.json"))
    assert ("rope_scaling = yarn(factor = 4.0, original_seq = 8," in section) == yarn, section
    text = section + ("mesh { axis dp = 1  devices_per_node = 1 }\n"
                      "train { global_batch = 8  seq_len = seq  steps = 3  optimizer = adamw(lr = 1e-3)\n"
                      f"        init = from(\"{tmp_path / 'hf'}\") }}\n")
    compiled, prog = _program(tmp_path, text)
    sys.modules[prog.__name__] = prog
    stack = prog.CONFIG.init.stack
    assert stack == (("blocks", 0, 1, 2), ("blocks_2", 1, 1, 2))
    model = prog.Model()
    model.to_empty(device="cpu")
    loaded = hf.load(model, str(tmp_path / "hf"), stack=stack)
    assert sorted(loaded.names) == sorted(n for n, _ in model.named_parameters())
    assert loaded.tensors_read == loaded.tensors  # every tensor of the checkpoint, the expert bias too
    biases = {n: b for n, b in model.named_buffers() if n.endswith("moe_bias.bias")}
    assert len(biases) == (2 if kind == "deepseek_v3" else 0)
    for n, b in biases.items():
        layer = 1 + int(n.split(".")[1])
        torch.testing.assert_close(b, dict(ref.named_buffers())[f"model.layers.{layer}.mlp.gate.e_score_correction_bias"])
    g = torch.Generator().manual_seed(3)
    tokens, targets = torch.randint(0, 128, (4, 32), generator=g), torch.randint(0, 128, (4, 32), generator=g)
    loss = model(tokens, targets)
    want = torch.nn.functional.cross_entropy(ref(input_ids=tokens).logits.flatten(0, 1), targets.flatten())
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=0)
    loss.backward()
    want.backward()
    params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        if ".moe_experts." in name:  # transformers 5 keeps them fused in memory: gate_up_proj, down_proj
            layer = int(hf.hf_name(name, 0, hf.DEEPSEEK, stack).split(".")[2])
            gate_up = params[f"model.layers.{layer}.mlp.experts.gate_up_proj"].grad
            f = gate_up.shape[1] // 2
            want_g = {"w_gate": lambda: gate_up[:, :f].transpose(1, 2), "w_up": lambda: gate_up[:, f:].transpose(1, 2),
                      "w_down": lambda: params[f"model.layers.{layer}.mlp.experts.down_proj"].grad.transpose(1, 2)
                      }[name.rsplit(".", 1)[1]]()
        else:
            want_g = params[hf.hf_name(name, layout=hf.DEEPSEEK, stack=stack)].grad
        err = (p.grad - want_g).norm() / want_g.norm()
        assert err <= 1e-5, f"{name}: gradient off by {err:.2e}"
