"""Resolve and check a parsed .scale file into a Spec, collecting every problem before reporting any.

The grammar only knows structure; this module resolves the model, the mesh, the plan and the training settings
against the language's tables (compiler/language.py: which sections, settings, layer kinds and arguments exist and
what type each takes; the binder, compiler/binder.py, turns expressions into those types). Once they exist it runs
the rules of the plan, one module per pass they protect (compiler/rules/), the cross-setting lints
(compiler/lints.py), the checks of the files the settings name (compiler/file_checks.py) and of the mesh's network
(compiler/network_checks.py: its topology, a Slurm topology.conf, the placement). Each problem becomes
a Diagnostic pointing at the offending text, with a remedy.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

from compiler import ast
from compiler import layers as L
from compiler import fp8_checks, lints
from compiler import network_checks
from compiler import spec as S
from compiler.binder import Checker, bind_settings, end_span, span_of, spans_of
from compiler.diagnostics import Diagnostic, ScaleError, Span, did_you_mean
from compiler.file_checks import file_checks
from compiler.layout.cluster import Cluster
from compiler.layout import power as POWER
from compiler.language import (CAPACITY, DEVICES, KNOWN_AXES, LAYERS, MAX_COUNT, MAX_REPEAT, MAX_SEED, MESH_SETTINGS,
                               OVERRIDABLE, PLAN_SETTINGS, RESILIENCE_SETTINGS, SECTIONS, TRAIN_SETTINGS,
                               TRAIN_SIZE_NAMES, placement)
from compiler.layout import failures as FAIL
from compiler.parse import parse
from compiler.plan import Plan, compiles
from compiler.rules import check_plan
from compiler.symbols import size as size_symbol
from runtime import choices  # torch-free: the defaults the language shares with the runtime

# The language's tables, read as `check.X` by the tests that enumerate the language (tests/fuzz.py,
# tests/test_settings_reach_output.py, tests/test_plan.py): their home is compiler/language.py.
from compiler.binder import MISSING, Param  # noqa: E402,F401
from compiler.language import (DATASETS, FABRICS, INITS, INTERRUPTIONS, OFFLOADS, ON_STRAGGLER,  # noqa: E402,F401
                               OPTIMIZERS, SCHEDULES, STRAGGLERS, TOPOLOGIES, TP_LAYERS)


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
    c = Checker(file, source)
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
    end = end_span(file, source)
    for k in ("model", "mesh", "train"):
        if k not in sections:
            c.error("E0103", f"the file has no `{k}` section", end,
                    help=f"add `{k} {{ ... }}`; see samples/tiny_gpt.scale")
    model = _model(c, sections["model"]) if "model" in sections else None
    mesh = _mesh(c, sections["mesh"], cluster_only) if "mesh" in sections else None
    plan = _plan(c, sections.get("plan"), cluster_only)
    if "mesh" in sections:
        lints.device_figures(c, sections["mesh"])
    train, train_values = _train(c, sections["train"]) if "train" in sections else (None, {})
    if train is not None:
        lints.train_checks(c, train, train_values)
    resilience = _resilience(c, sections["resilience"]) if "resilience" in sections else S.Resilience()
    spec = None
    if model and mesh and plan and train and resilience:
        lints.bind_capacities(c, model, train)
        lints.windows_cover_the_sequence(c, model, train)
        spec = S.Spec(path=file.path, source=source, model=model, mesh=mesh.machines, cluster=mesh.cluster,
                      plan=_written_plan(c, mesh, plan, train), train=train, values=dict(c.values),
                      resilience=resilience)
        own = spec.plan
        if cluster_only:  # one device, the plan's defaults: what is left refuses every plan
            own = dataclasses.replace(own, axes=(("dp", 1),), micro_batches=1,
                                      schedule="1f1b", virtual_stages=1, sequence_parallel=False, layout=(),
                                      data_parallel="ddp")
        c.diags += check_plan(spec, own)  # the rules of each pass and of the mesh (compiler/rules/)
        reading = file_checks(c, model, train, train_values, imported_model)
        if reading is not None:  # what the program reads: the dtype a .npy header gives, its format
            data = dataclasses.replace(train.data, dtype=reading.dtype, format=reading.format, reading=reading)
            spec = dataclasses.replace(spec, train=dataclasses.replace(train, data=data))
        lints.no_effect_checks(c, spec, bool(mesh.axis_spans))
        fp8_checks.spec_checks(c, spec)  # precision = fp8: torchao, a device with FP8 matmuls
        lints.resilience_checks(c, spec)
    if any(d.severity == "error" for d in c.diags):
        raise ScaleError(c.diags, {file.path: source})  # warnings too: they may explain the errors
    if c.diags:
        spec = dataclasses.replace(spec, warnings=tuple(c.diags))
    return spec


# -- model --------------------------------------------------------------------------------------------------------


def _model(c: Checker, sec: ast.Section) -> S.Model | None:
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
    lints.positions_twice(c, layers)
    return S.Model(name=sec.name.id if sec.name else "model", sizes=dict(c.env), layers=tuple(layers),
                   span=sec.span)


def _define_size(c: Checker, st: ast.Assign) -> None:
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


def _layer(c: Checker, st, top: bool = True) -> Any:
    if isinstance(st, ast.Repeat):
        if not top:
            c.error("E0204", "`repeat` can only stand at the top level of the model", st.span,
                    help="blocks repeat whole: put residuals inside `repeat`, not `repeat` inside a block")
            return None
        count = c.as_size(st.count, "the repeat count")
        if count is not None and c.number(count) > MAX_REPEAT:
            c.error("E0120", f"{c.number(count)} repeats are more than this compiler plans for", span_of(st.count),
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


def _stray(c: Checker, st) -> bool:
    """Report a setting or axis written among layers; True if `st` is one."""
    if isinstance(st, ast.Assign):
        c.error("E0111", "sizes are defined at the top of the model, not inside a block", st.span,
                help=f"move `{st.key.id} = ...` out of the block")
        return True
    if isinstance(st, ast.Axis):
        c.error("E0111", "`axis` belongs in the `mesh` section", st.span)
        return True
    return False


def _model_structure(c: Checker, sec: ast.Section, layers: list) -> None:
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


# -- mesh, plan, train --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _MeshWritten:
    """The mesh section, checked: where it is written and the machines (the Spec's) and its axes (the Plan's)."""
    machines: S.Mesh
    cluster: Cluster
    axes: tuple
    axis_spans: dict
    placement: object = None
    """The Plan's `placement` as written (compiler/network_checks.py), None when not."""
    placement_span: Span | None = None

    @property
    def world_size(self) -> int:
        return self.cluster.world_size


