"""This machine's figures for the step-time model's `cpu` device, measured as generated programs run on CPU.

    python -m bench.cpu_calibration                 # everything, ~1-2 minutes on 2 cores
    python -m bench.cpu_calibration --json cpu.json # the same, also written as JSON
    python -m bench.cpu_calibration --quick         # a few sizes of each, 2 ranks only: a sanity run (~10 s)
    python -m bench.cpu_calibration --wait-idle 120 # before each part, wait for other jobs to leave the cores

Generated programs on CPU run one process per rank with one thread each (OMP_NUM_THREADS=1) and talk over gloo on
loopback. Everything here is measured that way: the compute figures in this process after
`torch.set_num_threads(1)`, the communication figures in 2 and 4 spawned processes of one thread each.

Method (every figure a median; every timed thing run first as a warm-up):

1. Matmul rate, fp32 (and bf16), 1 thread. `torch.mm(a, b, out=c)` for square sizes 64..1024 and `x @ w.t()`
   (nn.Linear's layout, no bias) for the shapes of the e2e tiny models (samples/gpt_dp.scale, gpt_tp.scale:
   hidden 64, ffn 256, vocab 128, 8 × 32 = 256 rows per dp rank or 16 × 32 = 512 on one device; tp halves the
   output or input dim). A sample is `inner` calls back to back, `inner` chosen so that a sample lasts ~5 ms;
   the median of 7 samples, divided by `inner`, is the time of one call, dispatch included. FLOPs = 2·m·k·n.
   The peak is the best rate of the square sizes >= 512. Small shapes fall below it by a cost per call (dispatch,
   packing), so the model fitted is
       time(m, k, n) = t0 + 2·m·k·n / peak,   i.e.  rate = peak · f(shape),  f = F / (F + peak·t0)
   with t0 the least-squares fit on log(time) over every measured shape (square and model shapes alike); the table
   prints the rate the fit predicts beside the measured one, and the JSON carries both and the fit's worst
   relative error, so where one constant does not describe a shape is seen, not hidden.
2. Memory bandwidth, 1 thread: `torch.add(a, b, out=c)` on 64 MB fp32 tensors (bytes = 2 read + 1 written),
   `c.copy_(a)` (1 read + 1 written) and `a.mul_(-1.0)` in place (1 + 1); GB/s = bytes / median time. The model
   uses the add's figure (what elementwise ops of a step look like).
3. gloo over loopback, 2 and 4 ranks (torch.multiprocessing, spawn; `tcp://127.0.0.1` rendezvous; fp32 tensors):
   all_reduce (sum), all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single, and send/recv (ping-pong
   between rank pairs (0,1), (2,3), ..., all pairs at once; one-way time = round trip / 2). Sizes 4 B .. 64 MB
   by factors of 4. Bytes follow the ledger's convention (compiler/cost ledger, bench/tp.py): all-reduce = the
   tensor, all-gather = the gathered output, reduce-scatter = the full input, all-to-all = the tensor each rank
   sends, send/recv = the message. A sample: a barrier, then `inner` operations back to back (inner = 20 up to
   16 kB, 5 up to 1 MB, else 1), divided by `inner`; each rank's samples are reduced by max over ranks (the
   operation ends when its slowest rank does), and the median over the repeats is the time. Fit per op and rank
   count: time = alpha + bytes / beta, beta by least squares over sizes >= 4 MB (slope and intercept: at 1 MB and
   below the buffers sit in cache and the time is mostly alpha), alpha as the mean over sizes <= 4 kB of
   (time − bytes/beta). The table also prints measured times at 4 B, 4 kB, 1 MB and 64 MB, and the fit's worst
   relative error over all sizes. 4 ranks on 2 cores are oversubscribed: their figures are
   what a 4-rank e2e case sees here, not a faster network.
4. Per-op overhead: a tiny `torch.add` of two 8-element tensors (out-of-place, as programs run), median over
   samples of 2000 calls: the dispatch cost every small op pays; and the same through autograd (`requires_grad`
   inputs) since training forwards record the graph.

Each figure is measured with the rest of this machine as it is: the JSON records the load average before and
after and, for each part, how many cores other processes kept busy while it ran (all cores' busy time from
/proc/stat minus this process's and its workers' CPU time), so a figure taken while other jobs ran can be
recognised. `--wait-idle S` waits (within S seconds per part) for other processes to leave the cores before each
part, and measures a part again when they took 0.2 of a core or more during it: on 2 cores one busy neighbour
slows a single-threaded matmul and stretches gloo's small-message times several-fold (it must be scheduled to
answer). Nothing here is written into compiler/; the lead
copies the figures into the device table with this command as their source.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import time

import torch

# Shapes (m, k, n) of the e2e tiny models' matmuls (hidden 64, ffn 256, vocab 128, seq 32; global batch 16).
MODEL_SHAPES = {
    "dp2 qkv 256x64x192": (256, 64, 192),
    "dp2 attn-out 256x64x64": (256, 64, 64),
    "dp2 mlp-up 256x64x256": (256, 64, 256),
    "dp2 mlp-down 256x256x64": (256, 256, 64),
    "dp2 lm-head 256x64x128": (256, 64, 128),
    "one mlp-up 512x64x256": (512, 64, 256),
    "one mlp-down 512x256x64": (512, 256, 64),
    "tp2 qkv 512x64x96": (512, 64, 96),
    "tp2 mlp-up 512x64x128": (512, 64, 128),
    "tp2 mlp-down 512x128x64": (512, 128, 64),
    "tp2 lm-head 512x64x64": (512, 64, 64),
}
SQUARE = (64, 128, 256, 384, 512, 768, 1024)
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def _time_call(fn, target_s: float = 0.005, samples: int = 7, max_inner: int = 10_000) -> float:
    """Median seconds per call of `fn`: warm-up, then `samples` samples of `inner` back-to-back calls."""
    fn()
    t = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t, 1e-7)
    inner = max(1, min(max_inner, int(target_s / once)))
    for _ in range(min(inner, 3)):
        fn()
    times = []
    for _ in range(samples):
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t) / inner)
    return statistics.median(times)


# ---------------------------------------------------------------------------------------------------------------
# 1. matmul

def _mm_time(m: int, k: int, n: int, dtype: torch.dtype, linear: bool, samples: int) -> float:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=g).to(dtype)
    if linear:  # nn.Linear's layout: weight [n, k], x @ w.t()
        w = torch.randn(n, k, generator=g).to(dtype)
        return _time_call(lambda: torch.matmul(a, w.t()), samples=samples)
    b = torch.randn(k, n, generator=g).to(dtype)
    c = torch.empty(m, n, dtype=dtype)
    return _time_call(lambda: torch.mm(a, b, out=c), samples=samples)


def fit_matmul(points: list[dict], peak: float) -> float:
    """t0 (s) of time = t0 + flops/peak, t0 >= 0, by least squares on log(time) (every shape weighs by its relative
    error, the tiny ones as much as the large): a scan of t0 over 0..1 ms in 0.05 us steps."""
    import math

    def cost(t0: float) -> float:
        return sum(math.log((t0 + p["flops"] / peak) / p["time_s"]) ** 2 for p in points)
    return min((i * 5e-8 for i in range(20_001)), key=cost)


def matmul(dtype: torch.dtype, squares, shapes: dict, samples: int) -> dict:
    points = []
    for s in squares:
        t = _mm_time(s, s, s, dtype, linear=False, samples=samples)
        points.append({"name": f"square {s}", "m": s, "k": s, "n": s, "flops": 2 * s ** 3, "time_s": t})
    for name, (m, k, n) in shapes.items():
        t = _mm_time(m, k, n, dtype, linear=True, samples=samples)
        points.append({"name": name, "m": m, "k": k, "n": n, "flops": 2 * m * k * n, "time_s": t})
    for p in points:
        p["gflops"] = p["flops"] / p["time_s"] / 1e9
    large = [p for p in points if p["name"].startswith("square") and p["m"] >= min(512, max(squares))]
    peak = max(p["flops"] / p["time_s"] for p in large)
    t0 = fit_matmul(points, peak)
    for p in points:
        p["gflops_fit"] = p["flops"] / (t0 + p["flops"] / peak) / 1e9
    worst = max(abs(p["gflops_fit"] / p["gflops"] - 1) for p in points)
    return {"dtype": str(dtype).removeprefix("torch."), "peak_gflops": peak / 1e9, "t0_us": t0 * 1e6,
            "fit_worst_rel_err": worst, "points": points,
            "model": "time = t0 + 2*m*k*n / peak  (rate = peak * F / (F + peak * t0))"}


# ---------------------------------------------------------------------------------------------------------------
# 2. memory bandwidth and 4. per-op overhead

def bandwidth(mbytes: int, samples: int) -> dict:
    n = mbytes * 2 ** 20 // 4
    a, b, c = torch.rand(n), torch.rand(n), torch.empty(n)
    nb = n * 4
    out = {}
    for name, fn, moved in (("add", lambda: torch.add(a, b, out=c), 3 * nb),
                            ("copy", lambda: c.copy_(a), 2 * nb),
                            ("scale_inplace", lambda: a.mul_(-1.0), 2 * nb)):
        t = _time_call(fn, target_s=0.0, samples=samples)
        out[name] = {"bytes": moved, "time_s": t, "gb_s": moved / t / 1e9}
    out["tensor_mb"] = mbytes
    return out


def overhead(samples: int) -> dict:
    a, b = torch.rand(8), torch.rand(8)
    ga, gb = torch.rand(8, requires_grad=True), torch.rand(8, requires_grad=True)
    res = {}
    for name, fn in (("add_us", lambda: torch.add(a, b)), ("add_autograd_us", lambda: torch.add(ga, gb))):
        fn()
        times = []
        for _ in range(samples):
            t = time.perf_counter()
            for _ in range(2000):
                fn()
            times.append((time.perf_counter() - t) / 2000)
        res[name] = statistics.median(times) * 1e6
    return res


# ---------------------------------------------------------------------------------------------------------------
# 3. gloo

def _inner(nbytes: int) -> int:
    return 20 if nbytes <= 16 * 1024 else 5 if nbytes <= 2 ** 20 else 1


def _repeats(nbytes: int, quick: bool) -> int:
    if quick:
        return 3
    return 11 if nbytes <= 2 ** 20 else 5 if nbytes <= 16 * 2 ** 20 else 3


def ledger_bytes(op: str, numel: int, world: int) -> int:
    """Bytes of one operation on a `numel`-element fp32 buffer per rank, in the ledger's convention (see the
    module docstring); `numel` is the tensor the op is named by (all-gather: its output)."""
    return 4 * numel


def _gloo_worker(rank: int, world: int, port: int, sizes: list[int], quick: bool, queue) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    import warnings

    import torch.distributed as dist
    # all_gather_into_tensor / reduce_scatter_tensor: deprecated names in 2.13, the same gloo operations the
    # runtime's functional collectives issue.
    warnings.filterwarnings("ignore", category=FutureWarning)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    results = {}
    try:
        peer = rank ^ 1
        for op in OPS:
            if op == "send_recv" and world % 2:
                continue
            for nbytes in sizes:
                numel = max(1, nbytes // 4)
                if op in ("all_gather", "reduce_scatter", "all_to_all"):
                    numel = max(world, numel - numel % world)  # divisible by the world size
                big = torch.ones(numel)
                part = torch.ones(numel // world)
                if op == "all_reduce":
                    def fn():
                        dist.all_reduce(big)
                elif op == "all_gather":
                    def fn():
                        dist.all_gather_into_tensor(big, part)
                elif op == "reduce_scatter":
                    def fn():
                        dist.reduce_scatter_tensor(part, big)
                elif op == "all_to_all":
                    out = torch.empty_like(big)

                    def fn():
                        dist.all_to_all_single(out, big)
                else:
                    def fn():  # ping-pong: the even rank of each pair sends first
                        if rank % 2 == 0:
                            dist.send(big, peer)
                            dist.recv(big, peer)
                        else:
                            dist.recv(big, peer)
                            dist.send(big, peer)
                inner = _inner(4 * numel)
                fn()  # warm-up (connections, buffers)
                times = []
                for _ in range(_repeats(4 * numel, quick)):
                    dist.barrier()
                    t = time.perf_counter()
                    for _ in range(inner):
                        fn()
                    times.append((time.perf_counter() - t) / inner)
                slowest = torch.tensor(times, dtype=torch.float64)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                t = statistics.median(slowest.tolist())
                if op == "send_recv":
                    t /= 2  # one way
                results.setdefault(op, []).append({"bytes": ledger_bytes(op, numel, world), "time_s": t})
        if rank == 0:
            queue.put(results)
    finally:
        dist.destroy_process_group()


def fit_alpha_beta(points: list[dict], large_from: int = 4 * 2 ** 20, small_to: int = 4096) -> dict:
    """time = alpha + bytes/beta: beta from a least-squares line through the sizes >= `large_from`, alpha the mean
    over sizes <= `small_to` of what that slope leaves. Falls back to the two largest sizes when fewer than two
    are large (the --quick sweep). `fit_worst_rel_err`: the line's worst relative error over every size."""
    large = [p for p in points if p["bytes"] >= large_from]
    if len(large) < 2:
        large = sorted(points, key=lambda p: p["bytes"])[-2:]
    n = len(large)
    mx = sum(p["bytes"] for p in large) / n
    my = sum(p["time_s"] for p in large) / n
    sxx = sum((p["bytes"] - mx) ** 2 for p in large)
    slope = sum((p["bytes"] - mx) * (p["time_s"] - my) for p in large) / sxx
    small = [p for p in points if p["bytes"] <= small_to] or sorted(points, key=lambda p: p["bytes"])[:1]
    alpha = sum(p["time_s"] - p["bytes"] * slope for p in small) / len(small)
    beta = 1 / slope if slope > 0 else float("inf")
    worst = max(abs((alpha + p["bytes"] * slope) / p["time_s"] - 1) for p in points)
    return {"alpha_us": alpha * 1e6, "beta_gb_s": beta / 1e9, "fit_worst_rel_err": worst}


