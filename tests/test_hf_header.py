"""`init = from(...)` checked at `check` (compiler/hf_header.py): the safetensors headers and config.json of the
checkpoint against the tensors the program will read, so that a checkpoint of another architecture or size is
refused at the `init` line before any process starts. Tiny checkpoints are made with transformers in tmp_path
(tests/test_hf_weights.py's models); the checker itself imports neither torch nor runtime/."""
from __future__ import annotations

import json
import struct

import pytest

from compiler import hf_header as H
from compiler.check import check_text
from compiler.diagnostics import ScaleError
from tests.test_hf_weights import hf_model, scale_text

transformers = pytest.importorskip("transformers")  # the test-only extra (pyproject `dev`)

def _text(kind: str, path, *edits: tuple[str, str]) -> str:
    text = scale_text(kind, path)
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    return text


def _check(kind: str, path, *edits: tuple[str, str]):
    return check_text(_text(kind, path, *edits), str(path.parent / "tiny.scale"))


def _error(kind: str, path, *edits: tuple[str, str]):
    """The one error of checking the model against the checkpoint at `path`, which sits at the init path (an edit
    may add a warning of its own: a learned `positional` beside rotary embeddings, W0138)."""
    text = _text(kind, path, *edits)
    with pytest.raises(ScaleError) as info:
        check_text(text, str(path.parent / "tiny.scale"))
    (d,) = [d for d in info.value.diagnostics if d.severity == "error"]
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if "init " in ln)
    assert d.span.line == line and d.span.end_col - d.span.col == len(f'"{path}"'), d.span
    return d


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "mistral_head_dim", "phi3", "mixtral", "qwen3_moe"])
def test_names_and_shapes_are_the_models_and_runtime_hf_s(kind, tmp_path):
    """The torch-free restatement equals compiler.model's parameters under runtime.hf.hf_name, expert by expert;
    Phi-3's fused tensors are their parts' rows, stacked."""
    from compiler import model as M
    from runtime import hf
    spec = check_text(scale_text(kind, tmp_path / "none").replace('  init         = from("', '  # '), "t.scale")
    # Qwen-MoE's expert names (mlp.experts.j.*), Phi-3's fused qkv_proj and gate_up_proj
    layout = hf.QWEN_MOE if kind.startswith("qwen") else hf.PHI3 if kind == "phi3" else hf.MIXTRAL
    want = {}
    params = dict(M.build(spec).named_parameters())
    for name, p in params.items():
        if ".moe_experts." in name:
            for e in range(p.shape[0]):
                want[hf.hf_name(name, e, layout)] = tuple(p.shape[1:][::-1])
        elif (part := hf.fused_rows(name, lambda n: params[n].shape[0], layout)) is not None:
            want[hf.hf_name(name, layout=layout)] = (part[2], *p.shape[1:])
        else:
            want[hf.hf_name(name, layout=layout)] = tuple(p.shape)
    if kind == "phi3":  # 4 layers of qkv_proj (64 + 2 · 2 · 16 rows) and gate_up_proj (2 · 256 rows)
        assert {k: v for k, v in want.items() if k.endswith(("qkv_proj.weight", "gate_up_proj.weight"))} == {
            f"model.layers.{i}.{leaf}": shape for i in range(4) for leaf, shape in (
                ("self_attn.qkv_proj.weight", (128, 64)), ("mlp.gate_up_proj.weight", (512, 64)))}
    got, orphans = H.expected(spec.model, spec.value, layout)
    assert orphans == []
    assert {k: tuple(int(spec.value(d)) for d in shape) for k, (shape, _) in got.items()} == want
    assert len(want) > (24 if kind == "phi3" else 30)  # the layers' every tensor, experts one by one


def test_parameters_are_the_models_for_a_gpt_too():
    from pathlib import Path

    from compiler import model as M
    spec = check_text((Path(__file__).parents[1] / "samples" / "tiny_gpt.scale").read_text(), "tiny_gpt.scale")
    got = {k: tuple(int(spec.value(d)) for d in shape) for k, (shape, _) in H.parameters(spec.model,
                                                                                          spec.value).items()}
    assert got == {k: tuple(p.shape) for k, p in M.build(spec).named_parameters()}
    from runtime import hf

    def runtime_lacks(name):
        try:
            hf.hf_name(name)
        except KeyError:
            return True
        return False
    _, orphans = H.expected(spec.model, spec.value)
    assert [n for n, _ in orphans] == [n for n in got if runtime_lacks(n)] == ["pos.weight", "norm.bias"]


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "mistral_head_dim", "phi3", "mixtral", "qwen3_moe"])
def test_the_right_checkpoint_passes(kind, tmp_path):
    hf_model(kind, tmp_path / "hf")
    assert _check(kind, tmp_path / "hf").warnings == ()


