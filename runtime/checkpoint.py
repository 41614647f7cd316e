"""Checkpoints with torch.distributed.checkpoint (DCP): one layout-independent form for every plan.

What a checkpoint `DIR/step_NNNNNNNN/` holds, whatever plan wrote it:
- `model.NAME`: every parameter as the whole logical tensor of the single-device model, under its single-device
  name. A tensor sharded over tp or ep is a DTensor Shard(dim) over that mesh axis (DCP stores the pieces with
  their offsets in the whole tensor); a vocabulary padded to a multiple of tp (`pad_vocab`) is stored unpadded (the
  padding rows are left out: the shards are DTensor's uneven ceil-sized chunks); FSDP's pieces are DTensors over
  dp (with tp as well: the piece is gathered over dp and stored as a tp shard); pipeline stages are merged, each
  pp rank writing its stages' parameters (the tied embedding, on the first and the last stage, is written once, by
  the first). Replicas (dp, and tp for unsharded tensors) hold equal values; DCP writes one of them.
  Under bf16 the parameter stored is the fp32 master the optimizer keeps (runtime.precision), not the bf16 weight:
  a checkpoint is fp32 whatever the precision, and bf16 weights are recast from the masters on load.
- `optim.state.NAME.{exp_avg,exp_avg_sq,step}`: AdamW's state, sharded like its parameter. The learning rates are
  the schedule's (the param groups are the plan's and are not stored). Under zero1 (ZeroRedundancyOptimizer) each
  dp rank holds, writes and reads the state of its partition of the parameters only (`local_state`): together the
  dp ranks write every parameter's state once, in the same form, so such a checkpoint loads into any plan and any
  plan's into zero1 (no consolidate_state_dict: nothing is gathered on one rank).
- `progress`: the step, the scheduler's epoch and the run's length. The data of step k is a function of (seed, k)
  (runtime/data.py), so the step is the data position.
- `scalec.json` (beside DCP's `.metadata`): what model the checkpoint holds (every parameter's single-device name
  and whole shape, sorted, and their sha256: the fingerprint) and every file of the checkpoint with its size and
  CRC32. Each rank checksums its share of the files DCP wrote (re-read from the page cache just after the write),
  rank 0 writes the manifest before the rename.

Guarantee: a checkpoint written under any plan of a model loads into any plan of the same model (same parameter
names and whole shapes; fp32), and training then continues as it would have on the original plan (the e2e tests
compare the losses to 1e-5; a resumed run of the same plan is bitwise the uninterrupted one). The manifest also
records the run (`run`: seed, batch, data, optimizer, schedule; runtime.resume): a resume that would change what
the run computes is refused in one line naming each difference, unless the user allows it (`--resume-changed`);
a longer run is an extension whose schedule the log states (runtime.resume).

Atomicity and failures: a checkpoint is written as `step_N.tmp` and renamed by rank 0 once every rank has finished;
a `.tmp` left by a crash is ignored and removed at the next start. Before loading, rank 0 checks the newest
checkpoints (metadata readable, every file it names present and long enough) and takes the newest intact one,
warning in one line about each one skipped; a load that still fails falls back the same way. All ranks follow rank
0's choice. Then, before any tensor is read, the model this run builds (its parameters' names and whole shapes,
gathered from every rank) must be the one the manifest records: a checkpoint of another model, even one whose names
are a superset of this model's (which DCP, reading only the keys asked for, would load "fine"), stops the run with
the one line `scalec reshard` gives (E0901). Then every file is checked against its CRC32 (each rank its share): a
file changed in place (same size) is named in a one-line warning and the checkpoint before it loads. Checkpoints
written before the manifest load with the older checks (this model's names and shapes present in `.metadata`).
If none is intact, the run stops with a one-line error. These start-up failures are `runtime.errors.FatalError`:
torchrun does not restart the job for them. DIR is checked at start-up (a writable directory), not at the first
save. DIR must be one filesystem every rank sees.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import zlib

import torch
import torch.distributed as dist

from runtime.errors import FatalError

_STEP = re.compile(r"^step_(\d{8})$")
_TMP = re.compile(r"^step_(\d{8})\.tmp$")
_TEST_KILL = "SCALEC_TEST_KILL_IN_SAVE"  # "RANK:STEP": that rank SIGKILLs itself after writing its files (drills)
MANIFEST = "scalec.json"
_CHUNK = 1 << 22  # bytes read at a time for a checksum


def _dcp():
    """torch.distributed.checkpoint, imported at the first save or load: it imports DTensor's ops (0.8 s a rank on
    a CPU), which a run that never checkpoints does not need."""
    import torch.distributed.checkpoint as dcp
    return dcp


def _complete(directory: str) -> list[tuple[int, str]]:
    if not os.path.isdir(directory):
        return []
    found = []
    for entry in os.listdir(directory):
        m = _STEP.match(entry)
        if m and os.path.exists(os.path.join(directory, entry, ".metadata")):
            found.append((int(m.group(1)), os.path.join(directory, entry)))
    return sorted(found)


def _problem(path: str) -> str | None:
    """Why the checkpoint at `path` cannot be loaded (naming the file), or None when it looks intact: its metadata
    reads and every file it names is there and long enough for what is stored in it."""
    meta_file = os.path.join(path, ".metadata")
    try:
        metadata = _dcp().FileSystemReader(path).read_metadata()
    except Exception as exc:  # noqa: BLE001 (any failure to read it makes the checkpoint unusable)
        return f"{meta_file} is unreadable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    need: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        need[info.relative_path] = max(need.get(info.relative_path, 0), info.offset + info.length)
    for rel, size in sorted(need.items()):
        file = os.path.join(path, rel)
        if not os.path.exists(file):
            return f"{file} is missing"
        if os.path.getsize(file) < size:
            return f"{file} is truncated ({os.path.getsize(file):,} of {size:,} bytes)"
    return None


def newest_intact(directory: str) -> tuple[str | None, list[str]]:
    """For reading a checkpoint directory off-line (`scalec export`): its newest `step_N` whose files look intact
    (`_problem`), or None, and why each newer one was passed over."""
    skipped = []
    for _, path in reversed(_complete(directory)):
        problem = _problem(path)
        if problem is None:
            return path, skipped
        skipped.append(problem)
    return None, skipped


def newest_step(directory: str) -> int:
    """The step of the newest `step_N` of `directory` renamed into place, 0 without one."""
    found = _complete(directory)
    return found[-1][0] if found else 0


def newest_complete(directory: str) -> str | None:
    """The newest `step_N` of `directory` that was renamed into place (its files not yet checked), or None."""
    found = _complete(directory)
    return found[-1][1] if found else None


def _broadcast(obj, ctx):
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def check_directory(directory: str, ctx) -> None:
    """At start-up: `directory` must be (or become) a writable directory; stale `step_N.tmp` left by a save that
    was killed are removed. Rank 0 looks; every rank stops with it."""
    error = None
    if ctx.is_logger:
        try:
            os.makedirs(directory, exist_ok=True)
            probe = os.path.join(directory, f".scalec-write-test-{os.getpid()}")
            with open(probe, "w"):
                pass
            os.remove(probe)
            for entry in os.listdir(directory):
                if _TMP.match(entry):
                    print(f"scalec: removing {os.path.join(directory, entry)}, left by a save that did not finish",
                          flush=True)
                    shutil.rmtree(os.path.join(directory, entry), ignore_errors=True)
        except OSError as exc:
            error = (f"scalec: checkpoint directory {directory} is not a writable directory "
                     f"({exc.strerror or type(exc).__name__})")
    error = _broadcast(error, ctx)
    if error:
        raise FatalError(error if ctx.is_logger else None)


def local_state(optimizer) -> dict:
    """parameter -> AdamW state of the parameters this rank updates: all of them, or under zero1 the rank's
    partition (ZeroRedundancyOptimizer keeps it in its local optimizer, `.optim`; its own `.state` stays empty)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    return optimizer.optim.state if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer.state


