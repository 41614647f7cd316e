"""Devices the cost model knows, by the name a mesh's `device` setting takes, with every figure's source.

A mesh may override any figure by its field name (`peak_tflops = 400`, `inter_node_gbps = 50`, ...); a device
kind not listed here does not exist for the checker. Torch-free: the checker reads it to resolve the mesh.

What the step-time model (compiler/cost/step_time.py) does with them:
- a matmul runs at `peak_tflops × matmul_efficiency`, less what tile and wave quantisation waste (a GEMM is cut
  into `tile`-sized output tiles spread over `units` multiprocessors; NVIDIA, "Matrix Multiplication Background
  User's Guide"), and never faster than its operands stream from memory;
- every other op moves its bytes at `hbm_gbps`;
- each op costs at least `op_overhead_us` (the eager dispatch and launch time of one op on the host);
- a collective costs `latency_us` per algorithm step plus its bytes over the link's bandwidth, inside a node or
  between nodes (alpha-beta model).
"""
from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True, kw_only=True)
class Figures:
    peak_tflops: float
    """Dense bf16 peak TFLOP/s (datasheet)."""
    memory_gb: float
    """Device memory, GB (1e9 bytes)."""
    intra_node_gbps: float
    """Per-device bandwidth to the devices of the same node, one direction, GB/s."""
    inter_node_gbps: float
    """Per-device bandwidth to other nodes, one direction, GB/s."""
    hbm_gbps: float
    """Memory bandwidth, GB/s."""
    matmul_efficiency: float
    """Fraction of `peak_tflops` a large bf16 matmul reaches."""
    attention_efficiency: float
    """Fraction of `peak_tflops` fused attention (SDPA's flash kernels) reaches, forward and backward."""
    intra_node_latency_us: float
    """Latency of one step of a collective between devices of one node, µs."""
    inter_node_latency_us: float
    """Latency of one step of a collective between nodes, µs."""
    op_overhead_us: float
    """The least time one op takes in an eager program (host dispatch and kernel launch), µs."""
    step_overhead_ms: float = 0.0
    """What the runtime itself costs per step besides the model's ops (making the batch, the loss and gradient norm
    read back, the optimizer's per-tensor work, logging)."""
    intra_node_efficiency: float = 1.0
    """Fraction of `intra_node_gbps` (datasheet or a mesh's own) the collectives of a training step reach inside a
    node, as the alpha-beta model's bandwidth (compiler/cost/step_time.py `links`)."""
    units: int = 1
    """Multiprocessors a matmul's tiles are spread over (waves)."""
    tile: int = 1
    """Side of a matmul's output tile, elements."""
    host_gbps: float = 0.0
    """Bandwidth of the device's link to its host memory, one direction, GB/s (offload's copies:
    compiler/cost/offload.py)."""
    host_adam_params_per_s: float = 0.0
    """Parameters per second the device's share of its host steps with AdamW (offload's host step)."""


OVERRIDABLE = tuple(f.name for f in fields(Figures)
                    if f.name not in ("units", "tile", "step_overhead_ms", "intra_node_efficiency", "host_gbps",
                                      "host_adam_params_per_s"))

