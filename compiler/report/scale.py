"""A Plan printed as .scale text: its mesh and plan sections rendered from its fields, in a file whose other sections
(the model, train) are copied from the source as written. `scalec search -o BEST.scale` writes its winner so.

Why a printer and not edits of the user's text: the plan the search decided is a value (compiler/plan.py's Plan);
the file that carries it is rendered from that value, one setting per field, so that what is written is what was
costed, whatever the source's plan section said (or whether it had one). Only what the Plan does not carry is copied:
the model and train sections, the comments between sections, and the mesh's device and its figures (`device`,
`memory_gb`, ...: the cluster, which the search does not choose), each statement as written.

Deterministic: the same plan and source give the same bytes. A setting at its default is left out, except the ones
a reader looks for first (data_parallel, micro_batches, recompute), which are always written.
"""
from __future__ import annotations

from compiler import ast as A
from compiler.plan import placement_text

CLUSTER = ("nodes", "devices_per_node")  # the mesh settings printed from the Cluster; the mesh's others are the
                                         # device's and the network's, copied as written, but `placement`, the Plan's


def mesh_section(plan, cluster, device: list | tuple = ()) -> str:
    """`mesh { ... }`: the plan's axes outermost first, the cluster's nodes and devices per node
    (compiler/layout/cluster.py), then `device`, the device's statements as written, one a line, then the plan's
    `placement` where it has one (a searched mesh's plan has none: the file's order names the file's axes)."""
    lines = [f"axis {a} = {n}" for a, n in plan.axes]
    lines += [f"nodes = {cluster.nodes}", f"devices_per_node = {cluster.devices_per_node}", *device]
    placement = getattr(plan, "placement", None)
    if placement is not None:
        lines.append("placement = " + placement_text(placement))
    return "mesh {\n" + "".join(f"  {line}\n" for line in lines) + "}"


def plan_settings(plan, device_kind: str) -> list:
    """The plan section's statements of `plan`, in the order a reader takes them: how dp holds state and the
    micro-batches, the pipeline, tensor parallelism, recomputation, then the precision and FSDP2 settings.
    `device_kind` gives `compile`'s default (on on GPUs, off on cpu): it is written only where the plan differs and
    the file would mean it (a zero-bubble pipeline never compiles, so `compile = true` there is left out)."""
    from compiler.language import TP_LAYERS  # tp_layers when the plan section does not name them
    from compiler.plan import compiles
    out = [f"data_parallel = {plan.data_parallel}", f"micro_batches = {plan.micro_batches}"]
    if plan.size("pp") > 1:
        out.append(f'schedule = "{plan.schedule}"')
        if plan.virtual_stages > 1:
            out.append(f"virtual_stages = {plan.virtual_stages}")
        if plan.layout:
            out.append(f"layout = ({', '.join(f'({a}, {b})' for a, b in plan.layout)})")
    if plan.size("tp") > 1:
        out.append(f"sequence_parallel = {_bool(plan.sequence_parallel)}")
    if plan.size("cp") > 1:
        out.append(f"context_parallel = {plan.context_parallel}")
    if tuple(plan.tp_layers) != TP_LAYERS:
        out.append(f"tp_layers = ({', '.join(plan.tp_layers)})")
    if plan.pad_vocab:
        out.append("pad_vocab = true")
    out.append(f"recompute = {plan.recompute}")
    if plan.offload != "none":
        out.append(f"offload = {offload_setting(plan)}")
    if plan.compile != compiles(None, device_kind) and plan.compiles == plan.compile:
        out.append(f"compile = {_bool(plan.compile)}")
    if plan.grad_reduce != "fp32":
        out.append(f"grad_reduce = {plan.grad_reduce}")
    if plan.fp32_residual:
        out.append("fp32_residual = true")
    if plan.syncs_each_micro_batch:
        out.append("fsdp_grad_sync = micro_batch")
    return out


def offload_setting(plan) -> str:
    """A plan's offload as the plan section writes it: `optimizer(fraction = 0.5)`, `params`,
    `activations(modules = [attention, mlp])`."""
    if plan.offload == "optimizer":
        return f"optimizer(fraction = {plan.offload_fraction:g})"
    if plan.offload == "activations" and plan.offload_modules:
        return f"activations(modules = [{', '.join(plan.offload_modules)}])"
    return plan.offload


def plan_section(plan, device_kind: str) -> str:
    """`plan { ... }`: `plan_settings`, one a line."""
    return "plan {\n" + "".join(f"  {s}\n" for s in plan_settings(plan, device_kind)) + "}"


def scale_file(plan, cluster, source: str, tree: A.File, header: str = "") -> str:
    """`header`, then `source` (parsed as `tree`; a checked file, so it has a mesh section) section by section: the
    mesh and plan sections printed from `plan` on `cluster` (compiler/layout/cluster.py: its nodes, devices per
    node and device kind), every other section and the text between sections as written.
    Without a plan section in the source, the plan's comes after the mesh, a blank line between."""
    device_kind = cluster.device.kind
    at = _Offsets(source)
    has_plan = any(sec.kind.id == "plan" for sec in tree.sections)
    out, pos = [header], 0
    for sec in tree.sections:
        start, end = at.span(sec.span)
        out.append(source[pos:start])
        if sec.kind.id == "mesh":
            device = [source[slice(*at.span(st.span))] for st in sec.body
                      if isinstance(st, A.Assign) and st.key.id not in (*CLUSTER, "placement")]
            out.append(mesh_section(plan, cluster, device))
            if not has_plan:
                out.append("\n\n" + plan_section(plan, device_kind))
        elif sec.kind.id == "plan":
            out.append(plan_section(plan, device_kind))
        else:
            out.append(source[start:end])
        pos = end
    out.append(source[pos:])
    return "".join(out)


def _bool(value: bool) -> str:
    return "true" if value else "false"


class _Offsets:
    """Offsets into a source of the 1-based (line, column) positions its spans give (lines end at each "\\n")."""

    def __init__(self, source: str):
        self.starts = [0]
        for line in source.split("\n"):
            self.starts.append(self.starts[-1] + len(line) + 1)

    def span(self, span) -> tuple:
        return (self.starts[span.line - 1] + span.col - 1, self.starts[span.end_line - 1] + span.end_col - 1)


def offload_setting(plan) -> str:
    """`offload`'s value as the plan section writes it: `optimizer(fraction = 0.5)`, `params`, `activations` or
    `activations(modules = (attention, mlp))`."""
    if plan.offload == "optimizer":
        return f"optimizer(fraction = {plan.offload_fraction!r})"
    if plan.offload == "activations" and plan.offload_modules:
        return f"activations(modules = ({', '.join(plan.offload_modules)}))"
    return plan.offload
