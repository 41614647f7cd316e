"""Mixture-of-Experts: the generated expert-parallel program (all-to-all) against an all-gather design and against
the same model run densely in one process, same model, same global batch, same seed.

    python bench/moe.py                  # samples/moe_gpt.scale at bench sizes, 3 rounds, ~2.5 minutes
    python bench/moe.py --quick          # one round of 5 steps each: a sanity run, ~1 minute
    python bench/moe.py --steps 16 --rounds 5 --keep /tmp/moe-bench
    python bench/moe.py --dropless       # dropless grouped against dropless padded, both ep = 2 (issue 25)

The .scale file is edited to bench sizes (`--hidden 256 --heads 8 --layers 4 --seq 128 --vocab 512 --batch 8`:
two MoE layers of 8 SwiGLU experts with 512 hidden units each, top-2, capacity factor 1.25, as the sample has them)
and compiled twice: for `axis ep = 2` on 2 devices, and for `axis dp = 1` on one. Three variants, run in
alternation round after round (ep, all-gather, dense, ep, ...), each with `--steps N --metrics F --count-bytes F`:

  ep          the generated program under torchrun, 2 ranks × 1 thread (OMP_NUM_THREADS=1): each rank routes its
              half of the batch and exchanges the capacity slots with runtime.moe's all-to-alls, E·N·H elements
              each way per layer and direction (N = B·C slots per expert of the rank's B sequences).
  all-gather  the same program and ranks, with runtime.moe.all_to_all_dispatch/all_to_all_combine replaced (by this
              script, `--worker all-gather`, before the program's own code runs) by all-gathers: dispatch gathers
              every rank's whole E × N × H slot buffer and keeps its experts' slots; combine gathers every rank's
              expert outputs, (E/ep) × (ep·N) × H, and keeps its own tokens' part. The backward of each is the
              reduce-scatter of the gradient (zero outside the part that was kept). Each moves ep times the bytes
              of the all-to-all it replaces, counted the runtime's way (all-gather: the gathered output;
              reduce-scatter: the full input). The experts compute exactly what they compute under ep.
  dense       the single-device program, one process × 1 thread, with runtime.moe.dispatch/combine/Experts.forward
              replaced (`--worker dense`): every expert processes every token, and each output is weighted by the
              gate times the keep-mask of runtime.moe.route (the same routing, capacity and dropped choices), so no
              slot buffers, no capacity padding, no communication, and S/C times the expert FLOPs of the
              capacity slots (128/40 = 3.2 at the bench sizes).

Read the table as: median step time over every timed step of every round (the first `--skip` steps of each run
are warm-up), tokens/s = global batch × seq / that median, MoE bytes per step = what the runtime counted over the
`ep` axis during the last step of a run (`--count-bytes`; DDP's gradient all-reduce is not counted by the runtime
and is the same in ep and all-gather), ratio = median step time / ep's; the fastest step of each, less disturbed by
other work on the machine than the median, is beside them. Below the table: the compiler's ledger
(plan.json, the all_to_all entries) for ep, and the losses of the three variants, which must agree: all-gather
computes exactly the same numbers as ep (the same slots reach the same experts), dense the same up to float
summation order (relative 1e-5).

Timings on a shared 2-core machine are only as good as the machine is quiet, and a rank slowed by other work holds
up its peer at every exchange, so the two-rank variants suffer more from it than dense. The script prints the load
average at start and end and, for each variant, how many CPUs other processes took while it ran (/proc/stat busy
time minus this script's and its children's), and warns above 0.1; the rounds alternate the variants so that such
work falls on all three.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import compile_into, env, read_metrics, set_plan, set_size  # noqa: E402

WHO = "bench/moe.py"

DEFAULT_SCALE = "samples/moe_gpt.scale"
SIZES = {"hidden": 256, "heads": 8, "layers": 4, "seq": 128, "vocab": 512}  # 8.6 M parameters, 6.3 M of them in experts
DEFAULT_BATCH = 8
VARIANTS = ("ep", "all-gather", "dense")
LOSS_RTOL = 1e-5  # dense against ep; all-gather must match ep to the bit


# -- the .scale text ------------------------------------------------------------------------------------------------


def _set_mesh(text: str, axes: str, devices: int) -> str:
    """Replace the whole mesh section: `axes` (e.g. "axis ep = 2"), one node of `devices` CPU devices."""
    pattern = re.compile(r"^mesh\s*\{.*?^\}", re.M | re.S)
    if not pattern.search(text):
        raise SystemExit(f"{WHO}: the .scale file has no mesh section to replace")
    body = f"mesh {{\n  {axes}\n  nodes = 1\n  devices_per_node = {devices}\n  device = cpu\n}}"
    return pattern.sub(lambda m: body, text, count=1)


def edited_text(args) -> str:
    path = Path(args.scale) if Path(args.scale).is_absolute() else ROOT / args.scale
    text = path.read_text()
    if not args.keep_sizes:
        for name in SIZES:
            text = set_size(text, name, getattr(args, name), WHO)
        text = set_size(text, "global_batch", args.batch, WHO)
    if args.micro_batches:
        text = set_plan(text, "micro_batches", str(args.micro_batches), WHO)
    return text


def compile_single(text: str, rel: str, out: Path):
    """Compile `text` for one device (the mesh already edited to `axis dp = 1`) into `out`."""
    from compiler import codegen
    from compiler.check import check_text
    from compiler.pipeline import compile_spec
    compiled = compile_spec(check_text(text, rel))
    if any(n != 1 for _, n in compiled.plan.axes):
        raise SystemExit(f"{WHO}: the dense build wants one device, got {compiled.plan.axes}")
    codegen.emit(compiled, str(out))
    (Path(out) / "model.scale").write_text(text)
    return compiled


# -- all-gather instead of all-to-all (runs under torchrun, patched into runtime.moe) -------------------------------


def _gather_classes():
    """The two autograd Functions of the all-gather design (defined here so that the driver never imports torch)."""
    import torch

    from runtime import collectives

    class GatherDispatch(torch.autograd.Function):
        """E × N × H on every rank -> (E/ep) × (ep·N) × H, the layout of runtime.moe._to_experts: all-gather every
        rank's whole slot buffer, keep this rank's experts. Backward: this rank's gradient put back into a zero
        ep × E × N × H buffer, reduce-scattered, so that every rank gets the sum of what all ranks' experts sent
        back for its slots."""

        @staticmethod
        def forward(ctx, x_ENH, axis):
            n, r = collectives.axis_size(axis), collectives.axis_rank(axis)
            e, t, h = x_ENH.shape
            if e % n:
                raise ValueError(f"{e} experts do not divide over {axis} = {n}")
            mine = e // n
            ctx.axis, ctx.shape, ctx.n, ctx.r = axis, (e, t, h), n, r
            everyone = collectives._all_gather(x_ENH, axis, 0).reshape(n, e, t, h)  # (source rank, expert, slot)
            return everyone[:, r * mine:(r + 1) * mine].transpose(0, 1).reshape(mine, n * t, h)

        @staticmethod
        def backward(ctx, grad):
            (e, t, h), n, r = ctx.shape, ctx.n, ctx.r
            mine = e // n
            full = grad.new_zeros(n, e, t, h)
            full[:, r * mine:(r + 1) * mine] = grad.reshape(mine, n, t, h).transpose(0, 1)
            return collectives._reduce_scatter(full.reshape(n * e, t, h), ctx.axis, 0), None

    class GatherCombine(torch.autograd.Function):
        """(E/ep) × (ep·N) × H -> E × N × H, the layout of runtime.moe._from_experts: all-gather every rank's
        expert outputs (for all ranks' tokens), keep this rank's tokens. Backward: the gradient of this rank's
        tokens put back into a zero buffer of the gathered shape, reduce-scattered to the experts' ranks."""

        @staticmethod
        def forward(ctx, y_LMH, axis):
            n, r = collectives.axis_size(axis), collectives.axis_rank(axis)
            mine, m, h = y_LMH.shape
            t = m // n
            ctx.axis, ctx.shape, ctx.n, ctx.r = axis, (mine, t, h), n, r
            # (owner rank, its expert, token rank, slot)
            everyone = collectives._all_gather(y_LMH, axis, 0).reshape(n, mine, n, t, h)
            return everyone[:, :, r].reshape(n * mine, t, h)

        @staticmethod
        def backward(ctx, grad):
            (mine, t, h), n, r = ctx.shape, ctx.n, ctx.r
            full = grad.new_zeros(n, mine, n, t, h)
            full[:, :, r] = grad.reshape(n, mine, t, h)
            return collectives._reduce_scatter(full.reshape(n * mine, n * t, h), ctx.axis, 0), None

    return GatherDispatch, GatherCombine


def patch_all_gather() -> None:
    from runtime import collectives, moe
    dispatch_fn, combine_fn = _gather_classes()

    def all_gather_dispatch(x_ENH, axis: str):
        return x_ENH if collectives.axis_size(axis) == 1 else dispatch_fn.apply(x_ENH, axis)

    def all_gather_combine(y, axis: str):
        return y if collectives.axis_size(axis) == 1 else combine_fn.apply(y, axis)

    # The program calls moe.all_to_all_dispatch(...) through the module: these attributes are what it finds.
    moe.all_to_all_dispatch = all_gather_dispatch
    moe.all_to_all_combine = all_gather_combine


# -- dense-masked MoE (one process, patched into runtime.moe) -------------------------------------------------------


def patch_dense() -> None:
    """Every expert on every token, its output weighted by gate × keep. route() is left as it is: the slots it
    returns (expert·C + position, or E·C when dropped) give each choice's expert and whether it was kept."""
    import torch
    import torch.nn.functional as F

    from runtime import moe

    capacity_of_layer = {}  # C of the layer being computed: dispatch is called before its layer's combine

    def dense_dispatch(x_BSH, slot_BSK, experts: int, capacity: int):
        capacity_of_layer["C"] = capacity
        b, s, h = x_BSH.shape
        return x_BSH.reshape(b * s, h)  # T × H: no slots, every token goes to every expert

    def dense_experts_forward(self, x_TH):
        x = x_TH.unsqueeze(0)  # 1 × T × H, broadcast over the experts
        h_ETF = torch.matmul(x, self.w_up)
        h_ETF = F.silu(torch.matmul(x, self.w_gate)) * h_ETF if self.act == "swiglu" else F.gelu(h_ETF)
        return torch.matmul(h_ETF, self.w_down)  # E × T × H

    def dense_combine(y_ETH, slot_BSK, gate_BSK, x_BSH=None):
        e, t, h = y_ETH.shape
        b, s, k = slot_BSK.shape
        c = capacity_of_layer["C"]
        keep_BSK = slot_BSK < e * c
        expert_BSK = torch.where(keep_BSK, slot_BSK // c, torch.zeros_like(slot_BSK))
        w_BSK = gate_BSK.to(y_ETH.dtype)
        weight_BSE = (F.one_hot(expert_BSK, e).to(y_ETH.dtype) * (w_BSK * keep_BSK).unsqueeze(-1)).sum(2)
        out_TH = torch.einsum("eth,te->th", y_ETH, weight_BSE.reshape(t, e))
        out_BSH = out_TH.reshape(b, s, h)
        if x_BSH is not None:  # `dropped = identity`: a dropped choice passes gate × the token itself
            out_BSH = out_BSH + (w_BSK * ~keep_BSK).sum(-1, keepdim=True) * x_BSH
        return out_BSH

    moe.dispatch = dense_dispatch
    moe.combine = dense_combine
    moe.Experts.forward = dense_experts_forward


def worker(kind: str, build: str, program_args: list[str]) -> None:
    """Patch runtime.moe, then run the generated program as `python program.py ARGS` would."""
    if kind == "all-gather":
        patch_all_gather()
    else:
        patch_dense()
    program = str(Path(build) / "program.py")
    sys.argv = [program, *program_args]
    runpy.run_path(program, run_name="__main__")


# -- the driver -----------------------------------------------------------------------------------------------------


def _cpu_snapshot() -> tuple[float, float, float]:
    """(wall, CPU seconds the whole machine was busy, CPU seconds of this process and its waited-for children):
    between two snapshots, the first difference minus the second is what other processes took (Linux)."""
    import resource
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
        busy = (ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        busy = float("nan")
    mine = sum(getattr(resource.getrusage(who), field) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for field in ("ru_utime", "ru_stime"))
    return time.perf_counter(), busy, mine


def _run(cmd: list[str], what: str, verbose: bool) -> tuple[float, float]:
    """Run `cmd`; return its wall time and the CPU seconds other processes took meanwhile."""
    before = _cpu_snapshot()
    proc = subprocess.run(cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if verbose or proc.returncode:
        print(proc.stdout)
    if proc.returncode:
        raise SystemExit(f"{WHO}: {what} failed (exit {proc.returncode}): {' '.join(cmd)}")
    after = _cpu_snapshot()
    return after[0] - before[0], max(0.0, (after[1] - before[1]) - (after[2] - before[2]))


def _command(kind: str, builds: dict, program_args: list[str]) -> list[str]:
    if kind == "ep":
        return ["bash", str(builds["ep"] / "launch.sh"), *program_args]
    me = str(Path(__file__).resolve())
    if kind == "all-gather":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                "--nproc-per-node", "2", me, "--worker", kind, "--build", str(builds["ep"]), "--", *program_args]
    return [sys.executable, me, "--worker", kind, "--build", str(builds["dense"]), "--", *program_args]


def _moe_bytes(counts: dict) -> dict:
    """The runtime's byte counts over the ep axis, by op."""
    return {key.split("/")[0]: n for key, n in counts.items() if key.endswith("/ep")}


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def _table(header: list[str], rows: list[list[str]]) -> None:
    """A markdown table, the first column left-aligned, the others right-aligned."""
    w = [max(len(str(x)) for x in col) for col in zip(header, *rows)]

    def line(cells):
        return "| " + " | ".join(f"{c:<{w[i]}}" if i == 0 else f"{c:>{w[i]}}" for i, c in enumerate(cells)) + " |"
    print(line(header))
    print("|" + "|".join("-" * (w[0] + 2) if i == 0 else "-" * (w[i] + 1) + ":" for i in range(len(w))) + "|")
    for r in rows:
        print(line(r))


# -- dropless: grouped against padded (issue 25) ----------------------------------------------------------------------

DROPLESS = ("padded", "grouped")


def _dropless_text(text: str, dispatch: str) -> str:
    """The sample's `moe` made dropless (`capacity_factor = none`), its dispatch `padded` (every expert a buffer of
    seq slots per sequence) or `grouped` (the tokens sorted by expert, variable all-to-alls, grouped matmuls)."""
    if "capacity_factor = 1.25," not in text:
        raise SystemExit(f"{WHO}: --dropless wants the sample's `capacity_factor = 1.25,` to replace")
    extra = " dispatch = grouped," if dispatch == "grouped" else ""
    return text.replace("capacity_factor = 1.25,", f"capacity_factor = none,{extra}").replace(
        "dropped = residual)", "renormalize = true)")


def dropless_main(args) -> None:
    """`--dropless`: today's dropless (buffers padded to the worst case, capacity = seq) against dropless grouped,
    both the generated ep = 2 program, alternating round after round; median step time, the compiler's hardware
    FLOPs per step of each (the padded one's counts every empty slot), their ratios, and the losses (the same
    model: equal to float32 rounding)."""
    with tempfile.TemporaryDirectory(prefix="scalec-moe-dropless-") as tmp:
        work = Path(args.keep).resolve() if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        text = edited_text(args)
        rel = Path(args.scale).as_posix()
        builds, hw, model = {}, {}, {}
        for kind in DROPLESS:
            builds[kind] = work / f"build_{kind}"
            compiled = compile_into(_set_mesh(_dropless_text(text, kind), "axis ep = 2", 2), rel, builds[kind], "ep",
                                    WHO)
            hw[kind], model[kind] = compiled.costs.flops_step_hw_n, compiled.costs.flops_step_n
        print(f"dropless MoE at bench sizes ({', '.join(f'{k} {getattr(args, k)}' for k in SIZES)}, batch "
              f"{args.batch}), ep = 2 ranks × 1 thread; {args.rounds} round(s) of {args.steps} steps, first "
              f"{args.skip} left out", flush=True)
        times = {k: [] for k in DROPLESS}
        losses, counts = {}, {}
        for r in range(args.rounds):
            line = []
            for kind in DROPLESS:
                metrics, counted = work / f"{kind}_{r}.jsonl", work / f"{kind}_bytes_{r}.json"
                wall, other = _run(["bash", str(builds[kind] / "launch.sh"), "--steps", str(args.steps),
                                    "--metrics", str(metrics), "--count-bytes", str(counted)], kind, args.verbose)
                run = read_metrics(metrics)
                losses.setdefault(kind, [m["loss"] for m in run])
                counts[kind] = json.loads(counted.read_text()) if counted.exists() else {}
                timed = [m["step_time"] for m in run[args.skip:]]
                times[kind] += timed
                line.append(f"{kind} {statistics.median(timed) * 1e3:6.1f} ms/step (others {other / wall:.2f} CPUs)")
            print(f"  round {r + 1}: " + ", ".join(line), flush=True)
        med = {k: statistics.median(times[k]) for k in DROPLESS}
        print()
        _table(["dropless", "median ms/step", "ratio vs padded", "hardware FLOP/step", "hardware / model FLOPs",
                "ratio vs padded", "all_to_all bytes (last step)", "steps timed"],
               [[k, f"{med[k] * 1e3:.1f}", f"{med[k] / med['padded']:.2f}", f"{hw[k]:.4g}", f"{hw[k] / model[k]:.3f}",
                 f"{hw[k] / hw['padded']:.3f}", _mib(counts[k].get("all_to_all/ep", 0)), str(len(times[k]))]
                for k in DROPLESS])
        gap = max(abs(a - b) / abs(b) for a, b in zip(losses["grouped"], losses["padded"]))
        print(f"model FLOPs per step {model['padded']:.4g} (both); losses agree to {gap:.1e} relative "
              f"(padded {losses['padded'][0]:.6f} → {losses['padded'][-1]:.6f}, grouped {losses['grouped'][0]:.6f} "
              f"→ {losses['grouped'][-1]:.6f})")
        if args.keep:
            print(f"builds, metrics and byte counts in {work}")
        if gap > 1e-4:
            raise SystemExit(f"{WHO}: padded and grouped dropless disagree (losses {gap:.1e} apart)")


def main() -> None:
    if "--worker" in sys.argv:  # `bench/moe.py --worker KIND --build DIR -- PROGRAM ARGS`
        p = argparse.ArgumentParser(prog=WHO)
        p.add_argument("--worker", choices=["all-gather", "dense"], required=True)
        p.add_argument("--build", required=True)
        split = sys.argv.index("--") if "--" in sys.argv else len(sys.argv)
        args = p.parse_args(sys.argv[1:split])
        worker(args.worker, args.build, sys.argv[split + 1:])
        return

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scale", nargs="?", default=DEFAULT_SCALE, help=f"the .scale file (default {DEFAULT_SCALE})")
    for name, value in SIZES.items():
        p.add_argument(f"--{name}", type=int, default=value, help=f"model size `{name}` (default {value})")
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH, help=f"global_batch (default {DEFAULT_BATCH})")
    p.add_argument("--micro-batches", type=int, help="set the plan's micro_batches (default: as the file has it)")
    p.add_argument("--keep-sizes", action="store_true", help="keep the file's own sizes and global batch")
    p.add_argument("--steps", type=int, default=12, help="optimizer steps per run (default 12)")
    p.add_argument("--skip", type=int, default=3, help="warm-up steps left out of each run's timings (default 3)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of ep, all-gather, dense (default 3)")
    p.add_argument("--quick", action="store_true", help="one round of 5 steps each (2 of them warm-up)")
    p.add_argument("--keep", metavar="DIR", help="write the builds, metrics and byte counts here (default: a temp dir)")
    p.add_argument("--verbose", action="store_true", help="show each run's output")
    p.add_argument("--dropless", action="store_true", help="instead: dropless grouped against dropless padded "
                   "(capacity_factor = none), both over ep = 2 (issue 25)")
    args = p.parse_args()
    if args.quick:
        args.steps, args.skip, args.rounds = 5, 2, 1
    if args.steps <= args.skip:
        raise SystemExit(f"{WHO}: --steps {args.steps} leaves no step after the {args.skip} skipped")
    if args.dropless:
        dropless_main(args)
        return

    with tempfile.TemporaryDirectory(prefix="scalec-moe-") as tmp:
        work = Path(args.keep).resolve() if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        text = edited_text(args)
        rel = Path(args.scale).as_posix()
        builds = {"ep": work / "build_ep", "dense": work / "build_dense"}
        compile_into(_set_mesh(text, "axis ep = 2", 2), rel, builds["ep"], "ep", WHO)
        compile_single(_set_mesh(text, "axis dp = 1", 1), rel, builds["dense"])
        plan = json.loads((builds["ep"] / "plan.json").read_text())
        v, cost = plan["values"], plan["cost"]
        tokens_per_step = v["global_batch"] * v["seq"]
        ledger = sum(int(e["bytes_per_step"]) for e in plan["ledger"] if e["op"] == "all_to_all")
        micro = plan["plan"].get("micro_batches", 1)
        print(f"{plan['name']} from {rel}: {cost['parameters']:,} parameters, hidden {v['hidden']}, heads "
              f"{v['heads']}, layers {v['layers']}, seq {v['seq']}, vocab {v['vocab']}, {v['experts']} experts, "
              f"capacity {v['capacity']} slots per expert per sequence; global batch {v['global_batch']} "
              f"({tokens_per_step:,} tokens), micro-batches {micro}")
        print(f"ep and all-gather: 2 ranks × 1 thread; dense: 1 process × 1 thread. {args.rounds} round(s), "
              f"{args.steps} steps per run, first {args.skip} of each left out", flush=True)
        load_before = os.getloadavg()

        times = {k: [] for k in VARIANTS}
        others = {k: [0.0, 0.0] for k in VARIANTS}  # wall seconds of the runs, CPU seconds other processes took
        first_run: dict = {}
        counts: dict = {}
        for r in range(args.rounds):
            line = []
            for kind in VARIANTS:
                metrics, counted = work / f"{kind}_{r}.jsonl", work / f"{kind}_bytes_{r}.json"
                cmd = _command(kind, builds, ["--steps", str(args.steps), "--metrics", str(metrics),
                                              "--count-bytes", str(counted)])
                wall, other = _run(cmd, kind, args.verbose)
                others[kind][0] += wall
                others[kind][1] += other
                run = read_metrics(metrics)
                first_run.setdefault(kind, run)
                counts[kind] = json.loads(counted.read_text()) if counted.exists() else {}
                timed = [m["step_time"] for m in run[args.skip:]]
                times[kind] += timed
                line.append(f"{kind} {statistics.median(timed) * 1e3:6.1f} ms/step ({wall:4.1f} s run, others "
                            f"{other / wall:.2f} CPUs)")
            print(f"  round {r + 1}: " + ", ".join(line), flush=True)
        load_after = os.getloadavg()

        med = {k: statistics.median(times[k]) for k in VARIANTS}
        moe_bytes = {k: _moe_bytes(counts[k]) for k in VARIANTS}
        print()
        rows = []
        for k in VARIANTS:
            b = moe_bytes[k]
            detail = " + ".join(f"{op} {_mib(n)}" for op, n in sorted(b.items()))
            rows.append([k, f"{med[k] * 1e3:.1f}", f"{tokens_per_step / med[k]:,.0f}", _mib(sum(b.values())),
                         detail or "-", f"{med[k] / med['ep']:.2f}", f"{min(times[k]) * 1e3:.1f}",
                         str(len(times[k]))])
        _table(["variant", "median ms/step", "tokens/s", "MoE bytes/step", "by op (runtime count, last step)",
                "ratio vs ep", "fastest ms/step", "steps timed"], rows)
        busy = {k: others[k][1] / others[k][0] for k in VARIANTS}
        print(f"CPUs taken by other processes while each variant ran (of {os.cpu_count()}): "
              + ", ".join(f"{k} {busy[k]:.2f}" for k in VARIANTS)
              + ("  <- a busy machine: timings are unreliable" if max(busy.values()) > 0.1 else ""))
        print()
        ep_measured = sum(moe_bytes["ep"].values())
        print(f"Compiler's ledger for ep (plan.json, all_to_all entries): {_mib(ledger)} per step "
              f"({ledger:,} B; measured {ep_measured:,} B, {'equal' if ledger == ep_measured else 'DIFFERENT'}).")
        if ep_measured:
            print(f"all-gather moves {sum(moe_bytes['all-gather'].values()) / ep_measured:.2f}× the bytes of ep.")

        # The losses: all-gather must reproduce ep exactly, dense up to summation order.
        ok = True
        n = min(len(first_run[k]) for k in VARIANTS)
        print(f"Losses of each variant's first run ({n} steps), against ep:")
        for k in VARIANTS:
            losses = [m["loss"] for m in first_run[k][:n]]
            ref = [m["loss"] for m in first_run["ep"][:n]]
            rel_diff = max(abs(a - b) / abs(b) for a, b in zip(losses, ref))
            step1 = abs(losses[0] - ref[0]) / abs(ref[0])
            limit = 0.0 if k == "all-gather" else LOSS_RTOL
            good = step1 <= limit if k != "ep" else True
            ok &= good
            print(f"  {k:<10} step 1 {losses[0]:.6f}, last {losses[-1]:.6f}; relative difference at step 1 "
                  f"{step1:.1e}, largest over the run {rel_diff:.1e}" + ("" if k == "ep" else
                                                                         f" ({'ok' if good else 'TOO LARGE'}, "
                                                                         f"limit {limit:.0e} at step 1)"))
        print(f"Load average (1, 5, 15 min) {', '.join(f'{x:.2f}' for x in load_before)} at start, "
              f"{', '.join(f'{x:.2f}' for x in load_after)} at end, on {os.cpu_count()} CPUs.")
        if args.keep:
            print(f"builds, metrics and byte counts in {work}")
        if not ok:
            raise SystemExit(f"{WHO}: the variants' losses disagree (see above)")


if __name__ == "__main__":
    main()
