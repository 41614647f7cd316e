"""The stage-split policy on its own: exact against exhaustive search (the slowest rank, interleaved or not),
complete, uneven where the head is heavy."""
from __future__ import annotations

import itertools
import random

import pytest

from compiler.passes.pipeline_split import balance_stages, rank_costs, stage_costs


def _compositions(n: int, k: int):
    """Every way to cut n blocks into k non-empty contiguous stages, as layouts."""
    for cuts in itertools.combinations(range(1, n), k - 1):
        edges = (0,) + cuts + (n,)
        yield tuple(zip(edges, edges[1:]))


def _best(n, c, p, v, first, last, style="loop") -> int:
    """The exhaustive optimum: the least slowest-rank compute over every layout of p × v stages."""
    return min(max(rank_costs(layout, c, p, first, last, style)) for layout in _compositions(n, p * v))


def test_uniform_blocks_split_evenly():
    assert balance_stages(8, 5, 4) == ((0, 2), (2, 4), (4, 6), (6, 8))
    assert balance_stages(16, 5, 4, 2) == tuple((2 * k, 2 * k + 2) for k in range(8))


def test_a_heavy_head_leaves_the_last_stage_fewer_blocks():
    layout = balance_stages(12, 10, 4, first_extra=2, last_extra=25)
    sizes = [b - a for a, b in layout]
    assert sizes[-1] < sizes[0]
    assert max(rank_costs(layout, 10, 4, 2, 25)) == _best(12, 10, 4, 1, 2, 25)


def test_interleaved_llama3_70b_ranks_are_balanced():
    """Llama-3-70B on pp 4 × v 5 (80 blocks; a block ~1/80 of the model, the head ~1.3 blocks, the embedding
    nothing): the old cut by stage cost gave stages of 4, 1, 4, 1, 4, 1, 5, 5, ... blocks, whole stages apart per
    rank; by rank, the head's rank holds one block fewer, no rank is a block's cost from another, stages within a
    block's cost of each other."""
    per_block, first, last = 1_000, 0, 1_300
    layout = balance_stages(80, per_block, 4, 5, first, last)
    loads = rank_costs(layout, per_block, 4, first, last)
    held = [sum(b - a for a, b in layout[r::4]) for r in range(4)]
    assert sorted(held) == [19, 20, 20, 21] and held[3] == 19
    assert max(loads) - min(loads) <= per_block
    assert max(loads) == 21 * per_block
    stage = stage_costs(layout, [per_block] * 80, first, last)
    assert max(stage) - min(stage) <= per_block


@pytest.mark.parametrize("seed", range(40))
def test_optimal_and_complete_against_exhaustive_search(seed):
    rng = random.Random(seed)
    p = rng.randint(1, 3)
    v = rng.randint(1, 3)
    n = rng.randint(p * v, min(p * v + 5, 10))
    c = rng.randint(1, 20)
    first, last = rng.randint(0, 60), rng.randint(0, 60)
    layout = balance_stages(n, c, p, v, first, last)
    assert len(layout) == p * v and all(b > a for a, b in layout)
    assert [i for a, b in layout for i in range(a, b)] == list(range(n))  # every block exactly once, in order
    assert max(rank_costs(layout, c, p, first, last)) == _best(n, c, p, v, first, last)


@pytest.mark.parametrize("seed", range(12))
def test_the_v_layout_optimal_against_exhaustive_search(seed):
    """dualpipev's V (rank r holds stages r and 2p-1-r): the first and the last stage, with the embedding and the
    head, both on rank 0, which the cut gives fewer blocks."""
    rng = random.Random(seed)
    p = rng.randint(1, 3)
    n = rng.randint(2 * p, min(2 * p + 5, 10))
    c, first, last = rng.randint(1, 20), rng.randint(0, 60), rng.randint(0, 60)
    layout = balance_stages(n, c, p, 2, first, last, "v")
    assert [i for a, b in layout for i in range(a, b)] == list(range(n))
    assert max(rank_costs(layout, c, p, first, last, "v")) == _best(n, c, p, 2, first, last, "v")


def test_more_stages_than_blocks_is_refused():
    with pytest.raises(ValueError, match="cannot cut 3 blocks into 4"):
        balance_stages(3, 1, 4)


# -- several repeats: their blocks concatenated ------------------------------------------------------------------

def _dense_first(**plan) -> str:
    """moe_gpt.scale as DeepSeek-V3 is shaped: `repeat 1` of a dense block, then `repeat 3` of MoE blocks; its mesh
    and plan printed from `plan` (Plan fields)."""
    from tests.e2e.cases import DENSE_FIRST
    from tests.e2e.runner import ROOT, with_plan
    text = (ROOT / "samples" / "moe_gpt.scale").read_text()
    for old, new in DENSE_FIRST:
        text = text.replace(old, new)
    return with_plan(text, "dense_first.scale", **plan)


