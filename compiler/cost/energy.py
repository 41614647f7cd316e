"""Energy, dollars and carbon of a plan: per step from the step-time model's phases, per run with the goodput
model's lost time. Torch-free.

Per step, per kind of rank (compiler/cost/step_time.py RankTime: every rank, or each pp rank; `world / pp` devices
of each kind), its step of `T` seconds (the slowest rank's end, the step time) cut into four phases:
- active: computing, `compute_s` less the collectives on its critical path, plus the optimizer and the runtime's
  own per-step work (`tail_s`);
- communicating: the collectives the rank waits in: tensor, expert and context parallelism's inside its compute,
  the pipeline sends the schedule exposes, data parallelism's exposed synchronisation after the pipeline, and
  offload's host<->device copies the step waits for (exposed "host": compiler/cost/offload.py);
- bubble: waiting in the pipeline schedule for another stage (`idle_s` less the exposed sends);
- waiting: the rest of the step, after its own end, for the slowest rank (the next step's first collective).
A device draws `active_w`, `communicating_w` or `idle_w` in each (compiler/layout/power.py); every node draws
`host_w + network_w` for the whole step; the facility multiplies it all by its PUE:

    E_step = PUE · (Σ_kinds n_k · (P_a·t_active + P_c·t_comm + P_i·(t_bubble + t_wait)) + nodes · (P_host + P_net) · T)

The bubble's own line (Perseus's "intrinsic bloat" is the energy a pipeline spends because its stages are not
balanced: here what its devices draw idling in the schedule) is PUE · Σ n_k · P_i · t_bubble; a straggler's (the
"extrinsic bloat"): one rank at the detection threshold's speed `s` (the resilience section's, 0.8 by default)
stretches the step by its active time × (1/s − 1), during which it computes and every other device idles.

Per run, `steps` steps (`train { steps }`, or `tokens` over a step's tokens), with the goodput model's ETTR
(compiler/cost/goodput.py: the share of wall time that trains, saves, rework and restarts being the rest):
wall = steps · T / ETTR (a program that checkpoints nothing during the run is priced at the best interval's
ETTR, as it would be run); GPU-hours = devices · wall / 3600; energy = E_step · steps / ETTR (the lost time drawn at
the step's average power: restarts draw less, rework the same); dollars = GPU-hours · price per device-hour (a
rental price includes power and facility); carbon = energy · the grid's intensity (location-based, operational
only: the hardware's embodied carbon is not counted).
"""
from __future__ import annotations

from dataclasses import dataclass

from compiler.layout import power as POWER

J_PER_KWH = 3.6e6


@dataclass(frozen=True)
class Phases:
    """One kind of rank's step, in seconds per phase, and what one of its devices draws over it (joules)."""

    who: str
    devices: int
    active_s: float
    communicating_s: float
    bubble_s: float
    waiting_s: float
    joules: float

    def as_json(self) -> dict:
        return {"who": self.who, "devices": self.devices, "active_s": self.active_s,
                "communicating_s": self.communicating_s, "bubble_s": self.bubble_s, "waiting_s": self.waiting_s,
                "joules_per_device": self.joules}


@dataclass(frozen=True)
class Step:
    """One step's energy and price, every input beside what it makes."""

    seconds: float
    ranks: tuple                   # Phases per kind of rank
    devices: int
    nodes: int
    power: POWER.Power
    devices_j: float               # the devices, before PUE
    hosts_j: float                 # the nodes' hosts, before PUE
    network_j: float
    bubble_j: float                # with PUE
    straggler_j: float             # with PUE: one rank at the detection threshold's speed, this much more a step
    straggler_s: float             # and the step this much longer
    threshold: float
    tokens: int
    model_flops: float

    @property
    def it_j(self) -> float:
        return self.devices_j + self.hosts_j + self.network_j

    @property
    def joules(self) -> float:
        """The facility's energy per step."""
        return self.it_j * self.power.pue

    @property
    def usd(self) -> float:
        return self.devices * self.seconds / 3600 * self.power.usd_per_gpu_hour

    @property
    def watts(self) -> float:
        return self.joules / self.seconds if self.seconds > 0 else 0.0

    def as_json(self) -> dict:
        """plan.json's "step": "seconds", "joules" and "usd" are what tools read (docs/planning.md)."""
        return {"seconds": self.seconds, "joules": self.joules, "usd": self.usd, "watts": self.watts,
                "devices_joules": self.devices_j, "hosts_joules": self.hosts_j, "network_joules": self.network_j,
                "bubble_joules": self.bubble_j, "straggler_joules": self.straggler_j,
                "straggler_seconds": self.straggler_s, "straggler_threshold": self.threshold,
                "ranks": [r.as_json() for r in self.ranks]}


