"""Released architectures written in the language: `scalec plan` prints their published parameter counts exactly
(Llama 2 7B: Touvron et al. 2023; Llama 3 8B and 70B: Meta 2024; Mixtral 8x7B: Jiang et al. 2024), and each
sample's plan fits its cluster (the compiler refuses one that does not)."""
from __future__ import annotations

from pathlib import Path

import pytest

from compiler.check import check_text
from compiler.report.plan import plan_text
from compiler.fit import budget
from compiler.pipeline import compile_spec

ROOT = Path(__file__).resolve().parents[1]

PUBLISHED = {"llama3_8b": 8_030_261_248, "llama3_70b": 70_553_706_496, "mixtral_8x7b": 46_702_792_704}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_sample_prints_the_published_parameter_count(name):
    path = ROOT / "samples" / f"{name}.scale"
    compiled = compile_spec(check_text(path.read_text(), str(path)))
    assert compiled.costs.params_n == PUBLISHED[name]
    assert f"parameters  {PUBLISHED[name]:,} " in plan_text(compiled)
    assert budget(compiled) == []  # fits, with no warning of being within 10% of the device


def test_llama2_7b_has_its_published_parameter_count():
    text = (ROOT / "samples" / "llama3_8b.scale").read_text()
    for old, new in (("vocab   = 128256", "vocab   = 32000"), ("kv      = 8", "kv      = 32"),
                     ("ffn     = 14336", "ffn     = 11008"), ("seq     = 8192", "seq     = 4096"),
                     ("rope_theta = 500000", "rope_theta = 10000")):
        assert old in text
        text = text.replace(old, new)
    compiled = compile_spec(check_text(text, "llama2_7b.scale"))
    assert compiled.costs.params_n == 6_738_415_616
