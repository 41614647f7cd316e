"""This rank's part of the model (torchtitan's `model_parts`): the whole model, micro-batches accumulated under its
data-parallel wrapper (`WholeModel`), or the pipeline stages its pp rank runs (`PipelineStages`). The optimizer,
clipping, the gradient syncs and checkpoints work over the one list of modules either gives; the two differ in how
a step's batch is fed to them and how its gradients are synchronised over the batch ranks (what the data-parallel
mode's properties say: runtime.config.Parallel.shards_grads, FSDP2's own reduce-scatter, or an all-reduce).
"""
from __future__ import annotations

import contextlib

import torch

from runtime import context_parallel, data, faults, mesh, packed, parallelize, precision, sections
from runtime import tensor_parallel as tp
from runtime.config import Config


class ModelParts:
    """This rank's part of the model as a list of modules (torchtitan's `model_parts`): the whole model, or the
    pipeline stages this pp rank runs. The optimizer, clipping, the gradient syncs and checkpoints all work over
    this one list; only `step` (the forward and backward of one optimizer step) differs between the two kinds."""

    modules: list
    """The modules, in the order their parameters are given to the optimizer and checkpoints."""
    tied_elsewhere: tuple = ()
    """Parameter names held here that are copies of a parameter another rank owns (the last stage's tied
    embedding): left out of the norm, the parameter count and saving, so each is counted once."""
    pp_group = None
    """The group the gradient norm is summed over besides dp and tp (the pp row), or None."""
    aux_loss_scale = 1.0
    """The MoE auxiliary loss's scale: each micro-batch's loss is scaled by 1/m, by the schedule under pp."""
    where = ""
    """What the parameter count of the start-up line covers."""
    measure = None
    """runtime.memory.Measure of the step being measured (its forwards record activations), or None."""

    def named_parameters(self, counted_once: bool = False):
        """(name, parameter) over every module; `counted_once`: without the `tied_elsewhere` copies, nor a second
        copy of a name held here (dualpipev's rank 0 holds the first and the last stage, a tied embedding's two
        copies, equal after every step)."""
        seen = set()
        for module in self.modules:
            for name, p in module.named_parameters():
                bare = name.removeprefix("module.")
                if counted_once and (bare in self.tied_elsewhere or bare in seen):
                    continue
                seen.add(bare)
                yield name, p

    def batches(self, source, step: int, held_out: bool = False) -> list:
        """This rank's (tokens, targets) host tensors of step `step`, one pair per micro-batch the step feeds;
        `held_out`: of evaluation's held-out batch `step` instead."""
        raise NotImplementedError

    def step(self, batches: list) -> torch.Tensor:
        """Forward and backward of this rank's share of a step's batch (`batches`, on the device), gradients
        averaged over the batch ranks (all but the experts'); returns this rank's mean loss, on the device."""
        raise NotImplementedError

    def eval_loss(self, batches: list) -> torch.Tensor:
        """The forward alone (under no_grad) of this rank's share of one held-out batch (`batches`, as `step`'s):
        the sum of the cross entropy over its tokens, float64, on the device, the same on every rank of a batch
        rank's tp and pp groups."""
        raise NotImplementedError


