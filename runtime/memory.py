"""What a rank allocates during one training step: its peak, the activations it keeps for backward, its model state.

Two ways of measuring, one record (`--memory-report FILE`, and the peak in the log on CUDA):
- CUDA: `torch.cuda.reset_peak_memory_stats` at the start of a step and `torch.cuda.max_memory_allocated` after it:
  every byte the caching allocator handed out, kernels' workspaces included.
- Anywhere (CPU included, and for the activations on CUDA too): `Tracker`, a TorchDispatchMode that sees every
  operator's inputs and outputs and so every tensor storage created while it is active (deduplicated by storage
  with StorageWeakRef; a weak reference to the storage's Python object tells when it is freed). It keeps the live
  bytes at every operator boundary and their peak. Storages that existed before it started count from the start,
  as they do for `max_memory_allocated`: the model state given to `start`, and any buffer first seen as an
  operator's input that is still alive at the end (DDP's buckets; Tracker.peak).
  What it cannot see: the temporaries inside one kernel (CPU attention's own buffers) and memory allocated outside
  the dispatcher. FSDP2 frees and reallocates its gathered parameters by resizing their storage (no operator):
  under FSDP the tracker re-reads every storage's size at each operator (`reread`). Over a training step its peak
  equals torch's own MemTracker's (the tiny GPT) and FSDPMemTracker's (FSDP2 over 2 ranks), byte for byte
  (tests/test_memory_measure.py).
  A functional collective's work object (gloo's) holds the tensors it was given and made for a moment after it
  wakes the waiter: the process group's worker thread lets go of them after the program has moved on. When the
  program dropped them first, they are freed on that thread whenever it next gets the GIL, so a region read in
  between counted them as kept (cp2_recompute_full: the last all-gather's local and gathered values, 98,304 bytes,
  in 1 run of 2 under load). A region is therefore read once the collectives have let go (`Tracker.settle`): the
  bytes it reports are what the program holds, not what a worker thread had not yet released.

"Activations" are the bytes created inside a forward and still alive after it: what autograd saves for backward
(and what checkpointing keeps). `Region` collects the storages created while it is open and counts those still
alive: for a whole model one region per micro-batch, read after its forward; for pipeline stages one region opened
and closed around every stage forward (and the loss) by module hooks, read after each, whose largest value is the
schedule's in-flight peak.

Under `plan { compile = true }` a dispatch mode makes compiled regions run eagerly: the step the tracker measures
is the eager program's (the CUDA allocator's counters of the other steps are the compiled program's).

Nothing here is active unless asked for: a run without `--memory-report` only reads the CUDA allocator's counters.
"""
from __future__ import annotations

import functools
import time
import weakref

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves


def storages(t) -> list:
    """The untyped storages under a tensor: its own, or its inner tensors' for a wrapper subclass (DTensor, FSDP's
    sharded parameters); nothing for a non-tensor."""
    if not isinstance(t, torch.Tensor):
        return []
    out, todo = [], [t]
    while todo:
        x = todo.pop()
        if is_traceable_wrapper_subclass(x):
            attrs, _ = x.__tensor_flatten__()
            todo += [v for v in (getattr(x, a) for a in attrs) if isinstance(v, torch.Tensor)]
        elif x.device.type != "meta":
            try:
                out.append(x.untyped_storage())
            except (RuntimeError, NotImplementedError):  # a tensor without a storage (sparse, opaque subclasses)
                pass
    return out


def distinct_bytes(tensors) -> int:
    """Bytes of the distinct storages under `tensors` (views of one storage counted once)."""
    seen = {}
    for t in tensors:
        for st in storages(t):
            seen[StorageWeakRef(st)] = st.nbytes()
    return sum(seen.values())


def optimizer_tensors(opt: torch.optim.Optimizer) -> list:
    """The optimizer's state on its parameters' device: not what `offload = optimizer` keeps on the host (a CPU run's
    host is its device: counted there), nor a master that is the parameter's own storage (runtime.offload)."""
    return [v for p, state in opt.state.items() for k, v in state.items() if isinstance(v, torch.Tensor)
            and not (k == "master" and v.data_ptr() == p.data_ptr())
            and (v.device.type == p.device.type or v.ndim == 0)]


