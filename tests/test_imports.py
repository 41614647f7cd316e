"""Which compiler modules may import the runtime, and why (docs/internals.md, "How it works").

The compiler decides and the runtime executes. A compiler module imports runtime/ only where the program it emits
calls that runtime code, so that what is traced, costed and proved is the very code that runs:
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent

ALLOWED = {
    "compiler/model.py": "builds the model from runtime.layers (Repeat, Bias) and runtime.moe (Experts, routing): "
                         "the modules the generated program instantiates",
    "compiler/trace.py": "keeps the runtime's Repeat whole in the traced graph (the op records keep the other leaves)",
    "compiler/schedule.py": "re-exports runtime.schedule: the schedule the program executes is the one verified",
    "compiler/passes/tensor_parallel.py": "inserts calls to runtime.collectives into the graph",
    "compiler/passes/expert_parallel.py": "inserts runtime.moe's all-to-alls and shards its Experts",
    "compiler/passes/context_parallel.py": "inserts runtime.collectives' gathers and runtime.context_parallel's "
                                           "positions, rotation and attention into the graph",
    "compiler/ops.py": "one record per op the program calls, keyed by the runtime's leaves and autograd Functions "
                       "(collectives, MoE, rotary) themselves",
    "compiler/cost/activations.py": "recognises the runtime's Repeat in the traced graph: a block's saved tensors "
                                    "are its own graph's, under its recomputation",
    "compiler/export.py": "writes a checkpoint under the names runtime.hf reads back (one mapping, both ways)",
    "compiler/datasets.py": "`scalec data` writes its datasets with runtime.indexed, the reader the runtime uses "
                            "(one format, both ways)",
    "compiler/files.py": "reads a Megatron index's header with runtime.indexed, the reader the program uses "
                         "(torch-free, as `scalec check` requires)",
    "compiler/hf_header.py": "checks an init checkpoint's headers under the names the program reads it by "
                             "(runtime.hf_names, torch-free, as `scalec check` requires)",
    "compiler/codegen/": "writes the imports of runtime modules into program.py and recognises their leaves",
}


# What the language shares with the runtime, importing nothing, so that any compiler module, the checker included,
# may read it: runtime/choices.py, the names (axes, data parallelism, schedules, recomputation), and runtime/split.py,
# the held-out split of a token file (the checker sizes it as the program cuts it).
SHARED = ("runtime.choices", "runtime.split")


def _imports_runtime(path: Path) -> bool:
    """Any import of runtime but the shared names (SHARED), at the top, inside a function, or on first use
    (compiler.lazy)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "runtime" and a.name not in SHARED
                                                for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "runtime":
            if node.module in SHARED or (node.module == "runtime" and
                                         all(f"runtime.{a.name}" in SHARED for a in node.names)):
                continue
            return True
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy" and node.args  # lazy("runtime.x")
                and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).split(".")[0] == "runtime"):
            return True
    return False


def _allowed(rel: str) -> bool:
    return any(rel == k or (k.endswith("/") and rel.startswith(k)) for k in ALLOWED)


def test_only_the_allow_list_of_compiler_modules_imports_the_runtime():
    importing = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "compiler").rglob("*.py") if _imports_runtime(p))
    assert "compiler/trace.py" in importing  # the scan sees imports (a broken scan would find none and pass)
    assert [m for m in importing if not _allowed(m)] == [], (
        "these compiler modules import runtime/ but emit no call to it: move the code, or add them to ALLOWED "
        "with the reason")
    # nothing on the list is stale: each entry that exists still imports the runtime
    for key in ALLOWED:
        if (ROOT / key).is_file():
            assert key in importing, f"{key} no longer imports runtime/: drop it from ALLOWED"


def test_the_checker_and_the_rules_import_no_runtime():
    for rel in ("compiler/check.py", "compiler/binder.py", "compiler/rules/__init__.py", "compiler/rules/tensor_parallel.py",
                "compiler/rules/pipeline_split.py", "compiler/rules/expert_parallel.py", "compiler/plan.py",
                "compiler/codes.py", "compiler/layout/devices.py", "compiler/layout/groups.py",
                "compiler/layout/cluster.py", "compiler/cli.py", "compiler/report/__init__.py",
                "compiler/report/units.py", "compiler/report/commands.py", "compiler/report/plan.py"):
        assert not _imports_runtime(ROOT / rel), rel


