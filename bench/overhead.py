"""The runtime's own time per step: a generated program's training loop (runtime.train) against the same Model in a
bare loop (forward, backward, torch's clip_grad_norm_, AdamW, zero_grad) on the same batch, one process, one rank.

    python -m bench.overhead [--steps N] [--repeats R] [--sample samples/tiny_gpt.scale] [--profile]

Both are timed step by step (on the CPU a step's end is its work's end; the program's step times are its --metrics
records, which read the loss every step), alternating bare and program `--repeats` times; the medians of the steps
after the first five are printed side by side, with the CPU time per step of each (a run of 2N steps less one of N,
so that set-up cancels; on a machine shared with other work the CPU time is the steadier figure). `--profile` then runs the program once more under cProfile and
prints where the runtime's own Python time goes (functions of runtime/*.py by their own time, per step), and
torch.profiler's op counts per step of both loops.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.common import ROOT, load_program, read_metrics

ONE_RANK = (("axis dp = 2", "axis dp = 1"), ("devices_per_node = 2", "devices_per_node = 1"))


def _compile(sample: str, out: Path):
    from compiler import codegen
    from compiler.check import check_text
    from compiler.pipeline import compile_spec
    text = (ROOT / sample).read_text()
    for old, new in ONE_RANK:
        text = text.replace(old, new)
    compiled = compile_spec(check_text(text, Path(sample).name))
    if compiled.plan.world_size != 1:
        raise SystemExit(f"bench.overhead: {sample} must run on one rank (got {compiled.plan.axes})")
    codegen.emit(compiled, str(out))
    return load_program(out)


def _args(metrics: str | None) -> argparse.Namespace:
    return argparse.Namespace(metrics=metrics, tensorboard=None, dump_grads=None, checkpoint_dir=None,
                              stop_after=None, count_bytes=None, memory_report=None, debug=False,
                              resume_changed=frozenset(), resume_schedule="keep")


def bare(program, steps: int) -> list[float]:
    """The generated Model in a 20-line loop: what any training loop must do, with the same batch every step."""
    from runtime import data, optimizer
    cfg = program.CONFIG
    torch.manual_seed(cfg.seed)
    model = program.Model()
    source = data.Synthetic(cfg.data.vocab, cfg.data.seq_len, cfg.seed)
    tokens, targets = data.micro_batch(source, 0, cfg.data.global_batch, 0, 1, 0, 1)
    params = list(model.parameters())
    opt = optimizer.adamw(params, cfg.optim)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = model(tokens, targets)
        loss.backward()
        if cfg.optim.grad_clip:
            torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return times


def program_loop(program, ctx, steps: int, work: Path) -> list[float]:
    from dataclasses import replace

    from runtime import train
    metrics = work / "metrics.jsonl"
    cfg = replace(program.CONFIG, steps=steps, log_every=10 ** 9)
    train.run(program.Model, cfg, ctx, _args(str(metrics)))
    return [r["step_time"] for r in read_metrics(metrics)]


def _ops_per_step(fn, steps: int) -> int:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key.startswith("aten::")) // steps


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sample", default="samples/tiny_gpt.scale")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--profile", action="store_true")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from runtime import mesh
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        program = _compile(a.sample, work / "build")
        ctx = mesh.setup(program.CONFIG.parallel.axes, 0, program.CONFIG.parallel.groups)
        got = {"bare": [], "program": []}
        for _ in range(a.repeats):
            got["bare"] += bare(program, a.steps)[5:]
            got["program"] += program_loop(program, ctx, a.steps, work)[5:]
        b, r = statistics.median(got["bare"]), statistics.median(got["program"])
        # CPU time per step (this process's, every thread): a loop of 2N steps less one of N, so that set-up cancels;
        # robust to other processes sharing the cores, which wall-clock medians are not.
        cpu = {"bare": [], "program": []}
        for _ in range(a.repeats):
            for name, fn in (("bare", lambda k: bare(program, k)), ("program",
                                                                     lambda k: program_loop(program, ctx, k, work))):
                spent = []
                for k in (a.steps, 2 * a.steps):
                    t0 = time.process_time()
                    fn(k)
                    spent.append(time.process_time() - t0)
                cpu[name].append((spent[1] - spent[0]) / a.steps)
        cb, cr = statistics.median(cpu["bare"]), statistics.median(cpu["program"])
        print(f"{a.sample}: one rank, one thread; wall: median step over {a.repeats} × {a.steps - 5} steps; "
              f"CPU: median over {a.repeats} of (CPU time of {2 * a.steps} steps - of {a.steps}) / {a.steps}")
        print(f"  bare loop  wall {b * 1e3:8.3f} ms   CPU {cb * 1e3:8.3f} ms")
        print(f"  program    wall {r * 1e3:8.3f} ms   CPU {cr * 1e3:8.3f} ms")
        print(f"  runtime's own per step: wall {(r - b) * 1e3:+.3f} ms ({r / b - 1:+.1%}), "
              f"CPU {(cr - cb) * 1e3:+.3f} ms ({cr / cb - 1:+.1%})")
        if a.profile:
            n = 20
            print(f"  aten ops per step: bare {_ops_per_step(lambda: bare(program, n), n)}, "
                  f"program {_ops_per_step(lambda: program_loop(program, ctx, n, work), n)}")
            prof = cProfile.Profile()
            prof.enable()
            program_loop(program, ctx, n, work)
            prof.disable()
            stats = pstats.Stats(prof)
            rows = [(tt / n * 1e3, ct / n * 1e3, f"{Path(f).name}:{line} {fn}")
                    for (f, line, fn), (_, _, tt, ct, _) in stats.stats.items() if f"{os.sep}runtime{os.sep}" in f]
            print(f"  runtime/*.py functions, own (cumulative) ms per step, the top 15 of {n} steps:")
            for own, cum, name in sorted(rows, reverse=True)[:15]:
                print(f"    {own:7.3f} ({cum:7.3f})  {name}")
    sys.stdout.flush()
    os._exit(0)  # after gloo (../shared TORCH-ON-CPU)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
