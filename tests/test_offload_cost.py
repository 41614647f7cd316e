"""Offload priced (compiler/cost/offload.py, compiler/layout/state.py `offloaded`): the rows each setting moves to
the host, each rank's device and host bytes, the host<->device copies in the ledger, the step time with the host
link and the host's AdamW, `plan`'s output, the 70B sample and the search choosing offload where nothing else fits.
Every expected figure is derived here from the bytes each setting moves, not read from the model's output.

The plans are the files' own, evolved with the offload settings; samples/llama3_70b_offload.scale writes its own,
and is compared with itself without it."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from compiler import plan as P
from compiler.check import check_path, check_text
from compiler.cost import activations as A
from compiler.cost import offload as OFF
from compiler.cost.formulas import Formula, env_of
from compiler.cost.op_times import MEMORY_EFFICIENCY
from compiler.cost.step_time import ADAMW_BYTES_PER_PARAM, CLIP_BYTES_PER_PARAM
from compiler.layout import state as ST
from compiler.pipeline import compile_spec
from compiler.report.plan import plan_json, plan_text
from tests.e2e.runner import with_plan

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "llama3_70b_offload.scale"


def _plan(mode="ddp", dp=4, **kw):
    return P.Plan(axes=(("dp", dp),), data_parallel=mode, micro_batches=4, global_batch=8 * dp, seq_len=128, **kw)


def _where(rows, kind, location):
    return [r for r in rows if r.kind == kind and r.location == location and r.params == ST.DENSE]


# -- the rows ---------------------------------------------------------------------------------------------------


def test_optimizer_offload_splits_the_optimizer_rows():
    """bf16 zero1 keeps an fp32 master: f of it and of the moments on the host, 1 - f on the device, and a pinned
    fp32 gradient buffer of f beside them (the master is the parameter the host steps: no second copy)."""
    rows = ST.rows(P.evolve(_plan("zero1"), offload="optimizer", offload_fraction=0.25), "bf16")
    for kind, k in ((ST.MASTER, 4), (ST.MOMENTS, 8)):
        (dev,), (host,) = _where(rows, kind, ST.DEVICE), _where(rows, kind, ST.HOST)
        assert (dev.share, host.share, dev.dtype_bytes, host.group, host.size) == (0.75, 0.25, k, "dp", 4)
    (buf,) = _where(rows, ST.HOST_GRADS, ST.HOST)
    assert (buf.dtype_bytes, buf.share, buf.size) == (4, 0.25, 4)
    assert not _where(rows, ST.HOST_PARAMS, ST.HOST)
    # what the host holds per parameter of the rank's shard (over dp): (4 + 8 + 4) · 0.25
    assert sum(k for _, k in rows.terms(None, location=ST.HOST)) == 16 * 0.25
    # fp32 ddp has no master: the host steps its own fp32 copy of the parameters; all of it at f = 1
    rows = ST.rows(P.evolve(_plan("ddp"), offload="optimizer", offload_fraction=1.0), "fp32")
    assert not _where(rows, ST.MOMENTS, ST.DEVICE)
    assert [r.dtype_bytes for r in rows if r.location == ST.HOST and r.params == ST.DENSE] == [8, 4, 4]


def test_parameter_offload_moves_fsdp_sharded_state():
    """FSDP2's CPUOffloadPolicy: the sharded fp32 parameter, its sharded gradient and the moments on the host; the
    gathered bf16 units and a unit's whole gradient before its reduce-scatter stay on the device."""
    rows = ST.rows(P.evolve(_plan("fsdp"), offload="params"), "bf16")
    on = {r.kind: r.location for r in rows if r.params == ST.DENSE}
    assert on == {ST.COMPUTE: ST.DEVICE, ST.WEIGHTS: ST.HOST, ST.GRADS: ST.DEVICE, ST.MAIN_GRADS: ST.HOST,
                  ST.MOMENTS: ST.HOST}


# -- memory, ledger and step time of a small fp32 program ------------------------------------------------------


@pytest.fixture(scope="module")
def gpt():
    """gpt_dp (fp32, ddp over dp 2, cpu) with six layers, so that activation offload's window (two blocks) leaves
    some on the host; its trace shared by every variant."""
    text = (ROOT / "samples" / "gpt_dp.scale").read_text().replace("layers = 2", "layers = 6")
    spec = check_text(text, "samples/gpt_dp.scale")
    base = compile_spec(spec)

    def with_(**kw):
        return compile_spec(spec, plan=P.evolve(spec.plan, **kw), unsharded=base.unsharded)
    return spec, base, with_


