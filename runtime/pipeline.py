"""Pipeline parallelism over `pp` with torch.distributed.pipelining: this rank's stages and their schedule.

Stage s runs on the pp rank the schedule's runtime.schedule.Layout puts it: s % pp (v stages per rank for
interleaved schedules), or folded in a V under dualpipev (rank r runs stages r and 2·pp-1-r). Each stage module is
built on the meta device, sharded or initialised by name like the single-device model, and handed to a
PipelineStage told that mapping; the schedule runs the micro-batches in the order of runtime/schedule.py (the order
the compiler checked) and scales gradients by 1/micro-batches (the loss is a per-micro-batch mean). dualpipev's
overlapped pairs (OVERLAP_F_B) run their forward and backward one after the other (exact; on CPU), or on CUDA side
by side on two streams (`Overlap`).
A tied embedding lives on the first and the last stage; their gradients are summed after each step: over a group of
the two ranks, or on rank 0 itself when the V puts both stages there.
Packed documents (runtime/packed.py): every pp rank reads the batch, so each computes the document ids of the
micro-batches itself (nothing moves between stages for them); each stage's forward, backward (whose recomputation
re-runs the forward) and weight backward of micro-batch k runs inside `packed.batch` of micro-batch k's ids
(`Documents`), as does the stages' shape inference on micro-batch 0.
"""
from __future__ import annotations

import contextlib
import functools

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, schedules
from torch.distributed.pipelining._utils import _make_tensor_from_meta
from torch.distributed.pipelining.schedules import OVERLAP_F_B, _Action, _PipelineScheduleRuntime

from runtime import collectives, mesh, moe, offload, packed, schedule, sections
from runtime.overlap import Overlap

TIED = "embed.weight"


def torch_order(name: str, pp: int, micro_batches: int, virtual: int) -> dict:
    """Our compute order for every rank (runtime/schedule.py, the lists the compiler checked) in torch's action
    type; torch's runtime adds the sends and receives by the same rule the check assumes."""
    lay = schedule.Layout.of(name, pp, virtual, micro_batches)
    return {r: [_Action.from_str(str(a)) for a in acts]
            for r, acts in schedule.compute_order(name, lay).items()}


def _quietly(fn):
    def run(*args, **kwargs):
        with moe.not_recording(), offload.paused():
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


class _Sends(list):
    """A stage's send ops with what they carry: ("F" or "B", stage index, micro-batch), read by InFlight's
    _batch_p2p to keep the sends' works itself."""

    def __init__(self, ops, key):
        super().__init__(ops)
        self.key = key


def _receiving(info) -> bool:
    """A receive info whose buffer a recv op fills (not a root argument, not a None gradient)."""
    return not info.is_root_arg and info.tensor_meta is not None


FREEABLE = ("AddBackward0",)
"""The grad_fn types of a stage output whose data its backward never reads: the residual add that ends our blocks
(it saves no tensor). Any other eager node (ReLU's saves its result, a cast, a custom Function, a checkpoint's)
keeps it."""

COMPILED = "CompiledFunctionBackward"
"""torch.compile's backward node (AOTAutograd's autograd Function): what its backward reads is exactly what its
forward stashed, `saved_tensors` and `_tensors_no_vc_check` (torch/_functorch/_aot_autograd/runtime_wrappers.py),
besides symbolic sizes and opaque objects, which are no tensor data."""


def _saves_tensor(value) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    return isinstance(value, (tuple, list)) and any(_saves_tensor(v) for v in value)


def _compiled_saves(fn, out) -> bool:
    """Whether a compiled region's backward node stashed a tensor on `out`'s storage (the output itself, or a
    detached alias of it, which AOTAutograd saves in place of a view). A node whose stash cannot be read counts as
    saving it."""
    try:
        saved = tuple(fn.saved_tensors) + tuple(getattr(fn, "_tensors_no_vc_check", ()))
    except RuntimeError:  # already freed or otherwise unreadable: assume the worst
        return True
    ptr = out.untyped_storage().data_ptr()
    return any(isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == ptr for t in saved)


def _freeable(out) -> bool:
    """Whether the data of a stage's (single) output may be dropped before its backward: a plain tensor (not a
    DTensor nor a subclass), not a view (its storage would be its base's), made by an op in FREEABLE whose node
    saved no tensor, or by a compiled region (COMPILED) that stashed nothing on the output's storage. Its backward
    runs from that node and then only from nodes made before it (the output's ancestors), and no ancestor can have
    saved the output itself: an in-place op that made it would have bumped the version such a saved tensor checks,
    so such a backward would already fail. Not yet freed (> 1 element)."""
    fn = out.grad_fn
    if type(out) is not torch.Tensor or out._is_view() or fn is None:
        return False
    kind = type(fn).__name__
    if kind == COMPILED:
        if _compiled_saves(fn, out):
            return False
    elif kind not in FREEABLE or any(_saves_tensor(getattr(fn, a)) for a in dir(fn) if a.startswith("_saved_")):
        return False
    return out.untyped_storage().nbytes() > out.element_size()


class InFlight:
    """Keeps only what the micro-batches in flight need, as Megatron does, where torch.distributed.pipelining
    (2.13) keeps a buffer per micro-batch for the whole step:
    - receive buffers: torch's stage allocates one per micro-batch and direction once (`args_recv_info`,
      `grad_recv_info`) and keeps them; here each is allocated when its recv op is made and the stage's reference
      dropped (a 0-element placeholder) after that micro-batch's backward (zero-bubble's input half: what the weight
      half still needs its backward_state keeps, until the weight half);
    - sends: torch's runtime keeps every send's Work, and the Work its tensor (NCCL stashes it, gloo's work holds
      it), until the end of the step. Here the works of a stage's sends are kept by this object instead
      (schedules._batch_p2p replaced during the step): a forward send of micro-batch k is waited on as soon as it
      reports completion (is_completed does not block; polled at each send and at each forward and backward), else
      at that stage's backward of k, after its gradient was received (the peer received k's activation before it
      could send it), a gradient send as soon as it reports completion, any left at the step's end;
    - sent outputs (Megatron's deallocate_output_tensor): a stage before the last keeps each micro-batch's output
      in fwd_cache for `autograd.backward(outputs, grads)` until its backward, though the backward needs only the
      output's grad_fn, not its data. Once its send has completed, an output that `_freeable` accepts gets a
      1-element storage, expanded to its shape (so torch's backward, which checks the gradient's shape against the
      output's, runs unchanged).
    """

    def __init__(self, stages):
        self.fwd_sends: dict = {}  # (stage index, micro-batch) -> the works of that forward send
        self.bwd_sends: list = []  # the works of gradient sends not yet completed
        self.stages = {stage.stage_index: stage for stage in stages}
        for stage in stages:
            self._wrap(stage)

    def _wrap(self, stage) -> None:
        device = stage.device

        def allocate(infos):
            for info in infos:
                if _receiving(info):
                    info.buffer = _make_tensor_from_meta(info.tensor_meta, device)

        def release(infos):
            for info in infos:
                if _receiving(info) and info.buffer is not None:
                    info.buffer = torch.empty(0, dtype=info.tensor_meta.dtype, device=device)

        def released(prepare, table):
            """_prepare_{forward,backward}_infra, then the m buffers it allocated dropped."""
            @functools.wraps(prepare)
            def run(*args, **kwargs):
                out = prepare(*args, **kwargs)
                for infos in getattr(stage, table).values():
                    release(infos)
                return out
            return run

        def allocating(get_ops, table):
            @functools.wraps(get_ops)
            def run(mb, *args, **kwargs):
                if mb in getattr(stage, table):
                    allocate(getattr(stage, table)[mb])
                return get_ops(mb, *args, **kwargs)
            return run

        def tagged(get_ops, kind):
            @functools.wraps(get_ops)
            def run(mb, *args, **kwargs):
                return _Sends(get_ops(mb, *args, **kwargs), (kind, stage.stage_index, mb))
            return run

        backward = stage.backward_one_chunk
        forward = stage.forward_one_chunk
        weight = stage.backward_weight_one_chunk
        local_bwd = stage.set_local_bwd_input

        # each computation timed as the stage's forward or backward (runtime.sections); the schedule's rest is pp_p2p
        @functools.wraps(forward)
        def forward_one_chunk(*args, **kwargs):
            self._reap()
            with sections.section("forward"):
                sections.slow_work("forward")  # the straggler drill's extra work (SCALEC_TEST_SLOW), if any
                return forward(*args, **kwargs)

        @functools.wraps(backward)
        def backward_one_chunk(mb, *args, **kwargs):
            key = (stage.stage_index, mb)
            if key in self.fwd_sends:  # complete: this stage has received the gradient of micro-batch k (the class)
                self._sent(key)
            with sections.section("backward"):
                sections.slow_work("backward")
                backward(mb, *args, **kwargs)
            release(stage.args_recv_info.get(mb, ()))
            release(stage.grad_recv_info.get(mb, ()))
            self._reap()

        @functools.wraps(weight)
        def backward_weight_one_chunk(*args, **kwargs):
            with sections.section("backward"):
                sections.slow_work("backward")
                return weight(*args, **kwargs)

        @functools.wraps(local_bwd)
        def set_local_bwd_input(grads, mb):  # a None gradient zeroes the buffer in place: give it one first
            allocate(stage.grad_recv_info.get(mb, ()))
            return local_bwd(grads, mb)

        stage._prepare_forward_infra = released(stage._prepare_forward_infra, "args_recv_info")
        stage._prepare_backward_infra = released(stage._prepare_backward_infra, "grad_recv_info")
        stage.get_fwd_recv_ops = allocating(stage.get_fwd_recv_ops, "args_recv_info")
        stage.get_bwd_recv_ops = allocating(stage.get_bwd_recv_ops, "grad_recv_info")
        stage.get_fwd_send_ops = tagged(stage.get_fwd_send_ops, "F")
        stage.get_bwd_send_ops = tagged(stage.get_bwd_send_ops, "B")
        stage.forward_one_chunk = forward_one_chunk
        stage.backward_one_chunk = backward_one_chunk
        stage.backward_weight_one_chunk = backward_weight_one_chunk
        stage.set_local_bwd_input = set_local_bwd_input

    def _sent(self, key) -> None:
        """Wait on the forward send `key` and drop its works (a work holds the sent tensor, which shares the output's
        storage), then free that output if it may be."""
        works = self.fwd_sends.pop(key)
        while works:
            works.pop().wait()
        self._free_output(key)

    def _free_output(self, key) -> None:
        """Give the output of a stage's micro-batch, sent (its send waited on and dropped), a 1-element storage
        when `_freeable` proves nothing will read its data."""
        stage = self.stages[key[0]]
        cached = stage.fwd_cache.get(key[1])
        if stage.is_last or cached is None:
            return
        outputs = cached[0]
        if len(outputs) == 1 and _freeable(outputs[0]):
            out = outputs[0]
            out.data = torch.empty((1,), dtype=out.dtype, device=out.device).expand(out.shape)

    def _reap(self) -> None:
        """Wait on (and drop) the sends that have completed; free the sent outputs whose sends completed."""
        for key in [k for k, works in self.fwd_sends.items() if all(w.is_completed() for w in works)]:
            self._sent(key)
        left = []
        for works in self.bwd_sends:
            if all(w.is_completed() for w in works):
                for w in works:
                    w.wait()
            else:
                left.append(works)
        self.bwd_sends = left

    @contextlib.contextmanager
    def sending(self):
        """During one schedule step: this object keeps the works of the stages' sends (the runtime gets none to
        keep); at its end every send left is waited on, as the runtime would."""
        original = schedules._batch_p2p

        def batch_p2p(p2p_ops, *args, **kwargs):
            works = original(p2p_ops, *args, **kwargs)
            key = getattr(p2p_ops, "key", None)
            if key is None or not works:
                self._reap()
                return works
            if key[0] == "F":
                self.fwd_sends.setdefault(key[1:], []).extend(works)
            else:
                self.bwd_sends.append(works)
            self._reap()
            return []

        schedules._batch_p2p = batch_p2p
        try:
            yield
        finally:
            schedules._batch_p2p = original
        for works in list(self.fwd_sends.values()) + self.bwd_sends:
            for w in works:
                w.wait()
        self.fwd_sends, self.bwd_sends = {}, []


