"""The language's vocabulary: which sections, settings, call arguments and layers a `.scale` file may write, the type
and default of each (binder.Param), the bounds that keep a plan sane, and where a misplaced setting belongs
(`placement`). Tables only: resolution reads them (compiler/check.py), and so do the lints (compiler/lints.py), the
file checks (compiler/file_checks.py) and the tests that enumerate the language (tests/fuzz.py,
tests/test_settings_reach_output.py).
"""
from __future__ import annotations

from runtime import choices  # torch-free: the names the language shares with the runtime

from compiler import files as F
from compiler import layers as L
from compiler.binder import (MISSING, Param, call_of, one_of, to_bool, to_count_or_auto, to_duration, to_float,
                             to_int, to_placement, to_pos_int, to_ratio, to_ratios, to_size, to_string)
from compiler.layout import failures as FAIL
from compiler.layout import power as POWER
from compiler.layout.devices import DEVICES, OVERRIDABLE
from compiler.plan import AXES

# Bounds that keep planning in seconds and every size a valid tensor dimension.
MAX_REPEAT = 4096
MAX_SEED = 2**31 - 1

# The longest `timeout`, in seconds: a week. The runtime turns it into timedeltas and thread waits (runtime/mesh.py,
# runtime/faults.py), which overflow past about 10^13 s; no collective legitimately waits longer than a day or so.
MAX_TIMEOUT = 7 * 24 * 3600.0
# The shortest `timeout` that is not a mistake: it also bounds the start-up rendezvous (8 CPU ranks take 10-15 s to
# start here) and the first step's one-time work; below a few seconds it is a unit slip (`timeout = 0.5` for half a
# minute) or a watchdog that ends healthy runs.
MIN_TIMEOUT = 5.0

# The most steps (and steps between logs or checkpoints, warm-up steps, restarts) a run counts: checkpoints hold the
# step in an int64 tensor (runtime/checkpoint.py), and 2^31 - 1 steps is far past any run.
MAX_COUNT = 2**31 - 1

# A learning rate above this is surely a slip of the exponent (3e3 for 3e-3): AdamW's are 1e-6 .. 1e-2.
SUSPICIOUS_LR = 1.0

# Names the train section turns into size symbols (so formulas read `global_batch`): a model size cannot take them.
TRAIN_SIZE_NAMES = ("global_batch", "seq_len")

# What the tp axis can shard (plan setting `tp_layers`).
TP_LAYERS = ("attention", "mlp", "vocab")

# Axes a plan can use (compiler.plan.AXES). `ep` is folded out of data parallelism: the batch is split over dp × ep
# ranks, dense weights are replicated over both, experts are sharded over ep and replicated over dp.
KNOWN_AXES = AXES

# Names of the size symbols the checker binds for each `moe` layer (its capacity per sequence).
CAPACITY = L.moe.CAPACITY


# -- the layer vocabulary: one module per kind in compiler/layers/ (schema, resolution, tensor-parallel roles) ----

LAYERS = L.SCHEMAS

# -- the network: the mesh's `fabric` and `topology` (compiler/layout/topology.py's constructors, by their keyword
# names; compiler/network_checks.py builds and checks them) ----------------------------------------------------------

