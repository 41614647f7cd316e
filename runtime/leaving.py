"""Ending an attempt on purpose to leave a node out: `on_straggler = restart(exclude = node)` or `replan`.

Rank 0 names a straggler at the end of a window (runtime.stragglers) and asks to leave its node out (`ask`). The ask
travels in the preemption vote every rank already takes each step (runtime.faults.StopVote: an all-reduce MAX of one
number), so every rank stops after the same step, saves the checkpoint the next attempt resumes from, and reads
the same verdict (`decode`). Then (`finish`):

- `restart`: rank 0 marks the node `excluded` in the node record (runtime.node_record); the workers on that node end
  with runtime.errors.EXIT_EXCLUDE and the others with EXIT_REJOIN, which runtime.launch's agents read (a spare takes
  the node's place, or the job ends for launch.sbatch to submit again without it).
- `replan`: rank 0 writes the request `scalec run` reads (compiler/run_command.py, `REQUEST` in the checkpoint
  directory: the nodes of this attempt, the node to leave out by group rank and by name, why, the step); every
  worker ends with runtime.errors.REPLAN_CODE, which the launcher does not restart; `scalec run` searches the same
  file on the nodes left, writes the plan beside it and launches it, resuming from that checkpoint.

A node that is gone (its machine died, its agent killed): the others' collectives fail and their agents restart
them; with `on_straggler = replan` launch.sh lets torchrun's rendezvous form with one node fewer (`--nnodes N-1:N`),
so the next attempt starts with fewer processes than the plan needs. Its start-up (`shrunk`, before any process
group) compares the nodes that joined with the last whole attempt's (the node record's `members`), and rank 0 asks
for a re-plan leaving out the nodes gone, as above.

The vote's number: 0 go on, 1 a signal (SIGTERM, SIGINT), 2 + 2 × rank + (1 for replan) leave out the node of
`rank`. The largest wins, so a leave outranks a signal (both stop after the same step and save). No torch at import.
"""
from __future__ import annotations

import json
import os

from runtime import node_record
from runtime.errors import REPLAN_CODE

REQUEST = "replan.json"  # compiler/run_command.py REQUEST: the one file name both sides read


def encode(rank: int, action: str) -> float:
    """The vote's number for leaving out the node of `rank` by `action` (restart or replan)."""
    return 2.0 + 2 * rank + (1 if action == "replan" else 0)


def decode(value: float) -> tuple[int, str] | None:
    """(the straggler's rank, restart | replan) from a vote's number, or None (go on, or a signal)."""
    if value < 2:
        return None
    v = int(value) - 2
    return v // 2, "replan" if v % 2 else "restart"


def request(directory: str, world: list, rank: int, step: int, why: str) -> str:
    """Rank 0: the re-plan request in the checkpoint `directory`, written whole (a temporary file renamed over it);
    `world` is each rank's {"node" (torchrun's group rank), "name" (runtime.node_record.node_name)}. Its path."""
    nodes = sorted({w["node"] for w in world})
    return _write(directory, {"nodes": len(nodes), "exclude": [world[rank]["node"]], "hosts": [world[rank]["name"]],
                              "why": why, "step": step})


def _write(directory: str, body: dict) -> str:
    path = os.path.join(directory, REQUEST)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(body, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def finish(verdict: tuple[int, str], world: list, me: int, checkpoint_dir: str, step: int, attempt: int,
           why: str) -> int:
    """After the checkpoint of `step` (1-based) is saved, on every rank: rank 0's records and line, and this rank's
    exit status (module docstring). `world` as `request`'s."""
    rank, action = verdict
    out = world[rank]
    if me == 0:
        where = f"node {out['node']} ({out['name']})"
        record = node_record.NodeRecord.at(checkpoint_dir)
        if record is not None:
            record.mark(out["name"], "excluded", {"rank": rank, "step": step, "action": action}, attempt,
                        group_rank=out["node"], host=out.get("host"))
        if action == "replan":
            path = request(checkpoint_dir, world, rank, step, why)
            print(f"scalec: leaving out {where} after step {step} to re-plan on the nodes left ({why}); the "
                  f"checkpoint is saved and {path} asks `scalec run` for the new plan", flush=True)
        else:
            print(f"scalec: leaving out {where} after step {step} ({why}); the checkpoint is saved and the job "
                  "restarts without it", flush=True)
    if action == "replan":
        return REPLAN_CODE
    return node_record.leave_out(out["name"], world[me]["name"])


def shrunk(resilience, checkpoint_dir: str, world: int, expected: int, store_of) -> int | None:
    """At start-up, where torchrun started `world` processes and the plan needs `expected` (more): with
    `on_straggler = replan` and the last whole attempt's nodes in the node record, every rank's exit status
    (REPLAN_CODE) after rank 0 wrote the request that leaves out the nodes gone; None where this does not apply (the
    start-up refuses the world as before). `store_of()` gives the attempt's store (runtime.faults.attempt_store):
    each node's first rank says its name there, rank 0 reads them all, writes the request and says it is done, and
    every rank waits for that before it ends (its agent stops the node's other workers when the first ends)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0)
    if (resilience is None or getattr(resilience, "on_straggler", "") != "replan" or not checkpoint_dir
            or world >= expected or local < 1 or world % local or expected % local):
        return None
    record = node_record.NodeRecord.at(checkpoint_dir)
    members = record.members()
    if not members or len(members) * local != expected:
        return None
    store = store_of()
    rank, group = int(os.environ.get("RANK", "0")), int(os.environ.get("GROUP_RANK", "0"))
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        store.set(f"shrunk/node{group}", node_record.node_name())
    if rank == 0:
        present = [store.get(f"shrunk/node{g}").decode() for g in range(world // local)]
        gone = [n for n in members if n not in present]
        if gone and len(members) - len(gone) == world // local:
            from runtime.checkpoint import newest_step  # torch: loaded in a worker already
            step = newest_step(checkpoint_dir)
            why = (f"{', '.join(gone)} did not join: {world // local} of the last attempt's {len(members)} nodes "
                   "started")
            for name in gone:
                record.mark(name, "excluded", {"step": step, "action": "replan", "gone": True}, 0,
                            group_rank=members.index(name))
            path = _write(checkpoint_dir, {"nodes": len(members), "exclude": [members.index(n) for n in gone],
                                           "hosts": gone, "why": why, "step": step})
            print(f"scalec: {why}; re-planning on the nodes left from the checkpoint of step {step}: {path} asks "
                  "`scalec run` for the new plan", flush=True)
            store.set("shrunk/done", "replan")
        else:  # not a node gone (the same names, or a count that does not add up): refused at start-up
            store.set("shrunk/done", "refuse")
    got = store.get("shrunk/done").decode()
    return REPLAN_CODE if got == "replan" else None
