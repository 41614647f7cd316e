"""runtime.node_record: what earlier attempts saw of each node, kept in the checkpoint directory across restarts;
and the launcher's pure decisions about a node left out (runtime.launch)."""
from __future__ import annotations

import json
import multiprocessing
import os

import pytest

from runtime import errors, node_record
from runtime.node_record import NodeRecord


def test_round_trip_and_the_start_up_line(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEC_NODE", "n1")
    monkeypatch.setenv("GROUP_RANK", "1")
    rec = NodeRecord(tmp_path / "ckpt" / node_record.FILE)
    assert rec.load() == {} and node_record.startup_line(rec) is None
    rec.mark("n1", "slow", {"rank": 5, "section": "backward", "score": 0.62, "step": 140}, attempt=0)
    rec.mark("n1", "slow", {"rank": 5, "section": "backward", "score": 0.55, "step": 60}, attempt=1)
    rec.mark("n2", "unhealthy", {"rank": 2, "reasons": ["clocks held down: HW slowdown"]}, attempt=1, group_rank=0,
             host="gpu-a18")
    again = NodeRecord(rec.path)  # another attempt reads what this one wrote
    nodes = again.load()
    assert nodes["n1"][0] == {"kind": "slow", "attempt": 0, "group_rank": 1, "host": os.uname().nodename,
                              "detail": {"rank": 5, "section": "backward", "score": 0.62, "step": 140}}
    assert list(again.flagged(min_count=2)) == ["n1"] and set(again.flagged()) == {"n1", "n2"}
    assert again.excluded() == []
    assert node_record.startup_line(again) == (
        "scalec: node n1 (group rank 1, host " + os.uname().nodename + ") was slow in attempts 0 and 1 (rank 5 "
        "backward score 0.55 step 60); node n2 (group rank 0, host gpu-a18) was unhealthy in attempt 1 (clocks "
        "held down: HW slowdown)")
    again.mark("n2", "excluded", {"by": "restart(exclude = node)"}, attempt=1)
    assert NodeRecord(rec.path).excluded() == ["n2"]
    with pytest.raises(ValueError, match="kind 'fast'"):
        rec.mark("n1", "fast", {}, attempt=0)
    assert not [p for p in os.listdir(tmp_path / "ckpt") if p != node_record.FILE]  # no temporary file left


def _writer(path: str, who: int, n: int) -> None:
    rec = NodeRecord(path)
    for i in range(n):
        rec._write({"version": 1, "nodes": {f"n{who}": [{"kind": "slow", "attempt": i, "detail": "x" * 4000}]}})


def test_a_reader_never_sees_a_half_written_record(tmp_path):
    path = str(tmp_path / node_record.FILE)
    NodeRecord(path)._write({"version": 1, "nodes": {}})
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(path, w, 150)) for w in range(2)]
    for p in procs:
        p.start()
    reads, damaged = 0, []
    rec = NodeRecord(path, warn=damaged.append)
    while any(p.is_alive() for p in procs):
        rec.load()
        reads += 1
    for p in procs:
        p.join()
        assert p.exitcode == 0
    assert reads > 0 and damaged == []
    assert json.loads(open(path).read())["nodes"]  # the last whole write won
    assert os.listdir(tmp_path) == [node_record.FILE]


@pytest.mark.parametrize("text", ["{\"nodes\": [1, 2", "[]", "{\"nodes\": {\"n1\": 3}}", "\xff\xfe"])
def test_a_damaged_record_warns_once_and_reads_as_empty(tmp_path, text):
    path = tmp_path / node_record.FILE
    path.write_bytes(text.encode("latin-1"))
    said = []
    rec = NodeRecord(path, warn=said.append)
    assert rec.load() == {} and rec.flagged() == {} and node_record.startup_line(rec) is None
    assert len(said) == 1 and "is damaged" in said[0] and str(path) in said[0]
    rec.mark("n1", "unhealthy", {"reasons": ["a row remapping failed"]}, attempt=2)  # written afresh
    assert list(NodeRecord(path).load()) == ["n1"] and len(said) == 1