class Documents:
    """The document ids of this step's micro-batches (packed documents), entered around each stage's work on
    micro-batch k: torch's schedule calls the stages' forward_one_chunk(k, ...), backward_one_chunk(k, ...) and
    backward_weight_one_chunk(k, ...), and infers their shapes (`_prepare_{forward,backward}_infra`) on micro-batch
    0. Without packed documents (`docs` None) nothing is entered."""

    def __init__(self, stages):
        self.docs: list | None = None
        for stage in stages:
            for name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
                setattr(stage, name, self._at(getattr(stage, name)))
            for name in ("_prepare_forward_infra", "_prepare_backward_infra"):
                setattr(stage, name, self._first(getattr(stage, name)))

    def _enter(self, mb: int):
        return packed.batch(self.docs[mb]) if self.docs is not None else contextlib.nullcontext()

    def _at(self, fn):
        @functools.wraps(fn)
        def run(mb, *args, **kwargs):
            with self._enter(mb):
                return fn(mb, *args, **kwargs)
        return run

    def _first(self, fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            with self._enter(0):
                return fn(*args, **kwargs)
        return run

    @contextlib.contextmanager
    def step(self, docs: torch.Tensor | None, micro_batches: int):
        """During one schedule step: micro-batch k's ids are `docs`' k-th split along the batch, as the schedule
        splits the tokens (torch.tensor_split)."""
        self.docs = None if docs is None else list(docs.tensor_split(micro_batches))
        try:
            yield
        finally:
            self.docs = None


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
        self.ctx, self.cfg, self.loss_fn = ctx, cfg, loss_fn
        pp, r = ctx.axis_size("pp"), ctx.coords["pp"]
        par = cfg.parallel
        self.layout = schedule.Layout.of(par.schedule, pp, par.virtual_stages, par.micro_batches)
        n_stages = self.layout.stages
        self.ids = self.layout.stages_of(r)
        self.modules = []
        for s in self.ids:
            with torch.device("meta"):
                module = stage_cls(s)
            # Sends carry what the stage returns: the residual stream, bf16 under bf16 (fp32 with fp32_residual).
            self.modules.append(prepare(module))
        group = ctx.mesh["pp"].get_group()
        self.stages = [PipelineStage(m, s, n_stages, ctx.device, group=group) for m, s in zip(self.modules, self.ids)]
        # each stage's peers by the layout (torch's stages assume s % pp; its V schedules set this mapping too)
        placed = {s: self.layout.rank_of(s) for s in range(n_stages)}
        for stage in self.stages:
            stage.stage_index_to_group_rank = placed
        for stage in self.stages:  # its first forward infers shapes on uninitialised tensors: not a training step
            infer = getattr(stage, "_forward_metadata_inference", None)
            if infer is not None:
                stage._forward_metadata_inference = _quietly(infer)
            for name in ("get_fwd_send_ops", "get_fwd_recv_ops", "get_bwd_send_ops", "get_bwd_recv_ops"):
                setattr(stage, name, _counted(getattr(stage, name)))
        self.in_flight = InFlight(self.stages)  # receive buffers and sends only for the micro-batches in flight
        self.documents = Documents(self.stages)  # packed documents: each micro-batch's ids around its stage work
        # Run exactly the action lists the compiler printed and proved (not a schedule class's own order).
        self.schedule = _PipelineScheduleRuntime(self.stages, n_microbatches=par.micro_batches,
                                                 loss_fn=loss_fn, scale_grads=not main_grads)
        self.schedule._prepare_schedule_with_comms(torch_order(par.schedule, pp, par.micro_batches,
                                                               par.virtual_stages))
        self.overlap = None
        if ctx.device.type == "cuda" and par.schedule in schedule.V_SHAPED:  # CPU: torch runs the pair in order
            self.overlap = Overlap(torch.cuda.Stream(ctx.device))
            self.schedule.register_custom_function(OVERLAP_F_B, self.overlap)
        self.holds_last = (n_stages - 1) in self.ids
        self.holds_first = 0 in self.ids
        tied = par.tied_embedding and pp > 1
        # The two copies of a tied embedding on one rank (the V's rank 0: its gradients summed here), or on two
        # ranks (summed over the group of the two, which every rank makes).
        self.tied_here = tied and self.layout.rank_of(0) == self.layout.rank_of(n_stages - 1)
        self.tie = tie_group(ctx) if tied and not self.tied_here else None
        # The last stage's copy of a tied embedding when the first stage is elsewhere: the same parameter, counted
        # (norm, parameter count) and saved once, by the rank holding the first stage. Two copies on one rank are
        # counted once by name (runtime.model_parts).
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

    def step(self, tokens: torch.Tensor, targets: torch.Tensor, docs: torch.Tensor | None = None) -> torch.Tensor:
        """Forward and backward of all micro-batches; returns the mean loss, on every pp rank. `docs`: the batch's
        document ids (packed documents), split into micro-batches as the tokens are."""
        losses: list = []
        # return_outputs=False: the last stage computes each micro-batch's loss as the forward ends and keeps its
        # logits only until that micro-batch's backward (torch's fwd_cache; with 1F1B-style schedules the next
        # action), as Megatron's last stage does. The default would also collect every micro-batch's logits in
        # output_chunks for the whole step and concatenate them at its end: m × the logits, that nothing reads.
        if self.overlap is not None:
            self.overlap.stream_of.clear()  # this step's forwards' streams only
        with self.in_flight.sending(), self.documents.step(docs, self.cfg.parallel.micro_batches):
            self.schedule.step(tokens, target=targets, losses=losses, return_outputs=False)
        if self.mains is not None:  # the mean over micro-batches, as the schedule's scale_grads would
            self.mains.finish(1.0 / self.cfg.parallel.micro_batches)
        if self.tie is not None or self.tied_here:
            copies = []
            for module in self.modules:
                for name, p in module.named_parameters():
                    grad = p.main_grad if self.mains is not None else p.grad
                    if name.removeprefix("module.") == TIED and grad is not None:
                        copies.append(grad.to_local() if hasattr(grad, "to_local") else grad)
            if self.tie is not None:
                for g in copies:
                    dist.all_reduce(g, group=self.tie)
            elif len(copies) == 2:  # both copies here (the V): each gets their sum, as the group's all-reduce gives
                copies[0].add_(copies[1])
                copies[1].copy_(copies[0])
        total = (torch.stack([l.detach().float() for l in losses]).mean() if self.holds_last and losses
                 else torch.zeros((), device=self.ctx.device))
        dist.all_reduce(total, group=self.ctx.mesh["pp"].get_group())
        return total

    def evaluate(self, tokens: torch.Tensor, targets: torch.Tensor, docs: torch.Tensor | None = None) -> torch.Tensor:
        """The forward alone of this rank's batch, in the schedule's micro-batches, filled and drained through the
        stages (GPipe's forward half); returns the sum of the cross entropy over its tokens (float64), on every pp
        rank. The schedule's runtime is not used: its action lists hold the backward (torch's `eval` would switch
        the stages' mode and infer their shapes again); each output goes to the next stage's rank with an
        asynchronous send, preceded by its shape and dtype (the receiver cannot know a stage's output shape under
        sequence parallelism and mixed precision without them), and every rank visits (micro-batch, stage) in the
        same order, so the blocking receives meet their sends."""
        ctx = self.ctx
        m = self.cfg.parallel.micro_batches
        n_stages = self.layout.stages
        group = ctx.mesh["pp"].get_group()
        local = dict(zip(self.ids, self.modules))
        total = torch.zeros((), dtype=torch.float64, device=ctx.device)
        sends = []
        docs_mbs = docs.tensor_split(m) if docs is not None else (None,) * m
        for tokens_mb, targets_mb, docs_mb in zip(tokens.tensor_split(m), targets.tensor_split(m), docs_mbs):
            x = None
            for s in range(n_stages):
                if s not in local:
                    continue
                if s > 0 and s - 1 not in local:
                    x = _receive(dist.get_global_rank(group, self.layout.rank_of(s - 1)), group, ctx.device)
                with packed.batch(docs_mb) if docs_mb is not None else contextlib.nullcontext():
                    x = local[s](tokens_mb if s == 0 else x)
                if s == n_stages - 1:
                    total += self.loss_fn(x, targets_mb).double() * targets_mb.numel()
                elif s + 1 not in local:
                    sends += _send(x, dist.get_global_rank(group, self.layout.rank_of(s + 1)), group)
        for work, _ in sends:
            work.wait()
        dist.all_reduce(total, group=group)  # the last stage's sum to every pp rank
        return total


# The dtypes a stage's output may have (the residual stream: fp32, bf16), by code in the header of a send.
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_HEADER = 8  # int64s: ndim, the sizes (at most 6), the dtype's code


def _send(x: torch.Tensor, dst: int, group) -> list:
    """Asynchronous sends of `x`'s header (shape, dtype) and data to global rank `dst`: (work, tensor) pairs, the
    tensor kept alive until its work is waited for."""
    header = torch.zeros(_HEADER, dtype=torch.int64, device=x.device)
    header[0] = x.dim()
    header[1:1 + x.dim()] = torch.tensor(x.shape, dtype=torch.int64)
    header[-1] = _DTYPES.index(x.dtype)
    x = x.contiguous()
    return [(dist.isend(header, dst, group=group), header), (dist.isend(x, dst, group=group), x)]


def _receive(src: int, group, device) -> torch.Tensor:
    """The tensor `_send` sent from global rank `src`."""
    header = torch.empty(_HEADER, dtype=torch.int64, device=device)
    dist.recv(header, src, group=group)
    ndim, *rest = header.tolist()
    x = torch.empty(rest[:ndim], dtype=_DTYPES[rest[-1]], device=device)
    dist.recv(x, src, group=group)
    return x
