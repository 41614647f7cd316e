"""Resolve and check a parsed .scale file into a Spec, collecting every problem before reporting any.

The grammar only knows structure; this module knows the vocabulary: which sections, settings, layer kinds and
arguments exist and what type each takes (the binder, compiler/binder.py, turns expressions into those types), and
resolves the model, the mesh, the plan and the training settings. Once they exist it runs the rules of the plan,
one module per pass they protect (compiler/rules/). Each problem becomes a Diagnostic pointing at the
offending text, with a remedy.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from typing import Any

from runtime import choices  # torch-free: the names the language shares with the runtime
from runtime.split import split_windows  # torch-free: the held-out split, as the program cuts it

from compiler import ast
from compiler import files as F
from compiler import hf_header as H
from compiler import layers as L
from compiler import spec as S
from compiler.binder import (_MISSING, Param, _bool, _call_of, _Checker, _choice, _duration, _float,
                             _end_span, _int, _pos_int, _settings, _size, _span, _spans_of,
                             _string)
from compiler.layout.devices import DEVICES, OVERRIDABLE
from compiler.diagnostics import Diagnostic, ScaleError, Span, did_you_mean
from compiler.parse import parse
from compiler.plan import AXES, Plan, compiles
from compiler.rules import check_plan
from compiler.symbols import capacity
from compiler.symbols import size as size_symbol

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

# -- section settings ---------------------------------------------------------------------------------------------

MESH_SETTINGS: dict[str, Param] = {
    "nodes": Param(_pos_int, 1, "machines"),
    "devices_per_node": Param(_pos_int, _MISSING, "devices (processes) per machine"),
    "device": Param(_choice(*DEVICES), "cpu", "device kind, for the cost model"),
    "peak_tflops": Param(_float, None, "dense bf16 peak TFLOP/s of one device"),
    "memory_gb": Param(_float, None, "memory of one device, GB"),
    "intra_node_gbps": Param(_float, None, "per-device bandwidth inside a node, GB/s"),
    "inter_node_gbps": Param(_float, None, "per-device bandwidth between nodes, GB/s"),
    "hbm_gbps": Param(_float, None, "memory bandwidth of one device, GB/s"),
    "matmul_efficiency": Param(_float, None, "fraction of the peak a large matmul reaches"),
    "attention_efficiency": Param(_float, None, "fraction of the peak fused attention reaches"),
    "intra_node_latency_us": Param(_float, None, "latency of one collective step inside a node, µs"),
    "inter_node_latency_us": Param(_float, None, "latency of one collective step between nodes, µs"),
    "op_overhead_us": Param(_float, None, "the least time one eager op takes, µs"),
}

PLAN_SETTINGS: dict[str, Param] = {
    "data_parallel": Param(_choice(*choices.DATA_PARALLEL), "ddp", "how dp holds model state"),
    "micro_batches": Param(_pos_int, 1, "gradient-accumulation micro-batches per step"),
    "tp_layers": Param(lambda c, e, w: c.as_names(e, w, TP_LAYERS), TP_LAYERS, "what tp shards"),
    "sequence_parallel": Param(_bool, False, "shard norms and residuals along the sequence over tp"),
    "pad_vocab": Param(_bool, False, "pad the vocabulary to a multiple of tp (padded logits masked)"),
    "schedule": Param(_choice(*choices.SCHEDULES), "1f1b", "pipeline schedule"),
    "virtual_stages": Param(_pos_int, 1, "pipeline stages per pp rank (interleaved-1f1b)"),
    "layout": Param(lambda c, e, w: c.as_ranges(e, w), (), "manual stage layout: ((first, end), ...) blocks"),
    "recompute": Param(_choice(*choices.RECOMPUTE), "none",
                       "activation recomputation of each block in backward: none, selective (attention core and "
                       "cheap ops; matmul and collective outputs kept) or full (from the block's input)"),
    "compile": Param(_bool, None, "torch.compile each block and the code around them (default: true on GPUs, "
                                  "false on cpu)"),
    "grad_reduce": Param(_choice("fp32", "bf16"), "fp32",
                         "under bf16: the dtype gradients are accumulated and reduced in (Megatron's main gradients, "
                         "FSDP2's reduce_dtype)"),
    "fp32_residual": Param(_bool, False, "under bf16: keep the residual stream fp32 (Megatron's "
                                         "--fp32-residual-connection)"),
    "fsdp_grad_sync": Param(_choice("step", "micro_batch"), "step",
                            "when fsdp and zero2 reduce-scatter the gradients of several micro-batches: step (the "
                            "last micro-batch; whole gradients accumulated until then) or micro_batch (every one: "
                            "they stay sharded, m× the reduce-scatters)"),
    "context_parallel": Param(_choice(*choices.CONTEXT_PARALLEL), "all_gather",
                              "how attention runs over a sequence sharded over cp: all_gather (keys and values "
                              "gathered once per layer), ring (passed around the cp group) or all_to_all (Ulysses: heads "
                              "scattered, the sequence gathered)"),
}

OPTIMIZERS = {"adamw": {"lr": Param(_float, doc="peak learning rate"),
                        "betas": Param(lambda c, e, w: c.as_floats(e, w, 2), (0.9, 0.95), "Adam betas"),
                        "weight_decay": Param(_float, 0.1, "decoupled weight decay"),
                        "eps": Param(_float, 1e-8, "Adam epsilon")}}
SCHEDULES = {"cosine": {"warmup": Param(_int, 0, "linear warm-up steps"),
                        "min_lr": Param(_float, 0.0, "learning rate at the last step")},
             "constant": {"warmup": Param(_int, 0, "linear warm-up steps")}}
INITS = {"normal": {}, "from": {"path": Param(_string, doc="a Hugging Face checkpoint: its directory or a "
                                                            ".safetensors file")}}
DATASETS = {"synthetic": {},
            "tokens": {"path": Param(_string, doc="binary file of token ids"),
                       "dtype": Param(_choice(*F.ITEMSIZE), "uint16", "token id type (a .npy file's header says "
                                                                     "it)"),
                       "document_separator": Param(_int, None, "the id ending each document: packed documents, "
                                                               "each attending only to itself")}}


TRAIN_SETTINGS: dict[str, Param] = {
    "global_batch": Param(_size, doc="sequences per optimizer step, over all dp ranks"),
    "seq_len": Param(_size, doc="tokens per sequence"),
    "steps": Param(_pos_int, doc="optimizer steps"),
    "seed": Param(_int, 1234, "seed of initialisation and data"),
    "precision": Param(_choice("fp32", "bf16"), "fp32", "compute precision"),
    "optimizer": Param(_call_of(OPTIMIZERS, "optimizer"), ("adamw", None), "the optimizer"),
    "lr_schedule": Param(_call_of(SCHEDULES, "schedule"), ("constant", {"warmup": 0}), "learning-rate schedule"),
    "grad_clip": Param(_float, 1.0, "global gradient-norm clip; 0 turns it off"),
    "data": Param(_call_of(DATASETS, "dataset"), ("synthetic", {}), "training data"),
    "log_every": Param(_pos_int, 1, "steps between progress lines"),
    "init": Param(_call_of(INITS, "initialisation"), ("normal", {}), "the starting weights: normal (GPT-2's "
                  "initialisation, by name) or from(\"DIR or FILE.safetensors\") (a Hugging Face checkpoint)"),
    "checkpoint_dir": Param(_string, "", "where checkpoints go; empty for none"),
    "checkpoint_every": Param(_int, 0, "steps between checkpoints; 0 for only the last"),
    "checkpoint_async": Param(_bool, False, "write each checkpoint but the last in the background (DCP's "
                              "async_save): the next steps run while its files are written"),
    "restarts": Param(_int, None, "times torchrun restarts a failed job (from the last checkpoint); default 3 "
                                  "with checkpoint_dir, 0 without"),
    "timeout": Param(_duration, 600.0, "a collective that has not completed after this long ends the job, naming "
                                       "the ranks and the operation; 0 turns the watchdog off"),
    "eval_every": Param(_pos_int, 0, "steps between evaluations on held-out data (and after the last); none by "
                                     "default"),
    "eval_batches": Param(_pos_int, 8, "global batches each evaluation reads, the same ones every time"),
    "eval_split": Param(_float, None, "the share of a token file held out for evaluation, in (0, 0.5]: its last "
                                      "windows, never trained on"),
}

# The largest share of a token file `eval_split` holds out: more is a slip (the fraction trained on, written for
# the one held out), and training on half a file is already an experiment, not a run.
MAX_EVAL_SPLIT = 0.5

SECTIONS = ("model", "mesh", "plan", "train")

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
CALL_ARGUMENTS = (("optimizer", "OPTIMIZERS"), ("lr_schedule", "SCHEDULES"), ("data", "DATASETS"))


# ---------------------------------------------------------------------------------------------------------------


def placement(key: str, section: str) -> tuple[str, str | None]:
    """Where a setting unknown in `section` belongs: another section, an argument of a call, or the name of a
    setting another tool calls `key` (`batch_size`, `epochs`); ("", None) when it is none of these. The second item
    is the setting of `section` meant, if any (then not reported again as missing)."""
    name = ALIASES.get(key, key)
    tables = {"mesh": MESH_SETTINGS, "plan": PLAN_SETTINGS, "train": TRAIN_SETTINGS}
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


def check_text(text: str, path: str, cluster_only: bool = False) -> S.Spec:
    """Parse and check; raise ScaleError with every diagnostic found. `cluster_only`: see check_file."""
    try:
        return check_file(parse(text, path), text, cluster_only)
    except RecursionError:
        raise ScaleError([Diagnostic("E0001", "an expression is nested too deeply", Span(path, 1, 1, 1, 2),
                                     help="write it with fewer nested parentheses, signs or terms")],
                         {path: text}) from None


def check_path(path: str, cluster_only: bool = False) -> S.Spec:
    with open(path, encoding="utf-8-sig") as f:  # a leading byte-order mark is not part of the text
        text = f.read()
    return check_text(text, path, cluster_only)


def check_file(file: ast.File, source: str, cluster_only: bool = False) -> S.Spec:
    """The Spec of `file`, or ScaleError. With `cluster_only` (what `scalec search` reads), the mesh needs only the
    cluster (nodes, devices_per_node, device): its axes and the plan section's rules are what a search chooses, so
    no axis (or axes of another device count) and a plan whose rules refuse it are not errors; the model, the
    cluster, the plan's settings as written and the train section are checked as always, and so are the rules no
    plan can satisfy (the sequence over the learned positions), checked on one device."""
    c = _Checker(file, source)
    c.placement = placement
    sections: dict[str, ast.Section] = {}
    for sec in file.sections:
        k = sec.kind.id
        if k not in SECTIONS:
            c.error("E0101", f"unknown section `{k}`", sec.kind.span, label="not a section",
                    help=did_you_mean(k, SECTIONS))
        elif k in sections:
            c.error("E0102", f"section `{k}` is written twice", sec.kind.span, label="second one here",
                    help=f"the first is at {sections[k].kind.span}; merge them")
        else:
            sections[k] = sec
            if sec.name is not None and k != "model":
                c.error("E0111", f"`{k}` takes no name", sec.name.span, label="not expected here",
                        help=f"write `{k} {{ ... }}`")
    end = _end_span(file, source)
    for k in ("model", "mesh", "train"):
        if k not in sections:
            c.error("E0103", f"the file has no `{k}` section", end,
                    help=f"add `{k} {{ ... }}`; see samples/tiny_gpt.scale")
    model = _model(c, sections["model"]) if "model" in sections else None
    mesh = _mesh(c, sections["mesh"], cluster_only) if "mesh" in sections else None
    plan = _plan(c, sections.get("plan"), cluster_only)
    if "mesh" in sections:
        _device_figures(c, sections["mesh"])
    train, train_values = _train(c, sections["train"]) if "train" in sections else (None, {})
    if train is not None:
        _train_checks(c, train, train_values)
    spec = None
    if model and mesh and plan and train:
        _bind_capacities(c, model, train)
        _windows_cover_the_sequence(c, model, train)
        spec = S.Spec(path=file.path, source=source, model=model, mesh=mesh.machines,
                      plan=_written_plan(c, mesh, plan, train), train=train, values=dict(c.values))
        own = spec.plan
        if cluster_only:  # one device, the plan's defaults: what is left refuses every plan
            own = dataclasses.replace(own, axes=(("dp", 1),), micro_batches=1,
                                      schedule="1f1b", virtual_stages=1, sequence_parallel=False, layout=(),
                                      data_parallel="ddp")
        c.diags += check_plan(spec, own)  # the rules of each pass and of the mesh (compiler/rules/)
        reading = _file_checks(c, model, train, train_values)
        if reading is not None:  # what the program reads: the dtype a .npy header gives, its format
            data = dataclasses.replace(train.data, dtype=reading.dtype, format=reading.format, reading=reading)
            spec = dataclasses.replace(spec, train=dataclasses.replace(train, data=data))
        _no_effect_checks(c, spec, bool(mesh.axis_spans))
    if any(d.severity == "error" for d in c.diags):
        raise ScaleError(c.diags, {file.path: source})  # warnings too: they may explain the errors
    if c.diags:
        spec = dataclasses.replace(spec, warnings=tuple(c.diags))
    return spec


# -- model --------------------------------------------------------------------------------------------------------


def _model(c: _Checker, sec: ast.Section) -> S.Model | None:
    if sec.name is None:
        c.error("E0113", "a model needs a name", sec.kind.span, help="write `model NAME { ... }`")
    layers: list = []
    before = c.errors()  # warnings (a setting with no effect) do not stop the model
    for st in sec.body:
        if isinstance(st, ast.Assign):
            _define_size(c, st)
        elif isinstance(st, ast.Axis):
            c.error("E0111", "`axis` belongs in the `mesh` section", st.span)
        else:
            layer = _layer(c, st)
            if layer is not None:
                layers.append(layer)
    if c.errors() > before:
        return None  # the structure check would only repeat what is already reported
    _model_structure(c, sec, layers)
    if c.errors() > before:
        return None
    _positions_twice(c, layers)
    return S.Model(name=sec.name.id if sec.name else "model", sizes=dict(c.env), layers=tuple(layers),
                   span=sec.span)


def _define_size(c: _Checker, st: ast.Assign) -> None:
    name = st.key.id
    if name in c.env:
        c.error("E0102", f"size `{name}` is defined twice", st.key.span, label="redefined here",
                help=f"the first definition is at {c.name_spans[name]}; give this one another name")
        return
    if name in KNOWN_AXES or name in TRAIN_SIZE_NAMES or re.fullmatch(rf"{CAPACITY}(_\d+)?", name):
        what = ("a mesh axis" if name in KNOWN_AXES else "a training setting" if name in TRAIN_SIZE_NAMES
                else "the capacity of a `moe` layer")
        c.error("E0102", f"`{name}` names {what} and cannot name a model size", st.key.span,
                help="formulas use that name already; call this size something else")
        return
    if name in LAYERS or name in ("repeat", "axis"):
        c.error("E0102", f"`{name}` is a layer kind and cannot name a size", st.key.span)
        return
    x = c.as_size(st.value, f"size `{name}`")
    if x is None:
        c.env[name] = size_symbol(name)  # keep going: later uses are neither unknown nor reported again
        c.values[size_symbol(name)] = 1
        c.poisoned.add(size_symbol(name))
        c.name_spans[name] = st.key.span
        return
    if x.free_symbols:
        c.env[name] = x                  # derived: `ffn = 4 * hidden` stays a formula in `hidden`
    else:
        sym = size_symbol(name)
        c.env[name] = sym
        c.values[sym] = int(x)
    c.name_spans[name] = st.key.span


def _layer(c: _Checker, st, top: bool = True) -> Any:
    if isinstance(st, ast.Repeat):
        if not top:
            c.error("E0204", "`repeat` can only stand at the top level of the model", st.span,
                    help="blocks repeat whole: put residuals inside `repeat`, not `repeat` inside a block")
            return None
        count = c.as_size(st.count, "the repeat count")
        if count is not None and c.number(count) > MAX_REPEAT:
            c.error("E0120", f"{c.number(count)} repeats are more than this compiler plans for", _span(st.count),
                    help=f"at most {MAX_REPEAT} blocks")
            return None
        body = [b for b in (_layer(c, x, False) for x in st.body if not _stray(c, x)) if b is not None]
        if not body:
            c.error("E0204", "`repeat` needs at least one layer in its body", st.span)
            return None
        return None if count is None else S.Repeat(count=count, body=tuple(body), span=st.span)
    if not isinstance(st, ast.Layer):
        _stray(c, st)
        return None
    kind = st.kind.id
    if kind not in LAYERS:
        c.error("E0111", f"unknown layer `{kind}`", st.kind.span, label="not a layer kind",
                help=did_you_mean(kind, LAYERS))
        return None
    if kind in L.CONTAINERS:
        if st.body is None:
            c.error("E0204", f"`{kind}` needs a body: `{kind} {{ ... }}`", st.span)
            return None
        body = [b for b in (_layer(c, x, False) for x in st.body if not _stray(c, x)) if b is not None]
        if not st.body:
            c.error("E0204", f"`{kind}` needs at least one layer in its body", st.span,
                    help="an empty residual would compute x + x")
            return None
        return S.Residual(body=tuple(body), span=st.span)
    if st.body is not None:
        c.error("E0204", f"`{kind}` takes no body", st.span, help="only `residual` and `repeat` hold layers")
    a = c.bind(st.args, LAYERS[kind], f"`{kind}`", st.span)
    if a is None:
        return None
    return L.BY_NAME[kind].resolve(c, st, a, kind)


def _stray(c: _Checker, st) -> bool:
    """Report a setting or axis written among layers; True if `st` is one."""
    if isinstance(st, ast.Assign):
        c.error("E0111", "sizes are defined at the top of the model, not inside a block", st.span,
                help=f"move `{st.key.id} = ...` out of the block")
        return True
    if isinstance(st, ast.Axis):
        c.error("E0111", "`axis` belongs in the `mesh` section", st.span)
        return True
    return False


def _model_structure(c: _Checker, sec: ast.Section, layers: list) -> None:
    """The layer sequence: embedding first, lm_head then cross_entropy last, one width throughout."""
    top = [type(x) for x in layers]
    if not layers or top[0] is not S.Embedding:
        c.error("E0204", "a model starts with `embedding(vocab, hidden)`",
                layers[0].span if layers else sec.kind.span, help="put the token embedding first")
        return
    if top[-2:] != [S.LMHead, S.CrossEntropy]:
        c.error("E0204", "a model ends with `lm_head(...)` then `cross_entropy`", layers[-1].span,
                help="end the model with `lm_head(vocab, hidden)` and `cross_entropy`")
        return
    emb, head = layers[0], layers[-2]
    width = emb.hidden

    def walk(items, top_level, in_residual=False):
        for i, x in enumerate(items):
            if isinstance(x, S.MoE) and x.dropped == "residual" and not in_residual:
                c.error("E0705", "this `moe` drops tokens to the residual, but it is not inside a `residual`", x.span,
                        label="dropped tokens would vanish here",
                        help="wrap it: `residual { rmsnorm(hidden)  moe(...) }`, or write `dropped = identity` to pass "
                             "a dropped token on through the layer itself")
            if top_level and isinstance(x, (S.Embedding, S.LMHead, S.CrossEntropy)) and i not in (0, len(items) - 2,
                                                                                            len(items) - 1):
                c.error("E0204", f"`{_kind(x)}` may appear only once, at its place", x.span)
            if not top_level and isinstance(x, (S.Embedding, S.LMHead, S.CrossEntropy, S.Positional)):
                c.error("E0204", f"`{_kind(x)}` cannot sit inside a block", x.span)
            if isinstance(x, S.Positional) and top_level and i != 1:
                c.error("E0204", "`positional` comes right after `embedding`", x.span)
            w = getattr(x, "hidden", None)
            if w is not None and c.number(w) != c.number(width):
                c.error("E0203", f"width mismatch: `{_kind(x)}` works on width {c.number(w)}, the model's is "
                        f"{c.number(width)}", x.span, help="every layer of the residual stream has the embedding's "
                        "width; use the same size name")
            if isinstance(x, (S.Residual, S.Repeat)):
                walk(x.body, False, in_residual or isinstance(x, S.Residual))

    walk(layers, True)
    if c.number(head.vocab) != c.number(emb.vocab):
        c.error("E0203", f"the LM head predicts {c.number(head.vocab)} tokens but the embedding has "
                f"{c.number(emb.vocab)}", head.span, help="use the same vocabulary size for both")


def _positions_twice(c: _Checker, layers: list) -> None:
    """Learned absolute positions beside rotary embeddings: both run, but a model has one of them (GPT-2 the first,
    Llama the second); the two together are almost surely a half-converted file."""
    pos = next((x for x in layers if isinstance(x, S.Positional)), None)
    rotary = next((x for x in S.walk(layers) if isinstance(x, (S.Attention, S.MLA)) and x.rope_theta), None)
    if pos is not None and rotary is not None:
        c.warn("W0138", "learned positions and rotary embeddings together: positions are encoded twice", pos.span,
               label="learned absolute positions", help=f"the attention at {rotary.span} has rotary embeddings "
               f"(rope_theta = {rotary.rope_theta:g}); remove `positional(...)`, or `rope_theta` for GPT-style "
               "learned positions")


# -- mesh, plan, train --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _MeshWritten:
    """The mesh section, checked: the machines (the Spec's) and the axes and node counts (the Plan's)."""
    machines: S.Mesh
    axes: tuple
    nodes: int
    devices_per_node: int
    axis_spans: dict

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node


def _mesh(c: _Checker, sec: ast.Section, cluster_only: bool = False) -> _MeshWritten | None:
    axes: list[tuple[str, int]] = []
    spans: dict[str, Span] = {}
    for st in sec.body:
        if not isinstance(st, ast.Axis):
            continue
        name = st.name.id
        if name not in KNOWN_AXES:
            c.error("E0111", f"unknown axis `{name}`", st.name.span, label="not a parallelism axis",
                    help=did_you_mean(name, KNOWN_AXES))
            continue
        if name in spans:
            c.error("E0102", f"axis `{name}` is declared twice", st.name.span,
                    help=f"the first is at {spans[name]}")
            continue
        n = c.as_int(st.size, f"axis `{name}`", 1)
        if n is None:
            continue
        axes.append((name, n))
        spans[name] = st.span
    s = _settings(c, sec, MESH_SETTINGS, "mesh", allowed_other=(ast.Axis,))
    if s is None:
        return None
    kind = s["device"]
    figures = DEVICES[kind]
    for key in OVERRIDABLE:
        if s[key] is not None and (s[key] <= 0 or (key.endswith("_efficiency") and s[key] > 1)):
            c.error("E0120", f"`{key}` must be positive" + (" and at most 1" if key.endswith("_efficiency") else ""),
                    _span(s["_spans"][key]), help=f"or leave it out to use the figures of `{kind}`")
            return None
    device = S.Device(kind=kind, **{f.name: getattr(figures, f.name) if s.get(f.name) is None else s[f.name]
                                    for f in dataclasses.fields(figures)})
    mesh = _MeshWritten(S.Mesh(device=device, span=sec.span), tuple(axes), s["nodes"], s["devices_per_node"], spans)
    if cluster_only and (not axes or math.prod(n for _, n in axes) != mesh.world_size):  # the search's to choose
        return dataclasses.replace(mesh, axes=(("dp", mesh.world_size),), axis_spans={})
    if not axes and not any(isinstance(st, ast.Axis) for st in sec.body):
        c.error("E0113", "the mesh declares no axis", sec.kind.span, help="declare at least one, e.g. `axis dp = 1`")
        return None
    product = math.prod(n for _, n in axes)
    if product != mesh.world_size:
        shown = " × ".join(f"{a}={n}" for a, n in axes) or "no axes"
        target = spans[axes[-1][0]] if axes else sec.kind.span
        folded = (" (`ep` counts like `dp`: the batch is split over dp × ep ranks, each holding 1/ep of the "
                  "experts; to fold ep out of existing dp ranks, divide dp by ep)") if "ep" in spans else ""
        c.error("E0301", f"the mesh axes hold {product} devices but the machines have {mesh.world_size}", target,
                label=f"{shown} = {product}",
                help=f"nodes × devices_per_node = {mesh.nodes} × {mesh.devices_per_node} = {mesh.world_size}; "
                     f"make the product of the axes equal it{folded}")
        return None
    _tp_placement(c, mesh)
    return mesh


def _tp_placement(c: _Checker, mesh: _MeshWritten) -> None:
    """W0413: tp's groups cross nodes though tp fits in one. The axes are listed outermost first and the last
    varies fastest over the ranks (runtime/mesh.py builds the DeviceMesh so; compiler/cost/step_time.py `links` reads
    the same order), so tp's group is tp ranks `stride` apart, stride the product of the axes listed after it: it
    stays in a node when tp × stride divides devices_per_node. tp's all-reduces sit on every layer's critical path,
    and between nodes they run at the network's bandwidth, a tenth of NVLink's."""
    names = [a for a, _ in mesh.axes]
    if "tp" not in names or mesh.nodes < 2:
        return
    i = names.index("tp")
    n, per_node = mesh.axes[i][1], mesh.devices_per_node
    stride = math.prod(k for _, k in mesh.axes[i + 1:])
    block = n * stride
    if n < 2 or (block <= per_node and per_node % block == 0) or n > per_node or per_node % n:
        return  # inside a node already, or too large for one whatever the order
    inner = ", ".join(f"{a} = {k}" for a, k in mesh.axes[i + 1:] if k > 1)
    c.warn("W0413", f"tp = {n} is listed before {inner}, so each tp group takes ranks {stride} apart and crosses "
           f"nodes of {per_node} devices", mesh.axis_spans["tp"], label="tp's all-reduces cross nodes",
           help=f"axes are listed outermost first and the last varies fastest over the ranks: list `axis tp = {n}` "
                f"last and its groups stay inside a node (`scalec plan` shows each axis's link)")


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


def _device_figures(c: _Checker, sec: ast.Section) -> None:
    """A device figure written as a number far outside any device: a warning at it (the cost model would plan for
    it as written, and say nothing while the memory check passes a plan no device can hold)."""
    for st in sec.body:
        if not (isinstance(st, ast.Assign) and st.key.id in FIGURE_RANGES and isinstance(st.value, ast.Number)):
            continue
        low, high, unit = FIGURE_RANGES[st.key.id]
        v = float(st.value.value)
        if v > 0 and ((low is not None and v < low) or (high is not None and v > high)):
            c.warn("W0139", f"`{st.key.id} = {v:g}` is far outside any device", st.value.span,
                   label="in other units?", help=f"{st.key.id} is in {unit}")


def _plan(c: _Checker, sec: ast.Section | None, cluster_only: bool = False) -> dict | None:
    """The plan section's settings, checked, each default filled in, with `spans` ((setting, Span), ...)."""
    s = _settings(c, sec, PLAN_SETTINGS, "plan")
    if s is None:
        return None
    if not cluster_only and s["virtual_stages"] > 1 and s["schedule"] != "interleaved-1f1b":
        c.error("E0604", f"virtual_stages = {s['virtual_stages']} needs the interleaved-1f1b schedule",
                _span(s["_spans"]["virtual_stages"]), help='set `schedule = "interleaved-1f1b"`, or `virtual_stages = 1`')
        return None
    spans = _spans_of(s) + tuple((f"layout {i}", sp) for i, (_, _, sp) in enumerate(s["layout"]))
    return {**{k: s[k] for k in PLAN_SETTINGS}, "spans": spans}  # a new setting: its PLAN_SETTINGS row, its field


