"""Our generated tensor-parallel program against torch's own DTensor plan, same model, same mesh, side by side.

    python bench/tp.py                        # samples/gpt_tp.scale at bench sizes, 3 rounds A/B, ~2 minutes
    python bench/tp.py --sequence-parallel    # the same with `sequence_parallel = true`
    python bench/tp.py --quick                # one round of 6 steps each: a sanity run
    python bench/tp.py FILE.scale --keep-sizes --steps 30 --rounds 5

2 ranks × 1 thread (OMP_NUM_THREADS=1), tp = 2, gloo. The script compiles the .scale file (after editing its
sizes, `--hidden/--heads/--layers/--seq/--vocab/--batch`, so that a step is long enough to time), then runs, in
alternation, round after round:

  A  the generated program (`launch.sh --steps N --metrics F --count-bytes F`);
  B  the single-device model of the same spec (`compiler.model.build`), initialised by the same names and seed,
     parallelised with `torch.distributed.tensor.parallel.parallelize_module`: Colwise/Rowwise linears,
     a vocabulary-parallel (Rowwise) embedding tied to the head, `loss_parallel` cross-entropy, and with
     `--sequence-parallel` SequenceParallel norms, sequence-sharded residual stream and positions. The training
     loop is the generated program's (same data, AdamW groups, schedule, clipping arithmetic, timing points).
     This script runs B itself under torchrun (`--worker dtensor`).

It prints the median step time of each (the first `--skip` steps of every run left out), their ratio, the bytes
each moved in its collectives during step 1 (ours: the runtime's `--count-bytes`; DTensor: a CommDebugMode that
also sums tensor sizes, same convention: all-reduce = the tensor, all-gather = the gathered output,
reduce-scatter = the full input), the compiler's predicted ledger, and the losses of both against a single-process
reference.

Where the two plans differ (both are Megatron's, and both reproduce the single-process loss):
  - our blocks have flat leaves (no `attention` module for torchtitan's PrepareModuleInput), so B puts a
    PrepareModuleOutput on each norm: q, k and v then share one Replicate input, gathered (SP) and its gradient
    summed once per block, as in our program, rather than once per linear;
  - with sequence parallelism DTensor leaves the gradients of replicated parameters fed by sharded activations
    Partial; B sums them after backward (our sync_partial_grads). DTensor adds a row-parallel linear's bias
    before the reduce-scatter, so its bias gradients need no all-reduce (ours: 2 small ones per block);
  - clipping is our arithmetic on DTensor local shards (torch's clip_grad_norm_ does not take a mix of DTensor
    and plain parameters); AdamW is torch's on DTensor parameters (for-each off on CPU, as in ours).
"""
from __future__ import annotations

import argparse
import collections
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

from bench.common import compile_into, env, load_program, read_metrics, run_worker, set_size  # noqa: E402

WHO = "bench/tp.py"

DEFAULT_SCALE = "samples/gpt_tp.scale"
SIZES = {"hidden": 256, "heads": 8, "layers": 4, "seq": 128, "vocab": 512}  # 3.3 M parameters: ~250 ms a step here
DEFAULT_BATCH = 8


# -- the .scale text ------------------------------------------------------------------------------------------------


def _sequence_parallel(text: str) -> str:
    if re.search(r"sequence_parallel\s*=\s*\w+", text):
        return re.sub(r"sequence_parallel\s*=\s*\w+", "sequence_parallel = true", text)
    if re.search(r"^plan\s*\{", text, re.M):
        return re.sub(r"^(plan\s*\{)", r"\1\n  sequence_parallel = true", text, count=1, flags=re.M)
    raise SystemExit("bench/tp.py: the .scale file has no plan section to turn sequence parallelism on in")


def edited_text(args) -> str:
    text = (ROOT / args.scale).read_text() if not Path(args.scale).is_absolute() else Path(args.scale).read_text()
    if not args.keep_sizes:
        for name in SIZES:
            text = set_size(text, name, getattr(args, name), WHO)
        text = set_size(text, "global_batch", args.batch, WHO)
    if args.sequence_parallel:
        text = _sequence_parallel(text)
    return text


# -- B: the DTensor baseline (runs under torchrun) ------------------------------------------------------------------


