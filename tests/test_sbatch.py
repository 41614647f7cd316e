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


def _submit(tmp_path: Path, nodes: str, srun_then: str, env_extra: dict = (), text: str | None = None) -> tuple:
    """Run launch.sbatch (two-node plan, or `text`) under the stand-in SLURM: (its process, srun's args, sbatch's
    record)."""
    build = tmp_path / "build"
    script = _emit(text or _two_nodes(), build)
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


def _replan() -> str:
    """The two-node plan with `on_straggler = replan` (and the checkpoint directory it needs)."""
    text = _two_nodes().replace("  log_every    = 5", '  log_every    = 5\n  checkpoint_dir = "ckpt"')
    return text + "\nresilience {\n  on_straggler = replan\n}\n"


def test_under_replan_a_node_that_fails_does_not_end_the_job(tmp_path):
    """sbatch and srun --no-kill keep the allocation and the step when a node fails, --kill-on-bad-exit=0 keeps the
    other tasks, and torchrun forms with one node fewer (launch.sh's --nnodes 1:2)."""
    script = _emit(_replan(), tmp_path / "plan")
    assert "--no-kill" in _directives(script)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    proc, srun, again, build = _submit(tmp_path, "2", "exit 0", text=_replan())
    assert proc.returncode == 0 and again is None, proc.stderr
    assert srun[:3] == ["--ntasks-per-node=1", "--no-kill", "--kill-on-bad-exit=0"]
    assert srun[srun.index("--nnodes") + 1] == "1:2"
    assert "re-planned" not in proc.stderr


def test_the_nodes_left_asking_for_a_re_plan_make_it_the_job_s_status(tmp_path):
    """The nodes left end with 81 and say so (SCALEC_REPLAN_HOSTS); srun's own status is the highest of its tasks',
    here a node gone's (137): the job ends with 81, which `scalec run --slurm` reads to re-plan."""
    then = 'echo gpu-a17 >> "$SCALEC_REPLAN_HOSTS"; exit 137'
    proc, _, again, build = _submit(tmp_path, "2", then, text=_replan())
    assert proc.returncode == 81 and again is None, proc.stderr
    assert "ended to be re-planned on the nodes left (status 81)" in proc.stderr


def test_hosts_left_out_earlier_in_the_allocation_get_no_task(tmp_path):
    """SCALEC_SLURM_EXCLUDE (set by `scalec run --slurm` after a re-plan): srun excludes those hosts and runs on the
    others; the allocation's nodes less those must still hold the plan's."""
    proc, srun, _, _ = _submit(tmp_path, "3", "exit 0", {"SCALEC_SLURM_EXCLUDE": "gpu-a19"})
    assert proc.returncode == 0, proc.stderr
    assert srun[:3] == ["--exclude=gpu-a19", "--nodes=2", "--ntasks-per-node=1"]
    build = tmp_path / "again"
    script = _emit(_two_nodes(), build)
    env = dict(_slurm(tmp_path / "again", "2"), SLURM_SUBMIT_DIR=str(build), SCALEC_SLURM_EXCLUDE="gpu-a18")
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "has 1 node(s) but the plan's mesh needs 2" in proc.stderr


def test_the_rendezvous_is_on_a_host_not_left_out(tmp_path):
    """A re-plan that left out the allocation's first host (a straggler on it, say): the new plan's agents meet on
    the first host srun still starts one on, not on the host excluded, where no agent would hold the store."""
    proc, srun, _, _ = _submit(tmp_path, "3", "exit 0", {"SCALEC_SLURM_EXCLUDE": "gpu-a17"})
    assert proc.returncode == 0, proc.stderr
    assert srun[:2] == ["--exclude=gpu-a17", "--nodes=2"]
    assert srun[srun.index("--rdzv-endpoint") + 1] == "gpu-a18:29500"
