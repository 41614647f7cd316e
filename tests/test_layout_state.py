"""compiler/layout/state.py: the rows of a rank's model state, for every data-parallel mode × precision on a small
plan, checked against what the program holds (runtime/train.py, runtime/precision.py) and against the per-parameter
table the plan's summary prints (memory.state_per_param)."""
from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

from compiler import plan as P
from compiler.cost import memory as MEM
from compiler.layout import state as ST
from runtime import choices


def _plan(mode="ddp", dp=4, pp=1, ep=1, cp=1, m=4, **kw):
    axes = tuple((a, n) for a, n in (("dp", dp), ("pp", pp), ("ep", ep), ("cp", cp)) if n > 1) or (("dp", 1),)
    return P.Plan(axes=axes, data_parallel=mode, micro_batches=m,
                  global_batch=8 * dp * ep, seq_len=128, **kw)


def _by(rows, params=ST.DENSE):
    return {r.kind: r for r in rows if r.params == params}


MODES = choices.DATA_PARALLEL
PRECISIONS = ("fp32", "bf16")


@pytest.mark.parametrize("mode,precision", list(itertools.product(MODES, PRECISIONS)))
def test_rows_of_each_mode_and_precision(mode, precision):
    """What each mode shards and keeps, on dp = 4: the kinds present, their dtypes and groups."""
    plan = _plan(mode)
    rows = ST.rows(plan, precision)
    dense = _by(rows)
    stage = choices.ZERO_STAGE[mode]
    assert plan.zero_stage == stage
    # moments: always 8 bytes, over dp from zero1 on; whole tensors to a rank under fp32 zero1
    assert dense[ST.MOMENTS].dtype_bytes == 8
    assert dense[ST.MOMENTS].size == (4 if stage >= 1 else 1)
    assert dense[ST.MOMENTS].partition == ("tensors" if stage == 1 and precision == "fp32" else "elements")
    if precision == "bf16":
        assert dense[ST.COMPUTE].dtype_bytes == 2 and dense[ST.COMPUTE].size == 1
        if stage < 2:  # the optimizer's fp32 master, sharded with the moments under zero1
            assert ST.WEIGHTS not in dense
            assert (dense[ST.MASTER].dtype_bytes, dense[ST.MASTER].size) == (4, 4 if stage == 1 else 1)
        else:  # FSDP2: the sharded fp32 parameter is the master
            assert ST.MASTER not in dense
            assert (dense[ST.WEIGHTS].dtype_bytes, dense[ST.WEIGHTS].size) == (4, 4)
    else:
        assert ST.MASTER not in dense
        assert dense[ST.WEIGHTS].dtype_bytes == 4
        assert dense[ST.WEIGHTS].size == (4 if stage == 3 else 1)
    if stage >= 2:  # accumulated whole in G bytes until the reduce-scatter, then an fp32 shard
        assert dense[ST.GRADS].alive == ST.ACCUMULATING and dense[ST.GRADS].size == 1
        assert (dense[ST.MAIN_GRADS].dtype_bytes, dense[ST.MAIN_GRADS].size) == (4, 4)
    else:
        assert ST.MAIN_GRADS not in dense
        assert dense[ST.GRADS].alive == ST.TO_STEP and dense[ST.GRADS].dtype_bytes == 4
    assert all(r.group == ("dp" if r.size == 4 else "") for r in rows)


@pytest.mark.parametrize("mode,precision", list(itertools.product(MODES, PRECISIONS)))
def test_step_rows_give_the_per_parameter_table(mode, precision):
    """At the optimizer step the rows alive, per element, are memory.state_per_param's figures (weights,
    gradients and optimizer columns) for every mode and precision: one table, not two."""
    plan = _plan(mode)
    per = MEM.state_per_param(precision, mode, 4, plan.grad_reduce)
    got = {"weights": 0.0, "grads": 0.0, "optimizer": 0.0}
    for r in ST.rows(plan, precision):
        if r.params == ST.DENSE and r.alive_at(ST.STEP_PEAK):
            got[r.column] += r.dtype_bytes / r.size
    # bf16 zero2: state_per_param counts the kept bf16 units with the weights; the rows have them alive from a
    # unit's forward to its backward only (the backward's instant)
    assert got == pytest.approx({"weights": per.params - (2 if precision == "bf16" and mode == "zero2" else 0),
                                 "grads": per.grads, "optimizer": per.optimizer}), got


def test_one_dp_rank_shards_nothing():
    """dp = 1: every mode is ddp (choices.zero_stage): no row is sharded and FSDP2's rows do not appear."""
    for mode in MODES:
        rows = ST.rows(_plan(mode, dp=1), "bf16")
        assert all(r.size == 1 and r.group == "" for r in rows)
        assert ST.MAIN_GRADS not in _by(rows)


