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


def test_a_failed_launchs_message_quotes_the_first_rank_to_fail_not_only_the_last_lines():
    """The survivors of a lost peer print a C++ stack each (26 frames): in CI (stop 58) 50 lines of tail held only
    theirs, not the first rank's cause. The message quotes the lines up to the launcher's word on the first failure,
    then the tail, without the frames."""
    frames = [f"frame #{i}: c10::Error::Error(...) + 0x9d (0x7f in libc10.so)" for i in range(26)]
    output = "\n".join(["scalec: step 1 loss 4.1", "scalec: rank 0 (tp=0, ep=0) failed at step 3: RuntimeError: the cause",
                        "zygote: rank 0 exited with 1; stopping the other ranks"]
                       + [line for r in (1, 2, 3) for line in
                          [*frames, f"scalec: rank {r} lost a peer at step 3: a peer rank is gone"]])
    from tests.e2e.runner import excerpt
    got = excerpt(output, tail=5)
    assert "RuntimeError: the cause" in got and "zygote: rank 0 exited" in got
    assert "scalec: rank 3 lost a peer" in got and "frame #" not in got
    plain = "\n".join(f"line {i}" for i in range(100))  # no launcher's word: the last lines
    assert excerpt(plain, before=10, tail=5).splitlines()[1:] == [f"line {i}" for i in range(85, 100)]
