"""`scalec run`'s command line, without launching: program flags after `--` reach the program whole, torchrun's
flags go in one shell-split string, a multi-node mesh runs this node's share; `train { restarts, timeout }`."""
from __future__ import annotations

import os
import shlex
import subprocess
from types import SimpleNamespace

import pytest

from compiler import codegen
from compiler.check import check_text
from compiler.cli import UsageError, launch_command, main
from compiler.diagnostics import ScaleError
from compiler.pipeline import compile_spec
from tests.e2e.runner import ROOT

DP = (ROOT / "samples" / "gpt_dp.scale").read_text()


def _args(argv, monkeypatch):
    """The namespace `scalec run` would hand cmd_run."""
    seen = {}

    def capture(args):
        seen["args"] = args
        return 0
    monkeypatch.setattr("compiler.cli.cmd_run", capture)
    assert main(["run", *argv]) == 0
    return seen["args"]


def test_program_flags_after_dashes_reach_the_program_whole(monkeypatch):
    args = _args(["f.scale", "--steps", "3", "--", "--checkpoint-dir", "my ckpt", "--seed", "7"], monkeypatch)
    cmd, env = launch_command(args, 1, "out", {})
    assert cmd == ["bash", os.path.join("out", "launch.sh"), "--steps", "3", "--checkpoint-dir", "my ckpt",
                   "--seed", "7"]
    assert env["TORCHRUN_ARGS"] == "" and "LOCAL_NODES" not in env


def test_torchrun_flags_are_split_as_a_shell_would(monkeypatch):
    args = _args(["f.scale", "--torchrun-args", "--redirects 3 --log-dir 'my logs'"], monkeypatch)
    _, env = launch_command(args, 1, "out", {})
    assert shlex.split(env["TORCHRUN_ARGS"]) == ["--redirects", "3", "--log-dir", "my logs"]
    args = _args(["f.scale", "--torchrun-args", "--log-dir 'unclosed"], monkeypatch)
    with pytest.raises(UsageError, match="No closing quotation"):
        launch_command(args, 1, "out", {})


def test_several_nodes_run_this_nodes_share_or_say_how(monkeypatch):
    args = _args(["f.scale"], monkeypatch)
    with pytest.raises(UsageError, match="spans 2 nodes: .*NODE_RANK.*MASTER_ADDR.*--local-nodes"):
        launch_command(args, 2, "out", {})
    _, env = launch_command(args, 2, "out", {"NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1", "LOCAL_NODES": "1"})
    assert "LOCAL_NODES" not in env and env["NODE_RANK"] == "1"  # this node's share only
    _, env = launch_command(_args(["f.scale", "--local-nodes"], monkeypatch), 2, "out", {})
    assert env["LOCAL_NODES"] == "1"


def test_launch_script_keeps_quoted_torchrun_flags_whole(tmp_path):
    """launch.sh splits TORCHRUN_ARGS like a shell, without evaluating it; restarts become --max-restarts."""
    compiled = compile_spec(check_text(DP.replace("log_every    = 5", "log_every = 5  restarts = 2"), "dp.scale"))
    codegen.emit(compiled, str(tmp_path))
    fake = tmp_path / "fake" / "runtime"  # launch.sh's torchrun is `python3 -m runtime.launch`: echo its arguments
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "launch.py").write_text('import sys\nfor a in sys.argv[1:]:\n    print(f"[{a}]")\n')
    env = dict(os.environ, PYTHONPATH=str(fake.parent),
               TORCHRUN_ARGS="--log-dir 'my logs' --redirects 3 $(touch pwned)")
    out = subprocess.run(["bash", str(tmp_path / "launch.sh"), "--checkpoint-dir", "a b"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert "[my logs]" in out and "[a b]" in out and "[$(touch]" in out and not (tmp_path / "pwned").exists()
    assert out[out.index("[--max-restarts]") + 1] == "[2]"


def test_restarts_default_to_three_with_checkpoints_and_timeout_takes_units():
    spec = check_text(DP, "dp.scale")
    assert spec.train.restarts == 0 and spec.train.timeout == 600.0
    spec = check_text(DP.replace("log_every    = 5", 'log_every = 5  checkpoint_dir = "c"  timeout = "2 min"'),
                      "dp.scale")
    assert spec.train.restarts == 3 and spec.train.timeout == 120.0
    spec = check_text(DP.replace("log_every    = 5", "log_every = 5  timeout = 30"), "dp.scale")
    assert spec.train.timeout == 30.0
    with pytest.raises(ScaleError) as err:
        check_text(DP.replace("log_every    = 5", 'log_every = 5  timeout = "ten minutes"'), "dp.scale")
    assert "must be a duration" in err.value.render() and "E0120" in err.value.render()


@pytest.mark.e2e
# `--steps -3` is the slow tier: the same check as `--steps 0` (a count that is not positive)
@pytest.mark.parametrize("flag", [["--steps", "0"], pytest.param(["--steps", "-3"], marks=pytest.mark.slow),
                                  ["--stop-after", "0"]])
def test_the_program_refuses_no_steps_once_and_without_a_restart(tmp_path, flag):
    """`program.py --steps 0` trained nothing and exited 0; now it is refused with FatalError's exit code (78), which
    runtime.launch does not restart on, and the message is printed by rank 0 only."""
    import sys
    from runtime.errors import EXIT_CODE
    compiled = compile_spec(check_text((ROOT / "samples" / "tiny_gpt.scale").read_text(), "tiny_gpt.scale"))
    codegen.emit(compiled, str(tmp_path))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, str(tmp_path / "program.py"), *flag], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == EXIT_CODE, r.stderr
    assert r.stderr.count("error:") == 1 and "positive" in r.stderr and "Traceback" not in r.stderr
    quiet = subprocess.run([sys.executable, str(tmp_path / "program.py"), *flag], capture_output=True, text=True,
                           env={**env, "RANK": "1"}, timeout=300)
    assert quiet.returncode == EXIT_CODE and quiet.stderr == ""


def test_slurm_runs_launch_sbatch_inside_an_allocation_only(monkeypatch):
    args = _args(["f.scale", "--slurm", "--steps", "3"], monkeypatch)
    cmd, env = launch_command(args, 4, "out", {"SLURM_JOB_NODELIST": "gpu-a[1-4]"})
    assert cmd == ["bash", os.path.join("out", "launch.sbatch"), "--steps", "3"]
    assert env["SCALEC_BUILD_DIR"] == os.path.abspath("out") and "LOCAL_NODES" not in env
    with pytest.raises(UsageError, match="inside a SLURM allocation") as refused:
        launch_command(args, 4, "out", {})
    # the allocation the re-plan runs in must outlive a node: launch.sbatch's own `#SBATCH --no-kill` does not act
    # when `scalec run --slurm` runs it with bash inside the job
    assert "sbatch --no-kill" in str(refused.value)
    with pytest.raises(UsageError, match="--slurm and --local-nodes"):
        launch_command(_args(["f.scale", "--slurm", "--local-nodes"], monkeypatch), 4, "out",
                       {"SLURM_JOB_NODELIST": "gpu-a[1-4]"})
