"""The mesh's `placement` reaches the program and the plan output: codegen writes Parallel.placement (the generator
of the rank of each mesh coordinate) where a placement is written, and nothing where none is; `plan` and plan.json
say the order it resolved to (compiler/layout/rank_order.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from compiler import codegen
from compiler.check import check_text
from compiler.layout import placement as P
from compiler.layout import rank_order as RO
from compiler.pipeline import compile_spec
from compiler.report.plan import plan_json, plan_text
from runtime.config import Parallel

ROOT = Path(__file__).resolve().parents[1]
GPT3D = (ROOT / "samples" / "gpt_3d.scale").read_text()  # dp 2 × pp 2 × tp 2 on one node of 8 cpu devices
LLAMA = (ROOT / "samples" / "llama3_70b.scale").read_text()  # pp 4 × dp 2 × tp 8 on 8 nodes of 8 H100


def _compiled(text: str, extra: str, device: str):
    assert text.count(f"  device = {device}\n") == 1
    spec = check_text(text.replace(f"  device = {device}\n", f"  device = {device}\n{extra}"), "x.scale")
    return spec, compile_spec(spec)


def test_no_placement_writes_no_ranks():
    spec, c = _compiled(GPT3D, "", "cpu")
    parallel = codegen.config_values(spec, c.traced, c.plan, costs=c.costs)["parallel"]
    assert "placement" not in parallel and "ranks" not in parallel
    assert "placement" not in plan_json(c)["mesh"]
    assert not any(line.startswith("placement") for line in plan_text(c).splitlines())


def test_an_order_is_written_as_its_rank_map():
    two_nodes = GPT3D.replace("  nodes = 1\n  devices_per_node = 8\n", "  nodes = 2\n  devices_per_node = 4\n")
    spec, c = _compiled(two_nodes, "  placement = order(dp, tp, pp)\n", "cpu")
    written = codegen.config_values(spec, c.traced, c.plan, costs=c.costs)["parallel"]["placement"]
    # coordinate (dp, pp, tp), row-major, on rank dp + 2·tp + 4·pp: the generator, not the ranks
    assert written == (("dp", ((2, 1),)), ("pp", ((2, 4),)), ("tp", ((2, 2),)))
    parallel = Parallel(axes=c.plan.axes, groups=c.plan.groups.contract(), placement=written)
    assert parallel.ranks == (0, 2, 4, 6, 1, 3, 5, 7)
    placed = plan_json(c)["mesh"]["placement"]
    assert placed == {"written": ["dp", "tp", "pp"], "order": ["dp", "tp", "pp"], "note": "",
                      "ranks": [0, 2, 4, 6, 1, 3, 5, 7]}
    assert "placement   order(dp, tp, pp); ranks by mesh coordinate (row-major): 0 2 4 6 1 3 5 7" in plan_text(c)
    assert "placement=(('dp', ((2, 1),)), ('pp', ((2, 4),)), ('tp', ((2, 2),)))" in codegen.program(
        spec, c.traced, c.costs, c.plan)


def test_auto_without_a_topology_keeps_the_mesh_order_and_says_so():
    spec, c = _compiled(LLAMA, "  placement = auto\n", "h100")
    placed = plan_json(c)["mesh"]["placement"]
    assert placed["ranks"] == list(range(64)) and placed["order"] == ["tp", "dp", "pp"]
    assert "the mesh describes no topology" in placed["note"]


def test_auto_on_a_fat_tree_keeps_the_heavy_groups_below_the_top():
    _, c = _compiled(LLAMA, "  topology = fat_tree(nodes_per_leaf = 2, oversubscription = 7)\n  placement = auto\n",
                     "h100")
    placed = plan_json(c)["mesh"]["placement"]
    rank_map = P.RankMap(c.plan.axes, tuple(placed["ranks"]))
    assert RO.in_order(rank_map)
    # tp's all-reduces stay inside a node, dp's gradients inside a leaf of 2 nodes
    assert all(len({r // 8 for r in row}) == 1 for row in rank_map.rows("tp"))
    assert all(len({r // 16 for r in row}) == 1 for row in rank_map.rows("dp"))


def test_auto_refuses_a_rank_map_torch_cannot_hold():
    """A snake puts some axis row out of increasing rank order; resolve never returns one."""
    axes = (("dp", 2), ("tp", 4))
    assert not RO.in_order(P.snake_order(axes, ("tp", "dp")))
    assert RO.in_order(P.order(axes, ("dp", "tp")))
    with pytest.raises(ValueError):  # two axes onto the same ranks
        Parallel(axes=axes, placement=(("dp", ((2, 1),)), ("tp", ((4, 1),))))
    with pytest.raises(ValueError):  # factors that are not the axis's size
        Parallel(axes=axes, placement=(("dp", ((2, 4),)), ("tp", ((2, 1),))))


def test_a_printed_file_carries_the_plans_placement():
    """compiler/report/scale.py (`search -o`, the e2e cases): the mesh's `placement` is the Plan's, printed from it;
    a plan without one (a searched mesh, whose axes the file's order may not name) prints none."""
    import dataclasses

    from compiler.parse import parse
    from compiler.report.scale import scale_file
    text = LLAMA.replace("  device = h100\n", "  device = h100\n  placement = order(tp, dp, pp)\n")
    spec = check_text(text, "x.scale")
    kept = scale_file(spec.plan, spec.cluster, text, parse(text, "x.scale"))
    assert kept.count("placement") == 1 and "  placement = order(tp, dp, pp)\n" in kept
    assert check_text(kept, "x.scale").plan.placement == ("tp", "dp", "pp")
    searched = dataclasses.replace(spec.plan, axes=(("dp", 64),), placement=None)
    assert "placement" not in scale_file(searched, spec.cluster, text, parse(text, "x.scale"))


def test_an_auto_choice_out_of_rank_order_falls_back_to_the_best_axis_order():
    """On a 4 × 4 torus of single-device nodes auto embeds dp's ring of 16 as single hops, a snake whose rank
    order runs backwards along some rows; torch's process groups would hold those ranks sorted, so resolve takes
    the best axis order instead (one axis: the mesh's own) and says why."""
    from types import SimpleNamespace

    from compiler.layout.topology import Torus
    axes, traffic, torus = (("dp", 16),), {"dp": 1.0}, Torus(4, 4, 1)
    assert not RO.in_order(P.auto(axes, traffic, torus, 16, 1).rank_map)
    cluster = SimpleNamespace(topology=torus, nodes=16, devices_per_node=1)
    got = RO.resolve("auto", axes, cluster, lambda: traffic)
    assert got.rank_map == P.RankMap.identity(axes) and got.order == ("dp",)
    assert "cannot hold" in got.note
