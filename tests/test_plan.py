"""The Plan: one frozen value holding every decision, decided once from an unsharded trace, shared by compile and
by candidate plans."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from compiler import trace as T
from compiler.candidates import Candidates
from compiler.check import check_path
from compiler.pipeline import compile_spec

SAMPLES = sorted((Path(__file__).parents[1] / "samples").glob("*.scale"))


@pytest.mark.parametrize("path", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_candidates_decide_what_compile_runs(path):
    """From the same unsharded trace, a candidate equal to the file's plan is decided exactly as compile decides
    it: tp regions, expert placements and stage layout."""
    spec = check_path(str(path))
    compiled = compile_spec(spec)
    assert Candidates(spec, compiled.unsharded).decide(spec.plan).to_json() == compiled.plan.to_json()


def test_passes_leave_the_unsharded_trace_alone():
    spec = check_path(str(Path(__file__).parents[1] / "samples" / "gpt_3d.scale"))
    compiled = compile_spec(spec)
    for _, gm in compiled.unsharded.segments():
        assert not any(T.COLLECTIVE in n.meta for n in gm.graph.nodes)
    assert any(T.COLLECTIVE in n.meta for _, gm in compiled.traced.segments() for n in gm.graph.nodes)
    again = Candidates(spec, compiled.unsharded)
    assert again.decide(spec.plan) == compiled.plan


def test_a_candidate_is_a_replace_on_the_same_trace():
    spec = check_path(str(Path(__file__).parents[1] / "samples" / "gpt_3d.scale"))
    cands = Candidates(spec)
    base = spec.plan
    assert base.span("axis tp") is not None and base.micro_batch_size == 2
    flat = dataclasses.replace(base, axes=(("dp", 4), ("pp", 2)), spans=())
    decided = cands.decide(flat)
    assert decided.tp == () and decided.stages == ((0, 2), (2, 4)) and decided.span("axis tp") is None
    assert decided.micro_batch_size == 1  # 16 sequences over dp 4 × 4 micro-batches
    deep = cands.decide(dataclasses.replace(base, axes=(("pp", 4), ("tp", 2)), micro_batches=8))
    assert [s[1] - s[0] for s in deep.stages] == [1, 1, 1, 1] and deep.stages_of(1) == (1,)
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.micro_batches = 3  # type: ignore[misc]


def test_a_candidate_compiles_to_the_program_its_text_would():
    """A candidate made with `replace` compiles (on the same unsharded trace) to the graphs, plan and ledger that
    the same plan written in the file compiles to."""
    from compiler import codegen
    from compiler.check import check_text
    root = Path(__file__).parents[1]
    text = (root / "samples" / "gpt_3d.scale").read_text()
    spec = check_text(text, "gpt_3d.scale")
    written = check_text(text.replace("axis dp = 2\n  axis pp = 2", "axis dp = 1\n  axis pp = 4")
                         .replace("micro_batches = 4", "micro_batches = 8")
                         .replace('schedule = "1f1b"', 'schedule = "interleaved-1f1b"  virtual_stages = 1'),
                         "gpt_3d.scale")
    base = compile_spec(spec)
    cand = dataclasses.replace(base.plan, axes=(("dp", 1), ("pp", 4), ("tp", 2)), micro_batches=8,
                               schedule="interleaved-1f1b", spans=())
    got, want = compile_spec(spec, plan=cand, unsharded=base.unsharded), compile_spec(written)
    assert got.plan.to_json() == want.plan.to_json()
    for (cls, a), (_, b) in zip(got.traced.segments(), want.traced.segments()):
        assert codegen.forward_code(a, got.spec) == codegen.forward_code(b, want.spec), cls
    assert [(c.op, c.axis, got.spec.value(c.bytes_per_step(), got.plan)) for c in got.costs.ledger.entries] == \
           [(c.op, c.axis, want.spec.value(c.bytes_per_step(), want.plan)) for c in want.costs.ledger.entries]


def test_show_graphs_prints_each_segment_after_each_pass(tmp_path, capsys):
    from compiler import cli
    sample = str(Path(__file__).parents[1] / "samples" / "gpt_3d.scale")
    assert cli.main(["compile", sample, "-o", str(tmp_path), "--show-graphs"]) == 0
    err = capsys.readouterr().err
    for after in ("tensor_parallel_pass", "expert_parallel_pass", "pipeline_split_pass"):
        assert f"# ---- Block after {after} ----" in err and f"# ---- Model after {after} ----" in err
    tp_part = err.split("# ---- Block after tensor_parallel_pass ----")[1].split("# ----")[0]
    assert "identity_fwd_all_reduce_bwd" not in tp_part and "all_gather_fwd_reduce_scatter_bwd" in tp_part


def test_check_between_names_the_pass_that_broke_the_graph(monkeypatch):
    """`lower` with `check_between` verifies the graphs after each pass, as torch.fx's PassManager does: a pass
    that drops a node's cost annotations is named in the error; unchecked, the same lowering goes through."""
    from compiler import lower as L
    spec = check_path(str(Path(__file__).parents[1] / "samples" / "gpt_3d.scale"))
    compiled = compile_spec(spec)
    tp_pass, cp_pass, ep_pass, pp_pass = L.passes()

    def forgetful_pass(traced, plan):
        for _, gm in traced.segments():
            next(n for n in gm.graph.nodes if n.op == "call_module").meta.pop(T.FLOPS)
        return traced
    monkeypatch.setattr(L, "passes", lambda: (tp_pass, cp_pass, forgetful_pass, pp_pass))
    with pytest.raises(AssertionError, match="lost its cost annotations after forgetful_pass"):
        L.lower(compiled.unsharded, compiled.plan, check_between=True)
    L.lower(compiled.unsharded, compiled.plan)
    assert all(T.FLOPS in n.meta for _, gm in compiled.unsharded.segments() for n in gm.graph.nodes)


