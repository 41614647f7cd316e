"""Helpers the benchmarks share: edit a sample, compile it, load the generated program, run workers."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def set_size(text: str, name: str, value: int, who: str) -> str:
    """Replace `name = <number>` in a .scale text."""
    pattern = re.compile(rf"(?<![\w.]){re.escape(name)}(\s*=\s*)\d+\b")
    if not pattern.search(text):
        raise SystemExit(f"{who}: no `{name} = <number>` in the .scale file to set to {value}")
    return pattern.sub(lambda m: f"{name}{m.group(1)}{value}", text, count=1)


def compile_into(text: str, rel: str, out: Path, axis: str, who: str):
    """Compile `text` into `out` (with the source beside it as model.scale); the mesh must be exactly `axis` = 2."""
    from compiler import codegen
    from compiler.check import check_text
    from compiler.pipeline import compile_spec
    compiled = compile_spec(check_text(text, rel))
    axes = dict(compiled.plan.axes)
    if axes.get(axis) != 2 or len(axes) != 1:
        raise SystemExit(f"{who}: wants a mesh of exactly `axis {axis} = 2`, got {compiled.plan.axes}")
    codegen.emit(compiled, str(out))
    (Path(out) / "model.scale").write_text(text)
    return compiled


def load_program(build: Path, name: str = "scalec_bench_program"):
    """The generated program.py as a module (its CONFIG, and Model or Stage/STAGES/loss_fn)."""
    spec = importlib.util.spec_from_file_location(name, Path(build) / "program.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def env() -> dict:
    """One thread per rank (2 ranks on 2 cores), the repository importable."""
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def run_worker(body, args) -> None:
    """Run `body(args)` in a torchrun worker on gloo; leave through os._exit (see ../shared TORCH-ON-CPU: a
    normal exit after gloo can abort), the exit code carrying failure."""
    import torch.distributed as dist
    dist.init_process_group("gloo")
    code = 0
    try:
        body(args)
    except BaseException:
        code = 1
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        dist.destroy_process_group()
        os._exit(code)


def set_plan(text: str, key: str, value: str, who: str) -> str:
    """`key = value` in the plan section: replaced where present, else added as the plan's first line."""
    pattern = re.compile(rf"^(\s*){key}\s*=\s*(\"[^\"]*\"|\S+)", re.M)
    if pattern.search(text):
        return pattern.sub(lambda m: f"{m.group(1)}{key} = {value}", text, count=1)
    if not re.search(r"^plan\s*\{", text, re.M):
        raise SystemExit(f"{who}: the .scale file has no plan section to set `{key}` in")
    return re.sub(r"^(plan\s*\{)", rf"\1\n  {key} = {value}", text, count=1, flags=re.M)


def free_port() -> int:
    """A TCP port free on loopback now (a drill's MASTER_PORT: each run its own, so none waits on the last one's)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_session(cmd: list, env: dict, timeout: float, cwd=None) -> tuple:
    """(exit status or "timeout", stdout and stderr together) of `cmd` in a session of its own: a run that hangs is
    ended whole (launch.sh, the torchrun agents and their workers), not just its shell, which would leave the agents
    and workers running into the next trial."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return "timeout", out
