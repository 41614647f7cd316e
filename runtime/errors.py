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

import sys

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
    return True


_KEY = "scalec/fatal_reported"


def _first_to_report() -> bool:
    """Whether no other rank has reported a fatal error yet: an atomic add on the default process group's store.
    Without a process group (or its store), every rank reports: a message twice beats a message lost."""
    try:
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_initialized():
            return True
        return dist.distributed_c10d._get_default_store().add(_KEY, 1) == 1
    except (RuntimeError, AttributeError, ValueError):
        return True
