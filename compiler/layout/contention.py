"""Contention: the bandwidth each group of one kind gets where several of them cross the same uplinks at once.

compiler/layout/topology.py gives each level a per-device `share` "when every rank crosses it at once": a fat-tree's
1:7 top tier gives each device 1/7 of its NIC, whoever sends. That is right when every device of a pod sends out of
it at the same moment, and too slow when fewer do: a ring over 128 ranks in 8 pods leaves each pod once, so the
128 dp rings of Llama 3 405B's mesh put 128 flows on uplinks that carry 2,048 / 7 ≈ 293 NICs' worth, and each
runs at its NIC. Here the flows are counted from the Layout instead.

What runs at the same moment (the step-time model's account, compiler/cost/step_time.py): every group of one kind
runs the same collective together, so those groups contend with each other and nothing else is counted:
    dp (and its folded groups: dp×cp, dp×ep, batch, dense)   every dp group reduces its gradients at the same point
                 of the step (with the last micro-batch's backward under DDP, each micro-batch's under FSDP, after
                 the pipeline under pp), all pipeline stages and tp ranks together;
    tp, cp, ep   every group of the axis inside each layer, on every stage at once (cp's ring sends overlap their
                 blocks' compute, ep's all-to-all sits between the router and the experts);
    pp           every stage boundary's sends of one micro-batch at once (a 1F1B steady state sends on every
                 boundary in each slot).
Collectives of different kinds can overlap in time (dp's all-reduce under the last backward's pp sends, cp's and
ep's traffic inside layers): that cross-kind traffic is not counted, each kind priced as if its own groups were
the only traffic on the uplinks (tp and cp usually stay inside a node, where no uplink is shared).

The model, on a topology whose switches nest (`Topology.domains`: a fat-tree's leaves and pods, a rail group under
PXN, a dragonfly's switches and groups, a Slurm switch tree):
 - a group's traffic is NCCL's ring over its scale-up domains (in the order the group first reaches them), with k
   rings side by side where each domain holds k of its ranks (k NICs, one per ring: compiler/cost/network.py's
   ring), so each step of that ring from domain u to domain v is k flows out of every switch domain (leaf, pod)
   that holds u and not v;
 - a switch domain's uplink carries its devices' NIC bandwidth times the share of the level above it
   (topology.py's `network_share`: a 16-device leaf under 1:1 uplinks 16 NICs' worth, a 2,048-device pod under a
   1:7 top tier 2,048 / 7), split equally among the flows that leave by it (what max-min fair sharing gives flows
   that are all limited at that link);
 - a flow runs at the least of those fair shares over the uplinks it leaves, never above its NIC (a flow held back
   elsewhere leaves its part of a link unused here: not handed to the others, so this is at most what max-min
   fairness gives); a group runs at its slowest flow's pace, a fraction `share` of its NIC (1: unhindered).
When every device of a domain sends out of it this is the topology's own share; fewer flows get more, up to the NIC.
Where the topology's switches do not nest (a torus, rails without PXN) `contention` returns None and the
topology's share stands (every rank crossing at once).

Torch-free; computed once per group kind, rank map and cluster (compiler/cost/links.py caches a mesh's links).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Contention:
    """What one group gets where it contends: its share of its NIC and the uplink that sets it."""

    share: float
    """The fraction of its NIC's bandwidth each of the group's flows gets at its slowest uplink (≤ 1)."""
    sharing: int
    """The groups whose flows leave by that uplink, this one included (1: alone, or no uplink crossed)."""
    flows: int = 0
    """The flows leaving by that uplink, all groups together."""
    capacity: float = 0.0
    """That uplink's bandwidth in NICs (the domain's devices × the share of the level above it)."""
    level: str = ""
    """The level that uplink leads to (a fat-tree's `spine` or `top`); '' where no uplink is crossed."""


ALONE = Contention(1.0, 1)


def contention(topology, rows, nodes: int, devices_per_node: int) -> tuple | None:
    """One Contention per row of `rows` (rank lists of the groups that run their collective at the same moment)
    on `topology` over `nodes` nodes of `devices_per_node` devices; None where its switches do not nest."""
    domains = topology.domains(nodes)
    if domains is None:
        return None
    su = topology.scale_up_devices(devices_per_node)
    levels = topology.network_levels()
    devices = [{} for _ in domains]
    for depth, ids in enumerate(domains):
        for d in ids:
            devices[depth][d] = devices[depth].get(d, 0) + devices_per_node
    load: dict = {}  # (depth, domain) -> [flows, groups leaving by it]
    crossed = []
    for g, row in enumerate(rows):
        first, counts = {}, {}
        for r in row:
            first.setdefault(r // su, r)
            counts[r // su] = counts.get(r // su, 0) + 1
        order, k = list(first.values()), min(counts.values(), default=0)
        mine = set()
        for a, b in zip(order, order[1:] + order[:1]) if len(order) > 1 else ():
            na, nb = a // devices_per_node, b // devices_per_node
            for depth, ids in enumerate(domains):
                if ids[na] == ids[nb]:
                    break
                key = (depth, ids[na])
                entry = load.setdefault(key, [0, set()])
                entry[0] += k
                entry[1].add(g)
                mine.add(key)
        crossed.append(mine)
    def fair(key: tuple) -> tuple:
        """(NICs per flow, then the higher uplink first among ties, ..., the uplink's capacity in NICs)."""
        depth, d = key
        capacity = devices[depth][d] * topology.network_share(depth + 1)
        return capacity / load[key][0], -depth, d, capacity

    out = []
    for mine in crossed:
        if not mine:
            out.append(ALONE)
            continue
        key = min(mine, key=fair)
        per_flow, _, _, capacity = fair(key)
        out.append(Contention(min(1.0, per_flow), len(load[key][1]), load[key][0], capacity, levels[key[0] + 1]))
    return tuple(out)
