"""`plan { recompute = none | selective | full }`: the setting reaches the program, the three modes train the same
model (same loss and gradients), and they keep what runtime/recompute.py says alive after a forward, counted on the
generated tiny_gpt program on CPU. Selective recomputation re-runs only the all-gathers (sequence-parallel inputs,
kept sharded as Megatron does); full re-runs every collective."""
from __future__ import annotations

import contextlib
import types
from pathlib import Path

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from compiler import codegen
from compiler.check import check_text
from compiler.diagnostics import ScaleError
from compiler.pipeline import compile_spec
from runtime.parallelize import apply_recompute
from runtime.layers import Repeat, init_parameters

ROOT = Path(__file__).resolve().parents[1]
TINY = (ROOT / "samples" / "tiny_gpt.scale").read_text()
B, S, H, L = 8, 64, 64, 2  # tiny_gpt: global_batch, seq_len, hidden, layers (ffn = 4·hidden)


def _with_plan(text: str, line: str) -> str:
    return text.replace("mesh {", f"plan {{\n  {line}\n}}\n\nmesh {{", 1)


def _program(text: str, tmp_path) -> str:
    compiled = compile_spec(check_text(text, str(tmp_path / "tiny.scale")))
    return codegen.program(compiled.spec, compiled.traced, compiled.costs, compiled.plan, str(tmp_path / "build"))


def _module(source: str) -> types.ModuleType:
    mod = types.ModuleType("tiny_program")
    exec(compile(source, "program.py", "exec"), mod.__dict__)
    return mod


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return _module(_program(TINY, tmp_path_factory.mktemp("tiny")))


def test_setting_reaches_the_program(tmp_path):
    for mode in ("selective", "full"):
        mod = _module(_program(_with_plan(TINY, f"recompute = {mode}"), tmp_path))
        assert mod.CONFIG.parallel.recompute == mode
    default = _program(TINY, tmp_path)
    assert "recompute" not in default  # not written when off: programs without it are unchanged
    assert _module(default).CONFIG.parallel.recompute == "none"


def test_unknown_mode_is_a_located_choice_diagnostic():
    text = _with_plan(TINY, "recompute = partial")
    with pytest.raises(ScaleError) as info:
        check_text(text, "tiny.scale")
    (d,) = info.value.diagnostics
    line = text.splitlines().index("  recompute = partial") + 1
    assert d.code == "E0111" and (d.span.line, d.span.col) == (line, 15)
    assert "`full`, `none`, `selective`" in str(d.help)


def _model(tiny, mode: str):
    model = tiny.Model()
    init_parameters(model, seed=7, std=0.02, residual_out=tiny.CONFIG.init.residual_out, layers=L)
    return apply_recompute(model, mode)


def _batch():
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, 128, (B, S), generator=g), torch.randint(0, 128, (B, S), generator=g)


def _loss_and_grads(tiny, mode: str, autocast: bool):
    model = _model(tiny, mode)
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with ctx:
        loss = model(*_batch())
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["selective", "full"])
def test_modes_give_the_gradients_of_none(tiny, mode, autocast):
    ref_loss, ref = _loss_and_grads(tiny, "none", autocast)
    loss, grads = _loss_and_grads(tiny, mode, autocast)
    assert torch.equal(loss, ref_loss)
    assert grads.keys() == ref.keys() and all(g is not None for g in grads.values())
    for name in ref:  # the recomputed forward is the same arithmetic: equal up to 1e-6 (in practice bitwise)
        torch.testing.assert_close(grads[name], ref[name], rtol=1e-6, atol=1e-9, msg=name)


