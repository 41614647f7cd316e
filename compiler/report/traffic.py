"""Where each collective of a compiled plan goes: the tier its group crosses, the algorithm the step-time model prices
it with, its seconds and bus bandwidth (`priced`, from compiler/cost/links.py: the figures the step-time model
charges), the bytes of one step per tier (`by_tier`) and what the plan's placement saves over the mesh's own order
(`naive_placement`). `plan`'s text, its `--json` and its HTML page read them from here.
"""
from __future__ import annotations

from dataclasses import dataclass

from compiler.cost import links as LK


def links(spec, plan, ledger) -> dict:
    """The links of every process group of `plan` on the spec's cluster, as the step-time model prices them
    (links.links: the placement resolved with the step's ledger where it is `auto`)."""
    return LK.links(plan, spec.cluster, lambda: ledger)


def priced(spec, plan, ledger) -> list:
    """links.Priced per entry of `ledger` (None where its group has no link on the cluster), in the ledger's order."""
    lk = links(spec, plan, ledger)
    return [LK.priced(c, lk[c.axis]) if c.axis in lk else None for c in ledger.entries]


@dataclass(frozen=True)
class Tier:
    """The step's collectives on one tier: their bytes per rank (the ledger's: the full tensor of each call), the
    groups that carry them, and the seconds of them the rank cannot hide (the step-time model's)."""

    tier: str
    bytes: int
    axes: tuple
    exposed_s: float

    def as_json(self) -> dict:
        return {"tier": self.tier, "bytes": self.bytes, "axes": list(self.axes), "exposed_s": self.exposed_s}


def _tier_order(cluster) -> tuple:
    """Tier names fastest first: the two tiers', or the topology's levels (compiler/layout/topology.py `levels`)."""
    topology = getattr(cluster, "topology", None)
    levels = topology.levels(cluster.devices_per_node) if topology is not None else ()
    return ("intra_node", *levels, "inter_node")


def by_tier(compiled) -> list:
    """The step's bytes per tier on the rank the ledger describes (pp rank 0 under pp), fastest tier first, with the
    seconds of them the step-time model says that rank cannot hide (its RankTime.exposed_comm_s, by its groups'
    tiers)."""
    spec, plan, costs = compiled.spec, compiled.plan, compiled.costs
    lk = links(spec, plan, costs.ledger)
    sent, axes = {}, {}
    for c in costs.ledger.entries:
        if c.axis not in lk:
            continue
        t = LK.tier_name(lk[c.axis])
        sent[t] = sent.get(t, 0) + c.bytes
        axes.setdefault(t, [])
        if c.axis not in axes[t]:
            axes[t].append(c.axis)
    exposed = {}
    pred = costs.step
    for a, s in (pred.ranks[0].exposed_comm_s.items() if pred is not None else ()):
        if a in lk:
            t = LK.tier_name(lk[a])
            exposed[t] = exposed.get(t, 0.0) + s
    order = _tier_order(spec.cluster)
    key = {t: i for i, t in enumerate(order)}
    return [Tier(t, sent[t], tuple(axes[t]), exposed.get(t, 0.0))
            for t in sorted(sent, key=lambda t: (key.get(t, len(order)), t))]


@dataclass(frozen=True)
class Naive:
    """The plan's step time against the same plan on the mesh's own order (no placement)."""

    step_s: float
    ratio: float         # the naive step time / the plan's
    order: tuple         # the mesh's order, innermost axis first
    same: bool           # the plan is on the mesh's order already (no placement written)

    def as_json(self) -> dict:
        return {"step_s": self.step_s, "ratio": self.ratio, "order": list(self.order)}


def naive_placement(compiled) -> Naive | None:
    """Where the mesh describes its network (links.described), the step time of the plan with no placement (the
    mesh's written axis order, the last axis fastest), costed as `plan` costs the plan itself: the compiled cost
    model's prediction (step_time.Simulator.predict) with only the links changed. None elsewhere (a placement
    changes no price there) and without a prediction."""
    from compiler.cost.step_time import unplaced
    spec, plan, costs = compiled.spec, compiled.plan, compiled.costs
    pred = costs.step if plan is not None else None
    if pred is None or not LK.described(spec.cluster):
        return None
    order = tuple(a for a, _ in reversed(plan.axes))
    if plan.placement is None:
        return Naive(pred.step_time_s, 1.0, order, True)
    naive = unplaced(compiled)
    return Naive(naive.step_time_s, naive.step_time_s / pred.step_time_s, order, False)
