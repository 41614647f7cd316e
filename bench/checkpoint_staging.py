"""The whole table of tests/test_checkpoint_staging.py: for every way a rank can hold its state (ddp, zero1, zero2,
fsdp, fsdp + tp, pipeline stages, bf16 under ddp, zero1 and fsdp, odd and padded vocabularies), the memory model's
staging copy of an asynchronous checkpoint against what the generated program stages, to the byte.

    python3 -m bench.checkpoint_staging [CASE ...]

The test suite runs one case per rule of the prediction (its SUITE); this runs them all (a two-process launch each,
about 15 s apiece on a 2-core machine) and prints the bytes of each, exiting 1 if any differs."""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from tests.test_checkpoint_staging import CASES, check_case


def main(argv: list[str]) -> int:
    failed = 0
    for case in argv or list(CASES):
        with tempfile.TemporaryDirectory() as tmp:
            try:
                host, device = check_case(case, Path(tmp))
            except AssertionError as exc:
                failed += 1
                print(f"{case:20s} DIFFERS: {str(exc).splitlines()[0] if str(exc) else exc!r}", flush=True)
                continue
        print(f"{case:20s} staged {host:>10,} B per rank (host)" + (f", {device:,} B gathered on the device" if
                                                                     device else "") + ": as predicted", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
