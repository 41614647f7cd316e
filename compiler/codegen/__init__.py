"""Emit build/<name>/: program.py (rank-generic), plan.json and launch.sh.

The skeleton comes from jinja2 templates beside this file; each segment's forward body is the torch.fx code of its
traced graph, with a comment naming the .scale line before each layer's statements. Nothing a user writes reaches
the output except through the escaping function of its context (compiler/codegen/escape.py: Python literal,
docstring, `#` comment, shell word, JSON); the templates refuse any other text. Output is deterministic: no
timestamps, no absolute paths, stable ordering.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import jinja2
import sympy
from torch import fx, nn

from compiler import __version__
from compiler import cost as C
from compiler.cost import goodput
from compiler.cost import links as LK
from compiler.cost.memory import predicted_peak_bytes
from compiler.hf_header import stack as hf_stack
from compiler.layout import placements as PL
from compiler.layout import rank_order as RO
from compiler import spec as S
from compiler import trace as T
from runtime.errors import REPLAN_CODE  # torch-free: the status launch.sh keeps
from compiler.codegen import escape as E
from compiler.model import residual_out
from compiler.report import plan as RP
from compiler.report.units import count
from runtime.layers import Bias, Repeat, ZeroCenteredRMSNorm

INIT_STD = 0.02

# Runtime modules whose functions the passes and the model call by name in emitted code.
RUNTIME_MODULES = ("runtime.attention", "runtime.collectives", "runtime.context_parallel", "runtime.moe",
                   "runtime.moe_nodes", "runtime.packed", "runtime.rebalance", "runtime.rotary")


@dataclass(frozen=True)
class Leaf:
    name: str
    ctor: str
    comment: str


@dataclass(frozen=True)
class SegmentCode:
    cls: str
    doc: str
    leaves: tuple
    forward: str


def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False,
                             finalize=E.finalize)
    env.filters.update(comment=E.comment, docstring=E.docstring, sh_word=E.sh_word, ident=E.ident)
    return env


def source_text(spec: S.Spec, span) -> str:
    """The .scale text of a span, cut to its first line and without a trailing comment, as a `#` comment."""
    lines = spec.source.split("\n")
    line = lines[span.line - 1]
    end = span.end_col - 1 if span.end_line == span.line else len(line)
    text = line[span.col - 1:end]
    if span.end_line != span.line and '"' not in text:
        text = text.split("#", 1)[0]
    return E.comment(text)


def source_name(spec: S.Spec) -> str:
    """The .scale file's name as generated files show it: its base name, undecodable bytes as `\\xNN`; each
    context escapes it further. Never the directory: output must not depend on where the compiler was run from."""
    return E.display(os.path.basename(spec.path)) or "input.scale"


def where(spec: S.Spec, span) -> str:
    return f"{source_name(spec)}:{span.line}"


def _ctor(mod: nn.Module) -> str:
    from compiler import ops
    op = ops.MODULES.get(type(mod))
    if op is None or op.render is None:
        raise NotImplementedError(f"no constructor for {type(mod).__name__}: add its record's render in compiler/ops/modules.py")
    return op.render(mod)


# FX prints some functions by their private torch names; the program uses the public ones.
_PUBLIC_NAMES = {"torch._C._nn.linear(": "F.linear(", "torch._C._nn.scaled_dot_product_attention(":
                 "F.scaled_dot_product_attention(", "torch._C._nn.gelu(": "F.gelu(", "torch.nn.functional.": "F."}

_DELETE = re.compile(r";  (?:\w+ = )+None$")


def forward_code(gm: fx.GraphModule, spec: S.Spec) -> str:
    """The graph's Python code as a method, with a provenance comment before each .scale layer's statements."""
    py = gm.graph.python_code(root_module="self")
    code = py.src
    for name, obj in py.globals.items():  # runtime functions read as `collectives.fn(...)`, `moe.fn(...)`
        module = getattr(obj, "__module__", "") or ""
        if module in RUNTIME_MODULES:
            code = re.sub(rf"(?<![.\w]){re.escape(name)}\b", f"{module.split('.')[1]}.{obj.__name__}", code)
    for private, public in _PUBLIC_NAMES.items():
        code = code.replace(private, public)
    # FX's `wrap(...)` registrations of the runtime's MoE functions are not code the program needs.
    lines = [ln for ln in code.strip("\n").splitlines()
             if ln.strip() and not ln.startswith("torch.fx._symbolic_trace.wrap(")]
    header, body = lines[0], [ln for ln in lines[1:] if ln.strip()]
    nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder",)]
    # One statement per node: FX codegen's contract for our graphs; checked, so a change in torch shows up here.
    if len(body) != len(nodes):
        raise AssertionError(f"FX emitted {len(body)} lines for {len(nodes)} nodes in {gm.__class__.__name__}")
    out = ["    " + header.replace(" : ", ": ")]
    last = None
    for node, line in zip(nodes, body):
        span = node.meta.get(T.SPAN)
        if span is not None and span != last:
            out.append(f"        # {E.comment(where(spec, span))}  {source_text(spec, span)}")
        last = span if span is not None else last
        notes = node.meta.get(T.COLLECTIVE)
        if isinstance(notes, tuple):  # a call that moves several things (the node dispatch): a line for each, above it
            out += [f"        # {_note_text(note)}" for note in notes]
        out.append("    " + _DELETE.sub("", line.rstrip()) + _collective_comment(node, spec))
    return E.code("\n".join(out))


def _collective_comment(node: fx.Node, spec: S.Spec) -> str:
    """`  # tp: forward all-reduce, backward identity; <reason> (<file>:<line>)` on a call that moves data."""
    note = node.meta.get(T.COLLECTIVE)
    if note is None:
        return ""
    span = node.meta.get(T.SPAN)
    src = f" ({where(spec, span)})" if span else ""
    if isinstance(note, tuple):  # each said on its own line above the call (forward_code)
        return "  # " + E.comment(f"the {len(note)} collectives above{src}")
    return "  # " + E.comment(_note_text(note) + src)


def _note_text(note) -> str:
    """`tp: forward all-reduce, backward identity; <reason>`: what one collective note says, escaped."""
    fwd = (note.forward or "identity").replace("_", "-")
    bwd = (note.backward or "identity").replace("_", "-")
    return E.comment(f"{note.axis}: forward {fwd}, backward {bwd}; {note.reason}")


def _segment(cls: str, gm: fx.GraphModule, spec: S.Spec) -> SegmentCode:
    leaves = []
    for name, mod in gm.named_children():
        if isinstance(mod, Repeat):
            ctor = f"Repeat({T.class_name(name)}() for _ in range({len(mod)}))"
        else:
            ctor = _ctor(mod)
        span = gm.meta[T.SPANS].get(name)
        comment = f"{where(spec, span)}  {source_text(spec, span)}" if span else ""
        leaves.append(Leaf(name, E.code(ctor), comment))
    if cls == "Model":
        doc = f"The whole model `{spec.model.name}`: token ids and targets in, the mean cross-entropy out."
    else:
        rep = gm.meta[T.REPEAT]
        doc = f"One block of the `repeat` at {where(spec, rep.span)}: the residual stream in and out."
    return SegmentCode(cls, doc, tuple(leaves), forward_code(gm, spec))


def data_path(spec: S.Spec, out_dir: str) -> str:
    """The token file as the program finds it: a relative path in the .scale file is relative to that file's
    directory; the program resolves it relative to its own directory (runtime.data.resolve), so it is written
    relative to the output directory. Absolute paths stay as written; nothing of the machine's layout is added."""
    return relative_path(spec, spec.train.data.path, out_dir)