FABRICS = ("ib", "roce")
TOPOLOGIES = {
    "fat_tree": {"nodes_per_leaf": Param(to_pos_int, doc="nodes under one leaf (top-of-rack) switch"),
                 "nodes_per_pod": Param(to_int, 0, "nodes under one pod's spines; 0: no pods"),
                 "oversubscription": Param(to_ratios, 1.0, "down:up bandwidth per uplink level, leaf first (a "
                                                           "number: the top uplink's)")},
    "rail_optimized": {"nodes_per_group": Param(to_pos_int, doc="nodes of one rail group (scalable unit)"),
                       "nodes_per_pod": Param(to_int, 0, "nodes under one pod's spines; 0: no pods"),
                       "oversubscription": Param(to_ratios, 1.0, "down:up bandwidth per uplink level, rail first"),
                       "pxn": Param(to_bool, True, "NCCL's PXN: cross-rail traffic over NVLink to the right rail")},
    "torus": {"x": Param(to_pos_int, doc="nodes along x"), "y": Param(to_pos_int, 1, "nodes along y"),
              "z": Param(to_pos_int, 1, "nodes along z"),
              "wrap": Param(to_bool, True, "wrap-around links (a torus); false: a mesh")},
    "dragonfly": {"groups": Param(to_pos_int, doc="groups"),
                  "nodes_per_group": Param(to_pos_int, doc="nodes of one group"),
                  "nodes_per_switch": Param(to_int, 0, "nodes on one switch of a group; 0: not modelled apart"),
                  "global_oversubscription": Param(to_ratio, 1.0, "a group's injection over its global bandwidth")},
    "from": {"path": Param(to_string, doc="a Slurm topology.conf (topology/tree), relative to the .scale file"),
             "oversubscription": Param(to_ratios, 1.0, "down:up bandwidth per uplink level (Slurm's file says "
                                                       "nothing of bandwidth)")},
}

# -- the grid a cluster draws from: a region of compiler/layout/power.py's table, or a figure with where it holds --

GRIDS = {"region": {"name": Param(one_of(*POWER.GRIDS), doc="a region of Ember's 2023 yearly data")},
         "intensity": {"g_per_kwh": Param(to_float, doc="g CO2e per kWh"),
                       "region": Param(to_string, doc="where and when the figure holds (it cannot be checked "
                                                      "without)")}}

# -- section settings ---------------------------------------------------------------------------------------------

MESH_SETTINGS: dict[str, Param] = {
    "nodes": Param(to_pos_int, 1, "machines"),
    "devices_per_node": Param(to_pos_int, MISSING, "devices (processes) per machine"),
    "device": Param(one_of(*DEVICES), "cpu", "device kind, for the cost model"),
    "peak_tflops": Param(to_float, None, "dense bf16 peak TFLOP/s of one device"),
    "memory_gb": Param(to_float, None, "memory of one device, GB"),
    "intra_node_gbps": Param(to_float, None, "per-device bandwidth inside a node, GB/s"),
    "inter_node_gbps": Param(to_float, None, "per-device bandwidth between nodes, GB/s"),
    "hbm_gbps": Param(to_float, None, "memory bandwidth of one device, GB/s"),
    "matmul_efficiency": Param(to_float, None, "fraction of the peak a large matmul reaches"),
    "attention_efficiency": Param(to_float, None, "fraction of the peak fused attention reaches"),
    "intra_node_latency_us": Param(to_float, None, "latency of one collective step inside a node, µs"),
    "inter_node_latency_us": Param(to_float, None, "latency of one collective step between nodes, µs"),
    "op_overhead_us": Param(to_float, None, "the least time one eager op takes, µs"),
    "fabric": Param(one_of(*FABRICS), None, "the network's link layer: ib (InfiniBand) or roce (RoCE v2)"),
    "topology": Param(call_of(TOPOLOGIES, "topology"), None,
                      "the network's shape: fat_tree(...), rail_optimized(...), torus(x, y, z), dragonfly(...) or "
                      "from(\"topology.conf\") (a Slurm tree)"),
    "scale_up": Param(to_pos_int, None, "devices in one NVLink domain, when it is not a node's (GB200 NVL72: 72)"),
    "placement": Param(to_placement, None, "which rank each mesh coordinate gets: auto, or order(tp, pp, dp) "
                                           "(innermost first); default: the axes as listed, the last fastest"),
    # what the machines draw and cost (compiler/layout/power.py: every default with its source)
    "active_w": Param(to_float, None, "one device's power while it computes, W"),
    "communicating_w": Param(to_float, None, "one device's power in an exposed collective, W"),
    "idle_w": Param(to_float, None, "one device's power while it waits (bubbles, the slowest rank), W"),
    "host_w": Param(to_float, None, "one node's power besides its devices (CPUs, memory, NICs, fans), W"),
    "network_w": Param(to_float, None, "one node's share of the network's switches, W"),
    "usd_per_gpu_hour": Param(to_float, None, "what one device costs an hour, US dollars"),
    "pue": Param(to_float, None, "the facility's power over its IT equipment's (power usage effectiveness), ≥ 1"),
    "grid": Param(call_of(GRIDS, "grid"), None, "the electricity's carbon intensity: region(\"us\") (Ember 2023) "
                                              "or intensity(g_per_kwh = 120, region = \"where\")"),
}

