"""bench/gpu.py and bench/handwritten.py: both sides are the same architecture, and the CPU smoke run gives a
complete, sane table (every column, one FLOP count, finite ratio); a failed column is reported, not hidden."""
from __future__ import annotations

import json
import math
import os
import statistics

import pytest
import torch

from bench import gpu
from bench.handwritten import GPT


def _generated_model(name: str, b: gpu.Bench, device: str, tmp_path):
    from bench.common import load_program
    where, plan = gpu.build(name, b, tmp_path / name, device, "fp32", False, 10)
    return load_program(where, f"scalec_test_bench_{name}"), plan


@pytest.mark.parametrize("catalogue,device", [(gpu.MODELS, "h100"), (gpu.CPU_MODELS, "cpu")])
def test_parameter_counts_match(catalogue, device, tmp_path):
    """Every model's generated Model and hand-written GPT hold the same parameters (counted on meta: the 1.1B
    costs nothing), which is also the compiler's count in plan.json."""
    for name, b in catalogue.items():
        program, plan = _generated_model(name, b, device, tmp_path)
        with torch.device("meta"):
            ours = sum(p.numel() for p in program.Model().parameters())
            hand = sum(p.numel() for p in GPT(b.arch).parameters())
        assert ours == hand == plan["cost"]["parameters"], name
    assert 1.0e9 < plan["cost"]["parameters"] < 1.2e9 if device == "h100" else True


def _copy_into(hand: GPT, ours: torch.nn.Module) -> None:
    """The generated model's weights into the hand-written one (q, k, v and gate, up concatenated)."""
    o = dict(ours.named_parameters())
    a = hand.a
    with torch.no_grad():
        hand.wte.weight.copy_(o["embed.weight"])
        if a.positional:
            hand.wpe.weight.copy_(o["pos.weight"])
        for i, blk in enumerate(hand.blocks):
            p = f"blocks.{i}."
            names = [("ln_1", "norm_1"), ("proj", "attn_o"), ("ln_2", "norm_2"), ("down", "mlp_down")]
            for mine, theirs in names:
                for kind in ("weight", "bias"):
                    if getattr(getattr(blk, mine), kind, None) is not None:
                        getattr(getattr(blk, mine), kind).copy_(o[f"{p}{theirs}.{kind}"])
            fc = ["mlp_gate", "mlp_up"] if a.act == "swiglu" else ["mlp_up"]
            for mine, parts in (("qkv", ["attn_q", "attn_k", "attn_v"]), ("fc", fc)):
                for kind in ("weight", "bias"):
                    if getattr(getattr(blk, mine), kind, None) is not None:
                        getattr(getattr(blk, mine), kind).copy_(torch.cat([o[f"{p}{x}.{kind}"] for x in parts]))
        for kind in ("weight", "bias"):
            if getattr(hand.ln_f, kind, None) is not None:
                getattr(hand.ln_f, kind).copy_(o[f"norm.{kind}"])
        if not a.tied:
            hand.head.weight.copy_(o["lm_head.weight"])


@pytest.mark.parametrize("name", ["gpt_tiny", "llama_tiny"])
def test_same_function_as_the_generated_model(name, tmp_path):
    """With the generated model's weights, the hand-written model computes the same function: the final norm's
    output (float64, before the fp32 loss) to 1e-10, the loss, and the gradients (only fused linears differ)."""
    b = gpu.CPU_MODELS[name]
    program, _ = _generated_model(name, b, "cpu", tmp_path)
    torch.manual_seed(0)
    ours = program.Model().double()
    for p in ours.parameters():  # every parameter random, so that a misplaced one shows
        torch.nn.init.normal_(p, 0.0, 0.3)
    hand = GPT(b.arch).double()
    _copy_into(hand, ours)
    seen = {}
    ours.norm.register_forward_hook(lambda _m, _a, out: seen.__setitem__("ours", out))
    hand.ln_f.register_forward_hook(lambda _m, _a, out: seen.__setitem__("hand", out))
    seq = torch.randint(0, b.arch.vocab, (2, b.arch.seq + 1))
    loss_ours, loss_hand = ours(seq[:, :-1], seq[:, 1:]), hand(seq[:, :-1], seq[:, 1:])
    assert (seen["ours"] - seen["hand"]).abs().max().item() < 1e-10
    assert loss_hand.item() == pytest.approx(loss_ours.item(), rel=1e-6)
    loss_ours.backward()
    loss_hand.backward()
    assert torch.allclose(hand.wte.weight.grad, ours.embed.weight.grad, rtol=1e-4, atol=1e-7)
    assert torch.allclose(hand.blocks[1].down.weight.grad, ours.blocks[1].mlp_down.weight.grad, rtol=1e-4,
                          atol=1e-7)