def _host(costs):
    return {c.op: c for c in costs.ledger.entries if c.axis == OFF.HOST}


@pytest.mark.parametrize("f", [0.5, 1.0])
def test_optimizer_offload_fp32(gpt, f):
    spec, base, with_ = gpt
    got = with_(offload="optimizer", offload_fraction=f)
    n = base.costs.params_rank  # ddp: the rank's optimizer holds every parameter
    r0, r = base.costs.memory[0], got.costs.memory[0]
    assert r0.host is None
    assert r.optimizer == pytest.approx(r0.optimizer - 8 * f * n)  # f of the two fp32 moments leave the device
    assert r.peak == pytest.approx(r0.peak - 8 * f * n)
    assert r.host == pytest.approx(16 * f * n)  # moments 8 + pinned gradients 4 + the host's fp32 parameters 4
    copies = _host(got.costs)
    # fp32 both ways, of the whole tensors HostAdamW takes: at least f of the shard, all of it at f = 1 (which
    # tensors: test_optimizer_offload_copies_the_runtimes_whole_tensors)
    moved = copies["d2h"].bytes / 4
    assert copies["h2d"].bytes == copies["d2h"].bytes and f * n <= moved <= n and (f < 1 or moved == n)
    dev = spec.cluster.device
    device_adam = n * (ADAMW_BYTES_PER_PARAM + CLIP_BYTES_PER_PARAM) / (dev.hbm_gbps * 1e9 * MEMORY_EFFICIENCY)
    chain = 8 * moved / (dev.host_gbps * 1e9) + f * n / dev.host_adam_params_per_s
    pred, pred0 = got.costs.step, base.costs.step
    assert pred0.optimizer_s == pytest.approx(device_adam)
    assert pred.optimizer_s == pytest.approx(max((1 - f) * device_adam, chain))
    assert pred.host_step_s == pytest.approx(f * n / dev.host_adam_params_per_s)
    assert pred.step_time_s - pred0.step_time_s == pytest.approx(pred.optimizer_s - pred0.optimizer_s)


OPTIMIZER_CASES = {
    # name: (sample, plan fields, the module the ledger's rank holds: the whole Model, or pp rank 0's Stage(0))
    "dp2_ddp": ("gpt_dp.scale", {}, None),
    "dp2_zero1": ("gpt_dp.scale", {"data_parallel": "zero1"}, None),
    "pp2_tp2": ("gpt_3d.scale", {"axes": (("dp", 1), ("pp", 2), ("tp", 2))}, 0),
    "dp2_zero1_pp2": ("gpt_3d.scale", {"axes": (("dp", 2), ("pp", 2), ("tp", 1)), "data_parallel": "zero1"}, 0),
}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("f", [0.3, 0.5, 1.0])
@pytest.mark.parametrize("case", sorted(OPTIMIZER_CASES))
def test_optimizer_offload_copies_the_runtimes_whole_tensors(tmp_path, case, f, precision):
    """The ledger's optimizer copies are the parameters runtime.offload.HostAdamW puts on the host, whole tensors
    (not f of the shard): on the generated program's own module (the ledger's rank: the model, or pp rank 0's
    stage, tp-sharded as built), HostAdamW over the runtime's param groups without zero1 (one process, no group:
    every parameter is the rank's), and under zero1 the runtime's partition of the same list (dp rank 0's, as
    HostAdamW computes it) and its prefix. Bytes: fp32 gradients down (bf16: its fp32 main gradients) and the
    parameters back in their dtype; an fp32 step measured through runtime.offload's counts."""
    import torch

    from runtime import offload, precision as PR
    sample, fields, stage = OPTIMIZER_CASES[case]
    text = (ROOT / "samples" / sample).read_text().replace("precision    = fp32", f"precision    = {precision}")
    world = {"gpt_dp.scale": 2, "gpt_3d.scale": 4}[sample]
    text = with_plan(text, sample, devices_per_node=world, offload="optimizer", offload_fraction=f, **fields)
    spec = check_text(text, sample)
    got = compile_spec(spec)
    host = _host(got.costs)
    assert host["d2h"].measured and host["h2d"].measured
    prog = _program(tmp_path, got)
    torch.manual_seed(0)
    module = prog.Model() if stage is None else prog.Stage(stage)
    groups = PR.decay_groups([p for _, p in module.named_parameters()], 0.1)
    params = [p for g in groups for p in g["params"]]
    if got.plan.data_parallel == "zero1":
        owner = PR.partition(params, got.plan.size("dp"))
        chosen = offload.host_share([p for p, r in zip(params, owner) if r == 0], f)
    else:
        chosen = offload.HostAdamW(groups, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, fraction=f).host
    elements = sum(p.numel() for p in chosen)
    assert 0 < elements and (f == 1.0 or elements < sum(p.numel() for p in params))
    w = 2 if precision == "bf16" else 4
    assert (host["d2h"].bytes, host["h2d"].bytes) == (4 * elements, w * elements)
    assert int(spec.value(host["d2h"].bytes_per_step(), got.plan)) == host["d2h"].bytes  # plan.json's figure
    if precision == "fp32" and got.plan.data_parallel != "zero1":
        opt = offload.HostAdamW(groups, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, fraction=f)
        for p in params:
            p.grad = torch.ones_like(p)
        offload.reset()
        opt.step()
        assert offload.counts() == {"d2h": host["d2h"].bytes, "h2d": host["h2d"].bytes}


