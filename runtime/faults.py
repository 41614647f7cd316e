"""Failures at scale: restarts, preemption, hangs that name themselves, and the one line a failed rank prints.

- Each torchrun attempt meets its peers under its own store prefix, so a restarted group never reads a dead peer's
  address left in the store by the attempt before (`attempt_store`). The workers agree on the attempt in the store
  itself (`agree_attempt`), not by TORCHELASTIC_RESTART_COUNT: torchrun advances that count only on the agent whose
  worker failed, not on an agent restarted for the membership change, so with several agents it differs.
- SIGTERM (preemption) only sets a flag; every step the ranks agree on it (one all-reduce MAX of one number, started
  at the step's beginning and read at its end, no host-device synchronisation of its own), so all of them stop
  after the same step, checkpoint and leave with status 0 (`StopVote`). SIGINT (Ctrl-C, which the terminal sends
  to every process of the job, and torchrun forwards again) is handled alike once the mesh is up: the step
  finishes, the checkpoint is saved (with checkpoint_dir), and the run leaves; before that (start-up) it
  interrupts as usual. A rank still in its step TERM_GRACE seconds after the signal leaves without a checkpoint.
- A watchdog thread times the operation each rank is blocked in: every collective of runtime.collectives and every
  collective region of the training loop records what it is (`op`: a global set before and after, nothing more).
  When one lasts longer than the plan's `timeout`, the ranks that are waiting write what they wait in to the store;
  the lowest of them prints one message naming each waiting rank's mesh coordinates, pipeline stage, operation and
  `.scale` line, and the ranks that never joined; then the job ends (exit 1).
- Test-only hooks, read only when set: SCALEC_TEST_KILL_AT=RANK:STEP (SIGKILL that rank at the start of that step on
  the first attempt), SCALEC_TEST_HANG_AT=RANK:STEP[:loss] (that rank sleeps forever there, or before that step's
  loss all-reduce), SCALEC_TEST_TERM_AT=RANK:STEP (that rank sends itself SIGTERM there, as a preemption would),
  SCALEC_TEST_NODE_DIES=NAME:STEP (the node named NAME dies there on the first attempt: its workers SIGKILL their
  torchrun agent and themselves).
"""
from __future__ import annotations

import linecache
import os
import re
import signal
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

# -- the operation this rank is blocked in ------------------------------------------------------------------------

_CURRENT = None   # (what, site, started) or None: site is (file, line) of the generated program's call, or None
_STEP = 0
_TIMEOUT = 600.0
_CTX = None
_STORE = None
_LAST = None      # the last marked operation (what, site): on CUDA collectives only queue work, so a rank stuck in
                  # one is found later, waiting for the device (`device_wait`)


_ATTEMPT = 0      # this attempt's generation, agreed by all workers in the store (agree_attempt)


def attempt() -> int:
    """This attempt's generation as the workers agreed it at start-up: 0 on the first attempt (and before start-up,
    and outside torchrun), larger on every restart."""
    return _ATTEMPT


def attempt_store(timeout: timedelta):
    """The store this attempt rendezvous through: torchrun's (or rank 0's), under a prefix of its own."""
    global _ATTEMPT
    store, rank, world = next(dist.rendezvous("env://", timeout=timeout))
    _ATTEMPT = agree_attempt(store, rank, world, timeout.total_seconds())
    return dist.PrefixStore(f"scalec/attempt{_ATTEMPT}", store)


_AGREE = "scalec/agree"


