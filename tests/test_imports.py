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
    "compiler/model.py": "builds the model's frame from runtime.layers (Repeat, Bias) and runtime.packed: the modules "
                         "and calls the generated program runs",
    "compiler/layers/": "each kind's builder (inside `build`, the module torch-free for the checker) builds its layer "
                        "from the runtime's modules and calls (runtime.layers, runtime.moe's Experts and routing, "
                        "runtime.attention, runtime.rotary, runtime.packed): the code the generated program runs",
    "compiler/trace.py": "keeps the runtime's Repeat whole in the traced graph (the op records keep the other leaves)",
    "compiler/schedule.py": "re-exports runtime.schedule: the schedule the program executes is the one verified",
    "compiler/passes/tensor_parallel.py": "inserts calls to runtime.collectives into the graph",
    "compiler/passes/expert_parallel.py": "inserts runtime.moe's all-to-alls and shards its Experts",
    "compiler/passes/context_parallel.py": "inserts runtime.collectives' gathers and runtime.context_parallel's "
                                           "positions, rotation and attention into the graph",
    "compiler/ops/": "one record per op the program calls, keyed by the runtime's leaves and autograd Functions "
                       "(collectives, MoE, rotary) themselves",
    "compiler/cost/activations.py": "recognises the runtime's Repeat in the traced graph: a block's saved tensors "
                                    "are its own graph's, under its recomputation",
    "compiler/cost/rebalance.py": "prices expert re-placement with the placement runtime.eplb makes (its own "
                                  "functions, torch-free): the plan's what-if is the runtime's placement",
    "compiler/cost/offload.py": "prices the optimizer's host share as runtime.offload.HostAdamW takes it, with its "
                                "own functions (runtime.precision.partition_sizes, runtime.offload.host_prefix), and "
                                "finds the runtime's Repeat in the traced graph (the parameters' order)",
    "compiler/export.py": "writes a checkpoint under the names runtime.hf reads back (one mapping, both ways)",
    "compiler/datasets.py": "`scalec data` writes its datasets with runtime.indexed, the reader the runtime uses "
                            "(one format, both ways)",
    "compiler/files.py": "reads a Megatron index's header with runtime.indexed, the reader the program uses "
                         "(torch-free, as `scalec check` requires)",
    "compiler/hf_header.py": "checks an init checkpoint's headers under the names the program reads it by "
                             "(runtime.hf_names, torch-free, as `scalec check` requires)",
    "compiler/run_command.py": "reads the exit status the program's workers end with to ask for a re-plan "
                                "(runtime.errors.REPLAN_CODE): one constant, both sides",
    "compiler/codegen/": "writes the imports of runtime modules into program.py and recognises their leaves",
}


# What the language shares with the runtime, importing nothing, so that any compiler module, the checker included,
# may read it: runtime/choices.py, the names (axes, data parallelism, schedules, recomputation), and runtime/split.py,
# the held-out split of a token file (the checker sizes it as the program cuts it), and runtime/schedule.py, the
# pipeline schedules' action lists and stage layout (which pp rank holds which stage: dualpipev's V puts the first and
# the last on one rank), which the plan, the stage cut and the proof read as the program places its stages.
SHARED = ("runtime.choices", "runtime.split", "runtime.schedule")


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
    for rel in ("compiler/check.py", "compiler/language.py", "compiler/lints.py", "compiler/file_checks.py",
                "compiler/binder.py", "compiler/rules/__init__.py", "compiler/rules/tensor_parallel.py",
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
    """runtime/choices.py, runtime/split.py and runtime/schedule.py are read by `scalec check` (no torch) and by the
    runtime (no compiler): they import nothing but __future__, dataclasses, typing and each other."""
    tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text(encoding="utf-8"))
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert {getattr(n, "module", None) for n in imports} <= {"__future__", "dataclasses", "typing", *SHARED}


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


# -- the import graph of compiler/ and runtime/ as it stands when a module is loaded ---------------------------------

def _all_modules() -> dict:
    """compiler's and runtime's modules: dotted name -> path (a package by its __init__.py)."""
    out = {}
    for top in ("compiler", "runtime"):
        for p in (ROOT / top).rglob("*.py"):
            out[".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")] = p
    return out


def _all_edges(name: str, path: Path, modules: dict) -> set:
    """The modules of `modules` that `name` imports anywhere: at module level, under `if TYPE_CHECKING:` (a circle
    for the type checker and the reader), inside functions (deferred: a deferred import that closes a circle only
    hides it) and through compiler.lazy. `from compiler.search import report` is an edge to compiler.search.report,
    `from compiler.search.prune import Search` one to compiler.search.prune."""
    def module_of(dotted: str) -> str:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set = set()
    for st in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(st, ast.Import):
            out.update(module_of(a.name) for a in st.names)
        elif isinstance(st, ast.ImportFrom):
            base = st.module or ""
            if st.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - st.level + 1] + ([base] if base else []))
            out.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else module_of(base) for a in st.names)
        elif (isinstance(st, ast.Call) and getattr(st.func, "id", None) == "lazy" and st.args
              and isinstance(st.args[0], ast.Constant)):
            out.add(module_of(str(st.args[0].value)))
    return {m for m in out if m and m != name}


# Circles being broken elsewhere, each to be deleted here when its fix lands (the list should be empty):
KNOWN_CIRCLES: set = set()