def _written_plan(c: _Checker, mesh: _MeshWritten, settings: dict, train: S.Train) -> Plan:
    """The Plan as the file writes it: the mesh's axes and machines, the plan section's settings (compile's
    default resolved by the device), the train section's batch and sequence, and where each was written."""
    spans = [(f"axis {a}", sp) for a, sp in mesh.axis_spans.items()] + [("mesh", mesh.machines.span)]
    spans += list(settings["spans"]) + list(train.spans)
    fields = {k: v for k, v in settings.items() if k != "spans"}
    fields["layout"] = tuple((a, b) for a, b, *_ in fields["layout"])
    fields["tp_layers"] = tuple(fields["tp_layers"])
    fields["compile"] = compiles(fields["compile"], mesh.machines.device.kind)
    return Plan(axes=mesh.axes, nodes=mesh.nodes, devices_per_node=mesh.devices_per_node,
                global_batch=int(c.number(train.global_batch)), seq_len=int(c.number(train.seq_len)),
                spans=tuple(spans), **fields)


def _train(c: _Checker, sec: ast.Section) -> tuple[S.Train | None, dict]:
    """The training settings, and the value expressions as written (to locate cross-check diagnostics)."""
    s = _settings(c, sec, TRAIN_SETTINGS, "train")
    if s is None:
        return None, {}
    opt_kind, opt = s["optimizer"]
    if opt is None:
        c.error("E0113", "`train` needs an optimizer with a learning rate", sec.kind.span,
                help="add `optimizer = adamw(lr = 3e-4)`")
        return None, {}
    at = _span(s["_spans"]["optimizer"])
    if opt["lr"] <= 0:
        c.error("E0120", "the learning rate must be positive", at, help="e.g. `lr = 3e-4`")
    if not all(0 <= b < 1 for b in opt["betas"]):
        c.error("E0120", f"Adam's betas must lie in [0, 1), not {tuple(opt['betas'])}", at,
                help="the usual values are `betas = (0.9, 0.95)`")
    if s["seed"] > MAX_SEED:
        c.error("E0120", f"the seed must be at most {MAX_SEED}", _span(s["_spans"]["seed"]))
    if any(d.code == "E0120" and d.span in (at, _span(s["_spans"].get("seed"))) for d in c.diags):
        return None, {}
    for key in ("global_batch", "seq_len"):  # a literal becomes a named size, so formulas read in these words
        if not s[key].free_symbols:
            c.values[size_symbol(key)] = int(s[key])
            s[key] = size_symbol(key)
    sched_kind, sched = s["lr_schedule"]
    data_kind, data = s["data"]
    init_kind, init = s["init"]
    return S.Train(
        init_from=init["path"] if init_kind == "from" else "",
        global_batch=s["global_batch"], seq_len=s["seq_len"], steps=s["steps"], seed=s["seed"],
        precision=s["precision"],
        optimizer=S.Optimizer(kind=opt_kind, lr=opt["lr"], betas=tuple(opt["betas"]),
                              weight_decay=opt["weight_decay"], eps=opt["eps"]),
        schedule=S.LRSchedule(kind=sched_kind, warmup=sched["warmup"], min_lr=sched.get("min_lr", 0.0)),
        grad_clip=s["grad_clip"], data=S.Data(kind=data_kind, **data), log_every=s["log_every"],
        checkpoint_dir=s["checkpoint_dir"], checkpoint_every=s["checkpoint_every"],
        checkpoint_async=s["checkpoint_async"],
        restarts=(3 if s["checkpoint_dir"] else 0) if s["restarts"] is None else s["restarts"], timeout=s["timeout"],
        eval_every=s["eval_every"], eval_batches=s["eval_batches"], eval_split=s["eval_split"],
        spans=_spans_of(s)), s["_spans"]