def relative_path(spec: S.Spec, path: str, out_dir: str) -> str:
    """A file or directory named in the .scale file (relative to it: data, init, checkpoint_dir) as the program
    finds it (data_path)."""
    if not path or os.path.isabs(path):
        return path
    return os.path.relpath(os.path.join(os.path.dirname(spec.path), path), out_dir)


def offload_values(plan) -> dict:
    """runtime.config.Parallel's offload fields, written only where the plan offloads: the kind, and the fraction
    (optimizer) or the modules (activations) it reads."""
    if plan.offload == "none":
        return {}
    if plan.offload == "optimizer":
        return {"offload": "optimizer", "offload_fraction": plan.offload_fraction}
    if plan.offload == "activations" and plan.offload_modules:
        return {"offload": "activations", "offload_modules": tuple(plan.offload_modules)}
    return {"offload": plan.offload}


def config_values(spec: S.Spec, traced: T.Traced, plan, out_dir: str = ".", costs=None, ledger=None,
                  every: int | None = None) -> dict:
    """The runtime contract (runtime/config.py) as nested dicts: {"name": ..., "parallel": {...}, "optim": {...},
    "data": {...}, "checkpoint": {...}, "init": {...}}. The mesh, the plan settings and the batch split
    (micro_batch_size, batch_ranks) are `plan`'s (compile's: the file's plan with the policies' decisions).
    With `costs` (compiler.cost.Costs), the "memory" group too: the predicted peak the program prints against what
    it measures. Where the mesh writes a `placement`, "placement" too: the generator of the rank of each mesh
    coordinate (compiler/layout/rank_order.py `generator` of compiler/cost/links.py `resolved`; auto reads the
    ledger: `costs`' or `ledger`), which runtime.config.placed_ranks expands. `every`: the steps between
    checkpoints where `costs` is not given and the file writes `checkpoint_every = auto` (plan.json's)."""
    t = spec.train
    v = spec.value
    placed = LK.resolved(plan, spec.cluster, costs.ledger if costs is not None else ledger)

    moe = traced.model.has_moe()
    parallel = {
        "axes": plan.axes, "groups": plan.groups.contract(),
        # written only with a placement: its generator (axes' factors and strides), not every rank
        **({"placement": RO.generator(placed.rank_map)} if placed is not None else {}),
        "data_parallel": plan.data_parallel, "micro_batches": plan.micro_batches,
        "micro_batch_size": plan.micro_batch_size, "batch_ranks": plan.batch_ranks,
        "schedule": plan.schedule, "virtual_stages": plan.virtual_stages,
        "sequence_parallel": bool(plan.sequence_parallel),
        **({"recompute": plan.recompute} if plan.recompute != "none" else {}),  # written only when set
        **({"compile": True} if plan.compiles else {}),
        **({"grad_reduce": plan.grad_reduce} if plan.grad_reduce != "fp32" else {}),  # written only when set
        **({"fp32_residual": True} if plan.fp32_residual else {}),
        **({"fsdp_grad_sync": plan.fsdp_grad_sync} if plan.fsdp_grad_sync != "step" else {}),  # only when set
        **offload_values(plan),  # only when set
        "tp_shards": traced.shard_patterns(T.TP_SHARDS), "tp_partial_grads": traced.partial_grads(),
        **({"ep_shards": traced.shard_patterns(T.EP_SHARDS)} if moe else {}),  # only MoE programs carry these
        "tied_embedding": bool(spec.model.head.tied),
        **_dp_tuning(spec, plan),
    }
    return {
        "name": spec.model.name, "source": source_name(spec),
        "steps": t.steps, "seed": t.seed, "precision": t.precision,
        **({"fp8": t.fp8.recipe, "fp8_filter": t.fp8.filter} if t.fp8 else {}),  # written only when set
        "log_every": t.log_every, "timeout": t.timeout,
        **({"moe": True} if moe else {}),
        "sources": sources(spec, plan),
        "parallel": parallel,
        "optim": {"lr": t.optimizer.lr, "betas": tuple(t.optimizer.betas), "weight_decay": t.optimizer.weight_decay,
                  "eps": t.optimizer.eps, "lr_schedule": t.schedule.kind, "warmup": t.schedule.warmup,
                  "min_lr": t.schedule.min_lr, "grad_clip": t.grad_clip},
        "data": {"kind": t.data.kind, "path": data_path(spec, out_dir), "dtype": t.data.dtype,
                 "global_batch": plan.global_batch, "seq_len": plan.seq_len, "vocab": v(spec.model.embedding.vocab),
                 **({"document_separator": t.data.document_separator}
                    if t.data.document_separator is not None else {}),
                 **({"format": t.data.format} if t.data.format != "raw" else {})},  # a .npy: read by its header
        "checkpoint": {"dir": relative_path(spec, t.checkpoint_dir, out_dir),
                       # as written, when relative: runtime.startup.legacy_checkpoints looks for it from the cwd too
                       **({"as_written": t.checkpoint_dir}
                          if t.checkpoint_dir and not os.path.isabs(t.checkpoint_dir) else {}),
                       "every": every if every is not None else checkpoint_every(spec, plan, costs),
                       **({"asynchronous": True} if t.checkpoint_async else {})},
        **({"eval": eval_values(t)} if t.eval_every else {}),  # written only when the file evaluates
        "init": {**({"path": relative_path(spec, t.init_from, out_dir)} if t.init_from else {}),
                 # how the checkpoint's layers lie in the repeats, where a block holds several (Gemma)
                 **({"stack": layers} if t.init_from and (layers := hf_stack(spec.model, v)) else {}),
                 "std": INIT_STD, "residual_out": residual_out(traced.model),
                 "layers": sum(v(x.count) for x in spec.model.layers if isinstance(x, S.Repeat)) or 1},
        **({"memory": memory_values(spec, costs)} if costs is not None else {}),
        **({"speed": speed_values(spec, traced, costs, plan)} if costs is not None else {}),
        **({"predicted_joules_per_step": joules_values(spec, costs)} if costs is not None else {}),
        **({"resilience": resilience_values(spec.resilience)} if spec.resilience.written else {}),
    }


