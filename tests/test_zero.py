"""ZeRO stages in the runtime (runtime.optimizer, runtime.parallelize, runtime.model_parts), on two gloo processes: zero1 partitions AdamW's state over dp and
updates exactly as AdamW (with its decay and no-decay groups); zero2 keeps each FSDP2 unit's weights gathered from
forward to backward where fsdp frees them, and shards the gradients as fsdp does. The e2e cases dp2_zero1 and
dp2_zero2 show that training is the single-device model's; these show that the stage asked for is the one run."""
from __future__ import annotations

import pytest

import torch
import torch.distributed as dist
from torch import nn

from tests import multirank

pytestmark = pytest.mark.e2e  # gloo ranks (tests/multirank.py): not the fast part

WORLD = 2


def _cfg(data_parallel: str):
    from runtime.config import Config, Data, Optim, Parallel
    return Config(name="t", source="t.scale", steps=3, seed=0,
                  parallel=Parallel(axes=(("dp", WORLD),), data_parallel=data_parallel, batch_ranks=WORLD),
                  optim=Optim(lr=1e-2, weight_decay=0.1), data=Data(global_batch=2, seq_len=4, vocab=8))


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        from runtime.layers import Repeat
        self.blocks = Repeat([nn.Sequential(nn.Linear(6, 6), nn.LayerNorm(6)) for _ in range(2)])
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        return self.head(self.blocks(x))


def _zero1(rank, ctx):
    from runtime import checkpoint, optimizer
    cfg = _cfg("zero1")
    torch.manual_seed(0)
    model, ref = _Model(), _Model()
    ref.load_state_dict(model.state_dict())
    group = optimizer.zero1_group(cfg, ctx)
    assert group is not None
    opt = optimizer.adamw(list(model.parameters()), cfg.optim, group)
    ref_opt = optimizer.adamw(list(ref.parameters()), cfg.optim)  # plain AdamW, same groups
    assert type(opt).__name__ == "ZeroRedundancyOptimizer"
    for step in range(2):
        torch.manual_seed(100 + step)  # the same gradients on both ranks, as after DDP's all-reduce
        for p, q in zip(model.parameters(), ref.parameters()):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        opt.step()
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=f"{name} differs from AdamW's update")
    # This rank's AdamW state is its partition: together the ranks hold each parameter's state exactly once.
    index = {p: i for i, p in enumerate(model.parameters())}
    mine = sorted(index[p] for p in checkpoint.local_state(opt))
    every: list = [None] * WORLD
    dist.all_gather_object(every, mine)
    assert all(every) and sorted(i for part in every for i in part) == list(range(len(index))), every
    for p, q in zip(model.parameters(), ref.parameters()):
        if p in checkpoint.local_state(opt):
            torch.testing.assert_close(checkpoint.local_state(opt)[p]["exp_avg_sq"], ref_opt.state[q]["exp_avg_sq"])


def _zero2(rank, ctx):
    from torch.distributed.tensor import DTensor
    from runtime import parallelize, tensor_parallel as tp
    x = torch.randn(4, 6)
    gathered_after_forward = {}
    for kind in ("fsdp", "zero2"):
        cfg = _cfg(kind)
        torch.manual_seed(0)
        model = parallelize.wrap_data_parallel(_Model(), ctx, cfg, tp.Shards((), (), ()))
        block = model.blocks["0"]
        assert all(isinstance(p, DTensor) for p in block.parameters())  # at rest: dp shards
        loss = model(x).square().sum()
        gathered_after_forward[kind] = not any(isinstance(p, DTensor) for p in block.parameters())
        loss.backward()
        assert all(isinstance(p, DTensor) for p in block.parameters())  # resharded after backward
        assert all(isinstance(p.grad, DTensor) and p.grad.to_local().shape[0] <= (p.shape[0] + 1) // WORLD
                   for p in block.parameters())  # gradients reduce-scattered to dp shards
    assert gathered_after_forward == {"fsdp": False, "zero2": True}, gathered_after_forward


def _both(rank, ctx):
    _zero1(rank, ctx)
    _zero2(rank, ctx)


def test_zero1_partitions_adamw_state_and_zero2_keeps_weights_gathered_from_forward_to_backward():
    """One pair of processes for both (each spawn costs seconds)."""
    multirank.spawn(_both, WORLD, mesh="dp")


