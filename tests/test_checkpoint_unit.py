"""runtime.checkpoint in one process (a gloo world of one): a checkpoint records the model it holds and a checksum of
every file, and a load checks both before it trusts the files (issue 21, items 1 and 12)."""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from runtime import checkpoint
from runtime.errors import EXIT_CODE, FatalError
from runtime.tensor_parallel import Shards

STEPS = 10


class Blocks(nn.Module):
    def __init__(self, layers: int, width: int = 32):
        super().__init__()
        self.embed = nn.Embedding(16, width)
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))


@pytest.fixture
def ctx(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield SimpleNamespace(rank=0, world_size=1, is_logger=True)
    dist.destroy_process_group()


def _training(model: nn.Module):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    return opt, sched


def _save(model: nn.Module, directory, step: int, ctx) -> str:
    opt, sched = _training(model)
    sum(p.sum() for p in model.parameters()).backward()  # every parameter gets AdamW state, as in training
    opt.step()
    return checkpoint.save(str(directory), step, [model], opt, sched, ctx, STEPS, Shards((), ()))


def _load(model: nn.Module, directory, ctx) -> int:
    opt, sched = _training(model)
    return checkpoint.load_latest(str(directory), [model], opt, sched, ctx, STEPS, Shards((), ()))


def test_the_manifest_records_the_model_and_every_file(ctx, tmp_path):
    path = _save(Blocks(2), tmp_path / "ckpt", 1, ctx)
    manifest = json.loads((tmp_path / "ckpt" / "step_00000001" / checkpoint.MANIFEST).read_text())
    assert manifest["model"]["parameters"] == [["blocks.0.bias", [32]], ["blocks.0.weight", [32, 32]],
                                               ["blocks.1.bias", [32]], ["blocks.1.weight", [32, 32]],
                                               ["embed.weight", [16, 32]]]
    written = sorted(f for f in os.listdir(path) if f != checkpoint.MANIFEST)
    assert sorted(manifest["files"]) == written and ".metadata" in written
    for rel, entry in manifest["files"].items():
        assert entry == {"bytes": os.path.getsize(os.path.join(path, rel)),
                         "crc32": checkpoint.crc32(os.path.join(path, rel))}


def test_a_smaller_model_does_not_resume_a_bigger_ones_checkpoint(ctx, tmp_path, capsys):
    """The defect: 2 layers resumed a 4-layer checkpoint (DCP reads only the keys asked for). Now the run stops,
    before any tensor is read, with reshard's E0901 words, in one line, and a code the launcher does not restart."""
    _save(Blocks(4), tmp_path / "ckpt", 2, ctx)
    small = Blocks(2)
    before = {n: p.clone() for n, p in small.state_dict().items()}
    with pytest.raises(FatalError) as err:
        _load(small, tmp_path / "ckpt", ctx)
    assert err.value.code == EXIT_CODE
    assert err.value.message == (
        f"scalec: the models differ: {tmp_path}/ckpt/step_00000002 has `blocks.2.bias` and 3 more parameters that "
        "this model lacks; a checkpoint moves between plans of one model: change the mesh and plan, not the model")
    assert all(torch.equal(before[n], p) for n, p in small.state_dict().items())  # nothing was read
    assert "resumed" not in capsys.readouterr().out


def test_another_width_and_another_name_are_named(ctx, tmp_path):
    _save(Blocks(2), tmp_path / "ckpt", 2, ctx)
    with pytest.raises(FatalError, match=r"the models differ: `embed\.weight` is 16×64 here and 16×32 in "):
        _load(Blocks(2, width=64), tmp_path / "ckpt", ctx)
    with pytest.raises(FatalError, match=r"the models differ: `blocks\.2\.weight` is not a parameter of .*step_0+2;"):
        _load(Blocks(3), tmp_path / "ckpt", ctx)
    assert _load(Blocks(2), tmp_path / "ckpt", ctx) == 2


def test_a_checkpoint_without_a_manifest_loads_with_the_older_check(ctx, tmp_path):
    path = _save(Blocks(2), tmp_path / "ckpt", 2, ctx)
    os.remove(os.path.join(path, checkpoint.MANIFEST))
    assert _load(Blocks(2), tmp_path / "ckpt", ctx) == 2
    with pytest.raises(FatalError, match="holds another model: it has no parameter blocks.2.weight"):
        _load(Blocks(3), tmp_path / "ckpt", ctx)


def test_a_file_zeroed_in_place_falls_back_to_the_previous_checkpoint(ctx, tmp_path, capsys):
    """The defect: 4 KB zeroed inside a shard, at the same size, loaded silently. Now the checksum names the file
    and the checkpoint before it loads, with that one's weights."""
    model = Blocks(2, width=128)
    _save(model, tmp_path / "ckpt", 1, ctx)
    first = {n: p.detach().clone() for n, p in model.state_dict().items()}
    second = _save(model, tmp_path / "ckpt", 2, ctx)
    capsys.readouterr()
    # 4 KB in the middle of a weight's bytes (64 KB, inside the record torch.save wrote for it)
    metadata = dcp.FileSystemReader(second).read_metadata()
    info = next(v for k, v in metadata.storage_data.items() if k.fqn == "model.blocks.0.weight")
    victim = os.path.join(second, info.relative_path)
    size = os.path.getsize(victim)
    with open(victim, "r+b") as f:
        f.seek(info.offset + info.length // 2)
        f.write(bytes(4096))
    assert os.path.getsize(victim) == size
    fresh = Blocks(2, width=128)
    assert _load(fresh, tmp_path / "ckpt", ctx) == 1
    out = capsys.readouterr().out
    warnings = [line for line in out.splitlines() if "warning" in line]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"scalec: warning: skipping checkpoint {second}: {victim} does not match its "
                                  "checksum (CRC32 ")
    assert all(torch.equal(first[n], p) for n, p in fresh.state_dict().items())


def test_a_broken_manifest_skips_its_checkpoint(ctx, tmp_path, capsys):
    model = Blocks(2)
    _save(model, tmp_path / "ckpt", 1, ctx)
    second = _save(model, tmp_path / "ckpt", 2, ctx)
    with open(os.path.join(second, checkpoint.MANIFEST), "w") as f:
        f.write("{")
    assert _load(Blocks(2), tmp_path / "ckpt", ctx) == 1
    assert f"{second}/{checkpoint.MANIFEST} is unreadable" in capsys.readouterr().out


def test_a_fatal_error_keeps_its_message_across_processes():
    import pickle
    exc = pickle.loads(pickle.dumps(FatalError("scalec: x")))
    assert isinstance(exc, FatalError) and exc.message == "scalec: x" and exc.code == EXIT_CODE


def test_an_asynchronous_save_holds_the_state_of_its_step(ctx, tmp_path):
    """checkpoint.begin with a group of its own writes from a copy taken when it returns: the weights may change
    while the files are written, and the checkpoint still holds the step's. Until `finish` there is only a .tmp,
    which a start ignores (and removes): the checkpoint before stays the latest."""
    model = Blocks(2)
    _save(model, tmp_path / "ckpt", 1, ctx)
    opt, sched = _training(model)
    sum(p.sum() for p in model.parameters()).backward()
    opt.step()
    at_save = {n: p.detach().clone() for n, p in model.named_parameters()}
    group = dist.new_group(backend="gloo")
    saving = checkpoint.begin(str(tmp_path / "ckpt"), 2, [model], opt, sched, ctx, STEPS, Shards((), ()),
                              group=group)
    with torch.no_grad():  # the next steps, while the files are written
        for p in model.parameters():
            p.add_(1.0)
    # not a checkpoint yet: the writer thread may or may not have made step_00000002.tmp by now
    assert "step_00000002" not in os.listdir(tmp_path / "ckpt")
    path = saving.finish()
    assert path.endswith("step_00000002") and sorted(os.listdir(tmp_path / "ckpt")) == ["step_00000001",
                                                                                        "step_00000002"]
    back = Blocks(2)
    assert _load(back, tmp_path / "ckpt", ctx) == 2
    for n, p in back.named_parameters():
        torch.testing.assert_close(p, at_save[n], rtol=0, atol=0)


def test_the_staging_count_is_what_dcps_default_stager_copies(ctx, tmp_path, capsys):
    """checkpoint.staging_bytes counts, before async_save, the host bytes DCP's default stager then holds: whole
    storages (a narrowed view costs its storage), CPU scalars too, a storage shared by two entries once, a DTensor
    by its local tensor. Checked against the stager's own copy; `begin` prints the largest over the ranks."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    mesh = init_device_mesh("cpu", (1,))
    padded = torch.zeros(10, 4)
    state = {"model": {"view": padded.narrow(0, 0, 6), "shard": DTensor.from_local(
        padded.narrow(0, 0, 7), mesh, [Shard(0)], run_check=False), "own": torch.ones(3, 5)},
        "optim": {"state": {"own": {"step": torch.tensor(1.0), "exp_avg": torch.zeros(3, 5)}}},
        "progress": {"step": torch.tensor(2)}}
    stager = DefaultStager(StagingOptions(False, False, False, False))  # what async_save builds (torch 2.13)
    staged = stager.stage(state)
    stager.close()
    copies = {}
    for t in (staged["model"]["view"], staged["model"]["shard"].to_local(), staged["model"]["own"],
              *staged["optim"]["state"]["own"].values(), staged["progress"]["step"]):
        assert t.device.type == "cpu" and t.untyped_storage().data_ptr() not in (padded.data_ptr(), 0)
        copies[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    assert checkpoint.staging_bytes(state) == sum(copies.values()) == 160 + 60 + 4 + 60 + 8

    model = Blocks(2)
    _save(model, tmp_path / "ckpt", 1, ctx)
    opt, sched = _training(model)
    sum(p.sum() for p in model.parameters()).backward()
    opt.step()
    capsys.readouterr()
    group = dist.new_group(backend="gloo")
    checkpoint.begin(str(tmp_path / "ckpt"), 2, [model], opt, sched, ctx, STEPS, Shards((), ()),
                     group=group).finish()
    n = sum(p.numel() for p in model.parameters())
    # fp32 weights and AdamW's two moments (4 + 8 bytes each), a 4-byte fp32 `step` per parameter tensor, and the
    # three int64 progress scalars
    expected = 12 * n + 4 * len(list(model.parameters())) + 3 * 8
    assert f"scalec: checkpoint staging {expected} bytes per rank (largest, rank 0)\n" in capsys.readouterr().out


def test_an_expert_bias_is_saved_and_resumed_its_load_is_not(ctx, tmp_path):
    """DeepSeek-V3's expert bias (runtime.moe.ExpertBias) is model state that is no parameter: the checkpoint holds
    it, whole, and a resumed run gets it back in place; the step's load (a non-persistent buffer) is not kept."""
    from runtime import moe
    model = Blocks(1)
    model.moe_bias = moe.ExpertBias(4, rate=0.1)
    model.moe_bias.bias.copy_(torch.tensor([0.3, -0.1, 0.0, 0.2]))
    model.moe_bias.load.fill_(7.0)
    _save(model, tmp_path / "ckpt", 1, ctx)
    manifest = json.loads((tmp_path / "ckpt" / "step_00000001" / checkpoint.MANIFEST).read_text())
    assert ["moe_bias.bias", [4]] in manifest["model"]["parameters"]
    assert not any(name == "moe_bias.load" for name, _ in manifest["model"]["parameters"])
    again = Blocks(1)
    again.load_state_dict(model.state_dict(), strict=False)
    again.moe_bias = moe.ExpertBias(4, rate=0.1)
    assert _load(again, tmp_path / "ckpt", ctx) == 1
    assert torch.equal(again.moe_bias.bias, torch.tensor([0.3, -0.1, 0.0, 0.2]))
    assert not again.moe_bias.load.any()
