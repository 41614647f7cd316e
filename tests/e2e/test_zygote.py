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
