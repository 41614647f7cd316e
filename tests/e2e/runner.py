"""Compile a .scale text, launch it under torchrun through its launch.sh (a world of one: `python program.py`
itself), and read back what it wrote."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from compiler import codegen
from compiler import plan as P
from compiler.check import check_text
from compiler.parse import parse
from compiler.pipeline import compile_spec
from compiler.report.scale import scale_file
from tests.e2e import zygote

ROOT = Path(__file__).resolve().parents[2]


# what a failed launch's message leaves out: C++ stack frames, which each rank that lost a peer prints by the dozen
_NOISE = re.compile(r"^(frame #\d+: |<omitting python frames>|Exception raised from )")
# the lines that say why a launch failed: a rank's own cause (runtime/faults.py failure_line: "failed at step", a
# hang's "waits in"), the launcher's word on the first failure (tests/e2e/zygote.py's "exited with", runtime/launch.py's
# "the job failed"), a Python traceback's head and its exception line, argparse's "error:"; not the survivors' "lost
# a peer"
_CAUSE = re.compile(r"^(scalec: .*(failed at step|waits in|the job failed)|zygote: rank \d+ exited|Traceback "
                    r"|\[rank ?\d+\].*Error|[A-Za-z_.]*(Error|Exception|Interrupt)\b|\S+: error: )")


def excerpt(output: str, causes: int = 40, tail: int = 30) -> str:
    """What a failed launch's message quotes of its output: every line that says why (`_CAUSE`: each rank's own
    cause and the launcher's word, wherever they fell among the other ranks' output), then the last lines; both
    without the C++ stack frames the ranks that lost a peer print (50 lines of tail once held only theirs)."""
    lines = [line for line in output.splitlines() if not _NOISE.match(line)]
    said = list(dict.fromkeys(line for line in lines if _CAUSE.match(line)))[:causes]
    out = "--- the output's last lines ---\n" + "\n".join(lines[-tail:])
    return ("--- the lines that say why, in order ---\n" + "\n".join(said) + "\n" + out) if said else out


@dataclass
class Run:
    losses: list
    grads: dict
    output: str
    measured: dict   # "op/axis" -> bytes counted by runtime.collectives during the first step
    predicted: dict  # "op/axis" -> bytes per step the ledger (plan.json) predicts for those collectives
    bounds: dict = dataclasses.field(default_factory=dict)  # "op/axis" -> {"exact", "worst"}: where variable
    # splits make the prediction an expectation, its exact part (the calls of known size) and its worst case
    records: list = None  # the metrics line of each step
    returncode: int = 0
    memory: dict = None   # --memory-report's JSON (runtime.memory: every rank's peak, activations, state), if asked
    costs: object = None  # the compiler's cost.Estimate of the plan (its memory model's prediction per rank)


CLUSTER_FIELDS = ("nodes", "devices_per_node")
"""The keywords of `with_plan` and `on_plan` that are the Cluster's (compiler/layout/cluster.py), not the Plan's."""


def _split(cluster, fields: dict) -> tuple:
    """(the cluster with `fields`' nodes and devices_per_node, the other fields: the Plan's)."""
    machines = {k: fields.pop(k) for k in CLUSTER_FIELDS if k in fields}
    return dataclasses.replace(cluster, **machines), fields


def with_plan(text: str, path: str = "case.scale", **fields) -> str:
    """`text` with its mesh and plan sections printed from its Plan with `fields` replaced
    (`dataclasses.replace(plan, **fields)`; `nodes` and `devices_per_node` replace its Cluster's) by
    compiler/report/scale.py, the printer `scalec search -o` writes its winner with; the model and train sections
    as written. A case states the plan it tests as the value the compiler decides on, rather than as edits of the
    sample's wording; the file is then compiled like any other. `path`: where the text's relative paths (a tokens
    file, an `init = from(...)` checkpoint) are found from."""
    spec = check_text(text, path)
    cluster, fields = _split(spec.cluster, dict(fields))
    plan = dataclasses.replace(spec.plan, **fields)
    return scale_file(plan, cluster, text, parse(text, path))


def on_plan(text: str, path: str = "case.scale", **fields) -> str:
    """The same model and training on another mesh and plan: `text` with its mesh and plan sections printed from a
    Plan of `fields` alone, every setting not named at its default (one node, ddp, one micro-batch, ...), none kept
    from the text's own plan (`with_plan` keeps them); `nodes` and `devices_per_node` are the Cluster's, the
    device the text's. `path`: as `with_plan`'s."""
    spec = check_text(text, path)
    plan = spec.plan
    cluster, fields = _split(spec.cluster, {"nodes": 1, **fields})
    fresh = P.Plan(**{"data_parallel": "ddp", "micro_batches": 1,
                      "compile": P.compiles(None, spec.cluster.device.kind), **fields},
                   global_batch=plan.global_batch, seq_len=plan.seq_len)
    return scale_file(fresh, cluster, text, parse(text, path))


def single_device(text: str, path: str = "reference.scale") -> str:
    """The same model, data and global batch on one device, no accumulation: the reference of every plan, on a
    fresh Plan (`on_plan`) but for `fp32_residual`: an fp32 residual stream is the model's numerics, not its
    layout, so the reference keeps it. The text depends only on the model and train sections and that setting, so
    cases of the same model share one reference run (test_e2e's `references`). `path`: as `with_plan`'s."""
    residual = check_text(text, path).plan.fp32_residual
    return on_plan(text, path, axes=(("dp", 1),), devices_per_node=1, fp32_residual=residual)


def case_text(case) -> str:
    """The .scale text of an e2e case (tests/e2e/cases.py): the sample, its `edits` of the model and train text
    applied, then its `plan` fields (`with_plan`)."""
    text = (ROOT / case.sample).read_text()
    for old, new in case.edits:
        assert old in text, f"case {case.id}: `{old}` is not in {case.sample}"
        text = text.replace(old, new)
    return with_plan(text, f"{case.id}.scale", **dict(case.plan)) if case.plan else text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(text: str, name: str, workdir: Path, *, steps: int, timeout: int, nproc: int | None = None,
           extra: tuple = (), dump_grads: bool = True, env: dict | None = None, check: bool = True,
           memory_report: bool = False, count_bytes: bool = True, torchrun: bool | None = None,
           forked: bool | None = None) -> Run:
    """`env`: added to the environment; `check=False`: a run that fails is returned (with `returncode`) too;
    `memory_report`: the program measures every rank's memory in the last step (`--memory-report`), read back into
    `Run.memory` (compared with the compiler's prediction in plan.json).
    `torchrun`: start the program through launch.sh's torchrun; by default only a world of more than one, or one
    that restarts: a single process without restarts runs as `python program.py` (runtime.mesh makes it a world of
    one).
    `forked`: fork the program's processes from tests/e2e/zygote.py's server, which imported torch once for this
    test process, instead of starting interpreters that each import it (most of a toy case's CPU: five imports for
    a case of four ranks). By default every launch that tests the program, not the launching: `check`ed, without
    restarts, `torchrun` not named, one node or a fixed number of them, and an environment the server can serve
    (zygote.served). SCALEC_TEST_ZYGOTE=0 starts every launch as its own processes (launch.sh or python)."""
    out = workdir / name
    compiled = compile_spec(check_text(text, f"{name}.scale"))
    if nproc is not None:
        assert compiled.plan.world_size == nproc, "the case's nproc disagrees with its mesh"
    codegen.emit(compiled, str(out))
    metrics, grads, counts = out / "metrics.jsonl", out / "grads.pt", out / "bytes.json"
    report = out / "memory.json"
    explicit = torchrun is not None
    if torchrun is None:
        torchrun = compiled.plan.world_size > 1 or int(compiled.spec.train.restarts) > 0
    start = ["bash", str(out / "launch.sh")] if torchrun else ["python3", str(out / "program.py")]
    cmd = [*start, "--steps", str(steps), "--metrics", str(metrics), *extra]
    if count_bytes:
        cmd += ["--count-bytes", str(counts)]
    if memory_report:
        cmd += ["--memory-report", str(report)]
    if dump_grads:
        cmd += ["--dump-grads", str(grads)]
    # PYTHONWARNINGS=default: DeprecationWarnings raised inside torch are shown too (hidden by default), so that
    # assert_no_warnings sees every deprecated call a run makes.
    env = dict(os.environ, PYTHONPATH=str(ROOT), LOCAL_NODES="1", MASTER_PORT=str(_free_port()),
               OMP_NUM_THREADS="1", PYTHONWARNINGS="default", **(env or {}))
    if forked is None:
        forked = (check and not explicit and int(compiled.spec.train.restarts) == 0
                  and codegen.min_nodes(compiled.spec) == compiled.spec.cluster.nodes)
    server = zygote.server(env) if forked else None
    if server is not None:
        zygote.guard("program.py, forked by tests/e2e/zygote.py")
        cmd = ["(forked by tests/e2e/zygote.py)", str(out / "program.py"), *cmd[2:]]  # what a failure names
        log = out / "output.txt"
        returncode = server.run(str(out / "program.py"), cmd[2:], cwd=out, env=dict(env, SCALEC_LAUNCH_TIME=repr(
            time.time())), nproc=compiled.plan.world_size, nodes=compiled.spec.cluster.nodes, out=log,
            timeout=timeout)
        output = log.read_text(errors="replace") if log.exists() else ""
        if returncode is None:
            pytest.fail(f"timed out after {timeout}s: {' '.join(cmd)}\n{excerpt(output)}", pytrace=False)
    else:
        try:
            proc = subprocess.run(cmd, cwd=out, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            got = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            pytest.fail(f"timed out after {timeout}s: {' '.join(cmd)}\n{excerpt(got)}", pytrace=False)
        output, returncode = proc.stdout + proc.stderr, proc.returncode
    if returncode != 0 and not check:
        records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
        return Run(losses=[r["loss"] for r in records], grads={}, output=output, measured={}, predicted={},
                   records=records, returncode=returncode)
    if returncode != 0:
        pytest.fail(f"exit {returncode}: {' '.join(cmd)}\n{excerpt(output)}", pytrace=False)
    assert_no_warnings(output, cmd)
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    losses = [r["loss"] for r in records]
    predicted: dict = {}
    worst: dict = {}
    for c in json.loads((out / "plan.json").read_text())["ledger"]:
        if c["measured"]:
            key = f"{c['op']}/{c['axis']}"
            predicted[key] = predicted.get(key, 0) + c["bytes_per_step"]
            # a variable-split all-to-all (moe dispatch = grouped): bytes_per_step is the expectation under
            # balanced routing, worst_bytes_per_step the most it moves
            worst.setdefault(key, {"exact": 0, "worst": 0, "variable": False})
            worst[key]["variable"] |= "worst_bytes_per_step" in c
            worst[key]["exact"] += 0 if "worst_bytes_per_step" in c else c["bytes_per_step"]
            worst[key]["worst"] += c.get("worst_bytes_per_step", c["bytes_per_step"])
    measured = json.loads(counts.read_text()) if counts.exists() else {}
    return Run(losses=losses, grads=_grads(grads) if dump_grads else {}, output=output, measured=measured,
               predicted=predicted, records=records, bounds={k: v for k, v in worst.items() if v["variable"]},
               memory=json.loads(report.read_text()) if memory_report else None, costs=compiled.costs)


# Python warnings a run may print, each with the reason it is not ours to fix; every other warning fails the run.
ALLOWED_WARNINGS: dict = {
    "`torch.jit.script` is deprecated": "torch's own modules decorate with it when imported: "
    "torch.distributed.optim's functional optimizers (imported with ZeroRedundancyOptimizer, zero1); nothing of "
    "ours calls torch.jit, and the default filter shows no DeprecationWarning raised inside torch",
    "`torch.jit.interface` is deprecated": "the same import of torch.distributed.optim",
    "`torch.jit.script_method` is deprecated": "torch.utils.mkldnn, imported by Inductor's pre-grad passes "
    "(plan { compile = true }) when torch.compile first runs",
}
_WARNING = re.compile(r"\b(FutureWarning|DeprecationWarning|UserWarning)\b")


def warnings_in(output: str) -> list:
    """The lines of a run's output that report a Python warning, less those ALLOWED_WARNINGS names."""
    return [line for line in output.splitlines()
            if _WARNING.search(line) and not any(key in line for key in ALLOWED_WARNINGS)]


def assert_no_warnings(output: str, cmd) -> None:
    """Every rank's output is ours: a warning torch prints per rank (a deprecated call, a misuse) is a defect."""
    found = warnings_in(output)
    if found:
        pytest.fail(f"the run printed warnings: {' '.join(map(str, cmd))}\n" + "\n".join(found[:20]), pytrace=False)


def _grads(path: Path) -> dict:
    """The whole model's gradients: one file, or one per pipeline stage (`.ppN`), merged (a tied embedding is on
    the first and last stage; after their sum both copies hold the same gradient)."""
    if path.exists():
        return torch.load(path)
    merged: dict = {}
    for part in sorted(path.parent.glob(path.name + ".pp*")):
        for name, g in torch.load(part).items():
            if name in merged:
                assert torch.equal(merged[name], g), f"the two copies of {name} disagree"
            merged[name] = g
    return merged


def assert_same_training(run: Run, ref: Run, rtol: float = 1e-5) -> None:
    """Losses equal elementwise to `rtol`; each gradient tensor equal to `rtol` in norm: ‖g − g_ref‖ ≤ rtol·‖g_ref‖.

    The norm is the right yardstick for a tensor: a parallel plan sums the same terms in another order, and an
    entry that is a near-cancelling sum (a bias gradient over 512 tokens, ~1e-4) can differ by more than 1e-5 of
    itself while the tensor agrees to 1e-7. A tensor whose gradient is zero in exact arithmetic holds rounding noise
    in both runs (the attention key bias: softmax ignores the per-query constant q·b), so norms are floored at 1e-3
    of the model's whole gradient norm.
    """
    assert len(run.losses) == len(ref.losses)
    torch.testing.assert_close(torch.tensor(run.losses, dtype=torch.float64),
                               torch.tensor(ref.losses, dtype=torch.float64), rtol=rtol, atol=0.0)
    assert run.grads.keys() == ref.grads.keys()
    total = torch.sqrt(sum(g.double().pow(2).sum() for g in ref.grads.values()))
    for name in ref.grads:
        got, want = run.grads[name].double(), ref.grads[name].double()
        assert got.shape == want.shape, f"gradient of {name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
        err = (got - want).norm() / torch.maximum(want.norm(), 1e-3 * total)
        assert err <= rtol, f"gradient of {name}: relative error {err:.3e} > {rtol}"
