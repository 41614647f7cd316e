"""`plan { offload }` under torchrun against the single device (runtime/offload.py): the optimizer's state half on
the host under zero1, the parameters under FSDP2's CPUOffloadPolicy, the blocks' saved activations under pp 2 ×
tp 2. Each trains as the single-device model does (losses and first-step gradients to 1e-5, as the e2e table's
fp32 cases), says at start-up what it put on the host, and reports the bytes it copied each step. That the host's
AdamW is torch's bit for bit (fractions 0, 0.5, 1; fp32 and bf16) is tests/test_offload.py's, on one process.

One model (gpt_3d's) and one single-device reference for the three; one launch each."""
from __future__ import annotations

import re

import pytest
import torch

from tests.e2e.runner import ROOT, assert_same_training, launch, single_device, with_plan

pytestmark = pytest.mark.e2e

TEXT = (ROOT / "samples" / "gpt_3d.scale").read_text()
STEPS = 3


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return launch(single_device(TEXT), "reference", tmp_path_factory.mktemp("offload"), steps=STEPS, timeout=240,
                  nproc=1)


def _run(tmp_path, name: str, nproc: int, count_bytes: bool = False, **plan):
    text = with_plan(TEXT, f"{name}.scale", devices_per_node=nproc, **plan)
    weights = tmp_path / f"{name}.weights.pt"  # the final weights, whole (runtime.faults, test-only)
    run = launch(text, name, tmp_path, steps=STEPS, timeout=240, nproc=nproc, count_bytes=count_bytes,
                 env={"SCALEC_TEST_SAVE_WEIGHTS": str(weights)})
    return run, torch.load(weights)


ZERO1 = dict(axes=(("dp", 2),), data_parallel="zero1")


@pytest.fixture(scope="module")
def half_zero1(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("half"), "optimizer_half_zero1", 2, count_bytes=True, **ZERO1,
                offload="optimizer", offload_fraction=0.5)


# slow tier with the two below (about 10 s each here): the CI suite keeps the pp 2 × tp 2 run, HostAdamW's steps are
# held bit for bit to torch's AdamW on one process (tests/test_offload.py), and its zero1 broadcast is bf16 zero1's
# (runtime.precision.MasterAdamW.publish: the e2e table's dp2_zero1_bf16)
@pytest.mark.slow
def test_half_the_optimizer_on_the_host_under_zero1(reference, half_zero1):
    """zero1 over dp 2, half of each rank's partition of AdamW's state on the host: every step copies those
    parameters' gradients down (fp32) and their values back, the elements the start-up line names, 4 bytes each."""
    run, _ = half_zero1
    assert_same_training(run, reference)
    line = re.search(r"the optimizer state of (\d+) of (\d+) parameter tensors \(([\d,]+) of ([\d,]+) elements",
                     run.output)
    assert line, run.output
    host, mine = (int(line.group(i).replace(",", "")) for i in (3, 4))
    assert 0.5 * mine <= host < mine
    assert all(r["offload_d2h_bytes"] == r["offload_h2d_bytes"] == 4 * host for r in run.records)
    # the ledger's copies are those whole tensors (compiler/cost/offload.host_elements: dp rank 0's partition and
    # prefix, computed with the runtime's functions), measured under --count-bytes with the zero1 broadcasts
    assert {c.op: c.bytes for c in run.costs.ledger.entries if c.axis == "host"} == {"d2h": 4 * host, "h2d": 4 * host}
    assert run.measured == run.predicted and run.measured["h2d/host"] == 4 * host, (run.measured, run.predicted)


@pytest.fixture(scope="module")
def plain_zero1(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("plain"), "zero1", 2, **ZERO1)


@pytest.mark.slow
def test_half_on_the_host_is_zero1_bit_for_bit(half_zero1, plain_zero1):
    """The same run without offload (torch's ZeroRedundancyOptimizer): the same losses and final weights, bit for
    bit (another owner of a parameter runs the same AdamW on the same gradient)."""
    _same_bits(half_zero1, plain_zero1)


@pytest.mark.slow
def test_all_on_the_host_is_zero1_bit_for_bit(plain_zero1, tmp_path):
    """fraction = 1: every parameter of each rank's partition stepped on the host, still torch's ZeRO bit for bit
    (fraction 0 offloads nothing: W0330 says so, tests/mistakes/offload_optimizer_fraction_zero.scale)."""
    _same_bits(_run(tmp_path, "optimizer_all_zero1", 2, **ZERO1, offload="optimizer", offload_fraction=1.0),
               plain_zero1)


def _same_bits(got, plain):
    (run, weights), (ref, ref_weights) = got, plain
    assert run.losses == ref.losses
    assert weights.keys() == ref_weights.keys()
    assert all(torch.equal(weights[k], ref_weights[k]) for k in weights)


# slow tier: 9 s here; the policy is FSDP2's own (torch's tests), the plan's refusals and contract are
# tests/test_offload.py's, and this file's two others keep it within its time
@pytest.mark.slow
def test_parameters_on_the_host_under_fsdp(reference, tmp_path):
    """FSDP2 over dp 2 with its CPUOffloadPolicy on every unit (each block and the root)."""
    run, _ = _run(tmp_path, "params_fsdp", 2, axes=(("dp", 2),), data_parallel="fsdp", offload="params")
    assert_same_training(run, reference)
    held = re.search(r"CPUOffloadPolicy on (\d+) of (\d+) units", run.output)
    assert held and held.group(1) == held.group(2) and int(held.group(1)) == 5, run.output  # 4 blocks + the root


def test_activations_on_the_host_under_pp2_tp2(reference, tmp_path):
    """1F1B over pp 2 × tensor + sequence parallelism over tp 2, attention's and the MLP's saved tensors copied to
    the host in each forward and back in each backward: as many bytes back as down (rank 0's, stage 0)."""
    run, _ = _run(tmp_path, "activations_pp2_tp2", 4, count_bytes=True, axes=(("dp", 1), ("pp", 2), ("tp", 2)),
                  offload="activations", offload_modules=("attention", "mlp"))
    assert_same_training(run, reference)
    assert "saved activations of attention, mlp in the blocks of 1 repeat(s)" in run.output
    down, back = ([r[f"offload_{k}_bytes"] for r in run.records] for k in ("d2h", "h2d"))
    # every step alike: the first step's shape inference (runtime.pipeline), a forward no backward reads, copies
    # nothing (offload.paused)
    assert down == back == [back[0]] * STEPS and back[0] > 0, (down, back)
    # the ledger's copies are the hooks' (compiler/cost/activations.saved_by_prefix: each save of the named
    # modules' ops, a tensor two of them save twice; the norms' saves stay): 2,760,704 bytes each way on pp rank 0
    # (2 blocks × 4 micro-batches), the compiled estimate being pp rank 0's (tests/e2e/runner.py)
    assert {c.op: c.bytes for c in run.costs.ledger.entries if c.axis == "host"} == {"d2h": down[0], "h2d": back[0]}
    # and under --count-bytes (the first step's, with every collective's): d2h/host, h2d/host as the ledger
    assert run.measured == run.predicted and run.measured["d2h/host"] == down[0], (run.measured, run.predicted)