def _byte_counting_comm_mode():
    """CommDebugMode that also adds up the bytes of every collective it sees, by op and by forward/backward."""
    import torch
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.debug._comm_mode import c10d_collective_ops

    def nbytes(x):
        if isinstance(x, torch.Tensor):
            return x.numel() * x.element_size()
        if isinstance(x, (list, tuple)):
            return sum(nbytes(y) for y in x)
        return 0

    class CommBytes(CommDebugMode):
        def __init__(self):
            super().__init__()
            self.bytes = collections.Counter()
            self.calls = collections.Counter()

        def __enter__(self):
            self.bytes.clear()
            self.calls.clear()
            return super().__enter__()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            if out is NotImplemented or isinstance(func, torch._ops.HigherOrderOperator):
                return out
            name = func._overloadpacket.__name__
            if name in ("all_reduce", "all_reduce_", "allreduce_"):
                n = nbytes(args[0])
            elif name in ("all_gather_into_tensor", "_allgather_base_"):
                n = nbytes(out) if name == "all_gather_into_tensor" else nbytes(args[0])
            elif name in ("reduce_scatter_tensor",):
                n = nbytes(args[0])
            elif name in ("_reduce_scatter_base_",):
                n = nbytes(args[1])
            elif func._overloadpacket in self.comm_registry or func._overloadpacket in c10d_collective_ops:
                n = max(nbytes(args), nbytes(out))  # any other collective: the largest tensor it touches
            else:
                return out
            # named as our runtime's counter names them
            name = {"allreduce": "all_reduce", "allgather_base": "all_gather", "all_gather_into_tensor": "all_gather",
                    "reduce_scatter_base": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter"}.get(name.strip("_"), name.strip("_"))
            key = (name, "backward" if self.advanced_module_tracker.is_bw else "forward")
            self.bytes[key] += n
            self.calls[key] += 1
            return out

    return CommBytes()


def _dtensor_plan(model, sequence_parallel: bool):
    """The Megatron plan in torch's own parallel styles (torchtitan's Llama plan, for this model's flat leaves)."""
    from torch import nn
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleOutput, RowwiseParallel,
                                                   SequenceParallel)
    seq = Shard(1) if sequence_parallel else Replicate()
    # A norm's output feeds every column-parallel linear after it (q, k, v): handing them one Replicate DTensor
    # makes DTensor gather it (SP) once, and sum its partial gradient once, instead of once per linear. torchtitan
    # gets this with PrepareModuleInput on its `attention` module; our blocks have flat leaves, so the norm does it.
    to_linears = PrepareModuleOutput(output_layouts=seq, desired_output_layouts=Replicate(), use_local_output=False)
    first, second = {}, {}
    names = dict(model.named_modules())
    for name, mod in names.items():
        leaf = name.rsplit(".", 1)[-1]
        if name == "embed":
            # Vocabulary-parallel embedding (rows sharded); its weight is also the tied head: F.linear(x, W) of a
            # Replicate x and this Shard(0) weight gives vocabulary-sharded logits for loss_parallel.
            first[name] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
        elif name == "pos" and sequence_parallel:
            # Each rank adds the positions of its sequence chunk; the gradient is gathered back whole.
            first[name] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(0))
        elif isinstance(mod, (nn.LayerNorm, nn.RMSNorm)):
            if sequence_parallel:
                first[name] = SequenceParallel()
            second[name] = to_linears
        elif leaf.startswith(("attn_q", "attn_k", "attn_v", "mlp_up", "mlp_gate")):
            first[name] = ColwiseParallel()
        elif leaf.startswith(("attn_o", "mlp_down")):
            first[name] = RowwiseParallel(output_layouts=seq)
        elif leaf == "lm_head":
            raise SystemExit("bench/tp.py: an untied lm_head is not planned for the DTensor baseline")
    return first, second


