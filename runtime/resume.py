"""The resume contract: a checkpoint records what determines its run's trajectory, and a resume that would change it
is refused unless the user says so.

What is recorded (`record`, in the checkpoint's manifest, runtime.checkpoint's `scalec.json`, under "run"):
- the settings that decide which numbers the run computes: `seed` (initialisation and the data order),
  `global_batch`, `seq_len`, the data's identity (`data`: its kind, path, dtype, size, a checksum of its first,
  middle and last MiB and of its sidecar `FILE.json` and Megatron index `PREFIX.idx` where they exist, the document
  separator), `eval_split` (the held-out tail is never trained on: another split is other training data), the
  optimizer's (`lr`, `betas`, `weight_decay`, `eps`, `grad_clip`) and the schedule's (`lr_schedule`, `warmup`,
  `min_lr`). A resume that differs in any of them stops at start-up with one line naming every difference, old and
  new value (`decide`), unless each changed one is named in the program's `--resume-changed KEY,...` (Megatron's
  `--override-opt_param-scheduler` in spirit): then the run resumes and its log says what changed.
- what only rounds the same computation differently: `micro_batching` (the plan's split of the global batch over
  batch ranks and micro-batches: a checkpoint moves between plans, runtime.checkpoint) and `precision` (the
  checkpoint holds fp32 masters whatever the precision). A change is said in the log, not refused.
- `steps` (the run's length) and `schedule_steps` (the step the cosine's decay is anchored to: `steps`, unless a
  resume extended the run keeping the old curve). More steps than the checkpoint's run is an extension, allowed:
  `--resume-schedule keep` (the default) keeps the schedule's curve as it was (a cosine stays at `min_lr` after
  its old last step; no step already planned changes its learning rate), `--resume-schedule reanchor` re-anchors
  the decay to the new last step (the curve a run of the new length would have had: the learning rate jumps back
  up at the resume step when the old one had decayed); the log says which, with the learning rates around the
  resume step. Fewer steps (still more than the checkpoint's step) bends the schedule too: it needs
  `--resume-changed steps`. Fewer steps than the checkpoint's step is refused.

A checkpoint written before the contract (no "run" in its manifest) is compared on its steps only, and the log
says so.

Plain values and hashlib: no torch (runtime.checkpoint and runtime.startup call this)."""
from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass, field

REFUSED = ("seed", "global_batch", "seq_len", "data", "eval_split", "lr", "betas", "weight_decay", "eps",
           "grad_clip", "lr_schedule", "warmup", "min_lr")
"""Settings a resume may change only when `--resume-changed` names them."""
NOTED = ("micro_batching", "precision")
"""Settings whose change is said in the log: the same computation, rounded differently."""
KEYS = REFUSED + ("steps",)
"""What `--resume-changed` accepts."""
SCHEDULES = ("keep", "reanchor")
"""`--resume-schedule`: what an extended run's schedule means (module docstring)."""
FORMAT = 1
_SAMPLE = 1 << 20  # bytes of the data file checksummed at its start, middle and end


def multiplier(step: int, *, schedule: str, warmup: int, lr: float, min_lr: float, anchor: int) -> float:
    """The peak learning rate's multiplier at optimizer step `step` (0-based): linear warm-up, then constant or a
    cosine reaching min_lr at step `anchor` and staying there."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, anchor - warmup)
    floor = min_lr / lr
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def _sha256_file(path: str) -> str | None:
    if not os.path.isfile(path):
        return None
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _sample_sha256(path: str, size: int) -> str:
    """sha256 of the first, middle and last MiB of `path` (all of it when smaller): a file rewritten with other ids
    differs there, and a terabyte file is not read whole at every start."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for offset in sorted({0, max(0, size // 2 - _SAMPLE // 2), max(0, size - _SAMPLE)}):
            f.seek(offset)
            h.update(f.read(_SAMPLE))
    return h.hexdigest()


def data_identity(kind: str, path: str, dtype: str, document_separator) -> dict:
    """What the training data is: for a token file its absolute path, dtype, size and checksums (module
    docstring); for synthetic data its kind alone (its stream is a function of the seed and the vocabulary)."""
    if kind != "tokens":
        return {"kind": kind}
    path = os.path.abspath(path)
    out = {"kind": kind, "path": path, "dtype": dtype, "document_separator": document_separator}
    try:
        size = os.path.getsize(path)
        out.update(bytes=size, sha256_sampled=_sample_sha256(path, size))
    except OSError:  # the data's own check at start-up says what is wrong with it
        out.update(bytes=None, sha256_sampled=None)
    out["sidecar_sha256"] = _sha256_file(path + ".json")
    if path.endswith(".bin"):
        out["index_sha256"] = _sha256_file(path[:-4] + ".idx")
    return out


