"""runtime.faults.agree_attempt: the workers of one torchrun attempt agree on its generation through the store that
outlives the attempts, whatever each agent's restart count says, however their starts are staggered, and when an
earlier attempt left a generation half joined (a worker died before joining)."""
from __future__ import annotations

import random
import threading
import time

import pytest
import torch.distributed as dist

from runtime import faults


@pytest.fixture()
def server():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    yield store


def _client(server):
    return dist.TCPStore("127.0.0.1", server.port, is_master=False)


def _attempt(server, ranks, world, delays=None, timeout=60.0):
    """Start one worker per rank in `ranks` (each with its own store client, as torchrun's workers have), each after
    its delay; return {rank: generation or the exception it raised}."""
    out, threads = {}, []

    def worker(rank, delay):
        time.sleep(delay)
        try:
            out[rank] = faults.agree_attempt(_client(server), rank, world, timeout)
        except RuntimeError as exc:
            out[rank] = exc
    for rank in ranks:
        t = threading.Thread(target=worker, args=(rank, (delays or {}).get(rank, 0.0)))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    return out


def test_two_agents_agree_on_each_attempt_whatever_their_restart_counts(server, monkeypatch):
    """Two agents of one rank each, restarted three times; torchrun's restart count would say 1 on the agent
    whose worker failed and 0 on the other (a membership-change restart): the generation is agreed in the store."""
    seen = []
    for n, count in enumerate(("0", "1", "1")):
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", count)  # not read: a per-agent count disagrees
        got = _attempt(server, [0, 1], 2, delays={n % 2: 0.05})  # the other agent's worker starts later
        assert got[0] == got[1], got
        seen.append(got[0])
    assert seen == [0, 1, 2]


def test_a_half_joined_attempt_is_skipped_not_joined(server):
    """An attempt in which rank 1 died before joining left rank 0 alone in its generation; the next attempt's
    rank 1 could fill that generation's empty slot, but never agrees there: every worker of the new attempt
    meets in a generation no earlier attempt used, whichever of them starts first."""
    assert _attempt(server, [0, 1], 2) == {0: 0, 1: 0}
    half = _attempt(server, [0], 2, timeout=0.3)  # rank 1 never came: rank 0 gives up (the attempt failed)
    assert isinstance(half[0], RuntimeError) and "1 of 2 ranks started" in str(half[0])
    for first in (1, 0):  # the slot rank 1 lacks in the half-joined generation, taken first or last
        got = _attempt(server, [0, 1], 2, delays={1 - first: 0.1})
        assert got[0] == got[1] and isinstance(got[0], int), got
    assert got[0] >= 3


def test_many_staggered_attempts_with_dead_workers_agree(server):
    """Random start orders, and before some attempts a half-joined one (a random subset of ranks that then died):
    the ranks of every complete attempt agree, on a generation larger than any earlier attempt's."""
    rng = random.Random(7)
    world, last = 3, -1
    for _ in range(6):
        if rng.random() < 0.5:
            dead = rng.sample(range(world), rng.randint(1, world - 1))
            _attempt(server, dead, world, timeout=0.2)
        got = _attempt(server, range(world), world, delays={r: rng.random() * 0.05 for r in range(world)})
        gens = set(got.values())
        assert len(gens) == 1 and isinstance(next(iter(gens)), int), got
        assert next(iter(gens)) > last
        last = next(iter(gens))
