"""Every setting the checker reads reaches what the run executes, or is explicitly only the cost model's.

The settings are enumerated from the checker's own tables (compiler/language.py: MESH_SETTINGS, PLAN_SETTINGS,
TRAIN_SETTINGS and the argument tables of call-valued settings such as `optimizer = adamw(...)`), so a setting
added there fails `test_every_setting_is_covered` until it is given a change here. Each change must alter the
emitted program.py or launch.sh: the files the run executes. plan.json is not compared: it is a report that also
holds the cost model's figures, which change with a setting the run never sees.
"""
from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from compiler import check as K
from compiler import codegen
from compiler.check import check_text
from compiler.diagnostics import ScaleError
from compiler.pipeline import compile_spec

ROOT = Path(__file__).resolve().parents[1]
G3 = "samples/gpt_3d.scale"  # dp × pp × tp with sequence parallelism: every plan setting applies
TP = "samples/gpt_tp.scale"
DP = "samples/gpt_dp.scale"
LLAMA = "tests/mistakes/files/files_llama.scale"  # a tiny Llama; tests/mistakes/files/files_llama/ is its checkpoint
TOKENS = ("data         = synthetic", 'data         = tokens(path = "a.bin")')
INTERLEAVED = ('schedule = "1f1b"', 'schedule = "interleaved-1f1b"')
CONSTANT = ("cosine(warmup = 5, min_lr = 3e-4)", "constant(warmup = 5)")
CKPT = ("data         = synthetic", 'data         = synthetic\n  checkpoint_dir = "ckpt"')
BF16 = ("precision    = fp32", "precision    = bf16")
EVAL = ("log_every    = 10", "log_every    = 10  eval_every = 5")
# a resilience section (written before the train section), and two nodes of one device for gpt_dp (a node to exclude)
RESILIENCE = ("\ntrain {", "\nresilience {\n  stragglers = detect(threshold = 0.7, window = 20)\n}\n\ntrain {")
TWO_NODES = (("nodes = 1", "nodes = 2"), ("devices_per_node = 2", "devices_per_node = 1"))
# checkpoints every `auto` steps, with failures frequent enough that the tiny model's interval is a few steps
AUTO = (('"ckpt"', '"ckpt"  checkpoint_every = auto'),
        ("window = 20)", "window = 20)\n  interruptions = per_gpu_hour(1000)"))


@dataclass(frozen=True)
class Change:
    edits: tuple
    """(old, new) replacements that change the setting."""
    sample: str = G3
    setup: tuple = ()
    """Replacements applied to both texts first (a context where the setting applies)."""


# Settings read only by the cost model (plan's FLOP time, memory warnings, bandwidths): the runtime places ranks
# on whatever accelerator it finds (runtime/mesh.py), so these cannot and need not reach the program.
COST_MODEL_ONLY = {
    "mesh.device": "the device kind picks the cost model's peak FLOP/s, memory and bandwidths; the runtime uses the "
                   "accelerator it finds (CUDA, else CPU)",
    "mesh.peak_tflops": "cost model: time per step at peak",
    "mesh.memory_gb": "cost model: the memory budget `compile` and `plan` check against",
    "mesh.intra_node_gbps": "cost model: bandwidth inside a node",
    "mesh.inter_node_gbps": "cost model: bandwidth between nodes",
    "mesh.hbm_gbps": "cost model: memory-bound ops' time",
    "mesh.matmul_efficiency": "cost model: the rate of a large matmul",
    "mesh.attention_efficiency": "cost model: the rate of fused attention",
    "mesh.intra_node_latency_us": "cost model: a collective step's latency inside a node",
    "mesh.inter_node_latency_us": "cost model: a collective step's latency between nodes",
    "mesh.op_overhead_us": "cost model: the least time of one eager op",
    # The network (issue 40): the Cluster holds it for the collectives' pricing on the topology's levels; the
    # runtime's NCCL finds the fabric itself. Each shape is refused where impossible (E0320, E0321) and warned
    # where it does nothing (W0320, tests/test_network_settings.py).
    "mesh.fabric": "cost model: the fabric's efficiency (ib or roce)",
    "mesh.topology": "cost model: the levels a group's traffic crosses and their oversubscription",
    **{f"mesh.topology.{kind}.{arg}": "cost model: the topology's shape"
       for kind, args in K.TOPOLOGIES.items() for arg in args},
    "mesh.scale_up": "cost model: the NVLink domain a group may stay in over several nodes",
    # What the machines draw and cost (issue 42): plan's power, energy, cost and run blocks and plan.json's "step",
    # "run" and "power"; the program measures what it draws (runtime/energy.py) whatever these say. A price or a
    # power of 0, a PUE below 1, a grid figure without its region are refused (tests/mistakes/front_cost_*).
    **{f"mesh.{k}": "cost model: energy and dollars" for k in ("active_w", "communicating_w", "idle_w", "host_w",
                                                               "network_w", "usd_per_gpu_hour", "pue")},
    "mesh.grid": "cost model: carbon", "mesh.grid.region.name": "cost model: carbon",
    "mesh.grid.intensity.g_per_kwh": "cost model: carbon", "mesh.grid.intensity.region": "cost model: carbon",
    # Not in the program yet: the Plan holds it and plan.json reports it; issue 40's codegen part writes the rank
    # lists it gives into the contract. Refused where it is no order of the axes (E0322), warned where every
    # order is alike (W0321).
    "mesh.placement": "the Plan's rank order: plan.json and `plan` today, the program's groups later",
    # The failure model (issue 41): `plan`'s goodput block and plan.json's "goodput"; the program sees the
    # interruption rate and the write bandwidth only through `checkpoint_every = auto`'s interval (CHANGES below)
    "resilience.interruptions": "cost model: the failure rate of plan's goodput (and auto's checkpoint interval)",
    **{f"resilience.interruptions.{kind}.{arg}": "cost model: the failure rate"
       for kind, args in K.INTERRUPTIONS.items() for arg in args},
    "resilience.restart": "cost model: a restart's seconds in plan's ETTR (Young's interval does not depend on it)",
    "resilience.storage_write_gbps": "cost model: a save's seconds (and auto's checkpoint interval)",
    "resilience.storage_read_gbps": "cost model: a restart's checkpoint load in plan's ETTR",
}

# Arguments with one value today: written, the program holds what it holds without them.
SINGLE_VALUED = {"resilience.on_straggler.restart.exclude": "`node` is the one unit a restart leaves out today"}

