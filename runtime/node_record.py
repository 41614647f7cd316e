"""What earlier attempts saw of each node, remembered across restarts: `<checkpoint_dir>/nodes.json`.

A node is named by its host (`socket.gethostname()`; under SLURM its SLURMD_NODENAME), or by SCALEC_NODE where set (several torchrun agents on one
machine, as the drills run them, each set its own); torchrun's GROUP_RANK, the node's place in this attempt's
rendezvous round, changes between rounds and is kept beside each event, not used as the name. Each event says what
was seen (`slow`: the straggler detector's rank, section, score and step; `unhealthy`: runtime.health's reasons;
`excluded`: the node left out by `restart(exclude = node)`; `crashed`: its workers failed on their own, not as
victims of another rank's failure nor on purpose, with how: `crash`) and in which attempt (runtime.faults.attempt()).

A crash is seen by the node's torchrun agent (runtime.launch), which passes it to the workers it starts next
(CRASHED_ENV); the next attempt's rank 0 gathers each node's (runtime.stragglers) and marks the nodes that crashed,
where some but not every node did (every node failing is the job's failure, not a node's). A node that crashed in
`n` attempts in a row is `crash_looping`, and is left out as a node flagged slow or unhealthy is.

Written by rank 0 only, atomically: the whole file is written to a temporary file beside it and renamed over it
(`os.replace`), so a reader (another attempt, a person, launch.sbatch) sees the old file or the new one, never a
half-written one. A damaged file (not JSON, or not this shape) gives one warning and is read as empty; the next
mark replaces it. No torch at import.

    record = NodeRecord(os.path.join(checkpoint_dir, FILE))
    record.mark(node_name(), "slow", {"rank": 5, "section": "backward", "score": 0.62, "step": 140}, attempt())
    print(startup_line(record))   # rank 0, at start-up: the nodes flagged in earlier attempts, or None
"""
from __future__ import annotations

import json
import os
import socket
import sys
import tempfile

from runtime.errors import EXIT_CODE, EXIT_EXCLUDE, EXIT_PEER, EXIT_REJOIN, REPLAN_CODE

FILE = "nodes.json"
KINDS = ("slow", "unhealthy", "excluded", "crashed")
VERSION = 1


