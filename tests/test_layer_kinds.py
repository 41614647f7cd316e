"""A layer kind in one place (issue 38): compiler/layers/<kind>.py holds its schema, its resolved class and its
builder; the operations it calls are records of compiler/ops. A new kind, a new attention variant, is its module,
its entry in compiler/layers KINDS and its op records.

Held here: the compiler files that name a kind (its resolved class, through compiler.spec or its own module, or its
module itself) are the kind's own module, the vocabulary (compiler/layers/__init__.py), compiler/spec.py's imports
for the Spec's readers, and the places below, each with the kinds it may name and why. A file that starts naming a
kind fails here until it is added with its reason; an entry that no longer names its kinds fails too. (A sliding
window touched 7 compiler files, MLA 8: the list says which of those places still must.)

The scan reads references, not strings: a kind's keyword doubles as an op's name (`embedding`, `layernorm`,
`cross_entropy`), a tp region's (`attention`, `mlp`), a leaf's (`lm_head`) or a setting's value (`residual`), so
what a file knows of a kind is the kind's class or module it reaches.
"""
from __future__ import annotations

import ast
from pathlib import Path

from compiler import layers as L

ROOT = Path(__file__).resolve().parents[1]

KINDS = {m.__name__.rsplit(".", 1)[1]: m for m in L.KINDS}  # module stem (`mla`) -> module
CLASSES = {m.SPEC.__name__: stem for stem, m in KINDS.items()}  # resolved class (`MLA`) -> module stem
BODY = {stem for stem, m in KINDS.items() if hasattr(m, "build")}  # the kinds compiler/model.py builds by their module
EVERY = frozenset(KINDS)

# The places that must name kinds beyond their own module: file -> (the kinds, why).
PLACES = {
    "compiler/layers/__init__.py": (EVERY, "the vocabulary: KINDS lists every kind's module"),
    "compiler/spec.py": (EVERY, "imports each kind's resolved class for the Spec's readers (Model's roles, walk)"),
    "compiler/check.py": (EVERY - {"norm", "mla"}, "the model section's structure (roles in order, once each)"),
    "compiler/lints.py": ({"attention", "embedding", "mla", "mlp", "moe", "positional"},
                          "the lints across layers and settings (a window longer than the sequence, a dropped choice "
                          "outside a residual, tp placement by kind, offload's modules by kind)"),
    "compiler/file_checks.py": ({"attention", "mla"}, "packed documents refuse mla, windowed and soft-capped "
                                                      "attention"),
    "compiler/language.py": ({"moe"}, "the names of the size symbols bound for each moe (its capacity per sequence)"),
    "compiler/model.py": ({"residual", "moe"}, "the model's frame: `residual` is a container; has_moe tells codegen "
                                               "to import runtime.moe"),
    "compiler/layers/mla.py": ({"attention"}, "shares attention's rope_scaling schema and its resolution"),
    "compiler/hf_header.py": (EVERY - {"cross_entropy", "residual"},
                              "an init checkpoint's tensors by their Hugging Face names, per kind, torch-free for "
                              "`scalec check`"),
    "compiler/export.py": ({"mla", "moe", "norm", "positional", "residual"},
                           "writes a Hugging Face config and checkpoint from the model's layers (the importer's "
                           "inverse)"),
    "compiler/export_gemma.py": ({"norm", "positional", "residual"}, "Gemma's config from the model's layers"),
    "compiler/passes/tensor_parallel.py": (EVERY - {"norm", "residual"},
                                           "the tp policy: the layers whose leaves it shards (heads, widths, "
                                           "vocabulary) and the sizes it divides"),
    "compiler/rules/tensor_parallel.py": ({"attention", "embedding", "mla", "mlp", "moe"},
                                          "what tp must divide: heads, widths, vocabulary (torch-free, for the "
                                          "search)"),
    "compiler/passes/context_parallel.py": ({"positional"}, "learned positions looked up per rank's chunk"),
    "compiler/rules/context_parallel.py": ({"attention", "mla", "moe"}, "what cp refuses or divides (windows, "
                                                                        "latent attention, expert capacity)"),
    "compiler/passes/expert_parallel.py": ({"moe"}, "shards a moe's experts over ep"),
    "compiler/rules/expert_parallel.py": ({"moe"}, "ep must divide the experts"),
    "compiler/passes/pipeline_split.py": ({"cross_entropy"}, "the loss ends the last stage"),
    "compiler/rules/__init__.py": ({"positional"}, "learned positions bound the sequence length"),
    "compiler/cost/ledger_parts.py": ({"attention"}, "why tp leaves gradients partial: attention's per-head q/k "
                                                     "norms"),
    "compiler/cost/memory.py": ({"moe"}, "the experts' weights apart from the dense ones"),
    "compiler/cost/rebalance.py": ({"moe", "residual"}, "expert re-placement's ledger rows and what-if: the rebalanced "
                                  "moe layers and how many times the model holds each (repeats inside residuals)"),
    "compiler/report/plan.py": ({"moe"}, "prints the experts' capacity and empty slots"),
    "compiler/cost/structures.py": ({"moe"}, "a moe's capacity divides by cp in the lowered graph: its cp sizes "
                                              "cannot share one lowering and cost model as a dense model's do"),
    "compiler/search/dispatch.py": ({"moe", "residual"}, "searches a dropless moe's dispatch both ways (walking the "
                                                         "residual blocks that hold it)"),
    "compiler/search/report.py": ({"moe"}, "explains ep choices"),
    "compiler/search/space.py": ({"moe"}, "ep's degrees from the experts"),
}