class _LM(nn.Module):
    """A tiny token model with the runtime's blocks: WholeModel's contract, forward(tokens, targets) -> loss."""

    def __init__(self):
        super().__init__()
        from runtime.layers import Repeat
        self.embed = nn.Embedding(8, 6)
        self.blocks = Repeat([nn.Sequential(nn.Linear(6, 6), nn.LayerNorm(6)) for _ in range(2)])
        self.head = nn.Linear(6, 8)

    def forward(self, tokens, targets):
        return nn.functional.cross_entropy(self.head(self.blocks(self.embed(tokens))).flatten(0, 1),
                                           targets.flatten())


def _grad_sync(rank, ctx):
    """WholeModel.step under FSDP2 with two micro-batches: with fsdp_grad_sync = step the first micro-batch's
    backward leaves no sharded gradient (FSDP2 accumulates it whole, unsharded, until the last micro-batch's
    reduce-scatter); with micro_batch it reduce-scatters there too, so the second micro-batch's forward finds every
    parameter's sharded gradient already set. Both end with the same gradients."""
    import contextlib
    import dataclasses

    from runtime import parallelize, tensor_parallel as tp
    from runtime.model_parts import WholeModel
    seen, grads, rs = {}, {}, {}
    for kind in ("fsdp", "zero2"):
        for sync in ("step", "micro_batch"):
            cfg = _cfg(kind)
            cfg = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, micro_batches=2,
                                                                        fsdp_grad_sync=sync))

            def prepare(module, cfg=cfg):
                module = parallelize.wrap_data_parallel(module, ctx, cfg, tp.Shards((), (), ()))
                module.to_empty(device="cpu")
                torch.manual_seed(0)
                with torch.no_grad():
                    for p in module.parameters():
                        p.to_local().copy_(torch.randn(p.to_local().shape) * 0.3)
                return module

            parts = WholeModel(_LM, cfg, ctx, prepare)
            calls = []  # FSDP2's reduce-scatters (elements of their inputs), however torch issues them
            for name in ("reduce_scatter_tensor", "reduce_scatter_single"):
                def counting(*args, _real=getattr(dist, name), **kw):
                    calls.append((kw.get("input") if "input" in kw else args[1]).numel())
                    return _real(*args, **kw)
                setattr(dist, name, counting)
            found = []
            parts.model.register_forward_pre_hook(
                lambda *_: found.append(all(p.grad is not None for p in parts.model.parameters())),
                prepend=True)  # before FSDP2's own hook gathers the root's weights
            torch.manual_seed(1 + rank)
            batches = [(torch.randint(0, 8, (1, 4)), torch.randint(0, 8, (1, 4))) for _ in range(2)]
            try:
                parts.step(batches)
            finally:
                for name in ("reduce_scatter_tensor", "reduce_scatter_single"):
                    setattr(dist, name, getattr(dist, name).__kwdefaults__["_real"])
            seen[(kind, sync)] = found
            rs[(kind, sync)] = calls
            # each reduce-scatter of a step moves the whole model's gradient once (every dim 0 here divides dp: no
            # padding), the ledger's `params` elements per occurrence
            assert sum(calls) == sum(p.numel() for p in parts.model.parameters()) * (2 if sync != "step" else 1)
            grads[(kind, sync)] = [p.grad.full_tensor() for p in parts.model.parameters()]
    assert seen == {(k, "step"): [False, False] for k in ("fsdp", "zero2")} | \
        {(k, "micro_batch"): [False, True] for k in ("fsdp", "zero2")}, seen
    for kind in ("fsdp", "zero2"):
        # the ledger's count: one reduce-scatter of every unit per step, or per micro-batch (twice the bytes here)
        assert rs[(kind, "step")] and rs[(kind, "micro_batch")] == rs[(kind, "step")] * 2, rs
        for a, b in zip(grads[(kind, "step")], grads[(kind, "micro_batch")]):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_fsdp_grad_sync_reduce_scatters_every_micro_batch_or_only_the_last():
    """runtime.model_parts honours Parallel.fsdp_grad_sync (the memory model's sharded or whole gradients between
    micro-batches, the ledger's one or m reduce-scatters)."""
    multirank.spawn(_grad_sync, WORLD, mesh="dp")