def _check_smoke(res: dict, printed: str, columns, steps: int, warmup: int) -> None:
    """The table and JSON of a CPU smoke run are complete and consistent."""
    for m in res["models"]:
        assert sorted(m["columns"]) == sorted(columns)
        peak = res["peak_tflops"] * 1e12
        for col, c in m["columns"].items():
            assert c["error"] is None, (col, c["error"])
            assert c["flops_per_step"] == m["flops_per_step"] > 0, col
            assert math.isfinite(c["median_ms"]) and c["median_ms"] > 0, col
            assert c["steady_steps"] == [warmup + 1, steps], col
            assert c["tokens_per_s"] == pytest.approx(m["tokens_per_step"] / (c["median_ms"] / 1e3)), col
            assert c["mfu"] == pytest.approx(m["flops_per_step"] / (c["median_ms"] / 1e3) / peak), col
            assert 0 < c["mfu"] < 1, col
            assert c["peak_memory_bytes"] is None, col  # CUDA's counter only
            assert abs(c["loss_first"] - math.log(m["arch"]["vocab"])) < 1.0, (col, c["loss_first"])
            assert gpu.TITLES[col] in printed, col
            assert len(c["step_times_ms"]) == c["rounds"] == res["rounds"], col
            pooled = [t for run in c["step_times_ms"] for t in run[warmup:]]
            assert len(pooled) == res["rounds"] * (steps - warmup), col
            assert c["median_ms"] == pytest.approx(statistics.median(pooled), rel=1e-3, abs=1e-3), col
        best = (min(m["columns"][c]["median_ms"] for c in gpu.OURS if c in columns)
                / min(m["columns"][c]["median_ms"] for c in gpu.HAND if c in columns))
        assert m["ours_over_hand"] == pytest.approx(best) and math.isfinite(best)
        assert f"ours / best hand-written (ms/step): {best:.3f}" in printed
        # the compiler's count for the architecture: 6 N per token (N: the matmuls' parameters, head included)
        # plus attention's 12 L h s² per sequence (Megatron-LM's count)
        a = m["arch"]
        kv = a["hidden"] // a["heads"] * a["kv_heads"]
        mlp = (3 if a["act"] == "swiglu" else 2) * a["hidden"] * a["ffn"]
        n = a["layers"] * (a["hidden"] * (2 * a["hidden"] + 2 * kv) + mlp) + a["vocab"] * a["hidden"]
        attention = 12 * a["layers"] * a["hidden"] * a["seq"] ** 2 * m["batch"]
        assert m["flops_per_step"] == 6 * n * m["tokens_per_step"] + attention


# slow tier: 14 s here; tests/test_gpu_check.py's dry run (CI) runs both eager columns of bench/gpu.py the same way
# and holds every row a measurement
@pytest.mark.slow
@pytest.mark.e2e
def test_cpu_smoke_eager_columns(tmp_path, capsys):
    """The Llama-style tiny model, both eager columns, two alternating rounds of a few steps (~10 s; the compiled
    columns' cold compilation takes ~40 s each on this CPU: test_cpu_smoke_all_four_columns)."""
    out = tmp_path / "gpu.json"
    columns = ["ours_eager", "hand_eager"]
    assert gpu.main(["--device", "cpu", "--models", "llama_tiny", "--columns", ",".join(columns), "--steps", "5",
                     "--warmup", "2", "--rounds", "2", "--json", str(out)]) == 0
    _check_smoke(json.loads(out.read_text()), capsys.readouterr().out, columns, 5, 2)


def test_compiled_columns_are_compiled(tmp_path):
    """What the compiled columns run, without running it: the generated program of `compile = true` and the
    hand-written loop with --compile; the eager ones neither."""
    from bench.common import load_program
    b = gpu.CPU_MODELS["gpt_tiny"]
    for compile_on in (True, False):
        where, plan = gpu.build("gpt_tiny", b, tmp_path / str(compile_on), "cpu", "fp32", compile_on, 10)
        assert plan["plan"]["compile"] is compile_on
        assert load_program(where, f"scalec_test_compiled_{compile_on}").CONFIG.parallel.compile is compile_on
    args = gpu.argparse.Namespace(steps=5, device="cpu")
    assert "--compile" in gpu.column_command("hand_compiled", None, b, {}, args, tmp_path / "m")
    assert "--compile" not in gpu.column_command("hand_eager", None, b, {}, args, tmp_path / "m")
    from bench import handwritten
    records = handwritten.train(b.arch, {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1,
                                         "grad_clip": 1.0}, steps=2, batch=2, device="cpu", precision="fp32",
                                compile_model=False, seed=0, metrics_path=None)
    assert [r["step"] for r in records] == [1, 2] and all(math.isfinite(r["loss"]) for r in records)


@pytest.mark.skipif(not os.environ.get("SCALEC_BENCH_COMPILED"),
                    reason="~100 s on a cold torch.compile cache (set SCALEC_BENCH_COMPILED=1)")
def test_cpu_smoke_all_four_columns(tmp_path, capsys):
    """Every column, the compiled ones included, on the tiny GPT."""
    out = tmp_path / "gpu.json"
    assert gpu.main(["--device", "cpu", "--models", "gpt_tiny", "--steps", "4", "--warmup", "1",
                     "--json", str(out)]) == 0
    _check_smoke(json.loads(out.read_text()), capsys.readouterr().out, gpu.COLUMNS, 4, 1)


def test_a_failed_column_is_reported(tmp_path, capsys):
    """A run that does not finish (here: a timeout far too short) fails the bench and says which column."""
    out = tmp_path / "gpu.json"
    assert gpu.main(["--device", "cpu", "--models", "gpt_tiny", "--columns", "hand_eager", "--steps", "3",
                     "--warmup", "1", "--timeout", "0.05", "--json", str(out)]) == 1
    captured = capsys.readouterr()
    assert "FAILED: timed out" in captured.out and "gpt_tiny/hand_eager" in captured.err
    (m,) = json.loads(out.read_text())["models"]
    assert m["ours_over_hand"] is None and "median_ms" not in m["columns"]["hand_eager"]
