"""The mesh section's network: `fabric`, `topology`, `scale_up` and `placement`, read and checked.

The language's tables (compiler/language.py: FABRICS, TOPOLOGIES and the mesh's rows, their values converted by
compiler/binder.py: `to_ratios`, `to_placement`) say what may be written; this module builds the
compiler/layout/topology.py value the Cluster holds (a Slurm `topology.conf` read relative to the .scale file), and
turns every impossible shape (`Topology.problems`, compiler/layout/placement.py `order_problems`) into a diagnostic
at the argument at fault, and every setting that changes nothing on these machines into a warning. Torch-free.
"""
from __future__ import annotations

import os

from compiler import ast
from compiler.binder import Checker, span_of
from compiler.layout import topology as T
from compiler.language import TOPOLOGIES
from compiler.layout.placement import order_problems

CLASSES = {"fat_tree": T.FatTree, "rail_optimized": T.RailOptimized, "torus": T.Torus, "dragonfly": T.Dragonfly}
"""The `topology = KIND(...)` calls (compiler/language.py TOPOLOGIES, but `from`) and the values they build."""


# -- the topology ---------------------------------------------------------------------------------------------------


def network(c: Checker, s: dict, nodes: int, per_node: int):
    """The topology the mesh's settings `s` (bound by compiler/check.py) describe on `nodes` nodes of `per_node`
    devices, `scale_up` folded in; None when none is written. Every problem is reported; returns False after one."""
    written = s["_spans"]
    before = c.errors()
    scale_up = s["scale_up"] or 0
    if s["topology"] is None:
        if not scale_up:
            return None
        topology = T.FatTree(nodes_per_leaf=nodes, scale_up=scale_up)  # one non-blocking level: the two tiers
        call = None
    else:
        kind, args = s["topology"]
        call = written["topology"]
        call = call if isinstance(call, ast.Call) else ast.Call(call, (), call.span)
        topology = (_slurm(c, call, args, scale_up) if kind == "from" else
                    CLASSES[kind](**args, scale_up=scale_up))
        if topology is None:
            return False
    for p in topology.problems(nodes, per_node):
        at = (span_of(written["scale_up"]) if p.field == "scale_up" and "scale_up" in written else
              _arg_span(call, p.field) if call is not None else span_of(written.get("scale_up")))
        c.error("E0320", p.message, at, label="not a shape these machines have", help=p.hint)
    return False if c.errors() > before else topology


def _arg_span(call: ast.Call, field: str):
    """Where argument `field` of a topology call is written (by name or position), else the call."""
    order = list(TOPOLOGIES.get(call.func.id, {}))
    for i, arg in enumerate(call.args):
        if (arg.name.id if arg.name is not None else (order[i] if i < len(order) else None)) == field:
            return span_of(arg.value)
    return call.span


def _slurm(c: Checker, call: ast.Call, args: dict, scale_up: int):
    """The SwitchTree of the Slurm topology.conf `from(path)` names (relative to the .scale file), or None with
    every problem reported at the path, each naming the conf's line."""
    at = _arg_span(call, "path")
    base = os.path.dirname(c.file.path) if c.file is not None else ""
    path = os.path.join(base, args["path"])
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as err:
        why = "is not a text file" if isinstance(err, UnicodeDecodeError) else (err.strerror or str(err)).lower()
        c.error("E0321", f"topology file {args['path']}: {why}", at, label="cannot be read",
                help="give a Slurm topology.conf (topology/tree), relative to this .scale file")
        return None
    try:
        return T.parse_slurm(text, args["oversubscription"], scale_up)
    except T.SlurmError as err:
        for p in err.problems:
            where = p.field.removeprefix("line ") if p.field.startswith("line ") else ""
            c.error("E0321", f"{args['path']}{':' + where if where else ''}: {p.message}", at,
                    label=f"line {where} of the file" if where else "in the file", help=p.hint)
        return None


# -- the placement --------------------------------------------------------------------------------------------------


def placement_checks(c: Checker, expr, placement, axes: tuple) -> bool:
    """`order(...)` against the mesh's `axes`: an axis named twice (at its second mention), one the mesh lacks (at
    it), one left out (at the call). True when it fits."""
    if not isinstance(placement, tuple):
        return True
    problems = order_problems(axes, placement)
    spans = {}
    for arg in expr.args:
        spans.setdefault(arg.value.id, []).append(arg.value.span)
    known = [a for a, _ in axes]
    # order_problems lists the axes named twice, then those unknown, then one problem for every axis left out
    at = [spans[n][1] for n in dict.fromkeys(placement) if placement.count(n) > 1]
    at += [spans[n][0] for n in dict.fromkeys(placement) if n not in known]
    at += [expr.span] * (len(problems) - len(at))
    for p, span in zip(problems, at):
        c.error("E0322", p.message, span, label="not an order of the mesh's axes", help=p.hint)
    return not problems


# -- settings that change nothing on these machines -----------------------------------------------------------------


def no_effect(c: Checker, s: dict, cluster, axes: tuple, placement) -> None:
    """W0320: a fabric or a topology on one node (nothing crosses the network), a scale-up domain of one node's
    devices (the default). W0321: a placement where every one puts the ranks alike, or where every pair of ranks
    crosses the same link."""
    written, nodes, per_node = s["_spans"], cluster.nodes, cluster.devices_per_node
    for key in ("fabric", "topology"):
        if key in written and nodes == 1:
            c.warn("W0320", f"a {key} on a single node: no traffic crosses the network", span_of(written[key]),
                   label="has no effect", help=f"the {key} describes the links between nodes; remove it, or give "
                                               "the cluster's nodes")
    if "scale_up" in written and s["scale_up"] == per_node:
        c.warn("W0320", f"scale_up = {per_node} is a node's own devices, the default", span_of(written["scale_up"]),
               label="has no effect", help="scale_up is for an NVLink domain wider or narrower than a node (GB200 "
                                           "NVL72: 72 over nodes of 4); remove it")
    if placement is None or "placement" not in written:
        return
    moving = [a for a, n in axes if n > 1]
    one_domain = nodes == 1 and (cluster.topology is None or cluster.topology.scale_up_devices(per_node) >= per_node)
    torus = isinstance(cluster.topology, T.Torus)
    if len(moving) <= 1 and (placement != "auto" or not torus):
        c.warn("W0321", f"a placement of a mesh with {'one axis' if moving else 'no axis'} larger than 1: every "
               "order puts the ranks alike", span_of(written["placement"]), label="has no effect",
               help="placement orders several axes over the ranks; remove it")
    elif one_domain:
        c.warn("W0321", f"a placement on one node of {per_node} devices in one NVLink domain: every pair of ranks "
               "crosses the same link", span_of(written["placement"]), label="has no effect",
               help="placement matters where the machines have several tiers; remove it")