# Settings that only permit what the compiler does whenever it is needed: their effect is that the file is
# accepted at all. Each is shown refused with its default and accepted with the change.
PERMISSIONS = {
    # The tp pass pads whenever tp does not divide the vocabulary; pad_vocab = false refuses such a plan (E0403).
    "plan.pad_vocab": Change((("sequence_parallel = false", "sequence_parallel = false  pad_vocab = true"),),
                             sample=TP, setup=(("vocab  = 128", "vocab  = 127"),)),
}

CHANGES = {
    # context parallelism: ring attention instead of gathered keys (ring_attention in the program)
    "plan.context_parallel": Change((("micro_batches = 1", "micro_batches = 1  context_parallel = ring"),), sample=DP,
                                   setup=(("axis dp = 2", "axis cp = 2"),)),
    # nodes × devices_per_node is the mesh's size: a change of one moves the other.
    "mesh.nodes": Change((("nodes = 1", "nodes = 2"), ("devices_per_node = 8", "devices_per_node = 4"))),
    "mesh.devices_per_node": Change((("devices_per_node = 8", "devices_per_node = 16"),
                                     ("axis dp = 2", "axis dp = 4"))),
    "plan.data_parallel": Change((("data_parallel = ddp", "data_parallel = fsdp"),)),
    "plan.micro_batches": Change((("micro_batches = 4", "micro_batches = 8"),)),
    "plan.tp_layers": Change((("sequence_parallel = false",
                               "sequence_parallel = false  tp_layers = (attention, mlp)"),), sample=TP),
    "plan.sequence_parallel": Change((("sequence_parallel = true", "sequence_parallel = false"),)),
    "plan.schedule": Change((('schedule = "1f1b"', "schedule = gpipe"),)),
    "plan.virtual_stages": Change(((INTERLEAVED[1], INTERLEAVED[1] + "  virtual_stages = 2"),),
                                  setup=(INTERLEAVED,)),
    "plan.recompute": Change((('schedule = "1f1b"', 'schedule = "1f1b"  recompute = selective'),)),
    "plan.compile": Change((('schedule = "1f1b"', 'schedule = "1f1b"  compile = true'),)),
    "plan.layout": Change((('schedule = "1f1b"', 'schedule = "1f1b"  layout = ((0, 3), (3, 4))'),)),
    "plan.grad_reduce": Change((("data_parallel = ddp", "data_parallel = ddp  grad_reduce = bf16"),), setup=(BF16,)),
    "plan.fp32_residual": Change((("data_parallel = ddp", "data_parallel = ddp  fp32_residual = true"),),
                                 setup=(BF16,)),
    # FSDP2 over dp with two micro-batches, no pp: where it chooses when the reduce-scatters run
    "plan.fsdp_grad_sync": Change((("micro_batches = 2", "micro_batches = 2  fsdp_grad_sync = micro_batch"),),
                                  sample=DP, setup=(("data_parallel = ddp", "data_parallel = fsdp"),
                                                    ("micro_batches = 1", "micro_batches = 2"))),
    # ep 2 over two nodes of one, a grouped moe: the node dispatch (runtime/moe_nodes.py, the default) or direct
    "plan.ep_dispatch": Change((("micro_batches = 2", "micro_batches = 2  ep_dispatch = direct"),),
                               sample="samples/tiny_deepseek.scale", setup=TWO_NODES),
    # offload (runtime/offload.py): the kind, the optimizer's fraction and the activations' modules reach Parallel
    "plan.offload": Change(((INTERLEAVED[0], INTERLEAVED[0] + "  offload = optimizer(fraction = 0.5)"),)),
    "plan.offload.optimizer.fraction": Change((("fraction = 0.5", "fraction = 0.25"),),
                                              setup=((INTERLEAVED[0], INTERLEAVED[0] + "  offload = optimizer("
                                                                                       "fraction = 0.5)"),)),
    "plan.offload.activations.modules": Change((("offload = activations", "offload = activations(modules = mlp)"),),
                                               setup=((INTERLEAVED[0], INTERLEAVED[0] + "  offload = activations"),)),
    "train.global_batch": Change((("global_batch = 16", "global_batch = 32"),)),
    "train.seq_len": Change((("seq_len      = seq", "seq_len      = 16"),)),
    "train.steps": Change((("steps        = 60", "steps        = 61"),)),
    # the steps as tokens over a step's (16 sequences of 32): 30,720 tokens are 60 steps, 31K rounds up to 61
    "train.tokens": Change((("tokens       = 30720", "tokens       = 31K"),),
                           setup=(("steps        = 60", "tokens       = 30720"),)),
    "train.seed": Change((("seed         = 1234", "seed         = 1235"),)),
    "train.precision": Change((("precision    = fp32", "precision    = bf16"),)),
    "train.precision.fp8.recipe": Change((("fp8(filter = all)", "fp8(recipe = rowwise, filter = all)"),),
                                         setup=(("precision    = fp32", "precision    = fp8(filter = all)"),)),
    "train.precision.fp8.filter": Change((("fp8()", "fp8(filter = all)"),),
                                         setup=(("precision    = fp32", "precision    = fp8()"),)),
    "train.optimizer": Change((("adamw(lr = 3e-3, betas = (0.9, 0.95), weight_decay = 0.1)",
                                "adamw(lr = 1e-3, betas = (0.8, 0.9), weight_decay = 0.0)"),)),
    "train.optimizer.adamw.lr": Change((("lr = 3e-3", "lr = 1e-3"),)),
    "train.optimizer.adamw.betas": Change((("betas = (0.9, 0.95)", "betas = (0.9, 0.99)"),)),
    "train.optimizer.adamw.weight_decay": Change((("weight_decay = 0.1", "weight_decay = 0.01"),)),
    "train.optimizer.adamw.eps": Change((("weight_decay = 0.1", "weight_decay = 0.1, eps = 1e-6"),)),
    "train.lr_schedule": Change((CONSTANT,)),
    "train.lr_schedule.cosine.warmup": Change((("warmup = 5", "warmup = 6"),)),
    "train.lr_schedule.cosine.min_lr": Change((("min_lr = 3e-4", "min_lr = 1e-4"),)),
    "train.lr_schedule.constant.warmup": Change((("warmup = 5", "warmup = 6"),), setup=(CONSTANT,)),
    "train.grad_clip": Change((("grad_clip    = 1.0", "grad_clip    = 0.5"),)),
    "train.data": Change((TOKENS,)),
    "train.data.tokens.path": Change((('"a.bin"', '"b.bin"'),), setup=(TOKENS,)),
    "train.data.tokens.dtype": Change((('"a.bin"', '"a.bin", dtype = uint32'),), setup=(TOKENS,)),
    "train.data.tokens.document_separator": Change((('"a.bin"', '"a.bin", document_separator = 0'),),
                                                   sample=DP, setup=(TOKENS,)),
    # a tiny Llama and its checkpoint (check reads the checkpoint's headers against the model)
    "train.init": Change((('  init = from("files_llama")\n', ""),), sample=LLAMA),
    "train.init.from.path": Change((('"files_llama"', '"w2"'),), sample=LLAMA),
    "train.log_every": Change((("log_every    = 10", "log_every    = 5"),)),
    "train.checkpoint_dir": Change((CKPT,), sample=DP),
    "train.checkpoint_every": Change((('"ckpt"', '"ckpt"  checkpoint_every = 3'),), sample=DP, setup=(CKPT,)),
    "train.checkpoint_async": Change((('"ckpt"', '"ckpt"  checkpoint_async = true'),), sample=DP,
                                     setup=(CKPT, ('"ckpt"', '"ckpt"  checkpoint_every = 3'))),
    "train.restarts": Change((("log_every    = 10", "log_every    = 10  restarts = 2"),)),
    "train.timeout": Change((("log_every    = 10", 'log_every    = 10  timeout = "30 s"'),)),
    "train.eval_every": Change((EVAL,)),
    "train.checkpoint_every auto": Change((('"ckpt"', '"ckpt"  checkpoint_every = auto'),), sample=DP,
                                          setup=(CKPT, RESILIENCE, AUTO[1])),
    "resilience.stragglers": Change((("detect(threshold = 0.7, window = 20)", "off"),), sample=DP, setup=(RESILIENCE,)),
    "resilience.stragglers.detect.threshold": Change((("threshold = 0.7", "threshold = 0.8"),), sample=DP,
                                                     setup=(RESILIENCE,)),
    "resilience.stragglers.detect.window": Change((("window = 20", "window = 10"),), sample=DP, setup=(RESILIENCE,)),
    "resilience.on_straggler": Change((("window = 20)", "window = 20)\n  on_straggler = restart"),), sample=DP,
                                      setup=(RESILIENCE, *TWO_NODES)),
    "resilience.interruptions.per_gpu_hour.rate": Change((("per_gpu_hour(1000)", "per_gpu_hour(20)"),), sample=DP,
                                                         setup=(CKPT, RESILIENCE, *AUTO)),
    "resilience.storage_write_gbps": Change((("per_gpu_hour(1000)",
                                              "per_gpu_hour(1000)  storage_write_gbps = 0.01"),),
                                            sample=DP, setup=(CKPT, RESILIENCE, *AUTO)),
    "train.eval_batches": Change((("eval_every = 5", "eval_every = 5  eval_batches = 2"),), setup=(EVAL,)),
    # a.bin holds 2048 uint16 ids: 63 windows of 33, of which 0.3 holds out 18 and 0.5 holds out 31
    "train.eval_split": Change((("eval_split = 0.3", "eval_split = 0.5"),),
                               setup=(TOKENS, (EVAL[0], EVAL[1] + "  eval_batches = 1  eval_split = 0.3"))),
}


