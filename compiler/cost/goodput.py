"""Goodput: how much of a run's wall time trains, given how often its machines fail (compiler/layout/failures.py),
what a checkpoint costs to save and a restart to resume, and how often the plan checkpoints. Torch-free.

The model, for one job of N devices whose interruptions come at random (a Poisson process):
- M, the job's mean time between interruptions: 1 / (rate × N), the rate per device-hour.
- C, a save's cost, what blocks the step: synchronous, the rank's files written; every unique byte of the
  checkpoint is written once (DCP's planner deduplicates replicas and spreads the writes over the ranks:
  runtime/checkpoint.py), 12 bytes a parameter (the fp32 weights, or the fp32 master under bf16, and AdamW's two
  fp32 moments), a node's share over the storage's write bandwidth per node. With `checkpoint_async` only the staging
  copy blocks (compiler/cost/memory.py `checkpoint_staging`: the fullest rank's host bytes over its device-to-host
  link); the files are written while the next steps run, so an interval is at least that write.
- R, a restart's cost: start-up (processes, rendezvous, groups, the model built), the checkpoint's load (what each
  rank holds of the weights and moments, a node's ranks' bytes over the read bandwidth per node), and, compiled,
  the first step's compile; or `restart = ...` as written.
- τ, the work between two checkpoints. Young's first-order optimum (J. W. Young, "A first order approximation to
  the optimum checkpoint interval", CACM 17(9), 1974): τ = √(2·C·M).
- ETTR, the effective training time ratio at an interval τ: Daly's model of the expected wall time of one
  segment of τ work and one save under exponential failures, each failure costing R and the work since the last
  checkpoint (J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps", FGCS
  22(3), 2006, eq. 11 with his restart time R): E = M·e^(R/M)·(e^((τ+C)/M) − 1), ETTR = τ / E. To first order it
  loses C/τ to saves, τ/(2M) to rework and R/M to restarts per unit time. A run with no checkpoint (none written,
  or only the last) is one segment of the whole run's work with C = 0: every interruption starts it again at step 0.
  An asynchronous save's files become a valid checkpoint only once written: that lag is not in the model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from compiler.layout import failures as FAIL

CHECKPOINT_BYTES_PER_PARAM = 12  # fp32 weights (under bf16 the fp32 master) and AdamW's two fp32 moments


@dataclass(frozen=True)
class Goodput:
    """The failure model's figures for one compiled plan, every input beside what it makes."""

    devices: int
    rate_per_gpu_hour: float
    rate_source: str
    mtbf_s: float                  # M
    nodes: int
    save_bytes_node: float         # what one node writes per checkpoint
    write_gbps: float              # per node
    read_gbps: float
    storage_source: str
    write_s: float                 # the node's files written
    staging_s: float | None        # checkpoint_async: the staging copy that blocks the step (C then)
    staging_bytes: float
    host_gbps: float
    save_s: float                  # C
    startup_s: float
    startup_source: str
    load_bytes_node: float
    load_s: float
    compile_s: float
    restart_s: float               # R
    restart_written: bool
    step_s: float
    steps: int
    best_interval_s: float         # Young's τ (at least the write, asynchronous; at least one step)
    best_steps: int                # τ in whole steps (at least 1): what `checkpoint_every = auto` writes
    checkpoints: bool              # a checkpoint_dir is written
    every: int                     # the steps between checkpoints the program uses (0: only the last)
    auto: bool                     # `checkpoint_every = auto`

    @property
    def run_s(self) -> float:
        return self.steps * self.step_s

    @property
    def interval_s(self) -> float | None:
        """The work between checkpoints as the program runs; None: no checkpoint before the last."""
        if not self.checkpoints or not 0 < self.every < self.steps:
            return None
        return self.every * self.step_s

    @property
    def ettr(self) -> float:
        """The ETTR as the program runs: at its interval, or with no checkpoint to resume from."""
        interval = self.interval_s
        if interval is None:
            return ettr(self.run_s, 0.0, self.restart_s, self.mtbf_s)
        return ettr(interval, self.save_s, self.restart_s, self.mtbf_s)

    @property
    def ettr_best(self) -> float:
        return ettr(self.best_interval_s, self.save_s, self.restart_s, self.mtbf_s)

    def as_json(self) -> dict:
        """plan.json's "goodput": the first five keys are what tools read (docs/planning.md)."""
        return {"ettr": self.ettr, "checkpoint_interval_s": self.interval_s, "mtbf_hours": self.mtbf_s / 3600,
                "save_s": self.save_s, "restart_s": self.restart_s,
                "best_interval_s": self.best_interval_s, "ettr_at_best": self.ettr_best,
                "checkpoint_every": self.every if self.checkpoints else None, "auto": self.auto,
                "rate_per_gpu_hour": self.rate_per_gpu_hour, "devices": self.devices,
                "write_s": self.write_s, "staging_s": self.staging_s, "startup_s": self.startup_s,
                "load_s": self.load_s, "compile_s": self.compile_s, "step_s": self.step_s}


