"""dualpipev's overlapped pairs on CUDA: the forward of one micro-batch on one stream beside the backward of another
(runtime/schedule.py makes the pairs, `OVERLAP_F_B`; runtime/pipeline.py registers `Overlap` with torch's schedule
runtime on CUDA devices only).

DeepSeek-V3 (§3.2.1) overlaps a forward chunk with a backward chunk so that one's all-to-alls and pipeline sends
run while the other computes; DeepSeek's DualPipe repository does it inside the model
(`overlapped_forward_backward`). Here the pair is overlapped at the stage's granularity by two CUDA streams: what
overlaps is whatever the two micro-batches' kernels and collectives leave of each other's idle time. Untested
here (no GPU on the project's machines): the CPU runs take torch's own in-order path, and the tests run this
function with `side=None` (no streams) to hold its bookkeeping to torch's.
"""
from __future__ import annotations

import contextlib

import torch
from torch.distributed.pipelining import schedules


class Overlap:
    """dualpipev's overlapped pair `(aFi;bBj)OVERLAP_F_B` run as the schedule's custom function for that action
    (`register_custom_function`): the forward of one micro-batch on one stream beside the backward of another, so
    that the communication of one (the experts' all-to-alls) hides behind the other's compute. Registered on CUDA
    only; on a CPU torch's runtime runs the two sub-actions one after the other (the same results, nothing to
    overlap). `side` None runs them here one after the other on the current stream (how the tests check this
    function's bookkeeping on CPU, against torch's own sequence).

    Streams. Autograd runs each op's backward on the stream its forward ran on, so the backward of micro-batch j on
    stage b runs where that forward ran (recorded in `stream_of` when an overlap ran it; otherwise the current
    stream). The forward takes the other of the two streams, the current one or `side`. Around the pair:
    - the receives of both sub-actions are waited on first, on the current stream (as torch's runtime does);
    - `side` waits for the current stream before the pair: the received and locally handed tensors, the weights'
      last update, and whatever the current stream freed that `side` may now reuse;
    - tensors made on the current stream and read on `side` (the forward's inputs) are `record_stream`-ed on it,
      and the forward's outputs, made on `side` and read later on the current stream (sends, the next stage's
      input, the loss), on the current stream, so the caching allocator does not hand their memory out while the
      other stream may still read it;
    - the current stream waits for `side` after the pair: what follows (sends, the next action) sees both done.
    The backward call itself is ordered with the current stream by autograd (its engine syncs the calling stream
    with the streams it ran on), so the gradients it hands to the previous stage are ready there."""

    def __init__(self, side=None, save_outputs: bool = False):
        self.side = side
        self.save_outputs = save_outputs  # Pipeline.step's return_outputs: no output chunks kept
        self.stream_of: dict = {}  # (stage, micro-batch) -> the stream an overlapped forward ran on

    def __call__(self, action, ctx) -> None:
        sched = ctx.schedule_ref
        f, b = action.sub_actions
        stages = {stage.stage_index: stage for stage in sched._stages}
        fs, bs = stages[f.stage_index], stages[b.stage_index]
        fk, bk = f.microbatch_index, b.microbatch_index
        # the receives, as torch's runtime waits for them (none from a stage on this rank: the V's bottom)
        if not fs.is_first and f.stage_index - 1 not in stages:
            schedules._wait_batch_p2p(sched.fwd_recv_ops.pop((f.stage_index, fk)))
        if not bs.is_last and b.stage_index + 1 not in stages:
            schedules._wait_batch_p2p(sched.bwd_recv_ops.pop((b.stage_index, bk)))
        here = torch.cuda.current_stream(fs.device) if self.side is not None else None
        stream = None
        if here is not None:
            ran = self.stream_of.pop((b.stage_index, bk), here)
            stream = self.side if ran == here else here
            self.side.wait_stream(here)
            if stream is self.side:
                for t in self._inputs(fs, fk, ctx):
                    t.record_stream(self.side)
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            sched._assert_unsharded(fs)
            out = fs.forward_one_chunk(fk, ctx.arg_mbs[fk], ctx.kwarg_mbs[fk], save_forward_output=self.save_outputs)
            sched._maybe_compute_loss(fs, out, ctx.target_mbs, fk)
            if f.stage_index + 1 in stages:
                stages[f.stage_index + 1].set_local_fwd_input(out, fk)
        if stream is not None:
            self.stream_of[(f.stage_index, fk)] = stream
        sched._assert_unsharded(bs)
        sched.backward_counter[b.stage_index] += 1
        bs.backward_one_chunk(bk, loss=sched._maybe_get_loss(bs, bk), full_backward=True,
                              last_backward=sched.backward_counter[b.stage_index] == sched._n_microbatches)
        if b.stage_index - 1 in stages:
            stages[b.stage_index - 1].set_local_bwd_input(bs.get_local_bwd_output(bk), bk)
        if here is not None:
            if stream is self.side:
                for t in _tensors(out):
                    t.record_stream(here)
            here.wait_stream(self.side)

    @staticmethod
    def _inputs(stage, mb: int, ctx) -> list:
        """The tensors a stage's forward of micro-batch `mb` reads besides its weights: the batch's on the first
        stage, else the receive buffers of that micro-batch."""
        if stage.is_first:
            return _tensors((ctx.arg_mbs[mb], ctx.kwarg_mbs[mb]))
        return [info.buffer for info in stage.args_recv_info.get(mb, ()) if isinstance(info.buffer, torch.Tensor)]


def _tensors(value) -> list:
    """The tensors in a (nested) tuple, list or dict."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []
