"""W0413 (compiler/lints.py `tp_placement`): tp listed so that its groups cross nodes though tp fits in one. The
warning and `scalec plan`'s links line (compiler/cost/step_time.py `links`, the order runtime/mesh.py builds) read
the mesh's axis order the same way: they agree on every layout of a small table."""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from compiler.check import check_text
from compiler.cost.links import links

ROOT = Path(__file__).resolve().parents[1]
MODEL = (ROOT / "tests" / "mistakes" / "mesh_tp_outside_dp_across_nodes.scale").read_text()
MODEL = MODEL[MODEL.index("model gpt"):MODEL.index("mesh {")]


def _spec(axes, nodes: int, per_node: int):
    lines = "\n".join(f"  axis {a} = {n}" for a, n in axes)
    text = (MODEL + f"mesh {{\n{lines}\n  nodes = {nodes}  devices_per_node = {per_node}  device = cpu\n}}\n"
            "plan { micro_batches = 2 }\n"
            "train { global_batch = 16  seq_len = seq  steps = 2  optimizer = adamw(lr = 1e-3) }\n")
    return check_text(text, "placement.scale")


LAYOUTS = [(axes, nodes, per_node)
           for nodes, per_node in ((1, 8), (2, 4), (2, 8), (4, 2))
           for tp in (2, 4)
           for order in itertools.permutations(("tp", "dp", "pp"))
           for axes in [tuple((a, {"tp": tp, "pp": 2}.get(a, nodes * per_node // (2 * tp))) for a in order)]
           if nodes * per_node % (2 * tp) == 0 and nodes * per_node // (2 * tp) >= 1]


@pytest.mark.parametrize("axes,nodes,per_node", LAYOUTS, ids=[
    f"{'_'.join(f'{a}{n}' for a, n in ax)}-{no}x{pn}" for ax, no, pn in LAYOUTS])
def test_the_warning_says_what_the_links_say(axes, nodes, per_node):
    spec = _spec(axes, nodes, per_node)
    warned = [w for w in spec.warnings if w.code == "W0413"]
    tp = dict(axes)["tp"]
    fits = tp <= per_node and per_node % tp == 0
    crosses = links(spec.plan, spec.cluster)["tp"].crosses_nodes
    assert bool(warned) == (crosses and fits), (axes, nodes, per_node, crosses, warned)
    if warned:
        assert warned[0].span.line == 1 + MODEL.count("\n") + [a for a, _ in axes].index("tp") + 1


def test_the_order_the_warning_advises_keeps_tp_inside_a_node():
    spec = _spec((("tp", 2), ("dp", 4)), 2, 4)
    (w,) = [w for w in spec.warnings if w.code == "W0413"]
    assert "list `axis tp = 2` last" in w.help
    fixed = _spec((("dp", 4), ("tp", 2)), 2, 4)
    assert not [w for w in fixed.warnings if w.code == "W0413"]
    assert not links(fixed.plan, fixed.cluster)["tp"].crosses_nodes