def _circles(graph: dict) -> list:
    """Every strongly connected set of two or more modules (Tarjan), as sorted lists."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_no_import_circle_in_the_compiler_and_the_runtime():
    """No module of compiler/ or runtime/ reaches itself through its imports (at the top, under `if
    TYPE_CHECKING:`, deferred inside functions, through compiler.lazy): each package is a stack of layers, the
    lower never importing the higher. search/result.py holds what prune.py returns and report.py words, below
    both."""
    modules = _all_modules()
    graph = {m: _all_edges(m, p, modules) for m, p in modules.items()}
    assert "compiler.search.result" in graph["compiler.search.report"]  # the scan sees TYPE_CHECKING imports
    assert "runtime.recompute" in graph["runtime.layers"]  # top-level ones
    circles = _circles(graph)
    stale = [set(k) for k in KNOWN_CIRCLES if sorted(k) not in circles]
    assert stale == [], f"these circles are gone: delete them from KNOWN_CIRCLES: {stale}"
    new = [c for c in circles if frozenset(c) not in KNOWN_CIRCLES]
    assert new == [], " ; ".join(" <-> ".join(c) for c in new)


def test_the_circle_scan_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


# -- private names stay in their module ----------------------------------------------------------------------------

# Private names read across modules in code this branch may not edit (compiler/cost/, runtime/), each to be made
# public by its owner; the list only shrinks.
KNOWN_PRIVATE = {
    ("compiler/cost/formulas.py", "compiler.cost.activations", "_numel"),
    ("runtime/context_parallel.py", "runtime.collectives", "_count"),
    ("runtime/context_parallel.py", "runtime.collectives", "_group"),
    ("runtime/context_parallel.py", "runtime.collectives", "_F"),
    ("runtime/context_parallel.py", "runtime.collectives", "_name"),
    ("runtime/moe.py", "runtime.collectives", "_count"),
    ("runtime/moe.py", "runtime.collectives", "_F"),
    ("runtime/moe.py", "runtime.collectives", "_name"),
    ("runtime/pipeline.py", "runtime.collectives", "_count"),
    ("runtime/tensor_parallel.py", "runtime.collectives", "_all_reduce"),
    ("runtime/tensor_parallel.py", "runtime.collectives", "_group"),
}


def _private_reads(path: Path, modules: dict, text: str | None = None) -> set:
    """(path, module, name) for each private name (`_x`, not `__x__`) of another module of compiler/ or runtime/
    that `path` imports (`from compiler.binder import _x`) or reads off the module (`B._x` after
    `from compiler import binder as B`, `import compiler.binder as B` or `B = lazy("compiler.binder")`). `text`:
    read in place of the file's."""
    rel = str(path.relative_to(ROOT))
    tree = ast.parse(path.read_text(encoding="utf-8") if text is None else text)
    private = lambda n: n.startswith("_") and not n.endswith("__")  # noqa: E731
    aliases, out = {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in (
                "compiler", "runtime"):
            for a in node.names:
                if f"{node.module}.{a.name}" in modules:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                elif private(a.name):
                    out.add((rel, node.module, a.name))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in modules and a.asname:
                    aliases[a.asname] = a.name
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
              and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "lazy"
              and node.value.args and isinstance(node.value.args[0], ast.Constant)):  # X = lazy("compiler.x")
            aliases[node.targets[0].id] = str(node.value.args[0].value)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and private(node.attr)):
            out.add((rel, aliases[node.value.id], node.attr))
    return out


def test_no_module_reads_another_modules_private_names():
    """A module's `_name` is its own: what another module needs is public API (the binder's Checker, to_size,
    span_of, ...; the search's Search; the passes' insert_call), so that a module can change its private helpers
    without breaking another."""
    modules = _all_modules()
    found = set()
    for p in modules.values():
        found |= _private_reads(p, modules)
    assert ("runtime/moe.py", "runtime.collectives", "_count") in found  # the scan sees module attributes
    assert found - KNOWN_PRIVATE == set(), sorted(found - KNOWN_PRIVATE)
    assert KNOWN_PRIVATE - found == set(), f"made public: delete from KNOWN_PRIVATE: {sorted(KNOWN_PRIVATE - found)}"


def test_the_private_scan_sees_each_way_of_reading_a_name():
    text = ("from compiler.binder import _x, y\nfrom compiler import binder as B\nimport compiler.spec as S\n"
            "L = lazy(\"compiler.parse\")\nB._z, S._w, L._v, B.public, B.__name__\n")
    modules = {m: ROOT for m in ("compiler.binder", "compiler.spec", "compiler.parse")}
    got = _private_reads(ROOT / "compiler" / "m.py", modules, text)
    assert {(m, n) for _, m, n in got} == {("compiler.binder", "_x"), ("compiler.binder", "_z"),
                                           ("compiler.spec", "_w"), ("compiler.parse", "_v")}


def test_the_search_path_imports_no_dynamo():
    """`scalec search` and `plan` trace with torch.fx and compile nothing: importing the search (and through it the
    op records, which key runtime.context_parallel's functions) loads no torch._dynamo, whose import was 0.7 s of
    CPU of every such command (runtime.context_parallel.mark_compiled_constants: marked when compiling)."""
    import subprocess
    import sys
    code = "import sys, compiler.search, runtime.compile\nprint('torch._dynamo' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
