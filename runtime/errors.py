"""Failures a restart cannot fix, and the exit code that tells the launcher so.

torchrun's agent restarts a failed job up to `--max-restarts` times whatever the cause. That is right for a rank
killed by the machine, and wrong for a failure that is a function of the inputs: a checkpoint of another model, a
missing init file, a batch that does not split. Every attempt would fail the same way, print the same error again
and spend the start-up each time. Such a failure raises `FatalError`; the worker exits with `EXIT_CODE`, and
`runtime.launch`'s agent takes that code as "do not restart": the job ends at once.

Every rank usually meets the same deterministic failure (the ranks that only follow rank 0's verdict raise it with
no message), so the message is printed once for the whole job: by the first rank that holds one (`announce`).

No torch at import: `runtime.launch` reads `EXIT_CODE` before anything else.
"""
from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

EXIT_CODE = 78
"""The worker's exit status for "fatal, do not restart": EX_CONFIG of sysexits.h ("something was found in an
unconfigured or misconfigured state"), a code neither Python (1, 2), a signal (128 + n) nor torchrun uses."""

EXIT_EXCLUDE = 79
"""The worker's exit status for "this attempt ended on purpose to leave out a node, and it is this worker's node"
(`restart(exclude = node)`; runtime.node_record.leave_out): its agent leaves the rendezvous (runtime.launch), and
where no spare takes its place and too few nodes are left, the job ends with this status, which launch.sbatch reads
as "submit again without the hosts left out". Past sysexits.h's range (64-78), below the signals' (128 + n)."""

EXIT_REJOIN = 80
"""The worker's exit status for "this attempt ended on purpose to leave out another node": its agent restarts the
workers on the nodes left (not counted as one of `restarts`), after the node left out has gone."""

REPLAN_CODE = 81
"""The workers' exit status for "ended on purpose, re-plan on the nodes left": the run named a node to leave out
(`resilience { on_straggler = replan }`), saved a checkpoint and wrote its request (compiler/run_command.py
`REQUEST`); the launcher does not restart it, and `scalec run` re-plans and launches the new plan."""

EXIT_PEER = 82
"""The worker's exit status for "a peer rank is gone" (a collective failed on a closed or reset connection): this
worker failed because another failed first. runtime.launch's agent does not count it as its node crashing (a crash is
any other failure: runtime.node_record.crash)."""


class FatalError(SystemExit):
    """A start-up failure that every restart would meet again: end the job at once, with one message.

    `message` is the one line to print (it names the file or setting at fault), or None on a rank that only follows
    another rank's verdict. A SystemExit, so code that lets SystemExit through (argparse, our own one-line errors)
    treats it alike; its exit code is EXIT_CODE."""

    def __init__(self, message: str | None):
        super().__init__(EXIT_CODE)
        self.message = message

    def __str__(self) -> str:
        return self.message or ""

    def __reduce__(self):  # picklable across processes with its message (SystemExit's own keeps only the code)
        return (type(self), (self.message,))


def announce(exc: FatalError, rank: int) -> bool:
    """Print `exc`'s message on stderr unless another rank of the job has printed one already (the first rank to
    claim a key in the process group's store prints); returns whether this rank printed."""
    if exc.message is None or not _first_to_report():
        return False
    print(f"[rank {rank}] {exc.message}", file=sys.stderr, flush=True)
    store = _store()
    if store is not None:
        try:
            store.set(_PRINTED, "1")  # the silent ranks may leave now (leave_after_reporter)
        except Exception:  # noqa: BLE001 -- the store already gone: nobody is waiting on it
            pass
    return True


FOLLOWER_GRACE_S = 2.0
"""The longest a rank that prints nothing waits before it exits with a fatal error another rank reports. The
launcher stops every rank of its node at the first one's exit (torchrun's agent, with SIGTERM): were a silent rank
first, the reporting rank could be killed before its message was written, and the job would end on "exit code 78"
and nothing else. With a process group the silent ranks wait until the reporter says it has printed (milliseconds);
before one exists (a bad flag) the ranks of rank 0's node wait this long, and rank 0's exit ends the job first. The
other nodes' ranks do not wait: their agents must see their own ranks' exit code, not the store's end."""


def leave_after_reporter() -> None:
    """Called by a rank that holds no message for the fatal error it leaves with (see FOLLOWER_GRACE_S)."""
    sys.stderr.flush()
    store = _store()
    if store is not None:
        try:
            store.wait([_PRINTED], timedelta(seconds=FOLLOWER_GRACE_S))
        except Exception:  # noqa: BLE001 -- no reporter, or the store already gone: leave now
            pass
    elif os.environ.get("GROUP_RANK", "0") == "0":
        time.sleep(FOLLOWER_GRACE_S)


_KEY = "scalec/fatal_reported"
_PRINTED = "scalec/fatal_printed"


def _store():
    """The default process group's store, or None (no process group, or no store)."""
    try:
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_initialized():
            return None
        return dist.distributed_c10d._get_default_store()
    except (RuntimeError, AttributeError, ValueError):
        return None


def _first_to_report() -> bool:
    """Whether no other rank has reported a fatal error yet: an atomic add on the default process group's store.
    Without a process group (or its store), every rank reports: a message twice beats a message lost."""
    store = _store()
    if store is None:
        return True
    try:
        return store.add(_KEY, 1) == 1
    except (RuntimeError, ValueError):
        return True
