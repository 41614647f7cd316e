"""torchrun as launch.sh starts it: torch's own elastic launcher, with the end of a failed job told in a few lines.

    python3 -m runtime.launch [torchrun flags] program.py [program flags]

Everything is torchrun's (`torch.distributed.run`): its flags, rendezvous, restarts (`--max-restarts`), signal
forwarding. Only the report differs. When workers fail for good, torchrun's command-line entry prints a Python
traceback of its own and a table of failures, after the workers' one-line causes; here it is one line naming the
rank that failed first (torchrun's "root cause") and how, and one line for the others. With `--debug` among the
program flags torchrun's full report is printed as well.

One change to torchrun's restarts: a worker that exits with `runtime.errors.EXIT_CODE` met a failure that every
restart would meet again (a checkpoint of another model, a missing init file: `runtime.errors.FatalError`), so the
agent does not restart the job and ends it at once. With several agents (nodes), the one that sees it also marks it
in the rendezvous store, and another agent whose workers failed for any reason in that round does not restart
either (its workers failed because the job is ending).

A node whose workers crash (a failure of theirs, not a peer's failure reaching them: runtime.errors.EXIT_PEER):
its agent passes how to the workers it starts next (runtime.node_record.CRASHED_ENV), and their rank 0 records it.

Leaving out a node (`restart(exclude = node)`, runtime.node_record.leave_out): the workers end the attempt on
purpose, those on the node to leave out with `runtime.errors.EXIT_EXCLUDE`, the others with `EXIT_REJOIN`. The first
agent to see either decides, once per rendezvous round (in its store), whether the job can go on: it can when the
nodes left plus the spares waiting in the rendezvous (torchrun's redundancy and wait lists: agents started beyond
`--nnodes`' maximum) reach `--nnodes`' minimum. Then the agent of the node left out leaves the rendezvous (torch's
own exit operation, without closing it) and waits, its workers stopped, until the job ends, then exits 0; the
others restart their workers at once, which is not counted among `--max-restarts`, and the next round forms
without it (a spare takes its place: the same world, the plan resumes from its last checkpoint; no spare and a
smaller minimum: a smaller world, which the program refuses at start-up saying a `replan` is needed). Otherwise every
agent ends the job with EXIT_EXCLUDE, and the node left out writes its host name to the file SCALEC_EXCLUDED_HOSTS
names, where set: launch.sbatch submits the job again without those hosts (`sbatch --exclude`).

The job's start is exported to the workers as SCALEC_LAUNCH_TIME (seconds since the epoch; runtime.progress.LAUNCH_TIME),
unless already set (a multi-node job may set one time for all nodes): the log's elapsed time and `done in` count
from it, start-up and restarts included.
"""
from __future__ import annotations

import os
import time

# Before torch's import (a second or more): runtime.progress.LAUNCH_TIME, inherited by every worker.
os.environ.setdefault("SCALEC_LAUNCH_TIME", repr(time.time()))

import json  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402

import torch.distributed.launcher.api as launcher_api  # noqa: E402
from torch.distributed.elastic.agent.server.api import (  # noqa: E402
    DEFAULT_ROLE, RunResult, WorkerGroup, WorkerState)
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent  # noqa: E402
from torch.distributed.elastic.multiprocessing.api import SignalException  # noqa: E402
from torch.distributed.elastic.rendezvous.api import (  # noqa: E402
    RendezvousClosedError, RendezvousConnectionError, RendezvousInfo, RendezvousStoreInfo)
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure  # noqa: E402
from torch.distributed.run import parse_args, run  # noqa: E402

from runtime.errors import EXIT_CODE, EXIT_EXCLUDE, EXIT_PEER, EXIT_REJOIN, REPLAN_CODE  # noqa: E402
from runtime.faults import TERM_GRACE  # noqa: E402
from runtime.node_record import CRASHED_ENV, LEFT_OUT_ENV, crash  # noqa: E402

_FATAL_KEY = "scalec/fatal"  # in the rendezvous store of the round: some worker of the job exited with EXIT_CODE
_EXCLUDE_KEY = "scalec/exclude"  # in the rendezvous store of the round: "go on" or "end", the first agent's decision
EXCLUDED_HOSTS_ENV = "SCALEC_EXCLUDED_HOSTS"  # a file the agent of a node left out appends its host name to
REPLAN_HOSTS_ENV = "SCALEC_REPLAN_HOSTS"  # a file each agent whose job ends to be re-planned appends its host name to


def fatal(result: RunResult) -> bool:
    """Whether a worker of `result` exited with EXIT_CODE (a failure no restart can fix) or REPLAN_CODE (the run
    ended to be re-planned: `scalec run` does that, not a restart of the same plan)."""
    return result.is_failed() and any(f.exitcode in (EXIT_CODE, REPLAN_CODE) for f in result.failures.values())


