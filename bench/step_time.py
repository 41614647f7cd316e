"""The step-time model (compiler/simulate.py) against published and measured step times.

    python -m bench.step_time [megatron] [h100] [cpu] [overheads]

megatron   Megatron-LM's Table 1 calibration rows (Narayanan et al. 2021; ../shared/reference/calibration.json):
           GPT models with s = 2048, V = 51200 on A100s, full recomputation, the interleaved schedule where p > 1.
           Their TFLOP/s per GPU counts eq. 3's FLOPs (model FLOPs plus recomputation's forward): the model's
           hardware TFLOP/s per device is the comparable figure. Megatron-LM computed attention with materialised
           scores then: the model is run with `attention = "materialised"`. The paper does not give the micro-batch
           size of each row; each row is costed at the micro-batch size (1, 2, 4, 8 or 16 sequences) the model
           predicts fastest among those whose predicted peak fits 80 GB (the paper tuned it too), else at 1.
h100       the three single-H100 programs of ../shared/reference/gpu-measured.json (our programs, measured eager on
           2026-11-22): predicted step time against the measured median.
overheads  this machine's per-op and per-step overheads of our programs (the `cpu` device's `op_overhead_us` and
           `step_overhead_ms`), from the tiny GPT run on one rank with 2 and 8 layers.
cpu        our CPU benchmarks run here under torchrun (gloo, one thread per rank), predicted with the `cpu` device's
           figures (measured on this machine by `python -m bench.cpu_calibration`) against the measured median.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "tests" / "reference"  # a copy of ../shared/reference (CI's clone has no ../shared)

MEGATRON = """model megatron_{name} {{
  vocab = {vocab}  hidden = {h}  heads = {a}  layers = {l}  seq = {s}
  embedding(vocab, hidden)  positional(seq, hidden)
  repeat layers {{
    residual {{ layernorm(hidden)  attention(hidden, heads) }}
    residual {{ layernorm(hidden)  mlp(hidden, 4 * hidden, act = gelu) }}
  }}
  layernorm(hidden)  lm_head(vocab, hidden, tied = true)  cross_entropy
}}
mesh {{ axis pp = {p}  axis dp = {dp}  axis tp = {t}  nodes = {nodes}  devices_per_node = 8  device = a100 }}
plan {{ data_parallel = ddp  micro_batches = {m}  {schedule}  recompute = full }}
train {{ global_batch = {B}  seq_len = seq  steps = 10  precision = bf16  optimizer = adamw(lr = 1e-4) }}
"""


def megatron_text(row: dict, setup: dict, b: int) -> str:
    t, p, n, B = row["t"], row["p"], row["gpus"], row["batch"]
    dp = n // (t * p)
    # interleaved with 2 chunks per rank where there is a pipeline (the paper's Table 1 runs use its interleaved
    # schedule; the chunk count is not given per row)
    schedule = 'schedule = "interleaved-1f1b"  virtual_stages = 2' if p > 1 else ""
    return MEGATRON.format(name=str(row["params_billion"]).replace(".", "_"), vocab=setup["vocab"],
                           h=row["hidden"], a=row["heads"], l=row["layers"], s=setup["seq"], p=p, dp=dp, t=t,
                           nodes=n // 8, m=B // dp // b, schedule=schedule, B=B)


def megatron_rows() -> list[dict]:
    """Each calibration row with the model's figures at the chosen micro-batch size."""
    from compiler import pipeline as D
    from compiler import simulate as SIM
    from compiler.check import check_text
    data = json.loads((REFERENCE / "calibration.json").read_text())
    setup = data["megatron_2021_setup"]
    out = []
    for row in data["megatron_2021_table1_calibration"]:
        dp = row["gpus"] // (row["t"] * row["p"])
        tried = []
        for b in (1, 2, 4, 8, 16):
            m = row["batch"] // dp // b
            if (row["batch"] // dp) % b or (row["p"] > 1 and m % row["p"]):
                continue
            compiled = D.compile_spec(check_text(megatron_text(row, setup, b), "megatron.scale"))
            pred = SIM.predict(compiled, attention="materialised")
            tried.append((b, pred, compiled.costs.peak_bytes))
        fits = [x for x in tried if x[2] <= 80e9]
        b, pred, peak = max(fits, key=lambda x: x[1].hardware_tflops_per_device) if fits else tried[0]
        out.append({"row": row, "micro_batch_size": b, "fits": bool(fits), "peak_bytes": peak, "prediction": pred,
                    "ratio": pred.hardware_tflops_per_device / row["tflops_per_gpu"]})
    return out


def h100_rows(compiled: bool = False) -> list[dict]:
    """Predicted against measured step time of the reference H100 programs: the eager programs as they ran
    (`compiled=False`), or, with `plan { compile = true }`, against the same generated Model under torch.compile
    in a bare loop (the file's `baselines_same_device`: the rows that have one)."""
    from compiler import pipeline as D
    from compiler import simulate as SIM
    from compiler.check import check_text
    data = json.loads((REFERENCE / "gpu-measured.json").read_text())
    base = data.get("baselines_same_device", {})
    out = []
    for row in data["rows"]:
        if compiled:
            ms = base.get(row["name"], {}).get("generated_Model_torch_compile_ms")
            if ms is None:
                continue
            measured = ms / 1e3
        else:
            measured = row["median_step_s"]
        text = row["spec"].replace("train {", f"plan {{ compile = {'true' if compiled else 'false'} }}\ntrain {{", 1)
        program = D.compile_spec(check_text(text, row["name"] + ".scale"))
        fused = SIM.ADAMW_BYTES_PER_PARAM
        if not compiled:  # these programs ran torch's foreach AdamW (the runtime of 2026-11-22); the loop, fused
            SIM.ADAMW_BYTES_PER_PARAM = SIM.ADAMW_FOREACH_BYTES_PER_PARAM
        try:
            pred = SIM.predict(program)
        finally:
            SIM.ADAMW_BYTES_PER_PARAM = fused
        out.append({"name": row["name"], "measured_s": measured, "prediction": pred,
                    "ratio": pred.step_time_s / measured, "compiled": compiled})
    return out


# Our CPU benchmarks: samples as they are (tiny: per-op overhead and gloo latency dominate) and with a wider model
# (hidden 256, seq 128: the matmuls count), on 1 and 2 ranks (this machine has 2 cores: more ranks would share them,
# which the model does not know).
WIDER = (("hidden = 64", "hidden = 256"), ("seq    = 32", "seq    = 128"))
CPU_CASES = (
    ("gpt_dp dp2", "samples/gpt_dp.scale", ()),
    ("gpt_dp dp2 wider", "samples/gpt_dp.scale", WIDER),
    ("gpt_dp dp2 fsdp wider", "samples/gpt_dp.scale", WIDER + (("data_parallel = ddp", "data_parallel = fsdp"),)),
    ("gpt_tp tp2", "samples/gpt_tp.scale", ()),
    ("gpt_tp tp2 wider", "samples/gpt_tp.scale", WIDER),
    ("gpt_pp pp2 1f1b", "samples/gpt_pp.scale", ()),
    ("gpt_pp pp2 1f1b wider", "samples/gpt_pp.scale", WIDER),
    ("gpt_dp 1 rank wider", "samples/gpt_dp.scale", WIDER + (("axis dp = 2", "axis dp = 1"),
                                                            ("devices_per_node = 2", "devices_per_node = 1"))),
)


def cpu_rows(steps: int = 20, cases=CPU_CASES) -> list[dict]:
    """Compile and run each case under torchrun (gloo, one thread per rank), the median step time of the steps after
    the first five against the prediction."""
    import os
    import socket
    import statistics
    import subprocess
    import tempfile

    from compiler import codegen
    from compiler import pipeline as D
    from compiler import simulate as SIM
    from compiler.check import check_text
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, sample, edits in cases:
            text = (ROOT / sample).read_text()
            for old, new in edits:
                assert old in text, (name, old)
                text = text.replace(old, new)
            compiled = D.compile_spec(check_text(text, sample))
            pred = SIM.predict(compiled)
            where = Path(tmp) / name.replace(" ", "_")
            codegen.emit(compiled, str(where))
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            env = dict(os.environ, PYTHONPATH=str(ROOT), LOCAL_NODES="1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
            metrics = where / "metrics.jsonl"
            subprocess.run(["bash", str(where / "launch.sh"), "--steps", str(steps), "--metrics", str(metrics)],
                           cwd=where, env=env, check=True, capture_output=True, timeout=300)
            times = [json.loads(line)["step_time"] for line in metrics.read_text().splitlines()][5:]
            measured = statistics.median(times)
            out.append({"name": name, "measured_s": measured, "prediction": pred,
                        "ratio": pred.step_time_s / measured})
    return out


ONE_RANK = (("axis dp = 2", "axis dp = 1"), ("devices_per_node = 2", "devices_per_node = 1"))


def cpu_overheads(steps: int = 30) -> dict:
    """This machine's per-op and per-step overheads of our programs: the tiny GPT on one rank with 2 and with 8
    layers (hidden 64: the ops' own work is a few µs), measured; each measured step = the model's kernel time (op
    overhead set to ~0) + ops × o + c. Two sizes give o (µs per op, eager dispatch and autograd included) and c (ms
    per step: the runtime's own work). These are the `cpu` device's `op_overhead_us` and `step_overhead_ms`."""
    from compiler import pipeline as D
    from compiler import simulate as SIM
    from compiler.check import check_text
    sizes = {}
    for layers in (2, 8):
        edits = ONE_RANK + (("layers = 2", f"layers = {layers}"),)
        (row,) = cpu_rows(steps, (("calibration", "samples/gpt_dp.scale", edits),))
        text = (ROOT / "samples/gpt_dp.scale").read_text()
        for old, new in edits + (("device = cpu", "device = cpu  op_overhead_us = 0.000001"),):
            text = text.replace(old, new)
        bare = SIM.predict(D.compile_spec(check_text(text, "calibration.scale")))
        sizes[layers] = (row["measured_s"], bare.step_time_s - bare.runtime_s, bare.ops_per_step)
    (t2, a2, n2), (t8, a8, n8) = sizes[2], sizes[8]
    o = ((t8 - a8) - (t2 - a2)) / (n8 - n2)
    c = t2 - a2 - n2 * o
    return {"op_overhead_us": o * 1e6, "step_overhead_ms": c * 1e3, "measured_ms": {k: v[0] * 1e3 for k, v in
                                                                                   sizes.items()},
            "ops": {k: v[2] for k, v in sizes.items()}}


def main(argv: list[str]) -> int:
    what = argv or ["megatron", "h100", "cpu"]
    if "megatron" in what:
        print("Megatron-LM 2021 Table 1 (A100, full recomputation): TFLOP/s per GPU, eq. 3's FLOPs")
        print(f"{'params':>8} {'t':>2} {'p':>2} {'GPUs':>5} {'b':>3} {'published':>9} {'predicted':>9} {'ratio':>6}"
              f" {'step s':>7} {'bubble':>6}  exposed communication")
        for r in megatron_rows():
            row, pred = r["row"], r["prediction"]
            exposed = ", ".join(f"{a} {t:.2f} s" for a, t in pred.exposed_comm_s.items())
            note = "" if r["fits"] else "  (no micro-batch size fits 80 GB in our program: b = 1 shown)"
            print(f"{row['params_billion']:>7}B {row['t']:>2} {row['p']:>2} {row['gpus']:>5} {r['micro_batch_size']:>3}"
                  f" {row['tflops_per_gpu']:>9} {pred.hardware_tflops_per_device:>9.1f} {r['ratio']:>6.3f}"
                  f" {pred.step_time_s:>7.2f} {pred.bubble_fraction:>6.1%}  {exposed}{note}")
    if "h100" in what:
        print("\nOur programs on one H100 (../shared/reference/gpu-measured.json): eager programs as measured, and "
              "compile = true against the generated Model under torch.compile in a bare loop")
        for r in h100_rows() + h100_rows(compiled=True):
            pred = r["prediction"]
            print(f"  {r['name']:<16} {'compiled' if r['compiled'] else 'eager':<8} measured {r['measured_s'] * 1e3:7.1f} ms  predicted {pred.step_time_s * 1e3:7.1f} ms"
                  f"  ratio {r['ratio']:.3f}  (MFU predicted {pred.mfu:.1%})")
    if "overheads" in what:
        got = cpu_overheads()
        print(f"\nthis machine's overheads of our programs (one rank, 2 and 8 layers of the tiny GPT): "
              f"{got['op_overhead_us']:.1f} µs per op, {got['step_overhead_ms']:.2f} ms per step "
              f"(measured {got['measured_ms']}, ops {got['ops']})")
    if "cpu" in what:
        print("\nOur CPU benchmarks on this machine (gloo over loopback, one thread per rank): step time, median of "
              "steps 6-20")
        for r in cpu_rows():
            pred = r["prediction"]
            exposed = ", ".join(f"{a} {t * 1e3:.2f} ms" for a, t in pred.exposed_comm_s.items()) or "none"
            print(f"  {r['name']:<24} measured {r['measured_s'] * 1e3:8.2f} ms  predicted {pred.step_time_s * 1e3:8.2f}"
                  f" ms  ratio {r['ratio']:.3f}  (exposed: {exposed})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
