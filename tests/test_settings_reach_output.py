"""Every setting the checker reads reaches what the run executes, or is explicitly only the cost model's.

The settings are enumerated from the checker's own tables (compiler/check.py: MESH_SETTINGS, PLAN_SETTINGS,
TRAIN_SETTINGS and the argument tables of call-valued settings such as `optimizer = adamw(...)`), so a setting
added there fails `test_every_setting_is_covered` until it is given a change here. Each change must alter the
emitted program.py or launch.sh: the files the run executes. plan.json is not compared: it is a report that also
holds the cost model's figures, which change with a setting the run never sees.
"""
from __future__ import annotations

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
}

# Settings that only permit what the compiler does whenever it is needed: their effect is that the file is
# accepted at all. Each is shown refused with its default and accepted with the change.
PERMISSIONS = {
    # The tp pass pads whenever tp does not divide the vocabulary; pad_vocab = false refuses such a plan (E0403).
    "plan.pad_vocab": Change((("sequence_parallel = false", "sequence_parallel = false  pad_vocab = true"),),
                             sample=TP, setup=(("vocab  = 128", "vocab  = 127"),)),
}

CHANGES = {
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
    "train.global_batch": Change((("global_batch = 16", "global_batch = 32"),)),
    "train.seq_len": Change((("seq_len      = seq", "seq_len      = 16"),)),
    "train.steps": Change((("steps        = 60", "steps        = 61"),)),
    "train.seed": Change((("seed         = 1234", "seed         = 1235"),)),
    "train.precision": Change((("precision    = fp32", "precision    = bf16"),)),
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
    # a tiny Llama and its checkpoint (check reads the checkpoint's headers against the model)
    "train.init": Change((('  init = from("files_llama")\n', ""),), sample=LLAMA),
    "train.init.from.path": Change((('"files_llama"', '"w2"'),), sample=LLAMA),
    "train.log_every": Change((("log_every    = 10", "log_every    = 5"),)),
    "train.checkpoint_dir": Change((CKPT,), sample=DP),
    "train.checkpoint_every": Change((('"ckpt"', '"ckpt"  checkpoint_every = 3'),), sample=DP, setup=(CKPT,)),
    "train.restarts": Change((("log_every    = 10", "log_every    = 10  restarts = 2"),)),
    "train.timeout": Change((("log_every    = 10", 'log_every    = 10  timeout = "30 s"'),)),
}


def _call_tables(param: K.Param) -> list[dict]:
    """The argument tables of a call-valued setting (`_call_of(TABLE, ...)`): {kind: {argument: Param}}."""
    cells = getattr(param.convert, "__closure__", None) or ()
    return [cell.cell_contents for cell in cells if isinstance(cell.cell_contents, dict)
            and all(isinstance(args, dict) and all(isinstance(p, K.Param) for p in args.values())
                    for args in cell.cell_contents.values())]


def settings() -> list[str]:
    names = []
    for section, table in (("mesh", K.MESH_SETTINGS), ("plan", K.PLAN_SETTINGS), ("train", K.TRAIN_SETTINGS)):
        for key, param in table.items():
            names.append(f"{section}.{key}")
            for kinds in _call_tables(param):
                names += [f"{section}.{key}.{kind}.{arg}" for kind, args in kinds.items() for arg in args]
    return names


def test_every_setting_is_covered():
    names = settings()
    assert "train.optimizer.adamw.lr" in names and "train.data.tokens.path" in names  # the tables are found
    covered = CHANGES.keys() | COST_MODEL_ONLY.keys() | PERMISSIONS.keys()
    assert not set(names) - covered, (f"settings the checker reads with no change here: "
                                      f"{sorted(set(names) - covered)}; give each a Change in CHANGES")
    assert not covered - set(names), f"settings here the checker no longer reads: {sorted(covered - set(names))}"


def _text(change: Change, changed: bool) -> str:
    text = (ROOT / change.sample).read_text()
    for old, new in change.setup + (change.edits if changed else ()):
        assert text.count(old) == 1, f"`{old}` is not once in {change.sample}"
        text = text.replace(old, new)
    return text


def _emitted(text: str, tmp_path: Path) -> dict:
    for name in ("a.bin", "b.bin"):  # token files beside the .scale file, fitting uint16 and uint32
        (tmp_path / name).write_bytes(bytes(4096))
    for name in ("files_llama", "w2"):  # checkpoints to start from, which check reads: the tiny Llama's
        shutil.copytree(ROOT / "tests" / "mistakes" / "files" / "files_llama", tmp_path / name, dirs_exist_ok=True)
    compiled = compile_spec(check_text(text, str(tmp_path / "plan.scale")))
    spec, traced, costs = compiled.spec, compiled.traced, compiled.costs
    return {"program.py": codegen.program(spec, traced, costs, str(tmp_path / "build")),
            "launch.sh": codegen.launch_script(spec)}


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
    import re

    from runtime.config import GROUPS, Config
    source = "".join(p.read_text() for p in (ROOT / "runtime").glob("*.py") if p.name != "config.py")
    groups = dict(GROUPS)
    unread = [f.name for f in dataclasses.fields(Config)
              if f.name not in groups and not re.search(rf"\bcfg\.{f.name}\b", source)]
    for group, cls in GROUPS:
        aliases = {group} | set(re.findall(rf"\b(\w+) = (?:self\.)?cfg\.{group}\b", source))
        unread += [f"{group}.{f.name}" for f in dataclasses.fields(cls)
                   if not any(re.search(rf"\b{a}\.{f.name}\b", source) for a in aliases)]
    assert not unread, f"Config fields the runtime never reads: {unread}"
