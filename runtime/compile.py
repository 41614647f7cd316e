"""`plan { compile = true }`: torch.compile over the regions of a generated program, as torchtitan compiles a model.

Each block of a `repeat` is one compiled region, its recomputation inside it: torch.utils.checkpoint and the
selective policy are traced into the region, and inductor's partitioner honours them (runtime.recompute.
compiled_forward). The code around the repeats (embedding and positions before; final norm, LM head and loss after;
under pp a stage's prologue and epilogue) is compiled too: the repeat itself is left out of that trace
(`torch._dynamo.disable`), so the module's forward becomes two regions around an eager loop over the compiled
blocks. Only forwards are compiled, never a module's call: its hooks (FSDP2's gathers and reduce-scatters, the
memory tracker's) run eagerly around the regions, as in torchtitan, where FSDP wraps compiled blocks. Blocks of one
class share one compilation (a block is an input of the region, its parameters graph inputs).

The collectives of runtime.collectives and runtime.moe are torch's functional collectives inside autograd
Functions: dynamo traces them into the regions' graphs, forward and backward, so tp, sp, ep and pp plans compile as
dp ones do. What only an eager step can do is done eagerly: `--count-bytes` runs the program uncompiled (a compiled
region counts nothing per call), and the watchdog names the step's phase (the backward, the pipeline schedule)
instead of the collective.
"""
from __future__ import annotations

import functools
import logging
import os

import torch
from torch import nn

from runtime import context_parallel, recompute
from runtime.layers import Repeat


class _NoInPlaceNotice(logging.Filter):
    """Drops torch's notice that a selective-recomputation policy under compile must not meet in-place ops: every
    rank printed it once. A block's body is the traced graph's code, out of place throughout (compiler/trace.py
    traces functional ops; runtime.moe's dispatch scatters out of place), and the compiled selective case of
    tests/e2e matches the single-device model."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "context_fn is passed to torch.utils.checkpoint under torch.compile" not in record.getMessage()


logging.getLogger("torch._higher_order_ops.wrap").addFilter(_NoInPlaceNotice())


BACKEND = "inductor"
"""torch.compile's backend for a program's regions."""
PARTITIONER = "aot_eager_decomp_partition"
"""The backend tests pass where what matters is what the regions keep for backward: AOTAutograd with inductor's
decompositions and its min-cut partitioner, which decides what is saved, without inductor's C++ code generation
(tests/test_memory_compiled.py holds both equal)."""


_TEST_BACKEND = "SCALEC_TEST_COMPILE_BACKEND"  # test-only: another backend for a whole program (the e2e table)


def apply(module: nn.Module, backend: str | None = None) -> nn.Module:
    """Compile `module`'s regions in place, before data parallelism wraps it; parameter names and the module tree
    are unchanged. The recomputation mode of each Repeat (runtime.parallelize.apply_recompute) must be set already.
    `backend`: torch.compile's (BACKEND, unless the test hook SCALEC_TEST_COMPILE_BACKEND names another)."""
    backend = backend or os.environ.get(_TEST_BACKEND) or BACKEND
    context_parallel.mark_compiled_constants()  # before any region is traced
    for m in module.modules():
        if isinstance(m, Repeat):
            m.compiled = True
            # The enclosing forward's trace stops at the repeat: its blocks are regions of their own.
            m.forward = torch._dynamo.disable(m.forward)
            for block in m.values():
                block.forward = functools.partial(recompute.compiled_forward, block, m.recompute, backend=backend)
    module.forward = torch.compile(module.forward, backend=backend)
    return module