def _arg_of(call, name: str, index: int):
    """The value expression of argument `name` (or the `index`-th positional one) of a call, or None."""
    for i, arg in enumerate(getattr(call, "args", ())):
        if (arg.name is not None and arg.name.id == name) or (arg.name is None and i == index):
            return arg.value
    return None


def _train_checks(c: _Checker, train: S.Train, written: dict) -> None:
    """Training settings that are each legal but together cannot do what they say, or that would fail only when the
    program starts: a schedule whose floor is above its peak, a warm-up longer than the run, a timeout the runtime's
    clocks cannot hold, checkpoint and log intervals the run never reaches."""
    opt, sched, steps = train.optimizer, train.schedule, train.steps
    at = {k: _span(v) for k, v in written.items()}
    if "timeout" in written and train.timeout > MAX_TIMEOUT:
        c.error("E0130", f"a timeout of {train.timeout:g} s is longer than the watchdog can wait",
                at["timeout"], label=f"more than {MAX_TIMEOUT:g} s (a week)",
                help=f"at most {MAX_TIMEOUT:g} s (\"7 days\"); a collective that legitimately takes longer than "
                     "its step is a hang. `timeout = 0` turns the watchdog off")
    elif "timeout" in written and 0 < train.timeout < MIN_TIMEOUT:
        c.warn("W0140", f"a timeout of {train.timeout:g} s is shorter than a healthy start-up or step can take",
               at["timeout"], label="the watchdog would end a healthy run",
               help=f"the watchdog bounds the rendezvous of all ranks and every collective: give at least "
                    f"{MIN_TIMEOUT:g} s (\"10 min\" is the default; a bare number is seconds); `timeout = 0` turns "
                    "it off")
    before = c.errors()
    counts = [(k, getattr(train, k), at.get(k)) for k in ("steps", "log_every", "checkpoint_every", "restarts",
                                                          "eval_every", "eval_batches")]
    counts.append(("warmup", sched.warmup, _span(_arg_of(written.get("lr_schedule"), "warmup", 0))))
    for key, n, where in counts:
        if n > MAX_COUNT and where is not None:
            c.error("E0120", f"`{key}` = {n} is more than a run counts", where, label="too large",
                    help=f"at most {MAX_COUNT}")
    if c.errors() > before:
        return  # the checks below compare these numbers
    call = written.get("optimizer")
    if opt.eps <= 0 and (e := _arg_of(call, "eps", 3)) is not None:
        c.error("E0120", "Adam's eps must be positive", _span(e), label="divides by the root of the second moment",
                help="the usual value is `eps = 1e-8`")
    if opt.lr > SUSPICIOUS_LR:
        c.warn("W0131", f"a learning rate of {opt.lr:g} is far above any AdamW rate", _span(_arg_of(call, "lr", 0))
               or at.get("optimizer"), label="the first step would blow the weights up",
               help="AdamW's peak rates are 1e-6 .. 1e-2: was `3e-3` meant?")
    call = written.get("lr_schedule")
    if sched.kind == "cosine" and sched.min_lr > opt.lr:
        c.error("E0131", f"the schedule's floor min_lr = {sched.min_lr:g} is above the peak lr = {opt.lr:g}",
                _span(_arg_of(call, "min_lr", 1)) or at.get("lr_schedule"), label="above `lr`",
                help="cosine decays from `lr` down to `min_lr`: make min_lr smaller than lr (e.g. lr / 10), or use "
                     "`constant(...)`")
    if sched.warmup >= steps and sched.warmup > 0:
        c.warn("W0130", f"a warm-up of {sched.warmup} steps is not over in a run of {steps}",
               _span(_arg_of(call, "warmup", 0)) or at.get("lr_schedule"), label=f"warmup ≥ steps = {steps}",
               help=f"the learning rate never reaches lr = {opt.lr:g}; use a warm-up shorter than `steps` (a few "
                    "percent of it)")
    if "checkpoint_every" in written and train.checkpoint_every:
        if not train.checkpoint_dir:
            c.warn("W0132", "`checkpoint_every` without `checkpoint_dir`: no checkpoint is written",
                   at["checkpoint_every"], label="has no effect",
                   help='add `checkpoint_dir = "ckpt"` to write checkpoints, or remove `checkpoint_every`')
        elif train.checkpoint_every >= steps:
            c.warn("W0133", f"checkpoint_every = {train.checkpoint_every} is not shorter than the run ({steps} steps):"
                   " only the last step is checkpointed", at["checkpoint_every"], label="has no effect",
                   help="the last step is always checkpointed; use fewer steps between checkpoints, or remove it")
    if "checkpoint_async" in written and train.checkpoint_async:
        why = ("no `checkpoint_dir`: no checkpoint is written" if not train.checkpoint_dir else
               "only the last step is checkpointed, and a run waits for its last checkpoint"
               if not 0 < train.checkpoint_every < steps else "")
        if why:
            c.warn("W0142", f"checkpoint_async has nothing to overlap: {why}", at["checkpoint_async"],
                   label="has no effect", help="asynchronous saves overlap the steps after a checkpoint that is not "
                   "the last: write checkpoints every `checkpoint_every` steps into `checkpoint_dir`, or remove it")
    if "restarts" in written and train.restarts and not train.checkpoint_dir:
        c.warn("W0134", f"restarts = {train.restarts} without `checkpoint_dir`: each restart begins again at step 0",
               at["restarts"], label="nothing to resume from",
               help='add `checkpoint_dir = "ckpt"` so that a restart resumes from the last checkpoint')
    if "log_every" in written and train.log_every > steps:
        c.warn("W0135", f"log_every = {train.log_every} is longer than the run ({steps} steps): only the first and "
               "last steps are logged", at["log_every"], label="has no effect",
               help="the first and last steps are always logged; use a shorter interval, or remove it")
    _eval_checks(c, train, at)