def test_a_gpt2_checkpoint_is_another_architecture(tmp_path):
    config = transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=4, n_head=4, n_positions=32)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "hf", safe_serialization=True)
    d = _error("llama", tmp_path / "hf")
    assert d.code == "E0807"
    assert d.message.startswith(f"checkpoint {tmp_path / 'hf'} lacks 39 of the 39 tensors the model reads: "
                                "`model.embed_tokens.weight`, ")
    assert "it looks like another architecture (its config.json says GPT2LMHeadModel)" in d.help
    assert "h.0.attn.c_attn" in d.help


def test_a_wider_llama_is_a_shape_mismatch_that_names_the_size(tmp_path):
    hf_model("llama", tmp_path / "hf")  # hidden 64
    d = _error("llama", tmp_path / "hf", ("hidden = 64", "hidden = 32"))
    assert d.code == "E0808"
    assert d.message.startswith(f"`model.embed_tokens.weight` is 128 × 64 in checkpoint {tmp_path / 'hf'}, "
                                "128 × 32 in the model (")
    assert d.label == "hidden 64 in the checkpoint, 32 in the model"


def test_a_deeper_checkpoint_says_how_many_layers(tmp_path):
    hf_model("llama", tmp_path / "hf")
    d = _error("llama", tmp_path / "hf", ("layers = 4", "layers = 2"))
    assert d.code == "E0807" and "holds 18 tensors the model has no place for" in d.message
    assert "the checkpoint has 4 layers, the model 2" in d.help


def test_heads_that_shapes_cannot_show_are_read_from_config_json(tmp_path):
    hf_model("llama", tmp_path / "hf")
    d = _error("llama", tmp_path / "hf", ("heads = 4", "heads = 8"), ("kv_heads = 2", "kv_heads = 4"))
    assert d.code == "E0809"
    assert "num_attention_heads 4 there, heads 8 here; num_key_value_heads 2 there, kv_heads 4 here" in d.message


def test_a_model_outside_these_families_is_named(tmp_path):
    hf_model("llama", tmp_path / "hf")
    d = _error("llama", tmp_path / "hf", ("  embedding(vocab, hidden)\n",
                                          "  embedding(vocab, hidden)  positional(seq, hidden)\n"))
    assert d.code == "E0810" and d.message.startswith("the model's `pos.weight` (`positional`) has no counterpart")


def test_layernorm_biases_are_named_as_such(tmp_path):
    hf_model("llama", tmp_path / "hf")
    d = _error("llama", tmp_path / "hf", ("rmsnorm(hidden, eps = 1e-6)  attention", "layernorm(hidden)  attention"))
    assert d.code == "E0807" and "lacks 4 of the" in d.message and "LayerNorm's bias" in d.help


def _file(tmp_path, header: bytes, data: bytes = b"") -> str:
    path = tmp_path / "m.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return str(path)


