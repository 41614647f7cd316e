"""Naming the straggler: per-rank section times (runtime.sections) gathered to rank 0 every `window` steps, scored as
NVIDIA's resiliency extension scores them, and a what-if from the schedule's own timing model.

Scores (NVRx's meaning; 1.0 is as fast as the reference, 0.5 twice as slow):
- relative: the fastest rank doing the same work over this rank. "The same work" is the ranks of the same pipeline
  stage (every rank without pp): they run the same layers on batches of the same shape. Scored per compute section
  (data, forward, backward, optimizer) and over the step's compute (`compute`).
- individual: this rank's own best window over its current one, per section likewise.
A rank whose relative score of its step's compute (forward + backward + optimizer; its data section too where that
takes at least SIGNIFICANT of the compute) falls below `threshold` is named, and the compute section it scores lowest
in is quoted as the slow one. The times compared are the mean of the faster half of each rank's steps of the window
(relative_scores, fastest_steps).
The individual score names a rank only where nothing is relative to it (a group of one rank: pp without dp), and
not while the other ranks' median individual score is below the threshold too: a busier machine slows everyone, a
straggler slows one. Waits never name: at a synchronising collective every peer waits for the slow rank, so their
waits grow while its compute grows; the waits are only quoted, to explain what the straggler costs the others.

The what-if replays the median step of the episode (the windows in a row that named the same ranks) with the
straggler's compute replaced by the median of its peers', the other ranks at their group's typical speed (_typical):
without pp, the step ends when the slowest rank reaches the synchronising collective (the longest compute plus the
transfers: the least any rank waits, since the last rank to arrive waits for nobody); with pp, runtime.schedule_time
times the schedule's action lists (the compiler's model) with each stage's measured forward and backward per
micro-batch.
"""
from __future__ import annotations

import bisect
import json
import os
import socket
import statistics

import torch
import torch.distributed as dist

from runtime import faults, health, leaving, node_record, sections
from runtime.sections import COMPUTE, INDEX, SECTIONS, WAITS

SIGNIFICANT = 0.10
"""A compute section is quoted as the slow one, and the data section names a rank on its own, only where it takes
at least this share of the step (the group's median): a section of a fraction of a millisecond is mostly the
clock's noise."""
STEP_COMPUTE = ("forward", "backward", "optimizer")
"""The step's compute: the sum that names a rank (`compute`)."""
SCORED = COMPUTE + ("compute",)
_STEP_COMPUTE = [INDEX[s] for s in STEP_COMPUTE]
_WAITS = [INDEX[s] for s in WAITS]
SUSTAINED = 6
"""Windows over which a slowdown too small for one window's noise is averaged: a rank whose relative naming score
averages below `sustained_threshold` over the last SUSTAINED windows is named too (a slow rank's degradation that
grows, the ramp drill's, is named at half the slowdown one window needs): reported, not acted on (Detector.score).
Measured on this 2-core machine's 8-rank drills (bench/straggler_drill.py), in a quiet spell: one window's relative
score of a clean rank falls to 0.81, the mean of six to 0.94; in a busy spell of the host a clean rank's mean of six
fell to 0.88."""


def sustained_threshold(threshold: float) -> float:
    """The mean relative score over SUSTAINED windows below which a rank is named: halfway from `threshold` to 1
    (0.9 for the default 0.8)."""
    return (1.0 + threshold) / 2


# -- scores (pure functions of the gathered tables) --------------------------------------------------------------