class WholeModel(ModelParts):
    """No pipeline: one module, `micro_batches` micro-batches accumulated; the data-parallel wrapper (DDP or FSDP)
    synchronises the gradients during the last micro-batch's backward only."""

    mains = None
    """runtime.precision.MainGrads under bf16 without FSDP (set by the Trainer); with dp, its buckets replace DDP."""

    def __init__(self, model_cls, cfg: Config, ctx: mesh.Context, prepare):
        with torch.device("meta"):
            model = model_cls()
        self.model = prepare(model)
        self.modules = [self.model]
        self.cfg, self.ctx = cfg, ctx
        # How the gradients are synchronised over the batch ranks: FSDP2 (zero2, fsdp), or replicated (ddp, zero1:
        # DDP, or bf16's main-gradient buckets); neither on one batch rank.
        self.fsdp = cfg.parallel.shards_grads
        self.replicated = ctx.batch_size > 1 and not self.fsdp
        self.aux_loss_scale = 1.0 / cfg.parallel.micro_batches
        self.measure = None  # runtime.memory.Measure of this step, when one is taken
        self.site = parallelize.site(self.fsdp)  # the lines behind the forward's and backward's collectives
        # What a forward waits for: FSDP's weight gathers; DDP's bucket order (broadcast from rank 0 at the first
        # forward after a backward) and buffers, over the batch ranks.
        self.gathers = (" (with FSDP's weight all-gathers over dp)" if self.fsdp else
                        " (with DDP's bucket and buffer synchronisation over the batch ranks)" if self.replicated
                        else "")

    def batches(self, source, step: int, held_out: bool = False) -> list:
        m, ctx = self.cfg.parallel.micro_batches, self.ctx
        return [_packed_shard(data.micro_batch(source, step, self.cfg.data.global_batch, ctx.batch_rank,
                                               ctx.data_ranks, j, m, held_out), self.cfg.data.document_separator)
                for j in range(m)]

    def step(self, batches: list) -> torch.Tensor:
        m, ctx, model = self.cfg.parallel.micro_batches, self.ctx, self.model
        ddp = self.replicated and self.mains is None  # DDP-wrapped (fp32)
        if self.measure is not None:  # what each micro-batch's forward keeps for its backward
            self.measure.watch_model(model.module if ddp else model)
        total = torch.zeros((), device=ctx.device)
        for j, (tokens, targets, *docs) in enumerate(batches):
            sync = j == m - 1
            no_sync = model.no_sync() if (not sync and ddp) else contextlib.nullcontext()
            if self.fsdp:  # FSDP2 (fsdp, zero2): reduce-scatter only on the last micro-batch; the ones
                # before accumulate whole (unsharded) gradients, held until that reduce-scatter (memory model);
                # fsdp_grad_sync = micro_batch: on every one, the gradients accumulating sharded
                sync = sync or self.cfg.parallel.fsdp_grad_sync == "micro_batch"
                model.set_requires_gradient_sync(sync)
            if sync and self.mains is not None:  # bf16 without DDP: the last backward launches the buckets
                self.mains.start_sync()
            with no_sync, _documents(docs):
                with faults.op(f"the forward{self.gathers if ddp or self.fsdp else ''}", self.site, "forward"):
                    sections.slow_work("forward")  # the straggler drill's extra work (SCALEC_TEST_SLOW), if any
                    loss = model(tokens, targets) / m
                synced = sync and parallelize.reduces_in_backward(self.cfg.parallel, ctx)
                # timed as backward, the reduction DDP waits for at its end split off (runtime.sections)
                with faults.op(f"the backward ({parallelize.sync_phrase(synced, self.fsdp, self.mains is not None)})",
                               self.site, sections.BACKWARD_SYNC if synced else "backward"):
                    sections.slow_work("backward")
                    if synced:
                        sections.mark_backward_end(loss)
                    loss.backward()
            total += loss.detach()
        if self.mains is not None:
            with faults.op("the bucketed gradient all-reduces over the batch ranks (main gradients)",
                           parallelize.site(False), "grad_reduce"):
                self.mains.wait()
            self.mains.finish()
        return total

    def eval_loss(self, batches: list) -> torch.Tensor:
        from torch.nn.parallel import DistributedDataParallel as DDP
        # DDP's own forward would synchronise buffers over the batch ranks: its module is the same model.
        model = self.model.module if isinstance(self.model, DDP) else self.model
        total = torch.zeros((), dtype=torch.float64, device=self.ctx.device)
        with faults.op(f"the evaluation forward{self.gathers if self.fsdp else ''}", self.site, "eval"):
            for tokens, targets, *docs in batches:  # each micro-batch's loss is the mean over its tokens
                with _documents(docs):
                    total += model(tokens, targets).double() * targets.numel()
        return total


