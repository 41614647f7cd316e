"""`plan { compile = true }`: torch.compile over the regions of a generated program, as torchtitan compiles a model.

Each block of a `repeat` is one compiled region (its recomputation inside it: torch.utils.checkpoint and the
selective policy trace into the region, and inductor's partitioner honours them). The code around the repeats
(embedding and positions before, final norm, LM head and loss after; under pp a stage's prologue and epilogue) is
compiled too: the repeat itself is left out of that trace (`torch._dynamo.disable`), so the module's forward becomes
two regions around the eager loop over the compiled blocks. Blocks of one repeat share their code, so one
compilation serves them all (parameters are the region's inputs, not constants).

The collectives of runtime.collectives and runtime.moe are torch's functional collectives inside autograd
Functions: dynamo traces them into the region's graph, forward and backward, so tp, sp, ep and pp plans compile
as dp ones do. What only an eager step can do is done eagerly: `--count-bytes` runs the program uncompiled (a
compiled region counts nothing per call), and the watchdog names the step's phase instead of the collective.
"""
from __future__ import annotations

import torch
from torch import nn

from runtime.layers import Repeat


def apply(module: nn.Module) -> nn.Module:
    """Compile `module`'s regions in place (parameter names and the module tree are unchanged): every block of
    every Repeat, and the module's own forward around them (`prologue`/`epilogue` under pp, see module docstring)."""
    for m in module.modules():
        if isinstance(m, Repeat):
            m.compiled = True
            # The enclosing forward's trace stops here: the blocks are regions of their own.
            m.forward = torch._dynamo.disable(m.forward)
    module.compile()
    return module


def compile_function(fn):
    """A free function of the program (the last pipeline stage's loss) as one compiled region."""
    return torch.compile(fn)