def _mesh(c: Checker, sec: ast.Section, cluster_only: bool = False) -> _MeshWritten | None:
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
    s = bind_settings(c, sec, MESH_SETTINGS, "mesh", allowed_other=(ast.Axis,))
    if s is None:
        return None
    kind = s["device"]
    figures = DEVICES[kind]
    for key in OVERRIDABLE:
        if s[key] is not None and (s[key] <= 0 or (key.endswith("_efficiency") and s[key] > 1)):
            c.error("E0120", f"`{key}` must be positive" + (" and at most 1" if key.endswith("_efficiency") else ""),
                    span_of(s["_spans"][key]), help=f"or leave it out to use the figures of `{kind}`")
            return None
    device = S.Device(kind=kind, **{f.name: getattr(figures, f.name) if s.get(f.name) is None else s[f.name]
                                    for f in dataclasses.fields(figures)})
    power = _power(c, s, kind)
    if power is None:
        return None
    topology = network_checks.network(c, s, s["nodes"], s["devices_per_node"])  # False: refused, reported
    cluster = Cluster(s["nodes"], s["devices_per_node"], device, fabric=s["fabric"],
                      topology=None if topology is False else topology, power=power)
    written = s["_spans"].get("placement")
    mesh = _MeshWritten(S.Mesh(span=sec.span), cluster, tuple(axes), spans, s["placement"], span_of(written))
    if cluster_only and (not axes or math.prod(n for _, n in axes) != mesh.world_size):  # the search's to choose
        # an order(...) names the axes written, which the search replaces: only `auto` carries over
        network_checks.no_effect(c, s, cluster, (), None)
        if topology is False:
            return None
        return dataclasses.replace(mesh, axes=(("dp", mesh.world_size),), axis_spans={},
                                   placement="auto" if s["placement"] == "auto" else None)
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
                help=f"nodes × devices_per_node = {mesh.cluster.nodes} × {mesh.cluster.devices_per_node} = "
                     f"{mesh.world_size}; make the product of the axes equal it{folded}")
        return None
    if not network_checks.placement_checks(c, written, s["placement"], mesh.axes) or topology is False:
        return None
    network_checks.no_effect(c, s, cluster, mesh.axes, s["placement"])
    lints.tp_placement(c, mesh)
    return mesh



