"""launch.sbatch, the SLURM batch job `scalec compile` writes beside launch.sh: rendered for the cluster the mesh
names, valid bash, and, run under a stand-in SLURM (no SLURM here: `srun` and `scontrol` are scripts on PATH that
record what they are given), the same torchrun command as launch.sh's, one per node, meeting at the allocation's
first node under the job's id."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from compiler import codegen
from compiler.check import check_text
from compiler.pipeline import compile_spec

ROOT = Path(__file__).resolve().parents[1]


def _emit(text: str, out: Path, name: str = "case.scale") -> Path:
    codegen.emit(compile_spec(check_text(text, name)), str(out))
    return out / "launch.sbatch"


def _directives(script: Path) -> list:
    """The #SBATCH lines sbatch reads: those before the first command."""
    out = []
    for line in script.read_text().splitlines():
        if line.startswith("#SBATCH "):
            out.append(line.removeprefix("#SBATCH "))
        elif line.strip() and not line.startswith("#"):
            break
    return out


def _two_nodes() -> str:
    text = (ROOT / "samples" / "gpt_dp.scale").read_text()
    assert "nodes = 1" in text and "devices_per_node = 2" in text
    return text.replace("nodes = 1", "nodes = 2").replace("devices_per_node = 2", "devices_per_node = 1")


def test_the_directives_name_the_mesh_s_cluster(tmp_path):
    cpu = _emit(_two_nodes(), tmp_path / "cpu")
    assert _directives(cpu) == ["--job-name=scalec-gpt_dp", "--nodes=2", "--ntasks-per-node=1"]
    gpu = _emit((ROOT / "samples" / "llama3_8b.scale").read_text(), tmp_path / "gpu", "llama3_8b.scale")
    assert "--gpus-per-node=8" in _directives(gpu)  # 8 h100 per node: torchrun starts 8 processes on each
    for script in (cpu, gpu):
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
        assert os.access(script, os.X_OK)


def _slurm(tmp_path: Path, nodes: str, srun_then: str = "") -> dict:
    """A stand-in SLURM on PATH: `scontrol show hostnames` prints two hosts, `srun` records its arguments (one per
    line) in srun.args instead of starting anything, then runs `srun_then`; `sbatch` records its arguments, its
    directory and SCALEC_RESUBMITS in sbatch.args."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "scontrol").write_text('#!/usr/bin/env bash\n[ "$1 $2" = "show hostnames" ] && printf "gpu-a17\\ngpu-a18\\n"\n')
    (bin_ / "srun").write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$@" > {tmp_path / "srun.args"}\n{srun_then}\n')
    (bin_ / "sbatch").write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$PWD" "$SCALEC_RESUBMITS" "$@" > '
                                 f'{tmp_path / "sbatch.args"}\n')
    for f in bin_.iterdir():
        f.chmod(0o755)
    return dict(os.environ, PATH=f"{bin_}:{os.environ['PATH']}", SLURM_JOB_NODELIST="gpu-a[17-18]",
                SLURM_JOB_NUM_NODES=nodes, SLURM_JOB_ID="4242", TORCHRUN_ARGS="--log-dir 'my logs'")


def test_a_dry_run_starts_launch_sh_s_torchrun_on_each_node(tmp_path):
    build = tmp_path / "build"
    script = _emit(_two_nodes(), build)
    spool = tmp_path / "spool"  # sbatch runs a copy from its spool directory, in the directory it was submitted from
    spool.mkdir()
    shutil.copy(script, spool / "slurm_script")
    env = _slurm(tmp_path, "2")
    env["SLURM_SUBMIT_DIR"] = str(build)
    proc = subprocess.run(["bash", str(spool / "slurm_script"), "--steps", "3", "--metrics", "m.jsonl"], cwd=build,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    args = (tmp_path / "srun.args").read_text().splitlines()
    assert args == ["--ntasks-per-node=1", "--kill-on-bad-exit=1", "python3", "-m", "runtime.launch",
                    "--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "0", "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", "gpu-a17:29500", "--rdzv-id", "4242", "--log-dir", "my logs",
                    f"{build}/program.py", "--steps", "3", "--metrics", "m.jsonl"]
    # launch.sh's multi-node command, word for word, but for the rendezvous SLURM provides
    launch = (build / "launch.sh").read_text()
    for words in ("--nnodes 2", "--nproc-per-node 1", "--max-restarts 0", "--rdzv-backend c10d"):
        assert words in launch


@pytest.mark.parametrize("case", ["wrong node count", "no slurm", "no program"])
def test_a_job_that_cannot_run_the_plan_says_why(tmp_path, case):
    build = tmp_path / "build"
    script = _emit(_two_nodes(), build)
    env = _slurm(tmp_path, "1" if case == "wrong node count" else "2")
    env["SLURM_SUBMIT_DIR"] = str(tmp_path if case == "no program" else build)
    if case == "no slurm":
        del env["SLURM_JOB_NODELIST"]
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and not (tmp_path / "srun.args").exists()
    assert {"wrong node count": "has 1 node(s) but the plan's mesh needs 2",
            "no slurm": "without SLURM use launch.sh",
            "no program": "no program.py in"}[case] in proc.stderr


def _submit(tmp_path: Path, nodes: str, srun_then: str, env_extra: dict = ()) -> tuple:
    """Run launch.sbatch (two-node plan) under the stand-in SLURM: (its process, srun's args, sbatch's record)."""
    build = tmp_path / "build"
    script = _emit(_two_nodes(), build)
    env = dict(_slurm(tmp_path, nodes, srun_then), SLURM_SUBMIT_DIR=str(build), SLURM_JOB_PARTITION="gpu",
               **dict(env_extra))
    proc = subprocess.run(["bash", str(script), "--steps", "3"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    srun = (tmp_path / "srun.args").read_text().splitlines()
    again = (tmp_path / "sbatch.args").read_text().splitlines() if (tmp_path / "sbatch.args").exists() else None
    return proc, srun, again, build


def test_more_nodes_than_the_mesh_s_wait_as_spares(tmp_path):
    proc, srun, again, _ = _submit(tmp_path, "3", "exit 0")
    assert proc.returncode == 0 and again is None, proc.stderr
    assert srun[srun.index("--nnodes") + 1] == "2"  # torchrun takes 2; the third waits in its rendezvous


LEAVE = 'echo gpu-a18 >> "$SCALEC_EXCLUDED_HOSTS"; exit '  # the agent of the node left out, then the job's status


@pytest.mark.parametrize("status", ["79", "137"])
def test_a_job_that_left_a_node_out_submits_itself_again_without_it(tmp_path, status):
    proc, _, again, build = _submit(tmp_path, "2", LEAVE + status)
    assert proc.returncode == int(status), proc.stderr
    assert "gpu-a18 left out (restart(exclude = node)): submitting this job again without it" in proc.stderr
    assert again == [str(build), "1", "--exclude=gpu-a18", "--nodes=2", "--dependency=afterany:4242",
                     "--partition=gpu", "launch.sbatch", "--steps", "3"]
    assert (build / "excluded_hosts").read_text() == "gpu-a18\n"


@pytest.mark.parametrize("case", ["went on with a spare", "fatal", "no node left out", "resubmitted enough"])
def test_no_resubmission_where_none_is_due(tmp_path, case):
    srun_then, extra = {"went on with a spare": (LEAVE + "0", {}), "fatal": (LEAVE + "78", {}),
                        "no node left out": ("exit 79", {}),
                        "resubmitted enough": (LEAVE + "79", {"SCALEC_RESUBMITS": "3"})}[case]
    proc, _, again, build = _submit(tmp_path, "2", srun_then, extra)
    assert again is None, proc.stderr
    if case == "resubmitted enough":
        assert "submitted again 3 time(s) already (SCALEC_MAX_RESUBMITS): not again" in proc.stderr
