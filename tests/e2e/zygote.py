"""A fork server for the e2e tests' launches: torch imported once per pytest worker, each generated program's
ranks forked from it.

Why: a rank's start-up on this CPU is mostly `import torch` (1.6-2.4 s of CPU), and a case of four ranks under
torchrun starts five interpreters (the agent and the ranks) that each import it before the first step, which takes
half a second: the e2e table spent most of its CPU importing torch. Forked from a process that has already imported
it, a rank starts in milliseconds.

What a launch through it is, beside `launch.sh` (torchrun):
- a job process of its own process group (killed whole on a timeout), its stdout and stderr one file, its working
  directory and environment the request's, the server's import-time output (warnings included: the e2e runner
  fails a run that prints one) written first;
- a world of one runs the program in the job process itself, as `python program.py` would; a world of N forks N
  ranks with the environment torchrun gives its workers on one node (RANK, LOCAL_RANK, WORLD_SIZE,
  LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK, ..., MASTER_ADDR and MASTER_PORT: rank 0 hosts the store, as under
  `env://` without an agent store), runs each with `runpy` as `__main__`, and when one fails stops the others
  (SIGTERM, then SIGKILL after the grace torchrun gives) and exits 1, as torchrun does.
What it is not: no restarts, no rendezvous agent, no per-process hash seed (every rank shares the server's), and the
modules the server imported are not imported again. So the runner sends only launches without restarts whose
environment agrees with the server's in every variable read at import time (`IMPORT_TIME`), and every test of
launching itself (restarts, faults, a failed job's report, node exclusion, `scalec run`) goes through launch.sh.

The server imports torch and the torch modules a program's runtime loads, never `runtime` or `compiler` (their
modules read test hooks from the environment at import: each job imports them after its environment is set). It
runs no tensor operation before forking, so no thread pool is inherited half-made.

Protocol (one request at a time, on the server's stdin and stdout): a JSON line
{"program", "args", "cwd", "env", "nproc", "nodes", "out"}; the server answers {"pid": job} when the job is forked and
{"rc": exit status} when it ends (negative: killed by that signal).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time

IMPORT_TIME = ("PYTHON", "TORCH", "PYTORCH", "OMP_", "MKL_", "KMP_", "CUDA", "NCCL", "GLOO", "LD_", "MALLOC")
"""Prefixes of the environment variables an interpreter or torch reads when it starts or imports: a request whose
values differ from the server's in any of them is not served (the runner starts it as a process of its own)."""

PRELOAD = ("torch", "torch.nn", "torch.nn.functional", "torch.distributed", "torch.distributed.distributed_c10d",
           "torch.distributed.tensor", "torch.distributed.fsdp", "torch.distributed.pipelining",
           "torch.utils.checkpoint", "numpy")
"""What the server imports before it forks: torch and the torch modules the runtime imports at start-up."""

TERM_GRACE = 5.0
"""Seconds between SIGTERM and SIGKILL to the other ranks once one failed (torchrun's default is 30; these are toy
runs)."""


def served(env: dict, server_env: dict) -> bool:
    """Whether a launch with environment `env` can be forked from a server started with `server_env`."""
    keys = {k for k in (*env, *server_env) if k.startswith(IMPORT_TIME)}
    return all(env.get(k) == server_env.get(k) for k in keys)


def _preload() -> bytes:
    """Import PRELOAD with fd 2 captured; returns what the imports printed (written first into every job's output)."""
    import importlib
    import tempfile
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            for name in PRELOAD:
                importlib.import_module(name)
            sys.stderr.flush()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read()
    assert not any(m == "runtime" or m.startswith(("runtime.", "compiler")) for m in sys.modules), \
        "the zygote imported scalec's own modules"
    return text


