"""Re-planning on the nodes left (compiler/replan.py) and `scalec run`'s loop that launches the new plan when a run
asks for it (compiler/run_command.py `replanning`), without launching anything: the search on fewer nodes, the
file written beside the old one, the request consumed, the node ranks renumbered, the refusals."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from compiler import run_command
from compiler.check import check_path
from compiler.cli import main
from compiler.replan import ReplanError, replan, replanned_path
from runtime.errors import REPLAN_CODE
from tests.e2e.runner import ROOT

DP = (ROOT / "samples" / "gpt_dp.scale").read_text()


def _file(tmp_path, nodes=2, per=1, ckpt=True) -> str:
    text = DP.replace("axis dp = 2", f"axis dp = {nodes * per}").replace("nodes = 1", f"nodes = {nodes}").replace(
        "devices_per_node = 2", f"devices_per_node = {per}")
    if ckpt:
        text = text.replace("  log_every    = 5", '  log_every    = 5\n  checkpoint_dir = "ckpt"')
    path = tmp_path / "gpt_dp.scale"
    path.write_text(text)
    return str(path)


def _args(program_args=()):
    return SimpleNamespace(program_args=list(program_args), torchrun_string=None, local_nodes=True, steps=None,
                           metrics=None, resume_changed=None, resume_schedule=None)


def test_replan_writes_the_fastest_plan_on_the_nodes_left_beside_the_file(tmp_path):
    path = _file(tmp_path, nodes=4, per=1)
    got = replan(path, 2)
    assert got.path == str(tmp_path / "gpt_dp.nodes2.scale") == replanned_path(path, 2)
    spec = check_path(got.path)
    assert (spec.cluster.nodes, spec.cluster.devices_per_node, spec.plan.world_size) == (2, 1, 2)
    assert spec.value(spec.train.global_batch) == 16 and spec.train.checkpoint_dir == "ckpt"  # sections as written
    assert got.old_step_s is not None and got.new_step_s > 0
    assert "re-planned on 2 of 4 nodes (node 2 slow)" in got.line("node 2 slow")
    # a re-plan of the re-plan is named after the first file
    assert replanned_path(got.path, 1) == str(tmp_path / "gpt_dp.nodes1.scale")


def test_replan_where_no_plan_fits_says_how_to_see_why(tmp_path):
    with pytest.raises(ReplanError, match=r"no plan of gpt_dp fits 3 node\(s\).*--nodes 3` says why"):
        replan(_file(tmp_path, nodes=4, per=1), 3)  # a global batch of 16 over 3 devices


def test_replan_refuses_no_node_left_and_more_nodes(tmp_path):
    path = _file(tmp_path)
    with pytest.raises(ReplanError, match="no node is left"):
        replan(path, 0)
    with pytest.raises(ReplanError, match="only takes nodes away"):
        replan(path, 3)


def test_run_replans_on_request_and_launches_the_new_plan(tmp_path, capsys):
    path = _file(tmp_path, nodes=2, per=1)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "replan.json").write_text(json.dumps(
        {"nodes": 2, "exclude": [1], "hosts": ["node1"], "why": "node 1 slow in backward", "step": 4}))
    launched, emitted = [], []

    def launch(cmd, env):
        launched.append((cmd, env))
        return 0

    def load(p):
        return SimpleNamespace(spec=check_path(p), costs=SimpleNamespace(step=None))

    compiled = SimpleNamespace(spec=check_path(path), costs=SimpleNamespace(step=SimpleNamespace(step_time_s=0.0123)))
    status = run_command.replanning(_args(), compiled, str(tmp_path / "build"), REPLAN_CODE, launch, load,
                                    lambda c, out: emitted.append((c.spec.cluster.nodes, out)), {})
    assert status == 0
    assert emitted == [(1, str(tmp_path / "build.nodes1"))]
    assert launched[0][0][:2] == ["bash", str(tmp_path / "build.nodes1" / "launch.sh")]
    assert launched[0][1]["SCALEC_LOCAL_NODE_NAMES"] == "node0"  # node1, left out, is not started again
    out = capsys.readouterr().out
    assert "re-planned on 1 of 2 nodes (node 1 slow in backward)" in out
    assert "predicted step 0.0123 s →" in out  # the running plan's own prediction, not compiled again
    # the request is consumed: kept under its step, not read again
    assert not (tmp_path / "ckpt" / "replan.json").exists()
    assert json.loads((tmp_path / "ckpt" / "replan.step4.json").read_text())["exclude"] == [1]


def test_run_without_a_request_does_not_replan(tmp_path, capsys):
    path = _file(tmp_path)
    compiled = SimpleNamespace(spec=check_path(path))
    status = run_command.replanning(_args(), compiled, "build", REPLAN_CODE, None, None, None, {})
    assert status == REPLAN_CODE
    assert "left no request" in capsys.readouterr().err
    # any other status is the launch's own
    assert run_command.replanning(_args(), compiled, "build", 1, None, None, None, {}) == 1


def test_checkpoint_dir_of_a_run_flag_first_then_the_file(tmp_path):
    spec = check_path(_file(tmp_path))
    assert run_command.checkpoint_dir(spec, ["--checkpoint-dir", "elsewhere"]) == "elsewhere"
    assert run_command.checkpoint_dir(spec, ["--checkpoint-dir=x"]) == "x"
    assert run_command.checkpoint_dir(spec, []) == str(tmp_path / "ckpt")
    assert run_command.checkpoint_dir(check_path(_file(tmp_path, ckpt=False)), []) is None


def test_this_node_renumbers_the_nodes_left_and_ends_the_one_left_out():
    request = {"nodes": 4, "exclude": [2]}
    assert run_command.this_node(request, {}) == (None, None)  # every node here (--local-nodes) or one node
    assert run_command.this_node(request, {"NODE_RANK": "3"}) == ("2", None)
    assert run_command.this_node(request, {"NODE_RANK": "1"}) == ("1", None)
    assert "left out" in run_command.this_node(request, {"NODE_RANK": "2"})[1]
    assert "MASTER_ADDR" in run_command.this_node({"nodes": 4, "exclude": [0]}, {"NODE_RANK": "1"})[1]


def test_a_damaged_request_is_named_not_followed(tmp_path, capsys):
    (tmp_path / "replan.json").write_text("{not json")
    assert run_command.read_request(str(tmp_path)) is None
    assert "cannot be read" in capsys.readouterr().err


def test_search_on_other_nodes(tmp_path, capsys):
    assert main(["search", _file(tmp_path, nodes=2, per=1), "--nodes", "1", "--top", "1"]) == 0
    assert "on 1 cpu = 1 node × 1" in capsys.readouterr().out


def test_on_slurm_the_new_plan_runs_in_the_same_allocation_without_the_hosts_left_out(tmp_path, capsys):
    """`scalec run --slurm`: the re-planned build's launch.sbatch, told the hosts to leave out (srun --exclude)."""
    path = _file(tmp_path, nodes=2, per=1)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "replan.json").write_text(json.dumps(
        {"nodes": 2, "exclude": [1], "hosts": ["gpu-a18"], "why": "gpu-a18 did not join", "step": 5}))
    launched = []

    def launch(cmd, env):
        launched.append((cmd, env))
        return 0

    def load(p):
        return SimpleNamespace(spec=check_path(p), costs=SimpleNamespace(step=None))
    args = SimpleNamespace(**{**vars(_args()), "local_nodes": False, "slurm": True})
    compiled = SimpleNamespace(spec=check_path(path), costs=SimpleNamespace(step=None))
    environ = {"SLURM_JOB_NODELIST": "gpu-a[17-19]", run_command.SLURM_EXCLUDE: "gpu-a19"}
    status = run_command.replanning(args, compiled, str(tmp_path / "build"), REPLAN_CODE, launch, load,
                                    lambda c, out: None, environ)
    assert status == 0
    cmd, env = launched[0]
    assert cmd[:2] == ["bash", str(tmp_path / "build.nodes1" / "launch.sbatch")]
    assert env[run_command.SLURM_EXCLUDE] == "gpu-a19,gpu-a18"  # an earlier re-plan's host, then this one's
    assert env["SCALEC_BUILD_DIR"] == str(tmp_path / "build.nodes1")