def checkpoint_every(spec: S.Spec, plan, costs) -> int:
    """runtime.config.Checkpoint.every: as written, or `auto`'s Young–Daly interval in steps
    (compiler/cost/goodput.py), which needs the plan's predicted step time (`costs`)."""
    if spec.train.checkpoint_every == "auto" and costs is None:
        raise ValueError("checkpoint_every = auto is resolved from the plan's predicted step time: pass `costs`")
    return goodput.checkpoint_steps(spec, plan, costs)


def resilience_values(r: S.Resilience) -> dict:
    """runtime.config.Resilience: straggler detection and what to do about one, as the resilience section writes
    them (only where it is written: the runtime's defaults are the section's)."""
    return {"detect": r.detect, "threshold": r.threshold, "window": r.window, "on_straggler": r.on_straggler,
            "exclude": r.exclude}


def eval_values(t: S.Train) -> dict:
    """runtime.config.Eval: the interval, the batches, and a token file's held-out share (none for synthetic data,
    whose held-out batches are a seed stream of their own)."""
    return {"every": t.eval_every, "batches": t.eval_batches,
            **({"split": t.eval_split} if t.eval_split and t.data.kind == "tokens" else {})}


# The settings whose lines the runtime names when an operation they cause hangs (runtime.faults.scale).
SOURCE_SETTINGS = ("data_parallel", "schedule", "grad_clip", "checkpoint_dir", "checkpoint_every")


