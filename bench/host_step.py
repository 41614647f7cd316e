"""What optimizer offload's host side costs on this machine: torch's AdamW stepping fp32 parameters on the CPU
(foreach, and fused where torch has a CPU kernel for it), in parameters per second per thread and with every
thread, and the bandwidth of a large host copy (what a pinned buffer's fill reads and writes: on a machine with a
GPU the host link, not this, bounds a device<->host copy).

    python3 -m bench.host_step [--params N] [--repeats K]

The last line is a JSON record: `host_adam_params_per_s` (the best AdamW implementation, every thread),
`host_adam_params_per_s_per_thread`, `copy_gbps`, with the torch version, the threads and the implementation.
compiler/layout/devices.py takes the cpu kind's figures from it (one thread a rank) and, for the GPU kinds, what it
shows of the fused step: ~28 bytes a parameter streamed (the one-thread rate × 28 is about the copy's traffic, read
and written), so a host's rate is its memory bandwidth per GPU over 28 (its comment says which runs;
bench/results/host_step_cpu_2026-11-29.json holds them)."""
from __future__ import annotations

import argparse
import json
import time

import torch


def adam_rate(n: int, repeats: int, impl: str, threads: int) -> float:
    """Parameters per second of torch.optim.AdamW over one fp32 tensor of `n` elements split into tensors of 1M
    (a model's parameters are many tensors), `impl` "foreach" or "fused", on `threads` threads: the best of
    `repeats` steps after one warm-up."""
    torch.set_num_threads(threads)
    chunk = 1 << 20
    params = [torch.nn.Parameter(torch.zeros(min(chunk, n - i))) for i in range(0, n, chunk)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1, **{impl: True})
    opt.step()  # the moments' allocation
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        opt.step()
        best = min(best, time.perf_counter() - t)
    return n / best


def copy_gbps(nbytes: int, repeats: int) -> float:
    """GB/s of copying `nbytes` between two host tensors (counted once: the bytes a copy moves), best of
    `repeats`."""
    a = torch.ones(nbytes // 4)
    b = torch.empty_like(a)
    b.copy_(a)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        b.copy_(a)
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=int, default=16 << 20, help="parameters stepped (default 16M)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    threads = torch.get_num_threads()
    rates = {}
    for impl in ("foreach", "fused"):
        try:
            rates[impl] = (adam_rate(args.params, args.repeats, impl, 1),
                           adam_rate(args.params, args.repeats, impl, threads))
        except (RuntimeError, TypeError) as exc:  # fused AdamW without a CPU kernel in this torch
            print(f"AdamW {impl}: not available on CPU ({exc})")
            continue
        print(f"AdamW {impl:8s}: {rates[impl][0] / 1e6:8.1f} M params/s on 1 thread, "
              f"{rates[impl][1] / 1e6:8.1f} M params/s on {threads}")
    torch.set_num_threads(threads)
    gbps = copy_gbps(256 << 20, args.repeats)
    print(f"host copy (256 MiB): {gbps:.1f} GB/s")
    impl = max(rates, key=lambda k: rates[k][1])
    record = {"torch": torch.__version__, "threads": threads, "params": args.params, "adamw": impl,
              "host_adam_params_per_s_per_thread": rates[impl][0], "host_adam_params_per_s": rates[impl][1],
              "copy_gbps": gbps}
    print(json.dumps(record))
    return record


if __name__ == "__main__":
    main()