def node_name() -> str:
    """This process's node: SCALEC_NODE where set, else SLURM's name of the node (SLURMD_NODENAME, which srun sets
    in each task: the name `sbatch --exclude` and `srun --exclude` take), else the host's name."""
    return os.environ.get("SCALEC_NODE") or os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def _warn(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class NodeRecord:
    """The record at `path` (`<checkpoint_dir>/nodes.json`): {"version": 1, "nodes": {name: [event, ...]}}, each
    event {"kind", "attempt", "group_rank", "host", "detail"}."""

    @classmethod
    def at(cls, directory: str | None) -> "NodeRecord | None":
        """The record of the checkpoint `directory` (`FILE` in it), or None without a directory."""
        return cls(os.path.join(directory, FILE)) if directory else None

    def __init__(self, path: str, warn=_warn):
        self.path = str(path)
        self._warn = warn
        self._warned = False

    def _data(self) -> dict | None:
        """The file as read: a dict, {} where there is none, None where it is damaged (warned once)."""
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            self._damaged(f"{type(exc).__name__}: {exc}")
            return None
        return data if isinstance(data, dict) else None

    def load(self) -> dict:
        """{node name: [event, ...]}; empty where there is no file yet, or (with one warning) a damaged one."""
        data = self._data()
        if data is None:
            return self._damaged("not a node record")
        if not data:
            return {}
        nodes = data.get("nodes")
        if not isinstance(nodes, dict) or not all(isinstance(v, list) and all(isinstance(e, dict) for e in v)
                                                  for v in nodes.values()):
            return self._damaged("not a node record")
        return nodes

    def _damaged(self, why: str) -> dict:
        if not self._warned:
            self._warned = True
            self._warn(f"scalec: warning: the node record {self.path} is damaged ({why}); earlier attempts' "
                       "nodes are forgotten, and the next mark writes it afresh")
        return {}

    def mark(self, node: str, kind: str, detail, attempt: int, group_rank: int | None = None,
             host: str | None = None) -> None:
        """Add what `attempt` saw of `node` (`kind`: slow, unhealthy or excluded; `detail`: plain values) and write
        the record atomically. Rank 0's to call."""
        if kind not in KINDS:
            raise ValueError(f"NodeRecord.mark: kind {kind!r} is not one of {', '.join(KINDS)}")
        nodes = self.load()
        if group_rank is None and os.environ.get("GROUP_RANK", "").isdigit() and node == node_name():
            group_rank = int(os.environ["GROUP_RANK"])
        nodes.setdefault(node, []).append({"kind": kind, "attempt": int(attempt), "group_rank": group_rank,
                                           "host": host or (socket.gethostname() if node == node_name() else None),
                                           "detail": detail})
        self._write({**self._kept(), "version": VERSION, "nodes": nodes})

    def _kept(self) -> dict:
        """What a write keeps of the file besides its nodes: the last attempt's members."""
        data = self._data() or {}
        members = data.get("members")
        return {"members": members} if isinstance(members, dict) else {}

    def set_members(self, names: list, attempt: int) -> None:
        """Rank 0, at an attempt's start: the node names of the attempt by torchrun's group rank, what a later
        attempt that starts with fewer nodes compares its own with (`members`) to name the nodes gone."""
        data = self._data() or {}
        if data.get("members") == {"attempt": int(attempt), "names": list(names)}:
            return
        self._write({"version": VERSION, "nodes": self.load(), "members": {"attempt": int(attempt),
                                                                          "names": list(names)}})

    def members(self) -> list | None:
        """The node names of the last attempt that started whole (`set_members`), by group rank; None: unknown."""
        got = (self._data() or {}).get("members")
        names = got.get("names") if isinstance(got, dict) else None
        return list(names) if isinstance(names, list) and all(isinstance(n, str) for n in names) else None

    def _write(self, data: dict) -> None:
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(self.path)}.", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise

    def flagged(self, min_count: int = 1, kinds=("slow", "unhealthy")) -> dict:
        """{node: [event, ...]} of the nodes flagged (events of `kinds`) in at least `min_count` distinct attempts."""
        out = {}
        for node, events in self.load().items():
            seen = [e for e in events if e.get("kind") in kinds]
            if len({e.get("attempt") for e in seen}) >= min_count and seen:
                out[node] = seen
        return out

    def crash_looping(self, min_count: int) -> dict:
        """{node: its `crashed` events} of the nodes that crashed in `min_count` attempts in a row (attempts n, n + 1,
        ...): a node that crashes again each time the job restarts, where one crash may be bad luck."""
        out = {}
        for node, events in self.load().items():
            seen = [e for e in events if e.get("kind") == "crashed" and isinstance(e.get("attempt"), int)]
            attempts = {e["attempt"] for e in seen}
            if min_count >= 1 and any(all(a + i in attempts for i in range(min_count)) for a in attempts):
                out[node] = seen
        return out

    def excluded(self) -> list[str]:
        """The nodes left out by `restart(exclude = node)`, in the order first left out."""
        return [node for node, events in self.load().items() if any(e.get("kind") == "excluded" for e in events)]


def _attempts(numbers: list) -> str:
    nums = sorted(set(numbers))
    if len(nums) == 1:
        return f"attempt {nums[0]}"
    return f"attempts {', '.join(str(n) for n in nums[:-1])} and {nums[-1]}"


def _detail(event: dict) -> str:
    d = event.get("detail")
    if not isinstance(d, dict):
        return str(d) if d is not None else ""
    if event.get("kind") == "slow":
        parts = [f"rank {d['rank']}" if "rank" in d else "", str(d.get("section", "")),
                 f"score {d['score']:.2f}" if isinstance(d.get("score"), (int, float)) else "",
                 f"step {d['step']}" if "step" in d else ""]
        return " ".join(p for p in parts if p)
    if "reasons" in d:
        return "; ".join(str(r) for r in d["reasons"])
    if event.get("kind") == "crashed":
        return " ".join(p for p in (f"rank {d['rank']}" if "rank" in d else "", str(d.get("how", ""))) if p)
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items()))


