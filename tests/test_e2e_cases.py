"""The e2e table's texts, without launching anything: each case's file carries the plan it names (its `plan` fields
printed by tests/e2e/runner.with_plan), and the single-device reference depends on the model alone, so that cases of
one model share one reference run (tests/e2e/test_e2e.py's `references`)."""
from __future__ import annotations

import dataclasses

import pytest

from compiler import plan as P
from compiler.check import check_text
from tests.e2e.cases import ALL_CASES, CASES, MORE, MORE_IDS, Case
from tests.e2e.runner import CLUSTER_FIELDS, case_text, single_device


@pytest.mark.parametrize("case", [c for c in ALL_CASES if c.plan], ids=[c.id for c in ALL_CASES if c.plan])
def test_case_file_holds_its_plan_fields(case):
    spec = check_text(case_text(case), f"{case.id}.scale")
    assert {k: getattr(spec.cluster if k in CLUSTER_FIELDS else spec.plan, k) for k, _ in case.plan} == dict(case.plan)
    assert spec.plan.world_size == spec.cluster.world_size == case.nproc


def test_references_depend_on_the_model_not_the_plan():
    """One reference per (sample, model and train edits, fp32_residual): the plan fields and the sample's plan and
    mesh wording leave it unchanged, and it is one device with the plan section's defaults."""
    refs: dict = {}
    for case in ALL_CASES:
        text = single_device(case_text(case))
        key = (case.sample, case.edits, dict(case.plan).get("fp32_residual", False))
        assert refs.setdefault(key, text) == text, f"case {case.id}: another reference than its model's other cases"
        spec = check_text(text, "reference.scale")
        plan = spec.plan
        default = P.Plan(axes=(("dp", 1),), data_parallel="ddp", micro_batches=1,
                         global_batch=plan.global_batch, seq_len=plan.seq_len, fp32_residual=key[2])
        assert dataclasses.replace(plan, spans=()) == default, case.id
        assert (spec.cluster.nodes, spec.cluster.devices_per_node) == (1, 1), case.id
    assert len(refs) < len(CASES)


def test_a_case_names_only_plan_fields():
    with pytest.raises(ValueError, match="global_batch"):
        Case(id="x", sample="samples/gpt_dp.scale", nproc=2, description="", plan=dict(global_batch=32))
    assert Case(id="x", sample="samples/gpt_dp.scale", nproc=2, description="",
                plan=dict(data_parallel="fsdp")).plan == (("data_parallel", "fsdp"),)


def test_the_cases_out_of_the_suite_are_named_and_still_valid():
    """Every id MORE names is a case of the table (a renamed case cannot silently leave both lists), and the two
    lists split the table."""
    assert MORE_IDS == {c.id for c in MORE} and len(CASES) + len(MORE) == len(ALL_CASES)
    assert len({c.id for c in ALL_CASES}) == len(ALL_CASES)


def test_the_two_halves_hold_the_table_and_keep_each_reference_in_one():
    """tests/e2e/test_e2e.py and test_e2e_second.py run the halves on the two workers: every CI case in exactly
    one, the cases of one single-device reference in the same one (each file runs its references once)."""
    from tests.e2e.cases import FIRST, SECOND, _reference_key
    assert sorted(c.id for c in FIRST + SECOND) == sorted(c.id for c in CASES)
    assert FIRST and SECOND and not {c.id for c in FIRST} & {c.id for c in SECOND}
    assert not {_reference_key(c) for c in FIRST} & {_reference_key(c) for c in SECOND}
