"""runtime/precision.py, Megatron's bf16 policy, in pieces: the model computes in bf16 weights without autocast,
gradients land in fp32 main gradients (accumulated over micro-batches, the bf16 ones freed), MasterAdamW keeps fp32
masters and updates them exactly as AdamW updates fp32 parameters, and zero1's sharded masters (two gloo
processes) update exactly as the whole ones. The e2e table's *_bf16 cases hold the training against the
single-device program."""
from __future__ import annotations

import pytest

import torch
import torch.distributed as dist
from torch import nn

from runtime import precision
from tests import multirank
from tests.test_zero import WORLD, _cfg, _Model


def _groups(params):
    return precision.decay_groups(params, 0.1)


def test_weights_become_bf16_and_the_masters_keep_their_fp32_values():
    torch.manual_seed(0)
    model = _Model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = {n: id(p) for n, p in model.named_parameters()}
    masters = precision.to_compute([model])
    for name, p in model.named_parameters():
        assert p.dtype == torch.bfloat16 and id(p) == ids[name]  # the same parameters (hooks, names, checkpoints)
        assert masters[p].dtype == torch.float32 and torch.equal(masters[p], before[name])
    out = model(torch.randn(3, 6, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16  # no autocast: the module computes in its weights' dtype


def test_main_grads_accumulate_micro_batches_in_fp32_and_free_the_bf16_ones():
    torch.manual_seed(0)
    model = _Model()
    precision.to_compute([model])
    params = list(model.parameters())
    mains = precision.MainGrads(params)
    xs = [torch.randn(4, 6, dtype=torch.bfloat16) for _ in range(3)]
    each = []
    for x in xs:
        model(x).float().square().sum().backward()
        assert all(p.grad is None for p in params)  # moved into the main gradient by the hook, and freed
        each.append([p.main_grad.clone() for p in params])
    mains.finish()
    for i, p in enumerate(params):
        assert p.main_grad.dtype == torch.float32
        # the fp32 sum of the three bf16 gradients (the first is the running sum so far after one micro-batch)
        bf16 = [each[0][i]] + [each[k][i] - each[k - 1][i] for k in (1, 2)]
        torch.testing.assert_close(p.main_grad, bf16[0] + bf16[1] + bf16[2])
    # grad_reduce = bf16: the buffers are bf16
    other = _Model()
    precision.to_compute([other])
    half = precision.MainGrads(list(other.parameters()), precision.grad_dtype("bf16"))
    other(xs[0]).float().sum().backward()
    assert all(p.main_grad.dtype == torch.bfloat16 for p in other.parameters())
    half.clear()
    assert all(p.main_grad is None for p in other.parameters())


def test_a_gradient_set_without_the_hook_is_folded_in_and_scaled():
    """torch pipelining's split weight backward assigns `.grad` itself; the schedule's 1/m is applied here."""
    p = nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    mains = precision.MainGrads([p])
    p.grad = torch.full((3,), 2.0, dtype=torch.bfloat16)
    mains.finish(0.5)
    assert p.grad is None and torch.equal(p.main_grad, torch.ones(3))


def test_master_adamw_updates_as_adamw_on_fp32_parameters():
    torch.manual_seed(0)
    model, ref = _Model(), _Model()
    ref.load_state_dict(model.state_dict())
    params = list(model.parameters())
    opt = precision.MasterAdamW(_groups(params), precision.to_compute([model]), lr=1e-2, betas=(0.9, 0.95),
                                eps=1e-8)
    ref_opt = torch.optim.AdamW(_groups(list(ref.parameters())), lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    for step in range(3):
        torch.manual_seed(100 + step)
        for p, q in zip(params, ref.parameters()):
            p.main_grad = torch.randn(p.shape)
            q.grad = p.main_grad.clone()
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        assert all(p.main_grad is None for p in params)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(opt.state[p]["master"], q.detach(), rtol=1e-6, atol=1e-7, msg=name)
        assert torch.equal(p.detach(), q.detach().to(torch.bfloat16)), name  # the weights: the masters rounded
        assert set(opt.state[p]) == {"step", "master", "exp_avg", "exp_avg_sq"}


def test_zero1_partition_balances_whole_parameters():
    params = [torch.empty(n) for n in (100, 60, 50, 10, 10)]
    assert precision.partition(params, 2) == [0, 1, 1, 0, 0]  # largest first, to the least loaded: 120 and 110
    assert precision.partition(params, 1) == [0] * 5


def _zero1(rank, ctx):
    from runtime import checkpoint, optimizer
    cfg = _cfg("zero1")
    group = optimizer.zero1_group(cfg, ctx)
    torch.manual_seed(0)
    model, ref = _Model(), _Model()
    ref.load_state_dict(model.state_dict())
    sharded = precision.MasterAdamW(_groups(list(model.parameters())), precision.to_compute([model]), lr=1e-2,
                                    betas=(0.9, 0.95), eps=1e-8, shard_group=group)
    whole = precision.MasterAdamW(_groups(list(ref.parameters())), precision.to_compute([ref]), lr=1e-2,
                                  betas=(0.9, 0.95), eps=1e-8)
    for step in range(2):
        torch.manual_seed(100 + step)  # the same main gradients on both ranks, as after the all-reduce
        for p, q in zip(model.parameters(), ref.parameters()):
            p.main_grad = torch.randn(p.shape)
            q.main_grad = p.main_grad.clone()
        sharded.step()  # this rank's partition updated, then every weight broadcast by its owner
        whole.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.equal(p.detach(), q.detach()), f"{name}: the bf16 weight differs from the whole optimizer's"
        if p in sharded.state:
            assert torch.equal(sharded.state[p]["master"], whole.state[q]["master"]), name
            assert torch.equal(sharded.state[p]["exp_avg_sq"], whole.state[q]["exp_avg_sq"]), name
    # Each rank holds the masters and moments of its partition only: together, every parameter's exactly once,
    # 12 bytes per parameter over the dp ranks.
    index = {p: i for i, p in enumerate(model.parameters())}
    mine = sorted(index[p] for p in checkpoint.local_state(sharded))
    every: list = [None] * WORLD
    dist.all_gather_object(every, mine)
    assert all(every) and sorted(i for part in every for i in part) == list(range(len(index))), every
    held = sum(t.numel() * t.element_size() for st in sharded.state.values() for k, t in st.items() if k != "step")
    total = sum(p.numel() for p in model.parameters())
    assert held < 12 * total and held == 12 * sum(p.numel() for p in sharded.state)


@pytest.mark.e2e
def test_zero1_sharded_masters_update_as_the_whole_ones():
    multirank.spawn(_zero1, WORLD, mesh="dp")


class _Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.linear = nn.LayerNorm(6), nn.Linear(6, 6)

    def forward(self, x):
        return x + self.linear(self.norm(x))


def test_fp32_residual_keeps_the_stream_fp32_and_hands_blocks_bf16():
    from runtime.layers import Repeat
    torch.manual_seed(0)
    x = torch.randn(3, 6, dtype=torch.bfloat16)
    for fp32_residual, stream in ((False, torch.bfloat16), (True, torch.float32)):
        blocks = Repeat([_Residual(), _Residual()])
        precision.apply_policy(blocks, fp32_residual)
        precision.to_compute([blocks])
        seen = []
        blocks["1"].norm.register_forward_hook(lambda m, i, o: seen.append((i[0].dtype, o.dtype)))
        assert blocks(x).dtype == stream
        assert seen == [(stream, torch.bfloat16)]  # the norm reads the stream and hands the block bf16


class _Loss(nn.Module):
    """(tokens, targets) -> a loss, as a generated Model."""

    def __init__(self):
        super().__init__()
        self.body = _Model()

    def forward(self, tokens, targets):
        return self.body(tokens).float().square().mean() + 0 * targets.sum()


def _reducer(rank, ctx):
    """The bf16 whole-model step's gradient all-reduce (DDP's replacement: launched from the backward's hooks) and
    zero1's broadcasts run inside a timed operation (runtime.faults.op) that names .scale lines, as every
    collective of the runtime does."""
    from runtime import faults, optimizer
    from runtime.model_parts import WholeModel
    from pathlib import Path
    from compiler import codegen
    from compiler.check import check_text
    cfg = _cfg("zero1")
    dp = (Path(__file__).resolve().parents[1] / "samples" / "gpt_dp.scale").read_text()
    spec = check_text(dp.replace("= ddp", "= zero1"), "dp.scale")
    faults.set_sources(codegen.sources(spec, spec.plan))
    seen = []

    def recording(fn):
        def call(*args, **kwargs):
            seen.append((fn.__name__, faults._CURRENT))
            return fn(*args, **kwargs)
        return call
    for name in ("all_reduce", "broadcast"):
        setattr(dist, name, recording(getattr(dist, name)))

    def prepare(module):
        module.to_empty(device="cpu")
        torch.manual_seed(0)
        for p in module.parameters():
            nn.init.normal_(p)
        return module
    parts = WholeModel(_Loss, cfg, ctx, prepare)
    params = list(parts.model.parameters())
    reduce = (ctx.batch_group, ctx.batch_size, set())  # as runtime.optimizer.build gives a whole model under dp
    opt, parts.mains = precision.mixed_adamw(params, parts.modules, cfg, optimizer.zero1_group(cfg, ctx), reduce)
    torch.manual_seed(rank)  # each rank its own batch
    x = torch.randn(4, 6, dtype=torch.bfloat16)
    parts.step([(x, torch.zeros(4))])
    assert all(p.grad is None and p.main_grad.dtype == torch.float32 for p in params)
    with faults.op("the optimizer step (zero1's parameter broadcasts over dp)", faults.scale("data_parallel")):
        opt.step()  # as runtime.trainer opens it under zero1
    ops = [name for name, _ in seen]
    assert ops.count("all_reduce") == 1 and ops.count("broadcast") == WORLD, ops  # one bucket; one per owner
    assert all(cur is not None and cur[1] is not None for _, cur in seen), seen
    every: list = [None] * WORLD
    dist.all_gather_object(every, [p.detach().float().sum().item() for p in params])
    assert every[0] == every[1]  # the ranks' weights agree after the step (different batches, averaged gradients)


@pytest.mark.e2e
def test_the_bf16_reducer_and_zero1_broadcasts_are_timed_operations_with_sites():
    multirank.spawn(_reducer, WORLD, mesh="dp")


def _bucketed_pair(ctx):
    """A bf16 model whose main gradients are bucketed for the batch ranks (MainGrads with `reduce`, about three
    buckets) and a copy of it whose main gradients are left unreduced: (model, ref, mains)."""
    torch.manual_seed(0)
    model, ref = _Model(), _Model()
    ref.load_state_dict(model.state_dict())
    precision.to_compute([model, ref])
    params = list(model.parameters())
    size = sum(p.numel() for p in params) * 4
    mains = precision.MainGrads(params, reduce=(ctx.batch_group, WORLD, set()), bucket_bytes=size / 3)
    precision.MainGrads(list(ref.parameters()))
    return model, ref, mains


def _assert_the_mean_of_the_ranks(model, ref) -> None:
    """Each reduced main gradient of `model` is the mean over the ranks of `ref`'s unreduced ones."""
    every: list = [None] * WORLD
    dist.all_gather_object(every, [p.main_grad.tolist() for p in ref.parameters()])
    for p, *ranks in zip(model.parameters(), *every):
        want = sum(torch.tensor(r) for r in ranks) / WORLD
        torch.testing.assert_close(p.main_grad, want.view_as(p.main_grad))


def _buckets(rank, ctx):
    """Buckets of main gradients (precision.MainGrads with `reduce`), against the mean over the ranks of the same
    model's unreduced main gradients: each bucket's all-reduce is launched from the hooks during the last
    micro-batch's backward, before the backward ends (the first layers' gradients are still to come), in bucket
    order; the earlier micro-batches launch none."""
    model, ref, mains = _bucketed_pair(ctx)
    params = list(model.parameters())
    launched = []
    all_reduce = dist.all_reduce

    def recording(t, *args, **kwargs):
        launched.append((t.numel(), mains.pending[-1]))  # gradients the last bucket still waits for
        return all_reduce(t, *args, **kwargs)
    dist.all_reduce = recording
    assert len(mains.buckets) >= 3 and mains.buckets[0][0] is params[-1]  # the head's first: backward's order
    for j in range(2):
        torch.manual_seed(10 * rank + j)
        x = torch.randn(4, 6, dtype=torch.bfloat16)
        if j == 1:
            mains.start_sync()
        model(x).float().square().sum().backward()
        ref(x).float().square().sum().backward()
        if j == 0:
            assert not launched
    mains.wait()
    assert [n for n, _ in launched] == [sum(p.numel() for p in b) for b in mains.buckets]
    assert launched[0][1] > 0  # the first bucket left while the first layers' gradients were still to come
    _assert_the_mean_of_the_ranks(model, ref)


@pytest.mark.e2e
def test_bucketed_main_gradients_are_reduced_from_the_last_backward():
    multirank.spawn(_buckets, WORLD, mesh="dp")


def _after_the_schedule(rank, ctx):
    """Pipeline stages (precision.MainGrads.reduce_now): no all-reduce while the micro-batches run; after them
    every bucket reduced in place (each main gradient still the same view of its bucket: no copy of the
    gradients), equal to the mean over the ranks of unreduced main gradients."""
    model, ref, mains = _bucketed_pair(ctx)
    params = list(model.parameters())
    launched = []
    all_reduce = dist.all_reduce

    def recording(t, *args, **kwargs):
        launched.append(t.data_ptr())
        return all_reduce(t, *args, **kwargs)
    dist.all_reduce = recording
    for j in range(2):
        torch.manual_seed(10 * rank + j)
        x = torch.randn(4, 6, dtype=torch.bfloat16)
        model(x).float().square().sum().backward()
        ref(x).float().square().sum().backward()
    assert not launched
    views = [p.main_grad.data_ptr() for p in params]
    mains.reduce_now()
    assert launched == [flat.data_ptr() for flat in mains.flat]  # the buckets themselves
    assert [p.main_grad.data_ptr() for p in params] == views
    _assert_the_mean_of_the_ranks(model, ref)


@pytest.mark.e2e
def test_pipeline_stages_reduce_their_main_gradient_buckets_in_place():
    multirank.spawn(_after_the_schedule, WORLD, mesh="dp")


def test_master_adamw_keeps_step_on_the_masters_device():
    """torch's fused AdamW (what MasterAdamW runs on CUDA) refuses a CPU `step` beside device tensors: every bf16
    program failed at step 1 on an H200 while the CPU suite passed. The step lives where the master lives (meta
    stands in for a device here)."""
    from runtime.precision import MasterAdamW
    p = torch.nn.Parameter(torch.empty(4, 4, device="meta", dtype=torch.bfloat16))
    master = torch.empty(4, 4, device="meta")
    opt = MasterAdamW([{"params": [p], "weight_decay": 0.0}], {p: master}, lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    assert opt.state[p]["step"].device == master.device and opt.state[p]["step"].dtype == torch.float32