def test_the_checker_loads_no_module_of_the_cost_model():
    """The front end reads the device figures and the groups from compiler/layout/, not through compiler.cost (whose
    modules import torch): importing compiler.check, or running the cli up to `check`, loads none of compiler.cost."""
    import subprocess
    import sys
    code = ("import sys, compiler.check, compiler.cli\n"
            "print(sorted(m for m in sys.modules if m == 'compiler.cost' or m.startswith('compiler.cost.')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_the_runtime_never_imports_the_compiler():
    for p in (ROOT / "runtime").rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            assert not any(n.split(".")[0] == "compiler" for n in names), p


@pytest.mark.parametrize("module", SHARED)
def test_the_shared_names_import_nothing(module):
    """runtime/choices.py and runtime/split.py are read by `scalec check` (no torch) and by the runtime (no
    compiler): they import nothing but __future__ and dataclasses."""
    tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text(encoding="utf-8"))
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert {getattr(n, "module", None) for n in imports} <= {"__future__", "dataclasses"}


def _compiler_imports(path: Path) -> set[str]:
    """The compiler modules `path` imports anywhere in it (top, inside a function, or through compiler.lazy), as
    dotted names: `from compiler import lower` gives compiler.lower, `from compiler.cost import x` compiler.cost."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy" and node.args
              and isinstance(node.args[0], ast.Constant)):
            out.add(str(node.args[0].value))
    return {m for m in out if m.split(".")[0] == "compiler"}


def test_the_cost_model_imports_no_pass():
    """The cost model reads what the passes left in the graphs (trace's meta keys) and the stage layout from the
    Plan; it decides nothing, so it needs no pass module (compiler/passes/ holds the policies and the surgery)."""
    cost = sorted((ROOT / "compiler" / "cost").rglob("*.py"))
    assert len(cost) > 3
    assert "compiler.passes.pipeline_split" in _compiler_imports(ROOT / "compiler" / "lower.py")  # the scan sees them
    for p in cost:
        bad = sorted(m for m in _compiler_imports(p) if m == "compiler.passes" or m.startswith("compiler.passes."))
        assert bad == [], f"{p.relative_to(ROOT)} imports {bad}"


def test_no_import_circle_among_the_driver_the_candidates_and_fit():
    """compiler/pipeline.py (compile), candidates.py (the search's plans) and fit.py (memory advice) lean on
    compiler/lower.py, not on each other in a circle: pipeline -> fit -> candidates -> lower."""
    names = ("pipeline", "candidates", "fit")
    edges = {a: {b for b in names if b != a and f"compiler.{b}" in _compiler_imports(ROOT / "compiler" / f"{a}.py")}
             for a in names}
    assert "fit" in edges["pipeline"] and "candidates" in edges["fit"]  # the scan sees the imports there are

    def reaches(start, goal, seen=()):
        return any(n == goal or (n not in seen and reaches(n, goal, (*seen, n))) for n in edges[start])
    assert not [a for a in names if reaches(a, a)], edges


def _module_names() -> dict:
    """compiler's modules: dotted name -> path (a package by its __init__.py)."""
    out = {}
    for p in (ROOT / "compiler").rglob("*.py"):
        name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def _edges(path: Path, modules: dict) -> set:
    """The compiler modules `path` imports when its code runs: at the top, inside functions and through
    compiler.lazy, but not under `if TYPE_CHECKING:` (annotations only). `from compiler.cost import flops` is an
    edge to compiler.cost.flops, `from compiler.cost import CostModel` to compiler.cost."""
    def module_of(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    out: set = set()

    class Scan(ast.NodeVisitor):
        def visit_If(self, node):
            if getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
                for x in node.orelse:
                    self.visit(x)
            else:
                self.generic_visit(node)

        def visit_Import(self, node):
            out.update(module_of(a.name) for a in node.names)

        def visit_ImportFrom(self, node):
            if node.level == 0 and node.module:
                out.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules
                           else module_of(node.module) for a in node.names)

        def visit_Call(self, node):
            if getattr(node.func, "id", None) == "lazy" and node.args and isinstance(node.args[0], ast.Constant):
                out.add(module_of(str(node.args[0].value)))
            self.generic_visit(node)

    Scan().visit(ast.parse(path.read_text(encoding="utf-8")))
    return {m for m in out if m}


def test_no_import_circle_in_the_compiler():
    """No compiler module reaches itself through the modules it imports, deferred imports (inside a function,
    compiler.lazy) included: a deferred import that closes a circle only hides it. The op table and the graph keys
    are below the tracer and the cost model (compiler/graph_meta.py), the rules below the passes."""
    modules = _module_names()
    graph = {m: _edges(p, modules) - {m} for m, p in modules.items()}
    assert "compiler.ops" in graph["compiler.trace"] and "compiler.trace" in graph["compiler.lower"]  # the scan sees

    circles, done = [], set()

    def walk(node, path):
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                circles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in done:
                walk(nxt, path + [nxt])
        done.add(node)

    for m in sorted(graph):
        if m not in done:
            walk(m, [m])
    assert circles == [], " ; ".join(" -> ".join(c) for c in circles[:5])