def test_the_exit_codes_of_an_attempt_that_leaves_out_a_node(monkeypatch):
    monkeypatch.setenv("SCALEC_NODE", "n2")
    assert node_record.leave_out("n2") == errors.EXIT_EXCLUDE
    assert node_record.leave_out("n3") == errors.EXIT_REJOIN
    assert len({errors.EXIT_CODE, errors.EXIT_EXCLUDE, errors.EXIT_REJOIN}) == 3
    assert all(64 <= c < 128 for c in (errors.EXIT_EXCLUDE, errors.EXIT_REJOIN))  # no signal's, no Python's
    monkeypatch.delenv(node_record.LEFT_OUT_ENV, raising=False)
    assert node_record.world_note() == ""
    monkeypatch.setenv(node_record.LEFT_OUT_ENV, "1")
    assert "1 node was left out" in node_record.world_note() and "`replan` is needed" in node_record.world_note()


def test_the_launcher_s_decisions():
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerState
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from runtime import launch

    def failed(*codes):
        return RunResult(state=WorkerState.FAILED, failures={
            r: ProcessFailure(local_rank=r, pid=100 + r, exitcode=c, error_file="/nonexistent")
            for r, c in enumerate(codes)})
    assert launch.exclusion(failed(errors.EXIT_EXCLUDE, errors.EXIT_EXCLUDE)) == "leave"
    assert launch.exclusion(failed(errors.EXIT_REJOIN)) == "rejoin"
    assert launch.exclusion(failed(errors.EXIT_REJOIN, 1)) is None  # a worker failed otherwise: a plain failure
    assert launch.exclusion(failed(errors.EXIT_EXCLUDE, -9)) is None
    assert launch.exclusion(RunResult(state=WorkerState.SUCCEEDED)) is None
    # 3 nodes of --nnodes 3 (min 3): one spare waiting lets the job go on; none, it ends; --nnodes 2:3 goes on
    assert launch.can_go_on(3, 1, 3) and not launch.can_go_on(3, 0, 3) and launch.can_go_on(3, 0, 2)
    assert not launch.can_go_on(3, 5, None)


class _Store:
    """A dict standing in for torchrun's store: set, and a get that must find the key (every node's first rank set
    its name before rank 0 reads: the test calls them in that order)."""

    def __init__(self):
        self.keys = {}

    def set(self, key, value):
        self.keys[key] = value.encode() if isinstance(value, str) else value

    def get(self, key):
        return self.keys[key]