def fastest_steps(n: int) -> int:
    """How many of a window's `n` steps the scores compare (`best`): the faster half. Other processes on a host
    only ever add time to some steps, while a slow device is slow in every step, so the faster steps are the
    steadiest measure of a rank's speed; the mean of the faster half is steadier than the single fastest step (a
    minimum of noisy draws) and, unlike the mean of all, leaves out up to half the steps slowed by something else.
    Measured on the ramp drill's 400 windows before its onset (8 ranks on this 2-core machine): a rank's compute
    over its peers' median varied by 2.7% (standard deviation) with the fastest step, 1.9% with the mean of the
    fastest 3 and 1.6% with the faster half's, and its largest excursion fell from 9.1% to 5.2%; replayed through
    the detector, 20 recorded ramps were named inside the drill's band in 13 with the fastest step, 19 with the
    fastest 3 and 20 with the faster half."""
    return max(1, (n + 1) // 2)


def window_stats(table) -> list[dict]:
    """Per rank (`table[rank][step][column]`, columns in SECTIONS' order; a nested list or a tensor): each
    section's median seconds per step over the window, `compute` (forward + backward + optimizer), `waits` (every
    wait) and `step` (every section), the medians the what-if replays; and under "best" each scored section's mean
    over the faster half of the window's steps (fastest_steps), which the scores compare (below). One sort over all
    ranks, steps and figures at once: rank 0 reads thousands of ranks' windows."""
    t = torch.as_tensor(table, dtype=torch.float64)  # rank × step × section
    n, width = t.shape[1], t.shape[2]
    # the window's sums per step beside its sections, sorted along the steps once: each median is the mean of the
    # middle two of an even count (as statistics.median), the fastest steps the first (torch.quantile sorted again
    # per figure: 0.8 ms a window of one rank, most of the detector's time)
    sums = torch.stack([t[:, :, _STEP_COMPUTE].sum(-1), t[:, :, _WAITS].sum(-1), t.sum(-1)], dim=2)
    ordered = torch.cat([t, sums], dim=2).sort(dim=1).values
    medians = ((ordered[:, (n - 1) // 2] + ordered[:, n // 2]) / 2).tolist()
    fastest = ordered[:, :fastest_steps(n)].mean(dim=1).tolist()
    out = []
    for r in range(t.shape[0]):
        stats = dict(zip(SECTIONS, medians[r][:width]))
        stats["compute"] = sum(stats[s] for s in STEP_COMPUTE)
        stats["waits"], stats["step"] = medians[r][width + 1], medians[r][width + 2]
        stats["best"] = {s: fastest[r][INDEX[s]] for s in COMPUTE}
        stats["best"]["compute"] = fastest[r][width]
        out.append(stats)
    return out


def _ratio(best: float, mine: float) -> float:
    return min(1.0, best / mine) if mine > 0 else 1.0


def relative_scores(stats: list[dict], groups: list[int]) -> list[dict]:
    """Per rank and scored section: the fastest of its group (`groups[rank]`: ranks of equal value do the same
    work) over its own time. The times compared are each rank's faster steps of the window (`best`, fastest_steps):
    other processes on a host only ever add time to some steps, while a slow device is slow in every step, its
    fastest too (on this 2-core machine the window's median moves ±15% between ranks with nothing slowed; the
    fastest step, ±10%)."""
    fastest = {}
    for r, g in enumerate(groups):
        for k in SCORED:
            fastest[g, k] = min(fastest.get((g, k), float("inf")), stats[r]["best"][k])
    return [{k: _ratio(fastest[groups[r], k], stats[r]["best"][k]) for k in SCORED} for r in range(len(stats))]


def _keep_least(least: list, figures: list[dict], keys) -> list:
    """Per rank, each of `keys`' least value so far (`least`, updated in place with this window's `figures`)."""
    for r, f in enumerate(figures):
        if r >= len(least):
            least.append({})
        for k in keys:
            least[r][k] = min(least[r].get(k, float("inf")), f[k])
    return least


def individual_scores(stats: list[dict], best: list[dict]) -> list[dict]:
    """Per rank and scored section: its best window so far (`best`, updated in place with this one) over this."""
    _keep_least(best, [s["best"] for s in stats], SCORED)
    return [{k: _ratio(best[r][k], stats[r]["best"][k]) for k in SCORED} for r in range(len(stats))]


def significant(stats: list[dict], groups: list[int]) -> dict:
    """Per group: the compute sections that take at least SIGNIFICANT of its ranks' median compute (data, forward,
    backward, optimizer). The share is of the compute, not of the step: the waits are another clock's on CPU
    (runtime.sections), and on a busy host they are most of a step."""
    members: dict = {}
    for r, g in enumerate(groups):
        members.setdefault(g, []).append(stats[r])
    out = {}
    for g, ss in members.items():
        compute = statistics.median(sum(s[k] for k in COMPUTE) for s in ss)
        out[g] = [k for k in COMPUTE if statistics.median(s[k] for s in ss) >= SIGNIFICANT * compute]
    return out


def naming_score(scores: dict, significant: list[str]) -> float:
    """The score that names a rank: its step's compute, or its data section where that is significant (a slow
    loader is no part of the compute)."""
    return min([scores["compute"]] + ([scores["data"]] if "data" in significant else []))


def stragglers(stats: list[dict], groups: list[int], relative: list[dict], individual: list[dict],
               threshold: float, sig: dict | None = None, history: list | None = None) -> list[dict]:
    """The named ranks, each {"rank", "score" (its naming score), "kind" (relative, sustained or individual),
    "section" (the significant compute section it scores lowest in, the one quoted as slow), "section_score",
    "relative", "individual"}, by the rules of the module's docstring. `sig`: `significant(stats, groups)`, where the
    caller has it. `history`: the relative naming scores of the last windows, this one's last (one list of ranks'
    each); with SUSTAINED of them, a rank of a group of more than one whose mean is below
    `sustained_threshold(threshold)` is named ("sustained", its score that mean)."""
    named = []
    size = {g: groups.count(g) for g in groups}
    sig = significant(stats, groups) if sig is None else sig
    others_median = None
    lasting = history is not None and len(history) >= SUSTAINED
    for r in range(len(stats)):
        keys = sig[groups[r]]
        kind, scores = "relative", relative[r]
        if size[groups[r]] == 1:
            if others_median is None:
                others_median = _others_median([s["compute"] for s in individual])
            if others_median[r] is not None and others_median[r] < threshold:  # the others too: the job, not it
                continue
            kind, scores = "individual", individual[r]
        score = naming_score(scores, keys)
        if score >= threshold and kind == "relative" and lasting:
            mean = statistics.fmean(h[r] for h in history[-SUSTAINED:])
            if mean < sustained_threshold(threshold):
                kind, score = "sustained", mean
        if score < threshold or kind == "sustained":
            low = min(keys or ["compute"], key=lambda k: scores[k])
            named.append({"rank": r, "score": score, "kind": kind, "section": low, "section_score": scores[low],
                          "relative": relative[r]["compute"], "individual": individual[r]["compute"]})
    return named


def _others_median(values: list[float]) -> list:
    """For each index, the median of the values at the other indices (None with no other): one sort."""
    n = len(values)
    if n == 1:
        return [None]
    order, m = sorted(values), n - 1
    out = []
    for v in values:
        i = bisect.bisect_left(order, v)  # the remaining list: order without position i

        def at(j):
            return order[j] if j < i else order[j + 1]
        out.append(at(m // 2) if m % 2 else (at(m // 2 - 1) + at(m // 2)) / 2)
    return out


# -- the what-if --------------------------------------------------------------------------------------------------


def _typical(stats: list[dict], groups: list[int], slow: set) -> list[dict]:
    """`stats` with every rank not in `slow` at its group's median over the ranks not in `slow`, in each compute
    section. Ranks doing the same work on the same kind of device differ within a window mostly by noise, not by
    speed (the ramp drill's windows before its onset, 8 ranks on this 2-core machine: a rank's compute over its
    peers' median varies by 1.6% from window to window and by 0.6% from rank to rank), so the what-if takes them at
    their typical speed: as the slowest of them, the step would read the noise as time the straggler did not
    cost."""
    members: dict = {}
    for r, g in enumerate(groups):
        if r not in slow:
            members.setdefault(g, []).append(r)
    median = {(g, k): statistics.median(stats[q][k] for q in rs) for g, rs in members.items() for k in COMPUTE}
    out = [dict(s) for s in stats]
    for r, g in enumerate(groups):
        if r not in slow:
            out[r].update({k: median[g, k] for k in COMPUTE})
            out[r]["compute"] = sum(out[r][k] for k in STEP_COMPUTE)
    return out


def _replaced(stats: list[dict], groups: list[int], slow: set, best: list | None = None) -> list[dict]:
    """`stats` with each slow rank's compute sections the median of its group's other ranks'; a rank alone in its
    group gets its own best window's (`best`: best_windows' table), or keeps its own without one."""
    out = [dict(s) for s in stats]
    for r in slow:
        peers = [q for q in range(len(stats)) if groups[q] == groups[r] and q not in slow]
        for k in COMPUTE:
            out[r][k] = (statistics.median(stats[q][k] for q in peers) if peers
                         else best[r][k] if best else stats[r][k])
        out[r]["compute"] = sum(out[r][k] for k in STEP_COMPUTE)
    return out


def best_windows(stats: list[dict], best: list) -> list:
    """Per rank and compute section, the least of its windows' medians so far (`best`, updated in place with this
    window's and returned): a rank alone in its group is replaced in the what-if by its own best window."""
    return _keep_least(best, stats, COMPUTE)


def modelled_step(stats: list[dict], pipeline=None) -> float:
    """The step the model gives for these per-rank times. No pp: the slowest rank's compute (the sum of its compute
    sections) plus the collectives' transfer, the least any rank waits (the last to arrive waits for nobody; the
    others' waits hold their wait for it, and on a busy host the scheduler's noise). With pp (`pipeline`: (order,
    layout, pipes, actions) where `pipes` lists each pipeline's ranks by pp coordinate and `actions[rank]` its
    counts of F, B, W actions): each pipeline's schedule timed by runtime.schedule_time with each stage's forward
    and backward per micro-batch, plus the slowest rank's compute outside the schedule (data, optimizer)."""
    if pipeline is None:
        return max(sum(s[k] for k in COMPUTE) for s in stats) + min(s["waits"] for s in stats)
    from runtime import schedule_time
    order, lay, pipes, actions = pipeline
    steps = schedule_time.steps(order, lay)
    longest = 0.0
    for ranks in pipes:
        cost = {"F": [0.0] * lay.stages, "B": [0.0] * lay.stages, "I": [0.0] * lay.stages, "W": [0.0] * lay.stages}
        for st in range(lay.stages):
            r = ranks[lay.rank_of(st)]
            n_f, n_b, n_w = actions[lay.rank_of(st)]
            cost["F"][st] = stats[r]["forward"] / max(1, n_f)
            per_b = stats[r]["backward"] / max(1, n_b + n_w)  # a split backward: its halves alike
            cost["B"][st] = cost["I"][st] = cost["W"][st] = per_b
        longest = max(longest, max(schedule_time.timed(steps, lay, cost).values()))
    outside = max(stats[r]["data"] + stats[r]["optimizer"] for r in range(len(stats)))
    return longest + outside


def what_if(stats: list[dict], groups: list[int], slow: set, pipeline=None,
            best: list | None = None) -> tuple[float, float, float]:
    """(measured step, predicted step without the `slow` ranks, seconds lost per step): the model's step with the
    window's median times (each other rank at its group's typical speed: _typical) less its step with the slow
    ranks' compute replaced by their peers' median (`best`: best_windows' table, for a rank alone in its group)."""
    measured = statistics.median(s["step"] for s in stats)
    typical = _typical(stats, groups, slow)
    lost = max(0.0, modelled_step(typical, pipeline) - modelled_step(_replaced(typical, groups, slow, best), pipeline))
    return measured, measured - lost, lost


class Episode:
    """The windows in a row that named the same ranks: each rank's figures (the medians the what-if replays; not
    `best`, which only the scores read) summed, so that the what-if can read their mean (`mean`) at the cost of one
    window's figures whatever the episode's length. The what-if of one window of 10 steps moves by a tenth from
    window to window on this machine; over the episode it settles."""

    def __init__(self, slow: set, first: int):
        self.slow, self.first, self.n = frozenset(slow), first, 0
        self.total: list[dict] = []

    def add(self, stats: list[dict]) -> None:
        figures = [{k: v for k, v in s.items() if k != "best"} for s in stats]
        if self.total:
            for tot, f in zip(self.total, figures):
                for k, v in f.items():
                    tot[k] += v
        else:
            self.total = figures
        self.n += 1

    def mean(self) -> list[dict]:
        return [{k: v / self.n for k, v in tot.items()} for tot in self.total]


def pipeline_model(parallel, world: list[dict]):
    """`modelled_step`'s pipeline argument for a plan with pp (`world`: each rank's coordinates), else None."""
    from runtime import schedule
    pp = next((k for a, k in parallel.axes if a == "pp"), 1)
    if pp <= 1:
        return None
    lay = schedule.Layout.of(parallel.schedule, pp, parallel.virtual_stages, parallel.micro_batches)
    order = schedule.compute_order(parallel.schedule, lay)
    rows: dict = {}
    for r, coords in enumerate(world):
        key = tuple(sorted((a, i) for a, i in coords.items() if a != "pp"))
        rows.setdefault(key, [None] * pp)[coords.get("pp", 0)] = r
    kinds = {p: [x.kind for a in order[p] for x in a.parts] for p in range(pp)}  # an overlap: its two
    actions = {p: (k.count("F"), k.count("B") + k.count("I"), k.count("W")) for p, k in kinds.items()}
    return order, lay, list(rows.values()), actions


REMEMBERED = 2
"""Earlier attempts in which the node record found a node slow or unhealthy (or, in a row, crashing) for it to be
left out at start-up."""


# -- the detector the trainer runs -------------------------------------------------------------------------------


class Detector:
    """This rank's timeline and, every `window` steps, the gather to rank 0, its scores, its log line, its
    metrics; `act` on a named straggler as `on_straggler` says."""

    def __init__(self, cfg, ctx, track):
        res = cfg.resilience
        self.cfg, self.ctx, self.track = cfg, ctx, track
        self.threshold, self.window, self.on_straggler = res.threshold, res.window, res.on_straggler
        self.exclude = res.exclude
        self.timeline = sections.Timeline(ctx.device)
        self.slow = sections.start_slow(ctx.rank, ctx.device, ctx.world_size)
        self.best: list = []     # rank 0: each rank's best window (individual_scores)
        self.best_medians: list = []  # rank 0: each rank's least window medians (best_windows: the what-if's)
        self.episode: Episode | None = None  # rank 0: the windows in a row that named the same ranks
        self.history: list = []  # rank 0: the last SUSTAINED windows' relative naming scores (`stragglers`)
        self.pending: dict = {}  # the last window's figures, for the next metrics record
        self.verdict: str = ""   # rank 0: why a node is being left out (runtime.leaving), once asked
        self.named_before: set = set()  # rank 0: the ranks the last window named
        self.marked: set = set()  # rank 0: (node, kind) already in the node record this attempt: marked once
        me = {"node": int(os.environ.get("GROUP_RANK", "0")), "host": socket.gethostname(),
              "name": node_record.node_name(), "device": str(ctx.device), "coords": dict(ctx.coords),
              "crashed": node_record.crash_report()}
        world = [None] * ctx.world_size
        if ctx.world_size > 1:
            with faults.op("the straggler detector's start-up (each rank's node and device)", faults.scale()):
                dist.all_gather_object(world, me)
        else:
            world = [me]
        self.world = world
        self.groups = [w["coords"].get("pp", 0) for w in world]
        self.pipeline = pipeline_model(cfg.parallel, [w["coords"] for w in world])
        sections.set_timeline(self.timeline)
        faults.set_sections(self.timeline)
        # on CUDA each rank's device health (NVML) read every window beside the sections; on CPU nothing to read
        self.health = health.Monitor(ctx.device) if ctx.device.type == "cuda" else None
        if self.health is not None and ctx.is_logger:
            self.health.tell()
        if ctx.is_logger:
            self._remember_members()
            self._remember_crashes()
            self._leave_remembered()

    def _remember_members(self) -> None:
        """Rank 0, at start-up: this attempt's nodes by group rank in the node record, which an attempt that starts
        with fewer (a node gone: runtime.leaving.shrunk) reads to name the ones missing."""
        record = node_record.NodeRecord.at(self.cfg.checkpoint.dir)
        if record is None or self.on_straggler != "replan":
            return
        names = {w["node"]: w["name"] for w in self.world}
        record.set_members([names[n] for n in sorted(names)], faults.attempt())

    def _remember_crashes(self) -> None:
        """Rank 0, at start-up: the nodes whose workers crashed in the attempt before this one (their agents said so:
        runtime.node_record.crashed_nodes), marked `crashed` in the node record."""
        record = node_record.NodeRecord.at(self.cfg.checkpoint.dir)
        crashed = node_record.crashed_nodes(self.world) if record is not None else {}
        for name, seen in crashed.items():
            who = next(w for w in self.world if w["name"] == name)
            record.mark(name, "crashed", seen, max(0, faults.attempt() - 1), group_rank=who["node"],
                        host=who["host"])
            print(f"scalec: node {who['node']} ({name})'s workers crashed in the last attempt (rank {seen['rank']}, "
                  f"{seen['how']}); recorded in {record.path}", flush=True)

    def _leave_remembered(self) -> None:
        """Rank 0, at start-up: a node of this job the node record found slow or unhealthy in `REMEMBERED` or more
        earlier attempts, or crashing in `REMEMBERED` attempts in a row, keeps failing; with `on_straggler = restart
        | replan` it is left out after the first step (the same ask as a straggler's, on the preemption vote),
        before it costs the run again."""
        record = node_record.NodeRecord.at(self.cfg.checkpoint.dir)
        if self.on_straggler == "report" or record is None:
            return
        flagged = record.flagged(min_count=REMEMBERED)
        for name, events in record.crash_looping(REMEMBERED).items():
            flagged[name] = flagged.get(name, []) + events
        rank = next((r for r, w in enumerate(self.world) if w["name"] in flagged), None)
        if rank is None:
            return
        who = self.world[rank]
        self.verdict = f"it keeps failing: {node_record.describe(who['name'], flagged[who['name']])}"
        faults.ask_leave(leaving.encode(rank, self.on_straggler))
        print(f"scalec: on_straggler = {self.on_straggler}: node {who['node']} ({who['name']}) is left out after the "
              f"first step: {self.verdict}", flush=True)

    def begin(self, step: int) -> None:
        """Step `step` (0-based) starts."""
        if self.slow is not None:
            self.slow.begin_step(step + 1)
        self.timeline.begin()

    def end(self, step: int) -> None:
        """Step `step` ended; after a window's last step every rank sends its rows to rank 0, which scores them."""
        self.timeline.end()
        if (step + 1) % self.window:
            return
        rows = self.timeline.rows()
        if self.slow is not None:
            self.slow.seen(rows, step + 2 - len(rows), step + 1)
        if not rows:
            return
        mine = torch.tensor(rows, dtype=torch.float64, device=self.ctx.device)
        if self.ctx.world_size > 1:
            gathered = [torch.empty_like(mine) for _ in range(self.ctx.world_size)] if self.ctx.is_logger else None
            with faults.op("the straggler detector's gather of section times (to rank 0)", faults.scale()):
                dist.gather(mine, gathered, dst=0)
        else:
            gathered = [mine]
        if self.ctx.is_logger:
            self.score(torch.stack(gathered).cpu(), step + 2 - len(rows), step + 1)
        if self.health is not None:
            self._health(step + 1)

    def _health(self, step: int) -> None:
        """Every rank's device health this window, gathered to rank 0 (one small object each): rank 0 names each
        unhealthy device and marks its node `unhealthy` in the node record."""
        reasons = self.health.check()
        every = [None] * self.ctx.world_size if self.ctx.is_logger else None
        if self.ctx.world_size > 1:
            with faults.op("the health check's gather (to rank 0)", faults.scale()):
                dist.gather_object(reasons, every, dst=0)
        else:
            every = [reasons]
        if not self.ctx.is_logger:
            return
        record = node_record.NodeRecord.at(self.cfg.checkpoint.dir)
        for r, got in enumerate(every):
            if got:
                who = self.world[r]
                print(f"scalec: rank {r} (node {who['node']}, {who['host']}, {who['device']}) is unhealthy at step "
                      f"{step}: {'; '.join(got)}", flush=True)
                if record is not None and (who["name"], "unhealthy") not in self.marked:
                    self.marked.add((who["name"], "unhealthy"))
                    record.mark(who["name"], "unhealthy", {"rank": r, "reasons": got, "step": step},
                                faults.attempt(), group_rank=who["node"], host=who["host"])

    def score(self, table: torch.Tensor, first: int, last: int) -> None:
        """Rank 0: the window's scores, the log line for each straggler, the metrics and trackers' figures."""
        dump = os.environ.get("SCALEC_TEST_SECTIONS")  # test-only: the drill's record of every gathered table
        if dump:
            with open(dump, "a") as f:
                f.write(json.dumps({"first": first, "last": last, "table": table.tolist()}) + "\n")
        stats = window_stats(table)
        relative = relative_scores(stats, self.groups)
        individual = individual_scores(stats, self.best)
        best_windows(stats, self.best_medians)
        sig = significant(stats, self.groups)
        rel = [naming_score(relative[r], sig[self.groups[r]]) for r in range(len(stats))]
        self.history = (self.history + [rel])[-SUSTAINED:]
        named = stragglers(stats, self.groups, relative, individual, self.threshold, sig, self.history)
        before, self.named_before = self.named_before, {n["rank"] for n in named}
        ind = [naming_score(individual[r], sig[self.groups[r]]) for r in range(len(stats))]
        self.pending = {"straggler_window": [first, last], "relative_score": [round(x, 4) for x in rel],
                        "individual_score": [round(x, 4) for x in ind],
                        "stragglers": [n["rank"] for n in named]}
        scalars = {f"stragglers/rank{r}_relative": rel[r] for r in range(len(rel))}
        scalars.update({f"stragglers/rank{r}_individual": ind[r] for r in range(len(ind))})
        self.track.log(last, scalars)
        if not named:
            self.episode = None
            return
        slow = {n["rank"] for n in named}
        if self.episode is None or self.episode.slow != slow:
            self.episode = Episode(slow, first)
        self.episode.add(stats)
        # the what-if over the episode: the windows in a row that named these ranks, this one the last
        measured, without, lost = what_if(self.episode.mean(), self.groups, slow, self.pipeline, self.best_medians)
        self.pending.update(step_time_measured=measured, step_time_without=without)
        for n in named:
            print(describe(n, self.world, stats, self.groups, self.threshold, first, last), flush=True)
        print(f"scalec: what-if (steps {self.episode.first}-{last}): without {_ranks(slow)} a step would take "
              f"{without * 1e3:,.1f} ms instead of {measured * 1e3:,.1f}: {lost * 1e3:,.1f} ms/step "
              f"({lost / measured:.1%}) lost to {'it' if len(slow) == 1 else 'them'} "
              f"({'the pipeline schedule timed' if self.pipeline else 'the slowest rank reaching the collective'})",
              flush=True)
        # a sustained naming is an early warning: reported, neither recorded against its node nor acted on (on
        # this 2-core machine a busy spell of its host's neighbours gave one as often as a ramp did)
        strong = [n for n in named if n["kind"] != "sustained"]
        if not strong:
            return
        self._remember(strong, last)
        # an action that takes a node away waits for a second window: the same rank named in two in a row
        confirmed = [n for n in strong if n["rank"] in before]
        if self.on_straggler != "report" and not confirmed and not faults.leave_asked():
            print(f"scalec: on_straggler = {self.on_straggler}: {_ranks({n['rank'] for n in strong})} named in one "
                  "window; acted on if named again in the next", flush=True)
            return
        self.verdict = act({"named": confirmed or strong, "lost_s": lost, "on_straggler": self.on_straggler,
                            "exclude": self.exclude, "world": self.world}) or self.verdict

    def _remember(self, named: list, step: int) -> None:
        """Rank 0: each straggler's node marked `slow` in the node record (runtime.node_record), so that later
        attempts name it at start-up: once an attempt (the first window that names it; a rank slow for the whole run
        would otherwise rewrite a growing file every window)."""
        record = node_record.NodeRecord.at(self.cfg.checkpoint.dir)
        if record is None:
            return
        for n in named:
            who = self.world[n["rank"]]
            if (who["name"], "slow") in self.marked:
                continue
            self.marked.add((who["name"], "slow"))
            record.mark(who["name"], "slow", {"rank": n["rank"], "section": n["section"],
                                              "score": round(n["score"], 3), "step": step}, faults.attempt(),
                        group_rank=who["node"], host=who["host"])

    def record(self) -> dict:
        """The last window's figures for the next metrics record (once), else {}."""
        out, self.pending = self.pending, {}
        return out

    def close(self) -> None:
        sections.set_timeline(None)
        faults.set_sections(None)


def _ranks(ranks) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def describe(n: dict, world: list, stats: list, groups: list, threshold: float, first: int, last: int) -> str:
    """The log line naming straggler `n`: rank, node, device, the slow section and its score, and the waits its
    peers spent on it."""
    r, who = n["rank"], world[n["rank"]]
    peers = [q for q in range(len(stats)) if groups[q] == groups[r] and q != r]
    ref = {"relative": "the fastest rank doing the same work",
           "sustained": f"the mean over the last {SUSTAINED} windows of the fastest rank doing the same work",
           "individual": "its own best window"}[n["kind"]]
    if n["kind"] == "sustained":
        threshold = sustained_threshold(threshold)
    section = ("its compute" if n["section"] == "compute" else n["section"]) + f" (score {n['section_score']:.2f})"
    line = (f"scalec: straggler at steps {first}-{last}: rank {r} (node {who['node']}, {who['host']}, "
            f"{who['device']}) is slow in {section}: {n['kind']} score {n['score']:.2f} ({ref} ÷ its time; "
            f"threshold {threshold:g}); its compute's relative score {n['relative']:.2f}, individual "
            f"{n['individual']:.2f}")
    if peers:
        waited = statistics.median(stats[q]["waits"] for q in peers) - stats[r]["waits"]
        if waited > 0:
            line += f"; its peers waited {waited * 1e3:,.1f} ms/step more than it in collectives"
    return line


def act(verdict: dict) -> str:
    """What `on_straggler` does with the named stragglers (rank 0): `report` is the log line and the metrics (done
    by the caller); `restart` and `replan` ask every rank, through the preemption vote, to stop after the next step
    and leave out the node of the lowest-scoring straggler (runtime.leaving: saved, then restarted without it or
    re-planned on the nodes left). Returns why, in words, where it asked; else ""."""
    action = verdict["on_straggler"]
    if action == "report" or faults.leave_asked():
        return ""
    worst = min(verdict["named"], key=lambda n: n["score"])
    who = verdict["world"][worst["rank"]]
    why = (f"rank {worst['rank']} on it is a straggler, slow in {worst['section']} (score {worst['score']:.2f}); "
           f"{verdict['lost_s'] * 1e3:,.1f} ms/step lost to it")
    faults.ask_leave(leaving.encode(worst["rank"], action))
    print(f"scalec: on_straggler = {action}: {verdict['exclude']} {who['node']} ({who['name']}) is left out after the "
          f"next step: {why}", flush=True)
    return why