def record(cfg, data: dict, schedule_steps: int | None = None) -> dict:
    """The run record of `cfg` (runtime.config.Config) with the data identity `data` (`data_identity`)."""
    opt, par = cfg.optim, cfg.parallel
    return {"format": FORMAT, "seed": cfg.seed, "global_batch": cfg.data.global_batch, "seq_len": cfg.data.seq_len,
            "data": data, "eval_split": cfg.eval.split if data.get("kind") == "tokens" else 0.0,
            "lr": opt.lr, "betas": [float(b) for b in opt.betas], "weight_decay": opt.weight_decay, "eps": opt.eps,
            "grad_clip": opt.grad_clip, "lr_schedule": opt.lr_schedule, "warmup": opt.warmup, "min_lr": opt.min_lr,
            "micro_batching": {"batch_ranks": par.batch_ranks, "micro_batches": par.micro_batches,
                               "micro_batch_size": par.micro_batch_size},
            "precision": cfg.precision, "steps": cfg.steps,
            "schedule_steps": cfg.steps if schedule_steps is None else schedule_steps}


def parse_keys(text: str) -> frozenset:
    """`--resume-changed`'s value: comma-separated KEYS; raises ValueError naming an unknown one."""
    keys = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in keys if k not in KEYS]
    if unknown:
        raise ValueError(f"unknown setting{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: "
                         f"--resume-changed takes {', '.join(KEYS)}")
    return frozenset(keys)


def _value(key: str, v) -> str:
    if v is None:
        return "none"
    if key == "data":
        if v.get("kind") != "tokens":
            return str(v.get("kind"))
        size = f"{v['bytes']:,} bytes" if v.get("bytes") is not None else "unreadable"
        extra = "".join(f", {label} {v[k][:12]}" for k, label in (("sha256_sampled", "sha256"),
                                                                  ("sidecar_sha256", "sidecar sha256"),
                                                                  ("index_sha256", "index sha256")) if v.get(k))
        sep = (f", document_separator {v['document_separator']}" if v.get("document_separator") is not None
               else "")
        return f"{v.get('path')} ({v.get('dtype')}, {size}{extra}{sep})"
    if key == "micro_batching":
        return (f"{v['micro_batches']} micro-batch(es) of {v['micro_batch_size']} on {v['batch_ranks']} batch "
                "rank(s)")
    if key == "betas":
        return "(" + ", ".join(f"{b:g}" for b in v) + ")"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _difference(key: str, old, new) -> str:
    return f"{key} {_value(key, old)} → {_value(key, new)}"


def _same_data_elsewhere(old: dict, new: dict) -> bool:
    """The same token file at another path: every recorded figure but the path equal (and some checksum there)."""
    if old.get("kind") != "tokens" or new.get("kind") != "tokens" or not old.get("sha256_sampled"):
        return False
    return {k: v for k, v in old.items() if k != "path"} == {k: v for k, v in new.items() if k != "path"}


class Refused(Exception):
    """A resume the contract refuses: the one line to print."""


@dataclass
class Decision:
    """What a resume that the contract allows means: the schedule's anchor and the lines the log gets."""

    schedule_steps: int
    lines: list = field(default_factory=list)