def _call_tables(param: K.Param) -> list[dict]:
    """The argument tables of a call-valued setting (`_call_of(TABLE, ...)`): {kind: {argument: Param}}."""
    cells = getattr(param.convert, "__closure__", None) or ()
    return [cell.cell_contents for cell in cells if isinstance(cell.cell_contents, dict)
            and all(isinstance(args, dict) and all(isinstance(p, K.Param) for p in args.values())
                    for args in cell.cell_contents.values())]


def settings() -> list[str]:
    names = []
    for section, table in (("mesh", K.MESH_SETTINGS), ("plan", K.PLAN_SETTINGS), ("train", K.TRAIN_SETTINGS),
                           ("resilience", K.RESILIENCE_SETTINGS)):
        for key, param in table.items():
            names.append(f"{section}.{key}")
            for kinds in _call_tables(param):
                names += [f"{section}.{key}.{kind}.{arg}" for kind, args in kinds.items() for arg in args]
    return names


def test_every_setting_is_covered():
    names = settings()
    assert "train.optimizer.adamw.lr" in names and "train.data.tokens.path" in names  # the tables are found
    covered = {k.split()[0] for k in CHANGES} | COST_MODEL_ONLY.keys() | PERMISSIONS.keys() | SINGLE_VALUED.keys()
    assert not set(names) - covered, (f"settings the checker reads with no change here: "
                                      f"{sorted(set(names) - covered)}; give each a Change in CHANGES")
    assert not covered - set(names), f"settings here the checker no longer reads: {sorted(covered - set(names))}"


def _text(change: Change, changed: bool) -> str:
    text = (ROOT / change.sample).read_text()
    for old, new in change.setup + (change.edits if changed else ()):
        assert text.count(old) == 1, f"`{old}` is not once in {change.sample}"
        text = text.replace(old, new)
    return text


def _beside(tmp_path: Path) -> None:
    """The files a .scale file in tmp_path may name, which check reads."""
    for name in ("a.bin", "b.bin"):  # token files beside the .scale file, fitting uint16 and uint32
        (tmp_path / name).write_bytes(bytes(4096))
    for name in ("files_llama", "w2"):  # checkpoints to start from, which check reads: the tiny Llama's
        shutil.copytree(ROOT / "tests" / "mistakes" / "files" / "files_llama", tmp_path / name, dirs_exist_ok=True)


def _emitted(text: str, tmp_path: Path) -> dict:
    _beside(tmp_path)
    compiled = compile_spec(check_text(text, str(tmp_path / "plan.scale")))
    spec, traced, costs = compiled.spec, compiled.traced, compiled.costs
    return {"program.py": codegen.program(spec, traced, costs, compiled.plan, str(tmp_path / "build")),
            "launch.sh": codegen.launch_script(spec, compiled.plan)}


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_setting_changes_what_the_run_executes(name, tmp_path):
    change = CHANGES[name]
    base, changed = _emitted(_text(change, False), tmp_path), _emitted(_text(change, True), tmp_path)
    assert base != changed, (f"`{name}`: the checker reads it, but program.py and launch.sh are the same with "
                             f"{change.edits}: the setting never reaches the run")


@pytest.mark.parametrize("name", sorted(PERMISSIONS))
def test_permission_changes_what_is_accepted(name, tmp_path):
    change = PERMISSIONS[name]
    with pytest.raises(ScaleError):
        _emitted(_text(change, False), tmp_path)
    _emitted(_text(change, True), tmp_path)


