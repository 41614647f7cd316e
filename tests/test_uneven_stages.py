"""Uneven virtual stages: an interleaved pipeline whose blocks do not divide into pp × virtual_stages equal stages
(Megatron-LM's --decoder-first/last-pipeline-num-layers and --pipeline-model-parallel-layout; Llama 3 405B's 126
layers with the first and last stage one layer short). A written plan gets the cost-balanced cut or its `layout`;
the search still proposes only equal stages (E0605 for a candidate). The runtime's run of such a plan is the e2e
case pp2_interleaved_uneven."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from compiler import schedule as SCH
from compiler.check import check_text
from compiler.diagnostics import ScaleError
from compiler.pipeline import compile_spec
from compiler.report.plan import plan_text
from compiler.rules import pipeline_split as rules

ROOT = Path(__file__).resolve().parents[1]
INTERLEAVED = 'schedule = "interleaved-1f1b"  virtual_stages = 2'


def _six(extra: str = "") -> str:
    """samples/gpt_pp.scale with 6 blocks, interleaved over pp 2 × 2 stages (6 does not divide into 4)."""
    text = (ROOT / "samples" / "gpt_pp.scale").read_text()
    return text.replace("layers = 4", "layers = 6").replace('schedule = "1f1b"', INTERLEAVED + extra)


def _table(text: str) -> list[tuple]:
    """The `pipeline` table of `plan`: (stage, rank, first block, last block, parameters) per row."""
    rows = re.findall(r"^\s+(\d+)\s+(\d+)\s+(\d+)\.\.(\d+)\s+([\d,]+)\s", text.split("\npipeline ")[1], re.M)
    return [tuple(int(x.replace(",", "")) for x in row) for row in rows]


def test_six_blocks_interleave_as_one_two_two_one():
    """The cost-balanced cut gives the first and last stage (which also pay the embedding and the head) one block
    fewer; the schedule is proved, and `plan` prints each stage's blocks and parameters as the layout holds them."""
    compiled = compile_spec(check_text(_six(), "six.scale"))
    assert compiled.plan.stages == ((0, 1), (1, 3), (3, 5), (5, 6))
    text = plan_text(compiled)
    assert "every send has its receive and no rank waits forever" in text
    h, vocab, seq = 64, 128, 32
    block = 12 * h * h + 13 * h  # attention and MLP weights and biases, two layernorms
    first = block + vocab * h + seq * h  # the embedding and learned positions
    last = block + 2 * h + vocab * h  # the final norm and the tied head's copy of the embedding
    assert _table(text) == [(0, 0, 0, 0, first), (1, 1, 1, 2, 2 * block), (2, 0, 3, 4, 2 * block),
                            (3, 1, 5, 5, last)]


def test_uneven_stage_costs_still_verify():
    """The deadlock-freedom check with each stage's own duration (blocks 1, 2, 2, 1) and a transfer time."""
    lay = SCH.Layout(2, 2, 4)
    timeline = SCH.verify(SCH.actions("interleaved-1f1b", 2, 4, 2), lay,
                          cost={"F": [1.0, 2.0, 2.0, 1.0], "B": [2.0, 4.0, 4.0, 2.0]}, transfer=0.1)
    for rank in (0, 1):  # stages 0 and 2, or 1 and 3: (1 + 2 + 2 + 4) per micro-batch, 4 micro-batches
        assert sum(e - b for b, e, _ in timeline.spans[rank]) == 36.0
    assert timeline.makespan > 36.0  # the bubble


def test_a_written_uneven_layout_interleaves():
    """A manual layout with interleaving is taken as written, even where the blocks would divide evenly."""
    layout = "  layout = ((0, 2), (2, 3), (3, 4), (4, 6))"
    compiled = compile_spec(check_text(_six(layout), "six.scale"))
    assert compiled.plan.stages == ((0, 2), (2, 3), (3, 4), (4, 6))
    assert [(s, a, b) for s, _, a, b, _ in _table(plan_text(compiled))] == [(0, 0, 1), (1, 2, 2), (2, 3, 3),
                                                                            (3, 4, 5)]


def test_the_search_still_proposes_only_equal_stages():
    """A candidate (no spans: not written) of the same shape is refused, E0605 as before, so that the search's
    space and rankings stay those of equal stages; the written plan passes the same rule."""
    spec = check_text(_six(), "six.scale")
    assert [d.code for d in rules.requires(spec, spec.plan)] == []
    candidate = dataclasses.replace(spec.plan, spans=())
    (problem,) = rules.requires(spec, candidate)
    assert problem.code == "E0605" and "interleaving needs the 6 blocks to divide into 4 equal stages" in problem.message


def test_too_many_stages_is_still_refused():
    text = _six().replace("virtual_stages = 2", "virtual_stages = 4")
    with pytest.raises(ScaleError) as err:
        check_text(text, "six.scale")
    assert [d.code for d in err.value.diagnostics] == ["E0601"]


def test_llama3_405b_first_and_last_stage_one_layer_short():
    """samples/llama3_405b.scale: 126 layers over pp 16 × 2 stages, 3 in the first and the last, 4 elsewhere
    (Dubey et al. 2024, §3.3.2); pp rank 0 holds stages 0 and 16 (7 blocks), rank 15 stages 15 and 31 (7)."""
    text = (ROOT / "samples" / "llama3_405b.scale").read_text()
    plan = check_text(text, "samples/llama3_405b.scale").plan
    sizes = [b - a for a, b in plan.layout]
    assert len(sizes) == 32 and sizes[0] == sizes[-1] == 3 and set(sizes[1:-1]) == {4} and sum(sizes) == 126
    assert plan.size("pp") == 16 and plan.size("tp") == 8 and plan.size("dp") == 128 and plan.virtual_stages == 2
    assert rules.requires(check_text(text, "samples/llama3_405b.scale"), plan) == []
