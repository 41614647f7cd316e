"""The rules a plan must satisfy, gathered in one fixed order.

Each pass states what its plans need in a module of this package named after it: `requires(spec, plan) ->
list[Diagnostic]` in compiler/rules/tensor_parallel.py, pipeline_split.py, expert_parallel.py and
context_parallel.py, packed.py for packed documents and offload.py for `offload`. This module adds the
mesh-wide rules (the global batch over the batch ranks, the sequence over the learned positions) and runs them all.
The package imports no torch, by position: the passes themselves (compiler/passes/) import torch at the top, and
nothing here imports them (tests/test_imports.py holds it), so `scalec check` runs every rule without torch.

The settings are read from `plan` (a compiler.plan.Plan), never from the Spec's plan or mesh, so a candidate built
by `dataclasses.replace(plan, axes=...)` is checked exactly like the plan written in a file; the Spec supplies the
model. A rule points at the setting's text through `plan.span(key)`; a candidate has no spans, and its diagnostics
describe the plan in words instead (compiler.diagnostics.plan_error).
"""
from __future__ import annotations

from compiler import spec as S
from compiler.diagnostics import Diagnostic, plan_error
from compiler.rules import context_parallel, expert_parallel, offload, packed, pipeline_split, tensor_parallel


def mesh_requires(spec: S.Spec, plan) -> list[Diagnostic]:
    """Rules of the whole mesh: the batch splits evenly, the sequence fits the learned positions."""
    out: list[Diagnostic] = []
    dp, ep, m, gb = plan.size("dp"), plan.size("ep"), plan.micro_batches, plan.global_batch
    shards = plan.batch_ranks * m
    if gb % shards:
        ranks = f"dp = {dp} × ep = {ep}" if ep > 1 else f"dp = {dp}"
        out.append(plan_error(plan, "global_batch", "E0302", f"global batch {gb} does not divide into {ranks} × "
                              f"micro_batches = {m}", label=f"{gb} % {shards} == {gb % shards}",
                              help=f"use a multiple of {shards}, e.g. {(gb // shards + 1) * shards}", axis=None,
                              rule="mesh.batch"))
    pos = next((x for x in spec.model.layers if isinstance(x, S.Positional)), None)
    if pos is not None and plan.seq_len > (n := int(spec.value(pos.positions))):
        out.append(plan_error(plan, "seq_len", "E0205", f"sequences of {plan.seq_len} tokens need more than the {n} "
                              "learned positions", help="raise `positions` of `positional`, or shorten `seq_len`",
                              axis=None, rule="mesh.positions"))
    return out


# In this order: a file's diagnostics come out in it (tests/golden/diagnostics holds them).
RULES = (
    ("tensor_parallel", tensor_parallel.requires),
    ("pipeline_split", pipeline_split.requires),
    ("expert_parallel", expert_parallel.requires),
    ("context_parallel", context_parallel.requires),
    ("packed", packed.requires),
    ("offload", offload.requires),
    ("mesh", mesh_requires),
)


# The axes whose rules read no micro-batch count (READS): each of their refusals holds for a whole family.
PER_SHAPE_AXES = (tensor_parallel.AXIS, expert_parallel.AXIS, context_parallel.AXIS)


def per_shape(d: Diagnostic) -> bool:
    """Whether refusal `d` holds for every micro-batch count of its plan (it reads none: the rules of tp, ep, cp and
    packed documents, and pipeline_split's PER_SHAPE), by its structured fields, never its code."""
    return d.axis in PER_SHAPE_AXES or d.rule in pipeline_split.PER_SHAPE


def check_plan(spec: S.Spec, plan) -> list[Diagnostic]:
    """Every rule's diagnostics for `plan` over `spec`'s model; empty when the plan is legal."""
    out: list[Diagnostic] = []
    for _, rule in RULES:
        out += rule(spec, plan)
    return out


# What each rule's verdict reads of a plan (its messages may read more: the plan's description, the spans). A rule
# that passes one plan passes every plan that agrees on these; tests/test_rules.py holds `Checker` equal to
# `check_plan` over a search's whole space, so a rule that starts reading another setting must be named here.
READS = {
    "tensor_parallel": lambda p: (p.size("tp"), p.tp_layers, p.pad_vocab, p.sequence_parallel, p.seq_len,
                                  p.size("cp")),
    "pipeline_split": lambda p: (p.size("pp"), p.virtual_stages, p.schedule, p.recompute, p.compile,
                                 p.span("compile") is not None, p.micro_batches, p.layout),
    "expert_parallel": lambda p: (p.size("ep"), p.size("tp"), p.size("dp") > 1, p.sequence_parallel,
                                  p.data_parallel),
    "context_parallel": lambda p: (p.size("cp"), p.seq_len, p.context_parallel, p.size("pp"), p.size("tp"), p.tp_layers,
                                   p.size("ep"), p.data_parallel, p.size("dp") > 1, p.compile,
                                   p.span("compile") is not None),
    "packed": lambda p: (p.size("ep"), p.size("cp"), p.context_parallel, p.compile,
                         p.span("compile") is not None),
    "offload": offload.reads,
    "mesh": lambda p: (p.batch_ranks * p.micro_batches, p.global_batch, p.seq_len),
}