def sources(spec: S.Spec, plan) -> tuple:
    """runtime.config.Config.sources: ((what, "file.scale:LINE", the line's text), ...) of the mesh section, each
    mesh axis and the settings of SOURCE_SETTINGS written: the watchdog names the line behind each blocking
    operation of the runtime (DDP's and FSDP's collectives, the pipeline's sends, the loss all-reduce, ...)."""
    out = [("mesh", where(spec, spec.mesh.span), "the mesh section")]
    out += [(k, where(spec, span), source_text(spec, span)) for k, span in plan.spans if k.startswith("axis ")]
    written = dict(plan.spans) | dict(spec.train.spans)
    out += [(k, where(spec, written[k]), f"{k} = {source_text(spec, written[k])}")
            for k in SOURCE_SETTINGS if k in written]
    return tuple(out)


def _dp_tuning(spec: S.Spec, plan) -> dict:
    """The data-parallel wrapper's knobs, written where the plan uses that wrapper: the gradient all-reduce's bucket
    (more than one batch rank without FSDP: DDP's, bf16's main-gradient buckets, pipeline stages' buckets after the
    schedule) and FSDP2's prefetch depth
    (fsdp, zero2 over dp > 1). Both are the Plan's (ddp_bucket_bytes, fsdp_prefetch): the bucket and the prefetch
    its step-time and memory models assumed."""
    if plan.shards_grads:
        return {"fsdp_prefetch": plan.fsdp_prefetch}
    if plan.batch_ranks > 1:
        return {"ddp_bucket_mb": plan.ddp_bucket_bytes / 2 ** 20}
    return {}


