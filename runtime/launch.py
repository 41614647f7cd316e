"""torchrun as launch.sh starts it: torch's own elastic launcher, with the end of a failed job told in a few lines.

    python3 -m runtime.launch [torchrun flags] program.py [program flags]

Everything is torchrun's (`torch.distributed.run`): its flags, rendezvous, restarts (`--max-restarts`), signal
forwarding. Only the report differs. When workers fail for good, torchrun's command-line entry prints a Python
traceback of its own and a table of failures, after the workers' one-line causes; here it is one line naming the
rank that failed first (torchrun's "root cause") and how, and one line for the others. With `--debug` among the
program flags torchrun's full report is printed as well.

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

from torch.distributed.elastic.multiprocessing.api import SignalException  # noqa: E402
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure  # noqa: E402
from torch.distributed.run import parse_args, run  # noqa: E402


def how(failure: ProcessFailure) -> str:
    """How a worker ended: 'killed by SIGKILL', 'exit code 1'."""
    return f"killed by {failure.signal_name()}" if failure.exitcode < 0 else f"exit code {failure.exitcode}"


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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args.training_script_args
    try:
        run(args)
    except ChildFailedError as exc:
        print(report(exc), file=sys.stderr, flush=True)
        if debug:
            raise
        return 1
    except SignalException as exc:  # torchrun itself was signalled (preemption): it forwarded the signal and waited
        print(f"scalec: torchrun stopped by {exc.sigval.name}; the workers were told to finish their step, save a "
              "checkpoint (with checkpoint_dir) and exit", file=sys.stderr, flush=True)
        return 128 + int(exc.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