class _Entries:
    """This rank's parameters by single-device name, and how each is stored (`whole`) and restored."""

    def __init__(self, modules, shards, ctx, skip_on_save=()):
        self.shards, self.ctx, self.skip = shards, ctx, set(skip_on_save)
        self.params: dict[str, list] = {}  # name -> this rank's copies (a tied embedding can have two)
        for module in modules:
            for name, p in module.named_parameters():
                self.params.setdefault(name.removeprefix("module."), []).append(p)
        # Model state that is not a parameter: persistent buffers (DeepSeek-V3's expert biases, runtime.moe), whole
        # and replicated, saved and restored in place with the parameters, never given to the optimizer
        self.buffers: dict = {}
        for module in modules:
            for where, m in module.named_modules():
                for bname, b in m.named_buffers(recurse=False):
                    if bname not in m._non_persistent_buffers_set:
                        self.buffers[f"{where}.{bname}".removeprefix("module.")] = b
        self.after_load: list = []
        self.gathered = 0  # device bytes full_tensor() allocated for this save (FSDP pieces gathered over dp under tp)

    def whole(self, name: str, t: torch.Tensor):
        """`t` (the parameter or a state tensor shaped like it) as the whole logical tensor, or a DTensor of it."""
        if t.ndim == 0:
            return t
        s = self.shards.of(name)
        sharded = s is not None and self.ctx.axis_size(s[2]) > 1
        from torch.distributed.tensor import DTensor, Shard, distribute_tensor
        if isinstance(t, DTensor):  # FSDP's piece over dp
            if not sharded:
                return t
            # With tp as well: gather the tp piece over dp and store that as a tp shard; scattered back after load.
            piece, gathered = t, t.full_tensor()
            self.gathered += gathered.untyped_storage().nbytes()
            self.after_load.append(lambda: piece.to_local().copy_(
                distribute_tensor(gathered, piece.device_mesh, piece.placements, src_data_rank=None).to_local()))
            t = gathered
        if not sharded:
            return t
        dim, full, axis = s
        local, r = t.shape[dim], self.ctx.coords[axis]
        if axis == "ep":  # re-placed experts (runtime.rebalance) hold replica slots after their canonical E/ep
            local = min(local, full // self.ctx.axis_size(axis))
        real = max(0, min(full - r * local, local))  # padding rows (pad_vocab) are not part of the model
        shape = list(t.shape)
        shape[dim] = full
        stride = [1] * len(shape)
        for i in range(len(shape) - 2, -1, -1):
            stride[i] = stride[i + 1] * shape[i + 1]
        return DTensor.from_local(t.narrow(dim, 0, real), self.ctx.mesh[axis], [Shard(dim)], run_check=False,
                                  shape=torch.Size(shape), stride=tuple(stride))

    def state(self, optimizer, saving: bool) -> tuple[dict, dict]:
        model_sd, optim_sd = {}, {}
        for name, copies in self.params.items():
            if saving and name in self.skip:
                continue
            p = copies[0]
            st = dict(local_state(optimizer).get(p, {}))
            master = st.pop("master", None)  # bf16 plans (runtime.precision): the fp32 master is the parameter
            if master is None and getattr(optimizer, "owner", None) is not None:
                continue  # its owner (bf16 zero1) writes and reads it
            model_sd[name] = self.whole(name, (master if master is not None else p).detach())
            if st:  # under zero1, only the parameters of this rank's partition
                optim_sd[name] = {k: self.whole(name, v) if k != "step" else v for k, v in st.items()}
        model_sd.update(self.buffers)
        return model_sd, {"state": optim_sd}


def save(directory: str, step: int, modules, optimizer, scheduler, ctx, total_steps: int, shards,
         skip_on_save=(), run: dict | None = None) -> str:
    """Write `DIR/step_N` (see the module docstring) and return its path. `modules`: the model, or this rank's
    pipeline stages; `skip_on_save`: names another rank writes (the last stage's copy of a tied embedding); `run`:
    the run's record (runtime.resume.record), kept in the manifest for the resume contract."""
    return begin(directory, step, modules, optimizer, scheduler, ctx, total_steps, shards, skip_on_save,
                 run=run).finish()


def begin(directory: str, step: int, modules, optimizer, scheduler, ctx, total_steps: int, shards,
          skip_on_save=(), group=None, run: dict | None = None) -> "Saving":
    """Start writing `DIR/step_N.tmp`: synchronously (DCP's `save`), or, given `group` (a process group with a CPU
    backend, used by no other collective: DCP's writer thread coordinates the ranks over it while training goes
    on), asynchronously (DCP's `async_save`: the state is first copied to host memory, so the step after it may
    change the weights). `Saving.finish` completes it: the manifest, then the rename that makes it a checkpoint.
    Until then, a crash leaves a `.tmp` that the next start ignores: the checkpoint before stays the latest.
    Asynchronously, rank 0 also prints the host bytes the copy takes on the fullest rank (staging_bytes; one gather
    of two integers, at saves only), which `scalec plan` predicts (checkpoint_host)."""
    final = os.path.join(directory, f"step_{step:08d}")
    tmp = final + ".tmp"
    if ctx.is_logger:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(directory, exist_ok=True)
    dist.barrier()
    entries = _Entries(modules, shards, ctx, skip_on_save)
    model_sd, optim_sd = entries.state(optimizer, saving=True)
    state = {"model": model_sd, "optim": optim_sd,
             "progress": {"step": torch.tensor(step), "scheduler_epoch": torch.tensor(scheduler.last_epoch),
                          "total_steps": torch.tensor(total_steps)}}
    shapes = {name: t.shape for name, t in model_sd.items()}  # what the manifest names; no tensor is kept
    if group is None:
        return Saving(tmp, final, step, shapes, ctx, metadata=_dcp().save(state, checkpoint_id=tmp), run=run)
    _report_staging(staging_bytes(state), entries.gathered, ctx)
    return Saving(tmp, final, step, shapes, ctx, future=_dcp().async_save(state, checkpoint_id=tmp,
                                                                         process_group=group), run=run)


def staging_bytes(state) -> int:
    """Host bytes DCP's `async_save` copies `state` into, counted from the tensors before it does. What torch 2.13
    stages by default (state_dict_saver.async_save builds `DefaultStager(StagingOptions(False, False, False,
    False))`; _state_dict_stager.StateDictStager.deepcopy_with_tensor_offload does the copy):
    - every tensor, CPU ones included (AdamW's `step`, `progress`), is copied into new CPU storage, synchronously
      in the caller's thread, with blocking copies; the memory is neither pinned nor shared (the defaults that
      would pin it are off, and pinning needs CUDA), and it is held until the writer thread has written the files
      (the staged dict is what the upload future writes; our `Saving.finish` waits on it);
    - the copy is of each tensor's whole untyped storage, not of its view: a `narrow`ed vocabulary shard
      (pad_vocab) or FSDP2's piece (a view of its padded chunk) costs its padded storage;
    - a storage seen twice in one save is copied once (the stager's memo by storage);
    - a DTensor is copied as its local tensor (`_local_tensor` through `__slots__`), not gathered;
    - nothing is deduplicated across ranks before staging: replicas (dp under ddp, tp for replicated tensors) each
      stage their copy; DCP's dedup (_dedup_save_plans) only decides who writes.
    So: the sum over distinct storages of their bytes, DTensors by their local tensor."""
    from torch.distributed.tensor import DTensor
    seen: dict = {}

    def walk(x):
        if isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        elif isinstance(x, torch.Tensor):
            local = x.to_local() if isinstance(x, DTensor) else x
            storage = local.untyped_storage()
            seen[(str(storage.device), storage.data_ptr() or id(storage))] = storage.nbytes()

    walk(state)
    return sum(seen.values())


def _report_staging(host: int, device: int, ctx) -> None:
    """Rank 0 prints the largest staging copy over the ranks (and which rank holds it): what the memory model's
    `checkpoint_host` predicts for the fullest kind of rank. One gather on the default group, at saves only."""
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, (host, device))
    if ctx.is_logger:
        r = max(range(len(every)), key=lambda k: (every[k][0], -k))
        gathered = max(d for _, d in every)
        print(f"scalec: checkpoint staging {every[r][0]} bytes per rank (largest, rank {r})"
              + (f"; {gathered} bytes gathered on the device while it copies" if gathered else ""), flush=True)