def speed_values(spec: S.Spec, traced: T.Traced, costs, plan) -> dict:
    """runtime.config.Speed: the model FLOPs of one step (compiler.cost), the peak of one device of the mesh's kind
    and, when the plan has a step-time prediction (compiler.cost.step_time), that time."""
    step_s = costs.step.step_time_s  # the estimate's prediction (cost.Estimate.step): made once per compile
    return {"flops_per_step": float(costs.flops_step_n), "peak_flops": float(spec.cluster.device.peak_tflops) * 1e12,
            "device": spec.cluster.device.kind, "predicted_step_s": float(f"{step_s:.4g}")}


def joules_values(spec: S.Spec, costs) -> tuple:
    """runtime.config.Config.predicted_joules_per_step: ((pp rank, joules one device draws in a step), ...) from the
    energy model (compiler/cost/energy.py; the device's own power, what NVML's counter measures: no host, network or
    PUE), to 4 significant digits, beside which runtime/energy.py logs what it measures."""
    from compiler.cost import energy
    got = energy.step(costs.step, spec.cluster, costs)
    return tuple((int(k.who.rsplit(" ", 1)[-1]) if k.who.startswith("pp rank") else 0, float(f"{k.joules:.4g}"))
                 for k in got.ranks)


def memory_values(spec: S.Spec, costs) -> dict:
    """runtime.config.Memory: the largest rank's predicted peak and one device's bytes."""
    return {"predicted_peak_bytes": int(predicted_peak_bytes(costs)),
            "device_bytes": int(spec.cluster.device.memory_gb * 1e9)}


# The nested groups of runtime.config.Config, in the order the program writes them.
CONFIG_GROUPS = {"parallel": "Parallel", "optim": "Optim", "data": "Data", "checkpoint": "Checkpoint", "eval": "Eval",
                 "init": "Init", "memory": "Memory", "speed": "Speed", "resilience": "Resilience"}


def _config_code(values: dict) -> list:
    """(key, Python expression) of CONFIG's top level: plain values, then each group as `train.Group(...)`."""
    out = [(k, E.py_literal(val)) for k, val in values.items() if k not in CONFIG_GROUPS and k != "sources"]
    if "sources" in values:  # one line per .scale line
        out.append(("sources", E.code("(\n" + "".join(f"        {E.py_literal(x)},\n" for x in values["sources"])
                                      + "    )")))
    for key, cls in CONFIG_GROUPS.items():
        if key not in values:
            continue
        inner = ",\n".join(f"        {k}={E.py_literal(val)}" for k, val in values[key].items())
        out.append((key, E.code(f"train.{cls}(\n{inner},\n    )")))
    return out


def _json_value(v):
    if isinstance(v, dict):
        return {k: _json_value(x) for k, x in v.items()}
    return [_json_value(x) for x in v] if isinstance(v, tuple) else v


def mesh_text(spec: S.Spec, plan) -> str:
    """The plan's axes on the Spec's cluster, in words: `dp=2 × tp=4 (1 node × 8 h100)`."""
    axes = " × ".join(f"{a}={n}" for a, n in plan.axes) or "one device"
    cl = spec.cluster
    n = cl.nodes
    return f"{axes} ({n} node{'s' if n != 1 else ''} × {cl.devices_per_node} {cl.device.kind})"


def _pipeline(spec: S.Spec, traced: T.Traced, stages: tuple, style: str = "loop") -> dict | None:
    """What the template needs for a Stage class, when the plan has pipeline stages (`stages`: the Plan's layout;
    the top level cut into its pieces by passes.pipeline_split; `style`: its stage layout's, where each runs)."""
    top = traced.top
    if T.PROLOGUE not in top.meta:
        return None
    if not stages:
        raise ValueError("a pipelined program needs its decided Plan (the stage layout): pass compile's plan")
    pro, epi, loss = top.meta[T.PROLOGUE], top.meta[T.EPILOGUE], top.meta[T.LOSS]

    def leaves(gm):
        return {n: Leaf(n, E.code(_ctor(m)), f"{where(spec, gm.meta[T.SPANS][n])}  "
                        f"{source_text(spec, gm.meta[T.SPANS][n])}" if n in gm.meta[T.SPANS] else "")
                for n, m in gm.named_children()}
    first, last = leaves(pro), leaves(epi)
    groups = [("self.is_first", [v for k, v in first.items() if k not in last]),
              ("self.is_first or self.is_last", [v for k, v in first.items() if k in last]),
              ("self.is_last", [v for k, v in last.items() if k not in first])]
    loss_lines = forward_code(loss, spec).split("\n")
    loss_code = "\n".join(["def loss_fn(logits, targets):",
                            '    """The loss of one micro-batch on the last stage, from its logits."""']
                           + [ln[4:] for ln in loss_lines[1:]])
    from compiler.trace import repeat_edges
    repeats = [{"name": name, "cls": T.class_name(name), "first": a, "end": b}
               for name, a, b in repeat_edges(traced, spec.value)]
    placed = ("stage s runs on pp rank s % pp" if style == "loop" else
              "pp rank r runs stages r and 2·pp-1-r (dualpipev's V: the first and the last on rank 0)")
    return {"stages": E.py_literal(stages), "placed": placed,
            "leaf_groups": [(E.code(c), ls) for c, ls in groups if ls],
            "repeats": repeats,
            "prologue": E.code(forward_code(pro, spec).replace("def forward(", "def prologue(", 1)),
            "epilogue": E.code(forward_code(epi, spec).replace("def forward(", "def epilogue(", 1)),
            "loss": E.code(loss_code)}


