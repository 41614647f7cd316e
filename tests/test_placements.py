"""compiler/layout/placements.py: each parameter's placement per group in DTensor's vocabulary, the one table behind
plan.json's `parameters` and `scalec reshard`'s pieces; torch-free."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from compiler import codegen
from compiler import reshard
from compiler.check import check_text
from compiler.layout import placements as PL
from compiler.pipeline import compile_spec

ROOT = Path(__file__).resolve().parents[1]


def _compiled(sample: str, *edits):
    text = (ROOT / "samples" / f"{sample}.scale").read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    return compile_spec(check_text(text, f"{sample}.scale"))


def test_placements_module_is_torch_free():
    code = ("import sys; import compiler.layout.placements as P; "
            "assert 'torch' not in sys.modules, 'torch imported'; print(P.Shard(1), P.Partial(), P.Replicate())")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["Shard(1)", "Partial(sum)", "Replicate()"]


def test_tp_placements_are_plan_json_s_and_reshard_s():
    """gpt_2d (dp 2 × tp 2, ddp): tp's splits, the partial gradients of sequence parallelism and replication over dp,
    one table that plan.json writes and reshard reads."""
    c = _compiled("gpt_2d")
    table = {pl.name: pl for pl in PL.placements(c.traced, c.plan)}
    doc = json.loads(codegen.plan_json(c.spec, c.traced, c.costs, c.plan))
    assert [p["name"] for p in doc["parameters"]] == list(table)
    for p in doc["parameters"]:
        pl = table[p["name"]]
        assert p["placement"] == {a: str(x) for a, x in pl.groups}
        assert pl.on("dp") == PL.Placed(PL.Replicate())
        tp = pl.on("tp")
        assert (tp.value == PL.Shard(pl.pieces[0][1])) if pl.pieces else tp.value == PL.Replicate()
    assert any(pl.on("tp").grad == PL.Partial("sum") for pl in table.values())
    layout = reshard.Layout(c)
    for name, got in layout.params.items():
        parts = name.split(".")
        pl = table.get(name) or table[".".join([parts[0], "*", *parts[2:]])]
        assert [(p.axis, p.dim, p.n) for p in got.pieces] == [(a, d, 2) for a, d in pl.pieces]


def test_fsdp_with_ep_shards_the_dense_weights_over_dp_and_ep_and_the_experts_over_dp():
    """FSDP2 under ep (runtime/mesh.py's dense_mesh, runtime/train.py's _shard_experts): a dense weight's dim 0 is
    split over dp × ep, an expert's, after ep's split, over dp; plan.json and reshard say so (before the Layout,
    plan.json wrote the experts replicated over dp and the dense weights over ep, and reshard split the dense
    weights over dp alone)."""
    c = _compiled("moe_gpt", ("axis dp = 1", "axis dp = 2"), ("devices_per_node = 2", "devices_per_node = 4"),
                  ("data_parallel = ddp ", "data_parallel = fsdp "))
    assert c.plan.shards_params and c.plan.size("ep") == 2
    table = PL.placements(c.traced, c.plan)
    experts = [pl for pl in table if pl.expert]
    dense = [pl for pl in table if not pl.expert]
    assert experts and dense
    for pl in experts:
        assert pl.pieces[0][0] == "ep" and pl.pieces[1:] == (("dp", 0),)
        assert pl.on("dp") == PL.Placed(PL.Shard(0)) and pl.on("ep").value == PL.Shard(pl.pieces[0][1])
    for pl in dense:
        assert pl.pieces == (("dp", 0), ("ep", 0))  # the mesh's order: dp, then ep
        assert pl.on("dp") == pl.on("ep") == PL.Placed(PL.Shard(0))
    layout = reshard.Layout(c)
    assert {tuple(p.axis for p in got.pieces) for got in layout.params.values()} == {("dp", "ep"), ("ep", "dp")}


def test_fsdp_with_cp_folds_cp_into_the_dense_weights_pieces_but_plan_json_lists_dp_ep_tp():
    """Under cp, FSDP2 shards over dp × cp (cp holds the whole model otherwise): the placements say Shard(0) over
    cp too; plan.json keeps the groups it has always listed (dp, ep, tp)."""
    c = _compiled("gpt_dp", ("axis dp = 2", "axis dp = 2  axis cp = 2"), ("devices_per_node = 2",
                  "devices_per_node = 4"), ("data_parallel = ddp ", "data_parallel = zero2 "))
    assert c.plan.shards_grads and c.plan.size("cp") == 2
    for pl in PL.placements(c.traced, c.plan):
        assert pl.pieces == (("dp", 0), ("cp", 0))
        assert pl.on("cp") == PL.Placed(PL.Shard(0))
    doc = json.loads(codegen.plan_json(c.spec, c.traced, c.costs, c.plan))
    assert {json.dumps(p["placement"]) for p in doc["parameters"]} == {'{"dp": "Shard(0)"}'}