@pytest.mark.parametrize("make,message", [
    (lambda t: (t / "m.safetensors").write_bytes(b"abc") and str(t / "m.safetensors"),
     "m.safetensors is 3 bytes, too short for a safetensors header"),
    (lambda t: _file(t, b'{"a": 1'), "the header of m.safetensors is not JSON"),
    (lambda t: _file(t, json.dumps({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}).encode(),
                     b"\0" * 8), "`w` lies at bytes 0..16 of m.safetensors's data, which holds 8: the file is cut"),
    (lambda t: _file(t, json.dumps({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 8]}}).encode(),
                     b"\0" * 8), "`w` of m.safetensors is 2 × 2 F32 (16 bytes) but spans 8"),
    (lambda t: _file(t, json.dumps({"w": {"dtype": "F32", "shape": [2]}}).encode()), "without a dtype, shape"),
], ids=["short", "json", "cut", "size", "fields"])
def test_a_damaged_header_is_one_line(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(H.HeaderError) as info:
        H.checkpoint_tensors(path)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_cut_checkpoint_is_refused_at_the_init_line(tmp_path):
    hf_model("llama", tmp_path / "hf")
    f = tmp_path / "hf" / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    d = _error("llama", tmp_path / "hf")
    assert d.code == "E0806" and "the file is cut short" in d.message


def test_a_sharded_checkpoint_is_read_through_its_index(tmp_path):
    model = hf_model("llama", tmp_path / "hf")
    model.save_pretrained(tmp_path / "sharded", safe_serialization=True, max_shard_size="100KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    assert H.checkpoint_tensors(str(tmp_path / "sharded")).keys() == H.checkpoint_tensors(str(tmp_path / "hf")).keys()
    assert _check("llama", tmp_path / "sharded").warnings == ()
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    (tmp_path / "sharded" / sorted(set(index["weight_map"].values()))[-1]).unlink()
    d = _error("llama", tmp_path / "sharded")
    assert d.code == "E0806" and "which is not there" in d.message


def test_check_of_a_checkpoint_and_a_token_file_imports_no_torch(tmp_path):
    from runtime.data import write_tokens
    from tests.test_front_door import _run
    hf_model("llama", tmp_path / "hf")
    write_tokens(str(tmp_path / "tok.bin"), list(range(128)) * 4, "uint16", 128)
    (tmp_path / "t.scale").write_text(_text("llama", tmp_path / "hf", (
        "  init         = from(", '  data = tokens(path = "tok.bin")\n  init         = from(')))
    got = _run("check", str(tmp_path / "t.scale"))
    assert got["rc"] == 0 and got["heavy"] == [], got
    f = tmp_path / "hf" / "model.safetensors"  # the check does read the header: cut it, and it says so
    f.write_bytes(f.read_bytes()[:-100])
    got = _run("check", str(tmp_path / "t.scale"))
    assert got["rc"] == 1 and "then the data" in got["out"] and got["heavy"] == [], got  # E0806's help


def test_the_mistake_tables_tiny_llama_fits_its_checkpoint():
    """The fixture the table's init cases are variations of (tests/mistakes/files/make_files_fixtures.py)."""
    from pathlib import Path

    from compiler.check import check_path
    assert check_path(str(Path(__file__).parent / "mistakes" / "files" / "files_llama.scale")).warnings == ()


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "mistral_head_dim", "phi3", "mixtral", "qwen3_moe"])
def test_the_model_scalec_import_writes_fits_its_checkpoint(kind, tmp_path):
    """No false alarm on the way tests/e2e/test_hf_init.py goes: the model section from config.json, then the
    checkpoint's own weights."""
    from compiler.importer import import_config
    hf_model(kind, tmp_path / "hf")
    config = tmp_path / "hf" / "config.json"
    text = import_config(config.read_text(), str(config)) + f"""
mesh {{
  axis dp = 1
  devices_per_node = 1
}}
train {{
  global_batch = 8
  seq_len      = seq
  steps        = 3
  optimizer    = adamw(lr = 1e-3)
  init         = from("{tmp_path / 'hf'}")
}}
"""
    assert check_text(text, str(tmp_path / "t.scale")).warnings == ()
    narrow = text.replace("  hidden   = 64 ", "  hidden   = 32 ")
    assert narrow != text
    with pytest.raises(ScaleError) as info:  # and the same section, narrower, is refused
        check_text(narrow, str(tmp_path / "t.scale"))
    assert [d.code for d in info.value.diagnostics] == ["E0808"]


def test_a_qwen3_checkpoint_needs_the_models_qk_norms(tmp_path):
    """Without `qk_norm = rmsnorm` the model has no place for Qwen 3's q_norm and k_norm: refused at `check`, not
    silently dropped by the run."""
    hf_model("qwen3", tmp_path / "hf")
    d = _error("qwen3", tmp_path / "hf", ("qk_norm = rmsnorm, ", ""))
    assert d.code == "E0807" and "self_attn.q_norm.weight" in d.message, d.message


