"""Our generated programs against hand-written PyTorch, side by side on one device (issue 13, item 4).

    python -m bench.gpu                                   # CUDA: GPT-2 124M, GPT-2 350M, Llama-style 1.1B; all columns
    python -m bench.gpu --json gpu.json --steps 50 --warmup 15
    python -m bench.gpu --device cpu                      # tiny models on CPU (what CI smoke-tests)
    python -m bench.gpu --device cpu --models gpt_tiny --columns ours_eager,hand_eager --steps 8 --warmup 3
    python -m bench.gpu --device cpu --models gpt_small --rounds 3   # alternating rounds, for a shared machine

Columns, per model (each run is its own process, one after another, on the same device):
  ours_compiled  the generated program of `plan { compile = true }`:  scalec compile FILE -o DIR;
                 python DIR/program.py --steps N --metrics FILE (a world of one; no torchrun needed)
  ours_eager     the same with `plan { compile = false }`
  hand_eager     the same architecture hand-written in plain PyTorch (bench/handwritten.py: nanoGPT-style)
  hand_compiled  the same under torch.compile (the whole model)

Per column: the median step time over the steady steps (steps warmup+1 .. N of the metrics file's `step_time`:
wall clock of one optimizer step, host read of the loss included), tokens/s at that median, MFU = the compiler's
model FLOPs per step (plan.json `cost.flops_per_step`, the same figure for all four columns) / median / the
device's peak (compiler/layout/devices.py: 989 TFLOP/s bf16 dense for H100 and H200; the `cpu` entry's 0.1 TFLOP/s
on CPU), peak memory (max over the steady steps of CUDA's max_memory_allocated, reset at each step's start on both
sides; "n/a" off CUDA), and the warm-up: the first step's time and the warm-up steps' excess over the median (what
compilation and first-call work cost; every run compiles with empty caches unless --warm-cache). Per model:
ours / hand = min(ours_compiled, ours_eager) / min(hand_eager, hand_compiled) in median ms/step (< 1: ours is
faster). With --rounds R every column runs R times, alternating, and the median pools the steady steps of all R.

The same in every column: the architecture (written once as a `handwritten.Arch`, from which the .scale text is
made), the batch (sequences × seq), the precision (bf16 autocast on CUDA, weights and optimizer state fp32; fp32 on
CPU), AdamW with the decay / no-decay split of 1-D parameters, lr, betas, eps, weight decay, the learning-rate
schedule and the grad-clip norm (the hand-written side is given the generated program's own `CONFIG.optim`).

What differs, on purpose (each side as its users would write it):
- data: the generated program makes each batch with runtime.data.Synthetic on the host and copies it to the device;
  the hand-written loop draws random tokens on the device (`torch.randint`).
- layers: the generated program has q, k, v (and SwiGLU's gate and up) as separate linears, the hand-written
  model fuses them (nanoGPT's c_attn); the FLOPs are the same.
- the optimizer: the hand-written side uses fused AdamW on CUDA; the generated program uses what runtime/optimizer.py
  builds (AdamW; fused or not is the runtime's choice).
- what one step does besides the model: the generated program runs runtime/trainer.py's loop (faults' bookkeeping,
  the gradient norm read back for its metrics, its memory counters); the hand-written loop reads the loss only.
- initialisation: each side's own (N(0, 0.02), residual outputs scaled); it does not change the speed.
- compilation: the generated program compiles each repeated block and the code around the repeat
  (runtime/compile.py); the hand-written one compiles the whole model as one region.

Models (CUDA): GPT-2 124M (32 × 1024 tokens per step) and 350M (16 × 1024), the specs of
../shared/reference/gpu-measured.json; a Llama-style 1.1B with TinyLlama-1.1B's shape (hidden 2048, 22 layers,
32 heads, 4 kv heads, SwiGLU 5632, RMSNorm, vocab 32000, untied head, no biases) at seq 1024 with rotary
embeddings (base 10000; the hand-written side computes its angles once per forward and shares them, ours per
block). Its batch, 16 × 1024, is the largest of 4, 8, 12, 16, 24 whose
peak the compiler predicts (eager, bf16 autocast, fp32 AdamW) under 70% of 80 GB: 54.7 GB (24 predicts 74.4 GB);
the compiler's prediction is within 1% of the three measured eager programs of gpu-measured.json.
Models (CPU, `--device cpu`): gpt_tiny and llama_tiny (~0.1 M parameters, seq 64), gpt_small (3.2 M, seq 128);
all three by default.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.handwritten import Arch  # noqa: E402

COLUMNS = ("ours_compiled", "ours_eager", "hand_eager", "hand_compiled")
OURS, HAND = COLUMNS[:2], COLUMNS[2:]
TITLES = {"ours_compiled": "ours, compile", "ours_eager": "ours, eager",
          "hand_eager": "hand-written, eager", "hand_compiled": "hand-written, torch.compile"}


@dataclass(frozen=True)
class Bench:
    arch: Arch
    batch: int
    lr: float


GPT2 = dict(norm="layernorm", act="gelu", bias=True, tied=True, positional=True, seq=1024, vocab=50304)
LLAMA = dict(norm="rmsnorm", act="swiglu", bias=False, tied=False, positional=False, rope=10000.0)
MODELS = {
    "gpt2_124m": Bench(Arch(hidden=768, heads=12, kv_heads=12, layers=12, ffn=3072, **GPT2), batch=32, lr=6e-4),
    "gpt2_350m": Bench(Arch(hidden=1024, heads=16, kv_heads=16, layers=24, ffn=4096, **GPT2), batch=16, lr=6e-4),
    "llama_1b": Bench(Arch(vocab=32000, hidden=2048, heads=32, kv_heads=4, layers=22, ffn=5632, seq=1024, **LLAMA),
                      batch=16, lr=3e-4),
}
CPU_MODELS = {
    "gpt_tiny": Bench(Arch(vocab=256, hidden=64, heads=4, kv_heads=4, layers=2, ffn=256, seq=64,
                           **{k: v for k, v in GPT2.items() if k not in ("seq", "vocab")}), batch=8, lr=3e-3),
    "llama_tiny": Bench(Arch(vocab=256, hidden=64, heads=4, kv_heads=2, layers=2, ffn=176, seq=64, **LLAMA),
                        batch=8, lr=3e-3),
    # wide enough that the matmuls, not per-op overhead, take most of a step on CPU (3.2 M parameters)
    "gpt_small": Bench(Arch(vocab=256, hidden=256, heads=8, kv_heads=8, layers=4, ffn=1024, seq=128,
                            **{k: v for k, v in GPT2.items() if k not in ("seq", "vocab")}), batch=8, lr=1e-3),
}


def scale_text(name: str, b: Bench, device: str, precision: str, compile_on: bool, steps: int,
               figures: dict | None = None) -> str:
    """The .scale file of `b`: the same architecture as handwritten.GPT(b.arch); `figures`: the device's figures
    overridden in the mesh (compiler/layout/devices.py OVERRIDABLE), e.g. measured ones."""
    a = b.arch
    device += "".join(f"  {k} = {v:g}" for k, v in (figures or {}).items())
    bias = "" if a.bias else ", bias = false"
    norm = f"{a.norm}(hidden)"
    kv = f", kv_heads = {a.kv_heads}" if a.kv_heads != a.heads else ""
    kv += f", rope_theta = {a.rope:g}" if a.rope else ""
    return f"""model {name} {{
  vocab = {a.vocab}  hidden = {a.hidden}  heads = {a.heads}  layers = {a.layers}  ffn = {a.ffn}  seq = {a.seq}
  embedding(vocab, hidden){"  positional(seq, hidden)" if a.positional else ""}
  repeat layers {{
    residual {{ {norm}  attention(hidden, heads{kv}{bias}) }}
    residual {{ {norm}  mlp(hidden, ffn, act = {a.act}{bias}) }}
  }}
  {norm}  lm_head(vocab, hidden, tied = {str(a.tied).lower()})  cross_entropy
}}
mesh  {{ axis dp = 1  nodes = 1  devices_per_node = 1  device = {device} }}
plan  {{ compile = {str(compile_on).lower()} }}
train {{
  global_batch = {b.batch}  seq_len = seq  steps = {steps}  precision = {precision}
  optimizer = adamw(lr = {b.lr}, betas = (0.9, 0.95), weight_decay = 0.1)  grad_clip = 1.0  log_every = 10
}}
"""


def device_figures(device: str, peak_tflops: float | None) -> tuple[str, str, float]:
    """(name in words, compiler device name, peak FLOP/s) of the device the columns run on."""
    from compiler.layout.devices import DEVICES
    if device == "cpu":
        return "this machine's CPU", "cpu", (peak_tflops or DEVICES["cpu"].peak_tflops) * 1e12
    import torch
    name = torch.cuda.get_device_name(0)
    kind = next((k for k in ("gb200", "b200", "h200", "h100", "a100") if k in name.lower()), None)
    if kind is None and peak_tflops is None:
        raise SystemExit(f"bench/gpu.py: no figures for {name!r} in compiler/layout/devices.py: give --peak-tflops")
    return name, kind or "h100", (peak_tflops or DEVICES[kind].peak_tflops) * 1e12


def env(device: str, cache: Path | None) -> dict:
    """The environment of one run: a world of one; with `cache`, torch.compile's caches (inductor's, triton's) in
    that fresh folder, so that every compiled run compiles from nothing (its first steps show what a user's first
    run pays), not from what an earlier column or run left."""
    e = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if cache is not None:
        e.update(TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"), TRITON_CACHE_DIR=str(cache / "triton"))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):  # a world of one, always
        e.pop(k, None)
    if device == "cpu":
        e["OMP_NUM_THREADS"] = "1"  # every column on one thread: this machine's cores are shared
    return e


def read_metrics(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def build(name: str, b: Bench, where: Path, compiler_device: str, precision: str, compile_on: bool,
          steps: int) -> tuple[Path, dict]:
    """Compile the .scale text of `b` into `where` (the program, plan.json, the source beside them)."""
    from compiler import codegen
    from compiler.check import check_text
    from compiler.pipeline import compile_spec
    text = scale_text(name, b, compiler_device, precision, compile_on, steps)
    codegen.emit(compile_spec(check_text(text, f"{name}.scale")), str(where))
    (where / f"{name}.scale").write_text(text)
    return where, json.loads((where / "plan.json").read_text())


def column_command(col: str, build_dir: Path | None, b: Bench, optim: dict, args, metrics: Path) -> list[str]:
    """The command of one column: the generated program (`build_dir`) or bench/handwritten.py."""
    if col in OURS:
        return [sys.executable, str(build_dir / "program.py"), "--steps", str(args.steps), "--metrics", str(metrics)]
    return [sys.executable, "-m", "bench.handwritten", "--arch", json.dumps(asdict(b.arch)), "--optim",
            json.dumps(optim), "--batch", str(b.batch), "--steps", str(args.steps), "--metrics", str(metrics),
            "--device", args.device, "--precision", "fp32" if args.device == "cpu" else "bf16",
            *(["--compile"] if col == "hand_compiled" else [])]


def run_column(col: str, build_dir: Path | None, b: Bench, optim: dict, args, metrics: Path) -> dict:
    """Run one column in its own process; its metrics records and wall time, or the failure's last lines."""
    cmd = column_command(col, build_dir, b, optim, args, metrics)
    out: dict = {"column": col, "command": " ".join(cmd)}
    t0 = time.perf_counter()
    try:
        cache = None if args.warm_cache else metrics.with_suffix(".cache")
        proc = subprocess.run(cmd, cwd=ROOT, env=env(args.device, cache), capture_output=True, text=True,
                              timeout=args.timeout)
        failed = proc.returncode != 0 and f"exit {proc.returncode}"
        tail = (proc.stdout + proc.stderr).splitlines()[-8:]
    except subprocess.TimeoutExpired as exc:
        said = exc.stderr or b""  # bytes, even under text=True
        said = said.decode(errors="replace") if isinstance(said, bytes) else said
        failed, tail = f"timed out after {args.timeout:g} s", said.splitlines()[-8:]
    out["wall_s"] = time.perf_counter() - t0
    out["records"] = read_metrics(metrics)
    if failed or len(out["records"]) < args.steps:
        out["error"] = (f"{failed or 'only %d of %d steps recorded' % (len(out['records']), args.steps)}: "
                        + " | ".join(tail))
    return out


