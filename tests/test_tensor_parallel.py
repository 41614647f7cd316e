"""The tensor-parallel pass on its own: what the policy finds, what the ledger counts, and that every rank's
weights are exact slices of the single-device model's."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from compiler import codegen
from compiler import trace as T
from compiler.check import check_text
from compiler.passes.tensor_parallel import tp_policy
from compiler.pipeline import compile_spec
from runtime import collectives
from runtime import tensor_parallel as tp_rt
from runtime.layers import init_parameters
from tests.e2e.runner import with_plan

ROOT = Path(__file__).resolve().parents[1]
TP_TEXT = (ROOT / "samples" / "gpt_tp.scale").read_text()


def _text(tp=2, vocab=128, **fields) -> str:
    """gpt_tp with `vocab`, on `tp` ranks, the Plan's `fields` replaced (tests/e2e/runner.with_plan)."""
    return with_plan(TP_TEXT.replace("vocab  = 128", f"vocab  = {vocab}"), axes=(("tp", tp),), devices_per_node=tp,
                     **fields)


def test_policy_pairs_columns_with_rows_from_the_graph():
    spec = check_text(_text(), "gpt_tp.scale")
    from compiler import model as M
    traced = T.trace_model(M.build(spec))
    d = tp_policy(traced.blocks["blocks"], spec.plan)
    assert [(r.kind, r.columns, r.row) for r in d.regions] == [
        ("attention", ("attn_q", "attn_k", "attn_v"), "attn_o"), ("mlp", ("mlp_up",), "mlp_down")]
    top = tp_policy(traced.top, spec.plan)
    assert (top.embedding, top.head, top.loss) == ("embed", "linear", "cross_entropy") and not top.regions


def test_excluded_layers_stay_replicated():
    spec = check_text(_text(tp_layers=("attention", "vocab")), "x.scale")
    compiled = compile_spec(spec)
    block = compiled.traced.blocks["blocks"]
    assert block.get_submodule("mlp_up").out_features == 256  # whole
    assert block.get_submodule("attn_q").out_features == 32   # half of 64
    ops = [(c.op, c.direction) for c in compiled.costs.ledger.entries if "mlp" in c.reason]
    assert ops == []


@pytest.mark.parametrize("sp", [False, True])
def test_ledger_has_two_forward_and_two_backward_collectives_per_layer(sp):
    compiled = compile_spec(check_text(_text(sequence_parallel=sp), "gpt_tp.scale"))
    spec = compiled.spec
    per_layer = [c for c in compiled.costs.ledger.entries if "attention" in c.reason or "mlp (" in c.reason]
    layers = spec.value(spec.model.sizes["layers"])
    fwd = [c for c in per_layer if c.direction == "forward"]
    bwd = [c for c in per_layer if c.direction == "backward"]
    # Without SP: an all-reduce after each row linear forward, one before each column group backward.
    # With SP each becomes an all-gather / reduce-scatter pair (Korthikanti et al. 2022).
    per_direction = 4 if sp else 2
    assert len(fwd) == per_direction and len(bwd) == per_direction
    assert all(spec.value(c.per_step, compiled.plan) == layers for c in per_layer)
    expected = {"all_reduce"} if not sp else {"all_gather", "reduce_scatter"}
    assert {c.op for c in per_layer} == expected
    # Megatron's per-layer volume on the wire: 8·b·s·h·(t-1)/t elements per micro-batch over forward and backward,
    # the same with and without SP.
    t = compiled.plan.size("tp")
    b = spec.value(spec.train.global_batch)
    s, h = spec.value(spec.train.seq_len), spec.value(spec.model.sizes["hidden"])
    assert sum(spec.value(c.wire_elements(t), compiled.plan) for c in per_layer) == 8 * b * s * h * (t - 1) / t


def _load(path: Path, name: str):
    mod_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module


def _materialise(program, shards=None):
    with torch.device("meta"):
        model = program.Model()
    model.to_empty(device="cpu")
    cfg = program.CONFIG
    init_parameters(model, seed=cfg.seed, std=cfg.init.std, residual_out=cfg.init.residual_out, layers=cfg.init.layers,
                    shard_of=shards.of if shards else None, local_slice=tp_rt.local_slice)
    return dict(model.named_parameters())