def exclusion(result: RunResult) -> str | None:
    """'leave' where a worker of `result` exited with EXIT_EXCLUDE (this node is the one left out), 'rejoin' where
    every failure is EXIT_REJOIN (another node is), None for any other failure."""
    if not result.is_failed():
        return None
    codes = {f.exitcode for f in result.failures.values()}
    if EXIT_EXCLUDE in codes and codes <= {EXIT_EXCLUDE, EXIT_REJOIN}:
        return "leave"
    return "rejoin" if codes == {EXIT_REJOIN} else None


def can_go_on(nodes: int, spares: int, min_nodes: int | None) -> bool:
    """Whether a job of `nodes` nodes can go on without one of them: the nodes left and the `spares` waiting reach
    torchrun's minimum (`--nnodes MIN:MAX`; None: unknown, it cannot)."""
    return min_nodes is not None and nodes - 1 + spares >= min_nodes


def one_store(handler) -> None:
    """Make every agent of a rendezvous round give its workers the same store (MASTER_ADDR, MASTER_PORT).

    torch 2.13's dynamic rendezvous shares its agents' TCPStore with the workers: the agent of group rank 0 starts
    a server and publishes its address in the round's store, but only in an agent's first round or when it becomes
    rank 0 without a server of its own (dynamic_rendezvous.py, `next_rendezvous`). A node that joins a later round
    (a spare taking the place of a node left out) then waits for an address nobody publishes, and an agent that was
    not rank 0 keeps the address of its first round's. Here rank 0 publishes its own every round, and every other
    agent reads it; a handler that does not share its store (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1) is left alone."""
    original = handler.next_rendezvous

    def next_rendezvous() -> RendezvousInfo:
        info = original()
        boot = info.bootstrap_store_info
        if not getattr(handler, "use_agent_store", False) or boot is None:
            return info
        addr_key, port_key = RendezvousStoreInfo.MASTER_ADDR_KEY, RendezvousStoreInfo.MASTER_PORT_KEY
        if info.rank == 0:
            info.store.set(addr_key, boot.master_addr.encode())
            info.store.set(port_key, str(boot.master_port).encode())
            return info
        addr, port = info.store.get(addr_key).decode(), int(info.store.get(port_key).decode())
        if (addr, port) == (boot.master_addr, boot.master_port):
            return info
        return RendezvousInfo(info.store, info.rank, info.world_size, RendezvousStoreInfo(addr, port))

    handler.next_rendezvous = next_rendezvous


class _LeftOut(Exception):
    """This node is the one left out and the job goes on without it: the agent leaves (Agent.run)."""