def summarise(runs: list[dict], warmup: int, tokens: int, flops: float, peak_flops: float) -> dict:
    """The column's figures from its runs' per-step records (one run per round; steps warmup+1 .. N of each are
    the steady ones, pooled for the median; the warm-up figures are the median over the rounds)."""
    first = runs[0]
    s = {"column": first["column"], "command": first["command"], "rounds": len(runs),
         "wall_s": round(sum(r["wall_s"] for r in runs), 2),
         "error": next((r["error"] for r in runs if r.get("error")), None)}
    steady = [x["step_time"] for r in runs for x in r["records"][warmup:]]
    if not steady or s["error"]:
        return s
    median = statistics.median(steady)
    peaks = [x["peak_memory_bytes"] for r in runs for x in r["records"][warmup:] if x.get("peak_memory_bytes")]
    excess = [sum(x["step_time"] for x in r["records"][:warmup]) - warmup * median for r in runs]
    s.update(median_ms=median * 1e3, steady_steps=[warmup + 1, len(first["records"])], tokens_per_s=tokens / median,
             flops_per_step=flops, mfu=flops / median / peak_flops,
             peak_memory_bytes=max(peaks) if peaks else None,
             first_step_ms=statistics.median(r["records"][0]["step_time"] for r in runs) * 1e3,
             warmup_excess_s=statistics.median(excess),
             loss_first=first["records"][0]["loss"], loss_last=first["records"][-1]["loss"],
             step_times_ms=[[round(x["step_time"] * 1e3, 3) for x in r["records"]] for r in runs])
    return s


