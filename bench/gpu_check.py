"""The prepared GPU check: one command, inside a fixed time budget, whenever a GPU is at hand (issue 39, item 5).

    python -m bench.gpu_check                              # CUDA: the whole check, inside --budget (default 420 s)
    python -m bench.gpu_check --json out.json              # the record (default: gpu_check.json in the cwd)
    python -m bench.gpu_check --device cpu --quick         # the dry run the suite runs (tests/test_gpu_check.py)

What it measures, in this order (the order is the priority: when the budget runs out, what is left is skipped and
recorded as skipped, never silently missing):
1. kernels: the rates the step-time model (compiler/cost/step_time.py) assumes, each against the figure it assumes
   (compiler/layout/devices.py): a device-to-device copy (`hbm_gbps`); bf16 matmuls at 8192³ and at the shapes of
   the programs below (`peak_tflops × matmul_efficiency`); SDPA's fused (flash) attention forward and forward +
   backward, causal, at seq 1K-32K (`peak_tflops × attention_efficiency`); FlexAttention with a block mask (causal
   documents) beside SDPA at one length; F.grouped_mm at an MoE layer's shapes, and beside a copy of its all-to-all's
   payload on a second stream (DualPipe's overlap, `overlap_rows`); FP8: the tensorwise-scaled cast of
   a bf16 activation (GB/s) and torch._scaled_mm at 8192³ where the device has it.
2. checkpoint and resume: a tiny generated program saves a checkpoint and a longer run extends it, in the
   device's precision (bf16 on CUDA: the fused AdamW's state and step go through DCP and back).
3. programs, eager: per model (GPT-2 124M and 350M, a ~1.1B Llama; bench/gpu.py's catalogue), the generated
   program (`plan { compile = false }`) and the hand-written nanoGPT-style loop (bench/handwritten.py) side by side:
   median ms/step, MFU, the measured peak (CUDA's max_memory_allocated over the steady steps) against `plan`'s
   predicted peak, and the measured step time against `plan`'s predicted step time;
   and the joules per step the generated program measured itself (runtime/energy.py: NVML's energy counter on
   CUDA, RAPL on CPU; its metrics records' figure over the steady logged intervals) beside the compiler's
   prediction (`Config.predicted_joules_per_step`, empty until the compiler writes one), or why nothing was
   measured: no GPU time of its own, the programs' runs already read the counter.
4. programs, compiled: the same with `compile = true` and the hand-written loop under torch.compile, GPT-2 124M
   first, then the 1.1B Llama, then GPT-2 350M.

Timing: CUDA events around each kernel region (warm-up first, the median of the repeats); a program's step time is
the median of its metrics file's `step_time` over the steady steps (bench/gpu.py). Inputs are random, never zeros.

The JSON holds the date, torch and CUDA versions, the device, every row, what was skipped, and a `calibration`
block (`matmul_efficiency`, `attention_efficiency`, `hbm_gbps` as measured) that compiler/layout/devices.py
`calibration()` reads: the check prices each generated program again with those figures as mesh overrides
(`cal ms`), so the table separates what the device figures miss from what the step-time model misses. The table it prints last is what goes into an issue's note. ../shared/reference/
gpu-measured.json stays the record of the earlier, eager programs; this file's output is the new record.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import gpu  # noqa: E402

FORMAT = 1  # of the JSON; compiler/layout/devices.py `calibration` refuses another
SECTIONS = ("kernels", "resume", "eager", "compiled")


class Budget:
    """Seconds left of the check's budget; what does not fit is recorded as skipped."""

    def __init__(self, seconds: float):
        self.seconds, self.t0, self.skipped = seconds, time.perf_counter(), []

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.t0)

    def allows(self, what: str, need: float) -> bool:
        if self.left() >= need:
            return True
        self.skipped.append(f"{what}: needs ~{need:.0f} s, {max(self.left(), 0):.0f} s of the budget left")
        return False


# -- kernels ---------------------------------------------------------------------------------------------------------

