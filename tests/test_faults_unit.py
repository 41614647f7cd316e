"""runtime.faults without a process group: what a stuck collective is called, and the one line of a failure."""
from __future__ import annotations

import pytest

from compiler.layout.groups import groups
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


def test_a_re_plan_with_workers_the_agent_stopped_is_still_a_re_plan(monkeypatch, capsys):
    """Every worker ends with REPLAN_CODE after rank 0 asked, but the agent stops a node's others (SIGTERM) when the
    first ends: the job still ends asking for the re-plan; a re-plan beside another failure does not."""
    import signal as S

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from runtime import launch
    from runtime.errors import REPLAN_CODE

    def ends(*codes):
        def fail(args):
            raise ChildFailedError("program.py", {i: ProcessFailure(local_rank=i, pid=1, exitcode=c, error_file="")
                                                  for i, c in enumerate(codes)})
        monkeypatch.setattr(launch, "run", fail)
        return launch.main(["--nproc-per-node", str(len(codes)), "program.py"])
    assert ends(REPLAN_CODE, -int(S.SIGTERM)) == REPLAN_CODE
    assert ends(REPLAN_CODE, REPLAN_CODE) == REPLAN_CODE
    assert ends(REPLAN_CODE, 1) == 1
    assert ends(-int(S.SIGTERM)) == 1


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


def test_every_operation_the_watchdog_times_names_its_scale_lines():
    """Each `faults.op(...)` the runtime opens passes a site: a generated call's, or the `.scale` lines the program
    gave (faults.scale, faults.axis_site); `device_wait` names the last collective's. Found by reading the runtime's
    source, so a new timed operation without one fails here."""
    import ast
    from pathlib import Path

    import runtime
    sites, bare = 0, []
    for path in sorted(Path(runtime.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            is_op = ((isinstance(f, ast.Attribute) and f.attr == "op" and getattr(f.value, "id", "") == "faults")
                     or (path.name == "faults.py" and isinstance(f, ast.Name) and f.id == "op"))
            if not is_op:
                continue
            sites += 1
            site = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "site"),
                                                                 None)
            if site is None or (isinstance(site, ast.Constant) and site.value is None):
                bare.append(f"{path.name}:{node.lineno}")
    assert sites >= 20 and not bare, f"timed operations that name no .scale line: {bare}"


def _sources(text: str, name: str):
    from compiler import codegen
    from compiler.check import check_text
    spec = check_text(text, name)
    return codegen.sources(spec, spec.plan)


def test_the_runtimes_collectives_name_the_lines_of_their_axis_and_setting(monkeypatch):
    """The lines the program gives (Config.sources) and what each runtime operation names: DDP the dp axis and
    `data_parallel`; FSDP the `data_parallel` line (the dp axis when not written); the pipeline the pp axis and
    `schedule`; a runtime-issued tp collective its axis; anything else (or nothing given) the mesh section."""
    from pathlib import Path

    from runtime import parallelize
    root = Path(__file__).resolve().parents[1]

    def at(text, name, needle):
        return f"{name}:{next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)}"
    dp = (root / "samples" / "gpt_dp.scale").read_text()
    axis, setting, mesh = at(dp, "dp.scale", "axis dp"), at(dp, "dp.scale", "data_parallel ="), at(dp, "dp.scale",
                                                                                                    "mesh {")
    monkeypatch.setattr(faults, "_SOURCES", {})
    faults.set_sources(_sources(dp, "dp.scale"))
    assert parallelize.site(False) == f"{axis} (axis dp = 2), {setting} (data_parallel = ddp)"
    assert faults.scale("axis dp", "axis ep") == f"{axis} (axis dp = 2)"
    assert faults.scale("checkpoint_dir") == faults.scale() == f"{mesh} (the mesh section)"
    assert faults.axis_site(None, "dp") == f"{axis} (axis dp = 2)"
    assert faults.axis_site(("program.py", 3), "dp") == ("program.py", 3)
    faults.set_sources(_sources(dp.replace("data_parallel = ddp", "data_parallel = fsdp"), "dp.scale"))
    assert parallelize.site(True) == f"{setting} (data_parallel = fsdp)"
    faults.set_sources(_sources(dp.replace("data_parallel = ddp", "# data_parallel"), "dp.scale"))
    assert parallelize.site(True) == f"{axis} (axis dp = 2)"
    pp = (root / "samples" / "gpt_pp.scale").read_text().replace("log_every", 'checkpoint_dir = "ck"\n  log_every')
    faults.set_sources(_sources(pp, "pp.scale"))
    assert faults.scale("axis pp", "schedule") == (f'{at(pp, "pp.scale", "axis pp")} (axis pp = 2), '
                                                   f'{at(pp, "pp.scale", "schedule =")} (schedule = "1f1b")')
    assert faults.scale("checkpoint_dir", "checkpoint_every") == f'{at(pp, "pp.scale", "ck")} (checkpoint_dir = "ck")'
    assert faults.scale("grad_clip") == f'{at(pp, "pp.scale", "grad_clip")} (grad_clip = 1.0)'
    assert faults._site_text(faults.scale("axis tp")) == f' at {at(pp, "pp.scale", "mesh {")} (the mesh section)'


def test_the_programs_train_main_line_is_not_a_collectives_site(tmp_path):
    """A collective the runtime issues from the loop has the program's `train.main(...)` line under it on the
    stack: not the model's code, so no site (the runtime names the axis instead)."""
    program = tmp_path / "program.py"
    program.write_text("from runtime import faults\ndef forward():\n    return faults.caller_site(1)\n"
                       "site = faults.caller_site(1)\ninner = forward()\n")
    scope = {}
    exec(compile(program.read_text(), str(program), "exec"), scope)
    assert scope["site"] is None and scope["inner"] == (str(program), 3)


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_world_of_the_wrong_size_ends_without_a_restart(monkeypatch, capsys, rank):
    """torchrun started 3 processes for a dp = 2 program: the same on every attempt, so the exit code is the one the
    launcher does not restart on (runtime.errors), and only rank 0 says why; the others leave after it."""
    from runtime import errors, mesh
    from runtime.errors import EXIT_CODE
    slept = []
    monkeypatch.setattr(errors.time, "sleep", slept.append)
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(SystemExit) as info:
        mesh.setup((("dp", 2),), 60.0, groups((("dp", 2),)).contract())
    assert info.value.code == EXIT_CODE
    err = capsys.readouterr().err
    assert ("needs 2 processes (dp=2), but torchrun started 3" in err) == (rank == "0") and err.count("\n") <= 1
    assert slept == ([] if rank == "0" else [errors.FOLLOWER_GRACE_S])