# -- offload: what leaves the device for the host (runtime/offload.py; compiler/rules/offload.py refuses what cannot
# run) -------------------------------------------------------------------------------------------------------------

OFFLOADS = {"none": {},
            "optimizer": {"fraction": Param(to_float, 1.0, "the share of the optimizer's state (fp32 masters where "
                                                          "kept, AdamW's moments), by parameter count, kept and "
                                                          "stepped on the host: 0 to 1")},
            "params": {},
            "activations": {"modules": Param(lambda c, e, w: c.as_names(e, w, choices.OFFLOAD_MODULES), (),
                                             "which block modules' saved activations go to the host: "
                                             "(attention, mlp); none or left out: every one of the block")}}

PLAN_SETTINGS: dict[str, Param] = {
    "data_parallel": Param(one_of(*choices.DATA_PARALLEL), "ddp", "how dp holds model state"),
    "micro_batches": Param(to_pos_int, 1, "gradient-accumulation micro-batches per step"),
    "tp_layers": Param(lambda c, e, w: c.as_names(e, w, TP_LAYERS), TP_LAYERS, "what tp shards"),
    "sequence_parallel": Param(to_bool, False, "shard norms and residuals along the sequence over tp"),
    "pad_vocab": Param(to_bool, False, "pad the vocabulary to a multiple of tp (padded logits masked)"),
    "schedule": Param(one_of(*choices.SCHEDULES), "1f1b", "pipeline schedule"),
    "virtual_stages": Param(to_pos_int, 1, "pipeline stages per pp rank (interleaved-1f1b)"),
    "layout": Param(lambda c, e, w: c.as_ranges(e, w), (), "manual stage layout: ((first, end), ...) blocks"),
    "recompute": Param(one_of(*choices.RECOMPUTE), "none",
                       "activation recomputation of each block in backward: none, selective (attention core and "
                       "cheap ops; matmul and collective outputs kept) or full (from the block's input)"),
    "compile": Param(to_bool, None, "torch.compile each block and the code around them (default: true on GPUs, "
                                  "false on cpu)"),
    "grad_reduce": Param(one_of("fp32", "bf16"), "fp32",
                         "under bf16: the dtype gradients are accumulated and reduced in (Megatron's main gradients, "
                         "FSDP2's reduce_dtype)"),
    "fp32_residual": Param(to_bool, False, "under bf16: keep the residual stream fp32 (Megatron's "
                                         "--fp32-residual-connection)"),
    "fsdp_grad_sync": Param(one_of("step", "micro_batch"), "step",
                            "when fsdp and zero2 reduce-scatter the gradients of several micro-batches: step (the "
                            "last micro-batch; whole gradients accumulated until then) or micro_batch (every one: "
                            "they stay sharded, m× the reduce-scatters)"),
    "context_parallel": Param(one_of(*choices.CONTEXT_PARALLEL), "all_gather",
                              "how attention runs over a sequence sharded over cp: all_gather (keys and values "
                              "gathered once per layer), ring (passed around the cp group) or all_to_all (Ulysses: heads "
                              "scattered, the sequence gathered)"),
    "offload": Param(call_of(OFFLOADS, "kind of offload"), ("none", {}),
                     "what leaves the device for the host: none, optimizer(fraction = 0.5) (that share of the "
                     "optimizer's state, stepped on the host), params (FSDP2's CPUOffloadPolicy, fsdp and zero2) or "
                     "activations(modules = (attention, mlp)) (the blocks' saved activations)"),
    "ep_dispatch": Param(one_of(*choices.EP_DISPATCH), "nodes",
                         "how a grouped moe's tokens reach experts on other nodes: nodes (each token crosses to a node "
                         "once, then fans out inside it; the combine sums on the node first) or direct (each choice "
                         "to its expert's rank)"),
}