def agree_attempt(store, rank: int, world: int, timeout: float) -> int:
    """The generation every worker of this attempt agrees on, through `store` (torchrun's store, which outlives the
    attempts: keys of earlier attempts are still there). Each rank's counter cannot serve: torchrun's restart count
    is advanced only by the agent whose worker failed (an agent restarted for the membership change keeps its
    count), and a per-rank count of starts drifts when a worker dies before reaching this point.

    Generation g is joined in two phases. Join: take rank's slot in g (`add(slot, 1) == 1`) and count it; a slot
    already taken was taken by this rank's worker of an earlier attempt, so g is an earlier attempt's and this one
    moves to g + 1 (`compare_set`: one move however many find it, the others follow). Confirm: once g has `world`
    members, say so; the attempt is g when `world` members confirmed.

    Race-free because torchrun starts an attempt's workers only after every agent stopped (and reaped) the workers
    of the one before (each agent stops its workers before the rendezvous round, which needs every agent), and
    starts each rank once per attempt:
    - workers of one attempt start at different times: the early ones wait in g (confirm needs `world` members),
      and whoever moves g to g + 1 moves all of them, since a waiting worker leaves g for the newer generation;
    - an earlier attempt's workers are dead, but their keys remain: a generation they left full (the usual case)
      has every slot taken, so each new worker moves on; one they left partial (a worker died before joining)
      can get `world` members, but its old members never confirm, and each of their ranks' new workers, finding
      its slot taken, moves every new worker to g + 1 before anyone has `world` confirmations in g;
    - an earlier attempt's worker still alive (not under torchrun) joined its generation already and touches these
      keys no more; it keeps its own prefix, which no later attempt reuses."""
    def read(key: str) -> int:
        return int(store.add(key, 0))

    deadline = time.monotonic() + timeout
    gen = read(f"{_AGREE}/generation")
    while True:
        if store.add(f"{_AGREE}/{gen}/slot{rank}", 1) != 1:  # an earlier attempt's generation: the next one
            store.compare_set(f"{_AGREE}/generation", str(gen), str(gen + 1))
            gen = read(f"{_AGREE}/generation")
            continue
        store.add(f"{_AGREE}/{gen}/members", 1)
        confirmed, pause = False, 0.005
        while True:
            now = read(f"{_AGREE}/generation")
            if now != gen:  # a later worker found g an earlier attempt's: join the newer generation
                gen = now
                break
            if not confirmed and read(f"{_AGREE}/{gen}/members") >= world:
                store.add(f"{_AGREE}/{gen}/confirmed", 1)
                confirmed = True
            if confirmed and read(f"{_AGREE}/{gen}/confirmed") >= world:
                return gen
            if time.monotonic() > deadline:
                raise RuntimeError(f"scalec: {read(f'{_AGREE}/{gen}/members')} of {world} ranks started within "
                                   f"{timeout:g} s (attempt generation {gen})")
            time.sleep(pause)
            pause = min(pause * 2, 0.1)


def set_step(step: int) -> None:
    global _STEP
    _STEP = step


_SECTIONS = None  # runtime.sections.Timeline of this step while straggler detection times it (set_sections)


def set_sections(timeline) -> None:
    """Every marked region from now on also opens its `kind` in `timeline` (runtime.sections): the straggler
    detector's per-rank timing reuses these marks; None stops it."""
    global _SECTIONS
    _SECTIONS = timeline


class op:
    """`with op("what", site):` marks a blocking region (the innermost one is reported); `site` is the generated
    program's call (file, line), or the `.scale` lines of an operation the runtime opens (`scale(...)`). `kind` is
    the timing section the region's time goes to (runtime.sections.SECTIONS: `all_reduce`, `grad_reduce`,
    `forward`, ...; `wait` for the other collectives)."""
    __slots__ = ("what", "site", "outer", "kind")

    def __init__(self, what: str, site=None, kind: str = "wait"):
        self.what, self.site, self.kind = what, site, kind

    def __enter__(self):
        global _CURRENT, _LAST
        if torch.compiler.is_compiling():  # inside a compiled region (runtime.compile): the enclosing eager
            return  # region names the wait; no Python runs per call here
        self.outer = _CURRENT
        _CURRENT = (self.what, self.site, time.monotonic())
        _LAST = (self.what, self.site)
        if _SECTIONS is not None:
            _SECTIONS.enter(self.kind)

    def __exit__(self, *exc):
        global _CURRENT
        if torch.compiler.is_compiling():
            return False
        if self.outer is not None:  # the outer region made progress: time it afresh
            _CURRENT = (self.outer[0], self.outer[1], time.monotonic())
        else:
            _CURRENT = None
        if _SECTIONS is not None:
            _SECTIONS.exit()
        return False


def device_wait(what: str) -> op:
    """`with device_wait("reading the loss"):` marks a point where the host waits for the device's queued work. On
    NCCL a collective returns once queued, so a hang shows here; the report names the last collective queued and
    its line (the mesh section's before any)."""
    if _LAST:
        return op(f"waiting for the device ({what}; the last collective queued: {_LAST[0]})", _LAST[1] or scale())
    return op(f"waiting for the device ({what})", scale())


