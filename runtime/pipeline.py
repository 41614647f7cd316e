"""Pipeline parallelism over `pp` with torch.distributed.pipelining: this rank's stages and their schedule.

Stage s runs on pp rank s % pp (v stages per rank for interleaved schedules). Each stage module is built on the
meta device, sharded or initialised by name like the single-device model, and handed to a PipelineStage; the
schedule runs the micro-batches in the order of runtime/schedule.py (the order the compiler checked) and scales
gradients by 1/micro-batches (the loss is a per-micro-batch mean).
A tied embedding lives on the first and the last stage; their gradients are summed after each step.
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import _Action, _PipelineScheduleRuntime

from runtime import collectives, mesh, moe, schedule

TIED = "embed.weight"


def torch_order(name: str, pp: int, micro_batches: int, virtual: int) -> dict:
    """Our compute order for every rank (runtime/schedule.py, the lists the compiler checked) in torch's action
    type; torch's runtime adds the sends and receives by the same rule the check assumes."""
    lay = schedule.Layout(pp, virtual, micro_batches)
    return {r: [_Action.from_str(str(a)) for a in acts]
            for r, acts in schedule.compute_order(name, lay).items()}


def _quietly(fn):
    def run(*args, **kwargs):
        with moe.not_recording():
            return fn(*args, **kwargs)
    return run


def _counted(get_ops):
    """A stage's get_{fwd,bwd}_{send,recv}_ops that counts the bytes of each point-to-point op (runtime byte
    counting, compared with the ledger's pipeline transfers)."""
    @functools.wraps(get_ops)
    def ops(*args, **kwargs):
        out = get_ops(*args, **kwargs)
        for op in out:
            collectives._count("send_recv", "pp", op.tensor)
        return out
    return ops


def stage_ids(pp: int, pp_rank: int, virtual: int) -> list[int]:
    return [c * pp + pp_rank for c in range(virtual)]


def tie_group(ctx):
    """The group of the two ranks holding the first and the last stage with this rank's other coordinates (every
    rank creates every such group, in the same order, as new_group requires); None off those two ranks."""
    mine = None
    for row in mesh.rows(ctx.mesh, ("pp",)):
        group = dist.new_group([row[0], row[-1]])
        if ctx.rank in (row[0], row[-1]):
            mine = group
    return mine


class Pipeline:
    mains = None
    """runtime.precision.MainGrads when the stages' gradients are main gradients (bf16 without FSDP), set by the
    training loop once the optimizer has made them."""

    def __init__(self, stage_cls, cfg, ctx, loss_fn, prepare, main_grads: bool = False):
        """`prepare(module) -> module` materialises, initialises and wraps one stage module (data parallelism);
        `main_grads`: the gradients will be main gradients (runtime.precision), scaled by 1/micro-batches here
        rather than by the schedule (which scales `.grad`)."""
        self.ctx, self.cfg = ctx, cfg
        pp, r = ctx.axis_size("pp"), ctx.coords["pp"]
        par = cfg.parallel
        n_stages = pp * par.virtual_stages
        self.ids = stage_ids(pp, r, par.virtual_stages)
        self.modules = []
        for s in self.ids:
            with torch.device("meta"):
                module = stage_cls(s)
            # Sends carry what the stage returns: the residual stream, bf16 under bf16 (fp32 with fp32_residual).
            self.modules.append(prepare(module))
        group = ctx.mesh["pp"].get_group()
        self.stages = [PipelineStage(m, s, n_stages, ctx.device, group=group) for m, s in zip(self.modules, self.ids)]
        for stage in self.stages:  # its first forward infers shapes on uninitialised tensors: not a training step
            infer = getattr(stage, "_forward_metadata_inference", None)
            if infer is not None:
                stage._forward_metadata_inference = _quietly(infer)
            for name in ("get_fwd_send_ops", "get_fwd_recv_ops", "get_bwd_send_ops", "get_bwd_recv_ops"):
                setattr(stage, name, _counted(getattr(stage, name)))
        # Run exactly the action lists the compiler printed and proved (not a schedule class's own order).
        self.schedule = _PipelineScheduleRuntime(self.stages, n_microbatches=par.micro_batches,
                                                 loss_fn=loss_fn, scale_grads=not main_grads)
        self.schedule._prepare_schedule_with_comms(torch_order(par.schedule, pp, par.micro_batches,
                                                               par.virtual_stages))
        self.holds_last = (n_stages - 1) in self.ids
        self.holds_first = 0 in self.ids
        self.tie = tie_group(ctx) if par.tied_embedding and pp > 1 else None
        # The last stage's copy of a tied embedding when the first stage is elsewhere: the same parameter, counted
        # (norm, parameter count) and saved once, by the rank holding the first stage.
        self.tied_elsewhere = (TIED,) if self.tie is not None and not self.holds_first else ()

    def named_parameters(self):
        """Every parameter of this rank's stages; the last stage's copy of a tied embedding is left out when the
        first stage is elsewhere (it is the same parameter, counted once)."""
        for module in self.modules:
            for name, p in module.named_parameters():
                if name.removeprefix("module.") in self.tied_elsewhere:
                    continue
                yield name, p

    def all_named_parameters(self):
        for module in self.modules:
            yield from module.named_parameters()

    def watch(self, measure) -> None:
        """Count the activations of this rank's stage forwards and of the loss into `measure` (runtime.memory) for
        the next step: hooks on the stage modules, the schedule's loss function wrapped (both undone at its end)."""
        sched = self.schedule

        class _Restore:
            def __init__(self, recorded):
                self.original = sched._loss_fn
                sched._loss_fn = recorded(self.original)

            def remove(self):
                sched._loss_fn = self.original

        measure.watch_stages(self.modules, _Restore)

    def step(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Forward and backward of all micro-batches; returns the mean loss, on every pp rank."""
        losses: list = []
        # return_outputs=False: the last stage computes each micro-batch's loss as the forward ends and keeps its
        # logits only until that micro-batch's backward (torch's fwd_cache; with 1F1B-style schedules the next
        # action), as Megatron's last stage does. The default would also collect every micro-batch's logits in
        # output_chunks for the whole step and concatenate them at its end: m × the logits, that nothing reads.
        self.schedule.step(tokens, target=targets, losses=losses, return_outputs=False)
        if self.mains is not None:  # the mean over micro-batches, as the schedule's scale_grads would
            self.mains.finish(1.0 / self.cfg.parallel.micro_batches)
        if self.tie is not None:
            for module in self.modules:
                for name, p in module.named_parameters():
                    grad = p.main_grad if self.mains is not None else p.grad
                    if name.removeprefix("module.") == TIED and grad is not None:
                        g = grad.to_local() if hasattr(grad, "to_local") else grad
                        dist.all_reduce(g, group=self.tie)
        total = (torch.stack([l.detach().float() for l in losses]).mean() if self.holds_last and losses
                 else torch.zeros((), device=self.ctx.device))
        dist.all_reduce(total, group=self.ctx.mesh["pp"].get_group())
        return total
