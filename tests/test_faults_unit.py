"""runtime.faults without a process group: what a stuck collective is called, and the one line of a failure."""
from __future__ import annotations

from runtime import faults


def test_a_generated_call_is_named_by_its_scale_line_and_reason(tmp_path):
    program = tmp_path / "program.py"
    program.write_text("x = 1\ny = collectives.all_reduce_fwd_identity_bwd(x, 'tp')  # tp: forward all-reduce, "
                       "backward identity; row-parallel output of mlp (gpt.scale:17)\n")
    assert faults._site_text((str(program), 2)) == (
        " at gpt.scale:17 (tp: forward all-reduce, backward identity; row-parallel output of mlp)")
    assert faults._site_text((str(program), 1)) == " at program.py:1"
    assert faults._site_text(None) == ""


def test_regions_nest_and_the_innermost_is_reported():
    assert faults._CURRENT is None
    with faults.op("the backward"):
        with faults.op("all_reduce over tp (backward)", ("program.py", 3)):
            assert faults._CURRENT[:2] == ("all_reduce over tp (backward)", ("program.py", 3))
        assert faults._CURRENT[0] == "the backward"
    assert faults._CURRENT is None


def test_a_failure_is_one_line_with_where_it_happened():
    faults.set_step(4)
    with faults.op("the loss all-reduce over the batch ranks"):
        line = faults.failure_line(ValueError("bad shape\nmore detail"))
    assert line == ("scalec: rank 0 failed at step 4 in the loss all-reduce over the batch ranks: "
                    "ValueError: bad shape")
