"""The words users write are pinned: a new keyword, setting or flag must be added here on purpose (and to
docs/language.md or the page of its topic), never slip in."""
from __future__ import annotations

import argparse

from compiler import check, parse
from compiler.cli import main


def test_language_vocabulary_is_pinned():
    assert check.SECTIONS == ("model", "mesh", "plan", "train", "resilience")
    assert {k: tuple(v) for k, v in check.LAYERS.items()} == {
        "embedding": ("vocab", "hidden", "scaled"), "positional": ("positions", "hidden"), "layernorm": ("hidden", "eps"),
        "rmsnorm": ("hidden", "eps", "zero_centered"), "attention": ("hidden", "heads", "kv_heads", "bias", "qkv_bias",
                                                                   "rope_theta", "rope_scaling", "head_dim",
                                                                   "qk_norm", "qk_norm_eps", "window", "softcap",
                                                                       "query_scale"),
        "mla": ("hidden", "heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                "v_head_dim", "rope_theta", "rope_interleave", "norm_eps", "rope_scaling"),
        "mlp": ("hidden", "ffn", "act", "bias"),
        "moe": ("hidden", "ffn", "experts", "top_k", "capacity_factor", "act", "aux_loss", "dropped",
                "renormalize", "shared_ffn", "shared_gate", "scoring", "groups", "topk_groups", "routed_scale",
                "bias_update", "dispatch", "rebalance"),
        "residual": (),
        "lm_head": ("vocab", "hidden", "tied", "bias", "softcap"), "cross_entropy": ()}
    assert tuple(check.MESH_SETTINGS) == ("nodes", "devices_per_node", "device", "peak_tflops", "memory_gb",
                                          "intra_node_gbps", "inter_node_gbps", "hbm_gbps",
                                          "matmul_efficiency", "attention_efficiency", "intra_node_latency_us", "inter_node_latency_us",
                                          "op_overhead_us", "fabric", "topology", "scale_up", "placement",
                                          "active_w", "communicating_w", "idle_w", "host_w", "network_w",
                                          "usd_per_gpu_hour", "pue", "grid")
    from compiler.language import GRIDS
    assert {k: tuple(v) for k, v in GRIDS.items()} == {"region": ("name",), "intensity": ("g_per_kwh", "region")}
    assert check.FABRICS == ("ib", "roce")
    assert {k: tuple(v) for k, v in check.TOPOLOGIES.items()} == {
        "fat_tree": ("nodes_per_leaf", "nodes_per_pod", "oversubscription"),
        "rail_optimized": ("nodes_per_group", "nodes_per_pod", "oversubscription", "pxn"),
        "torus": ("x", "y", "z", "wrap"),
        "dragonfly": ("groups", "nodes_per_group", "nodes_per_switch", "global_oversubscription"),
        "from": ("path", "oversubscription")}
    assert tuple(check.PLAN_SETTINGS) == ("data_parallel", "micro_batches", "tp_layers", "sequence_parallel",
                                          "pad_vocab", "schedule", "virtual_stages", "layout", "recompute",
                                          "compile", "grad_reduce", "fp32_residual",
                                          "fsdp_grad_sync", "context_parallel", "offload", "ep_dispatch")
    assert {k: tuple(v) for k, v in check.OFFLOADS.items()} == {"none": (), "optimizer": ("fraction",), "params": (),
                                                                "activations": ("modules",)}
    assert tuple(check.TRAIN_SETTINGS) == ("global_batch", "seq_len", "steps", "tokens", "seed", "precision", "optimizer",
                                           "lr_schedule", "grad_clip", "data", "log_every", "init", "checkpoint_dir",
                                           "checkpoint_every", "checkpoint_async", "restarts", "timeout",
                                           "eval_every", "eval_batches", "eval_split")
    assert tuple(check.RESILIENCE_SETTINGS) == ("stragglers", "on_straggler", "interruptions", "restart",
                                                "storage_write_gbps", "storage_read_gbps")
    assert {k: tuple(v) for k, v in check.STRAGGLERS.items()} == {"detect": ("threshold", "window"), "off": ()}
    assert {k: tuple(v) for k, v in check.ON_STRAGGLER.items()} == {"report": (), "restart": ("exclude",),
                                                                    "replan": ()}
    assert {k: tuple(v) for k, v in check.INTERRUPTIONS.items()} == {"observed": ("count", "days", "gpus"),
                                                                     "per_gpu_hour": ("rate",)}
    assert {k: tuple(v) for k, v in check.OPTIMIZERS.items()} == {"adamw": ("lr", "betas", "weight_decay", "eps")}
    assert {k: tuple(v) for k, v in check.SCHEDULES.items()} == {"cosine": ("warmup", "min_lr"),
                                                                 "constant": ("warmup",)}
    assert {k: tuple(v) for k, v in check.DATASETS.items()} == {"synthetic": (), "tokens": ("path", "dtype", "document_separator")}
    assert {k: tuple(v) for k, v in check.INITS.items()} == {"normal": (), "from": ("path",)}
    from compiler.layers.attention import ROPE_SCALINGS
    assert {k: tuple(v) for k, v in ROPE_SCALINGS.items()} == {
        "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_seq"), "linear": ("factor",),
        "yarn": ("factor", "original_seq", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor",
                 "truncate")}
    assert check.KNOWN_AXES == ("dp", "pp", "tp", "ep", "cp")
    assert parse.ESCAPES == {"\\": "\\", '"': '"', "n": "\n", "t": "\t"}  # string escapes (docs/language.md)