class Agent(LocalElasticAgent):
    """torchrun's agent, which does not restart a job whose workers failed for good (module docstring).

    torch's loop (`SimpleElasticAgent._invoke_run`) restarts a FAILED worker group while `_remaining_restarts > 0`;
    the monitor it calls each interval is the one place that sees the exit codes before that decision, so this
    agent's monitor sets the restarts left to 0 when the failure is fatal, here or (through the store) elsewhere."""

    started = False  # whether this agent ever started workers (a spare never needed did not)

    def __init__(self, spec, *args, **kwargs):
        super().__init__(spec, *args, **kwargs)
        one_store(spec.rdzv_handler)

    def _start_workers(self, worker_group: WorkerGroup):
        Agent.started = True
        try:
            return super()._start_workers(worker_group)
        finally:  # the workers started have it in their environment; a later start does not
            os.environ.pop(CRASHED_ENV, None)

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        result = super()._monitor_workers(worker_group)
        if not result.is_failed():
            return result
        if fatal(result):
            self._remaining_restarts = 0
            self._mark(worker_group)
            return result
        how = exclusion(result)
        if how is not None:
            return self._exclude(worker_group, result, how)
        _note_crash(result)
        if self._remaining_restarts > 0 and self._marked(worker_group):
            self._remaining_restarts = 0
        return result

    def _exclude(self, worker_group: WorkerGroup, result: RunResult, how: str) -> RunResult:
        """The attempt ended to leave out a node (module docstring): leave, restart without counting, or end."""
        if how == "leave":
            _note_host()
        if self._decide(worker_group) == "go on":
            if how == "leave":
                raise _LeftOut()
            self._remaining_restarts += 1  # torch's loop takes one back: this restart is not counted
            print(f"scalec: a node was left out (restart(exclude = node)): node {_node()} restarts its workers "
                  "with the nodes left and a spare where one waits (not counted among --max-restarts)",
                  file=sys.stderr, flush=True)
            os.environ[LEFT_OUT_ENV] = str(int(os.environ.get(LEFT_OUT_ENV, "0")) + 1)
        else:
            self._remaining_restarts = 0
        return result

    def _decide(self, worker_group: WorkerGroup) -> str:
        """'go on' or 'end', decided once per round by the first agent to ask, from the rendezvous as it was before
        any agent moved (a later agent could count a node restarting early as a spare)."""
        mine = "go on" if can_go_on(worker_group.group_world_size, *self._room()) else "end"
        try:
            return worker_group.store.compare_set(_EXCLUDE_KEY, "", mine).decode()
        except Exception:  # noqa: BLE001 (the store's host is gone: no round can form again)
            return "end"

    def _room(self) -> tuple:
        """(spares waiting in the rendezvous, its minimum of nodes); (0, None) where the handler is not torch's
        dynamic rendezvous (its private state: torch 2.13's dynamic_rendezvous.py)."""
        handler = self._worker_group.spec.rdzv_handler
        try:
            handler._state_holder.sync()
            state = handler._state_holder.state
            return len(state.redundancy_list) + len(state.wait_list), handler._settings.min_nodes
        except AttributeError:
            return 0, None

    def run(self, role: str = DEFAULT_ROLE) -> RunResult:
        try:
            result = super().run(role)
        except _LeftOut:
            self._leave()
            return RunResult(state=WorkerState.SUCCEEDED)
        # torch's run returns None when the rendezvous closed on a spare never needed (RendezvousGracefulExitError)
        return result if result is not None else RunResult(state=WorkerState.SUCCEEDED)

    def _leave(self) -> None:
        """Leave the rendezvous without closing it (torch's exit operation, as next_rendezvous starts with), then
        wait until the job ends: the rendezvous closed by the last agents, or no agent left alive in it for the
        join timeout. Waiting, not exiting, keeps the rendezvous store up where this agent hosts it."""
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousExitOp
        handler = self._worker_group.spec.rdzv_handler
        print(f"scalec: node {_node()} is left out (restart(exclude = node)): its workers are stopped, and the job "
              "goes on without it", file=sys.stderr, flush=True)
        try:
            handler._stop_heartbeats()
            handler._op_executor.run(_RendezvousExitOp(), time.monotonic() + 60)
            limit = handler._settings.timeout.join.total_seconds()
        except Exception:  # noqa: BLE001 (no such handler, or the store is gone: the others drop us by heartbeat)
            return
        seen = time.monotonic()
        while True:
            time.sleep(1.0)
            try:
                handler._state_holder.sync()
                state = handler._state_holder.state
            except Exception:  # noqa: BLE001 (the store's host is gone: the job is over)
                return
            if state.closed:
                return
            if state.last_heartbeats:
                seen = time.monotonic()
            elif time.monotonic() - seen > limit:
                return

    def _mark(self, worker_group: WorkerGroup) -> None:
        try:
            worker_group.store.set(_FATAL_KEY, "1")
        except Exception:  # noqa: BLE001 (the store's host may be gone already: then no agent can restart anyway)
            pass

    def _marked(self, worker_group: WorkerGroup) -> bool:
        try:
            return bool(worker_group.store.check([_FATAL_KEY]))
        except Exception:  # noqa: BLE001 (the store's host is gone: the job is ending)
            return False


def _node() -> str:
    return os.environ.get("SCALEC_NODE") or socket.gethostname()


def _note_crash(result: RunResult) -> None:
    """This node's workers failed (not fatally, not to leave a node out): where that is a crash of theirs, not
    another rank's failure reaching them, tell the workers started next (runtime.node_record.CRASHED_ENV), whose
    rank 0 marks it in the node record."""
    seen = crash({rank: (f.exitcode, how(f)) for rank, f in result.failures.items()})
    if seen is None:
        os.environ.pop(CRASHED_ENV, None)
        return
    os.environ[CRASHED_ENV] = json.dumps(seen)
    print(f"scalec: node {_node()}'s workers crashed (rank {seen['rank']}, {seen['how']}); the next attempt's "
          "rank 0 records it in the node record", file=sys.stderr, flush=True)


def _note_host(env: str = EXCLUDED_HOSTS_ENV) -> None:
    """Append this host's name to the file `env` names: EXCLUDED_HOSTS_ENV (launch.sbatch: the hosts to --exclude)
    or REPLAN_HOSTS_ENV (launch.sbatch: the nodes left asked for a re-plan)."""
    path = os.environ.get(env)
    if path:
        with open(path, "a", encoding="utf-8") as f:  # SLURM's name of the node where srun started this agent
            f.write((os.environ.get("SLURMD_NODENAME") or socket.gethostname()) + "\n")