def test_parameter_offload_fsdp(gpt):
    spec, base, with_ = gpt
    fsdp = with_(data_parallel="fsdp")
    got = with_(data_parallel="fsdp", offload="params")
    n = got.costs.params_rank / 2  # the rank's shard over dp 2
    r0, r = fsdp.costs.memory[0], got.costs.memory[0]
    assert r.optimizer == 0 and r0.optimizer == pytest.approx(8 * n)
    assert r.host == pytest.approx(16 * n)  # fp32 shard 4 + its gradient 4 + moments 8
    m = got.plan.micro_batches
    copies = _host(got.costs)
    assert copies["h2d"].bytes == int(4 * n * 2 * m)  # each shard before each gather, forward and backward
    assert copies["d2h"].bytes == int(4 * n)  # the gradient shard after the one reduce-scatter
    dev = spec.cluster.device
    pred = got.costs.step
    assert pred.host_step_s == pytest.approx(n / dev.host_adam_params_per_s) == pytest.approx(pred.optimizer_s)
    # the copies run under the compute (milliseconds beside µs): one unit's copy of the 6 blocks and the root is
    # exposed
    total = sum(c.bytes for c in copies.values()) / (dev.host_gbps * 1e9)
    calls = sum(c.times for c in copies.values())
    assert pred.host_copy_s == pytest.approx(total / (calls * 7))


def _program(tmp_path, compiled):
    """`compiled`'s generated program, imported."""
    import importlib.util

    from compiler import codegen
    out = tmp_path / "build"
    codegen.emit(compiled, str(out))
    spec = importlib.util.spec_from_file_location(f"prog_{abs(hash(str(out)))}", out / "program.py")
    prog = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prog)
    return prog


def _hooked_bytes(tmp_path, compiled, modules: tuple) -> int:
    """The bytes runtime.offload's hooks copy to the host in one forward and backward of `compiled`'s generated
    Model at its micro-batch size (every save of a chosen op, a tensor two ops save twice), measured on CPU."""
    import torch

    from runtime import offload
    prog = _program(tmp_path, compiled)
    torch.manual_seed(0)
    model = prog.Model()
    offload.install(model, modules)
    b, cfg = compiled.plan.micro_batch_size, prog.CONFIG
    tokens, targets = (torch.randint(0, cfg.data.vocab, (b, cfg.data.seq_len)) for _ in range(2))
    offload.reset()
    model(tokens, targets).backward()
    got = offload.counts()
    assert got["d2h"] == got["h2d"] > 0
    return got["d2h"]


def test_activation_offload(gpt, tmp_path):
    """Every module: the ledger's copies are what the hooks copy, measured (each save, so a norm's output the
    three attention projections save crosses three times); the device is relieved of each storage once (the
    block's saved bytes, the memory model's formula, tests/test_memory.py) and the host holds the copies."""
    spec, base, with_ = gpt
    got = with_(offload="activations")
    block = next(iter(base.traced.blocks.values()))
    env = env_of(got.plan)
    per = Formula(A.block_saved_bytes(block, "fp32", "cpu"), base.model.formulas.sub)(env)
    layers, m = 6, got.plan.micro_batches
    hooked = _hooked_bytes(tmp_path, got, ())
    assert hooked > layers * per  # the projections' shared input, copied once per save
    copies = _host(got.costs)
    assert copies["d2h"].bytes == copies["h2d"].bytes == hooked * m
    assert copies["d2h"].measured and copies["h2d"].measured
    r0, r = base.costs.memory[0], got.costs.memory[0]
    assert r.host == pytest.approx(hooked)  # one micro-batch in flight
    assert r.activations == pytest.approx(r0.activations - layers * per + 2 * per)  # two blocks in flight of a copy
    # a subset: its modules' share of a block, less than the whole (the norms and the residual adds stay); both
    # named, still less (the norms' saves stay), and what the hooks copy
    both = with_(offload="activations", offload_modules=("attention", "mlp"))
    assert _host(both.costs)["d2h"].bytes == _hooked_bytes(tmp_path / "both", both, ("attention", "mlp")) * m
    mlp = _host(with_(offload="activations", offload_modules=("mlp",)).costs)["d2h"].bytes
    attention = _host(with_(offload="activations", offload_modules=("attention",)).costs)["d2h"].bytes
    assert 0 < mlp < copies["d2h"].bytes and 0 < attention < copies["d2h"].bytes
    assert mlp + attention == _host(both.costs)["d2h"].bytes < copies["d2h"].bytes


