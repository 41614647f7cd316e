"""The records of the losses: torch's cross-entropy, runtime.collectives' vocabulary-parallel one (tp), packed
documents' (runtime/packed.py); each with its working set (`loss`)."""
from __future__ import annotations

import torch.nn.functional as F

from compiler import graph_meta as K
from compiler.graph_meta import INT_BYTES
from compiler.ops.record import Op, ZERO, dtype_fp32
from runtime import collectives as C
from runtime import packed as P


def _loss_shape(node, args, kwargs, gm):
    return (), ZERO


def _cross_entropy_saved(g, node, args):
    logits, targets = args[:2]
    g.new(node, "log_softmax", logits.meta[K.SHAPE], 4)
    g.keep(targets)


def _vocab_cross_entropy_saved(g, node, args):
    logits = args[0]
    n = logits.meta[K.SHAPE][0]
    g.new(node, "softmax", logits.meta[K.SHAPE], 4)
    g.new(node, "mine", (n,), 1)
    g.new(node, "local", (n,), INT_BYTES)


def _loss_moments(kind):
    """The loss's working set: its forward holds the logits, their fp32 copy (bf16 only) and, vocabulary-
    parallel, the shifted logits and their exponentials; its backward the fp32 gradient of the log-softmax and its
    input's gradient (8 bytes per logit). One formula per moment."""
    def moments(n, copy):
        return [(copy + 2 * 4) * n if kind == "vocab" else copy * n, 8 * n]
    return moments

FUNCTIONS = {
    F.cross_entropy: Op("cross_entropy", _loss_shape, dtype_fp32, _cross_entropy_saved, loss=_loss_moments("whole"),
                        defaults=True),
    C.vocab_parallel_cross_entropy: Op("vocab_parallel_cross_entropy", _loss_shape, dtype_fp32,
                                       _vocab_cross_entropy_saved, loss=_loss_moments("vocab")),
    # Packed documents (runtime/packed.py): the loss whose targets after a separator count zero
    P.cross_entropy: Op("packed_cross_entropy", _loss_shape, dtype_fp32, _cross_entropy_saved,
                        loss=_loss_moments("whole"), wrapped=True),
}