def program(spec: S.Spec, traced: T.Traced, costs: C.Costs, plan, out_dir: str = ".") -> str:
    segs = [_segment(cls, gm, spec) for cls, gm in traced.segments()]
    pipeline = _pipeline(spec, traced, plan.stages, plan.stage_layout.style)
    if pipeline:  # the Stage class replaces Model
        segs = [sg for sg in segs if sg.cls != "Model"]
    imports = sorted(({"Repeat"} if traced.blocks else set())
                     | ({"Bias"} if any(isinstance(m, Bias) for m in traced.model.modules()) else set())
                     | ({"ZeroCenteredRMSNorm"} if any(isinstance(m, ZeroCenteredRMSNorm)
                                                       for m in traced.model.modules()) else set()))
    code = "".join(sg.forward + "".join(leaf.ctor for leaf in sg.leaves) for sg in segs) + (
        pipeline["prologue"] + pipeline["epilogue"] + pipeline["loss"]
        + "".join(leaf.ctor for _, leaves in pipeline["leaf_groups"] for leaf in leaves) if pipeline else "")
    code = "\n".join(line.split("#", 1)[0] for line in code.split("\n"))  # not the provenance comments
    # a module is imported where the code calls it (`attention.fn(`), not where a node's name ends in its name
    modules = [m.split(".")[1] for m in RUNTIME_MODULES
               if re.search(rf"(?<![.\w]){m.split('.')[1]}\.", code)] + ["train"]
    return _env().get_template("program.py.j2").render(
        version=__version__, source=source_name(spec), name=spec.model.name, params_human=count(costs.params_n),
        mesh_text=mesh_text(spec, plan), data_parallel=plan.data_parallel, micro_batches=plan.micro_batches,
        runtime_imports=E.code(", ".join(imports or ["Repeat"])), segments=segs,
        runtime_modules=E.code(", ".join(modules)), pipeline=pipeline,
        config=_config_code(config_values(spec, traced, plan, out_dir, costs)))


def min_nodes(spec: S.Spec) -> int:
    """torchrun's `--nnodes` minimum: every node, or one fewer under `on_straggler = replan`, so that the attempt
    after a node is gone still forms (with one node fewer, after torchrun's last-call wait) and asks for a re-plan
    (runtime.leaving.shrunk) instead of waiting for the node until the rendezvous times out."""
    n = spec.cluster.nodes
    return n - 1 if n > 1 and spec.resilience.written and spec.resilience.on_straggler == "replan" else n


def launch_script(spec: S.Spec, plan) -> str:
    return _env().get_template("launch.sh.j2").render(
        version=__version__, source=source_name(spec), name=spec.model.name, world=plan.world_size,
        nodes=spec.cluster.nodes, min_nodes=min_nodes(spec), devices_per_node=spec.cluster.devices_per_node,
        mesh_text=mesh_text(spec, plan), restarts=int(spec.train.restarts), replan_code=REPLAN_CODE)


def batch_script(spec: S.Spec, plan) -> str:
    """launch.sbatch: the SLURM batch job of launch.sh's torchrun command, one task per node, the rendezvous at the
    allocation's first node under the job's id. GPUs are asked for per node unless the mesh's device is the cpu."""
    return _env().get_template("launch.sbatch.j2").render(
        version=__version__, source=source_name(spec), job_name=E.job_name(spec.model.name), world=plan.world_size,
        nodes=spec.cluster.nodes, devices_per_node=spec.cluster.devices_per_node, mesh_text=mesh_text(spec, plan),
        restarts=int(spec.train.restarts), gpus=spec.cluster.device.kind != "cpu", min_nodes=min_nodes(spec),
        replan_code=REPLAN_CODE)