def _power(c: Checker, s: dict, kind: str):
    """The mesh's power, price and carbon figures over the device's defaults (compiler/layout/power.py), each in
    range: every figure positive, a PUE of at least 1, a device that draws no more waiting than working."""
    at = s["_spans"]
    for key in POWER.FIELDS:
        if s[key] == 0 and key != "network_w":  # to_float refuses a negative figure; a network of 0 W may be
            what = "a price" if key == "usd_per_gpu_hour" else "a power"
            c.error("E0120", f"`{key}` must be positive: {what} of {s[key]:g} prices the run at nothing",
                    span_of(at[key]),
                    help=f"or leave it out to use the figure of `{kind}` (compiler/layout/power.py, with its source)")
            return None
    if s["pue"] is not None and s["pue"] < 1:
        c.error("E0120", f"`pue = {s['pue']:g}`: a PUE is the facility's power over its IT equipment's, at least 1",
                span_of(at["pue"]), help="1.1 for a hyperscale data center, about 1.6 on average (Uptime 2023); "
                                         "leave it out for 1.1")
        return None
    grid = None
    if s["grid"] is not None:
        how, args = s["grid"]
        grid = ("region", args["name"]) if how == "region" else ("intensity", args["g_per_kwh"], args["region"])
        if how == "intensity" and not args["region"].strip():
            c.error("E0120", "a grid intensity needs the region it holds for", span_of(at["grid"]),
                    help='`grid = intensity(g_per_kwh = 120, region = "Quebec, 2024")`, or `grid = region("us")`')
            return None
    power = POWER.resolve(kind, {k: s[k] for k in POWER.FIELDS + ("pue",)}, grid)
    if not power.idle_w <= power.communicating_w <= power.active_w:
        key = next((k for k in ("idle_w", "communicating_w", "active_w") if s[k] is not None), "idle_w")
        c.error("E0120", f"the device draws {power.idle_w:g} W idle, {power.communicating_w:g} W communicating and "
                         f"{power.active_w:g} W computing: waiting cannot draw more than working",
                span_of(at[key]) if key in at else None,
                help="idle_w ≤ communicating_w ≤ active_w; write the three together")
        return None
    return power


def _plan(c: Checker, sec: ast.Section | None, cluster_only: bool = False) -> dict | None:
    """The plan section's settings, checked, each default filled in, with `spans` ((setting, Span), ...)."""
    s = bind_settings(c, sec, PLAN_SETTINGS, "plan")
    if s is None:
        return None
    if not cluster_only and s["schedule"] in choices.V_SHAPED:
        # two stages per rank, folded in a V: the schedule's own shape (written otherwise, E0616)
        if "virtual_stages" in s["_spans"] and s["virtual_stages"] != 2:
            c.error("E0616", f"dualpipev runs two stages per pp rank, not virtual_stages = {s['virtual_stages']}",
                    span_of(s["_spans"]["virtual_stages"]), label="the V holds stages r and 2·pp-1-r on rank r",
                    help="leave `virtual_stages` out (2 under dualpipev), or choose another schedule")
            return None
        s["virtual_stages"] = 2
    elif not cluster_only and s["virtual_stages"] > 1 and s["schedule"] != "interleaved-1f1b":
        c.error("E0604", f"virtual_stages = {s['virtual_stages']} needs the interleaved-1f1b schedule",
                span_of(s["_spans"]["virtual_stages"]),
                help='set `schedule = "interleaved-1f1b"`, or `virtual_stages = 1`')
        return None
    kind, args = s["offload"]
    fraction = args.get("fraction", 1.0)
    if kind == "optimizer" and not 0 <= fraction <= 1:
        c.error("E0120", f"an offload fraction of {fraction:g} is not a share between 0 and 1",
                span_of(lints.arg_of(s["_spans"]["offload"], "fraction", 0)), label="not in [0, 1]",
                help="the share of the optimizer's state kept on the host: 0.5 for half (not 50), 1 for all")
        return None
    spans = spans_of(s) + tuple((f"layout {i}", sp) for i, (_, _, sp) in enumerate(s["layout"]))
    # a new setting: its PLAN_SETTINGS row, its field; `offload`'s call is three fields (compiler.plan.Plan)
    settings = {k: s[k] for k in PLAN_SETTINGS if k != "offload"}
    return {**settings, "offload": kind, "offload_fraction": float(fraction),
            "offload_modules": tuple(args.get("modules", ())), "spans": spans}