PP2 = dict(axes=(("pp", 2),), devices_per_node=2)


def test_held_cuts_a_stage_at_the_repeats_boundary():
    from compiler.trace import held
    edges = (("blocks", 0, 1), ("blocks_2", 1, 4))
    assert held(edges, 0, 2) == ((0, 0, 1), (1, 0, 1))  # the dense block and the first MoE block
    assert held(edges, 2, 4) == ((1, 1, 3),)
    assert held(edges, 1, 2) == ((1, 0, 1),)


def test_stages_run_across_two_repeats():
    """The rules pass a pipeline over two consecutive repeats; the policy cuts their 4 blocks, the lowered trace
    numbers them across both repeats, and the Formulas say which each stage holds."""
    from compiler.check import check_text
    from compiler.pipeline import compile_spec
    from compiler.trace import repeat_edges
    compiled = compile_spec(check_text(_dense_first(**PP2, micro_batches=2), "dense_first.scale"))
    spec, traced, plan = compiled.spec, compiled.traced, compiled.plan
    assert repeat_edges(traced, spec.value) == (("blocks", 0, 1), ("blocks_2", 1, 4))
    assert [b for a, b in plan.stages] == [2, 4] and plan.stages[0][0] == 0
    from compiler.cost import CostModel
    fo = CostModel(spec, traced, plan).formulas
    assert fo.held(0, 2) == ((0, 1), (1, 1)) and fo.held(2, 4) == ((1, 2),)


@pytest.mark.parametrize("plan, stages", [
    (dict(layout=((0, 3), (3, 4))), ((0, 3), (3, 4))),
    (dict(schedule="interleaved-1f1b", virtual_stages=2), ((0, 1), (1, 2), (2, 3), (3, 4)))])
def test_layout_and_interleaving_over_the_concatenated_blocks(tmp_path, plan, stages):
    """A manual layout and interleaved stages number blocks across the repeats; each stage's module holds the
    single-device model's names of its blocks (`blocks.0`, `blocks_2.1`): checkpoints do not see the layout."""
    import importlib.util

    import torch

    from compiler import codegen
    from compiler.check import check_text
    from compiler.pipeline import compile_spec
    compiled = compile_spec(check_text(_dense_first(**PP2, micro_batches=2, **plan), "dense_first.scale"))
    assert compiled.plan.stages == stages
    codegen.emit(compiled, str(tmp_path))
    spec = importlib.util.spec_from_file_location("dense_first_prog", tmp_path / "program.py")
    prog = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prog)
    single = {f"blocks.0.{n}" for n in ("attn_q.weight", "mlp_up.weight")} | {
        f"blocks_2.{i}.moe_router.weight" for i in range(3)}
    seen = set()
    for k, (lo, hi) in enumerate(stages):
        with torch.device("meta"):
            names = {n for n, _ in prog.Stage(k).named_parameters()}
        mine = {n for n in single if (int(n.split(".")[1]) + (0 if n.startswith("blocks.") else 1)) in range(lo, hi)}
        assert mine <= names and not (single - mine) & names, (k, names)
        seen |= names & single
    assert seen == single


def _rules(text: str) -> list:
    from compiler.check import check_text
    from compiler.diagnostics import ScaleError
    try:
        check_text(text, "dense_first.scale")
    except ScaleError as err:
        return [(d.code, d.message) for d in err.diagnostics]
    return []


def test_a_layer_between_repeats_is_refused_under_pp():
    text = _dense_first(**PP2, micro_batches=2).replace("  }\n  repeat 3 {",
                                                         "  }\n  layernorm(hidden)\n  repeat 3 {")
    (problem,) = _rules(text)
    assert problem[0] == "E0605"
    assert problem[1].startswith("a layer (layernorm, line 22) stands between the `repeat`s of lines 18 and 23: "
                                 "a pipeline cuts the blocks of consecutive `repeat`s into stages"), problem
    # without pp the model is fine
    assert _rules(_dense_first(micro_batches=2).replace("  }\n  repeat 3 {", "  }\n  layernorm(hidden)\n  repeat 3 {")
                  ) == []


def test_stage_counts_add_the_repeats():
    pp4 = dict(axes=(("pp", 4),), devices_per_node=4, micro_batches=4)
    assert _rules(_dense_first(**pp4)) == []
    (problem,) = _rules(_dense_first(**pp4, schedule="interleaved-1f1b", virtual_stages=2))
    assert problem[0] == "E0601" and "8 pipeline stages but only 4 blocks" in problem[1]
    (problem,) = _rules(_dense_first(**PP2, micro_batches=2, layout=((0, 2), (2, 5))))
    assert problem[0] == "E0607" and "block 4 does not exist: the model has 4 blocks" in problem[1]