# Sources:
# - peak, memory, NVLink and HBM: NVIDIA's A100 80GB SXM (312 TFLOP/s bf16, 2,039 GB/s, NVLink 3 600 GB/s both
#   directions = 300 one way, 108 SMs), H100 SXM (989, 3,350 GB/s, NVLink 4 900 GB/s = 450 one way, 132 SMs) and
#   H200 SXM (989, 141 GB, 4,800 GB/s) datasheets. Between nodes: one 200 Gb/s HDR NIC per A100 (DGX A100) = 25 GB/s,
#   one 400 Gb/s NDR NIC per H100/H200 (DGX H100) = 50 GB/s.
# - H800 (the export H100, DeepSeek-V3's cluster): an H100 SXM's compute, memory and HBM with a narrower NVLink;
#   DeepSeek-V3's technical report (2024, section 3.2.1) gives the bandwidths it plans with: NVLink 160 GB/s inside
#   a node, InfiniBand 50 GB/s between nodes. Its efficiencies are the H100's, not measured.
# - B200 (HGX/DGX B200) and GB200 (GB200 NVL72), NVIDIA's datasheets, whose tensor figures are with 2:4 sparsity
#   (halved here for dense): DGX B200 (8 GPUs: 1,440 GB, 64 TB/s HBM3e; NVSwitch 14.4 TB/s aggregate) and HGX B200
#   (FP16/BF16 36 PFLOP/s sparse for 8): 2,250 TFLOP/s dense, 180 GB, 8,000 GB/s, NVLink 5 1.8 TB/s both directions
#   = 900 one way; between nodes 8 single-port ConnectX-7 at 400 Gb/s (DGX B200 user guide) = 50 GB/s per GPU.
#   GB200 NVL72 (72 GPUs: FP16/BF16 360 PFLOP/s sparse, up to 13.4 TB HBM3e at 576 TB/s, NVLink 130 TB/s): 2,500
#   TFLOP/s dense (the GB200's GPU runs at 1,200 W, the HGX B200's at 1,000 W), 186 GB, 8,000 GB/s, NVLink 5 900 GB/s
#   one way to every GPU of the rack (a 72-GPU domain: `scale_up = 72` over compute trays of 4, devices_per_node = 4);
#   between racks one 400 Gb/s ConnectX-7 per GPU as DGX GB200 deploys it (72 OSFP ports per rack) = 50 GB/s.
#   Both: 148 SMs (what CUDA reports of a B200; not a datasheet figure); the efficiencies, latencies and overheads
#   are the H100's, not measured on Blackwell (as the H800's). Each is overridable in the mesh like any figure.
# - matmul efficiency: H100/H200: an 8192³ bf16 matmul measured 798 TFLOP/s of 989 = 0.81
#   (../shared/reference/gpu-measured.json). A100: 0.775, fitted with the A100's intra_node_efficiency (below) by
#   `python -m bench.step_time fit` to the three calibration rows of Megatron-LM's Table 1 (Narayanan et al. 2021:
#   1.7B t1 p1, 18.4B t8 p1, 145.6B t8 p8; least squares of log(predicted/published TFLOP/s per GPU); ratios 0.976,
#   0.978, 1.033), costed after bf16 programs stopped autocasting (runtime/precision.py). Checked, not fitted, on
#   Table 1's seven other rows (0.94-1.09) and Korthikanti et al. 2022's Table 5 iteration times (0.97-1.01):
#   tests/test_simulate.py. Not measured here.
# - intra_node_efficiency: A100 0.56 (168 of NVLink 3's 300 GB/s one way), fitted with the matmul efficiency above:
#   the 1.7B row (t = 1, no tensor-parallel traffic) pins the matmul rate, the two t = 8 rows the rate of their
#   tensor-parallel all-reduces. Without it (1.0) the best matmul efficiency, 0.725, leaves the t = 1 row 6% slow and
#   the t = 8 rows 1-3% fast, a size trend the matmul rate alone cannot follow. NCCL's nccl-tests reach ~230 GB/s
#   bus bandwidth (0.77) for one large all-reduce on a DGX A100; Megatron's tensor-parallel all-reduces (~25-100 MB,
#   synchronous, between kernels) reach less in the fit. Inter-node links stay at their datasheet figure (the fit
#   with one efficiency on every link was worse and chose 1.0). H100, H200: 1.0, no published figure fitted.
# - attention efficiency: FlashAttention-2 (what SDPA runs) reaches 50-73% of the A100's peak forward and less in
#   backward (Dao 2023): 0.55; on H100 it reaches ~300-350 TFLOP/s (Shah et al. 2024, FlashAttention-3, Fig. 5-6,
#   their FA2 baseline): 0.33 of 989. Not measured here.
# - latencies: NCCL's small-message figures are a few µs per ring step inside a node and ~5-10 µs across
#   InfiniBand; these are order-of-magnitude figures, not measured here, and matter only for small messages.
# - op overhead: an eager PyTorch op costs ~5-10 µs of host time on CUDA (dispatch and launch); not measured here.
# - cpu: this machine (2 cores, AMD EPYC), one thread per rank, fp32, gloo over loopback, measured on 2026-11-23:
#   `python -m bench.cpu_calibration`: an fp32 matmul peaks at 80-100 GFLOP/s (0.1 TFLOP/s), the tiny models' shapes
#   reach 0.7-0.9 of it (0.8); a 64 MB add or copy moves 16-25 GB/s (30 × MEMORY_EFFICIENCY = 24); gloo on 2 ranks
#   all-reduces at 0.5-0.9 GB/s of the ledger's bytes (0.7; its all-gather and reduce-scatter are slower than the
#   ring ratio says, which one bandwidth cannot follow) and a 4-byte all-reduce takes ~260 µs idle (2 ring steps of
#   120 µs). `python -m bench.step_time overheads`: our programs cost 85 µs per graph op (eager dispatch, autograd,
#   the views and the optimizer's per-tensor work that grow with the ops) and no measurable fixed cost per step
#   (the fit gave -1.8 ms). Neither is measured on GPUs (step_overhead_ms 0 there: issue 13 measures the runtime).
# - host link (host_gbps): PCIe Gen4 x16 for the A100 SXM (32 GB/s a direction raw; ~25 GB/s effective after the
#   128b/130b encoding and the TLP headers of 256-byte payloads), PCIe Gen5 x16 for the H100, H200, H800 and B200
#   (64 GB/s raw, ~50 effective; NVIDIA's H100 and HGX B200 datasheets: "PCIe Gen5: 128 GB/s" both directions) and
#   NVLink-C2C for the GB200 (the Grace Blackwell superchip's, 900 GB/s both directions = 450 one way; GH200
#   datasheet's figure, which GB200 NVL72's datasheet repeats; the two GPUs of a superchip share their Grace). Not
#   measured on these machines. cpu: this machine's host copy, `python -m bench.host_step` on 2026-11-29: 19.9 GB/s
#   of a 256 MiB copy (the bytes once), quiet; 6-8 GB/s under a load of 5 on its 2 cores
#   (bench/results/host_step_cpu_2026-11-29.json).
# - host AdamW (host_adam_params_per_s): `python -m bench.host_step` (torch 2.13, 16M fp32 parameters in 1M tensors)
#   measured torch's fused CPU AdamW at 1,449 M parameters/s on one thread (2,363 M on both), foreach at 230 M (351
#   M), quiet (0.74-1.47e9 on one thread under load): the fused step moves ~28 bytes a parameter (parameter, gradient and both moments read, three written),
#   1.45e9 × 28 = 41 GB/s of traffic, what this machine's copy moves (2 × 19.9 GB/s read and written): it streams
#   memory, so a host's rate is its memory bandwidth per GPU over 28 bytes. DGX A100 (2 AMD EPYC 7742, 8 channels
#   of DDR4-3200 each: 409.6 GB/s for 8 GPUs, 51.2 each): 1.83e9. DGX H100 and H200 (2 Xeon Platinum 8480C, 8 of
#   DDR5-4800: 614.4 GB/s, 76.8 each; the H800's HGX the same): 2.74e9. DGX B200 (2 Xeon Platinum 8570, DDR5-5600:
#   716.8 GB/s, 89.6 each): 3.2e9. GB200 (a Grace's LPDDR5X, up to 512 GB/s, for two GPUs): 9.1e9. The datasheets'
#   peak bandwidths: what a STREAM run reaches is lower, so these rates are an upper bound (the step a lower
#   bound); DeepSpeed's CPU-Adam (Ren et al. 2021, ZeRO-Offload) reports several times the speed of torch's CPU
#   Adam of its time, the gap torch's fused CPU AdamW closes here (6.3x its foreach on one thread). cpu: the one-thread figure, 1.45e9 (a rank
#   is one thread). Our runtime's host step is torch's fused AdamW on CPU.
DEVICES = {
    "cpu": Figures(peak_tflops=0.1, memory_gb=16.0, intra_node_gbps=0.7, inter_node_gbps=0.7, hbm_gbps=30.0,
                   matmul_efficiency=0.8, attention_efficiency=0.8, intra_node_latency_us=120.0,
                   inter_node_latency_us=120.0, op_overhead_us=85.0, step_overhead_ms=0.0,
                   host_gbps=19.9, host_adam_params_per_s=1.45e9),
    "a100": Figures(peak_tflops=312.0, memory_gb=80.0, intra_node_gbps=300.0, inter_node_gbps=25.0, hbm_gbps=2039.0,
                    matmul_efficiency=0.775, attention_efficiency=0.55, intra_node_latency_us=3.0,
                    inter_node_latency_us=8.0, op_overhead_us=6.0, intra_node_efficiency=0.56, units=108, tile=128,
                    host_gbps=25.0, host_adam_params_per_s=1.83e9),
    "h100": Figures(peak_tflops=989.0, memory_gb=80.0, intra_node_gbps=450.0, inter_node_gbps=50.0, hbm_gbps=3350.0,
                    matmul_efficiency=0.81, attention_efficiency=0.33, intra_node_latency_us=3.0, inter_node_latency_us=8.0,
                    op_overhead_us=6.0, units=132, tile=128,
                    host_gbps=50.0, host_adam_params_per_s=2.74e9),
    "h800": Figures(peak_tflops=989.0, memory_gb=80.0, intra_node_gbps=160.0, inter_node_gbps=50.0, hbm_gbps=3350.0,
                    matmul_efficiency=0.81, attention_efficiency=0.33, intra_node_latency_us=3.0, inter_node_latency_us=8.0,
                    op_overhead_us=6.0, units=132, tile=128,
                    host_gbps=50.0, host_adam_params_per_s=2.74e9),
    "h200": Figures(peak_tflops=989.0, memory_gb=141.0, intra_node_gbps=450.0, inter_node_gbps=50.0, hbm_gbps=4800.0,
                    matmul_efficiency=0.81, attention_efficiency=0.33, intra_node_latency_us=3.0, inter_node_latency_us=8.0,
                    op_overhead_us=6.0, units=132, tile=128,
                    host_gbps=50.0, host_adam_params_per_s=2.74e9),
    "b200": Figures(peak_tflops=2250.0, memory_gb=180.0, intra_node_gbps=900.0, inter_node_gbps=50.0,
                    hbm_gbps=8000.0, matmul_efficiency=0.81, attention_efficiency=0.33, intra_node_latency_us=3.0,
                    inter_node_latency_us=8.0, op_overhead_us=6.0, units=148, tile=128,
                    host_gbps=50.0, host_adam_params_per_s=3.2e9),
    "gb200": Figures(peak_tflops=2500.0, memory_gb=186.0, intra_node_gbps=900.0, inter_node_gbps=50.0,
                     hbm_gbps=8000.0, matmul_efficiency=0.81, attention_efficiency=0.33, intra_node_latency_us=3.0,
                     inter_node_latency_us=8.0, op_overhead_us=6.0, units=148, tile=128,
                     host_gbps=450.0, host_adam_params_per_s=9.1e9),
}