def test_members_survive_marks_and_name_a_node_gone(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from runtime import leaving
    from runtime.errors import REPLAN_CODE
    record = node_record.NodeRecord.at(str(tmp_path))
    assert record.members() is None
    record.set_members(["node0", "node1", "node2", "node3"], 0)
    record.mark("node1", "slow", {"step": 3}, 0)  # a mark keeps the members
    assert record.members() == ["node0", "node1", "node2", "node3"] and "node1" in record.load()
    (tmp_path / "step_00000010").mkdir()
    (tmp_path / "step_00000010" / ".metadata").write_text("")
    replan = SimpleNamespace(on_straggler="replan")
    store = _Store()
    # the next attempt: 3 nodes of 2 processes joined, node2 did not; each node's first rank says its name
    for group, name in ((0, "node0"), (1, "node1"), (2, "node3")):
        monkeypatch.setenv("SCALEC_NODE", name)
        monkeypatch.setenv("GROUP_RANK", str(group))
        monkeypatch.setenv("LOCAL_RANK", "0")
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
        monkeypatch.setenv("RANK", str(2 * group + (group != 0)))  # rank 0 last: it reads what the others set
        if group:
            store.set(f"shrunk/node{group}", name)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("GROUP_RANK", "0")
    monkeypatch.setenv("SCALEC_NODE", "node0")
    assert leaving.shrunk(replan, str(tmp_path), 6, 8, lambda: store) == REPLAN_CODE
    got = json.loads((tmp_path / leaving.REQUEST).read_text())
    assert got["nodes"] == 4 and got["exclude"] == [2] and got["hosts"] == ["node2"] and got["step"] == 10
    assert record.load()["node2"][-1]["kind"] == "excluded"
    # not a re-plan, no members, or no checkpoint directory: the start-up refuses the world as before
    assert leaving.shrunk(SimpleNamespace(on_straggler="report"), str(tmp_path), 6, 8, lambda: store) is None
    assert leaving.shrunk(replan, "", 6, 8, lambda: store) is None
    assert leaving.shrunk(replan, str(tmp_path / "elsewhere"), 6, 8, lambda: store) is None


def test_a_crash_is_a_node_s_own_failure_not_a_victim_s_nor_a_stop():
    kill = -9
    assert node_record.crash({4: (kill, "killed by SIGKILL"), 5: (errors.EXIT_PEER, "lost a peer")}) == {
        "rank": 4, "exit": kill, "how": "killed by SIGKILL"}
    assert node_record.crash({3: (1, "exit code 1"), 2: (139, "exit code 139")})["rank"] == 2  # the lowest rank
    for benign in (errors.EXIT_PEER, errors.EXIT_CODE, errors.EXIT_EXCLUDE, errors.EXIT_REJOIN, errors.REPLAN_CODE,
                   -15, 143, -2, 130):
        assert node_record.crash({0: (benign, "")}) is None, benign
    assert errors.EXIT_PEER not in (errors.EXIT_CODE, errors.EXIT_EXCLUDE, errors.EXIT_REJOIN, errors.REPLAN_CODE)


def test_crashes_are_marked_where_some_nodes_crashed_and_a_crash_loop_is_two_attempts_in_a_row(tmp_path):
    seen = {"rank": 4, "exit": -9, "how": "killed by SIGKILL"}
    world = [{"name": f"node{r // 2}", "crashed": seen if r // 2 == 2 else None} for r in range(8)]
    assert node_record.crashed_nodes(world) == {"node2": seen}
    assert node_record.crashed_nodes([dict(w, crashed=seen) for w in world]) == {}  # every node: the job's failure
    assert node_record.crashed_nodes([dict(w, crashed=None) for w in world]) == {}
    rec = NodeRecord(tmp_path / node_record.FILE)
    rec.mark("node2", "crashed", seen, attempt=0, group_rank=2, host="h")
    rec.mark("node1", "crashed", seen, attempt=0)
    rec.mark("node1", "crashed", seen, attempt=2)  # not in a row: bad luck twice, not a loop
    assert rec.crash_looping(2) == {} and set(rec.crash_looping(1)) == {"node1", "node2"}
    assert rec.flagged() == {}  # slow and unhealthy only
    rec.mark("node2", "crashed", seen, attempt=1, group_rank=2, host="h")
    assert list(rec.crash_looping(2)) == ["node2"]
    assert node_record.describe("node2", rec.load()["node2"]) == (
        "node node2 (group rank 2, host h) was crashing in attempts 0 and 1 (rank 4 killed by SIGKILL)")


def test_the_agent_passes_its_node_s_crash_to_the_workers_it_starts_next(monkeypatch, capsys):
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerState
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from runtime import faults, launch

    def failed(*codes):
        return RunResult(state=WorkerState.FAILED, failures={
            4 + r: ProcessFailure(local_rank=r, pid=100 + r, exitcode=c, error_file="/nonexistent")
            for r, c in enumerate(codes)})
    monkeypatch.setenv("SCALEC_NODE", "node2")
    monkeypatch.delenv(node_record.CRASHED_ENV, raising=False)
    launch._note_crash(failed(-9, errors.EXIT_PEER))
    assert node_record.crash_report() == {"rank": 4, "exit": -9, "how": "killed by SIGKILL"}
    assert "node node2's workers crashed (rank 4, killed by SIGKILL)" in capsys.readouterr().err
    launch._note_crash(failed(errors.EXIT_PEER, errors.EXIT_PEER))  # a victim this time: nothing to pass on
    assert node_record.crash_report() is None
    assert "exit code 82 (lost a peer" in launch.how(failed(errors.EXIT_PEER).failures[4])
    # a worker's failure in a collective whose peer is gone is a victim's (runtime.train exits EXIT_PEER)
    assert faults.lost_peer(RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [::1]:4"))
    assert not faults.lost_peer(ValueError("bad shape"))