def _written_plan(c: Checker, mesh: _MeshWritten, settings: dict, train: S.Train) -> Plan:
    """The Plan as the file writes it: the mesh's axes and machines, the plan section's settings (compile's
    default resolved by the device), the train section's batch and sequence, and where each was written."""
    spans = [(f"axis {a}", sp) for a, sp in mesh.axis_spans.items()] + [("mesh", mesh.machines.span)]
    spans += [("placement", mesh.placement_span)] if mesh.placement_span is not None else []
    spans += list(settings["spans"]) + list(train.spans)
    fields = {k: v for k, v in settings.items() if k != "spans"}
    fields["layout"] = tuple((a, b) for a, b, *_ in fields["layout"])
    fields["tp_layers"] = tuple(fields["tp_layers"])
    fields["compile"] = compiles(fields["compile"], mesh.cluster.device.kind)
    return Plan(axes=mesh.axes, placement=mesh.placement,
                global_batch=int(c.number(train.global_batch)), seq_len=int(c.number(train.seq_len)),
                spans=tuple(spans), **fields)


def _train(c: Checker, sec: ast.Section) -> tuple[S.Train | None, dict]:
    """The training settings, and the value expressions as written (to locate cross-check diagnostics)."""
    s = bind_settings(c, sec, TRAIN_SETTINGS, "train")
    if s is None:
        return None, {}
    opt_kind, opt = s["optimizer"]
    if opt is None:
        c.error("E0113", "`train` needs an optimizer with a learning rate", sec.kind.span,
                help="add `optimizer = adamw(lr = 3e-4)`")
        return None, {}
    at = span_of(s["_spans"]["optimizer"])
    if opt["lr"] <= 0:
        c.error("E0120", "the learning rate must be positive", at, help="e.g. `lr = 3e-4`")
    if not all(0 <= b < 1 for b in opt["betas"]):
        c.error("E0120", f"Adam's betas must lie in [0, 1), not {tuple(opt['betas'])}", at,
                help="the usual values are `betas = (0.9, 0.95)`")
    if s["seed"] > MAX_SEED:
        c.error("E0120", f"the seed must be at most {MAX_SEED}", span_of(s["_spans"]["seed"]))
    if any(d.code == "E0120" and d.span in (at, span_of(s["_spans"].get("seed"))) for d in c.diags):
        return None, {}
    for key in ("global_batch", "seq_len"):  # a literal becomes a named size, so formulas read in these words
        if not s[key].free_symbols:
            c.values[size_symbol(key)] = int(s[key])
            s[key] = size_symbol(key)
    steps, tokens = _length(c, s, sec)
    if steps is None:
        return None, {}
    sched_kind, sched = s["lr_schedule"]
    data_kind, data = s["data"]
    init_kind, init = s["init"]
    prec_kind, prec = s["precision"]  # fp8 computes in bf16: every bf16 rule holds for it (S.FP8)
    return S.Train(
        init_from=init["path"] if init_kind == "from" else "",
        global_batch=s["global_batch"], seq_len=s["seq_len"], steps=steps, tokens=tokens, seed=s["seed"],
        precision="bf16" if prec_kind == "fp8" else prec_kind,
        fp8=S.FP8(**prec) if prec_kind == "fp8" else None,
        optimizer=S.Optimizer(kind=opt_kind, lr=opt["lr"], betas=tuple(opt["betas"]),
                              weight_decay=opt["weight_decay"], eps=opt["eps"]),
        schedule=S.LRSchedule(kind=sched_kind, warmup=sched["warmup"], min_lr=sched.get("min_lr", 0.0)),
        grad_clip=s["grad_clip"], data=S.Data(kind=data_kind, **data), log_every=s["log_every"],
        checkpoint_dir=s["checkpoint_dir"], checkpoint_every=s["checkpoint_every"],
        checkpoint_async=s["checkpoint_async"],
        restarts=(3 if s["checkpoint_dir"] else 0) if s["restarts"] is None else s["restarts"], timeout=s["timeout"],
        eval_every=s["eval_every"], eval_batches=s["eval_batches"], eval_split=s["eval_split"],
        spans=spans_of(s)), s["_spans"]