def _eval_checks(c: _Checker, train: S.Train, at: dict) -> None:
    """The evaluation settings: a share held out that is no fraction, an evaluation of a token file with nothing
    held out (it would evaluate on training data, or on nothing), and settings that evaluate nothing."""
    split = train.eval_split
    if "eval_split" in at and not 0 < split <= MAX_EVAL_SPLIT:
        c.error("E0120", f"eval_split = {split:g} is not a share in (0, {MAX_EVAL_SPLIT:g}]", at["eval_split"],
                label="a fraction of the file's windows",
                help="the share of the token file held out for evaluation: 0.01 .. 0.1 is usual (`eval_split = "
                     "0.05` holds out the last 5% of its windows)")
    tokens = train.data.kind == "tokens"
    if not train.eval_every:
        for key in ("eval_batches", "eval_split"):
            if key in at:
                c.warn("W0141", f"`{key}` without `eval_every`: no evaluation runs", at[key], label="has no effect",
                       help="add `eval_every = N` to evaluate every N steps (and after the last)"
                            + (", or remove it" if key == "eval_batches" else
                               "; without it the whole file is trained on" if tokens else ", or remove it"))
        return
    if tokens and "eval_split" not in at:
        c.error("E0133", "`eval_every` on a token file with nothing held out: evaluation needs data the run never "
                "trains on", at["eval_every"], label="no `eval_split`",
                help="add `eval_split = 0.05` (the last 5% of the file's windows are held out and never trained "
                     "on), or remove `eval_every`")
    elif not tokens and "eval_split" in at:
        c.warn("W0141", "`eval_split` with synthetic data: its held-out batches are a seed stream of their own",
               at["eval_split"], label="has no effect",
               help="eval_split holds out the tail of a token file (`data = tokens(...)`); remove it")


