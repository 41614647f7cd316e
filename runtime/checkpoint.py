"""Checkpoints with torch.distributed.checkpoint: sharded, layout-independent, atomic, resumable.

A checkpoint is `DIR/step_NNNNNNNN/`, written under a temporary name and renamed by rank 0 once every rank has
finished, so a crash never leaves a half-written checkpoint that looks complete. DIR must be one filesystem that
every rank sees (the usual shared storage of a cluster). Rank 0 decides which checkpoint to resume from and tells
the others. State dicts use fully qualified parameter names of the single-device model, so a checkpoint loads into
any other plan of the same model. Experts sharded over `ep` are saved as DTensors sharded along their first dim
(with their optimizer state), so they too are stored whole and load into any other ep degree. The run's length is
stored with it: resuming with another number of steps would silently bend the learning-rate schedule, so it is
refused.
"""
from __future__ import annotations

import os
import re
import shutil

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

_STEP = re.compile(r"^step_(\d{8})$")


def _complete(directory: str) -> list[tuple[int, str]]:
    if not os.path.isdir(directory):
        return []
    found = []
    for entry in os.listdir(directory):
        m = _STEP.match(entry)
        if m and os.path.exists(os.path.join(directory, entry, ".metadata")):
            found.append((int(m.group(1)), os.path.join(directory, entry)))
    return sorted(found)


def _state(model, optimizer, ctx, is_expert) -> tuple[dict, dict]:
    """Model and optimizer state dicts by single-device names; ep-sharded tensors (`is_expert(name)`) as DTensors
    Shard(0) over ep, so that DCP sees the whole expert tensors."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    if ctx.axis_size("ep") == 1:
        return model_sd, optim_sd
    from torch.distributed.tensor import DTensor, Shard
    ep_mesh = ctx.mesh["ep"]

    def whole(t):
        return DTensor.from_local(t, ep_mesh, [Shard(0)], run_check=False) if t.ndim > 0 else t
    for name in [n for n in model_sd if is_expert(n)]:
        model_sd[name] = whole(model_sd[name])
        for key, t in optim_sd["state"].get(name, {}).items():
            optim_sd["state"][name][key] = whole(t)
    return model_sd, optim_sd


def _unwrap_experts(model_sd: dict, optim_sd: dict, is_expert) -> None:
    """Back to this rank's local expert tensors after loading (other DTensors, FSDP's, stay as they are)."""
    for name in [n for n in model_sd if is_expert(n)]:
        model_sd[name] = model_sd[name].to_local()
        state = optim_sd["state"].get(name, {})
        for key, t in state.items():
            state[key] = t.to_local() if hasattr(t, "to_local") else t


def save(directory: str, step: int, model, optimizer, scheduler, ctx, total_steps: int,
         is_expert=lambda name: False) -> str:
    final = os.path.join(directory, f"step_{step:08d}")
    tmp = final + ".tmp"
    if ctx.is_logger:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(directory, exist_ok=True)
    dist.barrier()
    model_sd, optim_sd = _state(model, optimizer, ctx, is_expert)
    state = {"model": model_sd, "optim": optim_sd,
             "progress": {"step": torch.tensor(step), "scheduler_epoch": torch.tensor(scheduler.last_epoch),
                          "total_steps": torch.tensor(total_steps)}}
    dcp.save(state, checkpoint_id=tmp)
    dist.barrier()
    if ctx.is_logger:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        print(f"scalec: checkpoint {final}", flush=True)
    dist.barrier()
    return final


def load_latest(directory: str, model, optimizer, scheduler, ctx, total_steps: int,
                is_expert=lambda name: False) -> int:
    """Load the newest complete checkpoint in `directory`, if any; return the step to resume from."""
    found = _complete(directory) if ctx.is_logger else []
    choice = torch.tensor(found[-1][0] if found else -1, device=ctx.device)
    dist.broadcast(choice, src=0)  # rank 0's listing decides for everyone
    step = int(choice)
    if step < 0:
        return 0
    path = os.path.join(directory, f"step_{step:08d}")
    model_sd, optim_sd = _state(model, optimizer, ctx, is_expert)
    state = {"model": model_sd, "optim": optim_sd,
             "progress": {"step": torch.tensor(0), "scheduler_epoch": torch.tensor(0),
                          "total_steps": torch.tensor(0)}}
    dcp.load(state, checkpoint_id=path)
    written_for = int(state["progress"]["total_steps"])
    if written_for != total_steps:
        raise SystemExit(f"scalec: {path} belongs to a run of {written_for} steps; resuming it for {total_steps} "
                         "would change the learning-rate schedule. Resume with the same number of steps, or start "
                         "in an empty checkpoint directory.")
    if ctx.axis_size("ep") > 1:
        _unwrap_experts(state["model"], state["optim"], is_expert)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    scheduler.last_epoch = int(state["progress"]["scheduler_epoch"])
    for group, lr in zip(optimizer.param_groups, _lrs(scheduler)):
        group["lr"] = lr
    if ctx.is_logger:
        print(f"scalec: resumed from {path} (step {step})", flush=True)
    return int(state["progress"]["step"])


def _lrs(scheduler) -> list[float]:
    """The learning rates of the scheduler's current step, without stepping it."""
    return [base * lmbda(scheduler.last_epoch) for base, lmbda in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
