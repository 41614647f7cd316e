"""Checkpoints are one layout-independent form: a run interrupted on one plan and resumed on another continues as
it would have (the losses of the resumed steps are the uninterrupted run's, fp32, relative 1e-5; on the same plan,
bitwise), and broken checkpoints, kills during a save and bad directories are handled (module docstring of
runtime/checkpoint.py).

Each run is STEPS = 4 steps, interrupted after 2 (warm-up 1 step, so the resumed steps are on the cosine part of
the schedule). The reference is the single-device run of the same model, which every plan of the e2e table
matches to 1e-5: the uninterrupted run on the original plan."""
from __future__ import annotations

import os
import re
import shutil

import pytest
import torch

from tests.e2e.runner import ROOT, launch, on_plan, single_device, with_plan

pytestmark = pytest.mark.e2e

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


def test_tp2_resumes_on_tp2_bitwise(tmp_path):
    """The defect: each tp rank saved its shard under the whole tensor's name. Now the same plan resumes bitwise
    (one device loading a tp2 checkpoint: test_padded_vocab_resumes_on_one_device)."""
    text = _sample("gpt_tp")
    first, ckpt = _interrupt(text, "tp2", tmp_path)
    again = _resume(text, "tp2_again", tmp_path, ckpt)
    whole = launch(text, "tp2_whole", tmp_path, steps=STEPS, timeout=TIMEOUT, dump_grads=False)
    assert first.losses + again.losses == whole.losses  # bitwise


def test_tp2_sp_resumes_on_dp2(reference, tmp_path):
    text = _sample("gpt_tp", sequence_parallel=True)
    first, ckpt = _interrupt(text, "tp2_sp", tmp_path)
    second = _resume(on_plan(text, **DP2), "tp2_sp_to_dp2", tmp_path, ckpt, nproc=2)
    _same(first.losses + second.losses, reference(text))


def test_3d_resumes_on_pp4(reference, tmp_path):
    """dp × pp × tp (+ sp), 8 ranks: replicas over dp written once, stages merged, the tied embedding written by
    the first stage only; read back as four stages of one block."""
    text = _sample("gpt_3d")
    first, ckpt = _interrupt(text, "dp2_pp2_tp2", tmp_path)
    second = _resume(on_plan(text, **PP4), "3d_to_pp4", tmp_path, ckpt, nproc=4)
    _same(first.losses + second.losses, reference(text))


@pytest.mark.parametrize("schedule", [dict(schedule="interleaved-1f1b", virtual_stages=2),
                                      dict(schedule="zero-bubble")], ids=["interleaved", "zero_bubble"])
def test_pp2_resumes_on_tp2(schedule, reference, tmp_path):
    """Two stages per rank (interleaved) and the split backward (zero-bubble); GPipe and 1F1B hold their stages as
    zero-bubble does (one per rank), and a 1F1B checkpoint is resumed by test_3d_resumes_on_pp4."""
    text = _sample("gpt_pp", **schedule)
    first, ckpt = _interrupt(text, "pp2", tmp_path)
    second = _resume(on_plan(text, **TP2), "pp2_to_tp2", tmp_path, ckpt, nproc=2)
    _same(first.losses + second.losses, reference(text))


def test_moe_ep2_resumes_on_ep4_with_tp(reference, tmp_path):
    """Experts as DTensors over ep (with their AdamW state), dense weights over tp: ep = 2 to tp = 2 × ep = 4."""
    text = _sample("moe_gpt")
    first, ckpt = _interrupt(text, "ep2", tmp_path)
    target = on_plan(text, axes=(("tp", 2), ("ep", 4)), devices_per_node=8, micro_batches=2)
    second = _resume(target, "ep2_to_tp2_ep4", tmp_path, ckpt, nproc=8)
    _same(first.losses + second.losses, reference(text))


