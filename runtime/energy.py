"""Measured energy per step, beside the compiler's prediction (issue 42, item 5): each rank's energy counter read at
the logging intervals, joules per step on rank 0's log line (its own and the job's sum), in the `--metrics` records
and the trackers; where no counter can be read, one line once per run that says which and that energy is not
measured, and no figure at all: never a silent zero (codecarbon#1316: a GPU without the counter logged 0 J).

The counters:
- CUDA: NVML's total energy counter of this rank's GPU (`nvmlDeviceGetTotalEnergyConsumption`: millijoules since
  the driver was last reloaded; "for Volta or newer fully supported devices", NVML's API reference), the GPU found
  as runtime.health finds it (`nvml_index`). A 64-bit count of millijoules does not wrap in any run; a counter that
  goes backwards (the driver reloaded under the run) is reported and that interval not used.
- CPU: Linux RAPL through powercap: `/sys/class/powercap/intel-rapl:<N>/energy_uj`, microjoules, of each zone
  named `package-<N>` (its subzones, core, uncore and dram, are parts of it; `psys`, where present, holds the
  packages too); AMD's processors are read by the same driver on recent kernels. Each counter wraps to 0 past its
  `max_energy_range_uj` (the powercap sysfs ABI, Linux's Documentation/power/powercap/powercap.rst), which the delta
  undoes; an interval in which a counter wraps twice cannot be told from one in which it wraps once, so a logging
  interval longer than the range at the package's power is undercounted. Since the fix for CVE-2020-8694 (Linux
  5.10, and the stable kernels it was backported to) `energy_uj` is readable by root only.
  A package is a whole socket: every process on it counts, not this job alone, and every rank on a host reads the
  same packages. The figure is the packages', never divided by the ranks that share them: the line says how many
  do, and the job's sum takes each host once.

What a log step costs: one counter read per rank at each logging interval (and two around an evaluation, whose
energy is left out as the clock leaves out its time), and one gather of one number per rank to rank 0, only where
some rank measures: the ranks agree on that once, at start-up. (The straggler detector's gather comes every
`window` steps and only with `detect`; the log's loss all-reduce spans the batch ranks, not the pipeline's: neither
carries a figure per rank at each logging interval.)

The prediction is the program's `Config.predicted_joules_per_step`: ((pp rank, joules per device per step), ...),
from the compiler's energy model; empty: none, and the line has only the measurement.

No torch at import; pynvml is imported where used.
"""
from __future__ import annotations

import glob
import math
import os
import re
import socket

from runtime import health

POWERCAP = "/sys/class/powercap"
"""Where Linux's powercap class lists its zones (RAPL's as `intel-rapl:<N>`, subzones `intel-rapl:<N>:<M>`)."""

NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NO_PERMISSION = 3, 4
"""nvml.h's nvmlReturn_t values, where a pynvml does not name them."""


def _say(line: str) -> None:
    print(line, flush=True)


class Backwards(Exception):
    """A counter read less than it did before and has no range to have wrapped within."""

    def __init__(self, before_j: float, now_j: float):
        super().__init__(f"{before_j:,.1f} J → {now_j:,.1f} J")
        self.before_j, self.now_j = before_j, now_j


class Counter:
    """One rank's energy counter: `read()` gives the raw count of each of its zones (one GPU; each package of a
    host), in `unit` joules; a zone whose range is known wraps to 0 past it (`ranges`, None: never wraps).
    `errors`: the exceptions a read can raise where the counter is gone (the driver, the file)."""

    def __init__(self, source: str, what: str, read, unit: float, ranges: tuple, errors: tuple):
        self.source, self.what, self.read, self.unit = source, what, read, unit
        self.ranges, self.errors = ranges, errors


def joules(before: tuple, now: tuple, ranges: tuple, unit: float) -> float:
    """The energy between two readings of a counter's zones: each zone's growth, a wrap past its range undone;
    `Backwards` where a zone without a range went down."""
    total = 0
    for b, n, top in zip(before, now, ranges):
        if n >= b:
            total += n - b
        elif top:  # wrapped: from b up to the range, then from 0 to n
            total += top - b + n
        else:
            raise Backwards(b * unit, n * unit)
    return total * unit


# -- opening this rank's counter --------------------------------------------------------------------------------


def _nvml_why(nvml, exc) -> str:
    code = getattr(exc, "value", None)
    if code == getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED):
        return "not supported on this GPU (NVML has it from Volta on)"
    if code == getattr(nvml, "NVML_ERROR_NO_PERMISSION", NVML_ERROR_NO_PERMISSION):
        return f"no permission ({exc})"
    return str(exc) or type(exc).__name__


