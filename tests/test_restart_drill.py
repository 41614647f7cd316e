"""bench/restart_drill.py without running it (a trial costs 10-25 s of two CPU processes): its two-agent plan and
the kill schedule that alternates the killed rank."""
from __future__ import annotations

from bench import restart_drill


def test_two_nodes_build_two_torchrun_agents(tmp_path):
    launch = (restart_drill.build(tmp_path, nodes=2) / "launch.sh").read_text()
    assert "--nnodes 2" in launch and "--nproc-per-node 1" in launch and "--rdzv-backend c10d" in launch
    assert "--max-restarts 1" in launch
    assert "--nproc-per-node 2" in (restart_drill.build(tmp_path / "one", nodes=1) / "launch.sh").read_text()


def test_the_killed_rank_alternates():
    assert restart_drill.kills("1:4", "0,1", 5) == ["0:4", "1:4", "0:4", "1:4", "0:4"]
    assert restart_drill.kills("1:3", None, 2) == ["1:3", "1:3"]
