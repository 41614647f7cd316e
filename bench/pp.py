"""Pipeline parallelism: each rank's measured idle time against the bubble formulas, and our generated 1F1B program
against a hand-written torch.distributed.pipelining program on the same split, side by side.

    python bench/pp.py              # samples/gpt_pp.scale at bench sizes: idle fractions, then 3 rounds A/B, ~2.5 min
    python bench/pp.py --quick      # m = 4 only, fewer steps, one round: a sanity run, ~45 s
    python bench/pp.py --no-idle --rounds 5 --steps 20     # part 2 only, longer
    python bench/pp.py FILE.scale --keep-sizes --idle-micro-batches 4,8,16

2 ranks × 1 thread (OMP_NUM_THREADS=1), pp = 2, gloo. The .scale file is edited to bench sizes (`--hidden 256
--heads 8 --layers 4 --seq 128 --vocab 64 --batch 16`) and its head untied (`--keep-head` leaves it as written), so
that the two stages cost about the same: two equal blocks each, and an embedding and a head that are small next to
them (vocab 64 ≪ hidden 256). The plan's `schedule`, `virtual_stages` and `micro_batches` are set per run.

Part 1, idle fraction from timestamps (`--worker idle`, one torchrun run for every configuration). The worker
builds the generated program's stages (`Stage`, `STAGES`, `loss_fn` of each compiled build) through the runtime's
own `runtime.pipeline.Pipeline`, initialised as runtime/trainer.py does, and wraps each torch `PipelineStage`'s
`forward_one_chunk`, `backward_one_chunk` and `backward_weight_one_chunk`, and the schedule's loss computation
(counted with the forward), to record wall-clock start and end (`time.perf_counter`: CLOCK_MONOTONIC, one clock for
every process on the machine). It also times the schedule's waits on send/receive work. Each step starts after a
barrier. For every step and rank:

    window = last compute end of any rank − first compute start of any rank
    idle   = 1 − (sum of this rank's compute intervals) / window

reported as the median over the timed steps next to the formula: (p−1)/(m+p−1) for gpipe and 1f1b,
(p−1)/(v·m+p−1) for interleaved-1f1b (compiler/schedule.py: bubble_fraction), p = 2, v = 2 (4 blocks → 4 stages of
one block). The idle time is split by where it lies: before the rank's first computation (lead), between its
computations (gaps, with the part spent inside waits on p2p work; the rest is Python between chunks: scheduling,
p2p op set-up), after its last computation (tail). As a check of the formula itself, the project's static schedule
simulation (compiler/schedule.py: verify) of the same (schedule, p, m, v), with the measured median forward and
backward chunk times as costs and no communication, is compared with it. The chunks of the one-stage-per-rank runs
are also sorted into those that ran while the other rank was computing and those that ran alone (contention).

Part 2, ours against hand-written, alternating rounds A B A B …:
  A  the generated program for schedule 1f1b (`launch.sh --steps N --metrics F`);
  B  a hand-written torch.distributed.pipelining program (`--worker hand`, this script under torchrun): one
     nn.Module per stage written here with plain torch code (embedding + positions; pre-norm blocks: layernorm,
     causal SDPA attention, residual, layernorm, GELU MLP, residual; final norm + head), the same block ranges
     (the generated program's STAGES), the same weights (the single-device model of `compiler.model.build`,
     initialised by name, its leaves handed to the hand-written stages), PipelineStage + Schedule1F1B with the same
     micro-batches and scale_grads, the same data (runtime.data.Synthetic), AdamW with the same groups (decay on
     ≥2-D parameters) and LR schedule, global-norm clipping over both ranks, the loss all-reduced to rank 0, and
     the same timing points (data to `loss.item()`).
Median step time of each over every round (the first `--skip` steps of every run left out), their ratio, and the
step-1 losses of both against the single-process model.

Timings on a shared 2-core machine are only as good as the machine is quiet: the script reports how much CPU other
processes took while each part ran (/proc/stat busy time minus its own and its children's) and warns above 5%.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import compile_into, env, load_program, read_metrics, run_worker, set_plan, set_size  # noqa: E402

WHO = "bench/pp.py"

DEFAULT_SCALE = "samples/gpt_pp.scale"
SIZES = {"hidden": 256, "heads": 8, "layers": 4, "seq": 128, "vocab": 64}  # 3.2 M parameters, two equal stages
DEFAULT_BATCH = 16
IDLE_CONFIGS = (("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2))  # (schedule, virtual stages per rank)


# -- the .scale text ------------------------------------------------------------------------------------------------


def edited_text(args, schedule: str, m: int, v: int) -> str:
    path = Path(args.scale) if Path(args.scale).is_absolute() else ROOT / args.scale
    text = path.read_text()
    if not args.keep_sizes:
        for name in SIZES:
            text = set_size(text, name, getattr(args, name), WHO)
        text = set_size(text, "global_batch", args.batch, WHO)
    if not args.keep_head:
        text = re.sub(r"tied\s*=\s*true", "tied = false", text)
    text = set_plan(text, "schedule", f'"{schedule}"', WHO)
    text = set_plan(text, "virtual_stages", str(v), WHO)
    text = set_plan(text, "micro_batches", str(m), WHO)
    return text


# -- part 1: idle fraction from timestamps (runs under torchrun) ---------------------------------------------------


class Clock:
    """Wall-clock intervals of this rank's computations and p2p waits: (kind, stage, micro-batch, start, end)."""

    def __init__(self):
        self.events: list[tuple] = []

    def timed(self, fn, kind: str, stage: int):
        events = self.events

        def wrapper(mb, *a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(mb, *a, **kw)
            finally:
                events.append((kind, stage, mb, t0, time.perf_counter()))
        return wrapper

    def instrument(self, pipe) -> None:
        for st in pipe.stages:
            st.forward_one_chunk = self.timed(st.forward_one_chunk, "F", st.stage_index)
            st.backward_one_chunk = self.timed(st.backward_one_chunk, "B", st.stage_index)
            st.backward_weight_one_chunk = self.timed(st.backward_weight_one_chunk, "W", st.stage_index)
        sched, events = pipe.schedule, self.events
        inner = sched._maybe_compute_loss

        def compute_loss(stage, output, target_mbs, mb_index, *a, **kw):
            if not (stage.is_last and sched._loss_fn is not None):
                return inner(stage, output, target_mbs, mb_index, *a, **kw)
            t0 = time.perf_counter()
            try:
                return inner(stage, output, target_mbs, mb_index, *a, **kw)
            finally:
                events.append(("L", stage.stage_index, mb_index, t0, time.perf_counter()))
        sched._maybe_compute_loss = compute_loss

    def patch_waits(self) -> None:
        from torch.distributed.pipelining import schedules
        events, inner = self.events, schedules._wait_batch_p2p

        def wait(work):
            if not work:
                return inner(work)
            t0 = time.perf_counter()
            try:
                return inner(work)
            finally:
                events.append(("wait", -1, -1, t0, time.perf_counter()))
        schedules._wait_batch_p2p = wait


def worker_idle(args) -> None:
    from runtime import mesh
    builds = [Path(b) for b in args.builds.split(",")]
    first = load_program(builds[0], "scalec_bench_program_0")
    ctx = mesh.setup(first.CONFIG.parallel.axes, 600.0, first.CONFIG.parallel.groups)
    code = 0
    try:
        _idle_run(args, builds, ctx)
    except BaseException:
        code = 1
        import traceback
        traceback.print_exc()
    finally:
        mesh.shutdown(code)


def _idle_run(args, builds: list[Path], ctx) -> None:
    from dataclasses import replace

    import torch
    import torch.distributed as dist

    from runtime import data, optimizer
    from runtime import tensor_parallel as tp
    from runtime.layers import init_parameters
    from runtime.pipeline import Pipeline

    clock = Clock()
    clock.patch_waits()
    results = []
    pp_group = ctx.mesh["pp"].get_group()
    for i, build in enumerate(builds):
        prog = load_program(build, f"scalec_bench_program_{i}")
        cfg = replace(prog.CONFIG, steps=args.warmup + args.steps)
        shards = tp.Shards(cfg.parallel.tp_shards, cfg.parallel.tp_partial_grads)

        def prepare(module):
            module.to_empty(device=ctx.device)
            init_parameters(module, seed=cfg.seed, std=cfg.init.std, residual_out=cfg.init.residual_out,
                            layers=cfg.init.layers, shard_of=shards.of, local_slice=tp.local_slice)
            return module

        torch.manual_seed(cfg.seed)
        pipe = Pipeline(prog.Stage, cfg, ctx, prog.loss_fn, prepare)
        clock.instrument(pipe)
        opt = optimizer.adamw([p for _, p in pipe.all_named_parameters()], cfg.optim)
        source = data.Synthetic(cfg.data.vocab, cfg.data.seq_len, cfg.seed)
        steps = []
        for step in range(cfg.steps):
            tokens, targets = data.micro_batch(source, step, cfg.data.global_batch, 0, 1, 0, 1)
            dist.barrier()
            t_sync = time.perf_counter()  # right after the barrier: every rank's clock reads about the same here
            clock.events.clear()
            loss = pipe.step(tokens, targets)
            t_end = time.perf_counter()
            steps.append({"sync": t_sync, "end": t_end, "loss": float(loss), "events": list(clock.events)})
            tp.clip_grad_norm(pipe.named_parameters(), cfg.optim.grad_clip, shards, None, pp_group=pp_group,
                              scale=[p for _, p in pipe.all_named_parameters()])
            opt.step()
            opt.zero_grad(set_to_none=True)
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, {"rank": ctx.rank, "stages": pipe.ids, "steps": steps})
        results.append({"build": str(build), "schedule": cfg.parallel.schedule, "m": cfg.parallel.micro_batches,
                        "v": cfg.parallel.virtual_stages, "p": ctx.axis_size("pp"), "ranks": gathered})
        del pipe, opt
    if ctx.rank == 0:
        Path(args.out).write_text(json.dumps({"warmup": args.warmup, "results": results}))