@pytest.mark.parametrize("path", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_a_candidate_costs_what_compile_prints(path):
    """The candidate equal to the file's plan, decided and costed from the structure cache, has compile's
    Estimate: same parameters per rank, model state, stages, FLOPs and ledger."""
    spec = check_path(str(path))
    compiled = compile_spec(spec)
    cands = Candidates(spec, compiled.unsharded)
    plan = spec.plan
    assert cands.requires(plan) == []
    got, want = cands.estimate(cands.decide(plan)), compiled.costs
    assert (got.params_rank, got.model_state, got.stages, got.flops_rank_step_n) == \
           (want.params_rank, want.model_state, want.stages, want.flops_rank_step_n)
    assert [(c.op, c.axis, c.direction, c.bytes_per_step()) for c in got.ledger.entries] == \
           [(c.op, c.axis, c.direction, c.bytes_per_step()) for c in want.ledger.entries]


def test_the_data_parallel_wrappers_tuning_is_the_compilers():
    """DDP's bucket and FSDP2's prefetch depth are Plan fields the compiler decides (torch's 25 MiB, one block
    ahead), not settings of the language; plan.json leaves them out (the program's Parallel records them), and a
    value neither cost model costs is refused."""
    from compiler import check
    from compiler.plan import WRAPPER_TUNING
    spec = check_path(str(Path(__file__).parents[1] / "samples" / "gpt_dp.scale"))
    plan = spec.plan
    assert (plan.ddp_bucket_bytes, plan.fsdp_prefetch) == (25 * 2 ** 20, 1)
    assert not set(WRAPPER_TUNING) & set(plan.to_json())
    assert not {"ddp_bucket_bytes", "ddp_bucket_mb", "fsdp_prefetch"} & set(check.PLAN_SETTINGS)
    grammar = (Path(__file__).parents[1] / "grammar" / "scale.lark").read_text()
    assert "prefetch" not in grammar and "bucket" not in grammar
    with pytest.raises(ValueError, match="fsdp_prefetch must be at least 1"):
        dataclasses.replace(plan, fsdp_prefetch=0)
    with pytest.raises(ValueError, match="ddp_bucket_bytes must be positive"):
        dataclasses.replace(plan, ddp_bucket_bytes=0)
