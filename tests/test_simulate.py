"""The step-time model (compiler/cost/step_time.py): against Megatron-LM's published figures, our H100 measurements, the
collective algorithms' formulas, the mesh's placement on nodes and the schedule simulation."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from compiler import pipeline as D
from compiler import schedule as SCH
from compiler.cost import links as LK
from compiler.cost.formulas import env_of
from compiler.cost import op_times as OT
from compiler.cost import step_time as SIM
from compiler.check import check_text

ROOT = Path(__file__).resolve().parents[1]
GPT3 = (ROOT / "samples" / "gpt3_175b.scale").read_text()


def predict(text: str, name: str = "t.scale", **kw):
    compiled = D.compile_spec(check_text(text, name))
    return compiled, SIM.predict(compiled, **kw)


@pytest.fixture(scope="module")
def table1():
    """All ten rows of Narayanan et al. 2021's Table 1 as bench/step_time.py sets them up (t, p, interleaved with
    `chunks` per rank, full recomputation, micro-batch 1 or 2): compiled and costed once for the tests below."""
    from bench.step_time import megatron_rows
    return megatron_rows("megatron_2021_table1")


def test_megatron_table1_tflops_per_gpu_within_10_percent_on_nine_rows(table1):
    """Every row compiles as published, and the predicted TFLOP/s per GPU is within 10% of the paper's on at least
    9 of 10 (the A100's figures are fitted on the three calibration rows only: `python -m bench.step_time fit`; the
    seven others check them). Today all ten are, 0.94-1.09."""
    assert len(table1) == 10
    within = [r for r in table1 if abs(r["ratio"] - 1) <= 0.10]
    assert len(within) >= 9, [(r["row"]["params_billion"], round(r["ratio"], 3)) for r in table1]
    for r in table1:  # interleaved where there is a pipeline, as the paper ran it
        assert r["virtual_stages"] > 1 if r["row"]["p"] > 1 else r["virtual_stages"] == 1


# Every row fits: under pp the program (runtime.pipeline.InFlight) keeps receive buffers and sends only for the
# micro-batches in flight (issue 22), which brought 310B and 530B under 80 GB, and frees a sent stage output once its
# send completed (Megatron's deallocate_output_tensor) where its backward provably reads no data: a residual add,
# eager or compiled (a compiled region's stash is checked: runtime.pipeline._freeable). That brought 1T from 81 GB.
@pytest.mark.parametrize("billion", [1.7, 3.6, 7.5, 18.4, 39.1, 76.1, 145.6, 310.1, 529.6, 1008.0])
def test_megatron_table1_fits_80gb(table1, billion):
    (r,) = [r for r in table1 if r["row"]["params_billion"] == billion]
    assert r["fits"] and r["peak_bytes"] <= 80e9, (billion, r["peak_bytes"] / 1e9)


def test_a100_figures_are_the_calibration_fit():
    """compiler/layout/devices.py's A100 matmul_efficiency and intra_node_efficiency are the least-squares fit to
    Table 1's three calibration rows (bench/step_time.py `fit`): no neighbour on the fit's grid does better, so a
    change of the model that moves the optimum fails here until the figures are refitted."""
    import math

    from bench.step_time import _compiled_rows, _ratios
    from compiler.layout.devices import DEVICES
    a100 = DEVICES["a100"]
    rows = _compiled_rows("megatron_2021_table1_calibration")

    def loss(mm, ce):
        return sum(math.log(r) ** 2 for r in _ratios(rows, matmul_efficiency=mm, intra_node_efficiency=ce))
    here = loss(a100.matmul_efficiency, a100.intra_node_efficiency)
    for dm, dc in ((0.005, 0), (-0.005, 0), (0, 0.02), (0, -0.02)):
        assert here <= loss(a100.matmul_efficiency + dm, a100.intra_node_efficiency + dc), (dm, dc)
    assert here < loss(a100.matmul_efficiency, 1.0)  # the NVLink efficiency earns its place


@pytest.fixture(scope="module")
def table5():
    from bench.step_time import korthikanti_rows
    return {r["row"]["params_billion"]: r for r in korthikanti_rows()}


@pytest.mark.parametrize("billion", [22, 175, 530, 1000])
def test_korthikanti_table5_iteration_time_within_10_percent(table5, billion):
    """Korthikanti et al. 2022, Table 5's "present work" (sequence parallelism + selective recomputation) at their
    Table 3 configurations: predicted iteration time within 10% of the published one (checked, not fitted:
    0.99-1.05 today). Interleaving's chunks per rank are not published: bench/step_time.py KORTHIKANTI_CHUNKS."""
    r = table5[billion]
    assert abs(r["ratio"] - 1) <= 0.10, (billion, r["prediction"].step_time_s, r["published_s"])