class Region:
    """The storages created while this region is open (it may be opened and closed many times) and the bytes of
    those still alive; `peak` is the largest `live` read by `sample`."""

    def __init__(self):
        self.members: dict = {}
        self.live = 0
        self.peak = 0
        self.open = False

    def sample(self) -> int:
        self.peak = max(self.peak, self.live)
        return self.live


_WAIT = torch.ops._c10d_functional.wait_tensor.default


class Tracker(TorchDispatchMode):
    """Live bytes of every tensor storage, updated at each operator while active; `peak` the largest (see the
    module's docstring). `start(state)` counts the storages that exist already. `reread` (FSDP2): re-read every
    storage's size at each operator, since FSDP2 frees and regathers a unit's parameters by resizing their storages
    (no operator)."""

    def __init__(self, reread: bool = False):
        super().__init__()
        self.sizes: dict = {}      # StorageWeakRef -> bytes counted for it
        self._refs: dict = {}      # StorageWeakRef -> weakref to its Python storage (the callback frees it)
        self.live = 0
        self.found = 0            # bytes of storages that existed before but were not given to `start`
        self._starting = False
        self.regions: list = []
        self._resizable = reread  # re-read every size at each operator (also once a storage was seen resized)
        self._sighted: list = []  # (key, bytes) of each storage first seen as an input, not given to `start`
        self._seg = [0]           # the largest live bytes between two such sightings (before, between, after)
        self._lent: list = []     # (weakref to a tensor, references a functional collective's work took on it)

    def start(self, tensors=()) -> int:
        """Count `tensors`' storages (the model state) as existing; returns their bytes."""
        before = self.live
        self._starting = True
        for t in tensors:
            for st in storages(t):
                self._add(st, created=False)
        self._starting = False
        self._seg[-1] = max(self._seg[-1], self.live)
        return self.live - before

    @property
    def outliving(self) -> int:
        """Bytes of the storages first seen as inputs that are still alive (buffers that outlive steps)."""
        return sum(min(n, self.sizes.get(key, 0)) for key, n in self._sighted)

    @property
    def peak(self) -> int:
        """The largest live bytes so far. A storage first seen as an operator's input existed before: if it is still
        alive (a buffer that outlives steps: DDP's buckets), it is counted at every earlier moment too, with the
        smaller of its sizes then and now (FSDP's gathered buffers are empty between uses); one that is gone (a
        collective's temporary made on its own thread) only from when it was seen."""
        best, later = 0, 0
        for j in range(len(self._seg) - 1, -1, -1):
            best = max(best, self._seg[j] + later)
            if j:
                key, n = self._sighted[j - 1]
                later += min(n, self.sizes.get(key, 0))
        return best

    def region(self) -> Region:
        r = Region()
        self.regions.append(r)
        return r

    def _add(self, st, created: bool) -> None:
        key = StorageWeakRef(st)
        n = st.nbytes()
        old = self.sizes.get(key)
        if old is not None:
            if old != n:
                self._resized(key, old, n)
            return
        self.sizes[key] = n
        self._refs[key] = weakref.ref(st, functools.partial(self._freed, key))
        self.live += n
        if created:
            for r in self.regions:
                if r.open:
                    r.members[key] = n
                    r.live += n
        elif not self._starting:  # existed before we saw it (see `peak`)
            self.found += n
            self._sighted.append((key, n))
            self._seg.append(self.live)

    def _resized(self, key, old: int, n: int) -> None:
        self._resizable = True
        self.sizes[key] = n
        self.live += n - old
        for r in self.regions:
            if key in r.members:
                r.live += n - r.members[key]
                r.members[key] = n

    def _freed(self, key, _ref) -> None:
        n = self.sizes.pop(key, None)
        self._refs.pop(key, None)
        if n is None:
            return
        self.live -= n
        for r in self.regions:
            m = r.members.pop(key, None)
            if m is not None:
                r.live -= m

    def _reread(self) -> None:
        for key, ref in list(self._refs.items()):
            st = ref()
            if st is not None and st.nbytes() != self.sizes[key]:
                self._resized(key, self.sizes[key], st.nbytes())

    def settle(self, limit: float = 5.0) -> None:
        """Returns once every functional collective's work has let go of the tensors it took (see the module's
        docstring), so that those the program has dropped are freed (the GIL released meanwhile: the worker thread
        needs it to free them). A tensor still referenced `k` more times than its own object does while its
        collective took `k` is held by the work; `limit` seconds bound the wait (a failsafe: a program that keeps
        such a tensor elsewhere in C++ would be counted as before)."""
        deadline = time.monotonic() + limit
        while True:
            held = []
            for ref, k in self._lent:
                t = ref()
                if t is not None and t._use_count() >= 1 + k:
                    held.append((ref, k))
                del t
            self._lent = held
            if not held or time.monotonic() > deadline:
                return
            time.sleep(1e-4)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = tree_leaves((args, kwargs))
        for t in inputs:  # inputs: seen before (or existing since before the start)
            for st in storages(t):
                self._add(st, created=False)
        collective = func.namespace == "_c10d_functional" and func is not _WAIT
        if collective:  # the references its work takes on its inputs: counted before and after the call
            inputs = [t for t in inputs if isinstance(t, torch.Tensor)]
            before = [t._use_count() for t in inputs]
        out = func(*args, **kwargs)
        if collective:
            self._lent += [(weakref.ref(t), t._use_count() - b) for t, b in zip(inputs, before)
                           if t._use_count() > b]
            # a fresh output: its own object holds it once, the work the rest
            self._lent += [(weakref.ref(t), t._use_count() - 1) for t in tree_leaves(out)
                           if isinstance(t, torch.Tensor) and t._use_count() > 1]
        for t in tree_leaves(out):
            for st in storages(t):
                self._add(st, created=True)
        if self._resizable:
            self._reread()
        self._seg[-1] = max(self._seg[-1], self.live)
        return out