def test_runtime_reads_every_config_field():
    """What program.py carries is read: each field of runtime.config.Config is used as `cfg.<field>` in the runtime,
    each field of a group as `.<group>.<field>` or through a local bound to the group (`par = cfg.parallel`, then
    `par.<field>`). (Reading is not honouring on every path: bf16 under pp was read and ignored; the e2e bf16 cases
    pin that.)"""
    import dataclasses
    import inspect
    import re

    from runtime.config import GROUPS, Config
    source = "".join(p.read_text() for p in (ROOT / "runtime").glob("*.py") if p.name != "config.py")
    groups = dict(GROUPS)
    unread = [f.name for f in dataclasses.fields(Config)
              if f.name not in groups and not re.search(rf"\bcfg\.{f.name}\b", source)]
    for group, cls in GROUPS:
        aliases = {group} | set(re.findall(rf"\b(\w+) = (?:self\.)?cfg\.{group}\b", source))
        # a property the group mixes in reads its fields as `self.<field>` (choices.DataParallelMode: data_parallel)
        mixed = "".join(inspect.getsource(base) for base in cls.__mro__[1:] if base.__module__.startswith("runtime."))
        # and a property of the group's own that the runtime reads reads its fields (Parallel.ranks: placement)
        mixed += "".join(inspect.getsource(v.fget) for k, v in vars(cls).items() if isinstance(v, property)
                         and any(re.search(rf"\b{a}\.{k}\b", source) for a in aliases))
        unread += [f"{group}.{f.name}" for f in dataclasses.fields(cls)
                   if not any(re.search(rf"\b{a}\.{f.name}\b", source) for a in aliases)
                   and not re.search(rf"\bself\.{f.name}\b", mixed)]
    assert not unread, f"Config fields the runtime never reads: {unread}"


# -- every setting, in every plan shape: it reaches the program, or the check names it at its span ---------------
#
# The tests above show each setting reaching the program in one plan where it applies. A setting can still do
# nothing in another plan (sequence parallelism without tp, a pipeline schedule without pp, ZeRO with dp = 1). So each
# setting and layer argument is written here with values other than its default in each of a few plan shapes, and
# one of three must hold: the program the run executes changes (program.py without its comments and the cost
# model's figures, and launch.sh), the check refuses the file (the setting is surely a mistake there), or the check
# warns at the setting's line (the setting has no effect there and the user is told). A setting or argument added to
# the checker's tables without a probe here fails `test_every_setting_and_argument_is_probed`.

SHAPES = {"one device": "samples/tiny_gpt.scale", "dp": DP, "tp": TP, "pp": "samples/gpt_pp.scale", "dp×pp×tp": G3,
          "ep": "samples/moe_gpt.scale", "llama": LLAMA, "mla": "samples/tiny_deepseek.scale"}
TRAIN_SHAPES = ("one device", "dp×pp×tp")  # the training settings do not depend on the plan's axes
LAYER_SHAPES = ("one device", "tp")


@dataclass(frozen=True)
class Probe:
    values: tuple
    """Values other than the default, each written in turn: a setting's text, or for a layer argument a dict
    {argument: text} written into every call of that layer kind."""
    base: object = None
    """Written in both texts first (the context the values are compared in); None: the sample as it is."""
    shapes: tuple = tuple(SHAPES)
    setup: tuple = ()
    """Other settings written in both texts first: ((section.key, value), ...)."""


INTERLEAVE = (("plan.schedule", '"interleaved-1f1b"'),)
ADAMW = "adamw(lr = 3e-3)"
TOKENS_A = 'tokens(path = "a.bin")'
COSINE = "cosine(warmup = 5)"
ROPE = {"rope_theta": "10000", "rope_scaling": "llama3"}
YARN_ARGS = "factor = 4, original_seq = 8"  # the samples' sequences are longer: YaRN's ramp divides frequencies
# yarn's arguments, each with a value other than its default (factor and original_seq: replacing the base's)
YARN_VALUES = (("factor", ("factor = 4", "factor = 8")), ("original_seq", ("original_seq = 8", "original_seq = 4")),
               ("beta_fast", "16"), ("beta_slow", "2"), ("mscale", "0.707"), ("mscale_all_dim", "1.0"),
               ("attention_factor", "1.2"), ("truncate", "false"))

GROUPED = {"capacity_factor": "none", "dispatch": "grouped"}  # dropless without padding (moe's `dispatch`)