_SOURCES = {}     # what -> (file.scale:LINE, the line's text): the program's Config.sources (set_sources)


def set_sources(sources) -> None:
    """The `.scale` lines behind the runtime's blocking operations (runtime.config.Config.sources)."""
    global _SOURCES
    _SOURCES = {what: (where, text) for what, where, text in sources}


def axis_site(site, axis: str):
    """`site` (the generated program's call), or for a collective the runtime calls itself (tp's partial gradients,
    the vocabulary-parallel loss's maximum) the line of its mesh axis; nothing inside a compiled region."""
    if site or torch.compiler.is_compiling():
        return site
    return scale(f"axis {axis}")


def has_source(what: str) -> bool:
    """Whether the program gave the line of `what` (a setting is given only where the .scale file writes it)."""
    return what in _SOURCES


def scale(*whats: str) -> str | None:
    """The `site` of a blocking operation the runtime itself opens: the `.scale` lines of those of `whats` (`axis
    dp`, `data_parallel`, ...) the program gave, as "file.scale:LINE (text), ..."; the mesh section's when it gave
    none of them; None before the program gave any (a runtime test without a program)."""
    found = [_SOURCES[w] for w in dict.fromkeys(whats) if w in _SOURCES]
    if not found and "mesh" in _SOURCES:
        found = [_SOURCES["mesh"]]
    return ", ".join(f"{where} ({text})" for where, text in found) or None


def caller_site(depth: int = 2):
    """(file, line) of the generated program's frame that called a collective, or None: a cheap frame walk (None
    inside a compiled region, whose frames are traced once)."""
    if torch.compiler.is_compiling():
        return None
    f = sys._getframe(depth)
    while f is not None:
        if f.f_code.co_filename.endswith("program.py"):
            # the model's code (forward, loss_fn), not the program's `train.main(...)` line that runs the loop
            return None if f.f_code.co_name == "<module>" else (f.f_code.co_filename, f.f_lineno)
        f = f.f_back
    return None


def _site_text(site) -> str:
    """The `.scale` location and reason the generated program's comment gives for that call; a site the runtime
    opened is its `.scale` lines already (`scale`)."""
    if not site:
        return ""
    if isinstance(site, str):
        return f" at {site}"
    line = linecache.getline(site[0], site[1]).strip()
    if "#" not in line:
        return f" at {os.path.basename(site[0])}:{site[1]}"
    comment = line.split("#", 1)[1].strip()
    m = re.search(r"\(([^()]*\.scale:\d+)\)\s*$", comment)
    if m:
        return f" at {m.group(1)} ({comment[:m.start()].strip()})"
    return f" ({comment})"


def _coords() -> str:
    ctx = _CTX
    if ctx is None:
        return ""
    parts = ", ".join(f"{a}={i}" for a, i in ctx.coords.items())
    stage = f"; pipeline stage {ctx.coords['pp']}" if ctx.axis_size("pp") > 1 else ""
    return f" ({parts}{stage})" if parts else stage


def describe_rank() -> str:
    return f"rank {_CTX.rank if _CTX else os.environ.get('RANK', '0')}{_coords()}"


# -- configuration at start-up ------------------------------------------------------------------------------------


def start_watchdog(timeout: float) -> None:
    """Time every marked region from now on (the process group's start-up included); 0 turns it off."""
    global _TIMEOUT
    _TIMEOUT = float(timeout)
    if _TIMEOUT > 0:
        threading.Thread(target=_watch, name="scalec-watchdog", daemon=True).start()


def configure(ctx, store) -> None:
    """The mesh is up: name ranks by their coordinates, compare notes in `store`, stop on SIGTERM or SIGINT at a
    step."""
    global _CTX, _STORE
    _CTX, _STORE = ctx, store
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGINT, _on_sigterm)


def nccl_flight_recorder_env() -> None:
    """On NCCL, turn torch's flight recorder on (unless the user set it): the last collectives of each rank, dumped
    to TORCH_FR_DUMP_TEMP_FILE<rank> when a collective times out. Call before the process group starts."""
    os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", os.path.join(os.getcwd(), "scalec_flight_recorder_rank"))