# All four fit. 1T's first pp rank holds the activations of 191 chunk-micro-batches in flight (interleaved 1F1B,
# p = 64, 2 chunks: 127 of its first chunk, 64 of its second); with sequence parallelism the selective recomputation
# keeps each norm's output sharded and gathers it again in backward (runtime.recompute.RECOMPUTE, as Megatron's
# sequence-parallel linears), where it kept the gathered whole: 106 GB before, 63 GB now.
@pytest.mark.parametrize("billion", [22, 175, 530, 1000])
def test_korthikanti_table5_fits_80gb(table5, billion):
    assert table5[billion]["fits"], (billion, table5[billion]["peak_bytes"] / 1e9)


@pytest.mark.skip(reason="gpu-measured.json measured the bf16-autocast programs; bf16 programs now compute in bf16 "
                         "weights without casts (runtime/precision.py): re-measure on an H100 (bench/gpu.py)")
def test_h100_reference_programs_within_30_percent():
    """Our programs measured on one H100 (gpu-measured.json). The model predicts 0.73-0.86 of the measured step: the
    runtime's own overhead (8-23% over the same Model in a bare loop, measured there) is not modelled; issue 13
    removes it. The bound below is that gap, not a target."""
    from bench.step_time import h100_rows
    for r in h100_rows():
        assert 0.7 <= r["ratio"] <= 1.1, (r["name"], r["ratio"])


@pytest.mark.skip(reason="gpu-measured.json's compiled baselines ran the generated Model under bf16 autocast; the "
                         "model now predicts the cast-free program (runtime/precision.py): re-measure on an H100")
def test_h100_compiled_model_within_10_percent():
    """`plan { compile = true }`: the memory-bound ops between two matmuls run as one fused kernel each (their
    group's outside reads and writes, once). Against the generated Model under torch.compile in a bare loop on one
    H100 (gpu-measured.json's baselines: 68.3 ms for GPT-2 124M at 32 × 1024 tokens, 92.3 ms for 350M at 16 × 1024)
    the model gives 0.99 and 1.01 (AdamW fused there, as in our runtime now) with no figure fitted to them; the compiled program's own overhead over that loop
    is a GPU figure still to measure (bench/gpu.py)."""
    from bench.step_time import h100_rows
    rows = h100_rows(compiled=True)
    assert len(rows) == 2
    for r in rows:
        assert 0.9 <= r["ratio"] <= 1.1, (r["name"], r["ratio"])
    eager = {r["name"]: r["prediction"].step_time_s for r in h100_rows()}
    for r in rows:  # fusion must show: the compiled step predicted clearly shorter
        assert r["prediction"].step_time_s < 0.9 * eager[r["name"]]


def test_collective_formulas():
    intra = LK.Link("tp", 8, False, 300.0, 3.0)
    nbytes = 1e9
    ring = 2 * 7 * 3e-6 + 2 * 7 / 8 * nbytes / 300e9
    assert LK.collective_s("all_reduce", nbytes, intra) == pytest.approx(ring)
    assert LK.collective_s("all_gather", nbytes, intra) == pytest.approx(7 * 3e-6 + 7 / 8 * nbytes / 300e9)
    assert LK.collective_s("reduce_scatter", nbytes, intra) == LK.collective_s("all_gather", nbytes, intra)
    assert LK.collective_s("send_recv", nbytes, intra) == pytest.approx(3e-6 + nbytes / 300e9)
    assert LK.collective_s("all_reduce", nbytes, LK.Link("tp", 1, False, 300.0, 3.0)) == 0
    # across nodes a small all-reduce over many ranks takes the tree: 2·log2(n) latencies, not 2(n-1)
    wide = LK.Link("dp", 1024, True, 25.0, 8.0)
    small = LK.collective_s("all_reduce", 1e3, wide)
    assert small == pytest.approx(2 * 10 * 8e-6 + 2 * 1e3 / 25e9)
    with pytest.raises(ValueError):
        LK.collective_s("gossip", 1.0, intra)