OPTIMIZERS = {"adamw": {"lr": Param(to_float, doc="peak learning rate"),
                        "betas": Param(lambda c, e, w: c.as_floats(e, w, 2), (0.9, 0.95), "Adam betas"),
                        "weight_decay": Param(to_float, 0.1, "decoupled weight decay"),
                        "eps": Param(to_float, 1e-8, "Adam epsilon")}}
SCHEDULES = {"cosine": {"warmup": Param(to_int, 0, "linear warm-up steps"),
                        "min_lr": Param(to_float, 0.0, "learning rate at the last step")},
             "constant": {"warmup": Param(to_int, 0, "linear warm-up steps")}}
INITS = {"normal": {}, "from": {"path": Param(to_string, doc="a Hugging Face checkpoint: its directory or a "
                                                            ".safetensors file")}}
DATASETS = {"synthetic": {},
            "tokens": {"path": Param(to_string, doc="binary file of token ids"),
                       "dtype": Param(one_of(*F.ITEMSIZE), "uint16", "token id type (a .npy file's header says "
                                                                     "it)"),
                       "document_separator": Param(to_int, None, "the id ending each document: packed documents, "
                                                               "each attending only to itself")}}


# `precision`: fp32, bf16 (Megatron's mixed precision: runtime/precision.py) or fp8(...): bf16 with the blocks'
# linears chosen by `filter` computing in FP8 (torchao's float8 training: runtime/fp8.py)
PRECISIONS = {"fp32": {}, "bf16": {},
              "fp8": {"recipe": Param(one_of(*choices.FP8_RECIPES), "tensorwise",
                                      "tensorwise (one scale per tensor) or rowwise (one per row)"),
                      "filter": Param(one_of(*choices.FP8_FILTERS), "auto",
                                      "which linears: auto (where FP8 pays, by shape) or all")}}

TRAIN_SETTINGS: dict[str, Param] = {
    "global_batch": Param(to_size, doc="sequences per optimizer step, over all dp ranks"),
    "seq_len": Param(to_size, doc="tokens per sequence"),
    "steps": Param(to_pos_int, None, "optimizer steps (or `tokens`)"),
    "tokens": Param(to_float, None, "tokens to train on (`15.6T`): the steps are tokens / (global_batch × "
                                    "seq_len), rounded up; instead of `steps`"),
    "seed": Param(to_int, 1234, "seed of initialisation and data"),
    "precision": Param(call_of(PRECISIONS, "precision"), ("fp32", {}),
                       "compute precision: fp32, bf16 or fp8(recipe = tensorwise, filter = auto)"),
    "optimizer": Param(call_of(OPTIMIZERS, "optimizer"), ("adamw", None), "the optimizer"),
    "lr_schedule": Param(call_of(SCHEDULES, "schedule"), ("constant", {"warmup": 0}), "learning-rate schedule"),
    "grad_clip": Param(to_float, 1.0, "global gradient-norm clip; 0 turns it off"),
    "data": Param(call_of(DATASETS, "dataset"), ("synthetic", {}), "training data"),
    "log_every": Param(to_pos_int, 1, "steps between progress lines"),
    "init": Param(call_of(INITS, "initialisation"), ("normal", {}), "the starting weights: normal (GPT-2's "
                  "initialisation, by name) or from(\"DIR or FILE.safetensors\") (a Hugging Face checkpoint)"),
    "checkpoint_dir": Param(to_string, "", "where checkpoints go; empty for none"),
    "checkpoint_every": Param(to_count_or_auto, 0, "steps between checkpoints; 0 for only the last; auto: the "
                              "Young–Daly interval of the failure model (the `resilience` section)"),
    "checkpoint_async": Param(to_bool, False, "write each checkpoint but the last in the background (DCP's "
                              "async_save): the next steps run while its files are written"),
    "restarts": Param(to_int, None, "times torchrun restarts a failed job (from the last checkpoint); default 3 "
                                  "with checkpoint_dir, 0 without"),
    "timeout": Param(to_duration, 600.0, "a collective that has not completed after this long ends the job, naming "
                                       "the ranks and the operation; 0 turns the watchdog off"),
    "eval_every": Param(to_pos_int, 0, "steps between evaluations on held-out data (and after the last); none by "
                                     "default"),
    "eval_batches": Param(to_pos_int, 8, "global batches each evaluation reads, the same ones every time"),
    "eval_split": Param(to_float, None, "the share of a token file held out for evaluation, in (0, 0.5]: its last "
                                      "windows, never trained on"),
}

