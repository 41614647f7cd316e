"""`precision = fp8(recipe, filter)` without running a program: the shape rule (runtime.choices), which linears the
compiler and the runtime choose, the models (compiler/cost/fp8.py: step time, the ledger's FSDP gathers, the
gathered units' bytes), the checks (compiler/fp8_checks.py) and the runtime's pieces (runtime/fp8.py) in one
process. The 200-step loss curve and the FSDP gathers measured: tests/e2e/test_fp8.py."""
from __future__ import annotations

import math
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch import nn

from compiler import fp8_checks
from compiler.check import check_text
from compiler.cost import fp8 as FP8
from compiler.diagnostics import ScaleError
from compiler.layout.devices import DEVICES
from compiler.pipeline import compile_checked, compile_spec
from runtime import choices, collectives
from runtime import fp8 as RT
from runtime.config import Config, Data, Optim, Parallel
from runtime.errors import FatalError
from runtime.layers import Repeat
from tests.e2e.test_fp8 import _text


# -- the shape rule ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n, k, pays", [
    (1024, 4096, False),   # tensorwise loses where K <= 4096 and N <= 1024
    (1040, 4096, True), (1024, 4112, True), (4096, 4096, True),
    (4104, 8192, False),   # N not a multiple of 16: no FP8 kernel
])
def test_tensorwise_rule(n, k, pays):
    assert choices.fp8_pays("tensorwise", n, k) is pays


@pytest.mark.parametrize("n, k, pays", [
    (2048, 8192, False),   # N <= 2048
    (8192, 1024, False),   # K <= 1024
    (4096, 2048, False),   # N <= 4096 and K <= 2048
    (4096, 2064, True), (4112, 2048, True), (8192, 8192, True),
])
def test_rowwise_rule(n, k, pays):
    assert choices.fp8_pays("rowwise", n, k) is pays


def test_filter_all_takes_every_shape_fp8_kernels_take():
    assert choices.fp8_chosen("tensorwise", "all", 32, 48)
    assert not choices.fp8_chosen("tensorwise", "all", 30, 32)
    assert not choices.fp8_chosen("tensorwise", "auto", 32, 48)
    with pytest.raises(ValueError):
        choices.fp8_chosen("delayed", "auto", 4096, 4096)


# -- which linears: the compiler's and the runtime's ---------------------------------------------------------------

def test_tp_keeps_row_parallel_linears_in_bf16():
    """Under tp the row-parallel linears (attn_o, mlp_down) run as F.linear around their all-reduce: not converted,
    not priced; the column-parallel ones are, at their shard's shape."""
    text = open("samples/gpt_tp.scale").read().replace("precision    = fp32", "precision    = fp8(filter = all)")
    assert "fp8(filter = all)" in text
    compiled = compile_spec(check_text(text, "gpt_tp.scale"))
    got = FP8.linears(compiled.traced, compiled.spec.train.fp8)["blocks"]
    assert [(x.name, x.n, x.k) for x in got] == [("attn_q", 32, 64), ("attn_k", 32, 64), ("attn_v", 32, 64),
                                                  ("mlp_up", 128, 64)]
    assert "8 of the blocks' 12 linears in FP8 (no FP8 rate on cpu" in FP8.describe(compiled)[0]  # `plan`'s line


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(64, 32)   # column-parallel shard
        self.o = nn.Linear(32, 64)   # row-parallel shard
        self.odd = nn.Linear(64, 24)  # not a multiple of 16


def test_runtime_chooses_block_linears_by_the_same_rule():
    model = nn.Module()
    model.blocks = Repeat(_Block() for _ in range(2))
    model.head = nn.Linear(64, 64)  # outside the blocks: stays bf16
    row = lambda name: name.endswith(".o.weight")  # noqa: E731
    assert RT.chosen(model, "tensorwise", "all", row) == ["blocks.0.q", "blocks.1.q"]
    assert RT.chosen(model, "tensorwise", "auto", row) == []
    with torch.device("meta"):
        meta = nn.Module()
        meta.blocks = Repeat(_Block() for _ in range(1))
    assert RT.convert(meta, "tensorwise", "all", fsdp_all_gather=False) == ["blocks.0.o", "blocks.0.q"]
    assert type(meta.blocks[0].q).__name__ == "Float8Linear" and type(meta.blocks[0].odd) is nn.Linear


# -- the models ----------------------------------------------------------------------------------------------------

def _device(kind: str) -> SimpleNamespace:
    """A device as the step-time model reads it (spec.Device): its kind and datasheet figures."""
    return SimpleNamespace(kind=kind, **vars(DEVICES[kind]))


def test_fp8_matmuls_save_on_h100_and_cost_on_cpu():
    x = FP8.Linear("up", 8192, 8192, 0)
    m = 8192
    h100 = _device("h100")
    fwd, bwd = FP8.block_seconds((x,), (m,), h100)
    one = 2 * m * 8192 * 8192 / (h100.peak_tflops * 1e12 * h100.matmul_efficiency)
    cast_f = (m * 8192 + 8192 * 8192) * FP8.CAST_BYTES / (h100.hbm_gbps * 1e9)
    assert math.isclose(fwd, cast_f - one / 2)  # half the matmul's time saved, the casts paid
    assert bwd < 0 and fwd < 0
    fwd, bwd = FP8.block_seconds((x,), (m,), _device("cpu"))  # no FP8 rate: the casts alone
    assert fwd > 0 and bwd > 0
    tiny = FP8.Linear("q", 32, 32, 0)  # eager, a small cast costs its ops' overhead, not its bytes
    fwd, bwd = FP8.block_seconds((tiny,), (64,), h100, compiled=False)
    floor = FP8.CAST_OPS * h100.op_overhead_us * 1e-6
    assert math.isclose(fwd + bwd, 6 * floor, rel_tol=1e-3)  # 2 casts forward, 4 backward; the matmuls ~free