# What `python -m bench.gpu_check` measures and writes into its JSON's `calibration` block: the figures of a device
# kind it can replace with measured ones (each overridable in a mesh by the same name).
CALIBRATED = ("matmul_efficiency", "attention_efficiency", "hbm_gbps")
CALIBRATION_FORMAT = 1


class CalibrationError(ValueError):
    """A calibration file that is not bench/gpu_check's record, or holds figures we do not accept."""


def calibration(record: dict) -> tuple[str, dict[str, float]]:
    """(device kind, {figure: measured value}) of a bench/gpu_check record (its parsed JSON). The values are the
    mesh overrides of that kind (`mesh { device = h200  matmul_efficiency = 0.79 ... }`), so a plan priced with
    them is a plan on the device as measured. Refuses a record of another format, without its date or torch
    version, of an unknown device, or with a figure outside (0, 1] (efficiencies) or not positive (bandwidth)."""
    if record.get("format") != CALIBRATION_FORMAT:
        raise CalibrationError(f"not a bench/gpu_check record of format {CALIBRATION_FORMAT} "
                               f"(format {record.get('format')!r})")
    for key in ("date", "torch", "calibration"):
        if not record.get(key):
            raise CalibrationError(f"the record has no {key!r}")
    cal = dict(record["calibration"])
    kind = cal.pop("device", None)
    cal.pop("above_peak", None)  # measured faster than the device's peak figure: not calibrated (bench/gpu_check)
    if kind not in DEVICES:
        raise CalibrationError(f"the record's device {kind!r} is not one of {', '.join(DEVICES)}")
    unknown = sorted(set(cal) - set(CALIBRATED))
    if unknown:
        raise CalibrationError(f"the record calibrates {', '.join(unknown)}, which are not measured figures")
    for key, value in cal.items():
        if not isinstance(value, (int, float)) or value <= 0 or (key.endswith("efficiency") and value > 1):
            raise CalibrationError(f"{key} = {value!r} is not a measured figure")
    return kind, {k: float(v) for k, v in cal.items()}
