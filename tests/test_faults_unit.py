"""runtime.faults without a process group: what a stuck collective is called, and the one line of a failure."""
from __future__ import annotations

from runtime import faults


def test_a_generated_call_is_named_by_its_scale_line_and_reason(tmp_path):
    program = tmp_path / "program.py"
    program.write_text("x = 1\ny = collectives.all_reduce_fwd_identity_bwd(x, 'tp')  # tp: forward all-reduce, "
                       "backward identity; row-parallel output of mlp (gpt.scale:17)\n")
    assert faults._site_text((str(program), 2)) == (
        " at gpt.scale:17 (tp: forward all-reduce, backward identity; row-parallel output of mlp)")
    assert faults._site_text((str(program), 1)) == " at program.py:1"
    assert faults._site_text(None) == ""


def test_regions_nest_and_the_innermost_is_reported():
    assert faults._CURRENT is None
    with faults.op("the backward"):
        with faults.op("all_reduce over tp (backward)", ("program.py", 3)):
            assert faults._CURRENT[:2] == ("all_reduce over tp (backward)", ("program.py", 3))
        assert faults._CURRENT[0] == "the backward"
    assert faults._CURRENT is None


def test_a_failure_is_one_line_with_where_it_happened():
    faults.set_step(4)
    with faults.op("the loss all-reduce over the batch ranks"):
        line = faults.failure_line(ValueError("bad shape\nmore detail"))
    assert line == ("scalec: rank 0 failed at step 4 in the loss all-reduce over the batch ranks: "
                    "ValueError: bad shape")


def test_a_failed_job_ends_in_two_lines_naming_the_first_failure():
    import signal

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from runtime import launch

    def failure(local_rank, exitcode, when):
        f = ProcessFailure(local_rank=local_rank, pid=100 + local_rank, exitcode=exitcode, error_file="<N/A>")
        f.timestamp = when
        return f
    exc = ChildFailedError("program.py", {0: failure(0, 1, 20), 1: failure(1, -int(signal.SIGKILL), 10),
                                          2: failure(2, 1, 30)})
    lines = launch.report(exc).splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("scalec: the job failed: rank 1 (local rank 1 on ")
    assert lines[0].endswith("failed first, killed by SIGKILL")
    assert lines[1] == "scalec: then rank 0 (exit code 1), rank 2 (exit code 1); each rank's own cause is printed above"
    only = launch.report(ChildFailedError("program.py", {3: failure(3, 2, 5)}))
    assert only.splitlines() == [only] and only.endswith("failed first, exit code 2")


def test_the_launcher_keeps_torchruns_report_under_debug(monkeypatch, capsys):
    import pytest
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from runtime import launch

    def fail(args):
        raise ChildFailedError("program.py", {0: ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file="")})
    monkeypatch.setattr(launch, "run", fail)
    assert launch.main(["--nproc-per-node", "1", "program.py", "--steps", "1"]) == 1
    assert "rank 0 (local rank 0" in capsys.readouterr().err
    with pytest.raises(ChildFailedError):
        launch.main(["--nproc-per-node", "1", "program.py", "--debug"])


def test_the_agent_does_not_restart_after_a_fatal_exit_code(monkeypatch):
    """runtime.launch's agent: a worker that exited with runtime.errors.EXIT_CODE leaves no restarts (torchrun's
    loop then ends the job) and marks the store for other agents, whose failing workers are not restarted either;
    any other failure keeps torchrun's restarts."""
    from types import SimpleNamespace

    import torch.distributed as dist
    import torch.distributed.launcher.api as launcher_api
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from runtime import launch
    from runtime.errors import EXIT_CODE

    assert launcher_api.LocalElasticAgent is launch.Agent  # the class torchrun's launch_agent builds
    outcome = {}
    monkeypatch.setattr(LocalElasticAgent, "_monitor_workers", lambda self, group: outcome["result"])

    def failed(code):
        return RunResult(state=WorkerState.FAILED,
                         failures={0: ProcessFailure(local_rank=0, pid=1, exitcode=code, error_file="")})

    store = dist.HashStore()
    this, other = launch.Agent.__new__(launch.Agent), launch.Agent.__new__(launch.Agent)
    group = SimpleNamespace(store=store)
    for agent in (this, other):
        agent._remaining_restarts = 3
    outcome["result"] = failed(1)
    assert this._monitor_workers(group).is_failed() and this._remaining_restarts == 3  # ordinary: restarted
    outcome["result"] = RunResult(state=WorkerState.HEALTHY)
    this._monitor_workers(group)
    assert this._remaining_restarts == 3
    outcome["result"] = failed(EXIT_CODE)
    assert this._monitor_workers(group).is_failed() and this._remaining_restarts == 0
    outcome["result"] = failed(1)  # the other node's worker lost its peers: the job is ending, no restart
    other._monitor_workers(group)
    assert other._remaining_restarts == 0