def _no_effect_checks(c: _Checker, spec: S.Spec, axes_written: bool) -> None:
    """Plan settings written with a value that changes nothing in this mesh: a warning at the setting, so that a user
    who believes it does something learns that it does not (tests/test_settings_reach_output.py holds every setting
    to this: it changes the program, or the check says why not)."""
    plan = spec.plan
    at = dict(plan.spans)
    if spec.train.precision == "fp32":  # settings of the bf16 policy (runtime.precision)
        if "grad_reduce" in at and plan.grad_reduce != PLAN_SETTINGS["grad_reduce"].default:
            c.warn("W0302", f"grad_reduce = {plan.grad_reduce} under `precision = fp32`: gradients are fp32",
                   at["grad_reduce"], label="has no effect",
                   help="grad_reduce chooses how bf16 programs accumulate and reduce gradients; set "
                        "`precision = bf16`, or remove it")
        if plan.fp32_residual and "fp32_residual" in at:
            c.warn("W0303", "fp32_residual under `precision = fp32`: every activation is fp32 already",
                   at["fp32_residual"], label="has no effect",
                   help="fp32_residual keeps a bf16 program's residual stream in fp32; set `precision = bf16`, or "
                        "remove it")
    if not axes_written:
        return  # axes not written (a search chooses them): no setting can be said to lack an axis
    tp, pp, dp = plan.size("tp"), plan.size("pp"), plan.size("dp")

    def warn(code: str, key: str, message: str, help: str) -> None:
        if key in at:
            c.warn(code, message, at[key], label="has no effect", help=help)

    if plan.size("cp") == 1 and "context_parallel" in at:
        warn("W0310", "context_parallel", "context_parallel without context parallelism: the mesh has no `cp` axis "
             "(or cp = 1)", "context_parallel says how attention runs over a sequence sharded over cp; add "
             "`axis cp = 2` (or more), or remove the setting")
    if tp == 1:
        no_tp = "the mesh has no `tp` axis (or tp = 1)"
        if plan.sequence_parallel:
            warn("W0410", "sequence_parallel", f"sequence parallelism without tensor parallelism: {no_tp}",
                 "sequence parallelism splits norms and residuals over the tp ranks; add `axis tp = 2` (or more), "
                 "or remove the setting")
        if plan.pad_vocab:
            warn("W0411", "pad_vocab", f"pad_vocab without tensor parallelism: {no_tp}",
                 "the vocabulary is padded to a multiple of tp, and tp = 1 divides every vocabulary; remove it")
        if set(plan.tp_layers) != set(TP_LAYERS):
            warn("W0412", "tp_layers", f"tp_layers without tensor parallelism: {no_tp}",
                 "tp_layers says what a tp axis shards; add `axis tp = ...`, or remove the setting")
    elif plan.pad_vocab:
        vocab = int(spec.value(next(x for x in spec.model.layers if isinstance(x, S.Embedding)).vocab))
        if "vocab" not in plan.tp_layers:
            warn("W0411", "pad_vocab", "pad_vocab, but the vocabulary is not sharded (`vocab` is not in tp_layers)",
                 "padding applies to a vocabulary split over tp; remove it, or add `vocab` to tp_layers")
        elif vocab % tp == 0:
            warn("W0411", "pad_vocab", f"pad_vocab, but tp = {tp} divides the vocabulary ({vocab}): nothing is padded",
                 "padding is only needed when tp does not divide the vocabulary; remove it")
    if pp == 1:
        no_pp = "the mesh has no `pp` axis (or pp = 1)"
        if plan.schedule != PLAN_SETTINGS["schedule"].default:
            warn("W0612", "schedule", f"a pipeline schedule without pipeline parallelism: {no_pp}",
                 "the schedule orders the micro-batches of pipeline stages; add `axis pp = 2` (or more), or remove it")
        if plan.virtual_stages > 1:
            warn("W0613", "virtual_stages", f"virtual stages without pipeline parallelism: {no_pp}",
                 "virtual stages interleave the blocks of several stages on each pp rank; add `axis pp = ...`, or "
                 "remove it")
        if plan.layout:
            warn("W0614", "layout", f"a stage layout without pipeline parallelism: {no_pp}",
                 "a layout gives the blocks of each pipeline stage; add `axis pp = ...`, or remove it")
    if dp == 1 and plan.data_parallel != PLAN_SETTINGS["data_parallel"].default:
        warn("W0301", "data_parallel", f"data_parallel = {plan.data_parallel} shards over dp, and dp = 1",
             "ZeRO and FSDP shard the model state over the dp ranks; with one there is nothing to shard: add dp "
             "ranks, or remove the setting")
    if plan.fsdp_grad_sync != PLAN_SETTINGS["fsdp_grad_sync"].default:
        why = ("data_parallel is not fsdp or zero2" if plan.data_parallel not in ("fsdp", "zero2") else
               "dp = 1: nothing is sharded" if dp == 1 else
               "micro_batches = 1: every step reduce-scatters once" if plan.micro_batches == 1 else
               "with pp the pipeline schedule reduce-scatters once, after the last micro-batch" if pp > 1 else "")
        if why:
            warn("W0306", "fsdp_grad_sync", f"fsdp_grad_sync = {plan.fsdp_grad_sync} has no effect: {why}",
                 "it chooses when FSDP2 (fsdp, zero2 over dp > 1, no pp) reduce-scatters the gradients of a step of "
                 "several micro-batches; remove it, or use it with such a plan")
    if plan.recompute != "none" and not any(isinstance(x, S.Repeat) for x in spec.model.layers):
        warn("W0136", "recompute", "recompute, but the model has no `repeat` of blocks to recompute",
             "recomputation applies to each block of the model's `repeat`; write the blocks as `repeat n { ... }`")


