"""compiler/ops/ is the one place that knows operations: a record per op, read by the tracer, the FLOP, activation
and step-time models and the tensor-parallel policy. Held here three ways: no other module of the compiler's middle
names an op; an op without a record is an error at its node; and a new op is one record, with no other file
touched, for everything those readers need."""
from __future__ import annotations

import ast
import operator
from pathlib import Path

import pytest
import torch

from compiler import ops
from compiler.check import check_text
from compiler.pipeline import compile_spec

ROOT = Path(__file__).resolve().parents[1]

# Namespaces whose members are operations the programs run, and the members that are (None: every member).
OP_SPACES = {
    "torch.nn.functional": None, "runtime.collectives": None, "runtime.moe": None, "runtime.rotary": None,
    "operator": None, "runtime.layers": {"Bias"},
    "torch.nn": {"Linear", "LayerNorm", "RMSNorm", "Embedding"},
    "torch": {"tanh", "arange", "add", "mul", "sub", "unflatten", "transpose", "flatten", "sigmoid", "exp",
              "softmax", "matmul", "bmm"},
}

# Modules that may name operations, and why. Everything else in compiler/ reads compiler/ops/'s records.
MAY_NAME_OPS = {
    "compiler/ops/": "the records",
    "compiler/model.py": "the builder: the single-device model calls the ops the layers are made of",
    "compiler/layers/": "the layer kinds declare their leaves",
    "compiler/passes/": "the passes' policies recognise what they shard, and the passes insert the collectives they "
                        "name",
    "compiler/codegen/": "writes the import of runtime.layers.Bias where the program uses it",
    "compiler/cost/fp8.py": "torchao converts a block's nn.Linear modules by their type (runtime/fp8.py): the model "
                            "counts the same modules",
}
# FX's tuple indexing: how a graph takes the parts of a tuple result (naming them), not an op of the model.
STRUCTURE = {"operator.getitem"}


def _aliases(tree) -> dict:
    out = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            for a in n.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
            for a in n.names:
                out[a.asname or a.name] = f"{n.module}.{a.name}"
        elif isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and getattr(n.value.func, "id", None) == "lazy":
            if n.value.args and isinstance(n.value.args[0], ast.Constant):  # x = lazy("runtime.collectives")
                out.update({t.id: n.value.args[0].value for t in n.targets if isinstance(t, ast.Name)})
    return out


def _op_names(path: Path) -> set:
    """The operations a module names: attributes of an op namespace (`F.gelu`, `C.all_reduce_...`) and names
    imported from one (`from torch.nn.functional import gelu`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    aliases = _aliases(tree)

    def is_op(space: str, member: str) -> bool:
        return space in OP_SPACES and (OP_SPACES[space] is None or member in OP_SPACES[space])

    found = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in aliases:
            if is_op(aliases[n.value.id], n.attr):
                found.add(f"{aliases[n.value.id]}.{n.attr}")
        elif isinstance(n, ast.Name) and "." in aliases.get(n.id, ""):
            space, member = aliases[n.id].rsplit(".", 1)
            if is_op(space, member):
                found.add(aliases[n.id])
    return found - STRUCTURE


def test_only_the_op_records_name_operations():
    named = {str(p.relative_to(ROOT)): _op_names(p) for p in sorted((ROOT / "compiler").rglob("*.py"))}
    records = set().union(*(names for rel, names in named.items() if rel.startswith("compiler/ops/")))
    assert len(records) > 30  # the scan sees names (a broken scan would find none and pass)
    strays = {rel: sorted(names) for rel, names in named.items() if names
              and not any(rel == k or (k.endswith("/") and rel.startswith(k)) for k in MAY_NAME_OPS)}
    assert strays == {}, "these modules name operations: read compiler/ops/'s records instead (or say why here)"


def _tiny():
    text = (ROOT / "samples" / "tiny_gpt.scale").read_text()
    return compile_spec(check_text(text, "tiny.scale"))


def _with_sigmoid(traced):
    """The block's GELU replaced by torch.sigmoid (an op the tests take out of the records, or put back in their own
    form: a `moe`'s shared-expert gate has one)."""
    import torch.nn.functional as F
    block = next(iter(traced.blocks.values()))
    gelu = next(n for n in block.graph.nodes if n.target is F.gelu)
    gelu.target = torch.sigmoid
    block.recompile()
    return block


def test_an_op_without_a_record_is_an_error_at_its_node(monkeypatch):
    monkeypatch.delitem(ops.FUNCTIONS, torch.sigmoid)
    traced = _tiny().unsharded.copy()
    _with_sigmoid(traced)
    with pytest.raises(NotImplementedError, match=r"no record for sigmoid at node gelu: add one in compiler/ops/"):
        traced.annotate()


def test_a_new_op_is_one_record(monkeypatch):
    """torch.sigmoid in place of GELU, and one record for it (its backward reads its output, like ReLU's; a head or
    inner-width shard flows through it): the tracer gives it a shape and dtype, the activation model keeps its
    output, the FLOP model counts it as elementwise (0), and the tensor-parallel policy still finds the MLP's
    column -> row region through it. No other file changes."""
    from compiler.cost import activations as A
    from compiler.cost import flops as FL
    from compiler.passes.tensor_parallel import tp_policy
    compiled = _tiny()
    before = A.block_saved_bytes(next(iter(compiled.unsharded.blocks.values())), "fp32", "cpu")
    monkeypatch.setitem(ops.FUNCTIONS, torch.sigmoid, ops.Op("sigmoid", saved=lambda g, node, args: g.keep(node),
                                                               shard=True))
    traced = compiled.unsharded.copy()
    block = _with_sigmoid(traced)
    traced.annotate()
    node = next(n for n in block.graph.nodes if n.target is torch.sigmoid)
    up = node.args[0]
    assert node.meta["shape"] == up.meta["shape"] and node.meta["dtype"] == up.meta["dtype"]
    assert FL.graph_backward(block) == FL.graph_backward(next(iter(compiled.unsharded.blocks.values())))
    # GELU kept its input (the up projection's output, which the MLP's down linear does not keep); sigmoid keeps
    # its own output (what the down linear keeps as its input anyway): one tensor of the up projection's size less
    width = 4
    inner = A._numel(up.meta["shape"]) * width
    assert A.block_saved_bytes(block, "fp32", "cpu") == before - inner
    regions = tp_policy(block, compiled.spec.plan).regions
    assert [r.kind for r in regions] == ["attention", "mlp"], regions


def test_the_spellings_of_one_op_share_its_record():
    """`x + y`, `x.add(y)` and `torch.add(x, y)` trace to three targets: one record, so no rule can differ."""
    assert ops.FUNCTIONS[operator.add] is ops.FUNCTIONS["add"] is ops.FUNCTIONS[torch.add]
    assert ops.FUNCTIONS[torch.transpose] is ops.FUNCTIONS["transpose"]