def test_a_qwen3_moe_checkpoints_config_is_read_for_what_shapes_cannot_show(tmp_path):
    """A Qwen3-MoE checkpoint (its expert count written as transformers 5's num_local_experts): the gates'
    renormalisation and top_k have no shape, so config.json's norm_topk_prob and num_experts_per_tok are held
    against the `moe`; the experts' names are Qwen-MoE's (`mlp.experts.j.*_proj`), the model's without q/k norms
    lacks q_norm and k_norm."""
    hf_model("qwen3_moe", tmp_path / "hf")
    assert "num_local_experts" in json.loads((tmp_path / "hf" / "config.json").read_text())
    d = _error("qwen3_moe", tmp_path / "hf", ("renormalize = true", "renormalize = false"),
               ("top_k = 2", "top_k = 3"))
    assert d.code == "E0809"
    assert "num_experts_per_tok 2 there, top_k 3 here; norm_topk_prob true there, renormalize false here" \
        in d.message, d.message
    d = _error("qwen3_moe", tmp_path / "hf", ("4, top_k = 2", "8, top_k = 2"))
    assert d.code == "E0807" and "lacks 48 of the" in d.message, d.message
    d = _error("qwen3_moe", tmp_path / "hf", ("qk_norm = rmsnorm, ", ""))
    assert d.code == "E0807" and "self_attn.q_norm.weight" in d.message, d.message


def test_a_phi3_checkpoints_fused_tensors_are_held_against_their_parts(tmp_path):
    """Phi-3's qkv_proj holds q, k and v's rows, gate_up_proj gate and up's: a fused tensor cut short in the file is
    refused at the init line, naming the tensor and the model's sum of its parts (before any process would read
    rows of it that are not there); a model of other kv_heads, whose q, k, v rows sum to another count, the same
    way."""
    from safetensors.torch import load_file, save_file
    hf_model("phi3", tmp_path / "hf")
    assert _check("phi3", tmp_path / "hf").warnings == ()
    f = tmp_path / "hf" / "model.safetensors"
    tensors = load_file(f)
    assert tensors["model.layers.2.self_attn.qkv_proj.weight"].shape == (128, 64)  # q 64, k 32, v 32 rows
    tensors["model.layers.2.self_attn.qkv_proj.weight"] = tensors["model.layers.2.self_attn.qkv_proj.weight"][:96]
    save_file(tensors, f, metadata={"format": "pt"})
    d = _error("phi3", tmp_path / "hf")
    assert d.code == "E0808", d.message
    assert d.message == (f"`model.layers.2.self_attn.qkv_proj.weight` is 96 × 64 in checkpoint {tmp_path / 'hf'}, "
                         "128 × 64 in the model"), d.message
    hf_model("phi3", tmp_path / "hf")  # whole again: a model of 4 kv_heads reads 64 + 2 · 64 rows there
    d = _error("phi3", tmp_path / "hf", ("kv_heads = 2", "kv_heads = 4"))
    assert d.code == "E0808" and d.message == (f"`model.layers.0.self_attn.qkv_proj.weight` is 128 × 64 in checkpoint "
                                               f"{tmp_path / 'hf'}, 192 × 64 in the model (3 more tensors differ)")


@pytest.mark.parametrize("kind", ["gemma2", "gemma3"])
def test_a_gemma_checkpoint_is_held_to_the_model_layer_by_layer(kind, tmp_path):
    """A Gemma checkpoint's layers lie several to a block (the stack, runtime/hf_names.py): the model `scalec
    import` writes fits with no warning; what shapes cannot show (each layer's window, soft cap, score scale, rotary
    base, the embedding's scale) is read from config.json through the importer and held layer by layer; a layer
    moved to the other kind, or a missing post-norm, is refused before launch."""
    from compiler.importer import import_config
    from tests.test_hf_weights import gemma_model
    gemma_model(kind, tmp_path / "hf")
    config = tmp_path / "hf" / "config.json"
    text = import_config(config.read_text(), str(config)) + (
        "mesh { axis dp = 1  devices_per_node = 1 }\n"
        "train { global_batch = 8  seq_len = seq  steps = 3  optimizer = adamw(lr = 1e-3)\n"
        f"        init = from(\"{tmp_path / 'hf'}\") }}\n")
    assert check_text(text, str(tmp_path / "t.scale")).warnings == ()
    cases = [(("window = window,", "", 1), "E0809", "layer 0's attention: window 8"),
             (("embedding(vocab, hidden, scaled = true)", "embedding(vocab, hidden)", 1), "E0809",
              "the embedding: scaled by √hidden there, unscaled here")]
    if kind == "gemma2":
        cases.append((("softcap = 50.0,", "softcap = 40.0,", 1), "E0809", "softcap 50.0"))
    for (old, new, n), code, says in cases:
        with pytest.raises(ScaleError) as info:
            check_text(text.replace(old, new, n), str(tmp_path / "t.scale"))
        (d,) = info.value.diagnostics
        assert d.code == code and says in d.message, d.message
