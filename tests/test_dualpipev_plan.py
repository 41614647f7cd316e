"""DualPipeV planned: its step time (the schedule timed with overlapped pairs, DeepSeek's bubble formula), its
memory (the activations of PP + 1 micro-batches, the parameters of one rank's share) and the search's bound of it.

DeepSeek's figures (github.com/deepseek-ai/DualPipe, README's table, for PP pipeline stages, F, B and W a stage's
forward, full backward and weight-gradient times, F&B a forward and a backward overlapped): DualPipeV runs PP stages
on PP/2 devices with a bubble of (PP/2 - 1)(F&B + B - 3W), twice one stage's parameters per device (one 1F1B rank's
share: "1×" beside DualPipe's 2×) and PP + 1 stages' activations per device. Here p = PP/2 pp ranks, 2p stages.
"""
from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from compiler.check import check_text
from compiler.cost import step_time as SIM
from compiler.cost.memory import _moments, rank_peaks
from compiler.pipeline import compile_spec
from runtime.schedule import Layout, compute_order
from runtime.schedule_time import pair_seconds, steps, timed

ROOT = Path(__file__).resolve().parents[1]


def _bubble(p: int, m: int, cost: dict) -> float:
    """The most a rank idles in the step-time model's pipeline: the pipeline's end less its busy time (every rank
    ends together here; the last ones, whose pairs start latest, idle the most)."""
    ends = SIM.pipeline_ends("dualpipev", p, m, 2, cost, 0.0)
    hidden = SIM.pipeline_hidden("dualpipev", p, m, 2, cost)
    lay = Layout.of("dualpipev", p, 2, m)
    busy = {r: m * sum(cost["F"][s] + cost["B"][s] for s in lay.stages_of(r)) - hidden[r] for r in range(p)}
    return max(ends.values()) - min(busy.values())


@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_the_simulated_bubble_is_deepseeks_formula(p):
    """Equal stages whose input-gradient half takes a forward's time (I = B - W = F, the zero-bubble papers' and
    DeepSeek's accounting) and W <= F (a larger W leaves bubbles the deferred W cannot fill): the slowest rank idles (PP/2 - 1)(F&B + B - 3W) = (p - 1)(F&B + B - 3W), with F&B the
    pair's time from its communication (none: F + B; some hidden), at the warm-up's micro-batch counts and past the
    extrapolation (pipeline_ends' line beyond STEADY·p·v)."""
    n = 2 * p
    for f, w, f_comm, b_comm in ((1.0, 1.0, 0.0, 0.0), (1.0, 1.0, 0.4, 0.6), (1.0, 0.5, 0.3, 0.3),
                                 (2.0, 1.0, 0.0, 0.5), (2.0, 1.5, 1.0, 2.4)):
        b = f + w
        cost = {"F": [f] * n, "B": [b] * n, "I": [b - w] * n, "W": [w] * n,
                "F_comm": [f_comm] * n, "B_comm": [b_comm] * n}
        fb = pair_seconds(f, b, f_comm, b_comm)
        for m in (2 * p, 3 * p + 1, 10 * p + 3):
            assert _bubble(p, m, cost) == pytest.approx((p - 1) * (fb + b - 3 * w), rel=1e-9), (p, m, f, w)


def test_a_pair_hides_each_sides_communication_behind_the_others_compute():
    """pair_seconds: nothing to hide, F + B (a CPU runs them one after the other); each side's communication up to
    the other side's compute hidden, what exceeds it exposed; never below either side nor below the two
    communications one after the other (one link)."""
    assert pair_seconds(1.0, 2.0, 0.0, 0.0) == 3.0
    assert pair_seconds(1.0, 2.0, 0.5, 0.5) == pytest.approx(2.0)      # both hidden: the computes, 0.5 + 1.5
    assert pair_seconds(1.0, 2.0, 0.5, 1.5) == pytest.approx(0.5 + 0.5 + 1.0)  # the backward's 1.5 over 0.5 of F
    rng = random.Random(7)
    for _ in range(500):
        f, b = rng.uniform(0.1, 3), rng.uniform(0.1, 3)
        fc, bc = rng.uniform(0, f), rng.uniform(0, b)
        t = pair_seconds(f, b, fc, bc)
        assert max(f, b, fc + bc) - 1e-12 <= t <= f + b + 1e-12