class _Alive(TorchDispatchMode):
    """Records the storage of every op output, and whether a block (of the model's Repeat) was running."""

    def __init__(self):
        super().__init__()
        self.made, self.in_block = [], False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                self.made.append((st.data_ptr(), StorageWeakRef(st), st.nbytes(), self.in_block))
        return out

    def alive(self, exclude) -> dict:
        """{storage address: (bytes, made in a block)} of the outputs still alive, parameters excluded."""
        out = {}
        for ptr, ref, n, in_block in self.made:
            if not ref.expired() and ptr not in exclude and ptr not in out:
                out[ptr] = (n, in_block)
        return out


def alive_after_forward(tiny, mode: str, autocast: bool) -> tuple[int, int]:
    """(bytes alive after the forward, of them made inside the blocks): what the forward leaves for the backward,
    the loss and the autocast copies included, counted per storage."""
    model = _model(tiny, mode)
    rec = _Alive()
    for block in model.blocks.values():
        block.register_forward_pre_hook(lambda *a: setattr(rec, "in_block", True))
        block.register_forward_hook(lambda *a: setattr(rec, "in_block", False))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with rec, ctx:
        loss = model(*_batch())
    alive = rec.alive(params)
    del loss
    return sum(n for n, _ in alive.values()), sum(n for n, b in alive.values() if b)


# Bytes made inside the blocks and alive after the forward, per block (notes11/recompute.md names each tensor).
# Counted under the block that makes them, so a block's input is its predecessor's output, the last block's output is
# the final norm's saved input, and block 0's input (the embedding sum) is made outside the blocks. tiny_gpt has 4
# heads, biases, layernorm and gelu; B·S·H units: fp32 4 bytes each, bf16 2.
BSH = B * S * H
STATS = B * 4 * S * 4 + 4 * B * S * 4  # fp32 attention log-sum-exp (B, heads, S), 2 norms' mean and rstd (B, S, 1)
PER_BLOCK = {
    # output (fp32 residual stream)
    ("full", False): BSH * 4,
    ("full", True): BSH * 4,
    # output; q, k, v, o, mlp_up (4 units), mlp_down: the matmul outputs, bf16 under autocast
    ("selective", False): BSH * 4 + 9 * BSH * 4,
    ("selective", True): BSH * 4 + 9 * BSH * 2,
    # norm_1 out, q, k, v, attention out, the inner residual, norm_2 out, mlp_up (4), gelu (4), output; statistics
    ("none", False): 16 * BSH * 4 + STATS,
    # the bf16 casts of norm_1 out (one per q, k, v linear) and of norm_2 out, q, k, v, attention out, mlp_up (4),
    # gelu (4) in bf16; the inner residual and the output in fp32; statistics; and the bf16 copies autocast made
    # of the block's 6 weight matrices (4·H² + 2·4H·H elements)
    ("none", True): (3 + 1 + 3 + 1 + 4 + 4) * BSH * 2 + 2 * BSH * 4 + STATS + 12 * H * H * 2,
}


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
def test_full_keeps_less_than_selective_keeps_less_than_none(tiny, autocast):
    counted = {mode: alive_after_forward(tiny, mode, autocast) for mode in ("none", "selective", "full")}
    assert counted["full"][0] < counted["selective"][0] < counted["none"][0]
    for mode, (_, in_blocks) in counted.items():
        assert in_blocks == L * PER_BLOCK[(mode, autocast)], mode
    # Outside the blocks every mode keeps the same: the embedding sum, the final norm's and the head's tensors, the loss.
    outside = {mode: total - in_blocks for mode, (total, in_blocks) in counted.items()}
    assert outside["full"] == outside["selective"] == outside["none"]


# -- collectives under recomputation (two gloo processes) ---------------------------------------------------------


class _CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        self.calls[name] = self.calls.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