def test_moe_fsdp_ep_resumes_on_one_device(reference, tmp_path):
    """FSDP with ep (dense weights sharded over dp × ep, experts over ep then dp) and DeepSeek-V3's expert bias,
    moved after each step: saved on dp 2 × ep 2, resumed on one device (no ep), the bias and every expert whole."""
    text = _sample("moe_gpt", ("dropped = residual)", "dropped = residual, bias_update = 0.05)"),
                   axes=(("dp", 2), ("ep", 2)), devices_per_node=4, data_parallel="fsdp")
    first, ckpt = _interrupt(text, "dp2_ep2_fsdp", tmp_path)
    second = _resume(on_plan(text, **ONE), "dp2_ep2_fsdp_to_one", tmp_path, ckpt, nproc=1)
    _same(first.losses + second.losses, reference(text))


def test_fsdp_tp_resumes_on_one_device(reference, tmp_path):
    """FSDP over dp with tp: each piece is gathered over dp and stored as a tp shard, scattered back after a load."""
    text = _sample("gpt_2d", data_parallel="fsdp")
    first, ckpt = _interrupt(text, "dp2_tp2_fsdp", tmp_path)
    second = _resume(on_plan(text, **ONE), "fsdp_tp_to_one", tmp_path, ckpt, nproc=1)
    _same(first.losses + second.losses, reference(text))


def test_cp2_resumes_on_one_device_and_on_tp2(reference, tmp_path):
    """cp shards no weight (issue 24): a cp 2 checkpoint (written by cp rank 0, every weight and moment whole) is
    the layout-independent form as it stands; one device and tp 2 read it and continue as the single device
    does."""
    text = _sample("gpt_tp", axes=(("cp", 2),), devices_per_node=2, context_parallel="all_gather")
    first, ckpt = _interrupt(text, "cp2", tmp_path, nproc=2)
    want = reference(text)
    one = _resume(on_plan(text, **ONE), "cp2_to_one", tmp_path, ckpt, nproc=1)
    _same(first.losses + one.losses, want)
    tp2 = _resume(on_plan(text, **TP2), "cp2_to_tp2", tmp_path, ckpt, nproc=2)
    _same(first.losses + tp2.losses, want)


def test_fsdp_over_dp_cp_resumes_on_one_device(reference, tmp_path):
    """FSDP over dp × cp (the weights and AdamW's state sharded over all four ranks, the flattened mesh's DTensors):
    saved whole, resumed on one device as the single device continues."""
    text = _sample("gpt_dp", axes=(("dp", 2), ("cp", 2)), devices_per_node=4, data_parallel="fsdp")
    first, ckpt = _interrupt(text, "dp2_cp2_fsdp", tmp_path, nproc=4)
    second = _resume(on_plan(text, **ONE), "dp2_cp2_fsdp_to_one", tmp_path, ckpt, nproc=1)
    _same(first.losses + second.losses, reference(text))


def test_zero1_resumes_on_zero1(reference, tmp_path):
    """zero1 (ZeroRedundancyOptimizer): each dp rank writes and reads the AdamW state of its own partition only;
    read back by zero1 (each rank its partition again), training continues as the single-device run does, which
    it could not if a partition's state were missing from the checkpoint (AdamW restarted on those parameters)."""
    text = _sample("gpt_dp", data_parallel="zero1")
    first, ckpt = _interrupt(text, "dp2_zero1", tmp_path)
    again = _resume(text, "dp2_zero1_again", tmp_path, ckpt)
    _same(first.losses + again.losses, reference(text))


