"""The machines a plan runs on: nodes, devices per node, the device's figures and the link tiers between devices.

A device's figures and their sources are in compiler/layout/devices.py (a mesh may override any of them: the
checker resolves them into `compiler.spec.Device`). The tiers are what a process group's collectives cross
(compiler/layout/groups.py says which): inside a node, at the device's `intra_node_gbps` times the fraction a
training step's collectives reach there (`intra_node_efficiency`, fitted where devices.py says so), or between
nodes, at `inter_node_gbps` as given; each with its per-step latency (the alpha of the step-time model's
alpha-beta collectives, compiler/cost/step_time.py).

Torch-free. The nodes and devices per node are still the Plan's (written in the mesh section): the step-time
model's links build the Cluster from them and the Spec's device (compiler/cost/links.py).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tier:
    """One kind of link: the bandwidth collectives reach on it per device, one direction, and the latency of one
    algorithm step."""

    name: str
    """`intra_node` or `inter_node` (compiler/layout/groups.py Group.tier)."""
    gbps: float
    latency_us: float


def tiers(device) -> dict:
    """The two tiers of `device` (compiler.spec.Device, or devices.Figures), by name."""
    eff = getattr(device, "intra_node_efficiency", 1.0)
    return {"intra_node": Tier("intra_node", device.intra_node_gbps * eff, device.intra_node_latency_us),
            "inter_node": Tier("inter_node", device.inter_node_gbps, device.inter_node_latency_us)}


@dataclass(frozen=True)
class Cluster:
    """`nodes` nodes of `devices_per_node` devices of one kind (`device`: its figures, the mesh's overrides
    applied)."""

    nodes: int
    devices_per_node: int
    device: object

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def tiers(self) -> dict:
        return tiers(self.device)

    def tier(self, crosses_nodes: bool) -> Tier:
        """The tier a group's collectives run at: between nodes when some group of it spans two."""
        return self.tiers["inter_node" if crosses_nodes else "intra_node"]