def young_interval(save_s: float, mtbf_s: float) -> float:
    """Young's optimum work between checkpoints: √(2·C·M)."""
    return math.sqrt(2.0 * save_s * mtbf_s)


def ettr(work_s: float, save_s: float, restart_s: float, mtbf_s: float) -> float:
    """Daly's ratio of `work_s` to the expected wall time of doing it and saving once:
    M·e^(R/M)·(e^((τ+C)/M) − 1)."""
    if work_s <= 0:
        return 0.0
    x = (work_s + save_s) / mtbf_s
    if x + restart_s / mtbf_s > 700:  # e^700 ~ 1e304: the run almost surely never ends
        return 0.0
    return work_s / (mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1(x))


def goodput(spec, plan, costs, step_s: float) -> Goodput:
    """The failure model of `spec` (its resilience section's figures, or the defaults) for `plan` priced by `costs`
    (compiler.cost.Estimate) at `step_s` seconds per step."""
    r, t, cl = spec.resilience, spec.train, spec.cluster
    dev = cl.device
    devices = cl.world_size
    mtbf_s = 3600.0 / (r.rate_per_gpu_hour * devices)
    write_gbps = r.storage_write_gbps or FAIL.STORAGE_GBPS_PER_NODE
    read_gbps = r.storage_read_gbps or write_gbps
    written = [k for k in ("storage_write_gbps", "storage_read_gbps") if getattr(r, k) is not None]
    storage_source = "as written" if written else FAIL.STORAGE_SOURCE
    save_bytes_node = CHECKPOINT_BYTES_PER_PARAM * costs.params_n / cl.nodes
    write_s = save_bytes_node / (write_gbps * 1e9)
    staged = [m.checkpoint_host for m in costs.memory if m.checkpoint_host is not None]
    host_gbps = FAIL.host_link_gbps(dev)
    staging_bytes = max(staged) if t.checkpoint_async and staged else 0.0
    staging_s = staging_bytes / (host_gbps * 1e9) if t.checkpoint_async and staged else None
    save_s = write_s if staging_s is None else staging_s
    # what each rank holds of the weights (fp32) or the master (bf16, in `optimizer`) and the moments, read back
    ms = costs.model_state
    load_bytes_node = (ms.optimizer + (ms.params if t.precision == "fp32" else 0)) * cl.devices_per_node
    load_s = load_bytes_node / (read_gbps * 1e9)
    startup_s, startup_source = FAIL.startup_s(dev.kind)
    compile_s = FAIL.compile_s(dev.kind) if plan.compiles else 0.0
    restart_s = r.restart_s if r.restart_s is not None else startup_s + load_s + compile_s
    best = max(young_interval(save_s, mtbf_s), write_s if staging_s is not None else 0.0, step_s)
    every = t.checkpoint_every
    best_steps = max(1, round(best / step_s))
    return Goodput(devices=devices, rate_per_gpu_hour=r.rate_per_gpu_hour, rate_source=r.rate_source,
                   mtbf_s=mtbf_s, nodes=cl.nodes, save_bytes_node=save_bytes_node, write_gbps=write_gbps,
                   read_gbps=read_gbps, storage_source=storage_source, write_s=write_s, staging_s=staging_s,
                   staging_bytes=staging_bytes, host_gbps=host_gbps, save_s=save_s, startup_s=startup_s,
                   startup_source=startup_source, load_bytes_node=load_bytes_node, load_s=load_s,
                   compile_s=compile_s, restart_s=restart_s, restart_written=r.restart_s is not None, step_s=step_s,
                   steps=t.steps, best_interval_s=best, best_steps=best_steps, checkpoints=bool(t.checkpoint_dir),
                   every=best_steps if every == "auto" else every, auto=every == "auto")


def of(compiled) -> Goodput | None:
    """The compiled plan's goodput (its estimate's predicted step time), or None without a decided plan."""
    if compiled.plan is None:
        return None
    return goodput(compiled.spec, compiled.plan, compiled.costs, compiled.costs.step.step_time_s)


def checkpoint_steps(spec, plan, costs) -> int:
    """The steps between checkpoints the program writes: as written, or `auto`'s Young–Daly interval in steps."""
    every = spec.train.checkpoint_every
    if every != "auto":
        return every
    return goodput(spec, plan, costs, costs.step.step_time_s).best_steps
