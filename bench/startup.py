"""Start-up of one attempt: how long torchrun takes to start a generated program's ranks, rendezvous, build the
process groups and the model, run one step and exit. The failure model's restart cost on `cpu` is this
(compiler/layout/failures.py STARTUP_S); a restart adds the checkpoint's load (and, compiled, the compile).

    python -m bench.startup [--repeat 3] [--sample samples/gpt_dp.scale] [--nproc 2]

Prints each trial's wall seconds and the median. Measured 2026-11-29 on this machine (2 cores, gpt_dp on 2 CPU
ranks), the cores otherwise idle: 4.16, 4.32, 4.10 s, median 4.2 s (one step of 24 ms of it); with the cores shared
by other jobs (load average 8-9) 7-21 s a trial, median 13 s: what start-up waits for, not what it costs.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sample", default="samples/gpt_dp.scale")
    ap.add_argument("--nproc", type=int, default=2)
    a = ap.parse_args(argv)
    from compiler import codegen
    from compiler.check import check_path
    from compiler.pipeline import compile_spec
    with tempfile.TemporaryDirectory() as tmp:
        codegen.emit(compile_spec(check_path(str(ROOT / a.sample))), tmp)
        times = []
        for i in range(a.repeat):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            f"--nproc-per-node={a.nproc}", str(Path(tmp) / "program.py"), "--steps", "1"],
                           check=True, capture_output=True, cwd=tmp,
                           env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
            times.append(time.perf_counter() - t0)
            print(f"trial {i + 1}: {times[-1]:.2f} s")
    print(f"start-up to one step and exit: median {statistics.median(times):.2f} s over {len(times)}")


if __name__ == "__main__":
    main()