def test_bf16_zero1_resumes_bitwise_and_its_masters_load_into_fp32(tmp_path):
    """bf16 (runtime/precision.py): the checkpoint holds the fp32 masters (each zero1 rank its partition's) and
    AdamW's moments, not the bf16 weights, so the same plan resumes bitwise (the bf16 weights recast from the
    masters and broadcast by their owners), and an fp32 plan on one device resumes from it."""
    text = _sample("gpt_dp", ("precision    = fp32", "precision    = bf16"), data_parallel="zero1")
    first, ckpt = _interrupt(text, "dp2_zero1_bf16", tmp_path)
    import torch.distributed.checkpoint as dcp
    meta = dcp.FileSystemReader(str(ckpt / f"step_{STOP:08d}")).read_metadata().state_dict_metadata
    model = {k: v.properties.dtype for k, v in meta.items() if k.startswith("model.")}
    assert model and set(model.values()) == {torch.float32}, model  # the masters, every parameter once
    assert not [k for k in meta if k.endswith(".master")]  # stored as the parameter, not as optimizer state
    again = _resume(text, "dp2_zero1_bf16_again", tmp_path, ckpt)
    whole = launch(text, "dp2_zero1_bf16_whole", tmp_path, steps=STEPS, timeout=TIMEOUT, dump_grads=False)
    assert first.losses + again.losses == whole.losses  # bitwise
    fp32 = _resume(on_plan(text.replace("precision    = bf16", "precision    = fp32"), **ONE), "bf16_to_fp32_one",
                   tmp_path, ckpt, nproc=1)
    _same(fp32.losses, again.losses, rtol=2e-3)  # the same model state, continued in fp32 rather than bf16


def test_padded_vocab_resumes_on_one_device(reference, tmp_path):
    """Vocabulary 127 on tp = 2, padded to 128: the last rank's padding row is not stored; one device reads a
    [127, 64] embedding."""
    text = _sample("gpt_tp", ("vocab  = 128", "vocab  = 127"), pad_vocab=True)
    first, ckpt = _interrupt(text, "tp2_pad", tmp_path)
    second = _resume(on_plan(text, **ONE), "tp2_pad_to_one", tmp_path, ckpt, nproc=1)
    _same(first.losses + second.losses, reference(text))


def _step_dirs(ckpt) -> list[str]:
    return sorted(os.listdir(ckpt))