class Measure:
    """One step's measurement on this rank: `begin(state)` before the step, `watch_model` (a whole model) or
    `watch_stages` (pipeline stages) for its activations, `end()` after the optimizer step; `record()` is what
    `--memory-report` writes for this rank."""

    def __init__(self, device: torch.device, track: bool, reread: bool = False):
        """`track`: run the Tracker (activations, and the peak off CUDA); `reread`: its FSDP mode."""
        self.device = device
        self.cuda = device.type == "cuda"
        self.tracker = Tracker(reread) if track else None
        self.state: dict = {}
        self.peak = None
        self.activations = Region() if track else None  # the largest live bytes created in forwards
        self._hooks: list = []

    def begin(self, params, grads, optimizer) -> None:
        """Before the step: the model state is counted (when tracking) and CUDA's peak counter reset (both
        allocator counters are kept on the host: no synchronisation)."""
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        if self.tracker is not None:
            self.state = {"params": distinct_bytes(params), "grads": distinct_bytes(grads),
                          "optimizer": distinct_bytes(optimizer)}
            self.tracker.regions.append(self.activations)
            self.tracker.start([*params, *grads, *optimizer])
            self.tracker.__enter__()

    def end(self) -> None:
        if self.tracker is not None:
            self.tracker.__exit__(None, None, None)
            for h in self._hooks:
                h.remove()
            self._hooks = []
        if self.cuda:
            self.peak = torch.cuda.max_memory_allocated(self.device)
        elif self.tracker is not None:
            self.peak = self.tracker.peak

    # The activations of a whole model: one region per micro-batch, from its forward's start to its end.
    def forward_begin(self) -> None:
        if self.tracker is not None:
            self._mb = self.tracker.region()
            self._mb.open = True

    def forward_end(self) -> None:
        if self.tracker is not None:
            self._mb.open = False
            self.tracker.settle()
            self.activations.peak = max(self.activations.peak, self._mb.sample())
            self.tracker.regions.remove(self._mb)

    def watch_model(self, module) -> None:
        """Hooks on the model inside the data-parallel wrapper (removed at `end`): each forward is one micro-batch.
        Inside the wrapper, so that what the wrapper allocates before the forward (DDP rebuilding its buckets after
        the first step) is not taken for activations."""
        if self.tracker is None:
            return
        self._hooks += [module.register_forward_pre_hook(lambda _m, _a: self.forward_begin()),
                        module.register_forward_hook(lambda _m, _a, _o: self.forward_end())]

    # The activations of pipeline stages: every stage forward (and the loss) records into one region, read after
    # each: its largest value is what the schedule keeps in flight.
    def watch_stages(self, modules, wrap_loss=None) -> None:
        """Module hooks on the stage modules (removed at `end`); `wrap_loss(fn)` installs the recording loss."""
        if self.tracker is None:
            return
        act, tracker = self.activations, self.tracker

        def pre(_module, _args):
            act.open = True

        def post(_module, _args, _out):
            act.open = False
            tracker.settle()
            act.sample()

        for m in modules:
            self._hooks += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
        if wrap_loss is not None:
            def recorded(fn):
                @functools.wraps(fn)
                def loss(*args, **kwargs):
                    act.open = True
                    try:
                        return fn(*args, **kwargs)
                    finally:
                        act.open = False
                        tracker.settle()
                        act.sample()
                return loss
            self._hooks.append(wrap_loss(recorded))

    def record(self, rank: int, coords: dict) -> dict:
        return {
            "rank": rank, "coords": {a: coords.get(a, 0) for a in ("dp", "tp", "pp", "ep")},
            "device": self.device.type,
            "peak_bytes": int(self.peak) if self.peak is not None else None,
            "activation_bytes": int(self.activations.peak) if self.activations is not None else None,
            "state_bytes": dict(self.state),
            "tracked_peak_bytes": int(self.tracker.peak) if self.tracker is not None else None,
            # Buffers that outlive steps besides the model state, first seen as an operator's input: DDP's buckets,
            # cached masks (a pipeline's receive buffers no longer do: runtime.pipeline.InFlight).
            "other_existing_bytes": int(self.tracker.outliving) if self.tracker is not None else None,
            "method": ("torch.cuda.max_memory_allocated over the step; activations by runtime.memory.Tracker"
                       if self.cuda else "runtime.memory.Tracker (TorchDispatchMode over tensor storages)"),
        }