PROBES: dict[str, tuple[Probe, ...]] = {
    "plan.data_parallel": (Probe(("fsdp", "zero1", "zero2")),),
    "plan.micro_batches": (Probe(("2", "8")),),
    "plan.tp_layers": (Probe(("(attention, mlp)", "none")),),
    "plan.sequence_parallel": (Probe(("true",)),),
    "plan.pad_vocab": (Probe(("true",)),),
    "plan.schedule": (Probe(("gpipe", '"zero-bubble"', '"interleaved-1f1b"')),),
    "plan.virtual_stages": (Probe(("2",)), Probe(("2",), setup=INTERLEAVE)),
    "plan.layout": (Probe(("((0, 3), (3, 4))", "((0, 1), (1, 2))")),),
    "plan.recompute": (Probe(("selective", "full")),),
    "plan.compile": (Probe(("true",)),),  # its default on cpu is false
    # under fp32 both warn (W0302, W0303); under bf16 they reach the program
    "plan.grad_reduce": (Probe(("bf16",)), Probe(("bf16",), setup=(("train.precision", "bf16"),))),
    "plan.fp32_residual": (Probe(("true",)), Probe(("true",), setup=(("train.precision", "bf16"),))),
    "plan.context_parallel": (Probe(("ring", "all_to_all")),),  # without cp: W0310
    "plan.fsdp_grad_sync": (Probe(("micro_batch",)), Probe(("micro_batch",), setup=(("plan.data_parallel", "zero2"),))),
    # ep inside a node, or no grouped moe: W0725 (both values); across nodes: tests/test_settings_reach_output's change
    "plan.ep_dispatch": (Probe(("direct", "nodes")),),
    # params without FSDP2: E0330; fraction 0 and modules no block holds (moe_gpt's mlp): W0330
    "plan.offload": (Probe(("optimizer(fraction = 0.5)", "params", "activations")),
                     Probe(("params",), setup=(("plan.data_parallel", "fsdp"),))),
    "plan.offload.optimizer.fraction": (Probe(("optimizer(fraction = 0.25)", "optimizer(fraction = 0)"),
                                              base="optimizer(fraction = 0.5)"),),
    "plan.offload.activations.modules": (Probe(("activations(modules = mlp)", "activations(modules = attention)"),
                                               base="activations"),),
    "train.global_batch": (Probe(("32",), shapes=TRAIN_SHAPES),),
    "train.seq_len": (Probe(("16",), shapes=TRAIN_SHAPES),),
    "train.steps": (Probe(("7", "3"), shapes=TRAIN_SHAPES),),
    "train.tokens": (Probe(("1M", "20000.5"), shapes=TRAIN_SHAPES),),
    "train.seed": (Probe(("7",), shapes=TRAIN_SHAPES),),
    "train.precision": (Probe(("bf16", "fp8(filter = all)"), shapes=TRAIN_SHAPES),),
    "train.precision.fp8.recipe": (Probe(("fp8(recipe = rowwise, filter = all)",), base="fp8(filter = all)",
                                         shapes=TRAIN_SHAPES),),
    "train.precision.fp8.filter": (Probe(("fp8(filter = all)",), base="fp8()", shapes=TRAIN_SHAPES),),
    "train.optimizer": (Probe(("adamw(lr = 1e-3)",), shapes=TRAIN_SHAPES),),
    "train.optimizer.adamw.lr": (Probe(("adamw(lr = 1e-3)", "adamw(lr = 30)"), base=ADAMW, shapes=TRAIN_SHAPES),),
    "train.optimizer.adamw.betas": (Probe(("adamw(lr = 3e-3, betas = (0.8, 0.9))",), base=ADAMW,
                                          shapes=TRAIN_SHAPES),),
    "train.optimizer.adamw.weight_decay": (Probe(("adamw(lr = 3e-3, weight_decay = 0.01)",), base=ADAMW,
                                                 shapes=TRAIN_SHAPES),),
    "train.optimizer.adamw.eps": (Probe(("adamw(lr = 3e-3, eps = 1e-6)",), base=ADAMW, shapes=TRAIN_SHAPES),),
    "train.lr_schedule": (Probe(("constant", "cosine"), shapes=TRAIN_SHAPES),),
    "train.lr_schedule.cosine.warmup": (Probe(("cosine(warmup = 6)", "cosine(warmup = 500)"), base=COSINE,
                                              shapes=TRAIN_SHAPES),),
    "train.lr_schedule.cosine.min_lr": (Probe(("cosine(warmup = 5, min_lr = 1e-4)", "cosine(warmup = 5, min_lr = 1)"),
                                              base=COSINE, shapes=TRAIN_SHAPES),),
    "train.lr_schedule.constant.warmup": (Probe(("constant(warmup = 3)", "constant(warmup = 500)"), base="constant",
                                                shapes=TRAIN_SHAPES),),
    "train.grad_clip": (Probe(("0.5", "0"), shapes=TRAIN_SHAPES),),
    "train.data": (Probe((TOKENS_A,), shapes=TRAIN_SHAPES),),
    "train.data.tokens.path": (Probe(('tokens(path = "b.bin")',), base=TOKENS_A, shapes=TRAIN_SHAPES),),
    "train.data.tokens.dtype": (Probe(('tokens(path = "a.bin", dtype = uint32)',), base=TOKENS_A,
                                      shapes=TRAIN_SHAPES),),
    "train.data.tokens.document_separator": (Probe(('tokens(path = "a.bin", document_separator = 0)',
                                                    'tokens(path = "a.bin", document_separator = 7)'),
                                                   base=TOKENS_A, shapes=TRAIN_SHAPES),),
    # init = from(...) is read by check (names and shapes against the model): a model its checkpoint fits
    "train.init": (Probe(('from("files_llama")',), base="normal", shapes=("llama",)),),
    "train.init.from.path": (Probe(('from("w2")',), base='from("files_llama")', shapes=("llama",)),),
    "train.log_every": (Probe(("3", "1000"), shapes=TRAIN_SHAPES),),
    "train.checkpoint_dir": (Probe(('"ckpt"',), shapes=TRAIN_SHAPES),),
    "train.checkpoint_every": (Probe(("3", "1000", "auto"), shapes=TRAIN_SHAPES),
                               Probe(("3", "1000", "auto"), shapes=TRAIN_SHAPES,
                                     setup=(("train.checkpoint_dir", '"c"'),))),
    # the section written at all writes runtime.config.Resilience; off names no one (W0150 for an action then)
    "resilience.stragglers": (Probe(("off", "detect(threshold = 0.9)"), shapes=TRAIN_SHAPES),),
    "resilience.stragglers.detect.threshold": (Probe(("detect(threshold = 0.9)", "detect(threshold = 1.5)"),
                                                     base="detect", shapes=TRAIN_SHAPES),),
    "resilience.stragglers.detect.window": (Probe(("detect(window = 5)", "detect(window = 100000)"), base="detect",
                                                  shapes=TRAIN_SHAPES),),  # longer than the run: W0152
    # one node: nothing to exclude (E0151); stragglers off: W0150
    "resilience.on_straggler": (Probe(("restart", "replan"), shapes=TRAIN_SHAPES),
                                Probe(("restart",), shapes=TRAIN_SHAPES, setup=(("resilience.stragglers", "off"),))),
    "train.checkpoint_async": (Probe(("true",), shapes=TRAIN_SHAPES),
                               Probe(("true",), shapes=TRAIN_SHAPES, setup=(("train.checkpoint_dir", '"c"'),)),
                               Probe(("true",), shapes=TRAIN_SHAPES, setup=(("train.checkpoint_dir", '"c"'),
                                                                          ("train.checkpoint_every", "3")))),
    "train.restarts": (Probe(("2",), shapes=TRAIN_SHAPES),
                       Probe(("2",), shapes=TRAIN_SHAPES, setup=(("train.checkpoint_dir", '"c"'),))),
    "train.timeout": (Probe(('"30 s"', "0", '"30 days"'), shapes=TRAIN_SHAPES),),
    "train.eval_every": (Probe(("5", "1000"), shapes=TRAIN_SHAPES),),
    "train.eval_batches": (Probe(("2",), shapes=TRAIN_SHAPES),
                           Probe(("2",), shapes=TRAIN_SHAPES, setup=(("train.eval_every", "5"),))),
    # synthetic data (W0141), no eval_every (W0141), and a token file's held-out share (a.bin: 2048 ids)
    "train.eval_split": (Probe(("0.1",), shapes=TRAIN_SHAPES),
                         Probe(("0.1",), shapes=TRAIN_SHAPES, setup=(("train.eval_every", "5"),)),
                         Probe(("0.5",), base="0.3", shapes=TRAIN_SHAPES,
                               setup=(("train.data", TOKENS_A), ("train.eval_every", "5"),
                                      ("train.eval_batches", "1")))),
    "layer.layernorm.eps": (Probe(({"eps": "1e-6"},), shapes=LAYER_SHAPES),),
    "layer.rmsnorm.eps": (Probe(({"eps": "1e-5"},), shapes=LAYER_SHAPES),),  # the samples' norms made rmsnorm
    "layer.attention.kv_heads": (Probe(({"kv_heads": "2"},), shapes=LAYER_SHAPES),),
    "layer.attention.bias": (Probe(({"bias": "false"},), shapes=LAYER_SHAPES),),
    "layer.attention.qkv_bias": (Probe(({"qkv_bias": "false"}, {"qkv_bias": "true"}), shapes=LAYER_SHAPES),),
    "layer.attention.rope_theta": (Probe(({"rope_theta": "10000"},), shapes=LAYER_SHAPES),),
    "layer.attention.rope_scaling": (Probe(({"rope_scaling": "llama3"},), shapes=LAYER_SHAPES),
                                     Probe(({"rope_theta": "10000", "rope_scaling": "llama3"},),
                                           base={"rope_theta": "10000"}, shapes=LAYER_SHAPES)),
    **{f"layer.attention.rope_scaling.llama3.{arg}": (Probe(({**ROPE, "rope_scaling": f"llama3({arg} = {v})"},),
                                                            base=ROPE, shapes=("one device",)),)
       for arg, v in (("factor", "4.0"), ("low_freq_factor", "2.0"), ("high_freq_factor", "8.0"),
                      ("original_seq", "4096"))},
    "layer.attention.rope_scaling.linear.factor": (Probe(({"rope_theta": "10000", "rope_scaling": "linear(factor = 4.0)"},),
                                                         base={"rope_theta": "10000", "rope_scaling": "linear"},
                                                         shapes=("one device",)),),
    **{f"layer.attention.rope_scaling.yarn.{arg}": (Probe(({**ROPE, "rope_scaling": f"yarn({YARN_ARGS}, {arg} = {v})"
                                                           if arg not in ("factor", "original_seq") else
                                                           "yarn(" + YARN_ARGS.replace(*v) + ")"},),
                                                          base={**ROPE, "rope_scaling": f"yarn({YARN_ARGS})"},
                                                          shapes=("one device",)),)
       for arg, v in YARN_VALUES},
    "layer.attention.head_dim": (Probe(({"head_dim": "8"}, {"head_dim": "32"}), shapes=LAYER_SHAPES),),
    "layer.attention.qk_norm": (Probe(({"qk_norm": "rmsnorm"},), shapes=LAYER_SHAPES),),
    "layer.attention.qk_norm_eps": (Probe(({"qk_norm_eps": "1e-5"},), shapes=LAYER_SHAPES),
                                    Probe(({"qk_norm": "rmsnorm", "qk_norm_eps": "1e-5"},),
                                          base={"qk_norm": "rmsnorm"}, shapes=LAYER_SHAPES)),
    "layer.attention.window": (Probe(({"window": "8"},), shapes=LAYER_SHAPES),),
    "layer.attention.softcap": (Probe(({"softcap": "50"},), shapes=LAYER_SHAPES),),
    # the samples' heads are 16 or 32 wide
    "layer.attention.query_scale": (Probe(({"query_scale": "8"},), shapes=LAYER_SHAPES),),
    "layer.rmsnorm.zero_centered": (Probe(({"zero_centered": "true"},), shapes=LAYER_SHAPES),),
    "layer.embedding.scaled": (Probe(({"scaled": "true"},), shapes=LAYER_SHAPES),),
    "layer.lm_head.softcap": (Probe(({"softcap": "30"},), shapes=LAYER_SHAPES),),
    "layer.mlp.act": (Probe(({"act": "swiglu"},), shapes=LAYER_SHAPES),),
    "layer.mlp.bias": (Probe(({"bias": "false"},), shapes=LAYER_SHAPES),),
    "layer.moe.top_k": (Probe(({"top_k": "1"}, {"top_k": "8"}), shapes=("ep",)),),
    "layer.moe.capacity_factor": (Probe(({"capacity_factor": "2.0"}, {"capacity_factor": "none"}), shapes=("ep",)),),
    "layer.moe.act": (Probe(({"act": "gelu"},), shapes=("ep",)),),
    "layer.moe.aux_loss": (Probe(({"aux_loss": "0.1"},), shapes=("ep",)),
                           Probe(({"top_k": "8", "aux_loss": "0.1"},), base={"top_k": "8"}, shapes=("ep",))),
    "layer.moe.dropped": (Probe(({"dropped": "identity"},), shapes=("ep",)),
                          Probe(({"capacity_factor": "none", "dropped": "identity"},), base={"capacity_factor": "none"},
                                shapes=("ep",))),
    "layer.moe.renormalize": (Probe(({"renormalize": "false"},), shapes=("ep",)),
                              Probe(({"top_k": "1", "renormalize": "true"},), base={"top_k": "1"}, shapes=("ep",))),
    "layer.moe.shared_ffn": (Probe(({"shared_ffn": "ffn"},), shapes=("ep",)),),
    "layer.moe.scoring": (Probe(({"scoring": "sigmoid"},), shapes=("ep",)),),
    # the sample's 8 experts: 4 groups of 2, a token choosing in its best 2 (or W0715 where it limits nothing)
    "layer.moe.groups": (Probe(({"groups": "4"},), base={"groups": "2"}, shapes=("ep",)),
                         Probe(({"groups": "2"},), shapes=("ep",))),
    "layer.moe.topk_groups": (Probe(({"groups": "4", "topk_groups": "2"},), base={"groups": "4"}, shapes=("ep",)),
                              Probe(({"topk_groups": "1"},), shapes=("ep",))),
    "layer.moe.routed_scale": (Probe(({"routed_scale": "2.5"},), shapes=("ep",)),),
    "layer.moe.bias_update": (Probe(({"bias_update": "0.001"},), shapes=("ep",)),
                              Probe(({"top_k": "8", "bias_update": "0.001"},), base={"top_k": "8"}, shapes=("ep",))),
    # dropless grouped: the program sorts the rows (and the ledger's all-to-alls change); with a capacity, E0717
    "layer.moe.dispatch": (Probe(({"capacity_factor": "none", "dispatch": "grouped"},),
                                 base={"capacity_factor": "none"}, shapes=("ep",)),
                           Probe(({"dispatch": "grouped"},), shapes=("ep",))),
    # expert re-placement (dropless grouped only, else E0720): the program holds each layer's Slots, its experts
    # (experts + extra) / ep slots (with ep = 1, W0721: tests/mistakes/front_moe_rebalance_without_ep.scale)
    "layer.moe.rebalance": (Probe(({"rebalance": "replicate(every = 10, extra = 2)"},), base=GROUPED, shapes=("ep",)),),
    "layer.moe.rebalance.replicate.every": (Probe(({"rebalance": "replicate(every = 5)"},),
                                                  base={**GROUPED, "rebalance": "replicate(every = 10)"},
                                                  shapes=("ep",)),),
    "layer.moe.rebalance.replicate.extra": (Probe(({"rebalance": "replicate(extra = 2)"},),
                                                  base={**GROUPED, "rebalance": "replicate(extra = 0)"},
                                                  shapes=("ep",)),),
    "layer.moe.shared_gate": (Probe(({"shared_gate": "sigmoid"},), shapes=("ep",)),
                              Probe(({"shared_ffn": "ffn", "shared_gate": "sigmoid"},), base={"shared_ffn": "ffn"},
                                    shapes=("ep",))),
    # multi-head latent attention (samples/tiny_deepseek.scale writes q_lora_rank = 32)
    "layer.mla.q_lora_rank": (Probe(({"q_lora_rank": "16"},), shapes=("mla",)),),
    "layer.mla.rope_theta": (Probe(({"rope_theta": "500000"},), shapes=("mla",)),),
    "layer.mla.rope_interleave": (Probe(({"rope_interleave": "false"},), shapes=("mla",)),),
    "layer.mla.norm_eps": (Probe(({"norm_eps": "1e-5"},), shapes=("mla",)),),
    "layer.mla.rope_scaling": (Probe(({"rope_scaling": f"yarn({YARN_ARGS})"},), shapes=("mla",)),),
    **{f"layer.mla.rope_scaling.yarn.{arg}": (Probe(({"rope_scaling": f"yarn({YARN_ARGS}, {arg} = {v})"
                                                     if arg not in ("factor", "original_seq") else
                                                     "yarn(" + YARN_ARGS.replace(*v) + ")"},),
                                                    base={"rope_scaling": f"yarn({YARN_ARGS})"}, shapes=("mla",)),)
       for arg, v in YARN_VALUES},
    "layer.lm_head.tied": (Probe(({"tied": "false"},), shapes=LAYER_SHAPES),),
    "layer.lm_head.bias": (Probe(({"bias": "true"},), shapes=LAYER_SHAPES),),
}