def optim_settings(o) -> dict:
    """A generated program's optimizer settings (its CONFIG.optim), as bench/handwritten.py takes them."""
    return dict(lr=o.lr, betas=list(o.betas), eps=o.eps, weight_decay=o.weight_decay, grad_clip=o.grad_clip,
                lr_schedule=o.lr_schedule, warmup=o.warmup, min_lr=o.min_lr)


def bench_model(name: str, b: Bench, columns, args, dev: tuple[str, str, float], precision: str) -> dict:
    from bench.common import load_program
    _, compiler_device, peak_flops = dev
    tokens = b.batch * b.arch.seq
    with tempfile.TemporaryDirectory(prefix=f"bench_gpu_{name}_") as tmp:
        where = Path(tmp)
        builds = {col: build(name, b, where / col, compiler_device, precision, col == "ours_compiled", args.steps)
                  for col in OURS}
        flops = {plan["cost"]["flops_per_step"] for _, plan in builds.values()}
        if len(flops) != 1:
            raise SystemExit(f"bench/gpu.py: {name}: compile on and off count different FLOPs: {flops}")
        (flops,) = flops
        # The generated program's own optimizer settings, so that both sides train alike.
        optim = optim_settings(load_program(builds["ours_eager"][0], f"scalec_bench_{name}").CONFIG.optim)
        runs: dict[str, list] = {col: [] for col in sorted(columns, key=COLUMNS.index)}
        for k in range(args.rounds):  # rounds alternate the columns: A B C D A B C D ...
            for col in runs:
                label = f"  {name}: {TITLES[col]}" + (f" (round {k + 1}/{args.rounds})" if args.rounds > 1 else "")
                print(label + " ...", end="", flush=True)
                run = run_column(col, builds.get(col, (None,))[0], b, optim, args, where / f"{col}.{k}.jsonl")
                runs[col].append(run)
                print(f" {run['wall_s']:.1f} s" + (f"  FAILED: {run['error']}" if "error" in run else ""), flush=True)
        cols = {c: summarise(r, args.warmup, tokens, float(flops), peak_flops) for c, r in runs.items()}
    ours = [cols[c]["median_ms"] for c in OURS if "median_ms" in cols.get(c, {})]
    hand = [cols[c]["median_ms"] for c in HAND if "median_ms" in cols.get(c, {})]
    return {"model": name, "arch": asdict(b.arch), "batch": b.batch, "tokens_per_step": tokens,
            "parameters": builds["ours_eager"][1]["cost"]["parameters"], "flops_per_step": float(flops),
            "optim": optim, "columns": cols, "ours_over_hand": min(ours) / min(hand) if ours and hand else None}