def largest(nbytes: int, ctx) -> tuple[int, int]:
    """(the largest of every rank's `nbytes`, the lowest rank holding it): one all-reduce MAX of an int64 on the
    default group (bytes × world + world − 1 − rank: the rank rides along)."""
    import torch.distributed as dist
    w = ctx.world_size
    v = torch.tensor([int(nbytes) * w + w - 1 - ctx.rank], dtype=torch.int64, device=ctx.device)
    dist.all_reduce(v, op=dist.ReduceOp.MAX)
    both = int(v.item())
    return both // w, w - 1 - both % w


def gb(nbytes: int) -> str:
    return f"{nbytes / 1e9:.3g} GB"


def summary(predicted: int, device_bytes: int, measured: int, rank: int, how: str) -> str:
    """The run's last word on memory: the compiler's prediction against the largest measured peak."""
    text = f"peak memory: predicted {gb(predicted) if predicted else 'nothing'}, measured {gb(measured)} (rank {rank}"
    text += f"; {how})" if how else ")"
    if device_bytes:
        text += f" of the {gb(device_bytes)} of one device"
    return text


def write_report(path: str, record: dict, ctx, step: int, predicted: int, device_bytes: int) -> None:
    """Every rank's record of the measured step gathered on rank 0 (all_gather_object on the default group, which
    works on NCCL too: its objects travel as CUDA tensors on the current device) and written as one JSON."""
    import json

    import torch.distributed as dist
    records = [None] * ctx.world_size
    dist.all_gather_object(records, record)
    if ctx.rank != 0:
        return
    top = max(records, key=lambda r: (r["peak_bytes"], -r["rank"]))
    doc = {"step": step, "predicted_peak_bytes": predicted, "device_bytes": device_bytes,
           "peak_bytes": top["peak_bytes"], "peak_rank": top["rank"],
           "activation_bytes": max(r["activation_bytes"] for r in records), "ranks": records}
    with open(path, "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