def _windows_cover_the_sequence(c: _Checker, model: S.Model, train: S.Train) -> None:
    """A sliding window at least as long as the training sequences masks nothing the causal mask keeps: the
    attention is full causal and the setting changes nothing (but the program's kernel, and `plan`'s FLOPs)."""
    seq = int(c.number(train.seq_len))
    for a in (x for x in S.walk(model.layers) if isinstance(x, S.Attention) and x.window is not None):
        w = int(c.number(a.window))
        if w >= seq:
            c.warn("W0207", f"a window of {w} tokens covers the whole {seq}-token sequence: this attention is full "
                   "causal", a.window_span or a.span, label="has no effect",
                   help=f"sliding windows matter for sequences longer than the window; remove `window`, or train "
                        f"with seq_len above {w}")


def _bind_capacities(c: _Checker, model: S.Model, train: S.Train) -> None:
    """Each `moe` layer's capacity (slots per expert per sequence), from the sequence length."""
    for m in (x for x in S.walk(model.layers) if isinstance(x, S.MoE)):
        seq, experts = int(c.number(train.seq_len)), int(c.number(m.experts))
        slots = c.values[m.capacity] = capacity(seq, experts, m.top_k, m.capacity_factor)
        choices = m.top_k * seq
        if m.capacity_factor != "none" and 10 * experts * slots < choices:  # W0718: less than a tenth kept
            c.warn("W0718", f"capacity_factor = {m.capacity_factor:g} keeps at most {experts * slots:,} of the "
                   f"{choices:,} choices of each sequence ({experts * slots / choices:.0%}), the rest dropped",
                   m.capacity_span or m.span, label=f"{experts} experts × {slots} slot{'s' if slots > 1 else ''} "
                   f"for top_k {m.top_k} × seq_len {seq}",
                   help="capacity_factor is a multiple of a balanced share (top_k · seq_len / experts slots per "
                        "expert): 1.0 keeps every choice of a balanced load, 1.25 leaves room for imbalance (GShard, "
                        "Switch), `none` drops nothing")


def _file_checks(c: _Checker, model: S.Model, train: S.Train, spans: dict) -> F.Reading | None:
    """What the training settings need of the files and the model, whatever the plan; how the token file will be
    read (None without one, or when it cannot be)."""
    reading = None
    if train.data.document_separator is not None:
        _packed_checks(c, model, train, spans["data"])
    if train.data.kind == "tokens":
        reading = _data_checks(c, model, train, spans["data"], {k: _span(v) for k, v in spans.items()})
    if train.init_from:
        _init_checks(c, model, train, spans["init"])
    if train.data.kind == "synthetic" and int(c.number(model.embedding.vocab)) < 4:
        c.error("E0120", "the synthetic task needs a vocabulary of at least 4 tokens", model.embedding.span)
    return reading