def test_killed_save_and_truncated_checkpoint_fall_back(reference, tmp_path):
    """Drill: rank 1 is SIGKILLed inside the save of step 3 (after DCP wrote its files, before the rename), and the
    checkpoint of step 2 is truncated on disk. The next run removes `step_3.tmp`, skips step 2 with a warning
    naming the file, resumes from step 1, and the metrics file ends with one record per step (those after step 1
    of the killed run dropped)."""
    text = _sample("gpt_tp", ("log_every    = 5", "log_every    = 5  checkpoint_every = 1"))
    ckpt = tmp_path / "ckpt"
    killed = launch(text, "drill", tmp_path, steps=STEPS, timeout=TIMEOUT, dump_grads=False, check=False,
                    extra=("--checkpoint-dir", str(ckpt)), env={"SCALEC_TEST_KILL_IN_SAVE": "1:3"})
    assert killed.returncode != 0 and len(killed.losses) == 3
    assert _step_dirs(ckpt) == ["step_00000001", "step_00000002", "step_00000003.tmp"]
    victim = sorted((ckpt / "step_00000002").glob("*.distcp"))[0]
    os.truncate(victim, os.path.getsize(victim) // 2)
    resumed = launch(text, "drill", tmp_path, steps=STEPS, timeout=TIMEOUT, dump_grads=False,
                     extra=("--checkpoint-dir", str(ckpt)))
    warnings = [line for line in resumed.output.splitlines() if "warning: skipping checkpoint" in line]
    assert len(warnings) == 1 and str(victim) in warnings[0] and "truncated" in warnings[0]
    assert f"removing {ckpt}/step_00000003.tmp" in resumed.output
    assert f"resumed from {ckpt}/step_00000001" in resumed.output
    assert [r["step"] for r in resumed.records] == [1, 2, 3, 4]  # the file holds the killed run's step 1 too
    _same(resumed.losses, reference(text))
    assert "step_00000003.tmp" not in _step_dirs(ckpt)


def test_asynchronous_saves_resume_like_synchronous_ones(reference, tmp_path):
    """checkpoint_async: each checkpoint but the last is written while the next step runs and finished (manifest,
    rename) at the next save. Drill: rank 1 is SIGKILLed as it finishes step 2's (after its files, before the
    rename), during step 3's save: step 2 stays a `.tmp`, the next run removes it, resumes from step 1 and trains
    like the uninterrupted run. Each asynchronous save prints the bytes it staged: the plan's prediction
    (checkpoint_host, compiler.cost.memory.checkpoint_staging)."""
    from compiler.check import check_text
    from compiler.pipeline import compile_spec
    text = _sample("gpt_tp", ("log_every    = 5", "log_every    = 5  checkpoint_every = 1  checkpoint_async = true"))
    ckpt = tmp_path / "ckpt"
    killed = launch(text, "async", tmp_path, steps=STEPS, timeout=TIMEOUT, dump_grads=False, check=False,
                    extra=("--checkpoint-dir", str(ckpt)), env={"SCALEC_TEST_KILL_IN_SAVE": "1:2"})
    assert killed.returncode != 0 and len(killed.losses) == 3  # step 3 ran while step 2's files were written
    assert _step_dirs(ckpt) == ["step_00000001", "step_00000002.tmp"]
    resumed = launch(text, "async", tmp_path, steps=STEPS, timeout=TIMEOUT, dump_grads=False,
                     extra=("--checkpoint-dir", str(ckpt)))
    assert f"removing {ckpt}/step_00000002.tmp" in resumed.output
    assert f"resumed from {ckpt}/step_00000001" in resumed.output
    assert [r["step"] for r in resumed.records] == list(range(1, STEPS + 1))
    _same(resumed.losses, reference(text))
    assert _step_dirs(ckpt) == [f"step_{k:08d}" for k in range(1, STEPS + 1)]  # every save finished, the last too
    staged = re.findall(r"scalec: checkpoint staging (\d+) bytes per rank \(largest, rank \d+\)", resumed.output)
    predicted = max(r.checkpoint_host for r in compile_spec(check_text(text, "gpt_tp.scale")).costs.memory)
    assert len(staged) == STEPS - 2 and {int(n) for n in staged} == {predicted}  # steps 2, 3; step 4's is synchronous


def _our_traceback(output: str) -> bool:
    """A traceback through the program or the runtime (torchrun's own report of a failed worker is not ours)."""
    return re.search(r'File ".*(runtime/|program\.py)', output) is not None


def test_broken_checkpoints_and_directories_are_one_line_errors(tmp_path):
    """No intact checkpoint: one line naming the broken file, exit non-zero, no traceback. A checkpoint directory
    that is a file: one line before step 1."""
    text = _sample("tiny_gpt")
    ckpt = tmp_path / "ckpt"
    launch(text, "one", tmp_path, steps=STEPS, timeout=TIMEOUT, dump_grads=False, nproc=1,
           extra=("--checkpoint-dir", str(ckpt), "--stop-after", "1"))
    (ckpt / "step_00000001" / ".metadata").write_bytes(b"not a pickle")
    broken = launch(text, "one", tmp_path, steps=STEPS, timeout=TIMEOUT, dump_grads=False, check=False,
                    extra=("--checkpoint-dir", str(ckpt)))
    assert broken.returncode != 0 and not _our_traceback(broken.output)
    errors = [line for line in broken.output.splitlines() if "no intact checkpoint" in line]
    assert len(errors) == 1 and f"{ckpt}/step_00000001/.metadata is unreadable" in errors[0]
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    bad = launch(text, "one", tmp_path, steps=STEPS, timeout=TIMEOUT, dump_grads=False, check=False,
                 extra=("--checkpoint-dir", str(not_a_dir)))
    assert bad.returncode != 0 and not _our_traceback(bad.output) and "step " not in bad.output
    assert f"checkpoint directory {not_a_dir} is not a writable directory" in bad.output
