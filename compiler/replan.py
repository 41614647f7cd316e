"""Re-planning on the machines that are left: the same model, global batch and training state, searched again on a
cluster with fewer nodes, written as a `.scale` file beside the old one.

A run whose `resilience` says `on_straggler = replan` (or a person after a node died) ends its attempt with a
checkpoint; `scalec run` (compiler/cli.py) then calls `replan` with the nodes that are left, compiles the file it
writes and launches it: the program resumes from the same checkpoint directory on the new plan (a checkpoint
resumes on any plan of the same model: runtime/checkpoint.py, docs/checkpoints.md). What the new file changes is the
mesh (nodes, axes) and the plan section, as `scalec search -o` writes them; every other section is the old file's
text, so the resume contract (seed, batch, data, optimizer, schedule) holds and the losses continue.

The search is deterministic: every node that re-plans from the same file and the same count of nodes left writes
the same plan, so the nodes of a multi-node job can each re-plan on their own.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass


class ReplanError(Exception):
    """No plan on the nodes left: one line saying why (no node left, none of the plans fits)."""


@dataclass(frozen=True)
class Replanned:
    """What a re-plan decided: the file it wrote, the plans before and after, their predicted step times."""

    path: str
    nodes_before: int
    nodes_after: int
    old_plan: str          # Plan.describe() of the file's own plan
    new_plan: str
    old_step_s: float | None  # the old plan's predicted step time on all its nodes (None: it did not compile)
    new_step_s: float

    def line(self, why: str = "") -> str:
        """The run log's line: what happened, why, and the old and new predicted step times."""
        old = f"{self.old_step_s:.3g} s" if self.old_step_s is not None else "unknown"
        return (f"scalec: re-planned on {self.nodes_after} of {self.nodes_before} nodes"
                + (f" ({why})" if why else "") + f": {self.old_plan} → {self.new_plan}; predicted step {old} → "
                f"{self.new_step_s:.3g} s; wrote {self.path}")


def replanned_path(path: str, nodes: int) -> str:
    """Where the plan for `nodes` nodes goes: beside `path`, `NAME.nodesN.scale` (the same directory, so every
    path the file names, relative to it, still points where it did)."""
    stem = os.path.basename(path)
    stem = stem[:-len(".scale")] if stem.endswith(".scale") else stem
    base = stem.split(".nodes")[0]  # a re-plan of a re-plan is named after the first file
    return os.path.join(os.path.dirname(path), f"{base}.nodes{nodes}.scale")


def replan(path: str, nodes_left: int, headroom: float | None = None, out: str | None = None,
           old_step_s: float | None = None) -> Replanned:
    """Search `path`'s model on `nodes_left` of its cluster's nodes (the devices per node and the device as
    written) and write the fastest plan beside it (`replanned_path`, or `out`). `old_step_s`: the file's own
    predicted step time where the caller compiled it (`scalec run` did), else it is compiled here. ReplanError where
    no node is left or no plan fits; the file's own diagnostics (it was compiled before) propagate as ScaleError."""
    from compiler import search as SE
    from compiler.check import check_path

    spec = check_path(path)
    before = spec.cluster.nodes
    if nodes_left < 1:
        raise ReplanError(f"no node is left of {before}: nothing to re-plan on")
    if nodes_left > before:
        raise ReplanError(f"{nodes_left} nodes left of {before}: a re-plan only takes nodes away")
    old_step = _predicted(path) if old_step_s is None else old_step_s
    searched = check_path(path, cluster_only=True)
    smaller = searched.on(dataclasses.replace(searched.cluster, nodes=nodes_left))
    result = SE.search(smaller, top=1, headroom=headroom)
    if not result.winners:
        raise ReplanError(f"no plan of {spec.model.name} fits {nodes_left} node(s) of "
                          f"{spec.cluster.devices_per_node} {spec.cluster.device.kind}: `scalec search {path} "
                          f"--nodes {nodes_left}` says why")
    best = result.winners[0]
    target = out or replanned_path(path, nodes_left)
    with open(target, "w", encoding="utf-8") as f:
        f.write(SE.scale_text(smaller, best))
    return Replanned(target, before, nodes_left, spec.plan.describe(), best.plan.describe(), old_step,
                     best.prediction.step_time_s)


def _predicted(path: str) -> float | None:
    """The predicted step time of the file as written, or None where it does not compile."""
    from compiler import pipeline
    from compiler.diagnostics import ScaleError
    try:
        step = pipeline.compile_checked(path, memory=False).costs.step
    except ScaleError:
        return None
    return None if step is None else step.step_time_s
