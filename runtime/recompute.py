"""Activation recomputation of each block of a `repeat` (`plan { recompute = none | selective | full }`).

Megatron's two meanings, built from torch's own checkpointing (`torch.utils.checkpoint`, non-reentrant):

  full       each block is run under `checkpoint(block, x, use_reentrant=False)`: after its forward only the block's
             input is kept; its backward first re-runs the block's forward. That re-run includes the block's tensor-
             parallel collectives (runtime.collectives) and MoE all-to-alls (runtime.moe), as Megatron's full
             recomputation does: every rank of the group re-runs them in backward, in the same order, because every
             rank runs the same backward graph and the recomputation is triggered at the same node of it (torch's
             early stop ends it at the same op on every rank too). The bytes they move therefore count again.
  selective  torch's selective activation checkpoint API (`create_selective_checkpoint_contexts`) on each block,
             with `policy`: the outputs of matmuls and of the all-reduces, reduce-scatters and all-to-alls are
             saved (MUST_SAVE); everything else, the attention core (scaled_dot_product_attention and each of its
             aten kernels), activation functions, norms, elementwise ops and dtype casts, is recomputed.
             runtime.collectives and runtime.moe issue their collectives as torch's functional collectives
             (`torch.ops._c10d_functional`), whose outputs the policy saves by op, so the recomputation reads them
             back instead of communicating (ring attention's forward too, one operator whose output and
             log-sum-exp are saved: runtime.context_parallel); except the all-gathers (sequence parallelism's, before the column
             linears), which it runs again: their output is tp times their input, and Megatron too keeps a
             sequence-parallel linear's input sharded and gathers it again in backward.

Blocks keep their names (the mode is an attribute of runtime.layers.Repeat, not a wrapper module), so parameter
names, checkpoints, tp shard patterns and FSDP units are the same in every mode. `recomputing()` says whether the
code running is a recomputation (and of which mode): side effects of a forward that must happen once per step
(MoE statistics, collective byte counts of a saved collective) read it.
"""
from __future__ import annotations

import contextlib
import functools

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from runtime import choices

MODES = choices.RECOMPUTE

_RECOMPUTING: str | None = None


def recomputing() -> str | None:
    """`full` or `selective` while a block's forward is being re-run in backward, else None."""
    return _RECOMPUTING


def _ops(namespace, names):
    ns = getattr(torch.ops, namespace, None)
    return {getattr(getattr(ns, n), o) for n in names if ns is not None and hasattr(ns, n)
            for o in getattr(ns, n).overloads()}


# Saved by selective recomputation: matmuls (F.linear lowers to addmm or mm, batched experts to bmm), and the
# collectives whose outputs cost communication to make again (the functional ones runtime.collectives and runtime.moe
# issue). Not the all-gathers: a sequence-parallel all-gather's output is the whole sequence, tp times what it
# gathers, and Megatron keeps only the sharded input of its sequence-parallel linears and gathers it again in backward
# (Korthikanti et al. 2022, section 4.2.2); here the recomputation does, once per region. Nor the waits: a wait returns
# its collective's output, which the collective's entry saves (or recomputes).
SAVE = frozenset(_ops("aten", ("mm", "addmm", "bmm", "baddbmm", "_scaled_mm"))
                 | _ops("_c10d_functional", ("all_reduce", "reduce_scatter_tensor", "all_to_all_single")))
RECOMPUTE = frozenset(_ops("_c10d_functional", ("all_gather_into_tensor", "wait_tensor")))
"""Recomputed, also under torch.compile, whose partitioner otherwise saves every collective's output (torch/
_functorch/partitioners.py, force_save_collectives: only an op a policy marks MUST_RECOMPUTE is exempt)."""


_KEPT: set = set()


def keep(op) -> None:
    """Save `op`'s outputs under selective recomputation too: an operator the runtime defines itself (torch.library)
    whose outputs cost communication to make again, as SAVE's collectives' do (runtime.context_parallel's ring
    forward: its output and log-sum-exp, made by sending the keys and values round the cp group)."""
    _KEPT.add(op)


def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """Selective recomputation's choice for one op: save matmul outputs and those of the collectives in SAVE (and
    the runtime's own operators marked by `keep`), gather again in backward, recompute the rest."""
    if op in SAVE or op in _KEPT:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.MUST_RECOMPUTE if op in RECOMPUTE else CheckpointPolicy.PREFER_RECOMPUTE


@contextlib.contextmanager
def _marked(mode: str | None):
    global _RECOMPUTING
    outer, _RECOMPUTING = _RECOMPUTING, mode
    try:
        yield
    finally:
        _RECOMPUTING = outer


def _region(block, x: torch.Tensor, mode: str) -> torch.Tensor:
    """The body of a block (its class's forward, not its hooks) under recomputation `mode`, as one compiled region
    (runtime.compile): dynamo traces the checkpoint and the selective policy into the graph, and the partitioner
    recomputes in backward what they mark. Nothing is re-run in Python, so `recomputing()` stays None; a compiled
    region's Python side effects happen when it is traced, not per call."""
    body = type(block).forward
    if mode == "none" or not torch.is_grad_enabled():
        return body(block, x)
    context_fn = (functools.partial(create_selective_checkpoint_contexts, policy) if mode == "selective"
                  else None)
    kwargs = {"context_fn": context_fn} if context_fn is not None else {}
    return checkpoint(body, block, x, use_reentrant=False, **kwargs)


_COMPILED_REGIONS: dict = {}  # torch.compile's backend -> the compiled region


def compiled_forward(block, mode: str, x: torch.Tensor, *, backend: str) -> torch.Tensor:
    """A block's forward as a compiled region (runtime.compile sets it as the block's `forward`, so the module's
    hooks, FSDP's gathers among them, run eagerly around it). One compiled function serves every block: a block
    is an input of the region, its parameters are graph inputs, so blocks of one class share one compilation.
    `backend`: torch.compile's, as runtime.compile.apply was given it."""
    region = _COMPILED_REGIONS.get(backend)
    if region is None:
        region = _COMPILED_REGIONS[backend] = torch.compile(_region, backend=backend)
    return region(block, x, mode)


def run_block(block, x: torch.Tensor, mode: str, compiled: bool = False) -> torch.Tensor:
    """`block(x)` under the recomputation `mode`; `compiled`: the block's forward is a compiled region that
    recomputes by itself (compiled_forward)."""
    if compiled or mode == "none" or not torch.is_grad_enabled():
        return block(x)
    calls = [0]

    def forward(x):  # the first call is the forward, later ones (in backward) the recomputation
        calls[0] += 1
        with _marked(mode if calls[0] > 1 else _RECOMPUTING):
            return block(x)

    context_fn = (functools.partial(create_selective_checkpoint_contexts, policy) if mode == "selective"
                  else None)
    kwargs = {"context_fn": context_fn} if context_fn is not None else {}
    return checkpoint(forward, x, use_reentrant=False, **kwargs)

