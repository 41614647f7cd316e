"""`plan { offload }`: the setting read into the Plan and the program's contract, its refusals, and the runtime's
pieces on one process (runtime/offload.py): which parameters go to the host, AdamW stepped there equal bit for bit
to torch's on the device (fp32 and bf16's masters), and activation hooks that change no gradient while moving the
bytes they count. The runs under torchrun: tests/e2e/test_offload.py."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from compiler.check import check_text
from compiler.diagnostics import ScaleError
from compiler.pipeline import compile_spec
from compiler import codegen
from runtime import offload, optimizer, precision
from runtime.config import Optim, Parallel
from runtime.layers import Repeat

ROOT = Path(__file__).resolve().parents[1]
DP = (ROOT / "samples" / "gpt_dp.scale").read_text()


def _plan_text(setting: str, text: str = DP) -> str:
    return text.replace("data_parallel = ddp", f"data_parallel = ddp\n  {setting}")


@pytest.mark.parametrize("setting,want", [
    ("offload = optimizer(fraction = 0.25)", ("optimizer", 0.25, ())),
    ("offload = optimizer", ("optimizer", 1.0, ())),
    ("offload = activations(modules = (attention, mlp))", ("activations", 1.0, ("attention", "mlp"))),
    ("offload = activations(modules = mlp)", ("activations", 1.0, ("mlp",))),
    ("offload = none", ("none", 1.0, ())),
])
def test_the_setting_becomes_the_plans_three_fields(setting, want):
    plan = check_text(_plan_text(setting), "a.scale").plan
    assert (plan.offload, plan.offload_fraction, plan.offload_modules) == want
    if want[0] != "none":
        assert plan.to_json()["offload"] == want[0] and "offload" in plan.describe()
    else:
        assert "offload" not in plan.to_json()  # plan.json without offload: as before


def test_the_contract_carries_what_the_runtime_reads(tmp_path):
    """program.py's Parallel holds the kind and its argument, only where the plan offloads."""
    for setting, written in (("offload = optimizer(fraction = 0.5)", "offload_fraction=0.5"),
                             ("offload = activations(modules = mlp)", "offload_modules=('mlp',)"),
                             ("offload = none", None)):
        out = tmp_path / setting.split()[-1].split("(")[0]
        codegen.emit(compile_spec(check_text(_plan_text(setting), "a.scale")), str(out))
        program = (out / "program.py").read_text()
        assert (written in program) if written else "offload" not in program


def test_fsdp_takes_parameter_offload_and_refuses_optimizer_offload():
    fsdp = DP.replace("data_parallel = ddp", "data_parallel = fsdp")
    assert check_text(fsdp.replace("data_parallel = fsdp", "data_parallel = fsdp\n  offload = params"),
                      "a.scale").plan.offload == "params"
    with pytest.raises(ScaleError) as err:
        check_text(fsdp.replace("data_parallel = fsdp", "data_parallel = fsdp\n  offload = optimizer"), "a.scale")
    assert [d.code for d in err.value.diagnostics] == ["E0331"]


def test_a_search_candidate_is_refused_in_words():
    """The rule reads the plan it is given: a candidate without spans is described, not pointed at."""
    import dataclasses
    from compiler.rules import check_plan
    spec = check_text(DP, "a.scale")
    got = check_plan(spec, dataclasses.replace(spec.plan, offload="params", spans=()))
    assert [d.code for d in got] == ["E0330"] and got[0].span is None and "dp=2" in got[0].message


def test_activation_offload_turns_the_gpus_compile_default_off():
    gpu = _plan_text("offload = activations", DP.replace("device = cpu", "device = h100"))
    plan = check_text(gpu, "a.scale").plan
    assert plan.compile and not plan.compiles


# -- the runtime -----------------------------------------------------------------------------------------------------


def test_host_share_is_the_shortest_prefix_reaching_the_fraction():
    params = [torch.zeros(n) for n in (10, 30, 40, 20)]
    share = lambda f: [int(p.numel()) for p in params if p in offload.host_share(params, f)]  # noqa: E731
    assert share(0) == [] and share(1) == [10, 30, 40, 20]
    assert share(0.4) == [10, 30] and share(0.41) == [10, 30, 40] and share(0.05) == [10]


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4))


OPT = Optim(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)


def _train(model, opt, steps: int = 3, mixed: bool = False):
    torch.manual_seed(1)
    for _ in range(steps):
        x = torch.randn(5, 8, dtype=next(model.parameters()).dtype)
        model(x).float().pow(2).mean().backward()
        if mixed:  # main gradients as runtime.precision.MainGrads leaves them
            for p in model.parameters():
                p.main_grad, p.grad = p.grad.float(), None
        opt.step()
        opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_host_adamw_is_torchs_adamw_bit_for_bit(fraction):
    """fp32: the parameters after three steps equal torch.optim.AdamW's (runtime.optimizer.adamw) exactly, and the
    bytes each step copies are the offloaded gradients down and the parameters back."""
    ref, off = _model(), _model()
    _train(ref, optimizer.adamw(list(ref.parameters()), OPT))
    params = list(off.parameters())
    opt = offload.HostAdamW(precision.decay_groups(params, OPT.weight_decay), lr=OPT.lr, betas=OPT.betas,
                            eps=OPT.eps, fraction=fraction)
    offload.reset()
    _train(off, opt)
    for a, b in zip(ref.parameters(), off.parameters()):
        assert torch.equal(a, b)
    moved = 3 * 4 * sum(p.numel() for p in opt.host)
    assert offload.counts() == {"d2h": moved, "h2d": moved}
    assert (moved == 0) == (fraction == 0)