# -- preemption ---------------------------------------------------------------------------------------------------

_TERM = False
_LEAVE = 0.0      # a leave asked on this rank (runtime.leaving.encode): voted with the preemption flag


_TERM_AT = 0.0
_TERM_SIGNAL = "SIGTERM"
TERM_GRACE = 25.0  # seconds a rank may take to reach the end of its step after SIGTERM (torchrun kills at 30)


def _on_sigterm(signum, frame):
    """SIGTERM and SIGINT: stop after this step (module docstring); a second signal changes nothing."""
    global _TERM, _TERM_AT, _TERM_SIGNAL
    if not _TERM:  # the time first: the watchdog reads _TERM, then _TERM_AT
        _TERM_AT = time.monotonic()
        _TERM_SIGNAL = signal.Signals(signum).name
        _TERM = True


def stop_signal() -> str:
    """What stopped the run, in words: the signal this rank got (`SIGTERM`, `SIGINT`), or, when only another rank
    got one (the vote is MAX over every rank's flag), that."""
    return _TERM_SIGNAL if _TERM else "a SIGTERM or SIGINT to another rank"


def leave_asked() -> bool:
    """Whether this rank asked to leave a node out (ask_leave) already."""
    return _LEAVE > 0


def ask_leave(value: float) -> None:
    """Rank 0 asks every rank to stop after the next voted step and leave a node out (runtime.leaving.encode's
    number): it rides on the preemption vote."""
    global _LEAVE
    _LEAVE = max(_LEAVE, float(value))