def _clip(params, max_norm: float, group):
    """The generated program's clipping (runtime.tensor_parallel.clip_grad_norm) on DTensor gradients: local
    squares of sharded gradients summed over tp in one all-reduce, replicated ones counted once."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Shard
    sharded = torch.zeros((), dtype=torch.float64)
    replicated = torch.zeros((), dtype=torch.float64)
    grads = []
    for p in params:
        if p.grad is None:
            continue
        g = p.grad
        if isinstance(g, DTensor):
            if any(pl.is_partial() for pl in g.placements):
                raise AssertionError(f"partial gradient {g.placements}")
            is_sharded = any(isinstance(pl, Shard) for pl in g.placements)
            g = g.to_local()
        else:
            is_sharded = False
        sq = g.double().pow(2).sum()
        if is_sharded:
            sharded += sq
        else:
            replicated += sq
        grads.append(g)
    dist.all_reduce(sharded, group=group)
    norm = (sharded + replicated).sqrt()
    if max_norm > 0:
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef.to(g.dtype))
    return norm.float()


def worker_dtensor(args) -> None:
    import warnings
    warnings.filterwarnings("ignore", message="Full backward hook is firing")  # CommDebugMode's module tracker
    run_worker(_dtensor_run, args)


def _dtensor_run(args) -> None:
    import contextlib
    from dataclasses import replace

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.parallel import loss_parallel, parallelize_module

    from compiler import model as M
    from compiler.check import check_text
    from runtime import data, optimizer
    from runtime.layers import init_parameters

    build = Path(args.build)
    cfg = replace(load_program(build).CONFIG, steps=args.steps)
    spec = check_text((build / "model.scale").read_text(), "model.scale")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))

    torch.manual_seed(cfg.seed)
    model = M.build(spec, device="cpu")
    init_parameters(model, seed=cfg.seed, std=cfg.init.std, residual_out=cfg.init.residual_out, layers=cfg.init.layers)
    first, second = _dtensor_plan(model, spec.plan.sequence_parallel)
    parallelize_module(model, mesh, first)
    parallelize_module(model, mesh, second)
    opt = optimizer.adamw(list(model.parameters()), cfg.optim)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, optimizer.lr_lambda(cfg))
    source = data.Synthetic(cfg.data.vocab, cfg.data.seq_len, cfg.seed)
    group = mesh.get_group()
    tokens_per_step = cfg.data.global_batch * cfg.data.seq_len
    metrics = open(args.metrics, "w") if rank == 0 else None
    counter = _byte_counting_comm_mode()
    for step in range(cfg.steps):
        t0 = time.perf_counter()
        counting = counter if step == 0 else contextlib.nullcontext()
        total = torch.zeros(())
        with counting:
            tokens, targets = data.micro_batch(source, step, cfg.data.global_batch, 0, 1, 0, 1)
            with loss_parallel():
                loss = model(tokens, targets)
                loss.backward()
            total += (loss.to_local() if isinstance(loss, DTensor) else loss).detach()
            # With sequence parallelism the gradients of replicated parameters fed by sequence-sharded activations
            # (norms, row-parallel biases) are left Partial: sum them, as our program's sync_partial_grads does.
            for prm in model.parameters():
                g = prm.grad
                if isinstance(g, DTensor) and any(pl.is_partial() for pl in g.placements):
                    prm.grad = g.redistribute(placements=[Replicate()])
        if step == 0:
            fwd_bwd = dict(counter.bytes), dict(counter.calls)
            with counter:  # what clipping and the optimizer move (ours: one float64 scalar for the norm)
                norm = _clip(model.parameters(), cfg.optim.grad_clip, group)
                opt.step()
            rest = dict(counter.bytes), dict(counter.calls)
        else:
            norm = _clip(model.parameters(), cfg.optim.grad_clip, group)
            opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        loss_value = total.item()
        dt = time.perf_counter() - t0
        if metrics:
            metrics.write(json.dumps({"step": step + 1, "loss": loss_value, "grad_norm": float(norm),
                                      "lr": sched.get_last_lr()[0], "step_time": dt,
                                      "tokens_per_s": tokens_per_step / dt}) + "\n")
            metrics.flush()
    if rank == 0:
        def flat(pair):
            b, c = pair
            return {f"{op}/{phase}": {"bytes": b[(op, phase)], "calls": c[(op, phase)]} for op, phase in sorted(b)}
        with open(args.count_bytes, "w") as f:
            json.dump({"forward_backward": flat(fwd_bwd), "clip_and_optimizer": flat(rest)}, f, indent=2)
        metrics.close()


# -- the driver -----------------------------------------------------------------------------------------------------


def _run(cmd: list[str], what: str, verbose: bool) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if verbose or proc.returncode:
        print(proc.stdout)
    if proc.returncode:
        raise SystemExit(f"bench/tp.py: {what} failed (exit {proc.returncode}): {' '.join(cmd)}")
    return time.perf_counter() - t0


def _reference_loss(compiled, cfg) -> float:
    """Step-1 loss of the single-device model in this process (the value both plans must reproduce)."""
    import torch
    from compiler import model as M
    from runtime import data
    from runtime.layers import init_parameters
    torch.manual_seed(cfg.seed)
    model = M.build(compiled.spec, device="cpu")
    init_parameters(model, seed=cfg.seed, std=cfg.init.std, residual_out=cfg.init.residual_out, layers=cfg.init.layers)
    tokens, targets = data.micro_batch(data.Synthetic(cfg.data.vocab, cfg.data.seq_len, cfg.seed), 0,
                                       cfg.data.global_batch, 0, 1, 0, 1)
    with torch.no_grad():
        return float(model(tokens, targets))


def _ledger(plan: dict) -> int:
    """Bytes per step over tp that the compiler predicts."""
    return sum(int(e["bytes_per_step"]) for e in plan["ledger"] if e["axis"] == "tp")


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scale", nargs="?", default=DEFAULT_SCALE, help=f"the .scale file (default {DEFAULT_SCALE})")
    p.add_argument("--sequence-parallel", action="store_true", help="set `sequence_parallel = true` in the plan")
    for name, value in SIZES.items():
        p.add_argument(f"--{name}", type=int, default=value, help=f"model size `{name}` (default {value})")
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH, help=f"global_batch (default {DEFAULT_BATCH})")
    p.add_argument("--keep-sizes", action="store_true", help="keep the file's own sizes and global batch")
    p.add_argument("--steps", type=int, default=18, help="optimizer steps per run (default 18)")
    p.add_argument("--skip", type=int, default=3, help="warm-up steps left out of each run's timings (default 3)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of A then B (default 3)")
    p.add_argument("--quick", action="store_true", help="one round of 6 steps each")
    p.add_argument("--keep", metavar="DIR", help="write the build, metrics and byte counts here (default: a temp dir)")
    p.add_argument("--verbose", action="store_true", help="show each run's output")
    p.add_argument("--worker", choices=["dtensor"], help=argparse.SUPPRESS)
    p.add_argument("--build", help=argparse.SUPPRESS)
    p.add_argument("--metrics", help=argparse.SUPPRESS)
    p.add_argument("--count-bytes", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker == "dtensor":
        worker_dtensor(args)
        return
    if args.quick:
        args.steps, args.rounds = 6, 1
    if args.steps <= args.skip:
        raise SystemExit(f"bench/tp.py: --steps {args.steps} leaves no step after the {args.skip} skipped")

    with tempfile.TemporaryDirectory(prefix="scalec-tp-") as tmp:
        work = Path(args.keep).resolve() if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        build = work / "build"
        text = edited_text(args)
        rel = Path(args.scale).as_posix()
        compiled = compile_into(text, rel, build, "tp", WHO)
        (build / "model.scale").write_text(text)
        cfg = load_program(build).CONFIG
        plan = json.loads((build / "plan.json").read_text())
        sp = compiled.plan.sequence_parallel
        v = plan["values"]
        print(f"{plan['name']} from {rel}: {plan['cost']['parameters']:,} parameters, hidden {v['hidden']}, "
              f"heads {v['heads']}, layers {v['layers']}, seq {v['seq']}, vocab {v['vocab']}, "
              f"global batch {v['global_batch']}; tp = 2, sequence parallel {'on' if sp else 'off'}")
        print(f"2 ranks × 1 thread, {args.rounds} round(s) A (ours) then B (DTensor), {args.steps} steps per run, "
              f"first {args.skip} of each left out", flush=True)
        ref = _reference_loss(compiled, cfg)
        load_before = os.getloadavg()[0]

        times = {"ours": [], "dtensor": []}
        runs = {"ours": [], "dtensor": []}
        for r in range(args.rounds):
            a_metrics, a_bytes = work / f"ours_{r}.jsonl", work / "ours_bytes.json"
            wall = _run(["bash", str(build / "launch.sh"), "--steps", str(args.steps), "--metrics", str(a_metrics),
                         "--count-bytes", str(a_bytes)], "our program", args.verbose)
            runs["ours"].append(read_metrics(a_metrics))
            b_metrics, b_bytes = work / f"dtensor_{r}.jsonl", work / "dtensor_bytes.json"
            wall_b = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                           "--nproc-per-node", "2", str(Path(__file__).resolve()), "--worker", "dtensor",
                           "--build", str(build), "--steps", str(args.steps), "--metrics", str(b_metrics),
                           "--count-bytes", str(b_bytes)], "the DTensor baseline", args.verbose)
            runs["dtensor"].append(read_metrics(b_metrics))
            for k in times:
                times[k] += [m["step_time"] for m in runs[k][-1][args.skip:]]
            med = {k: statistics.median(m["step_time"] for m in runs[k][-1][args.skip:]) for k in runs}
            print(f"  round {r + 1}: ours {med['ours'] * 1e3:6.1f} ms/step ({wall:4.1f} s run), "
                  f"DTensor {med['dtensor'] * 1e3:6.1f} ms/step ({wall_b:4.1f} s run)", flush=True)

        load_after = os.getloadavg()[0]
        ours_bytes = json.loads(a_bytes.read_text())
        dt_bytes = json.loads(b_bytes.read_text())
        ledger_bytes = _ledger(plan)
        ours_total = sum(ours_bytes.values())
        dt_fb = dt_bytes["forward_backward"]
        dt_total = sum(x["bytes"] for x in dt_fb.values())
        dt_rest = dt_bytes["clip_and_optimizer"]
        med_ours, med_dt = statistics.median(times["ours"]), statistics.median(times["dtensor"])
        loss_a, loss_b = runs["ours"][0][0]["loss"], runs["dtensor"][0][0]["loss"]
        n = min(len(runs["ours"][0]), len(runs["dtensor"][0]))
        drift = max(abs(runs["ours"][0][i]["loss"] - runs["dtensor"][0][i]["loss"]) for i in range(n))

        def by_op(counts: dict, with_calls: bool) -> dict:
            agg, calls = collections.Counter(), collections.Counter()
            for k, x in counts.items():
                op = k.split("/")[0]
                agg[op] += x["bytes"] if isinstance(x, dict) else x
                calls[op] += x["calls"] if isinstance(x, dict) else 0
            return {op: _mib(b) + (f" ({calls[op]} calls)" if with_calls else "") for op, b in agg.items()}

        rest_bytes = sum(x["bytes"] for x in dt_rest.values())
        rest_calls = sum(x["calls"] for x in dt_rest.values())
        print()
        rows = [
            ("median step time", f"{med_ours * 1e3:.1f} ms", f"{med_dt * 1e3:.1f} ms"),
            ("ratio ours / DTensor (lower: ours faster)", f"{med_ours / med_dt:.3f}", "1"),
            ("steps timed (all rounds)", f"{len(times['ours'])}", f"{len(times['dtensor'])}"),
            ("bytes per step, forward + backward", _mib(ours_total), _mib(dt_total)),
            *((f"  {op}", by_op(ours_bytes, False).get(op, "-"), by_op(dt_fb, True).get(op, "-"))
              for op in sorted(set(by_op(ours_bytes, False)) | set(by_op(dt_fb, True)))),
            ("  compiler's ledger (plan.json)", _mib(ledger_bytes), ""),
            ("bytes in clipping + optimizer", "8 B (1 call)",
             f"{rest_bytes} B ({rest_calls} call{'s' if rest_calls != 1 else ''})"),
            (f"loss at step 1 (single process {ref:.6f})", f"{loss_a:.6f}", f"{loss_b:.6f}"),
            (f"max abs loss difference over {n} steps", f"{drift:.1e}", ""),
        ]
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(r[1]) for r in rows + [("", "ours (scalec)")])
        w2 = max(len(r[2]) for r in rows + [("", "", "DTensor parallelize_module")])
        print(f"| {'':<{w0}} | {'ours (scalec)':>{w1}} | {'DTensor parallelize_module':>{w2}} |")
        print(f"|{'-' * (w0 + 2)}|{'-' * (w1 + 1)}:|{'-' * (w2 + 1)}:|")
        for name, a, b in rows:
            print(f"| {name:<{w0}} | {a:>{w1}} | {b:>{w2}} |")
        print()
        print("Both plans are Megatron's: vocabulary-parallel embedding tied to the head and a loss over sharded "
              "logits,\ncolumn-parallel q/k/v/up, row-parallel o/down" +
              (", norms and residual stream sharded along the sequence." if sp else ", replicated norms."))
        print(f"Load average (1 min) {load_before:.1f} before, {load_after:.1f} after, on {os.cpu_count()} CPUs: "
              "other work on the machine shows up in both columns; the rounds alternate A and B to share it.")
        if args.keep:
            print(f"build, metrics and byte counts in {work}")


if __name__ == "__main__":
    main()