def test_cli_flags_are_pinned(monkeypatch):
    seen = {}
    real = argparse.ArgumentParser.parse_args

    def capture(self, *a, **kw):
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    seen[name] = sorted(o for act in sub._actions for o in act.option_strings)
        raise SystemExit(0)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    try:
        main(["check", "x"])
    except SystemExit:
        pass
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", real)
    assert {k: set(v) for k, v in seen.items()} == {
        "check": {"-h", "--help"}, "explain": {"-h", "--help"}, "plan": {"-h", "--help", "--svg", "--json", "--html"},
        "compile": {"-h", "--help", "-o", "--output", "--show-graphs", "--force"},
        "run": {"-h", "--help", "-o", "--output", "--metrics", "--steps", "--torchrun-args",
                "--local-nodes", "--slurm", "--force", "--resume-changed", "--resume-schedule"},
        "reshard": {"-h", "--help"}, "import": {"-h", "--help", "-o", "--output"},
        "export": {"-h", "--help", "-o", "--output", "--config"},
        "search": {"-h", "--help", "--top", "--fix", "-o", "--output", "--json", "--html", "--headroom", "--nodes",
                   "--minimize", "--deadline", "--budget", "--max-devices"},
        "network": {"-h", "--help", "--op", "--size", "--ranks", "--group", "--json", "--measured"},
        "data": {"-h", "--help", "--tokenizer", "-o", "--output", "--text-key", "--separator", "--quiet"}}


def test_program_flags_are_pinned(monkeypatch):
    """The flags of a generated program (runtime.train), pinned as the CLI's are."""
    import sys

    from runtime import train
    from runtime.config import Data, Optim, Parallel
    seen = []

    def capture(self, *a, **kw):
        seen.extend(o for act in self._actions for o in act.option_strings)
        raise SystemExit(0)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    monkeypatch.setattr(sys, "argv", ["program.py"])
    cfg = train.Config(name="m", source="m.scale", steps=1, seed=0, parallel=Parallel(axes=(("dp", 1),)),
                       optim=Optim(lr=1e-3), data=Data(global_batch=1, seq_len=2, vocab=3))
    try:
        train._parse_args(cfg)
    except SystemExit:
        pass
    assert set(seen) == {"-h", "--help", "--steps", "--seed", "--metrics", "--tensorboard", "--wandb", "--wandb-dir",
                         "--mlflow", "--dump-grads", "--checkpoint-dir", "--stop-after", "--count-bytes",
                         "--memory-report", "--debug", "--resume-changed", "--resume-schedule"}