launcher_api.LocalElasticAgent = Agent  # what torch.distributed.run's launch_agent builds


def how(failure: ProcessFailure) -> str:
    """How a worker ended: 'killed by SIGKILL', 'exit code 1', 'exit code 78 (not restarted: ...)'."""
    if failure.exitcode < 0:
        return f"killed by {failure.signal_name()}"
    if failure.exitcode == EXIT_CODE:
        return f"exit code {EXIT_CODE} (a failure no restart can fix: not restarted)"
    if failure.exitcode in (EXIT_EXCLUDE, EXIT_REJOIN):
        return f"exit code {failure.exitcode} (ended on purpose to leave out a node)"
    if failure.exitcode == REPLAN_CODE:
        return f"exit code {REPLAN_CODE} (ended on purpose to be re-planned: not restarted)"
    if failure.exitcode == EXIT_PEER:
        return f"exit code {EXIT_PEER} (lost a peer: another rank failed first)"
    return f"exit code {failure.exitcode}"


def report(exc: ChildFailedError) -> str:
    """The failures of this node's workers, first failure first, in at most two lines."""
    first, failure = exc.get_first_failure()
    lines = [f"scalec: the job failed: rank {first} (local rank {failure.local_rank} on {socket.gethostname()}) "
             f"failed first, {how(failure)}"]
    others = sorted(rank for rank in exc.failures if rank != first)
    if others:
        listed = ", ".join(f"rank {rank} ({how(exc.failures[rank])})" for rank in others[:8])
        more = f" and {len(others) - 8} more" if len(others) > 8 else ""
        lines.append(f"scalec: then {listed}{more}; each rank's own cause is printed above")
    return "\n".join(lines)


def stopped(name: str) -> str:
    """What happened when torchrun was signalled (SIGTERM, or SIGINT from Ctrl-C): it passed the signal on to the
    workers and waited for them (runtime.faults: each finishes its step, saves, and leaves)."""
    if name in ("SIGTERM", "SIGINT"):
        return (f"scalec: torchrun stopped by {name} and passed it on: a worker that was training finishes its "
                f"step, saves a checkpoint when checkpoint_dir is set and exits, as rank 0's line 'stopped by ... "
                f"after step N' above says; without that line nothing was saved (the workers were still starting, "
                f"or a step outlasted {TERM_GRACE:g} s)")
    return (f"scalec: torchrun stopped by {name}: the workers were stopped by {name} too, without finishing their "
            "step: nothing was saved since the last checkpoint")


ENDED = ("scalec: the job ended to leave out a node (restart(exclude = node)): without it, the nodes left and the "
         "spares waiting are fewer than torchrun's --nnodes minimum; submit the job again without that node "
         "(launch.sbatch does so itself, with sbatch --exclude), start it with a spare node, or replan")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args.training_script_args
    try:
        run(args)
    except ChildFailedError as exc:
        if {f.exitcode for f in exc.failures.values()} <= {EXIT_EXCLUDE, EXIT_REJOIN}:
            print(ENDED, file=sys.stderr, flush=True)
            return EXIT_EXCLUDE
        codes = {f.exitcode for f in exc.failures.values()}
        # every worker ends on purpose after rank 0 asked; the agent stops the node's others when the first ends,
        # so some may be signalled before their own exit (a negative exit code: the signal)
        if REPLAN_CODE in codes and all(c == REPLAN_CODE or c < 0 for c in codes):
            print(f"scalec: the run ended to be re-planned on the nodes left (exit {REPLAN_CODE}): `scalec run` "
                  "re-plans and launches the new plan; rank 0's lines above say why", file=sys.stderr, flush=True)
            _note_host(REPLAN_HOSTS_ENV)
            return REPLAN_CODE
        print(report(exc), file=sys.stderr, flush=True)
        if debug:
            raise
        return EXIT_CODE if any(f.exitcode == EXIT_CODE for f in exc.failures.values()) else 1
    except RendezvousConnectionError:
        if Agent.started:
            raise
        # a spare never needed: the agent hosting the rendezvous store ended with the job before this one saw it close
        print("scalec: the job has ended (its rendezvous store is gone) without needing this spare node",
              file=sys.stderr, flush=True)
        return 0
    except RendezvousClosedError:  # another node's agent ended the job (it failed for good) while this one restarted
        print("scalec: the job has ended on another node (its rendezvous is closed); see that node's report",
              file=sys.stderr, flush=True)
        return 1
    except SignalException as exc:  # torchrun itself was signalled (preemption): it forwarded the signal and waited
        print(stopped(exc.sigval.name), file=sys.stderr, flush=True)
        return 128 + int(exc.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