# -- the resilience section: stragglers, what to do about one, and the failure model goodput is priced with -------

STRAGGLERS = {"detect": {"threshold": Param(to_float, choices.STRAGGLER_THRESHOLD,
                                             "a rank scoring below this (relative to the fastest rank doing the same "
                                             "work, or to its own best) is named"),
                         "window": Param(to_pos_int, choices.STRAGGLER_WINDOW,
                                         "steps between gathers and scores on rank 0")},
              "off": {}}
ON_STRAGGLER = {"report": {}, "restart": {"exclude": Param(one_of("node"), "node", "what the restart leaves out")},
                "replan": {}}
INTERRUPTIONS = {"observed": {"count": Param(to_float, doc="interruptions seen"),
                              "days": Param(to_float, doc="over this many days"),
                              "gpus": Param(to_pos_int, doc="on this many GPUs (devices)")},
                 "per_gpu_hour": {"rate": Param(to_float, doc="interruptions per device-hour")}}

RESILIENCE_SETTINGS: dict[str, Param] = {
    "stragglers": Param(call_of(STRAGGLERS, "straggler detection"),
                        ("detect", {"threshold": choices.STRAGGLER_THRESHOLD, "window": choices.STRAGGLER_WINDOW}),
                        "detect(threshold, window): time each rank's step sections and name the slow ones; off"),
    "on_straggler": Param(call_of(ON_STRAGGLER, "straggler action"), ("report", {}),
                          "report (the log and metrics name it), restart(exclude = node) (end the attempt and rejoin "
                          "without its node) or replan (search again on the machines left and resume)"),
    "interruptions": Param(call_of(INTERRUPTIONS, "failure rate"),
                           ("observed", {"count": float(FAIL.LLAMA3_INTERRUPTIONS), "days": float(FAIL.LLAMA3_DAYS),
                                         "gpus": FAIL.LLAMA3_GPUS}),
                           "how often a device fails the job: observed(count, days, gpus) or per_gpu_hour(rate); "
                           "default Llama 3's 419 in 54 days on 16,384 GPUs"),
    "restart": Param(to_duration, None, "seconds one restart costs (start-up, checkpoint load, compile); default "
                                        "predicted"),
    "storage_write_gbps": Param(to_float, None, "GB/s one node writes a checkpoint at; default "
                                                f"{FAIL.STORAGE_GBPS_PER_NODE:.3g} ({FAIL.STORAGE_SOURCE})"),
    "storage_read_gbps": Param(to_float, None, "GB/s one node reads a checkpoint at (a restart); default as "
                                               "storage_write_gbps"),
}

# The largest share of a token file `eval_split` holds out: more is a slip (the fraction trained on, written for
# the one held out), and training on half a file is already an experiment, not a run.
MAX_EVAL_SPLIT = 0.5

SECTIONS = ("model", "mesh", "plan", "train", "resilience")