def open_nvml(device_index: int, nvml=None) -> tuple[Counter | None, str | None]:
    """(NVML's energy counter of CUDA device `device_index`, None), or (None, why it cannot be read)."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return None, "no NVML (pip install nvidia-ml-py)"
    fn = getattr(nvml, "nvmlDeviceGetTotalEnergyConsumption", None)
    if fn is None:
        return None, "this pynvml has no nvmlDeviceGetTotalEnergyConsumption (pip install -U nvidia-ml-py)"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return None, f"NVML did not start ({exc})"
    index = health.nvml_index(nvml, device_index)
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        fn(handle)
    except nvml.NVMLError as exc:
        return None, f"GPU {index}'s energy counter: {_nvml_why(nvml, exc)}"
    return Counter("NVML", f"GPU {index}", lambda: (int(fn(handle)),), 1e-3, (None,), (nvml.NVMLError,)), None


def _package_zones(root: str) -> list[str]:
    """The top-level RAPL zones under `root` whose name is a package's, in their number's order."""
    zones = [z for z in glob.glob(os.path.join(root, "intel-rapl:*"))
             if re.fullmatch(r"intel-rapl:\d+", os.path.basename(z))]
    out = []
    for z in sorted(zones, key=lambda z: int(z.rsplit(":", 1)[1])):
        try:
            with open(os.path.join(z, "name")) as f:
                name = f.read().strip()
        except OSError:
            continue
        if name.startswith("package"):
            out.append(z)
    return out


def _read_int(path: str) -> int:
    with open(path) as f:
        return int(f.read().strip())


def open_rapl(root: str | None = None) -> tuple[Counter | None, str | None]:
    """(RAPL's package counters of this host under `root` (default POWERCAP), None), or (None, why they cannot be
    read)."""
    root = root or POWERCAP
    if not os.path.isdir(root):
        return None, f"no RAPL powercap on this host (no {root})"
    zones = _package_zones(root)
    if not zones:
        return None, f"no RAPL package zone on this host (no {os.path.join(root, 'intel-rapl:N')} named package-N)"
    paths = [os.path.join(z, "energy_uj") for z in zones]
    try:
        for p in paths:
            _read_int(p)
    except PermissionError:
        return None, (f"RAPL's {paths[0]} is readable by root only (Linux 5.10 on: CVE-2020-8694); a root "
                      "`chmod a+r` of it lets the run read it")
    except (OSError, ValueError) as exc:
        return None, f"RAPL's counter cannot be read ({type(exc).__name__}: {exc})"
    ranges = []
    for z in zones:
        try:
            ranges.append(_read_int(os.path.join(z, "max_energy_range_uj")) or None)
        except (OSError, ValueError):
            ranges.append(None)  # no range: a counter that goes down is reported, not taken for a wrap
    what = f"{len(zones)} CPU package{'s' if len(zones) != 1 else ''}"
    return Counter("RAPL", what, lambda: tuple(_read_int(p) for p in paths), 1e-6, tuple(ranges),
                   (OSError, ValueError)), None


def open_counter(device, nvml=None, powercap: str | None = None) -> tuple[Counter | None, str | None]:
    """This rank's counter: NVML's on CUDA, RAPL's on CPU; or None and why not."""
    if getattr(device, "type", device) == "cuda":
        return open_nvml(getattr(device, "index", None) or 0, nvml)
    return open_rapl(powercap)


# -- this rank's meter ------------------------------------------------------------------------------------------


class Meter:
    """This rank's counter over the run: `lap(step)` at each logging interval gives joules per step since the last
    one, or None (nothing measured; an interval spoiled by a counter that went backwards, reported by this rank in
    one line). `pause()` and `resume()` leave out what runs between them (an evaluation)."""

    def __init__(self, counter: Counter | None, rank: int = 0, say=None):
        self.counter, self.rank, self._say = counter, rank, say or _say
        self.mark, self.acc, self.spoiled, self.last = None, 0.0, None, 0

    def _read(self):
        try:
            return self.counter.read()
        except self.counter.errors as exc:  # the counter is gone (the driver, the file): said once, read no more
            self._say(f"scalec: energy: rank {self.rank}: {self.counter.source}'s counter of {self.counter.what} "
                      f"cannot be read any more ({exc}) — energy not measured from here on")
            self.counter = None
            return None

    def start(self, step: int) -> None:
        """The run's first interval begins after step `step` (the step it resumed from, or 0)."""
        self.last = step
        if self.counter is not None:
            self.mark = self._read()

    def _add(self, now) -> None:
        try:
            self.acc += joules(self.mark, now, self.counter.ranges, self.counter.unit)
        except Backwards as exc:
            self.spoiled = f"{self.counter.source}'s counter of {self.counter.what} went backwards ({exc}"
            self.spoiled += ("; the driver reloaded?)" if self.counter.source == "NVML"
                             else "; no max_energy_range_uj to undo a wrap)")

    def pause(self) -> None:
        """Leave out what follows until `resume` (after the device has finished the steps before it)."""
        if self.counter is None or self.mark is None:
            return
        now = self._read()
        if now is not None:
            self._add(now)
        self.mark = None

    def resume(self) -> None:
        if self.counter is not None:
            self.mark = self._read()

    def lap(self, step: int) -> float | None:
        """Joules per step of the steps after the last lap up to `step` (once the device has finished them)."""
        first, self.last = self.last + 1, step
        if self.counter is None:
            return None
        now = self._read()
        if now is None:
            return None
        if self.mark is not None:
            self._add(now)
        value = self.acc / (step - first + 1) if self.spoiled is None and step >= first else None
        if self.spoiled is not None:
            self._say(f"scalec: energy: rank {self.rank}: {self.spoiled} — steps {first}-{step} not measured")
        self.mark, self.acc, self.spoiled = now, 0.0, None
        return value


