"""runtime.errors: a fatal error is reported by one rank, and the ranks that print nothing leave after it, so that
the launcher (which stops every rank at the first exit) cannot kill the reporter before its message is written."""
from __future__ import annotations

import time

import pytest
import torch.distributed as dist

from runtime import errors


def test_without_a_process_group_only_rank_0s_node_waits(monkeypatch):
    slept = []
    monkeypatch.setattr(errors.time, "sleep", slept.append)
    monkeypatch.setenv("GROUP_RANK", "0")
    errors.leave_after_reporter()
    assert slept == [errors.FOLLOWER_GRACE_S]
    monkeypatch.setenv("GROUP_RANK", "1")  # another agent: it must see its own ranks' exit code, not the store's end
    errors.leave_after_reporter()
    assert slept == [errors.FOLLOWER_GRACE_S]


@pytest.fixture
def group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_with_a_process_group_the_silent_ranks_wait_for_the_reporter_and_no_longer(group, monkeypatch, capsys):
    monkeypatch.setattr(errors, "FOLLOWER_GRACE_S", 0.4)
    start = time.monotonic()
    errors.leave_after_reporter()  # nobody has reported: the whole grace, then leave
    assert time.monotonic() - start >= 0.35
    assert not errors.announce(errors.FatalError(None), 0)  # a follower prints nothing
    assert errors.announce(errors.FatalError("scalec: the reason"), 0)
    assert not errors.announce(errors.FatalError("scalec: the reason"), 1)  # printed once for the job
    assert capsys.readouterr().err == "[rank 0] scalec: the reason\n"
    monkeypatch.setattr(errors, "FOLLOWER_GRACE_S", 30.0)
    start = time.monotonic()
    errors.leave_after_reporter()  # the reporter has printed: leave at once
    assert time.monotonic() - start < 5.0