def test_plan_output_under_offload(gpt):
    spec, base, with_ = gpt
    got = with_(offload="optimizer", offload_fraction=0.5)
    text = plan_text(got)
    assert re.search(r"AdamW +activations +working +peak +host", text)
    assert "optimizer offload 50%: the host's AdamW" in text and "host link 19.9 GB/s" in text
    assert re.search(r"\n  d2h +host +step +×1 +host link", text)
    doc = plan_json(got)
    assert doc["memory"]["host_peak_bytes"] == int(got.costs.memory[0].host)
    assert doc["memory"]["ranks"][0]["host_peak_bytes"] == int(got.costs.memory[0].host)
    assert doc["predicted"]["host_step_s"] == got.costs.step.host_step_s
    assert doc["plan"]["offload"] == "optimizer" and doc["plan"]["offload_fraction"] == 0.5
    plain = plan_json(base)  # without offload plan.json keeps its keys
    assert "host_peak_bytes" not in plain["memory"] and "offload" not in plain["plan"]


# -- the 70B sample ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama70():
    spec = check_path(str(SAMPLE))
    assert spec.plan.offload == "optimizer", "the sample writes its offload"
    got = compile_spec(spec)
    base = compile_spec(spec, plan=P.evolve(spec.plan, offload="none", offload_fraction=1.0),
                        unsharded=got.unsharded)
    return spec, base, got


def test_the_70b_sample_fits_16_h100_only_with_optimizer_offload(llama70):
    spec, base, got = llama70
    f = got.plan.offload_fraction
    assert f == 0.5
    limit = spec.cluster.device.memory_gb * 1e9
    assert base.costs.peak_bytes > limit and got.costs.peak_bytes < 0.9 * limit
    for r0, r, st in zip(base.costs.memory, got.costs.memory, got.costs.stages):
        n = st.params  # bf16 ddp under pp: the rank's optimizer holds its stage's parameters
        assert r.optimizer == pytest.approx(12 * (1 - f) * n)  # fp32 master 4 + moments 8, half on the device
        assert r.host == pytest.approx(16 * f * n)  # master 4 + moments 8 + pinned fp32 gradients 4
    n = got.costs.params_rank
    copies = _host(got.costs)
    # fp32 main gradients down, the bf16 weights the host updated up: of the whole tensors HostAdamW takes, the
    # ≥2-D ones first (the embedding, then each block's seven matrices) until half the rank's elements
    moved = copies["d2h"].bytes / 4
    assert copies["h2d"].bytes == 2 * moved and f * n <= moved < f * n + 8192 * 28672 / 8  # an MLP matrix at most
    dev = spec.cluster.device
    chain = 6 * moved / (dev.host_gbps * 1e9) + f * n / dev.host_adam_params_per_s
    device_adam = n * (ADAMW_BYTES_PER_PARAM + CLIP_BYTES_PER_PARAM) / (dev.hbm_gbps * 1e9 * MEMORY_EFFICIENCY)
    rank0 = got.costs.step.ranks[0]
    assert rank0.tail_s == pytest.approx(max((1 - f) * device_adam, chain))
    for r0, r in zip(base.costs.step.ranks, got.costs.step.ranks):  # the same pipeline; only the tail differs
        assert r.end_s - r0.end_s == pytest.approx(r.tail_s - r0.tail_s)
    text = plan_text(got)
    assert "optimizer offload 50%: the device columns are what stays on the device" in text
    assert "fits: 71% of the 80 GB" in text


