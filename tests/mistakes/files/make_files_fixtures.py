"""Writes the fixtures of the tests/mistakes/files_*.scale cases (each a few KB): token files with and without a
sidecar, and tiny safetensors checkpoints shaped as tiny models. Run from the repository root after changing it:

    PYTHONPATH=. python tests/mistakes/files/make_files_fixtures.py
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from runtime.data import write_tokens

HERE = Path(__file__).parent


def tokens() -> None:
    ids = np.random.default_rng(0).integers(0, 128, 200)
    write_tokens(str(HERE / "files_uint32_tokens.bin"), ids, "uint32", 128)        # uint32, with its sidecar
    ids.astype("<u4").tofile(HERE / "files_uint32_bare.bin")                        # uint32, no sidecar
    (HERE / "files_odd_size.bin").write_bytes(ids.astype("<u2").tobytes()[:301])   # cut mid-id
    write_tokens(str(HERE / "files_gpt2_tokens.bin"), ids, "uint16", 50257, tokenizer="gpt2")


def typed_tokens() -> None:
    """Token files that say (or should say) their dtype: np.save's .npy files and a bare int64 file, as numpy
    writes ids by default. Ids below GPT-2's vocabulary: read as uint16, a .npy header's bytes are ids too."""
    ids = np.random.default_rng(1).integers(0, 50257, 200)
    np.save(HERE / "files_int64_tokens.npy", ids)                                    # int64, by its header
    np.save(HERE / "files_float_tokens.npy", ids.astype(np.float32))                 # not ids
    np.save(HERE / "files_windows_tokens.npy", ids.reshape(10, 20))                  # two dimensions
    whole = (HERE / "files_int64_tokens.npy").read_bytes()
    (HERE / "files_cut_tokens.npy").write_bytes(whole[:-12])                         # cut short
    ids.astype("<u2").tofile(HERE / "files_flat_named.npy")                          # no header under the name
    (ids % 128).astype("<i8").tofile(HERE / "files_int64_bare.bin")                  # int64, no sidecar
    from runtime.indexed import Writer  # Megatron's layout: PREFIX.idx says int32 (a vocabulary past 65536)
    megatron = Writer(str(HERE / "files_megatron"), vocab_size=100_000)
    for doc in np.array_split(ids % 128, 4):
        megatron.add(doc)
    megatron.close()
    (HERE / "files_megatron.bin.json").unlink()  # as Megatron's preprocess_data.py writes it: no sidecar
    shutil.copyfile(HERE / "files_megatron.bin", HERE / "files_megatron_int16.bin")
    index = bytearray((HERE / "files_megatron.idx").read_bytes())
    index[17] = 3  # the dtype code of int16 ids, which are not read as token ids
    (HERE / "files_megatron_int16.idx").write_bytes(bytes(index))
    np.save(HERE / "files_big_endian_tokens.npy", (ids % 128).astype(">u2"))          # big-endian


# The tiny Llama of files_llama.scale: vocab 16, hidden 8, heads 2, kv_heads 1, one layer, ffn 16, untied head.
LLAMA = {"vocab_size": 16, "hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1,
         "num_hidden_layers": 1, "intermediate_size": 16}


def llama_tensors(vocab: int, hidden: int, heads: int, kv_heads: int, layers: int, ffn: int) -> dict:
    """Hugging Face's names and shapes of a Llama (zeros in fp16: the headers are what check reads)."""
    hd = hidden // heads
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
              "lm_head.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
                       p + "self_attn.q_proj.weight": (heads * hd, hidden),
                       p + "self_attn.k_proj.weight": (kv_heads * hd, hidden),
                       p + "self_attn.v_proj.weight": (kv_heads * hd, hidden),
                       p + "self_attn.o_proj.weight": (hidden, heads * hd),
                       p + "mlp.gate_proj.weight": (ffn, hidden), p + "mlp.up_proj.weight": (ffn, hidden),
                       p + "mlp.down_proj.weight": (hidden, ffn)})
    return {k: np.zeros(v, dtype=np.float16) for k, v in shapes.items()}


def llama_config(**sizes) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False, "max_position_embeddings": 16,
            **sizes}


def gpt2_tensors(vocab: int, hidden: int, layers: int, positions: int) -> dict:
    """GPT-2's names and shapes (Conv1D weights are in × out), as its released model.safetensors has them."""
    shapes = {"wte.weight": (vocab, hidden), "wpe.weight": (positions, hidden), "ln_f.weight": (hidden,),
              "ln_f.bias": (hidden,)}
    for i in range(layers):
        p = f"h.{i}."
        shapes.update({p + "ln_1.weight": (hidden,), p + "ln_1.bias": (hidden,), p + "ln_2.weight": (hidden,),
                       p + "ln_2.bias": (hidden,), p + "attn.c_attn.weight": (hidden, 3 * hidden),
                       p + "attn.c_attn.bias": (3 * hidden,), p + "attn.c_proj.weight": (hidden, hidden),
                       p + "attn.c_proj.bias": (hidden,), p + "mlp.c_fc.weight": (hidden, 4 * hidden),
                       p + "mlp.c_fc.bias": (4 * hidden,), p + "mlp.c_proj.weight": (4 * hidden, hidden),
                       p + "mlp.c_proj.bias": (hidden,)})
    return {k: np.zeros(v, dtype=np.float16) for k, v in shapes.items()}


def checkpoint(name: str, tensors: dict, config: dict) -> None:
    from safetensors.numpy import save_file
    out = HERE / name
    out.mkdir(exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def checkpoints() -> None:
    sizes = dict(vocab=16, hidden=8, heads=2, kv_heads=1, layers=1, ffn=16)
    checkpoint("files_llama", llama_tensors(**sizes), llama_config(**LLAMA))
    wide = {**sizes, "hidden": 16, "ffn": 32}
    checkpoint("files_llama_wide", llama_tensors(**wide),
               llama_config(**{**LLAMA, "hidden_size": 16, "intermediate_size": 32}))
    checkpoint("files_gpt2", gpt2_tensors(vocab=16, hidden=8, layers=1, positions=16),
               {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 8, "n_head": 2,
                "n_layer": 1, "n_positions": 16, "vocab_size": 16})


def run_checkpoint() -> None:
    """files_llama_run/step_00000002: a checkpoint of files_llama.scale's model as its program saves one (DCP's
    files and the scalec.json manifest: the model's names, whole shapes and fingerprint, each file's size and
    CRC32), zeros and no optimizer state, which nothing that reads it before refusing another model needs."""
    import shutil

    import torch
    import torch.distributed.checkpoint as dcp

    from compiler import pipeline, reshard
    from runtime.checkpoint import MANIFEST, crc32, fingerprint
    model = pipeline.compile_checked(str(HERE / "files_llama.scale"), memory=False).traced.model
    shapes = {n: list(s) for n, s in reshard.model_state(model).items()}
    step = HERE / "files_llama_run" / "step_00000002"
    shutil.rmtree(step.parent, ignore_errors=True)
    dcp.save({"model": {n: torch.zeros(s) for n, s in shapes.items()}}, checkpoint_id=str(step))
    files = {p.name: {"bytes": p.stat().st_size, "crc32": crc32(str(p))} for p in sorted(step.iterdir())}
    manifest = {"format": 1, "model": {"sha256": fingerprint(shapes), "parameters": sorted([n, s] for n, s in
                                                                                           shapes.items())},
                "files": files}
    (step / MANIFEST).write_text(json.dumps(manifest, indent=1))


if __name__ == "__main__":
    tokens()
    typed_tokens()
    checkpoints()
    run_checkpoint()