def describe(node: str, events: list) -> str:
    """One node's history in words: 'node gpu-a18 (group rank 1) was slow in attempts 0 and 1 (rank 5 backward
    score 0.62 step 140), unhealthy in attempt 1 (...)'."""
    group = next((e.get("group_rank") for e in reversed(events) if e.get("group_rank") is not None), None)
    host = next((e.get("host") for e in reversed(events) if e.get("host") and e.get("host") != node), None)
    where = ", ".join(x for x in (f"group rank {group}" if group is not None else "", host and f"host {host}") if x)
    parts = []
    for kind in KINDS:
        seen = [e for e in events if e.get("kind") == kind]
        if seen:
            words = {"slow": "slow", "unhealthy": "unhealthy", "excluded": "left out", "crashed": "crashing"}[kind]
            parts.append(f"{words} in {_attempts([e.get('attempt', 0) for e in seen])} ({_detail(seen[-1])})")
    return f"node {node}{f' ({where})' if where else ''} was {', '.join(parts)}"


def startup_line(record: NodeRecord) -> str | None:
    """Rank 0's start-up line naming every node earlier attempts flagged or left out; None when there is none."""
    nodes = record.load()
    if not nodes:
        return None
    return "scalec: " + "; ".join(describe(node, events) for node, events in nodes.items())


def leave_out(node: str, this: str | None = None) -> int:
    """The exit status with which this worker ends the attempt that leaves out `node` (after rank 0 marked it
    `excluded` and the checkpoint to resume from is saved): EXIT_EXCLUDE on `node` itself (its agent leaves),
    EXIT_REJOIN elsewhere (its agent restarts without it, not counting a restart). runtime.launch reads them."""
    return EXIT_EXCLUDE if node == (this or node_name()) else EXIT_REJOIN


CRASHED_ENV = "SCALEC_CRASHED"
"""Set by runtime.launch's agent for the workers it starts next after its own workers crashed: `crash`'s dict as
JSON. Only the next start carries it."""
BENIGN = (EXIT_CODE, EXIT_EXCLUDE, EXIT_REJOIN, REPLAN_CODE, EXIT_PEER)
"""Exit statuses that are not a crash of the node: a failure no restart fixes (the job's, not the node's), a node
left out or re-planned on purpose, a victim of another rank's failure."""
STOPPED = (15, 2)
"""SIGTERM and SIGINT: a worker stopped (its exit status 128 + n, or -n), a preemption, not a crash."""


def crash(failures: dict) -> dict | None:
    """What a node's agent saw when its workers failed: {global rank: (exit code, how in words)}, exit codes as
    torchrun gives them (negative: the signal). The first rank (lowest) whose status is a crash, as
    {"rank", "exit", "how"}; None where no failure is (every one BENIGN or a stop)."""
    for rank in sorted(failures):
        code, how = failures[rank]
        if code in BENIGN or code in tuple(-n for n in STOPPED) or code in tuple(128 + n for n in STOPPED):
            continue
        return {"rank": int(rank), "exit": int(code), "how": str(how)}
    return None


def crash_report() -> dict | None:
    """This worker's node's crash in the attempt before this one, as its agent passed it (CRASHED_ENV), or None."""
    text = os.environ.get(CRASHED_ENV)
    if not text:
        return None
    try:
        got = json.loads(text)
    except json.JSONDecodeError:
        return None
    return got if isinstance(got, dict) else None


def crashed_nodes(world: list) -> dict:
    """Rank 0, at start-up: {node name: crash} of the nodes whose workers report their agent saw them crash (`world`:
    each rank's {"name", "crashed"}), where some but not every node did: every node crashing is the job's failure
    (a bug, a bad input), which no node is to blame for. {} otherwise."""
    names = {w["name"] for w in world}
    crashed = {w["name"]: w["crashed"] for w in world if w.get("crashed")}
    return crashed if crashed and len(crashed) < len(names) else {}


LEFT_OUT_ENV = "SCALEC_LEFT_OUT"
"""Set by runtime.launch's agent for the workers it restarts after leaving out a node: how many it has left out
(the node record names them)."""


def world_note() -> str:
    """What to add to the start-up refusal of a world that no longer matches the plan, when runtime.launch's agent
    restarted the workers after leaving out a node (LEFT_OUT_ENV): a `replan` is what it needs."""
    left = os.environ.get(LEFT_OUT_ENV, "")
    if not left.isdigit() or int(left) < 1:
        return ""
    nodes = f"{left} node{'s were' if int(left) > 1 else ' was'}"
    return (f": {nodes} left out (restart(exclude = node); the node record names them) and no spare node took its "
            "place, so this plan no longer fits the nodes left; a `replan` is needed (on_straggler = replan), or "
            "start the job again with a spare node")