def _named(path: Path) -> set:
    """The kinds `path` names: an import from a kind's module or of its class from compiler.spec, and any attribute
    chain reaching one through an imported name (`S.MoE`, `L.moe.CAPACITY`, `layers.mla`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    alias = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            for a in n.names:
                alias[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
            for a in n.names:
                alias[a.asname or a.name] = f"{n.module}.{a.name}"

    def kind_of(dotted: str) -> str | None:
        parts = dotted.split(".")
        if parts[:2] == ["compiler", "spec"] and len(parts) > 2 and parts[2] in CLASSES:
            return CLASSES[parts[2]]
        if parts[:2] == ["compiler", "layers"] and len(parts) > 2 and parts[2] in KINDS:
            return parts[2]
        return None

    found = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
            found.update(k for a in n.names if (k := kind_of(f"{n.module}.{a.name}")))
        elif isinstance(n, ast.Import):
            found.update(k for a in n.names if (k := kind_of(a.name)))
        elif isinstance(n, (ast.Attribute, ast.Name)):
            chain, x = [], n
            while isinstance(x, ast.Attribute):
                chain.append(x.attr)
                x = x.value
            if isinstance(x, ast.Name) and x.id in alias and (k := kind_of(".".join([alias[x.id], *chain[::-1]]))):
                found.add(k)
    return found


def _naming() -> dict:
    """file -> the kinds it names, for every compiler file but the kinds' own modules (a module names itself)."""
    out = {}
    for p in sorted((ROOT / "compiler").rglob("*.py")):
        rel = str(p.relative_to(ROOT))
        own = rel.removeprefix("compiler/layers/").removesuffix(".py") if rel.startswith("compiler/layers/") else None
        kinds = _named(p) - {own}
        if kinds:
            out[rel] = kinds
    return out


def test_only_the_listed_places_name_a_layer_kind():
    naming = _naming()
    assert naming["compiler/spec.py"] == EVERY  # the scan sees names (a broken scan would find none and pass)
    assert "moe" in naming["compiler/passes/expert_parallel.py"]
    strays = {f: sorted(k - PLACES.get(f, (frozenset(), ""))[0]) for f, k in naming.items()
              if k - PLACES.get(f, (frozenset(), ""))[0]}
    assert strays == {}, ("these files name a layer kind: keep what the kind knows in compiler/layers/<kind>.py (and "
                          "its ops in compiler/ops), or add the file to PLACES with the reason it must")
    stale = {f: sorted(kinds - naming.get(f, set())) for f, (kinds, _) in PLACES.items()
             if kinds - naming.get(f, set())}
    assert stale == {}, "these places no longer name these kinds: narrow PLACES"


