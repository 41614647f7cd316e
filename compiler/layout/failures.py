"""The machines' failure model: how often a job is interrupted, and the figures its saves and restarts move at.
Torch-free: the checker reads the defaults (a `resilience` section overrides each), the goodput model
(compiler/cost/goodput.py) prices a plan's checkpoints and restarts with them.

Interruptions. Llama 3's pre-training (Dubey et al. 2024, "The Llama 3 Herd of Models", §3.3.4, Table 5) had 466
job interruptions in a 54-day snapshot on up to 16,384 H100 GPUs: 47 planned (firmware upgrades, operator-initiated
configuration or dataset updates) and 419 unexpected (faulty GPUs 30.1%, HBM3 17.2%, software 12.9%, network
8.4%, ...). We count the 419: the planned ones are scheduled, so a checkpoint is taken right before each (no
work is lost, only a restart), and the Young–Daly interval is about failures that come at random. Over the
whole snapshot as if all 16,384 GPUs ran every hour (an upper bound on GPU-hours, so a lower bound on the rate):
419 / (54 × 24 × 16,384) = 1.97e-5 interruptions per GPU-hour, one every 50,700 GPU-hours; a job on N GPUs is
interrupted every 1 / (rate × N) hours (16,384 GPUs: 3.1 h; Meta reports "about one every three hours").

Storage. The same paper's §3.3.1: Tectonic served the 16K-GPU runs' checkpoints at a sustained 2 TB/s (7 TB/s
peak); over the 2,048 nodes of 8 GPUs that is 0.98 GB/s per node, what a node's ranks write (and read at a restart)
when all write at once. Neither this share nor the peak is measured here.

Host link (an asynchronous save's staging copy, device to host): PCIe one way, datasheets: Gen4 x16 32 GB/s
(A100 SXM), Gen5 x16 64 GB/s (H100, H800, H200 SXM; B200 HGX), NVLink-C2C to the Grace CPU 450 GB/s one way
(GB200: 900 GB/s both ways). On `cpu` the copy is a memory copy: half the memory bandwidth (each byte read and
written). The copies reach less than the datasheet; not measured here.

Restart. Start-up (processes, rendezvous, process groups, the model built and placed) measured on this machine for
`cpu`: 4.2 s (`python -m bench.startup`: torchrun of gpt_dp's program on 2 CPU ranks, one step and exit, median of 3,
2026-11-29, the cores otherwise idle; 13 s with them shared by other jobs); on GPU clusters no figure is measured here: 60 s is an assumption of the order a thousands-of-ranks
job's rendezvous, NCCL communicators and model build take, to override with `restart = ...` once measured.
Compile (`compile = true`): our programs' first step on an H200 compiled in 13-14 s (GPT-2 124M, Llama 1.1B: docs/gpu.md,
bench.gpu_check 2026-11-28), on this CPU in 17-23 s; a larger model compiles its one repeated block once as well.
"""
from __future__ import annotations

# Llama 3's 54-day snapshot (§3.3.4): the unexpected interruptions, the days and the GPUs.
LLAMA3_INTERRUPTIONS = 419
LLAMA3_DAYS = 54
LLAMA3_GPUS = 16384
LLAMA3_SOURCE = "Llama 3, Dubey et al. 2024 §3.3.4: 419 unexpected in 54 days on 16,384 GPUs"

# Tectonic's sustained 2 TB/s over the 2,048 nodes of the 16K-GPU runs (§3.3.1), GB/s per node.
STORAGE_GBPS_PER_NODE = 2000.0 / 2048
STORAGE_SOURCE = "Llama 3 §3.3.1: Tectonic's 2 TB/s sustained over 2,048 nodes"

# One direction device -> host, GB/s (datasheets); `cpu`: half its memory bandwidth (`host_link_gbps`).
HOST_LINK_GBPS = {"a100": 32.0, "h100": 64.0, "h800": 64.0, "h200": 64.0, "b200": 64.0, "gb200": 450.0}

# Start-up of one attempt, seconds: measured on `cpu` (bench/startup.py), assumed elsewhere (see above).
STARTUP_S = {"cpu": 4.2}
STARTUP_ASSUMED_S = 60.0
# torch.compile of our programs' blocks (the first step's extra time), seconds: docs/gpu.md's measurements.
COMPILE_S = {"cpu": 20.0}
COMPILE_GPU_S = 14.0


def rate_per_gpu_hour(count: float, days: float, gpus: int) -> float:
    """Interruptions per GPU-hour of `count` interruptions seen in `days` days on `gpus` GPUs."""
    return count / (days * 24.0 * gpus)


DEFAULT_RATE = rate_per_gpu_hour(LLAMA3_INTERRUPTIONS, LLAMA3_DAYS, LLAMA3_GPUS)


def host_link_gbps(device) -> float:
    """GB/s of the staging copy from `device` (compiler.spec.Device) to host memory."""
    return HOST_LINK_GBPS.get(device.kind, device.hbm_gbps / 2)


def startup_s(kind: str) -> tuple[float, str]:
    """(seconds, where the figure comes from) of one attempt's start-up on devices of `kind`."""
    if kind in STARTUP_S:
        return STARTUP_S[kind], "measured here: bench/startup.py"
    return STARTUP_ASSUMED_S, "assumed, not measured"


def compile_s(kind: str) -> float:
    return COMPILE_S.get(kind, COMPILE_GPU_S)