def timer(torch, device: str, fn, reps: int, warmup: int) -> float:
    """Median seconds of one call of `fn` (CUDA events on CUDA; the host clock, each call waited for, on CPU)."""
    for _ in range(warmup):
        fn()
    times = []
    if device == "cuda":
        torch.cuda.synchronize()
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def shapes(quick: bool, device: str) -> dict:
    """The sizes of the kernel section: full on CUDA, small enough for seconds on CPU."""
    if device == "cuda" and not quick:
        return dict(square=8192, copy_bytes=2 << 30, seqs=(1024, 2048, 4096, 8192, 16384, 32768), sdpa_tokens=32768,
                    sdpa_heads=16, head_dim=128, flex_seq=8192, flex_docs=4, moe=(8, 16384, 2048, 1408),
                    fp8=(16384, 8192), reps=20, warmup=5, models=gpu.MODELS)
    return dict(square=256, copy_bytes=8 << 20, seqs=(128, 256), sdpa_tokens=512, sdpa_heads=4, head_dim=32,
                flex_seq=128, flex_docs=2, moe=(4, 256, 64, 96), fp8=(256, 256), reps=3, warmup=1,
                models=gpu.CPU_MODELS)


def model_gemms(models: dict) -> list:
    """(model, what, m, n, k) of each model's forward matmuls: tokens × hidden into q (hidden), into the MLP (ffn),
    out of the MLP (ffn into hidden) and the vocabulary head."""
    out = []
    for name, b in models.items():
        a, t = b.arch, b.batch * b.arch.seq
        out += [(name, "attn q", t, a.hidden, a.hidden), (name, "mlp up", t, a.ffn, a.hidden),
                (name, "mlp down", t, a.hidden, a.ffn), (name, "lm head", t, a.vocab, a.hidden)]
    return out