def _tiny(pp_nodes: int = 4) -> str:
    """samples/tiny_deepseek.scale (1 dense block and 3 MoE blocks) on pp 2 × ep 2, one h100 per node (ep's
    all-to-alls cross nodes), 4 micro-batches: the least dualpipev runs (2·pp)."""
    text = (ROOT / "samples" / "tiny_deepseek.scale").read_text()
    text = text.replace("  axis ep = 2\n  nodes = 1\n  devices_per_node = 2\n  device = cpu",
                        f"  axis pp = 2\n  axis ep = 2\n  nodes = {pp_nodes}\n  devices_per_node = 1\n  device = h100")
    return text.replace("micro_batches = 2", "micro_batches = 4")


@pytest.fixture(scope="module")
def tiny():
    spec = check_text(_tiny(), "tiny_deepseek.scale")
    return {s: compile_spec(spec, plan=replace(spec.plan, schedule=s, virtual_stages=v))
            for s, v in (("1f1b", 1), ("dualpipev", 2))}


EP = ("ep", "ep_rail", "ep_node")  # ep's collectives: direct, or dispatched by node (runtime/moe_nodes.py)


def test_the_expert_all_to_all_hides_in_the_pairs(tiny):
    """The step-time model on an MoE pipeline: under dualpipev each rank's ep all-to-alls are its stages' (m per
    stage, as under 1F1B) less what its overlapped pairs hid, the hidden part off its busy time too; the pairs are
    what the schedule's lists say (runtime.schedule_time.steps), the step shorter than the same lists with nothing
    hidden."""
    c = tiny["dualpipev"]
    plan, cm, sim = c.plan, c.model, SIM.Simulator(c.spec.cluster)
    pred = c.costs.step
    env = SIM.env_of(plan)
    pieces = sim.pieces(cm, plan, env, SIM.links(plan, sim.cluster))
    f, b, _, comm = sim.stage_times(cm, plan, env, pieces)
    hf, hb = sim.stage_hideable(cm, plan, env, pieces)
    assert all(x > 0 for x in hf[1:]) and all(x > 0 for x in hb[1:])  # the MoE stages communicate over ep
    m, lay = plan.micro_batches, plan.stage_layout
    assert lay.stages_of(0) == [0, 3] and lay.stages_of(1) == [1, 2]
    hidden = sim.hidden(cm, plan, env, pieces)
    for r, rank in enumerate(pred.ranks):
        # ep 2 over two nodes of one: dispatched by node, its all-to-alls over the rail (ep_rail; no ep_node)
        ep = m * sum(comm[s].get(a, 0.0) for s in lay.stages_of(r) for a in EP)
        assert sum(rank.hidden_comm_s.get(a, 0.0) for a in EP) == pytest.approx(hidden[r]) and 0 < hidden[r] < ep
        assert sum(rank.exposed_comm_s.get(a, 0.0) for a in EP) == pytest.approx(ep - hidden[r])
        assert rank.compute_s == pytest.approx(m * sum(f[s] + b[s] for s in lay.stages_of(r)) - hidden[r])
    # each rank's pairs, counted from its list: (F0, B1) and (F1, B0) per steady micro-batch (m - 2p + r + 1 of
    # them; the last rank's first F0 and B1 apart), then p - 1 - r (F1, B0) in the drain
    st = steps(compute_order("dualpipev", lay), lay)
    p = 2
    for r in range(p):
        assert sum(st.pair_counts[r].values()) == 2 * (m - 2 * p + r + 1) - (r == p - 1) + (p - 1 - r)
    cost = {"F": f, "B": b, "I": b, "W": [0.0] * 4}
    plain = max(timed(st, lay, cost).values())
    over = max(timed(st, lay, dict(cost, F_comm=hf, B_comm=hb)).values())
    assert over < plain
    # 1F1B of the same plan hides nothing: every all-to-all on its rank's critical path
    one = tiny["1f1b"].costs.step
    assert all(not r.hidden_comm_s for r in one.ranks)


def test_rank_zero_holds_pp_plus_one_stages_of_activations():
    """The memory model reads the lists: rank 0 keeps 2p micro-batches of its first stage and one of its last at
    its fullest moment, 2p + 1 half-size stages, DeepSeek's PP + 1 (PP = 2p stages); 1F1B's rank 0 keeps p whole
    stages (DeepSeek's PP, in 1F1B's stages). Every m has the states of m = 2p (memory._steady)."""
    for p in (2, 3, 4, 8):
        layout = tuple((i, i + 1) for i in range(2 * p))
        peaks = rank_peaks("dualpipev", p, 4 * p, 2, layout)
        assert peaks[0] == {0: 2 * p, 2 * p - 1: 1}
        assert all(sum(pk.values()) <= 2 * p + 1 for pk in peaks)
        assert rank_peaks("1f1b", p, 4 * p, 1, tuple((i, i + 1) for i in range(p)))[0] == {0: p}
        want = [states for states, _ in _moments("dualpipev", p, 2 * p, 2)]
        for m in range(2 * p, 6 * p + 2):
            assert [states for states, _ in _moments("dualpipev", p, m, 2)] == want, (p, m)


