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

The job's start is exported to the workers as SCALEC_LAUNCH_TIME (seconds since the epoch; runtime.progress.LAUNCH_TIME),
unless already set (a multi-node job may set one time for all nodes): the log's elapsed time and `done in` count
from it, start-up and restarts included.
"""
from __future__ import annotations

import os
import time

# Before torch's import (a second or more): runtime.progress.LAUNCH_TIME, inherited by every worker.
os.environ.setdefault("SCALEC_LAUNCH_TIME", repr(time.time()))

import socket  # noqa: E402
import sys  # noqa: E402

import torch.distributed.launcher.api as launcher_api  # noqa: E402
from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup  # noqa: E402
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent  # noqa: E402
from torch.distributed.elastic.multiprocessing.api import SignalException  # noqa: E402
from torch.distributed.elastic.rendezvous.api import RendezvousClosedError  # noqa: E402
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure  # noqa: E402
from torch.distributed.run import parse_args, run  # noqa: E402

from runtime.errors import EXIT_CODE  # noqa: E402
from runtime.faults import TERM_GRACE  # noqa: E402

_FATAL_KEY = "scalec/fatal"  # in the rendezvous store of the round: some worker of the job exited with EXIT_CODE


def fatal(result: RunResult) -> bool:
    """Whether a worker of `result` exited with EXIT_CODE (a failure no restart can fix)."""
    return result.is_failed() and any(f.exitcode == EXIT_CODE for f in result.failures.values())


class Agent(LocalElasticAgent):
    """torchrun's agent, which does not restart a job whose workers failed for good (module docstring).

    torch's loop (`SimpleElasticAgent._invoke_run`) restarts a FAILED worker group while `_remaining_restarts > 0`;
    the monitor it calls each interval is the one place that sees the exit codes before that decision, so this
    agent's monitor sets the restarts left to 0 when the failure is fatal, here or (through the store) elsewhere."""

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        result = super()._monitor_workers(worker_group)
        if not result.is_failed():
            return result
        if fatal(result):
            self._remaining_restarts = 0
            self._mark(worker_group)
        elif self._remaining_restarts > 0 and self._marked(worker_group):
            self._remaining_restarts = 0
        return result

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


launcher_api.LocalElasticAgent = Agent  # what torch.distributed.run's launch_agent builds


def how(failure: ProcessFailure) -> str:
    """How a worker ended: 'killed by SIGKILL', 'exit code 1', 'exit code 78 (not restarted: ...)'."""
    if failure.exitcode < 0:
        return f"killed by {failure.signal_name()}"
    if failure.exitcode == EXIT_CODE:
        return f"exit code {EXIT_CODE} (a failure no restart can fix: not restarted)"
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args.training_script_args
    try:
        run(args)
    except ChildFailedError as exc:
        print(report(exc), file=sys.stderr, flush=True)
        if debug:
            raise
        return EXIT_CODE if any(f.exitcode == EXIT_CODE for f in exc.failures.values()) else 1
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