def _run_program(program: str, args: list) -> int:
    """Run `program` as `python program args` would, in this process; its exit status."""
    import runpy
    import traceback
    sys.argv = [program, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(program))
    code = 0
    try:
        runpy.run_path(program, run_name="__main__")
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # what an uncaught exception prints
        traceback.print_exc()
        code = 1
    import atexit
    import threading
    for t in threading.enumerate():  # interpreter shutdown: non-daemon threads, then atexit
        if t is not threading.main_thread() and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def _agent(program: str, args: list, nproc: int, nodes: int) -> int:
    """torchrun's part: fork `nproc` ranks, `nproc // nodes` per node, as launch.sh's agents (one per node under
    LOCAL_NODES=1, each named nodeN in SCALEC_NODE) give them; wait; on the first failure stop the others."""
    per_node = nproc // nodes
    base = {"LOCAL_WORLD_SIZE": str(per_node), "WORLD_SIZE": str(nproc), "GROUP_WORLD_SIZE": str(nodes),
            "ROLE_NAME": "default", "ROLE_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1",
            "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "zygote"}
    os.environ.setdefault("MASTER_PORT", "29500")
    sys.stdout.flush()
    sys.stderr.flush()
    ranks = {}
    for r in range(nproc):
        pid = os.fork()
        if pid == 0:  # a rank: never back into this loop, whatever happens
            code = 1
            try:
                node = r // per_node
                os.environ.update(base, RANK=str(r), LOCAL_RANK=str(r % per_node), ROLE_RANK=str(r),
                                  GROUP_RANK=str(node))
                if nodes > 1:
                    os.environ["SCALEC_NODE"] = f"node{node}"
                code = _run_program(program, args)
            finally:
                os._exit(code)
        ranks[pid] = r
    failed = None
    deadline = None
    while ranks:
        pid, status = os.waitpid(-1, os.WNOHANG) if deadline else os.waitpid(-1, 0)
        if pid == 0:
            if time.monotonic() > deadline:
                for p in ranks:
                    os.kill(p, signal.SIGKILL)
                deadline = None
            else:
                time.sleep(0.05)
            continue
        r = ranks.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        if code != 0 and failed is None:
            failed = (r, code)
            print(f"zygote: rank {r} exited with {code}; stopping the other ranks", file=sys.stderr, flush=True)
            for p in ranks:
                os.kill(p, signal.SIGTERM)
            deadline = time.monotonic() + TERM_GRACE
    return 0 if failed is None else 1


def _job(request: dict, preamble: bytes) -> None:
    """The forked job: its process group, output, directory and environment, then the program's ranks. Never
    returns."""
    code = 1
    try:
        os.setpgid(0, 0)
        fd = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.close(null)
        os.write(1, preamble)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if request["nproc"] == 1:
            code = _run_program(request["program"], request["args"])
        else:
            code = _agent(request["program"], request["args"], request["nproc"], request.get("nodes", 1))
    except BaseException:
        import traceback
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve() -> None:
    preamble = _preload()
    reply_fd = os.dup(1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # nothing of the server's reaches the reply channel

    def reply(obj: dict) -> None:
        os.write(reply_fd, (json.dumps(obj) + "\n").encode())

    reply({"ready": os.getpid()})
    pending = b""
    while True:
        while b"\n" not in pending:
            chunk = os.read(0, 65536)
            if not chunk:
                return
            pending += chunk
        line, pending = pending.split(b"\n", 1)
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            os.close(reply_fd)
            _job(request, preamble)
        try:
            os.setpgid(pid, pid)  # as the job does itself: whichever runs first
        except OSError:
            pass
        reply({"pid": pid})
        _, status = os.waitpid(pid, 0)
        reply({"rc": os.waitstatus_to_exitcode(status)})


class Server:
    """The client: one server per test process, started at its first launch, ended with the process (its stdin
    closes)."""

    def __init__(self, env: dict):
        import subprocess
        self.env = dict(env)
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=self.env, cwd=os.path.dirname(__file__))
        self.pending = b""
        self._answer(120)  # {"ready": pid}

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _read(self, timeout: float | None) -> dict | None:
        import select
        end = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.pending:
            left = None if end is None else max(0.0, end - time.monotonic())
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if not ready:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                raise RuntimeError("the zygote server ended")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def _answer(self, timeout: float) -> dict:
        """The server's next answer, which must come within `timeout` seconds."""
        got = self._read(timeout)
        if got is None:
            raise RuntimeError(f"the zygote server did not answer within {timeout:g} s")
        return got

    def run(self, program: str, args: list, *, cwd: str, env: dict, nproc: int, nodes: int, out: str,
            timeout: float) -> int | None:
        """The job's exit status, or None when it ran past `timeout` seconds (it is killed, all its ranks)."""
        request = {"program": program, "args": [str(a) for a in args], "cwd": str(cwd), "env": env,
                   "nproc": nproc, "nodes": nodes, "out": str(out)}
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        job = self._answer(60)["pid"]
        done = self._read(timeout)
        if done is None:
            try:
                os.killpg(job, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._answer(60)  # its {"rc"}, once the server reaped it
            return None
        return done["rc"]


_SERVERS: list = []  # this process's server, once started


def server(env: dict) -> Server | None:
    """This test process's server (started by the first launch that asks), if it can serve a launch with `env`
    (`served`); None where it cannot or SCALEC_TEST_ZYGOTE=0: the caller starts its own processes."""
    if os.environ.get("SCALEC_TEST_ZYGOTE", "1") == "0":
        return None
    if _SERVERS and not _SERVERS[0].alive():
        _SERVERS.clear()
    if not _SERVERS:
        _SERVERS.append(Server(env))
    return _SERVERS[0] if served(env, _SERVERS[0].env) else None


def stop() -> None:
    """End this test process's server: the next launch that asks starts one with its own environment. For a test
    that must launch forked whatever launched before it in this process (a server started with another import-time
    environment serves none of the default launches: `served`)."""
    for srv in _SERVERS:
        if srv.alive():
            srv.proc.stdin.close()
            try:
                srv.proc.wait(timeout=10)
            except Exception:  # noqa: BLE001 - it did not end on its stdin's close
                srv.proc.kill()
                srv.proc.wait()
    _SERVERS.clear()


def guard(what: str) -> None:
    """tests/conftest.py's check that a test which launches processes is marked e2e: it sees subprocesses and
    torch.multiprocessing; a forked launch is checked here."""
    conftest = sys.modules.get("tests.conftest")
    if conftest is not None:
        conftest._refuse_unmarked(what)


if __name__ == "__main__":
    serve()