class Saving:
    """A checkpoint whose files DCP is writing (or has written) under `step_N.tmp`: `finish` waits for them, checks
    them into the manifest and renames the directory, on every rank together (it runs collectives)."""

    def __init__(self, tmp: str, final: str, step: int, shapes: dict, ctx, metadata=None, future=None,
                 run: dict | None = None):
        self.tmp, self.final, self.step, self.shapes, self.ctx = tmp, final, step, shapes, ctx
        self.metadata, self.future = metadata, future
        self.run = dict(run) if run is not None else None  # as it was at this step (a copy: the record moves on)

    def finish(self) -> str:
        ctx = self.ctx
        metadata = self.future.result() if self.future is not None else self.metadata  # DCP raises on every rank
        manifest = _manifest(self.tmp, metadata, self.shapes, ctx)
        if os.environ.get(_TEST_KILL) == f"{ctx.rank}:{self.step}":
            import signal
            os.kill(os.getpid(), signal.SIGKILL)
        dist.barrier()
        if ctx.is_logger:
            if self.run is not None:
                manifest["run"] = self.run
            with open(os.path.join(self.tmp, MANIFEST), "w") as f:
                json.dump(manifest, f, indent=1)
            shutil.rmtree(self.final, ignore_errors=True)
            os.replace(self.tmp, self.final)
            print(f"scalec: checkpoint {self.final}", flush=True)
        dist.barrier()
        return self.final