def _intersect(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def contention(results: list[dict], warmup: int) -> dict:
    """Chunks of the one-stage-per-rank runs sorted by whether the other rank computed meanwhile (≥ 90% of the
    chunk's time) or not (≤ 10%): kind -> {"alone" | "together": [duration / median of its (run, rank, kind)]}.
    Two ranks on two cores still share caches, memory bandwidth and the host."""
    out: dict = {}
    for result in results:
        if result["v"] != 1:
            continue
        ranks = result["ranks"]
        groups: dict = {}
        for s in range(warmup, len(ranks[0]["steps"])):
            comp = {r["rank"]: [e for e in r["steps"][s]["events"] if e[0] in ("F", "B")] for r in ranks}
            for k, es in comp.items():
                others = [e for j, x in comp.items() if j != k for e in x]
                for e in es:
                    d = e[4] - e[3]
                    share = sum(_intersect(e[3], e[4], o[3], o[4]) for o in others) / d if d > 0 else 0.0
                    where = "alone" if share <= 0.1 else "together" if share >= 0.9 else None
                    groups.setdefault((k, e[0]), []).append((d, where))
        for (k, kind), xs in groups.items():
            mid = statistics.median(d for d, _ in xs)
            for d, where in xs:
                if where and mid > 0:
                    out.setdefault(kind, {}).setdefault(where, []).append(d / mid)
    return out


def analyse_idle(result: dict, warmup: int) -> list[dict]:
    """Per rank, medians over the timed steps of: idle fraction of the window, and where the idle time lies: before
    the rank's first computation (lead), between its computations (gaps; the part spent inside p2p waits
    separately), after its last (tail). Also chunk times, the window, the formula, and the project's static
    simulation of the same schedule with the measured chunk times."""
    from compiler import schedule as S
    p, m, v, name = result["p"], result["m"], result["v"], result["schedule"]
    ranks = sorted(result["ranks"], key=lambda r: r["rank"])
    n_steps = len(ranks[0]["steps"])
    keys = ("idle", "lead", "gaps", "gaps_wait", "tail")
    frac = {r["rank"]: {key: [] for key in keys} for r in ranks}
    windows, skews = [], []
    chunk = {r["rank"]: {"F": [], "B": []} for r in ranks}
    for s in range(warmup, n_steps):
        per_rank = {r["rank"]: r["steps"][s] for r in ranks}
        skews.append(max(x["sync"] for x in per_rank.values()) - min(x["sync"] for x in per_rank.values()))
        comp = {k: [e for e in x["events"] if e[0] != "wait"] for k, x in per_rank.items()}
        start = min(e[3] for es in comp.values() for e in es)
        end = max(e[4] for es in comp.values() for e in es)
        window = end - start
        windows.append(window)
        for k, es in comp.items():
            busy = sum(e[4] - e[3] for e in es)
            first, last = min(e[3] for e in es), max(e[4] for e in es)
            waits = [e for e in per_rank[k]["events"] if e[0] == "wait"]
            f = frac[k]
            f["idle"].append(1 - busy / window)
            f["lead"].append((first - start) / window)
            f["tail"].append((end - last) / window)
            f["gaps"].append((last - first - busy) / window)
            f["gaps_wait"].append(sum(_intersect(e[3], e[4], first, last) for e in waits) / window)
            # Chunk times: forward with the loss of the same micro-batch (the last stage computes it right after).
            loss_t = {(e[1], e[2]): e[4] - e[3] for e in es if e[0] == "L"}
            chunk[k]["F"] += [e[4] - e[3] + loss_t.get((e[1], e[2]), 0.0) for e in es if e[0] == "F"]
            chunk[k]["B"] += [e[4] - e[3] for e in es if e[0] in ("B", "W")]
    f_all = statistics.median(x for c in chunk.values() for x in c["F"])
    b_all = statistics.median(x for c in chunk.values() for x in c["B"])
    sim = S.verify(S.actions(name, p, m, v), S.Layout(p, v, m), cost={"F": f_all, "B": b_all})
    formula = S.bubble_fraction(p, m, v)
    rows = []
    for r in ranks:
        k = r["rank"]
        row = {"schedule": name, "m": m, "v": v, "rank": k, "stages": r["stages"], "formula": formula,
               "sim": sim.idle_fraction(k), "F": statistics.median(chunk[k]["F"]),
               "B": statistics.median(chunk[k]["B"]), "window": statistics.median(windows), "skew": max(skews),
               "steps": len(windows), "idle_min": min(frac[k]["idle"]), "idle_max": max(frac[k]["idle"])}
        row.update({key: statistics.median(frac[k][key]) for key in keys})
        rows.append(row)
    return rows


# -- part 2 B: the hand-written torch.distributed.pipelining program (runs under torchrun) --------------------------


def _hand_modules(full, heads: int, stage: int, stages: tuple, tied: bool):
    """Stage `stage` of the model written by hand, holding the single-device model's leaves (same weights)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    want = {"norm_1", "attn_q", "attn_k", "attn_v", "attn_o", "norm_2", "mlp_up", "mlp_down"}

    class Block(nn.Module):
        """Pre-norm GPT block: x + attn(ln(x)), then x + mlp(ln(x)); causal attention, GELU MLP."""

        def __init__(self, src: nn.Module):
            super().__init__()
            names = {n for n, _ in src.named_children()}
            if names != want:
                raise SystemExit(f"bench/pp.py: the hand-written block is a pre-norm attention + GELU-MLP block "
                                 f"with leaves {sorted(want)}; this model's block has {sorted(names)}")
            for n in sorted(want):
                setattr(self, n, getattr(src, n))
            self.heads = heads

        def forward(self, x):
            b, s, h = x.shape
            y = self.norm_1(x)
            q = self.attn_q(y).view(b, s, self.heads, h // self.heads).transpose(1, 2)
            k = self.attn_k(y).view(b, s, self.heads, h // self.heads).transpose(1, 2)
            v = self.attn_v(y).view(b, s, self.heads, h // self.heads).transpose(1, 2)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.attn_o(a.transpose(1, 2).reshape(b, s, h))
            return x + self.mlp_down(F.gelu(self.mlp_up(self.norm_2(x))))

    class HandStage(nn.Module):
        def __init__(self):
            super().__init__()
            lo, hi = stages[stage]
            self.is_first, self.is_last = stage == 0, stage == len(stages) - 1
            if self.is_first:
                self.embed, self.pos = full.embed, full.pos
            if self.is_last:
                self.norm = full.norm
                if tied:
                    self.embed = full.embed
                else:
                    self.lm_head = full.lm_head
            self.blocks = nn.ModuleDict({str(i): Block(full.blocks[i]) for i in range(lo, hi)})

        def forward(self, x):
            if self.is_first:
                x = self.embed(x) + self.pos(torch.arange(x.shape[1], device=x.device))
            for block in self.blocks.values():
                x = block(x)
            if self.is_last:
                x = self.norm(x)
                x = F.linear(x, self.embed.weight) if tied else self.lm_head(x)
            return x

    return HandStage()


def worker_hand(args) -> None:
    run_worker(_hand_run, args)


def _hand_run(args) -> None:
    from dataclasses import replace

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from compiler import model as M
    from compiler.check import check_text
    from runtime import data, optimizer
    from runtime.layers import init_parameters

    build = Path(args.build)
    prog = load_program(build)
    cfg = replace(prog.CONFIG, steps=args.steps)
    spec = check_text((build / "model.scale").read_text(), "model.scale")
    rank, world = dist.get_rank(), dist.get_world_size()
    if len(prog.STAGES) != world or cfg.parallel.schedule != "1f1b":
        raise SystemExit(f"bench/pp.py: the hand-written program runs 1f1b with one stage per rank; the build has "
                         f"{len(prog.STAGES)} stages on {world} ranks, schedule {cfg.parallel.schedule}")
    heads = json.loads((build / "plan.json").read_text())["values"]["heads"]

    torch.manual_seed(cfg.seed)
    full = M.build(spec, device="cpu")
    init_parameters(full, seed=cfg.seed, std=cfg.init.std, residual_out=cfg.init.residual_out, layers=cfg.init.layers)
    module = _hand_modules(full, heads, rank, prog.STAGES, cfg.parallel.tied_embedding)
    del full
    stage = PipelineStage(module, rank, world, torch.device("cpu"))

    def loss_fn(logits, targets):
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    schedule = Schedule1F1B(stage, n_microbatches=cfg.parallel.micro_batches, loss_fn=loss_fn, scale_grads=True)
    params = list(module.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.optim.weight_decay},
                             {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
                            lr=cfg.optim.lr, betas=cfg.optim.betas, eps=cfg.optim.eps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, optimizer.lr_lambda(cfg))
    # A tied head: the first and last stage each hold the embedding; their gradients are summed every step.
    tie = dist.new_group([0, world - 1]) if cfg.parallel.tied_embedding else None
    source = data.Synthetic(cfg.data.vocab, cfg.data.seq_len, cfg.seed)
    metrics = open(args.metrics, "w") if rank == 0 else None
    for step in range(cfg.steps):
        t0 = time.perf_counter()
        tokens, targets = data.micro_batch(source, step, cfg.data.global_batch, 0, 1, 0, 1)
        losses: list = []
        if stage.is_first:
            schedule.step(tokens)
        elif stage.is_last:
            schedule.step(target=targets, losses=losses)
        else:
            schedule.step()
        if tie is not None and (stage.is_first or stage.is_last):
            dist.all_reduce(module.embed.weight.grad, group=tie)
        # Global gradient norm over both ranks (the tied copy counted once, on the first stage), then clip.
        sq = torch.zeros((), dtype=torch.float64)
        for name, p in module.named_parameters():
            if p.grad is not None and not (tie is not None and stage.is_last and name == "embed.weight"):
                sq += p.grad.double().pow(2).sum()
        dist.all_reduce(sq)
        norm = sq.sqrt()
        coef = torch.clamp(cfg.optim.grad_clip / (norm + 1e-6), max=1.0)
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef.to(p.grad.dtype))
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        total = torch.stack([l.detach() for l in losses]).mean() if losses else torch.zeros(())
        dist.all_reduce(total)
        loss_value = total.item()
        dt = time.perf_counter() - t0
        if metrics:
            metrics.write(json.dumps({"step": step + 1, "loss": loss_value, "grad_norm": float(norm),
                                      "lr": sched.get_last_lr()[0], "step_time": dt}) + "\n")
            metrics.flush()
    if metrics:
        metrics.close()


# -- the driver -----------------------------------------------------------------------------------------------------


def _cpu_snapshot() -> tuple[float, float, float]:
    """(wall, CPU seconds the whole machine was busy, CPU seconds of this process and its waited-for children):
    the difference of two snapshots tells how much CPU other processes took meanwhile (Linux /proc/stat)."""
    import resource
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        busy = (v[0] + v[1] + v[2] + v[5] + v[6]) / os.sysconf("SC_CLK_TCK")  # user nice system irq softirq
    except (OSError, ValueError, IndexError):
        busy = float("nan")
    mine = sum(getattr(resource.getrusage(w), a) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for a in ("ru_utime", "ru_stime"))
    return time.perf_counter(), busy, mine


OTHER: dict = {}  # part -> [wall seconds, CPU seconds taken by other processes]


def _run(cmd: list[str], what: str, verbose: bool, part: str = "") -> float:
    snap = _cpu_snapshot()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if verbose or proc.returncode:
        print(proc.stdout)
    if proc.returncode:
        raise SystemExit(f"bench/pp.py: {what} failed (exit {proc.returncode}): {' '.join(cmd)}")
    after = _cpu_snapshot()
    acc = OTHER.setdefault(part, [0.0, 0.0])
    acc[0] += after[0] - snap[0]
    acc[1] += max(0.0, (after[1] - snap[1]) - (after[2] - snap[2]))
    return time.perf_counter() - t0


def _torchrun(*worker_args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node", "2",
            str(Path(__file__).resolve()), *worker_args]


def _reference_loss(build: Path) -> float:
    """Step-1 loss of the single-device model in this process (the value both programs must reproduce)."""
    import torch
    from compiler import model as M
    from compiler.check import check_text
    from runtime import data
    from runtime.layers import init_parameters
    cfg = load_program(build, "scalec_bench_reference").CONFIG
    spec = check_text((build / "model.scale").read_text(), "model.scale")
    torch.manual_seed(cfg.seed)
    model = M.build(spec, device="cpu")
    init_parameters(model, seed=cfg.seed, std=cfg.init.std, residual_out=cfg.init.residual_out, layers=cfg.init.layers)
    tokens, targets = data.micro_batch(data.Synthetic(cfg.data.vocab, cfg.data.seq_len, cfg.seed), 0,
                                       cfg.data.global_batch, 0, 1, 0, 1)
    with torch.no_grad():
        return float(model(tokens, targets))


def _table(header: list[str], rows: list[list[str]], left: int = 1) -> None:
    """A markdown table: the first `left` columns left-aligned, the others right-aligned."""
    w = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = lambda cells: "| " + " | ".join(f"{c:<{w[i]}}" if i < left else f"{c:>{w[i]}}"  # noqa: E731
                                          for i, c in enumerate(cells)) + " |"
    print(fmt(header))
    print("|" + "|".join("-" * (w[i] + 2) if i < left else "-" * (w[i] + 1) + ":" for i in range(len(w))) + "|")
    for r in rows:
        print(fmt(r))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scale", nargs="?", default=DEFAULT_SCALE, help=f"the .scale file (default {DEFAULT_SCALE})")
    for name, value in SIZES.items():
        p.add_argument(f"--{name}", type=int, default=value, help=f"model size `{name}` (default {value})")
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH, help=f"global_batch (default {DEFAULT_BATCH})")
    p.add_argument("--keep-sizes", action="store_true", help="keep the file's own sizes and global batch")
    p.add_argument("--keep-head", action="store_true", help="keep the head as written (default: untied)")
    p.add_argument("--idle-micro-batches", default="4,8", help="micro-batch counts for part 1 (default 4,8)")
    p.add_argument("--idle-steps", type=int, default=6, help="timed steps per configuration in part 1 (default 6)")
    p.add_argument("--idle-warmup", type=int, default=2, help="untimed steps first in part 1 (default 2)")
    p.add_argument("--micro-batches", type=int, default=4, help="micro-batches for part 2 (default 4)")
    p.add_argument("--steps", type=int, default=15, help="optimizer steps per run in part 2 (default 15)")
    p.add_argument("--skip", type=int, default=3, help="warm-up steps left out of each run's timings (default 3)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of A then B in part 2 (default 3)")
    p.add_argument("--no-idle", action="store_true", help="skip part 1")
    p.add_argument("--no-compare", action="store_true", help="skip part 2")
    p.add_argument("--quick", action="store_true",
                   help="part 1 at m = 4 with 2 timed steps; part 2 one round of 6 steps")
    p.add_argument("--keep", metavar="DIR", help="write the builds, metrics and timestamps here (default: a temp dir)")
    p.add_argument("--verbose", action="store_true", help="show each run's output")
    p.add_argument("--worker", choices=["idle", "hand"], help=argparse.SUPPRESS)
    p.add_argument("--build", help=argparse.SUPPRESS)
    p.add_argument("--builds", help=argparse.SUPPRESS)
    p.add_argument("--metrics", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker == "idle":
        worker_idle(args)
        return
    if args.worker == "hand":
        worker_hand(args)
        return
    if args.quick:
        args.idle_micro_batches, args.idle_steps, args.idle_warmup = "4", 2, 1
        args.steps, args.rounds = 6, 1
    if args.steps <= args.skip:
        raise SystemExit(f"bench/pp.py: --steps {args.steps} leaves no step after the {args.skip} skipped")
    idle_ms = [int(x) for x in args.idle_micro_batches.split(",") if x.strip()]

    with tempfile.TemporaryDirectory(prefix="scalec-pp-") as tmp:
        work = Path(args.keep).resolve() if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        rel = Path(args.scale).as_posix()
        t_compile = time.perf_counter()
        builds: dict = {}

        def build_for(schedule: str, m: int, v: int) -> Path:
            key = (schedule, m, v)
            if key not in builds:
                out = work / f"build_{schedule}_m{m}_v{v}"
                compile_into(edited_text(args, schedule, m, v), rel, out, "pp", WHO)
                builds[key] = out
            return builds[key]

        ab_build = build_for("1f1b", args.micro_batches, 1)
        idle_builds = [build_for(s, m, v) for s, v in IDLE_CONFIGS for m in idle_ms] if not args.no_idle else []
        plan = json.loads((ab_build / "plan.json").read_text())
        vals = plan["values"]
        prog = load_program(ab_build, "scalec_bench_header")
        print(f"{plan['name']} from {rel}: {plan['cost']['parameters']:,} parameters, hidden {vals['hidden']}, "
              f"heads {vals['heads']}, layers {vals['layers']}, seq {vals['seq']}, vocab {vals['vocab']} "
              f"({'tied' if prog.CONFIG.parallel.tied_embedding else 'untied'} head), "
              f"global batch {vals['global_batch']}; "
              f"pp = 2, blocks per stage {[b - a for a, b in prog.STAGES]} (STAGES {prog.STAGES}); "
              f"{len(builds)} builds compiled in {time.perf_counter() - t_compile:.1f} s")
        print("2 ranks × 1 thread (OMP_NUM_THREADS=1), gloo", flush=True)
        load_before = os.getloadavg()[0]

        # -- part 1 -------------------------------------------------------------------------------------------------
        idle_rows = []
        if idle_builds:
            out = work / "idle.json"
            wall = _run(_torchrun("--worker", "idle", "--builds", ",".join(map(str, idle_builds)), "--steps",
                                  str(args.idle_steps), "--warmup", str(args.idle_warmup), "--out", str(out)),
                        "the idle-fraction run", args.verbose, "part 1")
            got = json.loads(out.read_text())
            for result in got["results"]:
                idle_rows += analyse_idle(result, got["warmup"])
            shared = contention(got["results"], got["warmup"])
            print(f"part 1: {len(idle_builds)} configurations × ({args.idle_warmup} + {args.idle_steps}) steps in "
                  f"one torchrun run, {wall:.1f} s", flush=True)

        # -- part 2 -------------------------------------------------------------------------------------------------
        times = {"ours": [], "hand": []}
        runs = {"ours": [], "hand": []}
        if not args.no_compare:
            print(f"part 2: {args.rounds} round(s) A (ours, 1f1b) then B (hand-written Schedule1F1B), "
                  f"m = {args.micro_batches}, {args.steps} steps per run, first {args.skip} of each left out",
                  flush=True)
            for r in range(args.rounds):
                a_metrics = work / f"ours_{r}.jsonl"
                wall = _run(["bash", str(ab_build / "launch.sh"), "--steps", str(args.steps), "--metrics",
                             str(a_metrics)], "our program", args.verbose, "part 2 A")
                runs["ours"].append(read_metrics(a_metrics))
                b_metrics = work / f"hand_{r}.jsonl"
                wall_b = _run(_torchrun("--worker", "hand", "--build", str(ab_build), "--steps", str(args.steps),
                                        "--metrics", str(b_metrics)), "the hand-written program", args.verbose,
                              "part 2 B")
                runs["hand"].append(read_metrics(b_metrics))
                for k in times:
                    times[k] += [x["step_time"] for x in runs[k][-1][args.skip:]]
                med = {k: statistics.median(x["step_time"] for x in runs[k][-1][args.skip:]) for k in runs}
                print(f"  round {r + 1}: ours {med['ours'] * 1e3:6.1f} ms/step ({wall:4.1f} s run), "
                      f"hand-written {med['hand'] * 1e3:6.1f} ms/step ({wall_b:4.1f} s run)", flush=True)
        load_after = os.getloadavg()[0]

        # -- report -------------------------------------------------------------------------------------------------
        if idle_rows:
            print()
            print("Idle fraction per rank from timestamps (median over the timed steps; [min, max] over them) "
                  "against the bubble formula:")
            print()
            header = ["schedule", "m", "v", "rank (stages)", "measured idle [min, max]", "formula", "lead",
                      "gaps (in p2p waits)", "tail", "F ms", "B ms", "window ms"]
            rows = [[x["schedule"], str(x["m"]), str(x["v"]), f"{x['rank']} {tuple(x['stages'])}",
                     f"{x['idle']:.3f} [{x['idle_min']:.3f}, {x['idle_max']:.3f}]", f"{x['formula']:.3f}",
                     f"{x['lead']:.3f}", f"{x['gaps']:.3f} ({x['gaps_wait']:.3f})", f"{x['tail']:.3f}",
                     f"{x['F'] * 1e3:.1f}", f"{x['B'] * 1e3:.1f}", f"{x['window'] * 1e3:.0f}"] for x in idle_rows]
            _table(header, rows, left=1)
            skew = max(x["skew"] for x in idle_rows)
            sim_diff = max(abs(x["sim"] - x["formula"]) for x in idle_rows)
            print()
            print("formula: (p-1)/(m+p-1) for gpipe and 1f1b, (p-1)/(v·m+p-1) for interleaved-1f1b, p = 2 "
                  "(compiler/schedule.py\nbubble_fraction). window: first compute start to last compute end of any "
                  "rank in one step. idle = 1 − busy / window,\nsplit into lead (before the rank's first computation), "
                  "gaps (between its computations; in brackets the part\ninside waits on send/receive work, the rest "
                  "is Python and p2p set-up between chunks) and tail (after its last\ncomputation); each column is a "
                  "median on its own, so they add up to the idle only roughly. F: forward chunk (the\nloss included on "
                  "the last stage), B: backward chunk, medians on that rank (v = 2: one block per chunk).")
            agree = ("gives the formula on every rank" if sim_diff < 1e-6 else
                     "differs from the formula")
            print(f"compiler/schedule.py's static simulation (verify) of the same schedules, with the measured median "
                  f"F and B as costs and\nno communication, {agree} (largest difference {sim_diff:.1e}). Ranks left "
                  f"each step's barrier at most\n{skew * 1e3:.2f} ms apart (one monotonic clock for every process on "
                  "the machine).")

            def ratio(kind: str) -> str:
                got = shared.get(kind, {})
                if not got.get("alone") or not got.get("together"):
                    return "-"
                return (f"{statistics.median(got['together']) / statistics.median(got['alone']):.2f}× "
                        f"(n = {len(got['together'])} together, {len(got['alone'])} alone)")
            print(f"Contention (v = 1 runs): a chunk that ran while the other rank computed took, in the median, "
                  f"forward {ratio('F')},\nbackward {ratio('B')} the time of one that ran alone (each chunk "
                  "relative to the median of its run, rank and kind).")
        if times["ours"]:
            ref = _reference_loss(ab_build)
            med_ours, med_hand = statistics.median(times["ours"]), statistics.median(times["hand"])
            loss_a, loss_b = runs["ours"][0][0]["loss"], runs["hand"][0][0]["loss"]
            n = min(len(runs["ours"][0]), len(runs["hand"][0]))
            drift = max(abs(runs["ours"][0][i]["loss"] - runs["hand"][0][i]["loss"]) for i in range(n))

            def per_round(k: str) -> str:
                return " ".join(f"{statistics.median(x['step_time'] for x in r[args.skip:]) * 1e3:.0f}"
                                for r in runs[k])
            print()
            print(f"Ours against hand-written torch.distributed.pipelining, 1f1b, m = {args.micro_batches}, "
                  "same split, weights, data, optimizer:")
            print()
            rows = [
                ["median step time", f"{med_ours * 1e3:.1f} ms", f"{med_hand * 1e3:.1f} ms"],
                ["ratio ours / hand-written (lower: ours faster)", f"{med_ours / med_hand:.3f}", "1"],
                ["steps timed (all rounds)", str(len(times["ours"])), str(len(times["hand"]))],
                ["per-round medians, ms", per_round("ours"), per_round("hand")],
                [f"loss at step 1 (single process {ref:.6f})", f"{loss_a:.6f}", f"{loss_b:.6f}"],
                [f"max abs loss difference over {n} steps", f"{drift:.1e}", ""],
            ]
            _table(["", "ours (scalec)", "hand-written Schedule1F1B"], rows, left=1)
        print()
        print(f"Load average (1 min) {load_before:.1f} before, {load_after:.1f} after, on {os.cpu_count()} CPUs: "
              "other work on the machine shows up in every number.")
        ncpu = os.cpu_count() or 1
        print("CPU taken by other processes while the runs ran (/proc/stat busy time minus this script's and its "
              "children's): " + "; ".join(f"{k} {o:.1f} CPU-s in {w:.0f} s ({o / (w * ncpu):.0%} of the machine)"
                                          for k, (w, o) in OTHER.items()))
        busy = [k for k, (w, o) in OTHER.items() if o > 0.05 * w * ncpu]
        if busy:
            print(f"warning: other processes took more than 5% of the machine during {', '.join(busy)}: those "
                  "timings measure contention too; rerun on a quiet machine")
        if args.keep:
            print(f"builds, metrics and timestamps in {work}")


if __name__ == "__main__":
    main()
