"""Issue 41's route-around drill, one trial (`python -m bench.route_around_drill -n 10` runs ten): a node made slow in
an 8-rank run with `on_straggler = replan` is left out, `scalec run` re-plans on the 6 ranks left, the run resumes
from its checkpoint on the new plan, and its losses equal (1e-6) a reference started on that plan from the same
checkpoint; and the same with a node that dies (its agent and workers killed: `--dead`) and one whose worker crashes
in two attempts in a row (`--crashing`)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench import route_around_drill as D


# slow tier: a minute (a slow node) or two (a dead node: the rendezvous waits out its keep-alive and its last call)
# of eight CPU processes and two relaunches here; CI holds the pieces: the re-plan and the run loop that launches it
# (tests/test_replan.py), the ask on the vote and each rank's status (tests/test_stragglers.py), the launcher's
# statuses (tests/test_node_record.py, tests/test_faults_unit.py), the members and the request of a smaller world
# (tests/test_node_record.py)
@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("how", ["slow", "dead", "crashing"], ids=["slow_node", "dead_node", "crashing_node"])
def test_a_node_is_left_out_and_the_run_resumes_on_the_re_planned_mesh(how):
    args = SimpleNamespace(rank=5, onset=8 if how == "crashing" else 21, fraction=1.0, steps=45, tolerance=1e-6,
                           timeout=600, remembered=False, restart=False, dead=how == "dead",
                           crashing=how == "crashing")
    ok, line = D.trial(args, 0, keep=False)
    assert ok, line  # within 1e-6 of the reference (bitwise in most trials: the note's figures)