def kernel_rows(device: str, figures, sz: dict, budget: Budget) -> list:
    import torch
    import torch.nn.functional as F
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    peak = figures.peak_tflops * 1e12
    g = torch.Generator(device=device).manual_seed(0)
    rows = []

    def rand(*shape, dtype=dt):
        return torch.randn(*shape, device=device, dtype=dtype, generator=g)

    def row(kind, what, seconds, *, flops=None, nbytes=None, assumed=None, unit="TFLOP/s", note=""):
        rate = (flops / seconds / 1e12) if flops is not None else (nbytes / seconds / 1e9)
        r = {"kind": kind, "what": what, "ms": seconds * 1e3, "rate": rate, "unit": unit, "note": note}
        if flops is not None:
            r["fraction_of_peak"] = flops / seconds / peak
        if assumed:
            r["assumed"] = assumed
            r["measured_over_assumed"] = rate / assumed
        rows.append(r)
        return r

    def refused(kind, what, exc):
        rows.append({"kind": kind, "what": what, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"})

    reps, warm = sz["reps"], sz["warmup"]
    matmul_assumed = figures.peak_tflops * figures.matmul_efficiency
    attention_assumed = figures.peak_tflops * figures.attention_efficiency

    # HBM: a device-to-device copy, bytes read plus bytes written
    n = sz["copy_bytes"] // 4
    src, dst = rand(n, dtype=torch.float32), torch.empty(n, device=device, dtype=torch.float32)
    row("memory", f"copy {sz['copy_bytes'] / 2**30:.3g} GiB", timer(torch, device, lambda: dst.copy_(src), reps, warm),
        nbytes=2 * sz["copy_bytes"], unit="GB/s", assumed=figures.hbm_gbps)
    del src, dst

    # matmuls: the square reference, then each model's forward shapes
    s = sz["square"]
    a, b = rand(s, s), rand(s, s)
    row("matmul", f"{s}³", timer(torch, device, lambda: a @ b, reps, warm), flops=2 * s**3, assumed=matmul_assumed)
    del a, b
    for name, what, m, nn_, k in model_gemms(sz["models"]):
        if not budget.allows(f"matmul {name} {what}", 5):
            break
        x, w = rand(m, k), rand(nn_, k)
        row("matmul", f"{name} {what} {m}×{k}·{k}×{nn_}", timer(torch, device, lambda: x @ w.t(), reps, warm),
            flops=2 * m * nn_ * k, assumed=matmul_assumed)
        del x, w

    # SDPA: causal, fused; forward, then forward + backward (backward = 2.5 forwards, FlashAttention's count)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = [SDPBackend.FLASH_ATTENTION] if device == "cuda" else [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
    heads, d = sz["sdpa_heads"], sz["head_dim"]
    for seq in sz["seqs"]:
        if not budget.allows(f"sdpa seq {seq}", 10):
            break
        bsz = max(sz["sdpa_tokens"] // seq, 1)
        q, k_, v = (rand(bsz, heads, seq, d).requires_grad_() for _ in range(3))
        fwd_flops = 4 * bsz * heads * seq * seq * d / 2  # causal: half the score matrix
        try:
            with sdpa_kernel(backend):
                def forward():
                    return F.scaled_dot_product_attention(q, k_, v, is_causal=True)
                out = forward()
                grad = torch.randn_like(out)

                def both():
                    forward().backward(grad)
                row("attention", f"sdpa causal fwd b{bsz} h{heads} s{seq} d{d}",
                    timer(torch, device, lambda: forward(), reps, warm), flops=fwd_flops, assumed=attention_assumed)
                row("attention", f"sdpa causal fwd+bwd b{bsz} h{heads} s{seq} d{d}",
                    timer(torch, device, both, reps, warm), flops=3.5 * fwd_flops, assumed=attention_assumed)
        except RuntimeError as exc:
            refused("attention", f"sdpa s{seq}", exc)
        del q, k_, v

    # FlexAttention: a block mask of causal documents (packed sequences), forward + backward, beside SDPA causal
    if budget.allows("flex attention", 60 if device == "cuda" else 20):
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            seq, docs = sz["flex_seq"], sz["flex_docs"]
            doc = torch.arange(seq, device=device) // (seq // docs)

            def mask(b_, h_, qi, ki):
                return (qi >= ki) & (doc[qi] == doc[ki])
            block = create_block_mask(mask, None, None, seq, seq, device=device)
            cuda = device == "cuda"  # FlexAttention has no backward on CPU: the dry run times its forward
            fn = torch.compile(flex_attention) if cuda else flex_attention
            q, k_, v = (rand(1, heads, seq, d).requires_grad_(cuda) for _ in range(3))
            out = fn(q, k_, v, block_mask=block)
            grad = torch.randn_like(out)
            useful = 4 * heads * d * docs * (seq // docs) ** 2 / 2  # causal within each document
            row("attention", f"flex causal documents {'fwd+bwd' if cuda else 'fwd'} h{heads} s{seq} docs{docs}",
                timer(torch, device, (lambda: fn(q, k_, v, block_mask=block).backward(grad)) if cuda
                      else (lambda: fn(q, k_, v, block_mask=block)), reps, warm),
                flops=(3.5 if cuda else 1.0) * useful, assumed=attention_assumed,
                note=f"block density {100 - block.sparsity():.0f}%")
        except Exception as exc:  # noqa: BLE001 -- a kernel the torch at hand lacks is a row, not a failed check
            refused("attention", "flex attention", exc)

    # grouped GEMM: one MoE layer's experts (E experts, T routed rows, hidden → ffn), rows split evenly
    experts, tokens, hidden, ffn = sz["moe"]
    grouped = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
    try:
        x, w = rand(tokens, hidden), rand(experts, hidden, ffn)
        offs = torch.arange(1, experts + 1, device=device, dtype=torch.int32) * (tokens // experts)
        row("matmul", f"grouped_mm E{experts} {tokens}×{hidden}·{hidden}×{ffn}",
            timer(torch, device, lambda: grouped(x, w, offs=offs), reps, warm), flops=2 * tokens * hidden * ffn,
            assumed=matmul_assumed)
        rows.extend(overlap_rows(torch, device, lambda: grouped(x, w, offs=offs), tokens * hidden * 2, reps, warm))
    except Exception as exc:  # noqa: BLE001
        refused("matmul", "grouped_mm", exc)

    # FP8: the tensorwise-scaled cast of a bf16 activation (amax, scale, cast: what torchao's float8 training does per
    # tensor), and an FP8 matmul
    rows_, cols = sz["fp8"]
    try:
        x = rand(rows_, cols, dtype=torch.bfloat16)
        f8 = torch.float8_e4m3fn
        top = torch.finfo(f8).max

        def cast():
            scale = top / x.abs().amax().float().clamp(min=1e-12)
            return (x.float() * scale).clamp(-top, top).to(f8)
        row("fp8", f"tensorwise cast bf16→e4m3 {rows_}×{cols}", timer(torch, device, cast, reps, warm),
            nbytes=rows_ * cols * (2 + 2 + 1), unit="GB/s", assumed=figures.hbm_gbps,
            note="bytes: read twice (amax, cast), written once")
        a8 = rand(s, s, dtype=torch.bfloat16).to(f8)
        b8 = rand(s, s, dtype=torch.bfloat16).to(f8).t()
        one = torch.tensor(1.0, device=device)
        row("fp8", f"_scaled_mm e4m3 {s}³", timer(torch, device, lambda: torch._scaled_mm(
            a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), reps, warm), flops=2 * s**3,
            note="against the bf16 peak")
    except Exception as exc:  # noqa: BLE001
        refused("fp8", "fp8", exc)
    return rows


def overlap_rows(torch, device: str, compute, nbytes: int, reps: int, warm: int) -> list:
    """DualPipe's premise on one GPU (issue 44): an MoE layer's grouped GEMM on the current stream and, beside it on
    a second stream, a copy of its all-to-all's payload (`nbytes`: the routed rows, bf16), which stands in for the
    other micro-batch's dispatch. Two copies: device to device (an SM- and HBM-bound copy, as NCCL's kernels move
    data inside a node) and device to pinned host (a copy engine and the host link, as a transfer between nodes
    leaves through the NIC). Each is timed alone and both together (both streams waited for); `hidden` is the share
    of the shorter one that disappeared: (alone_a + alone_b − together) / min(alone_a, alone_b), 1 when it hid
    completely, 0 when they ran back to back; the row's rate is (alone_a + alone_b) / together. The step-time model's DualPipeV pricing hides the all-to-all behind
    the other micro-batch's compute; this row says how much of that a device gives. On CPU there are no streams:
    the row times them one after the other (hidden ≈ 0), so the dry run still exercises the code."""
    cuda = device == "cuda"
    n = nbytes // 2
    src = torch.randn(n, device=device, dtype=torch.bfloat16)
    targets = [("device copy", torch.empty_like(src))]
    if cuda:
        targets.append(("pinned host copy", torch.empty(n, dtype=torch.bfloat16, pin_memory=True)))
    side = torch.cuda.Stream() if cuda else None
    out = []
    t_compute = timer(torch, device, compute, reps, warm)
    for what, dst in targets:
        def copy():
            dst.copy_(src, non_blocking=cuda)

        def both():
            if not cuda:
                compute()
                copy()
                return
            side.wait_stream(torch.cuda.current_stream())  # the inputs are ready before the side stream reads them
            with torch.cuda.stream(side):
                copy()
            compute()
            torch.cuda.current_stream().wait_stream(side)  # the timing's end event waits for both
        t_copy = timer(torch, device, copy, reps, warm)
        t_both = timer(torch, device, both, reps, warm)
        hidden = (t_compute + t_copy - t_both) / min(t_compute, t_copy)
        out.append({"kind": "overlap", "what": f"grouped_mm beside a {what} of {nbytes / 2**20:.3g} MiB",
                    "ms": t_both * 1e3, "rate": (t_compute + t_copy) / t_both, "unit": "× alone",
                    "note": f"alone: grouped_mm {t_compute * 1e3:.3f} ms, copy {t_copy * 1e3:.3f} ms"
                            + ("" if cuda else "; CPU: no streams, run in turn"),
                    "compute_ms": t_compute * 1e3, "copy_ms": t_copy * 1e3, "hidden": hidden})
    return out


# -- programs --------------------------------------------------------------------------------------------------------

def program_rows(device: str, dev: tuple, steps: int, warmup: int, budget: Budget, models: dict,
                 compiled: bool) -> list:
    """Each model's generated program and the hand-written loop, eager or compiled, with the compiler's
    predictions of peak memory and step time beside the measurements."""
    from bench.common import load_program
    precision = "fp32" if device == "cpu" else "bf16"
    cols = ("ours_compiled", "hand_compiled") if compiled else ("ours_eager", "hand_eager")
    need = 150 if compiled and device == "cuda" else 60 if device == "cuda" else 30
    out = []
    for name, b in models.items():
        with tempfile.TemporaryDirectory(prefix=f"gpu_check_{name}_") as tmp:
            where = Path(tmp)
            ours = cols[0]
            build_dir, plan = gpu.build(name, b, where / ours, dev[1], precision, compiled, steps)
            cfg = load_program(build_dir, f"scalec_gpu_check_{name}_{ours}").CONFIG
            optim = gpu.optim_settings(cfg.optim)
            flops = float(plan["cost"]["flops_per_step"])
            tokens = b.batch * b.arch.seq
            for col in cols:
                if not budget.allows(f"{name} {gpu.TITLES[col]}", need):
                    continue
                args = SimpleNamespace(steps=steps, device=device, warm_cache=False,
                                       timeout=max(min(budget.left(), 400), 30))
                print(f"  {name}: {gpu.TITLES[col]} ...", end="", flush=True)
                run = gpu.run_column(col, build_dir if col == ours else None, b, optim, args,
                                     where / f"{col}.jsonl")
                print(f" {run['wall_s']:.1f} s" + (f"  FAILED: {run['error']}" if "error" in run else ""), flush=True)
                s = gpu.summarise([run], warmup, tokens, flops, dev[2])
                s.pop("step_times_ms", None)
                r = {"model": name, "parameters": plan["cost"]["parameters"], "tokens_per_step": tokens, **s}
                if col == ours:
                    r.update(energy_figures(run["records"], warmup, device, cfg.predicted_joules_per_step))
                    r["predicted_peak_bytes"] = cfg.memory.predicted_peak_bytes
                    r["predicted_step_ms"] = cfg.speed.predicted_step_s * 1e3
                    if r.get("peak_memory_bytes"):
                        r["peak_measured_over_predicted"] = r["peak_memory_bytes"] / cfg.memory.predicted_peak_bytes
                    if r.get("median_ms"):
                        r["step_measured_over_predicted"] = r["median_ms"] / r["predicted_step_ms"]
                out.append(r)
    return out


def energy_figures(records: list, warmup: int, device: str, predicted: tuple) -> dict:
    """What a generated program measured of its energy (its metrics records' `energy_j_per_step`, each over the
    logged interval `energy_window`: runtime/energy.py): joules per step over the intervals after the warm-up,
    weighted by their steps, beside the compiler's prediction for pp rank 0 (a world of one). Where no steady
    interval carries a figure, why, in words (this host's counter as runtime.energy opens it): never a zero."""
    out: dict = {"predicted_joules_per_step": [list(p) for p in predicted]}
    steady = [x for x in records if "energy_j_per_step" in x and x["energy_window"][0] > warmup]
    if steady:
        steps = [x["energy_window"][1] - x["energy_window"][0] + 1 for x in steady]
        joules = sum(x["energy_j_per_step"] * n for x, n in zip(steady, steps)) / sum(steps)
        out.update(energy_j_per_step=joules, energy_counter="NVML" if device == "cuda" else "RAPL",
                   energy_steps=[steady[0]["energy_window"][0], steady[-1]["energy_window"][1]])
        mine = dict(predicted).get(0)
        if mine:
            out["energy_measured_over_predicted"] = joules / mine
        return out
    import torch

    from runtime import energy
    _, why = energy.open_counter(torch.device(device, 0) if device == "cuda" else torch.device(device))
    out["energy"] = "not measured: " + (why or "each logged interval that carries a figure includes warm-up steps "
                                               "(the program's log_every against --steps and --warmup)")
    return out


# -- checkpoint and resume -------------------------------------------------------------------------------------------

def resume_rows(device: str, dev: tuple, budget: Budget) -> list:
    """A generated program saves a checkpoint and a second run extends it from there, on this device in the
    device's precision (bf16 on CUDA: AdamW's fused kernel, its state and step on the device, loaded back by DCP):
    what the CPU suite cannot show for CUDA. One row per run: its exit status, whether it resumed, its last loss."""
    if not budget.allows("checkpoint and resume", 40 if device == "cuda" else 20):
        return []
    import re
    import subprocess
    b = gpu.CPU_MODELS["gpt_tiny"]
    precision = "fp32" if device == "cpu" else "bf16"
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu_check_resume_") as tmp:
        where = Path(tmp)
        build_dir, _ = gpu.build("gpt_tiny", b, where / "build", dev[1], precision, False, 4)
        for steps, expect in ((4, False), (6, True)):
            cmd = [sys.executable, str(build_dir / "program.py"), "--steps", str(steps), "--checkpoint-dir",
                   str(where / "ckpt"), "--metrics", str(where / f"m{steps}.jsonl")]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, cwd=where, env=gpu.env(device, None), capture_output=True, text=True,
                                  timeout=max(min(budget.left(), 300), 30))
            said = proc.stdout + proc.stderr
            records = gpu.read_metrics(where / f"m{steps}.jsonl")
            resumed = re.search(r"resumed from \S+", said)
            ok = proc.returncode == 0 and bool(resumed) == expect and records and records[-1]["step"] == steps
            rows.append({"what": f"{precision} {'extend to' if expect else 'train'} {steps} steps"
                                 + (" from the checkpoint" if expect else ", saving"),
                         "ok": bool(ok), "exit": proc.returncode, "seconds": time.perf_counter() - t0,
                         "resumed": resumed.group(0) if resumed else None,
                         "last_loss": records[-1]["loss"] if records else None,
                         **({} if ok else {"tail": said.splitlines()[-6:]})})
    return rows


# -- the record ------------------------------------------------------------------------------------------------------

def calibration(kind: str, kernels: list) -> dict:
    """What compiler/layout/devices.py `calibration()` reads: the measured rates as the Figures' fields."""
    from compiler.layout.devices import DEVICES
    peak = DEVICES[kind].peak_tflops
    cal: dict = {"device": kind}
    square = [r for r in kernels if r["kind"] == "matmul" and r["what"].endswith("³") and "rate" in r]
    both = [r["rate"] for r in kernels if r["what"].startswith("sdpa causal fwd+bwd") and "rate" in r]
    for key, rate in (("matmul_efficiency", square[0]["rate"] if square else None),
                      ("attention_efficiency", statistics.median(both) if both else None)):
        if rate is None:
            continue
        if rate > peak:  # the device's peak figure is below what ran (the `cpu` entry's 0.1 TFLOP/s is a rough one):
            cal.setdefault("above_peak", []).append(key)  # no efficiency to record; the figure itself is off
            continue
        cal[key] = round(rate / peak, 4)
    copy = [r for r in kernels if r["kind"] == "memory" and "rate" in r]
    if copy:
        cal["hbm_gbps"] = round(copy[0]["rate"], 1)
    return cal


def reprice(result: dict) -> None:
    """Each generated program's step time predicted again on the device as measured: the model's .scale text with
    the calibration's figures as mesh overrides (compiler/layout/devices.py `calibration`), beside the prediction
    with the datasheet figures the program printed. What is left between the calibrated prediction and the
    measurement is the model's, not the device figures'."""
    from compiler.check import check_text
    from compiler.cost import step_time
    from compiler.layout.devices import calibration as read_calibration
    from compiler.pipeline import compile_spec
    kind, figures = read_calibration(result)
    catalogue = {**gpu.MODELS, **gpu.CPU_MODELS}
    precision = "fp32" if kind == "cpu" else "bf16"
    for r in result["programs"]:
        if r["column"] not in gpu.OURS or r["model"] not in catalogue:
            continue
        text = gpu.scale_text(r["model"], catalogue[r["model"]], kind, precision, r["column"] == "ours_compiled",
                              result["steps"], figures)
        r["predicted_step_ms_calibrated"] = step_time.predict(compile_spec(check_text(
            text, f"{r['model']}.scale"))).step_time_s * 1e3
        if r.get("median_ms"):
            r["step_measured_over_calibrated"] = r["median_ms"] / r["predicted_step_ms_calibrated"]


def gb(n) -> str:
    return "n/a" if not n else f"{n / 1e9:.2f}"


def table(result: dict) -> str:
    lines = [f"bench/gpu_check on {result['device']} · torch {result['torch']} · CUDA {result['cuda']} · "
             f"{result['date']} · {result['wall_s']:.0f} s of a {result['budget_s']:.0f} s budget"]
    if result["kernels"]:
        lines += ["", "kernels (rate against what the step-time model assumes, compiler/layout/devices.py)",
                  f"  {'kernel':<56}{'ms':>9}{'rate':>16}{'assumed':>10}{'ratio':>7}"]
    for r in result["kernels"]:
        if "error" in r:
            lines.append(f"  {r['what']:<56}not run: {r['error']}")
            continue
        assumed = f"{r['assumed']:.4g}" if r.get("assumed") else "-"
        ratio = f"{r['measured_over_assumed']:.2f}" if r.get("measured_over_assumed") else "-"
        lines.append(f"  {r['what'][:55]:<56}{r['ms']:>9.3f}{r['rate']:>10.4g} {r['unit']:<6}{assumed:>9}{ratio:>7}")
        if r["kind"] == "overlap":
            lines.append(f"    alone {r['compute_ms']:.3f} + {r['copy_ms']:.3f} ms, together {r['ms']:.3f} ms: "
                         f"{r['hidden']:.0%} of the shorter hidden")
    lines += ["", "programs (median over the steady steps; peak: measured / plan's prediction, GB)",
              f"  {'model':<12}{'column':<28}{'ms/step':>9}{'pred ms':>9}{'cal ms':>8}{'MFU':>7}{'peak':>8}"
              f"{'pred':>8}{'meas/pred':>10}{'1st step':>10}"]
    for r in result["programs"]:
        title = gpu.TITLES[r["column"]]
        if "median_ms" not in r:
            lines.append(f"  {r['model']:<12}{title:<28}FAILED: {r.get('error')}")
            continue
        pred = f"{r['predicted_step_ms']:.1f}" if "predicted_step_ms" in r else "-"
        cal = f"{r['predicted_step_ms_calibrated']:.1f}" if "predicted_step_ms_calibrated" in r else "-"
        ratio = f"{r['peak_measured_over_predicted']:.3f}" if "peak_measured_over_predicted" in r else "-"
        lines.append(f"  {r['model']:<12}{title:<28}{r['median_ms']:>9.1f}{pred:>9}{cal:>8}{r['mfu']:>7.1%}"
                     f"{gb(r.get('peak_memory_bytes')):>8}{gb(r.get('predicted_peak_bytes')):>8}{ratio:>10}"
                     f"{r['first_step_ms'] / 1e3:>9.1f}s")
    for name in dict.fromkeys(r["model"] for r in result["programs"]):
        for pair in (("ours_eager", "hand_eager"), ("ours_compiled", "hand_compiled")):
            got = {r["column"]: r.get("median_ms") for r in result["programs"] if r["model"] == name}
            if got.get(pair[0]) and got.get(pair[1]):
                lines.append(f"  {name}: {gpu.TITLES[pair[0]]} / {gpu.TITLES[pair[1]]} = "
                             f"{got[pair[0]] / got[pair[1]]:.3f}")
    ours = [r for r in result["programs"] if "energy" in r or "energy_j_per_step" in r]
    if ours:
        lines += ["", "energy (the generated program's own counter, runtime/energy.py: J/step over the steady logged "
                      "intervals; the prediction: Config.predicted_joules_per_step)"]
    for r in ours:
        title = f"  {r['model']:<12}{gpu.TITLES[r['column']]:<28}"
        if "energy_j_per_step" not in r:
            lines.append(title + r["energy"])
            continue
        pred = dict(map(tuple, r["predicted_joules_per_step"])).get(0)
        lines.append(title + f"{r['energy_j_per_step']:,.1f} J/step ({r['energy_counter']}, steps "
                     f"{r['energy_steps'][0]}-{r['energy_steps'][1]}); predicted "
                     + (f"{pred:,.1f} J/step: measured/predicted {r['energy_measured_over_predicted']:.2f}" if pred
                        else "nothing yet (the compiler writes no prediction)"))
    if result.get("resume"):
        lines += ["", "checkpoint and resume (a generated program, then a longer run from its checkpoint)"]
        for r in result["resume"]:
            lines.append(f"  {r['what']:<50}{'ok' if r['ok'] else 'FAILED'}  exit {r['exit']}  "
                         f"loss {r['last_loss'] if r['last_loss'] is None else round(r['last_loss'], 4)}"
                         f"  {r['seconds']:.1f} s" + ("" if r["ok"] else "  " + " | ".join(r.get("tail", []))))
    if result.get("calibration"):
        lines += ["", "calibration: " + json.dumps(result["calibration"])]
    if result["skipped"]:
        lines += ["skipped (budget): " + "; ".join(result["skipped"])]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when available")
    p.add_argument("--quick", action="store_true", help="small shapes, one tiny model, eager only (the dry run)")
    p.add_argument("--budget", type=float, help="seconds for the whole check (default 420 on CUDA, 120 on CPU)")
    p.add_argument("--steps", type=int, help="steps per program (default 30 on CUDA, 6 with --quick)")
    p.add_argument("--warmup", type=int, help="steps left out of the medians (default 10 on CUDA, 2 with --quick)")
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"comma-separated, in this order of priority: {', '.join(SECTIONS)} (default: all)")
    p.add_argument("--models", help="comma-separated models of the program sections (default: all of them)")
    p.add_argument("--json", default="gpu_check.json", help="where the record goes (default gpu_check.json)")
    p.add_argument("--table", metavar="RECORD", help="print the table of an earlier record (and price its programs "
                                                     "on the calibrated device where it has not been); run nothing")
    args = p.parse_args(argv)
    if args.table:
        record = json.loads(Path(args.table).read_text())
        if record.get("calibration") and any(r["column"] in gpu.OURS and "predicted_step_ms_calibrated" not in r
                                             for r in record["programs"]):
            reprice(record)
        print(table(record))
        return 0
    import torch
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench/gpu_check: --device cuda, but torch sees no CUDA device")
    budget = Budget(args.budget or (420 if device == "cuda" else 120))
    quick = args.quick or device == "cpu"
    steps = args.steps or (6 if quick else 30)
    warmup = args.warmup if args.warmup is not None else (2 if quick else 10)
    if not 0 <= warmup < steps:
        raise SystemExit(f"bench/gpu_check: --warmup {warmup} leaves no steady step of --steps {steps}")
    dev = gpu.device_figures(device, None)
    from compiler.layout.devices import DEVICES
    figures = DEVICES[dev[1]]
    sz = shapes(quick, device)
    models = {"gpt_tiny": gpu.CPU_MODELS["gpt_tiny"]} if quick else sz["models"]
    sections = args.sections.split(",")
    bad = [x for x in sections if x not in SECTIONS] + [m for m in (args.models or "").split(",") if m
                                                        and m not in models]
    if bad:
        raise SystemExit(f"bench/gpu_check: unknown {bad} (sections: {', '.join(SECTIONS)}; models: "
                         f"{', '.join(models)})")
    if args.models:
        models = {m: models[m] for m in args.models.split(",")}
    result = {"what": "bench/gpu_check: kernel rates against the step-time model's figures, generated programs "
                      "against hand-written ones, measured peaks against plan's",
              "format": FORMAT, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
              "cuda": torch.version.cuda or "none", "device": dev[0], "compiler_device": dev[1],
              "peak_tflops": figures.peak_tflops, "quick": quick, "steps": steps, "warmup": warmup,
              "budget_s": budget.seconds}
    print(f"bench/gpu_check: {dev[0]}, torch {torch.__version__}, budget {budget.seconds:.0f} s", flush=True)
    result["kernels"] = kernel_rows(device, figures, sz, budget) if "kernels" in sections else []
    print(f"  kernels: {len(result['kernels'])} rows, {budget.seconds - budget.left():.0f} s", flush=True)
    result["resume"] = resume_rows(device, dev, budget) if "resume" in sections else []
    result["programs"] = (program_rows(device, dev, steps, warmup, budget, models, compiled=False)
                          if "eager" in sections else [])
    if not quick and "compiled" in sections:
        result["programs"] += program_rows(device, dev, steps, warmup, budget,
                                           {k: models[k] for k in ("gpt2_124m", "llama_1b", "gpt2_350m")
                                            if k in models}, compiled=True)
    result["calibration"] = calibration(dev[1], result["kernels"]) if result["kernels"] else {}
    result["skipped"] = budget.skipped
    if result["calibration"]:
        reprice(result)
    result["wall_s"] = budget.seconds - budget.left()
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print()
    print(table(result))
    failed = [f"{r['model']}/{r['column']}" for r in result["programs"] if r.get("error")]
    failed += [r["what"] for r in result["resume"] if not r["ok"]]
    if failed:
        print(f"bench/gpu_check: failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