class _TpBlock(torch.nn.Module):
    """A row-parallel linear's all-reduce, then an op that saves its output (sin), then a matmul, and a
    sequence-parallel all-gather: backward needs the all-reduce's and the all-gather's outputs again."""

    def __init__(self, collectives):
        super().__init__()
        self.C = collectives
        self.w1 = torch.nn.Parameter(torch.linspace(-1, 1, 16, dtype=torch.float64).reshape(4, 4))
        self.w2 = torch.nn.Parameter(torch.linspace(1, -0.5, 16, dtype=torch.float64).reshape(4, 4))

    def forward(self, x):
        h = self.C.all_reduce_fwd_identity_bwd(x @ self.w1, "tp").sin()
        return self.C.all_gather_fwd_reduce_scatter_bwd(h @ self.w2, "tp", 0).cos()


def _collectives_under_recompute(rank, C):
    results = {}
    for mode in ("none", "selective", "full"):
        block = _TpBlock(C)
        model = apply_recompute(Repeat([block]), mode)
        x = torch.linspace(-1, 1, 12, dtype=torch.float64).reshape(3, 4) * (rank + 1)
        counter = _CountOps()
        C.count_bytes(True)
        with counter:
            model(x).sum().backward()
        results[mode] = (counter.calls, dict(C.BYTES), block.w1.grad.clone(), block.w2.grad.clone())
        C.count_bytes(False)
    forward = {"all_reduce": 1, "all_gather_into_tensor": 1}
    for mode, (calls, nbytes, g1, g2) in results.items():
        ran = {op: calls.get(f"_c10d_functional.{op}", 0) for op in forward}
        # backward: the all-reduce's is the identity, the all-gather's a reduce-scatter, in every mode
        assert calls.get("_c10d_functional.reduce_scatter_tensor", 0) == 1, (mode, calls)
        if mode == "full":  # re-runs the forward's collectives in backward, as Megatron's full recomputation does
            assert ran == {op: 2 for op in forward}, (mode, ran)
            assert nbytes[("all_reduce", "tp")] == 2 * results["none"][1][("all_reduce", "tp")]
        elif mode == "selective":  # reads the all-reduce's output back; gathers again (Megatron's sp linears)
            assert ran == {"all_reduce": 1, "all_gather_into_tensor": 2}, (mode, ran)
            want = dict(results["none"][1])
            want[("all_gather", "tp")] *= 2
            assert nbytes == want, (nbytes, want)
        else:
            assert ran == forward, (mode, ran)
        assert torch.equal(g1, results["none"][2]) and torch.equal(g2, results["none"][3]), mode


@pytest.mark.e2e
def test_selective_reruns_only_the_all_gather_and_full_reruns_every_collective():
    from tests import multirank
    multirank.spawn(_collectives_under_recompute)


def test_moe_statistics_and_gradients_are_those_of_none(tmp_path):
    """An MoE model (moe_gpt on one device) under each mode: the same loss and gradients (the auxiliary loss's
    too), and the routing statistics counted once per forward, not again by the recomputation."""
    from runtime import moe
    from tests.e2e.runner import single_device
    mod = _module(_program(single_device((ROOT / "samples" / "moe_gpt.scale").read_text()), tmp_path))
    cfg = mod.CONFIG
    g = torch.Generator().manual_seed(5)
    tokens, targets = (torch.randint(0, cfg.data.vocab, (4, cfg.data.seq_len), generator=g) for _ in range(2))
    out = {}
    for mode in ("none", "selective", "full"):
        model = mod.Model()
        init_parameters(model, seed=7, std=0.02, residual_out=cfg.init.residual_out, layers=cfg.init.layers)
        apply_recompute(model, mode)
        moe.stats_reset()
        loss = model(tokens, targets)
        loss.backward()
        out[mode] = (loss.detach(), {n: p.grad for n, p in model.named_parameters()}, moe.stats_read("cpu"))
    ref_loss, ref_grads, ref_stats = out["none"]
    assert ref_stats["routed"] > 0
    for mode in ("selective", "full"):
        loss, grads, stats = out[mode]
        assert torch.equal(loss, ref_loss) and stats == ref_stats, mode
        for name in ref_grads:
            torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-6, atol=1e-9, msg=f"{mode} {name}")