# Settings changed only together with another (the mesh's size moves with its axes): held by CHANGES above.
STRUCTURAL = {"mesh.nodes": "nodes × devices_per_node is the product of the axes: CHANGES changes both",
              "mesh.devices_per_node": "as mesh.nodes"}


def _layer_arguments() -> list[str]:
    """layer.KIND.ARG for every optional argument of every layer kind (and of its call-valued arguments). A required
    argument is a size every such layer writes: it is the model's shape, not a setting that could go unused."""
    names = []
    for kind, params in K.LAYERS.items():
        for arg, param in params.items():
            if param.default is K.MISSING:
                continue
            names.append(f"layer.{kind}.{arg}")
            for kinds in _call_tables(param):
                names += [f"layer.{kind}.{arg}.{k}.{a}" for k, args in kinds.items() for a in args]
    return names


def test_every_setting_and_argument_is_probed():
    names = set(settings()) | set(_layer_arguments())
    assert "layer.moe.dropped" in names and "layer.attention.rope_scaling.llama3.factor" in names
    covered = PROBES.keys() | COST_MODEL_ONLY.keys() | STRUCTURAL.keys() | SINGLE_VALUED.keys()
    assert not names - covered, (f"settings or layer arguments with no probe: {sorted(names - covered)}; give each a "
                                 "Probe in PROBES: values that change the program, or that the check names")
    assert not covered - names, f"probes of settings the checker no longer reads: {sorted(covered - names)}"


