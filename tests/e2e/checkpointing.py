"""What the checkpoint tests share (tests/e2e/test_checkpoint*.py: resumes across layouts in two files, the drills
in a third, so that `--dist loadfile` gives them to both workers): the samples as the runs are made, the interrupted
and resumed launches, the single-device reference, each run STEPS = 4 steps interrupted after STOP = 2 (warm-up 1
step, so the resumed steps are on the cosine part of the schedule)."""
from __future__ import annotations

import os
import re
import shutil

import pytest
import torch

from tests.e2e.runner import ROOT, launch, single_device, with_plan

STEPS, STOP = 4, 2
TIMEOUT = 300


def _sample(name: str, *edits, **fields) -> str:
    """A sample, warm-up 1, its Plan's `fields` replaced (with_plan), then its model and train text `edits` (in this
    order: an edit may need the plan, as a vocabulary of 127 needs pad_vocab on tp = 2)."""
    text = (ROOT / "samples" / f"{name}.scale").read_text().replace("warmup = 5", "warmup = 1")
    if fields:
        text = with_plan(text, f"{name}.scale", **fields)
    for old, new in edits:
        assert old in text, f"`{old}` is not in {name}"
        text = text.replace(old, new)
    return text


# The meshes and plans the checkpoints are resumed on (on_plan: every other setting at its default).
ONE = dict(axes=(("dp", 1),), devices_per_node=1)
TP2 = dict(axes=(("tp", 2),), devices_per_node=2)
DP2 = dict(axes=(("dp", 2),), devices_per_node=2)
PP4 = dict(axes=(("pp", 4),), devices_per_node=4, micro_batches=4)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The single-device run of a model (shared by the cases of the same model)."""
    cache = {}
    workdir = tmp_path_factory.mktemp("ckpt_reference")

    def get(text: str) -> list[float]:
        key = single_device(text)
        if key not in cache:
            cache[key] = launch(key, f"ref{len(cache)}", workdir, steps=STEPS, timeout=TIMEOUT, nproc=1,
                                dump_grads=False).losses
        return cache[key]
    return get


def _interrupt(text: str, name: str, tmp_path, **kw):
    ckpt = tmp_path / f"{name}_ckpt"
    run = launch(text, name, tmp_path, steps=STEPS, timeout=TIMEOUT, dump_grads=False,
                 extra=("--checkpoint-dir", str(ckpt), "--stop-after", str(STOP)), **kw)
    assert len(run.losses) == STOP
    return run, ckpt


def _resume(text: str, name: str, tmp_path, ckpt, **kw):
    mine = tmp_path / f"{name}_ckpt"
    shutil.copytree(ckpt, mine)  # each resume from the same checkpoint
    run = launch(text, name, tmp_path, steps=STEPS, timeout=TIMEOUT, dump_grads=False,
                 extra=("--checkpoint-dir", str(mine)), **kw)
    assert f"resumed from {mine}/step_{STOP:08d}" in run.output
    assert [r["step"] for r in run.records] == list(range(STOP + 1, STEPS + 1))
    return run


def _same(losses, want, rtol=1e-5):
    torch.testing.assert_close(torch.tensor(losses, dtype=torch.float64), torch.tensor(want, dtype=torch.float64),
                               rtol=rtol, atol=0.0)


def _step_dirs(ckpt) -> list[str]:
    return sorted(os.listdir(ckpt))


def _our_traceback(output: str) -> bool:
    """A traceback through the program or the runtime (torchrun's own report of a failed worker is not ours)."""
    return re.search(r'File ".*(runtime/|program\.py)', output) is not None
