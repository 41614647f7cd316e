"""What the machines draw and cost: each device's power while it computes, communicates and idles, what a node's
host and its share of the network draw, the facility's PUE, the grid's carbon intensity and the rental price per
device-hour, each default with its source. Torch-free: the checker resolves a mesh's overrides into one `Power`
(the Cluster's `power`); the energy model (compiler/cost/energy.py) prices a plan's step with it.

Device power, watts, three states (the energy model's phases):
- `active_w`, computing: the datasheet's maximum board power (TDP): A100 SXM 400 W, H100 and H800 SXM 700 W, H200
  SXM 700 W, HGX B200 1,000 W, GB200 (per GPU) 1,200 W. It is the figure Meta's model card multiplies GPU-hours by
  (Llama 3.1: "H100-80GB (TDP of 700W)"); measured training draws less: an 8-GPU H100 HGX node peaked at 8.4 kW of
  its rated 10.2 kW training Llama-2-13B with its GPUs near full use (Latif et al., IEEE Access 13, 2025), and
  compute-heavy jobs averaged 76% of the rating (Newkirk et al. 2025, arXiv:2506.14551). So the energy of a busy
  step is an upper bound, within about 20-25%.
- `idle_w`, waiting in a pipeline bubble or for the slowest rank: an H200 idles at 74 W (nvidia-smi at 1 s over 31
  regions of RunPod's fleet, as published by ConserveMode's case study): 75 W on the Hopper parts. A100 50 W,
  B200 110 W and GB200 130 W are the same ~11% of their maximum, not measured.
- `communicating_w`, in an exposed collective: NCCL's kernels hold a few multiprocessors and stream HBM and the
  links while the math units wait. No published figure: assumed idle + 30% of (maximum - idle) (H100: 260 W).
  The GPU check (bench/gpu_check.py) measures a program's joules per step against the whole prediction.
- `cpu` (this machine's ranks, one core each): order-of-magnitude figures for a server core (a 64-core 280 W
  EPYC: ~4.4 W a core busy), not measured: no RAPL counter is readable here.

Per node, watts: `host_w`, everything in the node but its devices (CPUs, memory, NICs, fans, drives): the 8.4 kW
peak above less 8 × 700 W = 2.8 kW for an H100-class node (H800, H200 alike); DGX A100 (6.5 kW rated) and DGX B200
(14.3 kW rated) scaled by the same measured 8.4 / 10.2 less their GPUs' maximum: 2.2 kW and 3.8 kW; a GB200 NVL72
rack (~120 kW for 72 GPUs, NVIDIA's rack figure) per compute tray of 4: 6.7 kW less 4.8 kW = 1.9 kW (the Grace CPUs,
the NVLink switch trays' share). `network_w`, the node's share of the switches: each of its NICs uses about three
switch ports of a two-tier fat tree (its leaf port, a leaf uplink, a spine port), ~25 W a 400 Gb/s port with its
optics (an assumption of the order of a 64-port switch's ~1.7 kW): 8 NICs 600 W, A100's 200 Gb/s NICs 400 W,
GB200's 4 NICs per tray 300 W. Neither is measured here.

Facility: `pue` (power usage effectiveness: the facility's power over its IT equipment's): default 1.1, Google's
published fleet figure (1.10, 2021); the Uptime Institute's 2023 survey average over data centers is 1.58.

Grid (g CO2e per kWh, location-based, a year's average of generation): Ember's yearly electricity data for 2023
(Our World in Data's "carbon intensity of electricity generation"; Ember's Global Electricity Review 2024 gives
the world's as 481). `region("name")` takes one from `GRIDS`; `intensity(g_per_kwh = ..., region = "...")` gives
one's own with where it holds (a figure without its region is refused: it cannot be checked). Default: the world.

Price per device-hour, US dollars, what renting one costs (power and facility included): DeepSeek-V3's report
assumes $2 per H800 GPU-hour (its $5.576M for 2.788M GPU-hours); H100 the same silicon: $2. A100 $1.50, H200 $3,
B200 $4.50, GB200 $6: assumed list prices of 2025-26 clouds (A100 80GB $1.49-2.49, H100 SXM $2.49-3.99 on-demand
in early 2026 as surveyed by pricegpu), not quotes. `cpu`: $0.05 a core-hour, an assumption. Override with
`usd_per_gpu_hour`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Power:
    """One cluster's power, price and carbon figures (a mesh's overrides applied)."""

    active_w: float
    communicating_w: float
    idle_w: float
    host_w: float                 # per node
    network_w: float              # per node
    pue: float
    grid_g_per_kwh: float
    grid_region: str
    usd_per_gpu_hour: float
    kind: str = ""
    """The device kind whose defaults these are."""
    written: tuple = ()
    """The figures the mesh wrote (the others are the device's defaults, with their sources above)."""

    def source(self, name: str) -> str:
        """"as written", or where the default comes from, in a few words (`plan` prints it beside the figure)."""
        if name in self.written:
            return "as written"
        if self.kind == "cpu" and name in FIELDS:
            return "assumed for one core's share of a server, not measured"
        hopper = self.kind in ("h100", "h800", "h200")
        if name == "idle_w":
            return "an H200's measured idle" if hopper else "an H200's measured idle, scaled by maximum"
        if name == "host_w":
            return ("a measured 8-GPU H100 node's peak less its GPUs" if hopper
                    else "the node's rating less its GPUs, at a measured H100 node's share of its rating")
        if name == "usd_per_gpu_hour" and self.kind in ("h800", "h100"):
            return "DeepSeek-V3's assumed H800 rental"
        if name == "grid" and self.grid_region != WORLD:
            return f"Ember 2023, {self.grid_region}"
        return DEFAULT_SOURCES.get(name, "compiler/layout/power.py")


# (active, communicating, idle, host per node, network per node, usd per device-hour) by device kind
_FIGURES = {
    "cpu": (5.0, 3.0, 1.0, 50.0, 0.0, 0.05),
    "a100": (400.0, 155.0, 50.0, 2200.0, 400.0, 1.50),
    "h100": (700.0, 260.0, 75.0, 2800.0, 600.0, 2.00),
    "h800": (700.0, 260.0, 75.0, 2800.0, 600.0, 2.00),
    "h200": (700.0, 260.0, 75.0, 2800.0, 600.0, 3.00),
    "b200": (1000.0, 375.0, 110.0, 3800.0, 600.0, 4.50),
    "gb200": (1200.0, 450.0, 130.0, 1900.0, 300.0, 6.00),
}
FIELDS = ("active_w", "communicating_w", "idle_w", "host_w", "network_w", "usd_per_gpu_hour")
"""The figures a mesh may write by these names (each positive; `network_w` may be 0: one node on loopback)."""

PUE = 1.1
WORLD = "world"

# Ember's yearly data, 2023, g CO2e/kWh (lifecycle, generation): the world and the largest or the cleanest grids
GRIDS = {"world": 481.0, "china": 582.0, "us": 369.0, "india": 713.0, "germany": 381.0, "france": 56.0,
         "canada": 170.0, "brazil": 98.0, "australia": 549.0, "norway": 30.0}

DEFAULT_SOURCES = {
    "active_w": "the datasheet's maximum board power",
    "communicating_w": "assumed: idle + 30% of (maximum - idle)",
    "network_w": "assumed: 3 switch ports per NIC at 25 W",
    "pue": "Google's fleet, 2021",
    "grid": "Ember 2023, the world's average",
    "usd_per_gpu_hour": "assumed rental price",
}


def defaults(kind: str) -> Power:
    """The figures of device `kind` (any kind not listed: an H100's, the device the defaults are best sourced for),
    at PUE 1.1 on the world's average grid."""
    a, c, i, h, n, usd = _FIGURES.get(kind, _FIGURES["h100"])
    return Power(active_w=a, communicating_w=c, idle_w=i, host_w=h, network_w=n, pue=PUE,
                 grid_g_per_kwh=GRIDS[WORLD], grid_region=WORLD, usd_per_gpu_hour=usd, kind=kind)


def resolve(kind: str, written: dict, grid=None) -> Power:
    """The device's defaults with the mesh's figures (`written`: {field: value} of FIELDS and `pue`) and its grid
    (None: the world's; ("region", name) or ("intensity", g_per_kwh, region))."""
    p = defaults(kind)
    got = {k: float(v) for k, v in written.items() if v is not None}
    names = tuple(sorted(got))
    if grid is not None:
        if grid[0] == "region":
            got.update(grid_g_per_kwh=GRIDS[grid[1]], grid_region=grid[1])
        else:
            got.update(grid_g_per_kwh=float(grid[1]), grid_region=grid[2])
            names += ("grid",)
    return dataclasses.replace(p, **got, written=names)


def of(cluster) -> Power:
    """The cluster's Power: the one the checker resolved, or its device kind's defaults (a Cluster made in code)."""
    got = getattr(cluster, "power", None)
    return got if got is not None else defaults(cluster.device.kind)