def crc32(file: str) -> int:
    """CRC32 of a file's bytes (zlib's, read in 4 MiB chunks)."""
    crc = 0
    with open(file, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def _share(files: list[str], ctx) -> list[str]:
    """This rank's share of `files` (sorted) to checksum: every world_size-th, so each file is read by one rank."""
    return sorted(files)[ctx.rank::ctx.world_size]


def _gather_params(model_sd: dict, ctx) -> dict[str, list[int]]:
    """Every parameter of the model this run builds, single-device name -> whole shape: this rank's entries merged
    with every other rank's (a pipeline rank holds its stages' parameters only), in rank order. `model_sd`: name ->
    a tensor, or its shape."""
    mine = [(name, list(getattr(t, "shape", t))) for name, t in model_sd.items()]
    every = [None] * ctx.world_size
    dist.all_gather_object(every, mine)
    merged: dict[str, list[int]] = {}
    for part in every:
        for name, shape in part:
            merged.setdefault(name, shape)
    return merged


def fingerprint(params: dict[str, list[int]]) -> str:
    """sha256 of the sorted (name, whole shape) pairs: equal exactly when two models have the same parameters."""
    return hashlib.sha256(json.dumps(sorted(params.items())).encode()).hexdigest()


def _manifest(path: str, metadata, model_sd: dict, ctx) -> dict:
    """What `path` holds (module docstring), on rank 0 (None elsewhere): each rank checksums its share of the files
    DCP wrote and of `.metadata`; the model's parameters are gathered from every rank."""
    files = sorted({info.relative_path for info in (metadata.storage_data or {}).values()} | {".metadata"})
    sums = {rel: {"bytes": os.path.getsize(os.path.join(path, rel)), "crc32": crc32(os.path.join(path, rel))}
            for rel in _share(files, ctx)}
    every = [None] * ctx.world_size
    dist.all_gather_object(every, sums)
    params = _gather_params(model_sd, ctx)
    if not ctx.is_logger:
        return None
    merged = {rel: entry for part in every for rel, entry in part.items()}
    return {"format": 1,
            "model": {"sha256": fingerprint(params), "parameters": sorted([n, s] for n, s in params.items())},
            "files": dict(sorted(merged.items()))}


def _read_manifest(path: str) -> tuple[dict | None, str | None]:
    """(the manifest of `path`, None), (None, None) for a checkpoint written before manifests, or (None, the problem
    naming the file) when it is there but unreadable or not in the form `_manifest` writes."""
    file = os.path.join(path, MANIFEST)
    if not os.path.exists(file):
        return None, None
    try:
        with open(file) as f:
            raw = json.load(f)
        manifest = {"sha256": str(raw["model"]["sha256"]),
                    "parameters": {str(name): [int(d) for d in shape] for name, shape in raw["model"]["parameters"]},
                    "files": {str(rel): {"bytes": int(e["bytes"]), "crc32": int(e["crc32"])}
                              for rel, e in raw["files"].items()},
                    "run": raw["run"] if isinstance(raw.get("run"), dict) else None}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return None, f"{file} is unreadable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    return manifest, None


def _shape_text(shape) -> str:
    return "×".join(str(d) for d in shape) or "scalar"


def model_difference(path: str, stored: dict, ours: dict) -> str | None:
    """The first difference between the model the checkpoint at `path` holds (`stored`: name -> whole shape) and
    this one (`ours`), in the words of `scalec reshard`'s E0901, or None when they are the same model."""
    for name, shape in ours.items():
        if name not in stored:
            return f"the models differ: `{name}` is not a parameter of {path}"
        if tuple(stored[name]) != tuple(shape):
            return (f"the models differ: `{name}` is {_shape_text(shape)} here and {_shape_text(stored[name])} in "
                    f"{path}")
    missing = [name for name in stored if name not in ours]
    if missing:
        more = f" and {len(missing) - 1} more parameters" if len(missing) > 1 else ""
        return f"the models differ: {path} has `{missing[0]}`{more} that this model lacks"
    return None


_HELP = "a checkpoint moves between plans of one model: change the mesh and plan, not the model"


def _damaged(path: str, manifest: dict, ctx) -> str | None:
    """The first file of `path` (by name) whose size or CRC32 is not the manifest's, or None; each rank checks its
    share and every rank gets the answer."""
    problems = []
    for rel in _share(list(manifest["files"]), ctx):
        file, want = os.path.join(path, rel), manifest["files"][rel]
        try:
            size = os.path.getsize(file)
            if size != want["bytes"]:
                problems.append((rel, f"{file} is {size:,} bytes, {want['bytes']:,} when written"))
                continue
            got = crc32(file)
        except OSError as exc:
            problems.append((rel, f"{file} is unreadable ({exc.strerror or type(exc).__name__})"))
            continue
        if got != want["crc32"]:
            problems.append((rel, f"{file} does not match its checksum (CRC32 {got:08x}, {want['crc32']:08x} "
                                  "when written): it changed on disk"))
    every = [None] * ctx.world_size
    dist.all_gather_object(every, problems)
    found = sorted(p for part in every for p in part)
    return found[0][1] if found else None


def _mismatch(path: str, model_sd: dict) -> str | None:
    """A parameter this model has that the checkpoint lacks or holds with another shape, in one line (checkpoints
    written before the manifest: the names and shapes in DCP's `.metadata`)."""
    metadata = _dcp().FileSystemReader(path).read_metadata().state_dict_metadata
    for name, t in model_sd.items():
        stored = metadata.get(f"model.{name}")
        if stored is None:
            return f"{path} holds another model: it has no parameter {name}"
        if hasattr(stored, "size") and tuple(stored.size) != tuple(t.shape):
            return (f"{path} holds another model: {name} is {list(stored.size)} there and {list(t.shape)} in "
                    "this one")
    return None


# Exceptions that say our code is wrong, not that a file is damaged: loading re-raises them instead of falling back.
_BUGS = (TypeError, AttributeError, NameError, KeyError, IndexError, AssertionError)


def _causes(exc) -> list[BaseException]:
    """The per-rank exceptions DCP gathered (a CheckpointException's failures: rank -> (exception, traceback))."""
    return [f[0] if isinstance(f, tuple) else f for f in exc.failures.values()]


def load_latest(directory: str, modules, optimizer, scheduler, ctx, total_steps: int, shards,
                contract=None) -> int:
    """Load the newest intact checkpoint in `directory`, if any; return the step to resume from (0 without one).
    `contract` (runtime.resume.Contract): this run's record, compared with the checkpoint's before any tensor is
    read (a resume that changes the run is refused in one line, runtime.resume.decide); the scheduler then follows
    the decision (an extended run's schedule), and the log says what changed. Without it, only the number of steps
    is compared."""
    check_directory(directory, ctx)
    candidates = [path for _, path in reversed(_complete(directory))] if ctx.is_logger else []
    n = _broadcast(len(candidates), ctx)
    if n == 0:
        return 0
    from torch.distributed.checkpoint.state_dict import _init_optim_state
    _init_optim_state(optimizer)  # AdamW's state exists only after a step: make it, to load into
    entries = _Entries(modules, shards, ctx)
    last_problem = None
    for i in range(n):
        path = _broadcast(candidates[i] if ctx.is_logger else None, ctx)
        manifest, problem, decision = None, None, None
        if ctx.is_logger:
            problem = _problem(path)
            if problem is None:
                manifest, problem = _read_manifest(path)
        manifest, problem = _broadcast((manifest, problem), ctx)
        if problem is None:
            entries.after_load.clear()  # restores queued by an attempt that failed
            model_sd, optim_sd = entries.state(optimizer, saving=False)
            if manifest is not None:  # before any tensor is read: the same model (module docstring)
                ours = _gather_params(model_sd, ctx)
                differ = None if manifest["sha256"] == fingerprint(ours) else (
                    model_difference(path, manifest["parameters"], ours)
                    or f"{path} holds another model (its fingerprint differs)")
                if differ:
                    raise FatalError(f"scalec: {differ}; {_HELP}" if ctx.is_logger else None)
                if contract is not None and manifest["run"] is not None:  # the same run (runtime.resume)
                    decision = _decide(path, manifest["run"], contract, ctx)
                problem = _damaged(path, manifest, ctx)
            else:
                mismatch = _broadcast(_mismatch(path, model_sd) if ctx.is_logger else None, ctx)
                if mismatch:
                    raise FatalError(f"scalec: {mismatch}" if ctx.is_logger else None)
        if problem is None:
            state = {"model": model_sd, "optim": optim_sd,
                     "progress": {"step": torch.tensor(0), "scheduler_epoch": torch.tensor(0),
                                  "total_steps": torch.tensor(0)}}
            try:
                _dcp().load(state, checkpoint_id=path)  # DCP raises on every rank if any rank failed
            except _dcp().api.CheckpointException as exc:
                if any(isinstance(e, _BUGS) for e in _causes(exc)):
                    raise  # a defect of ours, not a damaged file: falling back would hide it and lose progress
                lines = str(exc).strip().splitlines()
                problem = f"{path} failed to load ({type(exc).__name__}: {lines[-1] if lines else ''})"
        if problem is not None:
            last_problem = problem
            if ctx.is_logger and i + 1 < n:  # the last one's problem is the error below
                print(f"scalec: warning: skipping checkpoint {path}: {problem}", flush=True)
            continue
        written_for = int(state["progress"]["total_steps"])
        done = int(state["progress"]["step"])
        if contract is None:
            if written_for != total_steps:
                raise FatalError(f"scalec: {path} belongs to a run of {written_for} steps; resuming it for "
                                 f"{total_steps} would change the learning-rate schedule. Resume with the same "
                                 "number of steps, or start in an empty checkpoint directory."
                                 if ctx.is_logger else None)
        else:
            if decision is None:  # written before the contract: its steps alone are known
                decision = _decide(path, {"steps": written_for}, contract, ctx, done)
                decision.lines.insert(0, f"scalec: note: {path} was written before checkpoints recorded their "
                                         "run's settings: only its number of steps is compared")
            contract.record["schedule_steps"] = decision.schedule_steps
            scheduler.lr_lambdas = [contract.lr_lambda()] * len(scheduler.lr_lambdas)
        for restore in entries.after_load:
            restore()
        if hasattr(optimizer, "load_masters"):  # bf16 (runtime.precision): the weights recast from the masters
            optimizer.load_masters()
        scheduler.last_epoch = int(state["progress"]["scheduler_epoch"])
        for group, lr in zip(optimizer.param_groups, _lrs(scheduler)):
            group["lr"] = lr
        if ctx.is_logger:
            print(f"scalec: resumed from {path} (step {done})", flush=True)
            for line in (decision.lines if decision is not None else ()):
                print(line, flush=True)
        return done
    raise FatalError(f"scalec: no intact checkpoint in {directory}: {last_problem}" if ctx.is_logger else None)


def _decide(path: str, old: dict, contract, ctx, done: int | None = None):
    """runtime.resume.decide for the checkpoint at `path` (its step from its name unless given), as a FatalError
    (one line, rank 0's) when refused. Every rank decides alike: the manifest and the record are the same on all."""
    from runtime import resume
    if done is None:
        done = int(_STEP.match(os.path.basename(path)).group(1))
    try:
        return resume.decide(path, old, contract.record, done, contract.allowed, contract.schedule)
    except resume.Refused as exc:
        raise FatalError(str(exc) if ctx.is_logger else None) from None


def _lrs(scheduler) -> list[float]:
    """The learning rates of the scheduler's current step, without stepping it."""
    return [base * lmbda(scheduler.last_epoch) for base, lmbda in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