def test_links_place_the_mesh_innermost_axis_first():
    _, inner = predict(GPT3)
    links = {k.axis: k for k in inner.links}
    assert not links["tp"].crosses_nodes and links["pp"].crosses_nodes and links["dp"].crosses_nodes
    outer_text = GPT3.replace("  axis dp = 24\n  axis pp = 8\n  axis tp = 8\n", "  axis tp = 8\n  axis dp = 24\n  axis pp = 8\n")
    assert outer_text != GPT3
    _, outer = predict(outer_text)
    links = {k.axis: k for k in outer.links}
    assert links["tp"].crosses_nodes and not links["pp"].crosses_nodes
    # every tp group spanning 8 nodes: the tensor-parallel collectives on the critical path take far longer
    assert outer.step_time_s > 1.5 * inner.step_time_s
    assert outer.exposed_comm_s["tp"] > 5 * inner.exposed_comm_s["tp"]


def test_a_group_that_straddles_nodes_crosses_them():
    from dataclasses import replace as rep

    spec = check_text(GPT3, "g.scale")
    cl = spec.cluster
    plan = spec.plan
    six = rep(plan, axes=(("dp", 256), ("tp", 6)))
    assert LK.links(six, cl)["tp"].crosses_nodes          # ranks 6-11 are on two nodes of 8
    four = rep(plan, axes=(("dp", 384), ("tp", 4)))
    assert not LK.links(four, cl)["tp"].crosses_nodes
    assert LK.links(four, cl)["dp"].crosses_nodes


def test_mesh_figures_override_the_device():
    text = GPT3.replace("device = a100", "device = a100  inter_node_gbps = 100")
    _, slow = predict(GPT3)
    _, fast = predict(text)
    assert fast.exposed_comm_s["dp"] < slow.exposed_comm_s["dp"] / 3
    assert fast.step_time_s < slow.step_time_s


PP = (ROOT / "samples" / "gpt_pp.scale").read_text()


def _pp(schedule: str, v: int = 1, m: int = 8):
    """Eager programs, so that the schedules compare alone (zero-bubble is never compiled: E0611)."""
    text = PP.replace('schedule = "1f1b"', f'schedule = "{schedule}"  compile = false'
                      + (f"  virtual_stages = {v}" if v > 1 else ""))
    text = text.replace("micro_batches = 4", f"micro_batches = {m}")
    assert text != PP
    return predict(text.replace("device = cpu", "device = h100"))


def test_pipeline_schedules_are_simulated():
    c, one = _pp("1f1b")
    _, gpipe = _pp("gpipe")
    _, inter = _pp("interleaved-1f1b", v=2)
    _, zb = _pp("zero-bubble")
    assert 0 < one.bubble_fraction < 0.5
    assert gpipe.step_time_s == pytest.approx(one.step_time_s, rel=0.02)  # same bubble, more memory
    assert inter.bubble_fraction < one.bubble_fraction
    assert zb.step_time_s < one.step_time_s
    # the lower bound a search ranks by never exceeds the exact figure
    bound = SIM.Simulator(c.spec.cluster).predict(c.model, c.plan, c.costs, exact=False)
    assert bound.step_time_s <= one.step_time_s


def test_verify_takes_per_stage_durations_and_transfer_time():
    order = SCH.actions("1f1b", 2, 1)
    tl = SCH.verify(order, SCH.Layout(2, 1, 1), cost={"F": [1.0, 2.0], "B": [3.0, 4.0]}, transfer=0.5)
    # F0 (1) → send (0.5) → F1 (2) → B1 (4) → send (0.5) → B0 (3)
    assert tl.makespan == pytest.approx(1 + 0.5 + 2 + 4 + 0.5 + 3)


