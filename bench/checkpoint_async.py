"""Does `torch.distributed.checkpoint.async_save` shorten the training step that carries a checkpoint?

Run under torchrun (2 ranks here):
    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 bench/checkpoint_async.py [--hidden 1024] [--saves 5]

Each rank trains an MLP (`--layers` Linear(hidden, hidden), AdamW, its gradients all-reduced as DDP would) and saves
its model and optimizer state every `--every` steps, side by side in the same process: synchronously (dcp.save, as
runtime/checkpoint.py does) and asynchronously (dcp.async_save on a separate gloo group; the next save waits for the
previous one). Reported on rank 0, medians over the saves: a plain step, the step that carries a save (from the
start of the save to the end of that step), and the cost of the save to the loop (the difference).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--saves", type=int, default=5)
    p.add_argument("--every", type=int, default=3)
    p.add_argument("--dir", default=None)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(args.hidden, args.hidden) for _ in range(args.layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch, args.hidden)
    ckpt_group = dist.new_group(backend="gloo")
    root = args.dir or tempfile.mkdtemp(prefix="scalec-async-bench-")

    def step():
        loss = model(x).square().mean()
        loss.backward()
        for q in model.parameters():
            dist.all_reduce(q.grad)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def state():
        return {"model": model.state_dict(), "optim": opt.state_dict()["state"]}

    for _ in range(2):
        step()
    results = {}
    pending = None
    for mode in ("sync", "async", "sync", "async"):  # interleaved, twice, so drift in machine load hits both
        plain, carrying = results.setdefault(mode, ([], []))
        for k in range(args.saves):
            for _ in range(args.every - 1):
                t0 = time.perf_counter()
                step()
                plain.append(time.perf_counter() - t0)
            dist.barrier()
            t0 = time.perf_counter()
            path = os.path.join(root, f"{mode}_{len(carrying)}")
            if mode == "sync":
                dcp.save(state(), checkpoint_id=path)
            else:
                if pending is not None:
                    pending.result()
                pending = dcp.async_save(state(), checkpoint_id=path, process_group=ckpt_group)
            step()
            carrying.append(time.perf_counter() - t0)
        if pending is not None:
            pending.result()
            pending = None
        dist.barrier()
    n_params = sum(q.numel() for q in model.parameters())
    if rank == 0:
        print(f"{dist.get_world_size()} ranks, {n_params:,} parameters per rank, state {n_params * 12 / 1e6:.0f} MB "
              f"per rank (weights + 2 moments, fp32), {args.saves * 2} saves per mode")
        for mode, (plain, carrying) in results.items():
            a, b = statistics.median(plain), statistics.median(carrying)
            print(f"  {mode:5}: plain step {a * 1000:7.1f} ms | step carrying a save {b * 1000:7.1f} ms | "
                  f"save costs the loop {(b - a) * 1000:7.1f} ms")
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