def _packed_checks(c: _Checker, model: S.Model, train: S.Train, call: ast.Call) -> None:
    """Packed documents (runtime/packed.py): a separator inside the vocabulary, and attention they run with."""
    at = _arg_span(call, "document_separator", tuple(DATASETS["tokens"]))
    sep, vocab = train.data.document_separator, int(c.number(model.embedding.vocab))
    if not 0 <= sep < vocab:
        c.error("E0812", f"document separator {sep} is outside the vocabulary of {vocab} tokens", at,
                label=f"not in 0..{vocab - 1}", help="give the id that ends each document of the token file (the "
                                                     "tokenizer's end-of-document token)")
    for x in S.walk(model.layers):
        why = ("multi-head latent attention (`mla`)" if isinstance(x, S.MLA) else
               "sliding-window attention (`window`)" if isinstance(x, S.Attention) and x.window is not None else
               "soft-capped attention (`softcap`)" if isinstance(x, S.Attention) and x.softcap is not None else None)
        if why:
            c.error("E0319", f"packed documents with {why} are not built yet (the layer at {x.span})", at,
                    label="each document attends only to itself",
                    help="remove `document_separator` (the file is then one stream), or use causal `attention` "
                         "without a window or soft cap")
            break


def _data_checks(c: _Checker, model: S.Model, train: S.Train, call: ast.Call, written_at: dict) -> F.Reading | None:
    """The token file exists and fits `dtype` and the model, found where the program will look: a relative path is
    relative to this .scale file's directory. A .npy file's header says its dtype and length (a dtype written
    otherwise is an error); a sidecar (compiler/files.py), when the file has one, says its dtype, vocabulary and
    length, and a Megatron index (PREFIX.idx beside PREFIX.bin) its dtype; without any, the first MiB says what it
    can (every id is checked when the run opens the file).
    Returns how the file will be read (`scalec check` prints it, the program reads exactly that), None when it
    cannot be."""
    order = tuple(DATASETS["tokens"])
    at = _arg_span(call, "path", order)
    at_dtype = _arg_span(call, "dtype", order, at)  # a defaulted dtype: at the path
    written = _has_arg(call, "dtype", order)
    shown = os.path.join(os.path.dirname(c.file.path), train.data.path)
    where = f"a relative path is relative to the .scale file's directory ({os.path.dirname(c.file.path) or '.'})"
    dtype = train.data.dtype
    vocab = int(c.number(model.embedding.vocab))
    if not os.path.exists(shown):
        c.error("E0801", f"data file {shown} does not exist", at, label="no such file", help=where)
        return None
    if os.path.isdir(shown):
        c.error("E0801", f"data file {shown} is a directory", at, label="not a file of token ids",
                help="name the binary file of token ids itself")
        return None
    size = os.path.getsize(shown)
    start = F.read_start(shown) if size else b""
    try:
        header = F.npy_header(start, size, named_npy=shown.lower().endswith(".npy"))
    except F.NpyError as exc:
        c.error("E0813", f"data file {shown} {exc}", at, label="not a flat array of token ids",
                help="a .npy token file holds one flat array of uint16, uint32, int32 or int64 ids, as "
                     "np.save(path, ids) writes it")
        return None
    fmt, offset, dtype_from = "raw", 0, "declared" if written else "the default"
    if header is not None:
        if written and dtype != header.dtype:
            c.error("E0803", f"data file {shown} holds {header.dtype} ids (its .npy header says so), but the file "
                    f"declares {dtype}", at_dtype, label=f"its header says {header.dtype}",
                    help=f"write `dtype = {header.dtype}`, or leave `dtype` out: a .npy file is read in the dtype "
                         "its header gives")
            return None
        fmt, offset, dtype, dtype_from = "npy", header.offset, header.dtype, "its .npy header"
    item = F.ITEMSIZE[dtype]
    try:
        side = F.read_sidecar(shown)
    except F.SidecarError as exc:
        c.error("E0805", f"the sidecar of data file {shown} cannot be read: {exc}", at, label="its sidecar",
                help=f"rewrite it with runtime.data.write_tokens, or remove {F.sidecar_path(shown)} to use the file "
                     "bare")
        return None
    if side is not None and not _sidecar_checks(c, side, shown, size - offset, dtype, model, at, at_dtype):
        return None
    if side is not None and header is None:
        dtype_from = "its sidecar"
    indexed = None
    if side is None and header is None:  # a Megatron dataset (PREFIX.bin): its PREFIX.idx says the dtype
        try:
            indexed = F.index_dtype(shown)
        except F.IndexFileError as exc:
            c.error("E0814", f"data file {shown}: {exc}", at, label="its index",
                    help="write the dataset with uint16 ids (a vocabulary up to 65536) or int32, as Megatron's "
                         "preprocess_data.py and `scalec data` do")
            return None
        if indexed is not None and written and indexed != dtype:
            c.error("E0803", f"data file {shown} holds {indexed} ids (its index {os.path.basename(shown)[:-4]}.idx "
                    f"says so), but the file declares {dtype}", at_dtype, label=f"its index says {indexed}",
                    help=f"write `dtype = {indexed}`, or leave `dtype` out: a Megatron dataset is read in the dtype "
                         "its index gives")
            return None
        if indexed is not None:
            dtype, dtype_from = indexed, f"its index {os.path.basename(shown)[:-4]}.idx"
            item = F.ITEMSIZE[dtype]
    payload = size - offset
    if payload == 0:
        c.error("E0801", f"data file {shown} is empty", at, label="no tokens")
    elif payload % item:
        c.error("E0801", f"data file {shown} holds {size} bytes, not a whole number of {dtype} ids", at,
                label=f"{size} % {item} == {size % item}",
                help=f"`dtype = {dtype}` reads {item} bytes per id: is it the file's dtype (uint16, "
                     "uint32, int32 or int64), and is the file whole?")
    elif payload // item <= (seq := int(c.number(train.seq_len))) + 1:
        c.error("E0801", f"data file {shown} holds {payload // item} tokens, too few for one sequence of {seq}", at,
                help=f"a training window is seq_len + 1 tokens; the file needs more than {seq + 1}")
    else:
        got = _sample_checks(c, shown, dtype, vocab, at, at_dtype, start, offset, guess=side is None and
                             header is None and indexed is None)
        _held_out_checks(c, train, shown, payload // item, seq, written_at)
        return F.Reading(path=shown, format=fmt, dtype=dtype, dtype_from=dtype_from, tokens=payload // item,
                         seen=got.seen, sampled=got.nbytes, vocab=side.vocab_size if side is not None else None)
    return None


def _has_arg(call: ast.Call, name: str, order: tuple) -> bool:
    """Whether argument `name` of a call whose parameters are `order` is written (by name or by position)."""
    return any((a.name.id if a.name else order[i] if i < len(order) else None) == name
               for i, a in enumerate(call.args))


def _held_out_checks(c: _Checker, train: S.Train, shown: str, tokens: int, seq: int, at: dict) -> None:
    """The held-out tail of `eval_split` (runtime.split, the runtime's own formula) holds the sequences of every
    evaluation (eval_batches × global_batch, read without repeating one), and leaves some to train on."""
    split = train.eval_split
    if not train.eval_every or not split or not 0 < split <= MAX_EVAL_SPLIT:
        return
    got = split_windows(tokens, seq, split)
    need = train.eval_batches * int(c.number(train.global_batch))
    if got.eval_windows < need:
        c.error("E0811", f"eval_split = {split:g} of {shown} holds out {got.eval_windows} sequence(s) of {seq}, "
                f"fewer than one evaluation reads (eval_batches {train.eval_batches} × global_batch "
                f"{int(c.number(train.global_batch))} = {need})", at["eval_split"],
                label=f"{got.eval_windows} of the file's {(tokens - 1) // seq} windows",
                help=_held_out_help(tokens, seq, need, int(c.number(train.global_batch))))
    elif got.train_windows < 1:
        c.error("E0811", f"eval_split = {split:g} of {shown} leaves no sequence of {seq} to train on",
                at["eval_split"], label="nothing left to train on", help="hold out less, or use a larger file")


def _held_out_help(tokens: int, seq: int, need: int, batch: int) -> str:
    """What would hold out enough: the least share that does, else the most batches the largest share gives."""
    least = next((k / 1000 for k in range(1, int(MAX_EVAL_SPLIT * 1000) + 1)
                  if split_windows(tokens, seq, k / 1000).eval_windows >= need), None)
    if least is not None:
        return f"hold out more (`eval_split = {least:g}` holds out {need}), or read fewer `eval_batches`"
    held = split_windows(tokens, seq, MAX_EVAL_SPLIT).eval_windows
    most = held // batch
    return (f"even eval_split = {MAX_EVAL_SPLIT:g} holds out {held} sequence(s): " +
            (f"read at most `eval_batches = {most}`, or use a larger file" if most else "use a larger file"))


def _sidecar_checks(c: _Checker, side: F.Sidecar, shown: str, size: int, dtype: str, model: S.Model, at: Span,
                    at_dtype: Span) -> bool:
    """The sidecar against the declared dtype, the file's size and the model's vocabulary; False when it disagrees."""
    ok = True
    vocab = int(c.number(model.embedding.vocab))
    if side.dtype != dtype:
        c.error("E0803", f"data file {shown} holds {side.dtype} ids, but the file declares {dtype}", at_dtype,
                label=f"its sidecar says {side.dtype}",
                help=f"write `dtype = {side.dtype}` (read as {dtype}, every id would be garbage); the dtype is "
                     f"recorded in {side.path}")
        ok = False
    need = side.tokens * F.ITEMSIZE[side.dtype]
    if need != size:
        c.error("E0805", f"data file {shown} holds {size} bytes, but its sidecar says {side.tokens} {side.dtype} ids "
                f"({need} bytes)", at, label="file and sidecar disagree",
                help="the file was changed or cut short after its sidecar was written: write both again "
                     "(runtime.data.write_tokens)")
        ok = False
    if side.vocab_size > vocab:
        tok = f" ({side.tokenizer})" if side.tokenizer else ""
        c.error("E0804", f"data file {shown} has a vocabulary of {side.vocab_size} tokens{tok}, the model "
                f"{vocab}", at, label=f"ids up to {side.vocab_size - 1}",
                help=f"the model's vocabulary must hold every id of the data: make `vocab` at least "
                     f"{side.vocab_size} (the embedding at {model.embedding.span})")
        ok = False
    return ok


def _sample_checks(c: _Checker, shown: str, dtype: str, vocab: int, at: Span, at_dtype: Span, start: bytes,
                   offset: int, guess: bool) -> F.Sample:
    """What the first MiB of a token file says: ids outside the vocabulary, or (`guess`: a bare file, whose dtype
    nothing records) a file of another dtype."""
    got = F.sample(shown, dtype, vocab, start=start, offset=offset)
    read = F.shown_bytes(got.nbytes)
    if got.outside is not None:
        pos, tid = got.outside
        fits_as = got.fits_as if guess else None
        also = (f"read as {fits_as}, every id of those bytes is inside the vocabulary: is the file {fits_as}? "
                f"Write `dtype = {fits_as}`" if fits_as else
                "the model's vocabulary must hold every id of the data; the run would stop at this id")
        c.error("E0804", f"data file {shown}: token id {tid} at position {pos} is outside the vocabulary of {vocab} "
                f"(ids 0..{vocab - 1})", at_dtype if fits_as else at,
                label=f"read as {dtype}" if fits_as else f"in its first {read}", help=also)
    elif guess and got.looks_like is not None:
        seen = ("is 0" if got.parts == 2 else "are 0") if got.high == 0 else (
            f"is at most {got.high}" if got.parts == 2 else f"are at most {got.high}")
        which = f"every odd {dtype}" if got.parts == 2 else f"the last {got.parts - 1} {dtype} of every {got.parts}"
        c.warn("W0803", f"`dtype = {dtype}`, but {which} of the first {read} of {shown} {seen}: the file "
               f"looks like {got.looks_like}", at_dtype, label=f"{dtype} declared",
               help=f"if it was written as {got.looks_like}, write `dtype = {got.looks_like}`; a sidecar "
                    f"({os.path.basename(F.sidecar_path(shown))}, written by runtime.data.write_tokens) or a .npy "
                    "header (np.save) records the dtype and silences this guess")
    return got


def _arg_span(call: ast.Call, name: str, order: tuple, default: Span | None = None) -> Span:
    """The span of argument `name` of a call whose parameters are `order` (positional arguments stand for them in
    that order), else `default` or the call's."""
    for i, a in enumerate(call.args):
        if (a.name.id if a.name else order[i] if i < len(order) else None) == name:
            return _span(a.value)
    return default or call.span


def _init_checks(c: _Checker, model: S.Model, train: S.Train, call: ast.Call) -> None:
    """The checkpoint of `init = from(...)` exists and holds safetensors, found where the program will look (a
    relative path is relative to this .scale file's directory), and its headers (names, shapes; no tensor data)
    and config.json fit the model (compiler/hf_header.py): a checkpoint of another architecture or size is
    refused here, before any process starts, rather than on every rank after launch."""
    at = _arg_span(call, "path", tuple(INITS["from"]))
    shown = os.path.join(os.path.dirname(c.file.path), train.init_from)
    where = f"a relative path is relative to the .scale file's directory ({os.path.dirname(c.file.path) or '.'})"
    if not os.path.exists(shown):
        c.error("E0802", f"checkpoint {shown} does not exist", at, label="no such file or directory", help=where)
    elif os.path.isdir(shown) and not any(f.endswith(".safetensors") for f in os.listdir(shown)):
        c.error("E0802", f"checkpoint directory {shown} holds no .safetensors file", at,
                label="no weights here", help="name the directory `save_pretrained` wrote, or its .safetensors file")
    elif os.path.isfile(shown) and not shown.endswith(".safetensors"):
        c.error("E0802", f"checkpoint {shown} is not a .safetensors file", at, label="not safetensors",
                help="Hugging Face checkpoints in safetensors (model.safetensors, or a directory of shards)")
    else:
        try:
            tensors, config = H.checkpoint_tensors(shown), H.read_config(shown)
        except H.HeaderError as exc:
            c.error("E0806", f"checkpoint {shown} cannot be read: {exc}", at, label="unreadable",
                    help="download or save it again (a safetensors file is a length, a JSON header, then the data)")
            return
        for p in H.compare(model, c.number, shown, tensors, config, imported_model):
            c.error(p.code, p.message, at, label=p.label, help=p.help)


# -- helpers ------------------------------------------------------------------------------------------------------


def _kind(layer) -> str:
    return {S.Embedding: "embedding", S.Positional: "positional", S.Attention: "attention", S.MLP: "mlp",
            S.Residual: "residual", S.Repeat: "repeat", S.MoE: "moe", S.LMHead: "lm_head",
            S.CrossEntropy: "cross_entropy"}.get(type(layer), getattr(layer, "kind", "layer"))


def imported_model(config: dict):
    """(the model section `scalec import` writes from a Hugging Face `config`, its sizes' number), or the first
    diagnostic's message where it does not import: what compiler/hf_header holds a Gemma checkpoint's model to, and
    what compiler/export holds a Gemma config it writes to."""
    from compiler.importer import complete, import_config
    try:
        spec = check_text(complete(import_config(json.dumps(config), "config.json")), "config.scale")
    except ScaleError as err:
        return err.diagnostics[0].message
    return spec.model, spec.value