def test_each_kind_module_holds_its_schema_its_class_and_its_builder():
    for stem, m in KINDS.items():
        assert m.SPEC.__module__ == m.__name__, f"{stem}'s resolved class is defined in {m.SPEC.__module__}"
        assert m.SCHEMA and isinstance(m.TP_ROLES, dict), stem
        assert getattr(m, "CONTAINER", False) or callable(m.resolve), stem
    # the layers of the body are built by their own module; the frame (embedding, positional, head, loss, residual)
    # is compiler/model.py's
    assert BODY == {"norm", "attention", "mla", "mlp", "moe"}
    for stem in BODY:
        assert callable(KINDS[stem].build) and KINDS[stem].LEAF, stem


def test_spec_and_model_define_no_layer_kind():
    """compiler/spec.py defines no layer class and compiler/model.py builds no layer of the body itself: the places a
    kind used to be written three times."""
    spec = ast.parse((ROOT / "compiler" / "spec.py").read_text(encoding="utf-8"))
    defined = {n.name for n in spec.body if isinstance(n, ast.ClassDef)}
    assert "Model" in defined and "Repeat" in defined
    assert defined & set(CLASSES) == set()
    assert _named(ROOT / "compiler" / "model.py") == {"residual", "moe"}


def test_a_new_kind_is_its_module(monkeypatch):
    """A kind the compiler has never seen, `mix(hidden)` (a square linear, an op with a record), declared in one
    module object and entered in the vocabulary, is checked, built, traced, costed and tp-sharded (replicated, as its
    TP_ROLES say) with no other file touched."""
    import types
    from dataclasses import dataclass

    from compiler.binder import Param, to_size
    from compiler.check import check_text
    from compiler.diagnostics import Span
    from compiler.pipeline import compile_spec
    from compiler.symbols import Size

    @dataclass(frozen=True, kw_only=True)
    class Mix:
        hidden: Size
        span: Span

    def build(seg, x, p):
        w = seg.linear(f"{p}_w", x.hidden, x.hidden, False, x.span)
        return lambda seg, h_BSH: getattr(seg, w)(h_BSH)

    mix = types.ModuleType("mix")
    mix.__dict__.update(SPEC=Mix, SCHEMA={"mix": {"hidden": Param(to_size, doc="model width")}}, TP_ROLES={},
                        resolve=lambda c, st, a, kind: Mix(hidden=a["hidden"], span=st.span), LEAF="mix", build=build)
    monkeypatch.setattr(L, "KINDS", (*L.KINDS, mix))
    monkeypatch.setitem(L.BY_NAME, "mix", mix)
    monkeypatch.setitem(L.SCHEMAS, "mix", mix.SCHEMA["mix"])

    text = (ROOT / "samples" / "tiny_gpt.scale").read_text()
    block = "residual { layernorm(hidden)  mlp(hidden, ffn, act = gelu) }"
    assert block in text
    text = text.replace(block, block + "\n    residual { layernorm(hidden)  mix(hidden) }")
    text = text.replace("axis dp = 1", "axis tp = 2").replace("devices_per_node = 1", "devices_per_node = 2")
    compiled = compile_spec(check_text(text, "mix.scale"))
    graph = compiled.traced.blocks["blocks"]
    assert "mix_w" in dict(graph.named_modules())
    node = next(n for n in graph.graph.nodes if n.target == "mix_w")
    assert isinstance(node.meta["layer"], Mix)
    # tp shards attention's and mlp's leaves; the new kind declares none, so its weight stays whole on every rank
    shapes = {name: tuple(p.shape) for name, p in graph.named_parameters()}
    assert shapes["mix_w.weight"] == (64, 64) and shapes["mlp_up.weight"] == (128, 64)
    plain = compile_spec(check_text((ROOT / "samples" / "tiny_gpt.scale").read_text(), "tiny.scale"))
    assert compiled.costs.params_n - plain.costs.params_n == 2 * (64 * 64 + 2 * 64)  # per block: its weight, a norm