def test_groups_under_ep_cp_and_the_tied_copy():
    """FSDP2 with ep: the dense rows over dp × ep, the experts' over dp; under cp both also over cp; zero1 shards
    both over dp (× cp) alone; the tied embedding's copy is a row class only under pp with a tied head."""
    fsdp = ST.rows(_plan("fsdp", ep=2), "bf16")
    assert _by(fsdp)[ST.MOMENTS].group == "dp×ep" and _by(fsdp)[ST.MOMENTS].size == 8
    assert _by(fsdp, ST.EXPERT)[ST.MOMENTS].group == "dp" and _by(fsdp, ST.EXPERT)[ST.MOMENTS].size == 4
    both = ST.rows(_plan("zero2", ep=2, cp=2), "fp32")
    assert (_by(both)[ST.MAIN_GRADS].group, _by(both)[ST.MAIN_GRADS].size) == ("dp×cp×ep", 16)
    assert (_by(both, ST.EXPERT)[ST.MAIN_GRADS].group, _by(both, ST.EXPERT)[ST.MAIN_GRADS].size) == ("dp×cp", 8)
    zero1 = ST.rows(_plan("zero1", ep=2), "fp32")
    assert {r.size for r in zero1 if r.kind == ST.MOMENTS} == {4}
    assert not any(r.params == ST.TIED for r in ST.rows(_plan(pp=1), "fp32", tied=True))
    tied = ST.rows(_plan(pp=2), "fp32", tied=True)
    assert [(r.kind, r.size) for r in tied if r.params == ST.TIED] == \
        [(r.kind, r.size) for r in tied if r.params == ST.DENSE]


def test_when_alive_follows_the_wrapper():
    """zero2 and pp keep FSDP2's units gathered from forward to backward; fsdp without pp gathers a few at a time;
    gradients reduce-scattered every micro-batch are a shard from the first backward."""
    assert _by(ST.rows(_plan("zero2"), "bf16"))[ST.COMPUTE].alive == ST.UNIT
    assert _by(ST.rows(_plan("fsdp"), "bf16"))[ST.COMPUTE].alive == ST.GATHER
    assert _by(ST.rows(_plan("fsdp", pp=2), "bf16"))[ST.COMPUTE].alive == ST.UNIT
    assert _by(ST.rows(_plan("fsdp", pp=2), "fp32"))[ST.WEIGHTS].alive == ST.AFTER_BACKWARD
    each = _by(ST.rows(_plan("fsdp", fsdp_grad_sync="micro_batch"), "bf16"))
    assert ST.GRADS not in each and each[ST.MAIN_GRADS].alive == ST.TO_STEP
    for alive in ST.MOMENTS_OF_STEP:
        assert any(alive in at for at in ST.ALIVE_AT.values())


def test_every_row_is_on_the_device_without_offload():
    """Without a plan's offload every row is on the device (tests/test_offload_cost.py: the rows it moves)."""
    seen = 0
    for mode, precision, pp, ep in itertools.product(MODES, PRECISIONS, (1, 2), (1, 2)):
        for r in ST.rows(_plan(mode, pp=pp, ep=ep), precision, tied=True):
            assert r.location == ST.DEVICE
            seen += 1
    assert seen > 100
    assert ST.HOST != ST.DEVICE


def test_state_is_torch_free():
    code = ("import sys; import compiler.layout.state; "
            "assert 'torch' not in sys.modules and not any(m.startswith('compiler.cost') for m in sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_terms_sum_each_column_by_group():
    """Rows.terms, what the memory model reads: bf16 zero1's fp32 master and moments one optimizer term of 12 bytes
    an element over dp; without gradients yet (a first micro-batch) no gradient term; under FSDP2 with ep a term
    carries both groups' sizes (dense over dp × ep, experts over dp)."""
    rows = ST.rows(_plan("zero1"), "bf16")
    step = dict(rows.terms(ST.STEP_PEAK))
    assert step[("optimizer", 4, 4, "elements")] == 12
    assert step[("weights", 1, 1, "elements")] == 2 and step[("grads", 1, 1, "elements")] == 4
    assert not any(column == "grads" for (column, *_), _ in rows.terms(ST.BACKWARD_PEAK, grads=False))
    fsdp = dict(ST.rows(_plan("fsdp", ep=2), "bf16").terms(ST.STEP_PEAK))
    assert fsdp == {("weights", 8, 4, "elements"): 4, ("grads", 8, 4, "elements"): 4,
                    ("optimizer", 8, 4, "elements"): 8}
    # fsdp without pp: the gathered bf16 units are a working set, not a term
    back = dict(ST.rows(_plan("fsdp"), "bf16").terms(ST.BACKWARD_PEAK))
    assert back == {("weights", 4, 4, "elements"): 4, ("grads", 1, 1, "elements"): 4,
                    ("optimizer", 4, 4, "elements"): 8}
