"""Expert re-placement during training (`moe(..., rebalance = replicate(every, extra))`, runtime/rebalance.py) on
gloo: with every router skewed alike (SCALEC_TEST_SKEW), a run re-placing its experts after every step trains
exactly as the same plan without re-placement (fp32, 1e-6: same routing, same math), while the measured per-rank
expert load spreads; the replicas' gradient all-reduce moves the ledger's bytes, and each re-placement moves at most
the ledger's bound. ep 2 in CI; ep 4 and a checkpoint resumed without re-placement in the slow tier."""
from __future__ import annotations

import json
import re

import pytest

from tests.e2e.runner import ROOT, assert_same_training, launch, on_plan, single_device, with_plan
from tests.e2e.test_e2e import assert_bytes_as_ledgered

pytestmark = pytest.mark.e2e

STEPS = 4
SKEW = {"SCALEC_TEST_SKEW": "3"}  # logits + 3·(1 - e/7): experts 0 and 1 take nearly every choice
MEASURED = re.compile(r"rebalance after step (\d+): (\S+): per-rank expert load max/mean ([0-9.]+) \(measured\) -> "
                      r"([0-9.]+) \(placed\), ([0-9,]+) bytes moved into")


def _texts(ep: int, extra: int) -> tuple[str, str]:
    """moe_gpt dropless and grouped on ep ranks, warm-up 1: (re-placed after every step, as it is)."""
    text = (ROOT / "samples/moe_gpt.scale").read_text().replace("warmup = 5", "warmup = 1")
    text = text.replace("capacity_factor = 1.25", "capacity_factor = none, dispatch = grouped")
    base = with_plan(text, f"ep{ep}.scale", axes=(("ep", ep),), devices_per_node=ep)
    placed = base.replace("dropped = residual)", "dropped = residual,\n"
                          f"                                      rebalance = replicate(every = 1, extra = {extra}))")
    assert placed != base
    return placed, base


def _moves_bound(out) -> int:
    """The ledger's bound on one re-placement's moves into a rank, per layer: its amortised row × every (1 here)."""
    rows = [c for c in json.loads((out / "plan.json").read_text())["ledger"] if "move the experts" in c["reason"]]
    assert rows
    return max(c["bytes_per_step"] // int(c["per_step"]) for c in rows)  # per step = layers × 1 re-placement


def _check(ep: int, extra: int, tmp_path, first_at_least: float, reference: str = "plan") -> None:
    """`reference`: "plan", the same plan without re-placement; "one", the single device (cheaper: one process)."""
    placed, base = _texts(ep, extra)
    # a checkpoint after step 2: the experts go to their canonical slots to be saved and back to their placement
    # after, before steps 3 and 4
    saving = placed.replace("log_every    = 10",
                            f'log_every    = 10\n  checkpoint_dir = "{tmp_path / "ckpt"}"  checkpoint_every = 2')
    assert saving != placed
    run = launch(saving, f"placed{ep}", tmp_path, steps=STEPS, timeout=300, nproc=ep, env=SKEW)
    ref = (launch(base, f"base{ep}", tmp_path, steps=STEPS, timeout=300, nproc=ep, env=SKEW, count_bytes=False)
           if reference == "plan" else
           launch(single_device(base), "one", tmp_path, steps=STEPS, timeout=300, nproc=1, env=SKEW, count_bytes=False))
    assert_same_training(run, ref, rtol=1e-6)
    assert_bytes_as_ledgered(run)  # the replicas' gradient all-reduce over ep: exactly the ledger's
    logged = MEASURED.findall(run.output)
    layers = {name for _, name, *_ in logged}
    assert len(logged) == STEPS * len(layers) == STEPS * 2, run.output
    bound = _moves_bound(tmp_path / f"placed{ep}")
    for step, name, measured, after, moved in logged:
        print(f"ep {ep}, step {step}, {name}: measured {measured}×, placed {after}×, {moved} bytes moved")
        assert int(moved.replace(",", "")) <= bound
        if step == "1":  # canonical placement under the skew: the hot experts' rank takes nearly every row
            assert float(measured) >= first_at_least
        else:  # the rows each rank received under the placement of the previous step
            assert float(measured) <= 1.3


def test_rebalanced_ep2_trains_as_without_and_spreads_the_load(tmp_path):
    """ep 2, 8 experts + 2 replicas (5 slots per rank): the load from 2× (everything on rank 0) to ≤ 1.3×."""
    _check(2, 2, tmp_path, first_at_least=1.9, reference="one")


# The slow tier (docs/testing.md): CI re-places over ep 2 above; the placement for 4 ranks is tests/test_rebalance.py's
@pytest.mark.slow
def test_rebalanced_ep4_trains_as_without_and_spreads_the_load(tmp_path):
    """ep 4, 8 experts + 8 replicas (4 slots per rank): from about 3.9× to ≤ 1.3×."""
    _check(4, 8, tmp_path, first_at_least=3.0)


# The slow tier: checkpoints of ep plans resuming on other plans are CI's (tests/e2e/test_checkpoint_sharded.py); this
# adds that a re-placed run writes the canonical order
@pytest.mark.slow
def test_a_rebalanced_checkpoint_resumes_without_rebalance(tmp_path):
    """Saved after a re-placement (the experts moved, replicas held), the checkpoint holds the canonical expert
    order: the same plan without re-placement resumes it and continues as an uninterrupted run without."""
    placed, base = _texts(2, 2)
    ckpt = tmp_path / "ckpt"
    first = launch(placed, "first", tmp_path, steps=4, timeout=300, env=SKEW, dump_grads=False,
                   extra=("--checkpoint-dir", str(ckpt), "--stop-after", "2"))
    assert "bytes moved" in first.output
    second = launch(on_plan(base, axes=(("ep", 2),), devices_per_node=2), "second", tmp_path, steps=4, timeout=300,
                    env=SKEW, dump_grads=False, extra=("--checkpoint-dir", str(ckpt)))
    whole = launch(base, "whole", tmp_path, steps=4, timeout=300, env=SKEW, dump_grads=False)
    assert len(first.losses) == 2 and len(second.losses) == 2
    assert first.losses + second.losses == pytest.approx(whole.losses, rel=1e-6)