# -- rank 0's lines (pure: the gathered values and each rank's description) -------------------------------------


def _ranks(ranks: list[int]) -> str:
    """`rank 3` or `ranks 0-3, 6`."""
    runs, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            runs.append(f"{start}" if start == r else f"{start}-{r}")
            start = None
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(runs)


def _hosts(world: list[dict], ranks) -> dict:
    """host -> the job's ranks on it, for the given ranks."""
    out: dict = {}
    for r in ranks:
        out.setdefault(world[r]["host"], []).append(r)
    return out


def startup_line(world: list[dict]) -> str:
    """Rank 0's one line, once per run: what measures energy on which ranks, and why the others do not. `world[r]`:
    rank r's {"source" (NVML, RAPL or None), "what", "missing" (why not, or None), "host"}."""
    measured = [r for r, w in enumerate(world) if w["source"]]
    why: dict = {}
    for r, w in enumerate(world):
        if not w["source"]:
            why.setdefault(w["missing"], []).append(r)
    if not measured:
        if len(why) == 1:
            on = f" on any of the {len(world)} ranks" if len(world) > 1 else ""
            return f"scalec: energy: not measured{on}: {next(iter(why))}"
        return "scalec: energy: not measured: " + "; ".join(f"{_ranks(rs)}: {reason}" for reason, rs in why.items())
    missing = "; ".join(f"{_ranks(rs)} ({reason})" for reason, rs in why.items())
    sources = {world[r]["source"] for r in measured}
    parts = []
    if "NVML" in sources:
        gpus = [r for r in measured if world[r]["source"] == "NVML"]
        parts.append(f"measured by NVML's total energy counter of each rank's own GPU on {len(gpus)} of "
                     f"{len(world)} ranks")
    if "RAPL" in sources:
        cpus = [r for r in measured if world[r]["source"] == "RAPL"]
        hosts = _hosts(world, cpus)
        shared = ", ".join(f"{h}: {world[rs[0]]['what']}, {len(rs)} rank{'s' if len(rs) != 1 else ''}"
                           for h, rs in hosts.items())
        parts.append(f"measured by RAPL (powercap) on {len(hosts)} host{'s' if len(hosts) != 1 else ''} ({shared}): "
                     "whole sockets, every process on them counts, not this job alone; each host's figure is its "
                     "packages', shared by the job's ranks there, not divided among them")
    line = "scalec: energy: " + "; ".join(parts)
    return line + (f"; not measured on {missing}" if why else "")