def _fsdp(precision: str):
    return compile_spec(check_text(_text(precision, dp=2, layers=2, plan="plan { data_parallel = fsdp }"),
                                   "fsdp.scale"))


def test_ledger_gathers_the_chosen_weights_in_fp8():
    fp8, bf16 = _fsdp("fp8(filter = all)"), _fsdp("bf16")

    def gathered(c):
        return sum(e.bytes for e in c.costs.ledger.entries if e.op == "all_gather" and e.axis == "dp")
    elements = 2 * (4 * 32 * 32 + 2 * 32 * 128)  # 2 blocks: q, k, v, o and the mlp's two
    assert FP8.weight_elements(fp8.traced, fp8.spec.train.fp8) == {"blocks": elements // 2}
    # gathered twice a step (forward, backward): one byte an element less than bf16's
    assert gathered(bf16) - gathered(fp8) == 2 * elements
    amax = [e for e in fp8.costs.ledger.entries if e.op == "all_reduce" and "amax" in e.reason]
    assert [e.bytes for e in amax] == [2 * 12 * 4]  # one fp32 per chosen weight per gather
    grads = [e.bytes for c in (fp8, bf16) for e in c.costs.ledger.entries if e.op == "reduce_scatter"]
    assert grads[0] == grads[1]  # gradients reduce-scattered in fp32 either way
    # the gathered units (root + a block and the next, prefetched) hold the FP8 weights in a byte
    assert FP8.gathered_saving(fp8.model, fp8.plan) == elements // 2
    # ... and the backward's working set holds the largest linear's FP8 copies: mlp_up's, M = 2 × 16 tokens (env:
    # dp, tp, ep, pp, µb = 2, cp), N = 128, K = 32: 2·M·N + N·K + M·K bytes
    casts = 2 * 32 * 128 + 128 * 32 + 32 * 32
    assert FP8.cast_bytes(fp8.model, (2, 1, 1, 1, 2, 1)) == casts
    assert bf16.costs.peak_bytes - fp8.costs.peak_bytes == 2 * elements // 2 - casts


def test_rowwise_gathers_bf16():
    c = _fsdp("fp8(recipe = rowwise, filter = all)")
    assert not [e for e in c.costs.ledger.entries if "float8" in e.reason]


# -- the checks ----------------------------------------------------------------------------------------------------

def test_missing_torchao_is_refused_at_the_setting(monkeypatch):
    monkeypatch.setattr(fp8_checks, "torchao_missing", lambda: "torchao is not installed")
    text = _text("fp8()")
    with pytest.raises(ScaleError) as e:
        check_text(text, "x.scale")
    (d,) = e.value.diagnostics
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "precision" in t)
    assert d.code == "E0390" and (d.span.line, d.span.col) == (line, 15)


def test_cpu_without_float8_matmul_is_refused(monkeypatch, tmp_path):
    path = tmp_path / "x.scale"
    path.write_text(_text("fp8(filter = all)"))
    compile_checked(str(path))
    monkeypatch.setattr(fp8_checks, "cpu_scaled_mm", lambda: "torch 2.11: no CPU kernel")
    with pytest.raises(ScaleError) as e:
        compile_checked(str(path))
    assert [d.code for d in e.value.diagnostics] == ["E0391"]


# -- the runtime's pieces ------------------------------------------------------------------------------------------

def test_config_takes_fp8_under_bf16_only():
    base = dict(name="m", source="m.scale", steps=1, seed=0, parallel=Parallel(axes=(("dp", 1),)), optim=Optim(lr=1e-3),
                data=Data(global_batch=1, seq_len=1, vocab=2))
    Config(precision="bf16", fp8="tensorwise", fp8_filter="all", **base)
    for bad in (dict(precision="fp32", fp8="tensorwise"), dict(precision="bf16", fp8="delayed")):
        with pytest.raises(ValueError):
            Config(**bad, **base)


def test_missing_torchao_ends_the_run_with_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao.float8", None)  # import fails
    with pytest.raises(FatalError, match=r"pip install 'scalec\[fp8\]'"):
        RT._float8()


def test_byte_all_gather_moves_float8_over_gloo(tmp_path):
    """gloo has no float8 dtypes: the gather moves the bytes as uint8, and counts them."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        x = torch.randn(8).to(torch.float8_e4m3fn)
        out = torch.empty(8, dtype=torch.float8_e4m3fn)
        collectives.count_bytes(True)
        RT.byte_all_gather("dp")(out, x, dist.group.WORLD)
        assert torch.equal(out.view(torch.uint8), x.view(torch.uint8))
        assert collectives.BYTES[("all_gather", "dp")] == 8
    finally:
        collectives.count_bytes(False)
        dist.destroy_process_group()