@pytest.mark.parametrize("fraction", [0.5, 1.0])
def test_host_adamw_over_bf16_masters_is_master_adamw(fraction):
    """bf16: fp32 masters on the host, the weights cast there and sent in bf16 (2 bytes a parameter back, 4 down)."""
    ref, off = _model().to(torch.bfloat16), _model().to(torch.bfloat16)
    ref_masters = {p: p.detach().float() for p in ref.parameters()}
    groups = precision.decay_groups(list(ref.parameters()), OPT.weight_decay)
    _train(ref, precision.MasterAdamW(groups, ref_masters, lr=OPT.lr, betas=OPT.betas, eps=OPT.eps), mixed=True)
    masters = {p: p.detach().float() for p in off.parameters()}
    opt = offload.HostAdamW(precision.decay_groups(list(off.parameters()), OPT.weight_decay), lr=OPT.lr,
                            betas=OPT.betas, eps=OPT.eps, fraction=fraction, masters=masters)
    offload.reset()
    _train(off, opt, mixed=True)
    for a, b in zip(ref.parameters(), off.parameters()):
        assert torch.equal(a, b)
    for p in opt.host:
        assert torch.equal(opt.state[p]["master"], ref_masters[next(q for q, r in zip(ref.parameters(),
                                                                                     off.parameters()) if r is p)])
    n = sum(p.numel() for p in opt.host)
    assert offload.counts() == {"d2h": 3 * 4 * n, "h2d": 3 * 2 * n}


class _Block(nn.Module):
    """A generated block's shape: leaves named by their layer (norm_1, attn_*, mlp_*), ops between them."""

    def __init__(self):
        super().__init__()
        self.norm_1 = nn.LayerNorm(8)
        self.attn_q = nn.Linear(8, 8)
        self.mlp_up = nn.Linear(8, 32)
        self.mlp_down = nn.Linear(32, 8)

    def forward(self, x):
        h = x + torch.softmax(self.attn_q(self.norm_1(x)), -1)
        return h + self.mlp_down(torch.nn.functional.gelu(self.mlp_up(h)))


@pytest.mark.parametrize("modules", [(), ("mlp",), ("attention", "mlp")])
def test_activation_offload_changes_no_gradient(modules):
    torch.manual_seed(0)
    ref = Repeat([_Block(), _Block()])
    off = copy.deepcopy(ref)
    offload.install(off, modules)
    x = torch.randn(2, 5, 8)
    ref(x).square().sum().backward()
    offload.reset()
    off(x).square().sum().backward()
    for (name, a), b in zip(ref.named_parameters(), off.parameters()):
        assert torch.equal(a.grad, b.grad), name
    got = offload.counts()
    assert got["d2h"] == got["h2d"] > 0
    # every saved tensor; the attention's and the MLP's leave the norms' behind; the MLP's alone fewer still
    every, both = _saved_bytes(()), _saved_bytes(("attention", "mlp"))
    assert got["d2h"] == {(): every, ("attention", "mlp"): both}.get(modules, got["d2h"])
    assert _saved_bytes(("mlp",)) < both < every


def _saved_bytes(modules) -> int:
    torch.manual_seed(0)
    m = Repeat([_Block(), _Block()])
    offload.install(m, modules)
    offload.reset()
    m(torch.randn(2, 5, 8)).sum().backward()
    return offload.counts()["d2h"]


def test_the_contract_refuses_what_the_runtime_does_not_know():
    with pytest.raises(ValueError):
        Parallel(axes=(("dp", 1),), offload="nvme")
    with pytest.raises(ValueError):
        Parallel(axes=(("dp", 1),), offload="optimizer", offload_fraction=2.0)


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_a_checkpoint_holds_every_parameter_and_its_state(fraction):
    """runtime.checkpoint stores a parameter's `master` as its value and the rest as AdamW's state, for every
    parameter the optimizer owns: on the host or on the device, each is there once, with its current value (a
    parameter left out would be saved by no rank and refused on resume)."""
    from types import SimpleNamespace

    from runtime import checkpoint
    from runtime import tensor_parallel as tp
    model = _model()
    params = list(model.parameters())
    opt = offload.HostAdamW(precision.decay_groups(params, OPT.weight_decay), lr=OPT.lr, betas=OPT.betas,
                            eps=OPT.eps, fraction=fraction)
    _train(model, opt, steps=1)
    ctx = SimpleNamespace(axis_size=lambda axis: 1, coords={})
    model_sd, optim_sd = checkpoint._Entries([model], tp.Shards((), ()), ctx).state(opt, saving=True)
    assert model_sd.keys() == optim_sd["state"].keys() == dict(model.named_parameters()).keys()
    for name, p in model.named_parameters():
        assert torch.equal(model_sd[name], p) and set(optim_sd["state"][name]) == {"step", "exp_avg", "exp_avg_sq"}