class PipelineStages(ModelParts):
    """Pipeline parallelism: the stages this pp rank runs, driven by the schedule the compiler proved; their dense
    gradients are averaged over the batch ranks after the schedule (no DDP: its pipelining hook fails a reducer
    assert when micro-batches = pp, torch 2.13), FSDP's own reduce-scatter under fsdp."""

    where = " in rank 0's pipeline stages"

    def __init__(self, model_cls, cfg: Config, ctx: mesh.Context, loss_fn, prepare, shards: tp.Shards):
        from runtime.pipeline import Pipeline
        self.pipe = Pipeline(model_cls, cfg, ctx, loss_fn, lambda module: prepare(module, ddp=False),
                             main_grads=precision.main_grads(cfg.precision, cfg.parallel))
        self.modules = self.pipe.modules
        self.tied_elsewhere = self.pipe.tied_elsewhere
        self.pp_group = ctx.mesh["pp"].get_group()
        self.cfg, self.ctx, self.shards = cfg, ctx, shards
        self.measure = None  # runtime.memory.Measure of this step, when one is taken

    def batches(self, source, step: int, held_out: bool = False) -> list:
        # The schedule splits this rank's batch into the micro-batches itself.
        ctx = self.ctx
        return [_packed_shard(data.micro_batch(source, step, self.cfg.data.global_batch, ctx.batch_rank,
                                               ctx.data_ranks, 0, 1, held_out), self.cfg.data.document_separator)]

    def step(self, batches: list) -> torch.Tensor:
        ctx = self.ctx
        if self.measure is not None:  # the stages' forwards and the loss, recorded over the schedule
            self.pipe.watch(self.measure)
        ((tokens, targets, *docs),) = batches
        # timed as pp_p2p: the stages' forwards and backwards inside it are timed as theirs (runtime.pipeline)
        with faults.op("the pipeline schedule (sends and receives between stages over pp)",
                       faults.scale("axis pp", "schedule"), "pp_p2p"):
            total = self.pipe.step(tokens, targets, *docs)
        if not self.cfg.parallel.shards_grads:
            with faults.op("the gradient all-reduce over the batch ranks (data parallelism of stages)",
                           parallelize.site(False), "grad_reduce"):
                if self.pipe.mains is not None:  # bf16: the main gradients' buckets, in place
                    self.pipe.mains.reduce_now()
                else:
                    parallelize.average_dense_grads(self.named_parameters(), ctx, self.shards,
                                                    self.cfg.parallel.ddp_bucket_mb * 2**20)
        return total

    def eval_loss(self, batches: list) -> torch.Tensor:
        ((tokens, targets, *docs),) = batches
        with faults.op("the evaluation's forward sends and receives between stages over pp",
                       faults.scale("axis pp", "schedule"), "eval"):
            return self.pipe.evaluate(tokens, targets, *docs)



def _packed_shard(pair: tuple, separator: int | None) -> tuple:
    """`_sequence_shard` of (tokens, targets); with packed documents (runtime.packed) the targets after a separator
    masked first, and the whole sequences' document ids appended (under cp every rank reads its queries' and the
    gathered keys' documents from them)."""
    if separator is None:
        return _sequence_shard(pair)
    tokens, targets = pair
    docs = packed.documents(tokens, separator)
    return (*_sequence_shard((tokens, packed.mask_targets(tokens, targets, separator))), docs)


def _documents(docs: list):
    """packed.batch over the micro-batch's document ids, when it has them."""
    return packed.batch(docs[0]) if docs else contextlib.nullcontext()


def _sequence_shard(pair: tuple) -> tuple:
    """This cp rank's tokens of a micro-batch's (tokens, targets): chunks i and 2·cp − 1 − i of each sequence
    (runtime.context_parallel); the pair as it is without cp."""
    return tuple(context_parallel.chunks(t, 1) for t in pair)