@dataclass(frozen=True)
class Run:
    """The whole run: `steps` steps at the step's figures, stretched by the goodput model's ETTR."""

    step: Step
    steps: int
    tokens_written: int | None     # `tokens` as written (None: `steps` was)
    ettr: float
    ettr_note: str = ""            # whose ETTR: the program's checkpoints, or the best interval's where it has none

    @property
    def wall_s(self) -> float:
        return self.steps * self.step.seconds / self.ettr if self.ettr > 0 else float("inf")

    @property
    def days(self) -> float:
        return self.wall_s / 86400

    @property
    def gpu_hours(self) -> float:
        return self.step.devices * self.wall_s / 3600

    @property
    def joules(self) -> float:
        return self.step.joules * self.steps / self.ettr if self.ettr > 0 else float("inf")

    @property
    def kwh(self) -> float:
        return self.joules / J_PER_KWH

    @property
    def usd(self) -> float:
        return self.gpu_hours * self.step.power.usd_per_gpu_hour

    @property
    def tco2e(self) -> float:
        return self.kwh * self.step.power.grid_g_per_kwh / 1e6

    @property
    def tokens(self) -> int:
        return self.steps * self.step.tokens

    @property
    def tokens_per_joule(self) -> float:
        return self.tokens / self.joules if self.joules > 0 else 0.0

    @property
    def flops_per_joule(self) -> float:
        return self.steps * self.step.model_flops / self.joules if self.joules > 0 else 0.0

    def as_json(self) -> dict:
        """plan.json's "run": the first seven keys are what tools read (docs/planning.md)."""
        return {"steps": self.steps, "days": self.days, "gpu_hours": self.gpu_hours, "kwh": self.kwh,
                "usd": self.usd, "tco2e": self.tco2e, "tokens_per_joule": self.tokens_per_joule,
                "tokens": self.tokens, "model_flops_per_joule": self.flops_per_joule, "ettr": self.ettr,
                "wall_s": self.wall_s}


def phases(rank, step_s: float) -> tuple:
    """(active, communicating, bubble, waiting) seconds of one kind of rank (step_time.RankTime) in a step of
    `step_s`: see the module's docstring. Every phase is at least 0 and they sum to `step_s`."""
    exposed = rank.exposed_comm_s
    sends = exposed.get("pp", 0.0)
    host = exposed.get("host", 0.0)  # offload's copies the step waits for, after the compute (step_time.py)
    inside = max(sum(exposed.values()) - rank.sync_s - sends - host, 0.0)  # tp, ep, cp: on the compute's path
    active = max(rank.compute_s - inside, 0.0) + rank.tail_s
    communicating = inside + sends + rank.sync_s + host
    bubble = max(rank.idle_s - sends, 0.0)
    waiting = max(step_s - active - communicating - bubble, 0.0)
    return active, communicating, bubble, waiting


def step(prediction, cluster, est, threshold: float = 0.8) -> Step:
    """The energy and price of one step of a plan: `prediction` (step_time.Prediction) of a plan on `cluster`
    (compiler/layout/cluster.py; its Power, or its device's defaults), `est` its cost.Estimate (tokens and model
    FLOPs per step), `threshold` the straggler detection's (a rank's speed relative to the fastest)."""
    pw = POWER.of(cluster)
    T = prediction.step_time_s
    world = cluster.world_size
    each = max(world // max(len(prediction.ranks), 1), 1)
    kinds, devices_j, bubble_j, slowest = [], 0.0, 0.0, 0.0
    last = max((r.end_s for r in prediction.ranks), default=T)
    for r in prediction.ranks:
        a, c, b, w = phases(r, T)
        j = pw.active_w * a + pw.communicating_w * c + pw.idle_w * (b + w)
        kinds.append(Phases(r.who, each, a, c, b, w, j))
        devices_j += each * j
        bubble_j += each * pw.idle_w * b
        if r.end_s >= last * (1 - 1e-12):  # a rank that ends the step (the busiest of them) sets the straggler's
            slowest = max(slowest, a)
    node_w = pw.host_w + pw.network_w
    extra = slowest * (1.0 / threshold - 1.0) if 0 < threshold < 1 else 0.0
    straggler_j = extra * (pw.active_w + (world - 1) * pw.idle_w + cluster.nodes * node_w) * pw.pue
    return Step(seconds=T, ranks=tuple(kinds), devices=world, nodes=cluster.nodes, power=pw, devices_j=devices_j,
                hosts_j=cluster.nodes * pw.host_w * T, network_j=cluster.nodes * pw.network_w * T,
                bubble_j=bubble_j * pw.pue, straggler_j=straggler_j, straggler_s=extra, threshold=threshold,
                tokens=int(est.tokens_step), model_flops=float(est.flops_step_n))


def run(step_energy: Step, steps: int, ettr: float, tokens: int | None = None, note: str = "") -> Run:
    return Run(step=step_energy, steps=steps, tokens_written=tokens, ettr=ettr, ettr_note=note)


def ettr_of(g) -> tuple:
    """(ETTR, what it is) of a goodput.Goodput for pricing a run: the program's, where it checkpoints during the
    run; otherwise the best interval's (a run with no checkpoint to resume from is priced as it would be run, not
    as the endless restarts of one that has none)."""
    if g is None:
        return 1.0, "no failure model"
    if g.checkpoints and g.interval_s is not None:
        return g.ettr, "as the program checkpoints"
    return g.ettr_best, "the best checkpoint interval's: the program saves none during the run"


def priced(spec, plan, est, prediction) -> Run:
    """The run of `plan` (decided) on `spec`'s cluster: its `prediction`'s step (est: its cost.Estimate) at the
    straggler detection's threshold (0.8 where detection is off), `train`'s steps, the goodput model's ETTR. What
    `plan` prints (`of`) and what `search --minimize` ranks (compiler/search/objective.py)."""
    from compiler.cost import goodput as GP
    r = spec.resilience
    threshold = r.threshold if getattr(r, "detect", True) else 0.8
    s = step(prediction, spec.cluster, est, threshold)
    ettr, note = ettr_of(GP.goodput(spec, plan, est, prediction.step_time_s))
    return run(s, spec.train.steps, ettr, spec.train.tokens, note)


def of(compiled) -> Run | None:
    """The compiled plan's run (`priced`); None without a decided plan."""
    if compiled.plan is None:
        return None
    return priced(compiled.spec, compiled.plan, compiled.costs, compiled.costs.step)