def interval(values: list, world: list[dict], predicted: dict, first: int, last: int) -> tuple[dict, str]:
    """Rank 0's figures of one logging interval (steps `first`-`last`) from every rank's joules per step (`values[r]`,
    None where not measured): the metrics record's fields and the log line. The job's sum takes each GPU once and
    each host's packages once. `predicted`: pp rank -> joules per device per step (empty: no prediction)."""
    measured = [r for r, v in enumerate(values) if v is not None]
    if not measured:
        return {}, f"scalec: energy steps {first}-{last}: not measured on any rank"
    gpus = [r for r in measured if world[r]["source"] == "NVML"]
    hosts = _hosts(world, [r for r in measured if world[r]["source"] == "RAPL"])
    gpu_sum = sum(values[r] for r in gpus)
    host_sum = sum(values[rs[0]] for rs in hosts.values())
    fields = {"energy_window": [first, last]}
    if values[0] is not None:
        fields["energy_j_per_step"] = values[0]
    fields["energy_j_per_step_sum"] = gpu_sum + host_sum
    parts = []
    if gpus:
        mine = f"rank 0 {values[0]:,.1f} J/step, " if world[0]["source"] == "NVML" and values[0] is not None else ""
        parts.append(f"{mine}{len(gpus)} of {len(world)} ranks {gpu_sum:,.1f} J/step (NVML, each rank's GPU)")
    if hosts:
        on = sum(1 for w in world if w["host"] in hosts)
        whose = "hosts'" if len(hosts) != 1 else "host's"
        parts.append(f"{host_sum:,.1f} J/step on {len(hosts)} {whose} CPU packages "
                     f"(RAPL: whole sockets, shared by the job's {on} rank{'s' if on != 1 else ''} there)")
    line = f"scalec: energy steps {first}-{last}: " + "; ".join(parts)
    if predicted:
        stages = []
        for p in sorted(predicted):
            mine = [values[r] for r in gpus if world[r].get("pp", 0) == p]
            if mine and predicted[p] > 0:
                m = sum(mine) / len(mine)
                stages.append(f"pp {p} {m:,.1f} J/step per GPU, predicted {predicted[p]:,.1f} "
                              f"({m / predicted[p]:.2f}×)")
        if stages:
            line += "; " + "; ".join(stages)
        want = [predicted.get(w.get("pp", 0)) for w in world]
        if gpus and all(predicted.get(world[r].get("pp", 0)) for r in gpus):
            fields["energy_measured_over_predicted"] = gpu_sum / sum(predicted[world[r].get("pp", 0)] for r in gpus)
        if hosts and len(hosts) == len({w["host"] for w in world}) and all(want):
            fields["energy_measured_over_predicted"] = host_sum / sum(want)
            devices = f"{len(world)} device{'s' if len(world) != 1 else ''}"
            line += (f"; predicted {sum(want):,.1f} J/step for the job's {devices} "
                     f"({host_sum / sum(want):.2f}×: the packages' whole draw against the plan's devices)")
        elif not stages:
            line += "; no prediction for the ranks measured"
    return fields, line


# -- what the trainer holds -------------------------------------------------------------------------------------


class Energy:
    """The job's energy measurement as one rank sees it: this rank's `Meter`, every rank's description (gathered
    once at start-up, and the start-up line printed on rank 0), and at each logging interval `lap`: the gather of
    every rank's joules per step to rank 0, rank 0's fields for the metrics record, and its line, printed by `say`
    (below the step's line and its evaluation's). Every rank calls each method at the same steps (the log's
    condition is the same everywhere)."""

    def __init__(self, cfg, ctx, start: int, nvml=None, powercap: str | None = None, say=None):
        self.ctx, self._say, self.line = ctx, say or _say, None
        counter, missing = open_counter(ctx.device, nvml, powercap)
        self.meter = Meter(counter, ctx.rank, self._say)
        me = {"source": counter and counter.source, "what": counter and counter.what, "missing": missing,
              "host": socket.gethostname(), "pp": ctx.coords.get("pp", 0)}
        self.world = [me]
        if ctx.world_size > 1:
            import torch.distributed as dist
            from runtime import faults
            self.world = [None] * ctx.world_size
            with faults.op("the energy meters' start-up (what each rank measures)", faults.scale()):
                dist.all_gather_object(self.world, me)
        self.on = any(w["source"] for w in self.world)  # else no rank gathers anything, ever
        self.predicted = dict(cfg.predicted_joules_per_step)
        if ctx.is_logger:
            self._say(startup_line(self.world))
        self.meter.start(start)

    def pause(self) -> None:
        self.meter.pause()

    def resume(self) -> None:
        self.meter.resume()

    def lap(self, step: int) -> dict:
        """At a logging interval's last step `step` (every rank): rank 0's metrics fields (its line kept for
        `say`); {} on the other ranks and where no rank measures."""
        if not self.on:
            return {}
        first = self.meter.last + 1
        value = self.meter.lap(step)
        values = [value]
        if self.ctx.world_size > 1:
            import torch
            import torch.distributed as dist
            from runtime import faults
            mine = torch.tensor([math.nan if value is None else value], dtype=torch.float64, device=self.ctx.device)
            every = [torch.empty_like(mine) for _ in range(self.ctx.world_size)] if self.ctx.is_logger else None
            with faults.op("the energy meters' gather (to rank 0)", faults.scale()):
                dist.gather(mine, every, dst=0)
            if self.ctx.is_logger:
                values = [None if math.isnan(v) else v for v in torch.cat(every).tolist()]
        if not self.ctx.is_logger:
            return {}
        fields, self.line = interval(values, self.world, self.predicted, first, step)
        return fields

    def say(self) -> None:
        """Print the last interval's line, once (rank 0; nothing elsewhere or when none is waiting)."""
        if self.line:
            self._say(self.line)
            self.line = None