def _length(c: Checker, s: dict, sec: ast.Section) -> tuple:
    """(steps, tokens as written or None) of the train section: `steps`, or `tokens` over a step's tokens rounded
    up; (None, None) where neither or both are written, or the tokens are not a whole step."""
    at = s["_spans"]
    if s["steps"] is None and s["tokens"] is None:
        c.error("E0113", "`train` needs the setting `steps` (or `tokens`)", sec.kind.span, label="`steps` missing",
                help="optimizer steps, `steps = 1000`; or the tokens to train on, `tokens = 15T`")
        return None, None
    if s["steps"] is not None and s["tokens"] is not None:
        c.error("E0120", "`steps` and `tokens` both say how long the run is", span_of(at["tokens"]),
                label="the second length", help=f"keep one: `steps` is at {span_of(at['steps'])}")
        return None, None
    if s["tokens"] is None:
        return s["steps"], None
    per = c.number(s["global_batch"] * s["seq_len"])
    if per.free_symbols or not per.is_positive:
        c.error("E0120", "`tokens` needs a batch of known size", span_of(at["tokens"]),
                help="write `global_batch` and `seq_len` as numbers or the model's sizes")
        return None, None
    tokens, per = int(s["tokens"]), int(per)
    steps = -(-tokens // per)
    if tokens < per or steps > MAX_COUNT:
        c.error("E0120", f"`tokens = {tokens:,}` is {'less than one step' if tokens < per else 'too many steps'} "
                         f"({per:,} tokens a step)", span_of(at["tokens"]),
                help=f"at most {MAX_COUNT:,} steps of {per:,} tokens" if tokens >= per else
                     f"one step is global_batch × seq_len = {per:,} tokens")
        return None, None
    return steps, tokens


def _resilience(c: Checker, sec: ast.Section) -> S.Resilience | None:
    """The resilience section: straggler detection and action (runtime.config.Resilience) and the failure model's
    figures, each in range (a threshold is a fraction of the fastest rank's speed; a rate, a bandwidth, positive)."""
    s = bind_settings(c, sec, RESILIENCE_SETTINGS, "resilience")
    if s is None:
        return None
    at = s["_spans"]
    (detect, found), (action, args), (kind, failures) = s["stragglers"], s["on_straggler"], s["interruptions"]
    ok = True
    if detect == "detect" and not 0 < found["threshold"] < 1:
        c.error("E0120", f"a straggler threshold of {found['threshold']:g} is not a fraction between 0 and 1",
                span_of(lints.arg_of(at["stragglers"], "threshold", 0)), label="not in (0, 1)",
                help="a rank scoring below it is named: 1.0 is as fast as the fastest rank, 0.7 NVIDIA's default "
                     "(30% slower)")
        ok = False
    written = [(k, s[k], at.get(k)) for k in ("storage_write_gbps", "storage_read_gbps") if s[k] is not None]
    # an interruption count, days, devices or rate; a default is positive, so a bad one is written: at its argument
    written += [(k, v, lints.arg_of(at.get("interruptions"), k, i)) for i, (k, v) in enumerate(failures.items())]
    for key, v, where in written:
        if v <= 0:
            c.error("E0120", f"`{key}` must be positive, not {v:g}", span_of(where), label="not positive",
                    help="a failure rate or a bandwidth of 0 says nothing: leave the setting out for the default")
            ok = False
    if not ok:
        return None
    if kind == "observed":
        rate = FAIL.rate_per_gpu_hour(failures["count"], failures["days"], failures["gpus"])
        source = (FAIL.LLAMA3_SOURCE if "interruptions" not in at else
                  f"{failures['count']:g} in {failures['days']:g} days on {failures['gpus']:,} devices, as written")
    else:
        rate, source = failures["rate"], "as written"
    return S.Resilience(detect=detect == "detect",
                        threshold=found.get("threshold", choices.STRAGGLER_THRESHOLD),
                        window=found.get("window", choices.STRAGGLER_WINDOW), on_straggler=action, exclude=args.get("exclude", "node"),
                        rate_per_gpu_hour=rate, rate_source=source, restart_s=s["restart"],
                        storage_write_gbps=s["storage_write_gbps"], storage_read_gbps=s["storage_read_gbps"],
                        written=True, spans=spans_of(s))


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