class StopVote:
    """Whether any rank was asked to stop (SIGTERM), agreed by all ranks after the same step, without a host-device
    synchronisation of its own. `start()` at the beginning of each step puts this rank's flag into an all-reduce MAX
    over all ranks; `result()` at the end of that step reads the outcome, the same on every rank, so all of them
    stop after the same step. The vote is started before the step's work is queued, so reading it waits for no more
    than the start of the step: on CUDA the flag comes back by a non-blocking copy into pinned memory and an event
    (the host then waits until the device reaches that point, with the whole step queued behind it: the device
    never idles for it); on gloo the all-reduce runs on gloo's thread while the step runs. A SIGTERM that arrives
    after a step's vote started is in the next step's vote. One process alone reads its flag directly."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.voting = dist.is_initialized() and dist.get_world_size() > 1
        self.flag = torch.zeros((), device=device)
        self.host = torch.zeros((), pin_memory=True) if (self.cuda and self.voting) else None
        self.work = self.event = None
        self.value = 0.0

    def start(self) -> None:
        if not self.voting:
            return
        self.flag.fill_(max(1.0 if _TERM else 0.0, _LEAVE))  # a fill from a host scalar: queued, no copy to wait for
        with op("the preemption check (all-reduce MAX of one flag over all ranks)", scale()):
            self.work = dist.all_reduce(self.flag, op=dist.ReduceOp.MAX, async_op=True)
        if self.cuda:
            self.work.wait()  # NCCL: the current stream waits for the all-reduce; the host does not
            self.host.copy_(self.flag, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()

    def result(self) -> bool:
        """Whether every rank stops after this step; the voted number stays in `value` (runtime.leaving.decode:
        a leave asked by rank 0 rides on the same vote)."""
        if not self.voting:
            self.value = max(1.0 if _TERM else 0.0, _LEAVE)
            return bool(self.value)
        with device_wait("the preemption check"):
            if self.cuda:
                self.event.synchronize()
                self.value = float(self.host.item())
            else:
                self.work.wait()
                self.value = float(self.flag.item())
        return bool(self.value)


# -- test-only hooks ----------------------------------------------------------------------------------------------


def _hook(name: str):
    value = os.environ.get(name)
    if not value:
        return None
    rank, step, *where = value.split(":")
    return int(rank), int(step), where[0] if where else "step"


_HOOKS = None


def test_hooks(rank: int, step: int, where: str = "step") -> None:
    """Drills: act on SCALEC_TEST_{KILL,HANG,TERM}_AT=RANK:STEP[:WHERE] (1-based step about to run; WHERE: `step`,
    its start, or `loss`, before its loss all-reduce); SCALEC_TEST_NODE_DIES=NAME:STEP (the node's agent and
    workers killed, first attempt only); SCALEC_TEST_NODE_CRASHES=NAME:STEP:N (the node's first worker SIGKILLed at
    STEP in each of the first N attempts: a node that crash-loops, its agent alive)."""
    global _HOOKS
    if _HOOKS is None:
        _HOOKS = {k: _hook(f"SCALEC_TEST_{k}_AT") for k in ("KILL", "HANG", "TERM")}
        dies = os.environ.get("SCALEC_TEST_NODE_DIES")
        if dies:  # NAME:STEP: the node named NAME (runtime.node_record.node_name) dies at that step
            name, at = dies.rsplit(":", 1)
            _HOOKS["DIES"] = (name, int(at), os.getppid())  # the parent: this node's torchrun agent
        crashes = os.environ.get("SCALEC_TEST_NODE_CRASHES")
        if crashes:  # NAME:STEP:ATTEMPTS: the node's first worker crashes at that step in its first ATTEMPTS attempts
            name, at, times = crashes.rsplit(":", 2)
            _HOOKS["CRASHES"] = (name, int(at), int(times))
        if not any(_HOOKS.values()):
            _HOOKS = {}
    if not _HOOKS:
        return
    if "DIES" in _HOOKS and where == "step" and attempt() == 0:
        name, at, agent = _HOOKS["DIES"]
        from runtime.node_record import node_name
        if step == at and node_name() == name:  # the agent first (nothing restarts this node), then this worker
            sys.stdout.flush()
            if agent > 1:
                try:
                    os.kill(agent, signal.SIGKILL)
                except ProcessLookupError:  # the node's other worker killed it first
                    pass
            os.kill(os.getpid(), signal.SIGKILL)
    if "CRASHES" in _HOOKS and where == "step" and os.environ.get("LOCAL_RANK", "0") == "0":
        name, at, times = _HOOKS["CRASHES"]
        from runtime.node_record import node_name
        if step == at and attempt() < times and node_name() == name:  # the worker only: its agent restarts the job
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
    here = (rank, step, where)
    if _HOOKS.get("KILL") == here and attempt() == 0:
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    if _HOOKS.get("TERM") == here and attempt() == 0:
        os.kill(os.getpid(), signal.SIGTERM)
    if _HOOKS.get("HANG") == here:
        while not _TERM:  # hung, but in Python: torchrun's SIGTERM still ends it
            time.sleep(0.1)
        os._exit(128 + signal.SIGTERM)


def save_weights_if_asked(named_params, ctx) -> None:
    """Test-only (SCALEC_TEST_SAVE_WEIGHTS=FILE): rank 0 saves the final weights, whole, for bitwise comparison."""
    path = os.environ.get("SCALEC_TEST_SAVE_WEIGHTS")
    if not path:
        return
    state = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu() for n, p in named_params()}
    if ctx.is_logger:
        torch.save(state, path)


# -- hangs --------------------------------------------------------------------------------------------------------

GRACE = 5.0  # seconds the waiting ranks give each other to report before the lowest one speaks


def _watch() -> None:
    while True:
        time.sleep(min(1.0, max(0.05, _TIMEOUT / 10)))
        cur = _CURRENT
        if cur is not None and time.monotonic() - cur[2] > _TIMEOUT:
            _timed_out(cur)
        if _TERM and time.monotonic() - _TERM_AT > TERM_GRACE:  # stuck: the step will not end, leave now
            where = f" in {cur[0]}{_site_text(cur[1])}" if cur else ""
            print(f"scalec: {describe_rank()} got {_TERM_SIGNAL} {TERM_GRACE:g} s ago and is still at step "
                  f"{_STEP}{where}: leaving without a checkpoint", file=sys.stderr, flush=True)
            os._exit(128 + signal.Signals[_TERM_SIGNAL])


def _timed_out(cur) -> None:
    what, site, started = cur
    if _CTX is None:  # still starting: no mesh, no store to compare notes in
        print(f"scalec: rank {os.environ.get('RANK', '0')} waited more than {_TIMEOUT:g} s in {what}; the other "
              "ranks did not all arrive (check that every node started, and MASTER_ADDR/MASTER_PORT)",
              file=sys.stderr, flush=True)
        os._exit(1)
    me = _CTX.rank
    waited = time.monotonic() - started
    line = f"{describe_rank()} waits in {what}{_site_text(site)} at step {_STEP}"
    _dump_flight_recorder()
    store, world = _STORE, _CTX.world_size
    reports = {me: line}
    try:
        store.set(f"timeout/{me}", line)
        deadline = time.monotonic() + GRACE
        while time.monotonic() < deadline:
            time.sleep(0.2)
        for r in range(world):
            if r != me and store.check([f"timeout/{r}"]):
                reports[r] = store.get(f"timeout/{r}").decode()
    except Exception:  # noqa: BLE001 - the store is gone: report what this rank knows
        pass
    if min(reports) == me:
        missing = [r for r in range(world) if r not in reports]
        text = [f"scalec: a collective did not complete within the timeout ({_TIMEOUT:g} s; this rank waited "
                f"{waited:.0f} s):"]
        text += [f"  {reports[r]}" for r in sorted(reports)]
        if missing:
            text += [f"  rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing[:16]))}"
                     f"{' …' if len(missing) > 16 else ''} never joined: not in any collective (hung or busy outside "
                     "communication, or dead)"]
        if os.environ.get("TORCH_FR_DUMP_TEMP_FILE") and _nccl():
            text += [f"  NCCL flight recorder: {os.environ['TORCH_FR_DUMP_TEMP_FILE']}<rank> (read it with "
                     "`python -m torch.distributed.flight_recorder.fr_trace`)"]
        text += ["  help: raise `timeout` in the `train` section if this step is legitimately slow"]
        print("\n".join(text), file=sys.stderr, flush=True)
    else:
        time.sleep(GRACE)  # let the lowest waiting rank speak first
    sys.stdout.flush()
    os._exit(1)


def _nccl() -> bool:
    try:
        return dist.get_backend() == "nccl"
    except Exception:  # noqa: BLE001
        return False


def _dump_flight_recorder() -> None:
    path = os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
    if not (path and _nccl()):
        return
    try:
        c10d = torch._C._distributed_c10d
        dump = getattr(c10d, "_dump_nccl_trace", None) or c10d._dump_fr_trace
        data = dump()  # the pickled trace of this rank's last collectives
        with open(f"{path}{_CTX.rank}", "wb") as f:
            f.write(data)
    except Exception:  # noqa: BLE001 - best effort: torch dumps it itself at its own timeout
        pass


# -- the one line a failed rank prints ----------------------------------------------------------------------------

_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Connection refused",
              "NCCL communicator was aborted", "remote process exited")


def lost_peer(exc: BaseException) -> bool:
    """Whether `exc` is a collective failing because a peer rank is gone (its connection closed or reset)."""
    return any(s in str(exc) for s in _PEER_LOST)


def failure_line(exc: BaseException) -> str:
    """One line: this rank, where it was, and the cause; a lost peer is said as such, naming the peers that did not
    answer when the survivors compared notes in the store."""
    cur = _CURRENT
    where = f" in {cur[0]}{_site_text(cur[1])}" if cur else ""
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    msg = msg.split(". This is typically caused")[0]
    if lost_peer(exc):
        lost = _lost_peers()
        who = (f"rank{'s' if len(lost) > 1 else ''} {', '.join(map(str, lost))} did not answer (likely the first to "
               "fail: see its log)") if lost else "a peer rank is gone"
        return f"scalec: {describe_rank()} lost a peer at step {_STEP}{where}: {who} ({type(exc).__name__}: {msg})"
    return f"scalec: {describe_rank()} failed at step {_STEP}{where}: {type(exc).__name__}: {msg}"


def _lost_peers() -> list[int]:
    if _STORE is None or _CTX is None:
        return []
    try:
        me, world = _CTX.rank, _CTX.world_size
        _STORE.set(f"alive/{me}", "1")
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            if _STORE.check([f"alive/{r}" for r in range(world)]):
                return []
            time.sleep(0.2)
        return [r for r in range(world) if not _STORE.check([f"alive/{r}"])]
    except Exception:  # noqa: BLE001
        return []