def reads_all(p) -> tuple:
    """`READS[name](p)` of every rule, in RULES' order, computed at once: the axis sizes and the compile span read
    once, not once per rule (a search checks about a hundred thousand candidates, and the seven keys, each reading
    the sizes again, were a tenth of the 175B search). tests/test_rules.py holds it equal to READS."""
    tp = pp = ep = cp = dp = 1
    for a, n in p.axes:
        if a == "tp":
            tp = n
        elif a == "pp":
            pp = n
        elif a == "ep":
            ep = n
        elif a == "cp":
            cp = n
        elif a == "dp":
            dp = n
    written = p.span("compile") is not None
    sharded, compiled, sp, variant = dp > 1, p.compile, p.sequence_parallel, p.context_parallel
    return (("tensor_parallel", (tp, p.tp_layers, p.pad_vocab, sp, p.seq_len, cp)),
            _pipeline_key(p, pp, written),
            ("expert_parallel", (ep, tp, sharded, sp, p.data_parallel)),
            ("context_parallel", (cp, p.seq_len, variant, pp, tp, p.tp_layers, ep, p.data_parallel, sharded,
                                  compiled, written)),
            ("packed", (ep, cp, variant, compiled, written)),
            ("offload", (p.offload, p.data_parallel, sharded, p.recompute, compiled, written)),
            _mesh_key(p))


MICRO_BATCH_READERS = ("pipeline_split", "mesh")
"""The rules whose verdict reads the micro-batch count (READS): of two plans that differ in it alone, what every
other rule says of one it says of the other (`Checker.passes_in_micro_batches`)."""


def _pipeline_key(p, pp: int, written: bool) -> tuple:
    return ("pipeline_split", (pp, p.virtual_stages, p.schedule, p.recompute, p.compile, written, p.micro_batches,
                               p.layout))


def _mesh_key(p) -> tuple:
    return ("mesh", (p.batch_ranks * p.micro_batches, p.global_batch, p.seq_len))


# The rules whose diagnostics read no more of a plan than READS and its spans, but for the message's words naming
# the plan (a candidate's `plan.describe()`): code, brief, key, label and help, axis and rule are the same for every
# plan that agrees on those (pipeline_split: pp, the virtual stages, the schedule, the micro-batches, the layout and
# the model's blocks). A search, which groups refusals by their brief and prints no message, is given a refusal of
# theirs again (`Checker(plan, reuse=True)`); tests/test_rules.py holds the fields equal over a search's space.
REUSABLE = frozenset({"pipeline_split"})


class Checker:
    """`check_plan` over one spec's model for many plans, remembering which rule passed which settings (`READS`):
    a search checks tens of thousands of candidates that differ in a few settings, and each rule runs again only
    for settings it has not passed. A refusal is recomputed, so its diagnostics (which describe the plan) are
    exactly `check_plan`'s, unless the caller asks for `reuse`: then a REUSABLE rule's refusal is the one it gave a
    plan of the same settings and spans, whose message may name that other plan (a search refused the same few
    micro-batch counts of each pipeline depth tens of thousands of times, describing each plan in words)."""

    def __init__(self, spec: S.Spec):
        self.spec = spec
        self._passed: set = set()
        self._refusals: dict = {}  # (REUSABLE rule's key, id of the plan's spans) -> (those spans, its diagnostics)

    def __call__(self, plan, reuse: bool = False) -> list[Diagnostic]:
        out: list[Diagnostic] = []
        for (name, rule), key in zip(RULES, reads_all(plan)):
            if key in self._passed:
                continue
            if reuse and name in REUSABLE:
                at = (key, id(plan.spans))
                got = self._refusals.get(at)
                if got is not None and got[0] is plan.spans:
                    out += got[1]
                    continue
                got = rule(self.spec, plan)
                if got:
                    self._refusals[at] = (plan.spans, got)
            else:
                got = rule(self.spec, plan)
            if not got:
                self._passed.add(key)
            out += got
        return out

    def passes_in_micro_batches(self, plan) -> bool:
        """Whether `plan` is legal, given that a plan differing from it in the micro-batch count alone passed every
        rule: where the rules that read that count (MICRO_BATCH_READERS) have each passed `plan`'s settings before,
        without running any (a search asks this of every micro-batch count of a group: tens of thousands). False
        means only "not known": call the Checker."""
        return (_pipeline_key(plan, plan.size("pp"), plan.span("compile") is not None) in self._passed
                and _mesh_key(plan) in self._passed)