@pytest.mark.parametrize("tp,vocab", [(2, 128), (4, 128), (4, 126)])
def test_every_rank_holds_exact_slices_of_the_single_device_weights(tp, vocab, tmp_path, monkeypatch):
    text, single = _text(tp, vocab, pad_vocab=True), _text(1, vocab, pad_vocab=True)
    paths = {}
    for name, t in (("single", single), ("sharded", text)):
        c = compile_spec(check_text(t, f"{name}.scale"))
        codegen.emit(c, str(tmp_path / name))
        paths[name] = tmp_path / name / "program.py"
    reference = _materialise(_load(paths["single"], "prog_single"))
    program = _load(paths["sharded"], "prog_sharded")
    shards = tp_rt.Shards(program.CONFIG.parallel.tp_shards, program.CONFIG.parallel.tp_partial_grads)
    monkeypatch.setattr(collectives, "axis_size", lambda axis: tp if axis == "tp" else 1)
    pieces = {}
    for rank in range(tp):
        monkeypatch.setattr(collectives, "axis_rank", lambda axis, rank=rank: rank if axis == "tp" else 0)
        for name, p in _materialise(program, shards).items():
            pieces.setdefault(name, []).append(p.detach())
    assert pieces.keys() == reference.keys()
    for name, parts in pieces.items():
        s = shards.of(name)
        if s is None:
            assert all(torch.equal(p, reference[name]) for p in parts), name
        else:
            dim, full, axis = s
            assert axis == "tp"
            whole = torch.cat(parts, dim)
            assert torch.equal(whole.narrow(dim, 0, full), reference[name]), name
            assert torch.all(whole.narrow(dim, full, whole.shape[dim] - full) == 0), f"{name}: padding not zero"


def _attention_with(monkeypatch, extra):
    """The attention builder (compiler/layers/attention.py `build`) with `extra(q)` applied to the queries after
    their linear: an operation the tp pass does not know, traced into the attention's graph like any of its own."""
    import torch.nn.functional as F
    from compiler.layers import attention as A
    real = A.build

    def patched(seg, a, p):
        real(seg, a, p)  # its leaves
        head_dim = seg.number(a.hidden / a.heads)
        gqa = seg.number(a.kv_heads) != seg.number(a.heads)

        def run(seg, x_BSH):
            q_BHSD = extra(getattr(seg, f"{p}_q")(x_BSH)).unflatten(-1, (-1, head_dim)).transpose(1, 2)
            k_BKSD = getattr(seg, f"{p}_k")(x_BSH).unflatten(-1, (-1, head_dim)).transpose(1, 2)
            v_BKSD = getattr(seg, f"{p}_v")(x_BSH).unflatten(-1, (-1, head_dim)).transpose(1, 2)
            y_BHSD = F.scaled_dot_product_attention(q_BHSD, k_BKSD, v_BKSD, is_causal=True, enable_gqa=gqa)
            return getattr(seg, f"{p}_o")(y_BHSD.transpose(1, 2).flatten(2))
        return run
    monkeypatch.setattr(A, "build", patched)


def test_tp_fails_closed_on_an_op_it_does_not_know(monkeypatch, capsys):
    """An attention holding an op outside the pass's allow-list (here sigmoid on the queries: the tracer knows its
    shape, the tp pass does not know it keeps a head shard) is not silently left replicated under tp = 2: compile
    refuses it at the attention's line, naming the op; with tp = 1 the same model compiles. (A rotary embedding's
    cat/chunk/neg stop even earlier today: the tracer has no shape rule for them.)"""
    import torch
    from compiler.diagnostics import ScaleError

    _attention_with(monkeypatch, torch.sigmoid)
    with pytest.raises(ScaleError) as err:
        compile_spec(check_text(_text(), "gpt_tp.scale"))
    (d,) = [d for d in err.value.diagnostics]
    text = err.value.render()
    assert d.code == "E0407" and d.span.line == TP_TEXT.split("\n").index(
        next(l for l in TP_TEXT.split("\n") if "attention(" in l)) + 1, text
    assert "cannot shard this attention" in text and "`sigmoid`" in text and "tp_layers = (mlp, vocab)" in text
    one = TP_TEXT.replace("axis tp = 2", "axis dp = 2")
    assert compile_spec(check_text(one, "gpt_dp.scale")).plan.tp == ()
    # Left out of tp, the same attention compiles, replicated by the user's choice.
    excluded = compile_spec(check_text(_text(tp_layers=("mlp", "vocab")), "gpt_tp.scale"))
    assert [r.kind for _, d in excluded.plan.tp for r in d.regions] == ["mlp"]


def test_roles_are_declared_by_the_layer_kinds_and_tagged_on_the_nodes():
    """q, k, v column, o row, up/gate column, down row: declared by compiler/layers, tagged while tracing, and the
    regions the policy finds from the dataflow agree with them on every sample that shards over tp."""
    from compiler import model as M
    from compiler.passes.tensor_parallel import unsharded
    spec = check_text(_text(), "gpt_tp.scale")
    traced = T.trace_model(M.build(spec))
    roles = {n.name: n.meta.get(T.TP_ROLE) for n in traced.blocks["blocks"].graph.nodes if n.op == "call_module"}
    assert {k: v for k, v in roles.items() if v != "replicated"} == {
        "attn_q": "column", "attn_k": "column", "attn_v": "column", "attn_o": "row", "mlp_up": "column",
        "mlp_down": "row"}
    compiled = compile_spec(spec)
    for cls, gm in compiled.unsharded.segments():
        assert unsharded(gm, compiled.plan, compiled.plan.decision("tp", cls)) == []
