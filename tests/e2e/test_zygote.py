"""tests/e2e/zygote.py, the fork server the e2e runner launches programs from: a failing rank ends the launch with
the program's own message, and a launch whose import-time environment differs from the server's is not served."""
from __future__ import annotations

import os

import pytest

from tests.e2e import zygote
from tests.e2e.runner import ROOT, launch

pytestmark = pytest.mark.e2e


@pytest.mark.skipif(os.environ.get("SCALEC_TEST_ZYGOTE") == "0", reason="the zygote server is off")
def test_a_failing_forked_rank_ends_the_launch_with_the_programs_message(tmp_path):
    text = (ROOT / "samples" / "gpt_dp.scale").read_text()  # two ranks
    zygote.stop()  # a server an earlier test of this process started with another environment would not serve it
    with pytest.raises(pytest.fail.Exception) as failed:
        launch(text, "bad_flag", tmp_path, steps=1, timeout=120, extra=("--no-such-flag",))
    message = str(failed.value)
    assert "(forked by tests/e2e/zygote.py)" in message and "program.py" in message
    assert "unrecognized arguments: --no-such-flag" in message
    assert "zygote: rank" in message and "stopping the other ranks" in message


def test_only_an_environment_equal_at_import_is_served():
    base = {"PYTHONPATH": "/x", "OMP_NUM_THREADS": "1", "SCALEC_TEST_SKEW": "0"}
    assert zygote.served(dict(base, SCALEC_TEST_SKEW="3", MASTER_PORT="1234"), base)  # read after the fork
    assert not zygote.served(dict(base, TORCH_LOGS="+dynamo"), base)  # read by torch's import
    assert not zygote.served(dict(base, OMP_NUM_THREADS="2"), base)
    assert not zygote.served({k: v for k, v in base.items() if k != "PYTHONPATH"}, base)


def test_a_failed_launchs_message_quotes_each_ranks_cause_not_only_the_last_lines():
    """The survivors of a lost peer print a C++ stack each (26 frames): in CI (stop 58) 50 lines of tail held only
    theirs, not the first rank's cause. The message quotes every line that says why, wherever it fell (here a
    survivor's lines come between the cause and the launcher's word, as when the failing rank tears its process
    group down before it exits), then the tail, without the frames."""
    frames = [f"frame #{i}: c10::Error::Error(...) + 0x9d (0x7f in libc10.so)" for i in range(26)]
    survivors = [line for r in (1, 2, 3) for line in
                 [*frames, f"scalec: rank {r} (tp=0, ep=1) lost a peer at step 3: a peer rank is gone"]]
    output = "\n".join(["scalec: step 1 loss 4.1", "Traceback (most recent call last):", '  File "x.py", line 1',
                        "RuntimeError: the cause",
                        "scalec: rank 0 (tp=0, ep=0) failed at step 3: RuntimeError: the cause", *survivors[:30],
                        "zygote: rank 1 exited with 3; stopping the other ranks", *survivors[30:]])
    from tests.e2e.runner import excerpt
    got = excerpt(output, tail=5)
    why = got.split("--- the output's last lines ---")[0]
    assert "rank 0 (tp=0, ep=0) failed at step 3: RuntimeError: the cause" in why
    assert "Traceback" in why and "zygote: rank 1 exited" in why and "lost a peer" not in why
    assert "scalec: rank 3 (tp=0, ep=1) lost a peer" in got and "frame #" not in got
    plain = "\n".join(f"line {i}" for i in range(100))  # nothing says why: the last lines alone
    assert excerpt(plain, tail=5).splitlines()[1:] == [f"line {i}" for i in range(95, 100)]