def test_activation_offload_under_pp(llama70):
    """Full recomputation keeps each block's input (the bf16 residual stream, sequence-sharded over tp): pp rank 0
    holds 41 blocks of 2 micro-batches in flight (1F1B: p - rank) and sends all but two blocks' to the host."""
    spec, base, _ = llama70
    got = compile_spec(spec, plan=P.evolve(spec.plan, offload="activations"), unsharded=base.unsharded)
    per = 2 * 8192 * 1 * 8192 / 8
    r0, r = base.costs.memory[0], got.costs.memory[0]
    blocks = got.costs.stages[0].blocks
    moved = 2 * (blocks[1] - blocks[0]) * per
    assert r.host == pytest.approx(moved)
    assert r.activations == pytest.approx(r0.activations - moved + 2 * per)


# -- the search -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small():
    """gpt_dp's model on two cpu devices of 1 MB: no plan fits without offload."""
    from compiler.candidates import Candidates
    spec = check_path(str(ROOT / "samples" / "gpt_dp.scale"), cluster_only=True)
    device = dataclasses.replace(spec.cluster.device, memory_gb=0.001)
    spec = spec.on(dataclasses.replace(spec.cluster, device=device))
    return spec, Candidates(spec)


def test_search_finds_offload_where_nothing_else_fits(small):
    from compiler.search import search
    spec, cands = small
    assert not search(spec, fixed={"offload": "none"}, cands=cands).winners
    found = search(spec, cands=cands)
    assert found.winners and all(w.plan.offload != "none" for w in found.winners)
    best = found.winners[0]
    assert best.peak_bytes <= 0.9 * 1e6
    assert any(re.match(r"(optimizer|parameter|activation) offload.* fits 110.3 k parameters on 2 cpu at "
                        r"[0-9.]+× the step time; without it", x) for x in best.reasons)
    fixed = search(spec, fixed={"offload": "optimizer"}, cands=cands)
    assert fixed.winners and all(w.plan.offload == "optimizer" for w in fixed.winners)


def test_search_says_when_offload_does_not_help(small):
    from compiler.search import search
    spec, _ = small
    tiny = spec.on(dataclasses.replace(spec.cluster, device=dataclasses.replace(spec.cluster.device,
                                                                                  memory_gb=0.0006)))
    got = search(tiny)
    assert not got.winners and got.rejected[-1].startswith("offload does not make it fit either: its least is")
    assert " offload" in got.rejected[-1]


def test_fix_offload_is_read():
    from compiler.search.space import FixError, parse_fixes
    assert parse_fixes(["offload=params"]) == {"offload": "params"}
    with pytest.raises(FixError):
        parse_fixes(["offload=nvme"])


def test_energy_counts_exposed_copies_as_communicating(gpt):
    """Parameter offload's exposed copies come after the compute (step_time.py): the device waits in them, at its
    communicating power, and its active time is its compute and tail alone."""
    from compiler.cost import energy
    spec, base, with_ = gpt
    got = with_(data_parallel="fsdp", offload="params")
    rank = got.costs.step.ranks[0]
    host = rank.exposed_comm_s["host"]
    assert host > 0
    active, communicating, bubble, waiting = energy.phases(rank, got.costs.step.step_time_s)
    inside = sum(t for a, t in rank.exposed_comm_s.items() if a != "host") - rank.sync_s
    assert active == pytest.approx(rank.compute_s - inside + rank.tail_s)
    assert communicating == pytest.approx(inside + rank.sync_s + host)


def test_host_step_bench_measures_both_figures(capsys):
    """bench/host_step.py: its last line is the JSON record devices.py's figures come from."""
    import json

    from bench import host_step
    record = host_step.main(["--params", str(1 << 20), "--repeats", "1"])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last == record
    assert last["host_adam_params_per_s"] > 0 and last["copy_gbps"] > 0 and last["adamw"] in ("foreach", "fused")


def test_plan_says_offload_would_fit(llama70):
    """`plan` on the 70B sample without its offload: E0501, and among what would fit, optimizer offload (after the
    changes that add no host work), at the peak the evolved plan has."""
    from compiler import fit
    spec, base, got = llama70
    found = {f.change: f for f in fit.advice(base)}
    half = found["offload = optimizer(fraction = 0.5)"]
    assert half.fits and half.peak == got.costs.peak_bytes
    fits = [f.change for f in fit.advice(base) if f.fits]
    assert fits.index("offload = optimizer(fraction = 0.5)") >= len([c for c in fits if not c.startswith("offload")])
    assert "would fit: offload = optimizer(fraction = 0.5)" in plan_text(base)