def _section(text: str, section: str) -> tuple[int, int]:
    """[start, end) of the body of `section { ... }` in text (a plan section is added when absent)."""
    m = re.search(rf"^{section}\b[^{{\n]*{{", text, re.MULTILINE)
    assert m, f"no `{section}` section"
    depth, i = 1, m.end()
    while depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return m.end(), i - 1


def _set(text: str, name: str, value: str) -> str:
    """`text` with setting `section.key` set to `value`: its value replaced where written, else a line added."""
    section, key = name.split(".")[:2]
    if section in ("plan", "resilience") and not re.search(rf"^{section}\b", text, re.MULTILINE):
        text = text.replace("\ntrain {", f"\n{section} {{\n}}\n\ntrain {{")
    a, b = _section(text, section)
    body = text[a:b]
    m = re.search(rf"(?<![\w.])({key}\s*=\s*)([^#\n]*?)(\s*(#[^\n]*)?)$", body, re.MULTILINE)
    if m:
        body = body[:m.start(2)] + value + body[m.end(2):]
    else:
        body = body.rstrip(" ") + f"  {key} = {value}\n"
    return text[:a] + body + text[b:]


def _calls(text: str, kind: str) -> list[tuple[int, int]]:
    """[start of the arguments, closing parenthesis) of every call of layer `kind` in the model section."""
    out = []
    for m in re.finditer(rf"(?<![\w.]){kind}\(", text[:_section(text, "model")[1]]):
        depth, i = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        out.append((m.end(), i - 1))
    return out


def _set_args(text: str, kind: str, args: dict) -> str:
    """Every call of `kind` with `args` set: replaced where written by name, else appended."""
    for a, b in reversed(_calls(text, kind)):
        inner = text[a:b]
        for arg, value in args.items():
            m = re.search(rf"(?<![\w.]){arg}\s*=\s*((?:[^,()]|\([^()]*\))+)", inner)
            inner = inner[:m.start(1)] + value + inner[m.end(1):] if m else inner.rstrip() + f", {arg} = {value}"
        text = text[:a] + inner + text[b:]
    return text


def _lines_of(text: str, name: str) -> set[int]:
    """The lines where the setting or argument `name` is written in `text`."""
    parts = name.split(".")
    if parts[0] == "layer":
        return {text.count("\n", 0, a) + 1 + k for a, b in _calls(text, parts[1])
                for k in range(text.count("\n", a, b) + 1)}
    a, b = _section(text, parts[0])
    m = re.search(rf"(?<![\w.]){parts[1]}\s*=", text[a:b])
    return {text.count("\n", 0, a + m.start()) + 1}