def test_a_rank_holds_one_ranks_share_of_the_parameters(tiny):
    """Two half-size stages per rank: the blocks' parameters per rank are 1F1B's (DeepSeek's 1× for DualPipeV;
    DualPipe, not built, would hold 2×); the first and last stage both on rank 0 (the V)."""
    one, v = tiny["1f1b"].costs, tiny["dualpipev"].costs
    assert [s.rank for s in v.stages] == [0, 1, 1, 0]
    per_rank = {r: sum(s.params for s in v.stages if s.rank == r) for r in (0, 1)}
    assert sum(per_rank.values()) == sum(s.params for s in one.stages)
    assert max(per_rank.values()) <= max(s.params for s in one.stages) * 1.2


def test_the_search_bounds_hold_under_dualpipev():
    """The family bound (compiler/search/bounds.py) is `predict(exact=False)`'s busiest rank, the pairs' hidden
    time off it; with fill and drain still below the exact step time; the cheap bound below that."""
    from compiler.search import prune as SE
    spec = check_text(_tiny(), "tiny_deepseek.scale")
    s = SE.Search(spec, 5, {"schedule": "dualpipev", "pp": 2})
    seen = 0
    for sizes in s.shapes():
        for plan in s.families(sizes):
            if plan.schedule != "dualpipev" or s.cands.requires(plan):
                continue
            d = s.cands.decide(plan)
            est = s.cands.estimate(d)
            cm = s.cands.cost_model(d)
            bound = s.sim.predict(cm, d, est, exact=False)
            exact = s.sim.predict(cm, d, est, exact=True)
            assert s.busy(d) == pytest.approx(max(r.compute_s for r in bound.ranks), rel=1e-12)
            assert s.busy(d) <= s.busy(d, fill=True) <= exact.step_time_s * (1 + 1e-12)
            assert 0 < s.cheap_bound(plan) <= s.busy(d, fill=True)
            seen += 1
    assert seen >= 2


def test_the_extrapolation_past_the_warm_up_is_the_full_simulation():
    """pipeline_ends and pipeline_hidden extend a line past STEADY·p·v micro-batches (compiler/cost/step_time.py):
    under dualpipev, with stages up to 4× apart and random communication to hide, the hidden time is the full
    count's to rounding (the pairs grow by the same ones per micro-batch) and each rank's end within 0.1% here
    (0.3% at worst seen: the steady state settles later than 1F1B's)."""
    rng = random.Random(1)
    for spread in (0.25, 3.0):
        for p in (2, 3, 4, 8):
            n = 2 * p
            f = [rng.uniform(1, 1 + spread) for _ in range(n)]
            b = [x * rng.uniform(1.8, 2.2) for x in f]
            w = [x * 0.4 for x in b]
            cost = {"F": f, "B": b, "I": [x - y for x, y in zip(b, w)], "W": w,
                    "F_comm": [x * rng.uniform(0, 0.6) for x in f], "B_comm": [x * rng.uniform(0, 0.6) for x in b]}
            for m in (SIM.STEADY * p * 2 + 2 * p, SIM.STEADY * p * 2 + 5 * p + 1):
                lay = Layout.of("dualpipev", p, 2, m)
                st = steps(compute_order("dualpipev", lay), lay)
                full = timed(st, lay, cost, 0.1)
                got = SIM.pipeline_ends("dualpipev", p, m, 2, cost, 0.1)
                assert got == pytest.approx(full, rel=1e-3), (spread, p, m)
                back = {1: b, 2: cost["I"]}
                want = {r: sum(k * (f[a] + back[c][z] - pair_seconds(f[a], back[c][z], cost["F_comm"][a],
                                                                     cost["B_comm"][z]))
                               for j, k in st.pair_counts[r].items() for a, z, c in [st.pairs[j]]) for r in range(p)}
                assert SIM.pipeline_hidden("dualpipev", p, m, 2, cost) == pytest.approx(want, rel=1e-9)
            for m in range(2 * p, 5 * p):  # linear in m from the least count (each micro-batch adds the same pairs)
                lay = Layout.of("dualpipev", p, 2, m)
                st = steps(compute_order("dualpipev", lay), lay)
                assert [sum(c.values()) for c in st.pair_counts] == [2 * (m - 2 * p + r + 1) - (r == p - 1)
                                                                     + (p - 1 - r) for r in range(p)]