def test_prediction_is_consistent():
    c, pred = predict(GPT3)
    world = c.plan.world_size
    assert pred.tokens_per_s == pytest.approx(c.costs.tokens_step / pred.step_time_s)
    assert pred.model_tflops_per_device == pytest.approx(c.costs.flops_step_n / world / pred.step_time_s / 1e12)
    assert pred.mfu == pytest.approx(pred.model_tflops_per_device / 312)
    assert pred.hardware_tflops_per_device > pred.model_tflops_per_device  # full recomputation
    assert max(r.end_s for r in pred.ranks) == pred.step_time_s
    assert math.isclose(sum(pred.as_json()["exposed_comm_s"].values()), sum(pred.exposed_comm_s.values()))


def test_plan_json_carries_the_prediction():
    out = subprocess.run([sys.executable, "-m", "compiler.cli", "plan", "--json", "samples/gpt3_175b.scale"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    got = json.loads(out)["predicted"]
    for key in ("step_time_s", "tokens_per_s", "model_tflops_per_device", "mfu", "bubble_fraction",
                "exposed_comm_s"):
        assert key in got
    assert set(got["exposed_comm_s"]) == {"tp", "pp", "dp"}
    assert 0 < got["mfu"] < 1


def test_pipeline_extrapolation_matches_the_full_simulation():
    """Past STEADY·p·v micro-batches each rank's end grows along a line (simulate.pipeline_ends). With stages within
    ±25% of each other (what the stage balancer makes) the line is the full simulation to rounding, every schedule;
    with stages up to 4× apart, 1F1B, GPipe and zero-bubble still are, interleaving within 1% (its steady state
    takes longer to settle)."""
    import random
    rng = random.Random(3)
    for spread, fb, tol in (((0.8, 1.25), (1.8, 2.2), 1e-9), ((0.5, 2.0), (1.5, 2.5), None)):
        for schedule, vs in (("1f1b", (1,)), ("gpipe", (1,)), ("zero-bubble", (1,)), ("interleaved-1f1b", (2, 3, 6))):
            for p in (2, 4, 8):
                for v in vs:
                    n = p * v
                    f = [rng.uniform(*spread) for _ in range(n)]
                    b = [x * rng.uniform(*fb) for x in f]
                    w = [x * rng.uniform(0.3, 0.6) for x in b]
                    cost = {"F": f, "B": b, "I": [x - y for x, y in zip(b, w)], "W": w}
                    for m in (SIM.STEADY * p * v + 2 * p, SIM.STEADY * p * v + 5 * p):
                        got = SIM.pipeline_ends(schedule, p, m, v, cost, 0.05)
                        tl = SCH.verify(SCH.actions(schedule, p, m, v), SCH.Layout(p, v, m), cost=cost, transfer=0.05)
                        full = {r: max(e for _, e, _ in sp) for r, sp in tl.spans.items()}
                        rel = tol or (1e-2 if schedule == "interleaved-1f1b" else 1e-9)
                        for r in full:
                            assert got[r] == pytest.approx(full[r], rel=rel), (schedule, p, v, m, r, spread)


def test_finish_times_equal_verify():
    """schedule.finish_times (the step-time model's fast path) gives each rank's end as `verify`'s timeline does."""
    import random
    rng = random.Random(5)
    for schedule, vs in (("1f1b", (1,)), ("gpipe", (1,)), ("zero-bubble", (1,)), ("interleaved-1f1b", (2, 3))):
        for p in (1, 2, 3, 4, 8):
            for v in vs:
                for m in sorted({p, 2 * p, 3 * p + (0 if v > 1 else 1)}):
                    n = p * v
                    f = [rng.uniform(0.5, 2.0) for _ in range(n)]
                    b = [x * rng.uniform(1.5, 2.5) for x in f]
                    w = [x * rng.uniform(0.3, 0.6) for x in b]
                    cost = {"F": f, "B": b, "I": [x - y for x, y in zip(b, w)], "W": w}
                    lay = SCH.Layout(p, v, m)
                    tl = SCH.verify(SCH.actions(schedule, p, m, v), lay, cost=cost, transfer=0.2)
                    want = {r: max((e for _, e, _ in sp), default=0.0) for r, sp in tl.spans.items()}
                    got = SCH.finish_times(SCH.compute_order(schedule, lay), lay, cost, 0.2)
                    assert got == pytest.approx(want, rel=1e-12), (schedule, p, v, m)


def test_one_bubble_figure_in_plan_search_and_json(tmp_path, capsys):
    """The bubble is one figure (simulate.bubble_fraction): the slowest rank's simulated idle share of the step, the
    same in `plan`'s text, `plan --json` (predicted and pipeline) and `search` for the same plan; the published
    formula appears only labelled as such. Interleaved pp 2 × v 2, 8 micro-batches: the formula says 5.9%."""
    from compiler.cli import main
    text = PP.replace('schedule = "1f1b"', 'schedule = "interleaved-1f1b"  compile = false  virtual_stages = 2')
    text = text.replace("micro_batches = 4", "micro_batches = 8").replace("device = cpu", "device = h100")
    path = tmp_path / "pp.scale"
    path.write_text(text)
    _, pred = predict(text)
    slow = max(pred.ranks, key=lambda r: r.end_s)
    want = slow.idle_s / slow.end_s
    assert pred.bubble_fraction == want > 0
    assert f"{want:.1%}" != f"{SCH.bubble_fraction(2, 8, 2):.1%}"  # the case tells the two apart
    assert main(["plan", "--json", str(path)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["predicted"]["bubble_fraction"] == got["pipeline"]["bubble_fraction"] == pytest.approx(want)
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"pipeline bubble {want:.1%} (the slowest rank" in out and f"; bubble {want:.1%} (simulated" in out
    assert f"(p-1)/(v·m+p-1) would say {SCH.bubble_fraction(2, 8, 2):.1%}" in out
    fixes = ["pp=2", "dp=1", "tp=1", "virtual_stages=2", "micro_batches=8", "schedule=interleaved-1f1b"]
    assert main(["search", str(path), *[x for f in fixes for x in ("--fix", f)]]) == 0
    out = capsys.readouterr().out
    assert f"pp 2: bubble {want:.1%} at 8 micro-batches" in out
    assert f"{want:.1%}  pp" in out  # the table's column


def test_the_ddp_bucket_is_the_plans():
    """DDP's last bucket waits for the backward to end: its all-reduce is exposed, the others run under the
    backward. The bucket is the Plan's (compiler.plan.Plan.ddp_bucket_bytes, what codegen writes into the program):
    a one-byte bucket leaves next to nothing exposed, one holding every gradient the whole all-reduce, torch's
    default 25 MiB of an 8B model's 32 GB of gradients (reduced in fp32) about 1/1200 of it."""
    import dataclasses
    from compiler.cost import CostModel
    from tests.e2e.runner import with_plan
    text = with_plan((ROOT / "samples" / "llama3_8b.scale").read_text(), data_parallel="ddp")
    spec = check_text(text, "llama3_8b.scale")
    compiled = D.compile_spec(spec)
    assert compiled.plan.data_parallel == "ddp" and compiled.plan.size("pp") == 1
    cm, sim = CostModel(spec, compiled.traced, compiled.plan), SIM.Simulator(spec.cluster)

    def exposed(bucket):
        plan = dataclasses.replace(compiled.plan, ddp_bucket_bytes=bucket)
        return sim.predict(cm, plan, cm.estimate(plan)).exposed_comm_s["dp"]
    default, tiny, whole = exposed(compiled.plan.ddp_bucket_bytes), exposed(1), exposed(10 ** 12)
    assert compiled.plan.ddp_bucket_bytes == 25 * 2 ** 20
    assert tiny < 1e-9 < default < whole / 1000


def test_ring_attention_prices_each_step_as_the_longer_of_its_transfer_and_its_block():
    """context_parallel = ring: each step's send is in flight while the block held is computed (runtime/
    context_parallel.py `_RingAttention`), so a step's exposed communication is max(0, transfer − compute), from the
    model's own transfer and block times; the steps carry the ledger's blocks, 2·(cp − 1) forward, 4·cp − 2 backward."""
    text = (ROOT / "samples" / "llama3_8b_128k.scale").read_text()
    c, pred = predict(text)
    sim = SIM.Simulator(c.spec.cluster)
    plan = c.plan
    env = env_of(plan)
    lk = LK.links(plan, sim.cluster)
    cp, link = plan.size("cp"), lk["cp"]
    mdl = sim.model(c.model)
    key = next(k for k in mdl.segments if isinstance(k, tuple))
    ot = mdl.segments[key].times(env, sim.device, mdl.act)
    assert ot.ring_forward > 0 and ot.ring_backward == pytest.approx(2 * ot.ring_forward)
    sites = {s.direction: f for s, f in mdl.sites if s.op == "send_recv" and s.axis == "cp"}
    block = sites["forward"](env) * mdl.act / (2 * (cp - 1))
    assert sites["backward"](env) * mdl.act / (4 * cp - 2) == pytest.approx(block)
    steps = OT.ring_steps(cp, block, ot.ring_forward, ot.ring_backward, link)
    msg = LK.collective_s("send_recv", 2 * block, link)
    assert [t for t, _ in steps["forward"]] == [msg] * (cp - 1)
    assert sum(t for t, _ in steps["backward"]) == pytest.approx(msg * (2 * cp - 1))  # 4·cp − 2 blocks, 2 a message
    # the compute of the blocks: the own one 2/(cp + 1) of the ring's, each other rank's 1/(cp + 1)
    assert sum(c_ for _, c_ in steps["forward"]) + ot.ring_forward / (cp + 1) == pytest.approx(ot.ring_forward)
    assert sum(c_ for _, c_ in steps["backward"]) == pytest.approx(ot.ring_backward)
    exposed = {d: sum(max(0.0, t - c_) for t, c_ in steps[d]) for d in steps}
    assert OT.ring_exposed(steps["forward"]) == pytest.approx(exposed["forward"])
    piece = sim.pieces(mdl.cm, plan, env, lk)[key]
    others = piece.comm.get("cp", 0.0) - exposed["forward"] - exposed["backward"]
    assert others == pytest.approx(0.0, abs=1e-12)  # the ring's sends are the block's only traffic over cp
    unhidden = sum(t for t, _ in steps["forward"] + steps["backward"])
    assert 0 < exposed["forward"] + exposed["backward"] < unhidden
    assert pred.exposed_comm_s["cp"] == pytest.approx(
        plan.micro_batches * mdl.cm.formulas.counts[key[1]].n * (exposed["forward"] + exposed["backward"]))


def test_ring_steps_expose_only_what_the_transfer_exceeds_the_compute_by():
    link = LK.Link("cp", 4, True, 50.0, 0.0)  # no latency: a message of 2·block bytes takes 2·block / 50e9 s
    block = 25e9 * 1e-3                          # a message takes 1 ms
    steps = OT.ring_steps(4, block, 5e-3, 10e-3, link)
    assert steps["forward"] == [pytest.approx((1e-3, 2e-3)), pytest.approx((1e-3, 1e-3)), pytest.approx((1e-3, 1e-3))]
    assert steps["backward"] == [pytest.approx((1e-3, 4e-3)), pytest.approx((2e-3, 2e-3)), pytest.approx((2e-3, 2e-3)),
                                 pytest.approx((1e-3, 2e-3)), pytest.approx((1e-3, 0.0))]
    assert OT.ring_exposed(steps["forward"]) == 0.0
    assert OT.ring_exposed(steps["backward"]) == pytest.approx(1e-3)  # the gradients' hop home
    slow = OT.ring_steps(4, block, 0.5e-3, 1e-3, link)  # compute shorter than the transfers: the excess shows
    assert OT.ring_exposed(slow["forward"]) == pytest.approx((1e-3 - 0.2e-3) + 2 * (1e-3 - 0.1e-3))