# Names other tools give a setting (Hugging Face's Trainer, Megatron, nanoGPT) -> the setting here.
ALIASES = {"batch_size": "global_batch", "global_batch_size": "global_batch", "train_batch_size": "global_batch",
           "max_steps": "steps", "train_steps": "steps", "train_iters": "steps", "iterations": "steps",
           "iters": "steps", "epochs": "steps", "num_train_epochs": "steps", "seq_length": "seq_len",
           "max_seq_len": "seq_len", "block_size": "seq_len", "context_length": "seq_len",
           "max_grad_norm": "grad_clip", "clip_grad": "grad_clip", "gradient_clipping": "grad_clip",
           "dtype": "precision", "mixed_precision": "precision", "learning_rate": "lr", "warmup_steps": "warmup",
           "warmup_iters": "warmup", "gradient_accumulation_steps": "micro_batches", "grad_accum": "micro_batches",
           "accumulation_steps": "micro_batches", "save_dir": "checkpoint_dir", "output_dir": "checkpoint_dir",
           "save_every": "checkpoint_every", "save_steps": "checkpoint_every", "log_interval": "log_every",
           "logging_steps": "log_every", "max_restarts": "restarts", "eval_interval": "eval_every",
           "eval_steps": "eval_every", "eval_iters": "eval_batches"}
CALL_ARGUMENTS = (("precision", "PRECISIONS"), ("offload", "OFFLOADS"), ("optimizer", "OPTIMIZERS"),
                  ("lr_schedule", "SCHEDULES"), ("data", "DATASETS"),
                  ("stragglers", "STRAGGLERS"), ("on_straggler", "ON_STRAGGLER"), ("interruptions", "INTERRUPTIONS"))


# What a device's figures can be, with room for devices to come (today's largest: about 2,500 TFLOP/s, 192 GB,
# 8,000 GB/s of memory bandwidth, 900 GB/s between GPUs of a node); a figure outside is almost surely in other units
# (bytes for GB, FLOP/s for TFLOP/s, seconds for µs).
FIGURE_RANGES = {"peak_tflops": (None, 1e5, "TFLOP/s: 989 for an H100, not 989e12"),
                 "memory_gb": (None, 1e5, "GB: 80 for an H100, not 80e9 bytes"),
                 "hbm_gbps": (None, 1e6, "GB/s: 3350 for an H100"),
                 "intra_node_gbps": (None, 1e5, "GB/s: 450 for NVLink 4, one way"),
                 "inter_node_gbps": (None, 1e5, "GB/s: 50 for a 400 Gb/s NIC"),
                 "intra_node_latency_us": (0.01, None, "µs: a few, not seconds"),
                 "inter_node_latency_us": (0.01, None, "µs: a few, not seconds"),
                 "op_overhead_us": (0.01, None, "µs: a few, not seconds")}



def placement(key: str, section: str) -> tuple[str, str | None]:
    """Where a setting unknown in `section` belongs: another section, an argument of a call, or the name of a
    setting another tool calls `key` (`batch_size`, `epochs`); ("", None) when it is none of these. The second item
    is the setting of `section` meant, if any (then not reported again as missing)."""
    name = ALIASES.get(key, key)
    tables = {"mesh": MESH_SETTINGS, "plan": PLAN_SETTINGS, "train": TRAIN_SETTINGS, "resilience": RESILIENCE_SETTINGS}
    said = f"`{key}` is called `{name}` here; " if name != key else ""
    if name in tables.get(section, {}):
        why = ", not epochs" if key in ("epochs", "num_train_epochs") else ""
        return f"write `{name} = ...` ({tables[section][name].doc}{why})", name
    for other, table in tables.items():
        if name in table:
            return said + f"it belongs in the `{other}` section: `{other} {{ {name} = ... }}`", None
    for setting, table_name in CALL_ARGUMENTS:
        for kind, args in globals()[table_name].items():
            if name in args:
                return said + f"it is an argument of `{setting}`: `{setting} = {kind}({name} = ...)`", None
    if name in KNOWN_AXES:
        return f"axes are declared in the `mesh` section: `axis {name} = ...`", None
    return "", None