def decide(path: str, old: dict, new: dict, done: int, allowed: frozenset = frozenset(),
           schedule: str = "keep") -> Decision:
    """Whether this run (`new`, its record) may resume the checkpoint at `path` (`old`, the record it was written
    with; `done`, its step), and what it means (module docstring); raises Refused with the one line otherwise.
    A key missing from `old` (a record of an older format) is not compared."""
    refused, changed, noted = [], [], []
    for key in REFUSED + NOTED:
        if key not in old or old[key] == new.get(key):
            continue
        if key == "data" and _same_data_elsewhere(old[key], new[key]):
            noted.append(f"the data file moved: {old[key]['path']} → {new[key]['path']} (the same size and "
                         "checksums)")
            continue
        text = _difference(key, old[key], new.get(key))
        if key in NOTED:
            noted.append(f"{text} (the same training, rounded differently)")
        elif key in allowed:
            changed.append(text)
        else:
            refused.append((key, text))
    old_steps, new_steps = int(old["steps"]), int(new["steps"])
    anchor = int(old.get("schedule_steps", old_steps))
    schedule_line = None
    if new_steps < done:
        raise Refused(f"scalec: {path} is at step {done}, past the {new_steps} steps of this run: run at least "
                      f"{done} steps, or start in an empty checkpoint directory")
    if new_steps != old_steps:
        if new_steps < old_steps and "steps" not in allowed:
            refused.append(("steps", _difference("steps", old_steps, new_steps)))
        else:
            if new_steps < old_steps:
                changed.append(_difference("steps", old_steps, new_steps))
            if schedule == "reanchor":
                anchor = new_steps
            schedule_line = _schedule_line(old_steps, new_steps, done, anchor, old, new, schedule)
    if refused:
        keys = ",".join(k for k, _ in refused)
        raise Refused(f"scalec: {path} was written by another run: {'; '.join(t for _, t in refused)}. To continue "
                      f"it with the new settings, resume with --resume-changed {keys}; else start in an empty "
                      "checkpoint directory")
    lines = []
    if changed:
        lines.append(f"scalec: resuming with changed settings (--resume-changed): {'; '.join(changed)}")
    if noted:
        lines.append(f"scalec: resuming with {'; '.join(noted)}")
    unused = sorted(k for k in allowed if k != "steps" and k in old and old[k] == new.get(k))
    if "steps" in allowed and new_steps == old_steps:  # (an extension needs no flag: it is said below)
        unused.append("steps")
    if unused:
        lines.append(f"scalec: note: --resume-changed names {', '.join(unused)}, unchanged since the checkpoint")
    if schedule_line:
        lines.append(schedule_line)
    return Decision(schedule_steps=anchor, lines=lines)


def _schedule_line(old_steps: int, new_steps: int, done: int, anchor: int, old: dict, new: dict,
                   schedule: str) -> str:
    """What the learning-rate schedule means after the run's length changed from `old_steps` to `new_steps`."""
    lead = f"scalec: steps {old_steps} → {new_steps}"
    kind = new.get("lr_schedule", "cosine")
    lr = float(new["lr"])

    def at(step: int, a: int) -> float:
        return lr * multiplier(step, schedule=kind, warmup=int(new["warmup"]), lr=lr, min_lr=float(new["min_lr"]),
                               anchor=a)
    if kind == "constant":
        return f"{lead}: the schedule is constant after its warm-up; the learning rate stays {lr:g}"
    # as the log shows it: a step's `lr` is the scheduler's after that step (the next step's learning rate)
    before = at(done, int(old.get("schedule_steps", old_steps)))
    after = at(done + 1, anchor) if done < new_steps else None
    around = (f"; the log's lr {before:.4g} at step {done}, {after:.4g} at step {done + 1}"
              if after is not None else "")
    if schedule == "keep":
        tail = (f", then stays at min_lr {float(new['min_lr']):g} to step {new_steps}" if new_steps > anchor else "")
        return (f"{lead}: the cosine keeps its curve (--resume-schedule keep, the default): it reaches min_lr at "
                f"step {anchor}{tail}{around}; --resume-schedule reanchor decays to min_lr at step {new_steps} "
                "instead")
    return (f"{lead}: the cosine is re-anchored (--resume-schedule reanchor): it reaches min_lr "
            f"{float(new['min_lr']):g} at step {new_steps}, as a run of {new_steps} steps would{around}")


@dataclass
class Contract:
    """This run's side of the contract: its record (`record`; its `schedule_steps` set by the resume's decision,
    so that the checkpoints it writes carry the anchor on), the keys the user allows to change and the meaning of
    an extended schedule (`--resume-changed`, `--resume-schedule`)."""

    record: dict
    allowed: frozenset = frozenset()
    schedule: str = "keep"

    def lr_lambda(self, anchor: int | None = None):
        """The learning-rate multiplier of this run's schedule with its cosine anchored at step `anchor` (default
        its `schedule_steps`)."""
        r = self.record
        a = int(r["schedule_steps"] if anchor is None else anchor)
        return lambda step: multiplier(step, schedule=r["lr_schedule"], warmup=int(r["warmup"]), lr=float(r["lr"]),
                                       min_lr=float(r["min_lr"]), anchor=a)