def plan_json(spec: S.Spec, traced: T.Traced, costs: C.Costs, plan, out_dir: str = ".") -> str:
    """plan.json: the Plan itself (every setting and decision), then what it costs and places, and the run's
    contract."""
    # Where each parameter lies over each group (compiler/layout/placements.py: Replicate(), Shard(dim), a Partial(sum)
    # gradient), as plan.json has always written it: dp, ep and tp (cp, which shards a weight only inside FSDP2's
    # folded group, is the placements' but not this file's).
    params = [{"name": pl.name, "local_shape": [str(d) for d in pl.local_shape],
               "local_numel": spec.value(sympy.Mul(*pl.local_shape), plan),
               "placement": {a: str(p) for a, p in pl.groups if a != "cp"}}
              for pl in PL.placements(traced, plan)]
    doc = {
        "generator": f"scalec {__version__}",
        "source": source_name(spec),
        "name": spec.model.name,
        "mesh": {"axes": [{"name": a, "size": n} for a, n in plan.axes], "nodes": spec.cluster.nodes,
                 "devices_per_node": spec.cluster.devices_per_node, "world_size": plan.world_size,
                 "device": spec.cluster.device.kind, **RP.placement_json(spec, plan, costs.ledger)},
        "plan": plan.to_json(spec.cluster),
        "sizes": {k: str(v) for k, v in spec.model.sizes.items()},
        "values": _values(spec, plan),
        "cost": {"parameters": costs.params_n, "parameters_formula": str(costs.params),
                 "flops_per_step": costs.flops_step_n, "flops_per_step_formula": str(costs.flops_step),
                 "tokens_per_step": costs.tokens_step,
                 "model_state_bytes_per_rank": {"params": costs.model_state.params, "grads": costs.model_state.grads,
                                                "optimizer": costs.model_state.optimizer}},
        "ledger": [{"op": c.op, "axis": c.axis, "elements": str(c.elements), "dtype_bytes": c.dtype_bytes,
                    "per_step": str(c.per_step), "bytes_per_step": spec.value(c.bytes_per_step(), plan),
                    "direction": c.direction, "measured": c.measured,
                    "source": where(spec, c.span) if c.span else None, "reason": c.reason,
                    **({} if c.worst_bytes is None else {"worst_bytes_per_step": c.worst_bytes})}
                   for c in costs.ledger.entries],
        "parameters": params,
        "train": {k: _json_value(v) for k, v in config_values(
            spec, traced, plan, out_dir, ledger=costs.ledger, every=goodput.checkpoint_steps(spec, plan, costs)).items()
                  if k not in ("name", "source")},
    }
    return E.json_text(doc)


def _values(spec: S.Spec, plan) -> dict:
    """plan.json's "values": the number of every symbol its formulas use, as the file reads: the model's sizes, then
    the plan's axes, then the train section's and the experts' capacities."""
    model = {str(k): int(v) for k, v in spec.values.items() if str(k) in spec.model.sizes}
    rest = {str(k): int(v) for k, v in spec.values.items() if str(k) not in spec.model.sizes}
    return {**model, **{a: n for a, n in plan.axes}, **rest}


def emit(compiled, out_dir: str) -> list[str]:
    """Write the build directory of a compiled plan (compiler.pipeline.Compiled); return the paths written."""
    spec, traced, costs, plan = compiled.spec, compiled.traced, compiled.costs, compiled.plan
    os.makedirs(out_dir, exist_ok=True)
    files = {"program.py": program(spec, traced, costs, plan, out_dir),
             "plan.json": plan_json(spec, traced, costs, plan, out_dir), "launch.sh": launch_script(spec, plan),
             "launch.sbatch": batch_script(spec, plan)}
    written = []
    for name, text in files.items():
        path = os.path.join(out_dir, name)
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        written.append(path)
    for script in ("launch.sh", "launch.sbatch"):
        os.chmod(os.path.join(out_dir, script), 0o755)
    return written