def _write(text: str, name: str, value) -> str:
    parts = name.split(".")
    return _set_args(text, parts[1], value) if parts[0] == "layer" else _set(text, name, value)


_COMMENT = re.compile(r"^\s*#.*\n|  # .*$", re.MULTILINE)
_COST = re.compile(r"\n\s*(memory|speed)=train\.\w+\([^)]*\),")


def _run_files(text: str, where: Path) -> tuple[str, str]:
    """What the run executes, less what does not change it: comments (they quote the .scale file's lines) and the
    cost model's predictions in the Config."""
    emitted = _emitted(text, where)
    return _COST.sub("", _COMMENT.sub("", emitted["program.py"])), _COMMENT.sub("", emitted["launch.sh"])


@pytest.fixture(scope="module")
def run_files(tmp_path_factory):
    where = tmp_path_factory.mktemp("probes")
    _beside(where)
    cache: dict[str, tuple[str, str]] = {}

    def get(text: str) -> tuple[str, str]:
        if text not in cache:
            cache[text] = _run_files(text, where)
        return cache[text]
    get.where = where
    return get


@pytest.mark.parametrize("name", sorted(PROBES))
def test_setting_changes_the_run_or_is_named(name, run_files):
    """For every probe value in every shape: the run changes, the check refuses, or it warns at the setting."""
    silent = []
    for probe in PROBES[name]:
        for shape in probe.shapes:
            base = (ROOT / SHAPES[shape]).read_text()
            if name.startswith("layer.rmsnorm."):
                base = base.replace("layernorm(", "rmsnorm(")
            if name.startswith("layer.") and not _calls(base, name.split(".")[1]):
                continue
            for key, value in probe.setup:
                base = _set(base, key, value)
            if probe.base is not None:
                base = _write(base, name, probe.base)
            check_text(base, str(run_files.where / "plan.scale"))  # the context itself is a valid plan
            for value in probe.values:
                text = _write(base, name, value)
                if text == base:
                    continue  # the sample writes this value already
                lines = _lines_of(text, name)
                try:
                    spec = check_text(text, str(run_files.where / "plan.scale"))
                except ScaleError:
                    continue  # refused: the setting is not ignored
                if any(w.span is not None and w.span.line in lines for w in spec.warnings):
                    continue  # named: it has no effect here, and the user is told
                if run_files(text) == run_files(base):
                    silent.append(f"{shape}: {value}")
    assert not silent, (f"`{name}` is accepted without a word and changes nothing the run executes in: {silent}; "
                        "make it reach the program there, or warn at its span (compiler/check.py)")


# Each no-effect warning, in a plan where it fires: the generated model, stages and launch are those of the file
# without the setting; only the setting's own field of the Config differs, which the runtime reads and, in this
# plan, does not act on (tp = 1, pp = 1, dp = 1, no checkpoint directory, past the last step).
NO_EFFECT = (
    ("W0310", "dp", (), "plan.context_parallel", "ring"),
    ("W0410", "dp", (), "plan.sequence_parallel", "true"),
    ("W0411", "tp", (), "plan.pad_vocab", "true"),
    ("W0412", "dp", (), "plan.tp_layers", "none"),
    ("W0612", "dp", (), "plan.schedule", "gpipe"),
    ("W0613", "dp", INTERLEAVE, "plan.virtual_stages", "2"),
    ("W0614", "dp", (), "plan.layout", "((0, 1), (1, 2))"),
    ("W0320", "one device", (), "mesh.fabric", "ib"),
    ("W0321", "dp", (), "mesh.placement", "auto"),
    ("W0301", "one device", (), "plan.data_parallel", "fsdp"),
    ("W0302", "one device", (), "plan.grad_reduce", "bf16"),
    ("W0303", "one device", (), "plan.fp32_residual", "true"),
    ("W0306", "dp", (), "plan.fsdp_grad_sync", "micro_batch"),
    ("W0132", "one device", (), "train.checkpoint_every", "3"),
    ("W0133", "one device", (("train.checkpoint_dir", '"c"'),), "train.checkpoint_every", "1000"),
    ("W0135", "one device", (), "train.log_every", "1000"),
    ("W0142", "one device", (), "train.checkpoint_async", "true"),
    ("W0141", "one device", (), "train.eval_batches", "2"),
    ("W0141", "one device", (("train.eval_every", "5"),), "train.eval_split", "0.1"),
    ("W0150", "one device", (("resilience.stragglers", "off"),), "resilience.on_straggler", "restart"),
    ("W0152", "one device", (("resilience.stragglers", "detect"),), "resilience.stragglers",
     "detect(window = 100000)"),
    ("W0137", "one device", (), "layer.attention.qkv_bias", {"qkv_bias": "true"}),
    ("W0143", "one device", (), "layer.attention.qk_norm_eps", {"qk_norm_eps": "1e-5"}),
    ("W0207", "one device", (), "layer.attention.window", {"window": "4096"}),
    ("W0208", "one device", (), "layer.attention.query_scale", {"query_scale": "16"}),
    ("W0711", "ep", (), "layer.moe.shared_gate", {"shared_gate": "sigmoid"}),
    ("W0715", "ep", (), "layer.moe.topk_groups", {"topk_groups": "1"}),
)


# The sources block names the .scale line behind each timed operation (for the watchdog's
# messages); a setting's own line appearing there is provenance, not an effect.
_SOURCE_LINE = re.compile(r"^\('[^']*', 'plan\.scale:\d+', .*\),$")


def _config_lines(program: str) -> set[str]:
    lines = (line.strip() for line in program.split("CONFIG = ")[1].splitlines())
    return {line for line in lines if not _SOURCE_LINE.match(line)}


@pytest.mark.parametrize("code, shape, setup, name, value", NO_EFFECT, ids=[c[0] for c in NO_EFFECT])
def test_a_no_effect_warning_is_true(code, shape, setup, name, value, run_files):
    base = (ROOT / SHAPES[shape]).read_text()
    for key, v in setup:
        base = _set(base, key, v)
    text = _write(base, name, value)
    spec = check_text(text, str(run_files.where / "plan.scale"))
    assert [w.code for w in spec.warnings if w.span.line in _lines_of(text, name)] == [code]
    (program, launch), (program0, launch0) = run_files(text), run_files(base)
    assert program.split("CONFIG = ")[0] == program0.split("CONFIG = ")[0] and launch == launch0
    changed = _config_lines(program) ^ _config_lines(program0)
    assert len(changed) <= 2, f"{code}: more than the setting's own field differs: {changed}"