def gb(n) -> str:
    return "n/a" if n is None else f"{n / 1e9:.1f} GB"


def table(result: dict) -> str:
    rounds = f" of {result['rounds']} alternating rounds" if result["rounds"] > 1 else ""
    lines = [f"bench/gpu.py on {result['device']} ({result['precision']}, peak {result['peak_tflops']:g} TFLOP/s; "
             f"medians over steps {result['warmup'] + 1}-{result['steps']}{rounds}; torch {result['torch']})"]
    for m in result["models"]:
        lines.append("")
        lines.append(f"{m['model']}: {m['parameters'] or 0:,} parameters, {m['batch']} × {m['arch']['seq']} tokens "
                     f"per step, {m['flops_per_step'] / 1e12:.4g} TFLOP per step (compiler's count, every column)")
        lines.append(f"  {'column':<28}{'ms/step':>10}{'tokens/s':>12}{'MFU':>8}{'peak mem':>11}"
                     f"{'1st step':>11}{'warm-up excess':>16}{'wall':>8}")
        for col in COLUMNS:
            c = m["columns"].get(col)
            if c is None:
                continue
            if "median_ms" not in c:
                lines.append(f"  {TITLES[col]:<28}FAILED: {c['error']}")
                continue
            lines.append(f"  {TITLES[col]:<28}{c['median_ms']:>10.2f}{c['tokens_per_s']:>12,.0f}{c['mfu']:>8.1%}"
                         f"{gb(c['peak_memory_bytes']):>11}{c['first_step_ms'] / 1e3:>10.2f}s"
                         f"{c['warmup_excess_s']:>15.1f}s{c['wall_s']:>7.0f}s")
        r = m["ours_over_hand"]
        lines.append("  ours / best hand-written (ms/step): " + ("n/a (needs a column of each side)" if r is None
                                                                 else f"{r:.3f}"))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when available")
    p.add_argument("--models", help=f"comma-separated (CUDA: {', '.join(MODELS)}; CPU: {', '.join(CPU_MODELS)})")
    p.add_argument("--columns", default=",".join(COLUMNS), help=f"comma-separated of {', '.join(COLUMNS)}")
    p.add_argument("--steps", type=int, help="steps per run (default 50 on CUDA, 20 on CPU)")
    p.add_argument("--warmup", type=int, help="steps left out of the medians (default 15 on CUDA, 5 on CPU)")
    p.add_argument("--peak-tflops", type=float, help="the device's peak (default: compiler/layout/devices.py)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run the columns this many times, alternating (A B C D A B C D ...), and pool their steady "
                        "steps: for a machine others share (default 1)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per run (default 600)")
    p.add_argument("--warm-cache", action="store_true",
                   help="keep torch.compile's usual caches (default: a fresh, empty cache for every run)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    if args.device is None:
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    cpu = args.device == "cpu"
    catalogue = CPU_MODELS if cpu else MODELS
    names = args.models.split(",") if args.models else list(catalogue)
    columns = args.columns.split(",")
    bad = [n for n in names if n not in catalogue] + [c for c in columns if c not in COLUMNS]
    if bad:
        raise SystemExit(f"bench/gpu.py: unknown {bad} on {args.device} (models: {', '.join(catalogue)}; "
                         f"columns: {', '.join(COLUMNS)})")
    args.steps = args.steps or (20 if cpu else 50)
    args.warmup = 5 if cpu and args.warmup is None else (15 if args.warmup is None else args.warmup)
    if args.rounds < 1:
        raise SystemExit("bench/gpu.py: --rounds must be at least 1")
    if not 0 <= args.warmup < args.steps:
        raise SystemExit(f"bench/gpu.py: --warmup {args.warmup} leaves no steady step of --steps {args.steps}")
    precision = "fp32" if cpu else "bf16"
    dev = device_figures(args.device, args.peak_tflops)
    import torch
    result = {"device": dev[0], "compiler_device": dev[1], "peak_tflops": dev[2] / 1e12, "precision": precision,
              "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds, "torch": torch.__version__, "models": []}
    t0 = time.perf_counter()
    for name in names:
        result["models"].append(bench_model(name, catalogue[name], columns, args, dev, precision))
    result["wall_s"] = time.perf_counter() - t0
    print()
    print(table(result))
    print(f"\n{time.perf_counter() - t0:.0f} s in all")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    failed = [f"{m['model']}/{c}" for m in result["models"] for c, v in m["columns"].items() if v.get("error")]
    if failed:
        print(f"bench/gpu.py: failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
