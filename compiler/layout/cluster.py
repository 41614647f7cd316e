"""The machines a plan runs on: nodes, devices per node, the device's figures and the link tiers between devices.

A device's figures and their sources are in compiler/layout/devices.py (a mesh may override any of them: the
checker resolves them into `compiler.spec.Device`). The checker resolves the mesh section's `nodes`,
`devices_per_node` and `device` into one Cluster (`Spec.cluster`); the Plan holds none of it (its axes multiply to
the cluster's world size), so the same Spec can be planned on another Cluster (`Spec.on`: a search or an elastic
re-plan on other machines).

The mesh's `fabric` (ib | roce) and `topology` (with `scale_up` folded in) are held here too, as written and
checked; the tiers below do not read them yet (the collectives' pricing on the topology's levels will).

The tiers are what a process group's collectives cross: inside a node, at the device's `intra_node_gbps` times the
fraction a training step's collectives reach there (`intra_node_efficiency`, fitted where devices.py says so), or
between nodes, at `inter_node_gbps` as given; each with its per-step latency (the alpha of the step-time model's
alpha-beta collectives, compiler/cost/step_time.py). A group (compiler/layout/groups.py: its stride pattern, from
the axes alone) is asked of the Cluster which tier it crosses (`crosses`, `tier`): the rank → device placement is
the Cluster's (today rank r on node r // devices_per_node).

Torch-free.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Tier:
    """One kind of link: the bandwidth collectives reach on it per device, one direction, and the latency of one
    algorithm step."""

    name: str
    """`intra_node` or `inter_node` (Cluster.tier)."""
    gbps: float
    latency_us: float


def tiers(device) -> dict:
    """The two tiers of `device` (compiler.spec.Device, or devices.Figures), by name."""
    eff = getattr(device, "intra_node_efficiency", 1.0)
    return {"intra_node": Tier("intra_node", device.intra_node_gbps * eff, device.intra_node_latency_us),
            "inter_node": Tier("inter_node", device.inter_node_gbps, device.inter_node_latency_us)}


def crosses(pattern: tuple, per_node: int) -> bool:
    """Whether some group of the stride `pattern` ((stride, size), ...; compiler/layout/groups.py) spans two nodes
    of `per_node` consecutive ranks. Each group lies in an aligned block of `span` = max(stride × size) consecutive
    ranks (its outermost axis's extent); unless a block fits a node a whole number of times, some block straddles a
    node boundary (tp 6 on nodes of 8: ranks 6-11), and the ranks either side of that boundary that differ along
    the group's outermost axis are in one group. The slowest group sets a collective's pace. A group of one rank
    crosses nothing."""
    if math.prod(n for _, n in pattern) <= 1:
        return False
    span = max(stride * n for stride, n in pattern)
    return span > per_node or per_node % span != 0


@dataclass(frozen=True)
class Cluster:
    """`nodes` nodes of `devices_per_node` devices of one kind (`device`: its figures, the mesh's overrides
    applied)."""

    nodes: int
    devices_per_node: int
    device: object
    """compiler.spec.Device (or any object with its figures' names: a test's namespace)."""
    fabric: str | None = None
    """The network's link layer as the mesh writes it, `ib` (InfiniBand) or `roce` (RoCE v2); None: not said."""
    topology: object | None = None
    """The network's shape (a compiler/layout/topology.py value: FatTree, RailOptimized, Torus, Dragonfly, or the
    SwitchTree of a Slurm topology.conf), the mesh's `scale_up` folded in as that module takes it; a `scale_up`
    written alone is a flat non-blocking network under it (one leaf over every node, what the two tiers assume).
    None: not said, the two tiers above. The checker has refused every shape whose `problems(nodes,
    devices_per_node)` is not empty."""
    power: object | None = None
    """What the machines draw and cost (compiler/layout/power.py Power: device power per state, host and network
    per node, PUE, grid, price per device-hour), the mesh's overrides applied; None: the device's defaults
    (`power.of(cluster)`)."""

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def tiers(self) -> dict:
        return tiers(self.device)

    def crosses(self, group) -> bool:
        """Whether some group of `group`'s pattern (compiler/layout/groups.py Group) has ranks on two nodes."""
        return crosses(group.pattern, self.devices_per_node)

    def tier(self, group) -> Tier:
        """The tier `group`'s collectives run at: between nodes when some group of its pattern spans two."""
        return self.tiers["inter_node" if self.crosses(group) else "intra_node"]

    def with_nodes(self, nodes: int) -> "Cluster":
        """The same machines, `nodes` of them, on the same fabric and topology (whose `problems(nodes, ...)` say
        whether it still describes that many)."""
        return dataclasses.replace(self, nodes=nodes)