def gloo(world: int, sizes: list[int], quick: bool) -> dict:
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    procs = [ctx.Process(target=_gloo_worker, args=(r, world, port, sizes, quick, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = queue.get()
    for p in procs:
        p.join()
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad:
        raise SystemExit(f"cpu_calibration: a gloo worker of {world} failed (exit codes {bad})")
    return {op: {"points": pts, **fit_alpha_beta(pts)} for op, pts in results.items()}


# ---------------------------------------------------------------------------------------------------------------

def _cpu_seconds() -> tuple[float, float]:
    """(seconds every core spent busy since boot, from /proc/stat; this process's and its joined children's CPU
    seconds)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    t = os.times()
    return (sum(v) - v[3] - v[4]) / hz, t.user + t.system + t.children_user + t.children_system


def _busy_cores(window_s: float = 0.5) -> float:
    """Cores kept busy by other processes over `window_s` (this process sleeps meanwhile)."""
    b0, _ = _cpu_seconds()
    t = time.monotonic()
    time.sleep(window_s)
    b1, _ = _cpu_seconds()
    return (b1 - b0) / (time.monotonic() - t)


def _part(name: str, fn, wait_s: float, record: dict):
    """Run one part of the calibration. With `wait_s` > 0: first wait (within `wait_s`) until other processes keep
    less than 0.2 of a core busy, and measure the part again if they used 0.2 of a core or more while it ran.
    `record[name]`: the cores other processes kept busy during the accepted measurement (all cores busy minus
    this process and its workers)."""
    deadline = time.monotonic() + wait_s
    while True:
        while wait_s and time.monotonic() < deadline and _busy_cores() >= 0.2:
            pass
        b0, m0 = _cpu_seconds()
        t = time.monotonic()
        result = fn()
        b1, m1 = _cpu_seconds()
        others = max(0.0, ((b1 - b0) - (m1 - m0)) / (time.monotonic() - t))
        if others < 0.2 or time.monotonic() >= deadline:
            record[name] = round(others, 2)
            return result


def measure(quick: bool = False, wait_idle: float = 0.0) -> dict:
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    load_before = os.getloadavg()
    busy: dict = {}
    samples = 3 if quick else 7
    squares = (64, 256) if quick else SQUARE
    shapes = dict(list(MODEL_SHAPES.items())[:2]) if quick else MODEL_SHAPES
    res = {"machine": {"cpu": _cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__,
                       "python": platform.python_version(), "threads": torch.get_num_threads(),
                       "load_avg_before": load_before},
           "quick": quick}
    res["matmul_fp32"] = _part("matmul_fp32", lambda: matmul(torch.float32, squares, shapes, samples),
                               wait_idle, busy)
    res["matmul_bf16"] = _part("matmul_bf16", lambda: matmul(torch.bfloat16, squares if quick else (64, 256, 512, 1024),
                                {} if quick else dict(list(MODEL_SHAPES.items())[:5]), samples), wait_idle, busy)
    res["memory_bandwidth"] = _part("memory", lambda: bandwidth(8 if quick else 64, 3 if quick else 7), wait_idle,
                                    busy)
    res["op_overhead"] = _part("overhead", lambda: overhead(3 if quick else 9), wait_idle, busy)
    sizes = [4 ** i for i in range(1, 11 if quick else 14)]  # 4 B .. 4 MB (quick) or 64 MB
    res["gloo"] = {}
    for w in (2,) if quick else (2, 4):
        res["gloo"][str(w)] = _part(f"gloo{w}", lambda: gloo(w, sizes, quick), wait_idle, busy)
    res["machine"]["others_busy_cores"] = busy
    res["machine"]["load_avg_after"] = os.getloadavg()
    res["wall_s"] = time.perf_counter() - t_start
    return res


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _size(b: float) -> str:
    for unit, f in (("MB", 2 ** 20), ("kB", 2 ** 10)):
        if b >= f:
            return f"{b / f:g} {unit}"
    return f"{b:g} B"


def render(res: dict) -> str:
    m = res["machine"]
    lines = [f"cpu calibration: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, 1 thread per process"
             f"{' (quick)' if res['quick'] else ''}",
             f"load average before {m['load_avg_before'][0]:.2f}, after {m['load_avg_after'][0]:.2f}; "
             f"wall {res['wall_s']:.0f} s",
             "cores other processes kept busy during each part: "
             + ", ".join(f"{k} {v:.2f}" for k, v in m["others_busy_cores"].items()), ""]
    for key in ("matmul_fp32", "matmul_bf16"):
        mm = res[key]
        lines.append(f"matmul {mm['dtype']}: peak {mm['peak_gflops']:.1f} GFLOP/s, t0 {mm['t0_us']:.1f} us "
                     f"(time = t0 + 2mkn/peak; worst fit error {mm['fit_worst_rel_err']:.0%})")
        lines.append(f"  {'shape':<26}{'m x k x n':>16}{'time us':>10}{'GFLOP/s':>9}{'fit':>8}")
        for p in mm["points"]:
            lines.append(f"  {p['name']:<26}{p['m']:>6}x{p['k']}x{p['n']:<6}{p['time_s'] * 1e6:>9.1f}"
                         f"{p['gflops']:>9.1f}{p['gflops_fit']:>8.1f}")
        lines.append("")
    bw = res["memory_bandwidth"]
    lines.append(f"memory bandwidth, {bw['tensor_mb']} MB fp32 tensors (bytes read + written):")
    for name in ("add", "copy", "scale_inplace"):
        lines.append(f"  {name:<14}{bw[name]['gb_s']:>7.2f} GB/s   ({bw[name]['time_s'] * 1e3:.2f} ms)")
    ov = res["op_overhead"]
    lines.append(f"per-op overhead (add of 8 elements): {ov['add_us']:.2f} us, with autograd "
                 f"{ov['add_autograd_us']:.2f} us")
    lines.append("")
    lines.append("gloo over loopback, fp32, time = alpha + bytes/beta (bytes as the ledger counts them)")
    lines.append(f"  {'op':<16}{'ranks':>6}{'alpha us':>10}{'beta GB/s':>11}{'fit err':>9}   time at "
                 + "  ".join(_size(s) for s in (4, 4096, 2 ** 20, 2 ** 26)))
    for world, ops in res["gloo"].items():
        for op, f in ops.items():
            at = {p["bytes"]: p["time_s"] for p in f["points"]}
            cells = "  ".join(f"{at[s] * 1e6:.0f}us" if s in at else "-" for s in (4, 4096, 2 ** 20, 2 ** 26))
            lines.append(f"  {op:<16}{world:>6}{f['alpha_us']:>10.1f}{f['beta_gb_s']:>11.3f}"
                         f"{f['fit_worst_rel_err']:>9.0%}   {cells}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="write the figures (and every measured point) to this file")
    p.add_argument("--quick", action="store_true", help="a few sizes, 2 ranks only (a sanity run, ~10 s)")
    p.add_argument("--wait-idle", type=float, default=0.0, metavar="S",
                   help="before each part, wait up to S seconds for other processes to leave the cores idle")
    args = p.parse_args(argv)
    res = measure(quick=args.quick, wait_idle=args.wait_idle)
    print(render(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
        print(f"\nwritten {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
