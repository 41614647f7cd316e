"""Runtime pieces on one process: data layout independence, the token-file reader, the schedule, initialisation."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from runtime import data
from runtime.layers import init_parameters, parameter_generator
from runtime.config import Config, Data, Optim, Parallel
from runtime.optimizer import lr_lambda


def test_any_dp_and_micro_batch_split_sees_the_same_global_batch():
    src = data.Synthetic(vocab=50, seq_len=12, seed=7)
    full, full_t = data.micro_batch(src, 3, 8, 0, 1, 0, 1)
    for dp, m in ((2, 1), (2, 2), (4, 2), (8, 1)):
        parts = [data.micro_batch(src, 3, 8, r, dp, j, m) for r in range(dp) for j in range(m)]
        assert torch.equal(torch.cat([p[0] for p in parts]), full)
        assert torch.equal(torch.cat([p[1] for p in parts]), full_t)
    # Targets are the next tokens, and steps differ from each other.
    assert torch.equal(full[:, 1:], full_t[:, :-1])
    assert not torch.equal(data.micro_batch(src, 4, 8, 0, 1, 0, 1)[0], full)


def test_synthetic_sequences_step_by_a_stride():
    tokens, _ = data.Synthetic(vocab=100, seq_len=10, seed=1).samples(0, 16, 0, 16)
    strides = (tokens[:, 1:] - tokens[:, :-1]) % 100
    assert all(len(set(row.tolist())) == 1 and 1 <= row[0] <= 4 for row in strides)


def test_token_file_windows(tmp_path):
    ids = np.arange(1000, dtype=np.uint16)
    path = tmp_path / "tokens.bin"
    ids.tofile(path)
    src = data.TokenFile(str(path), "uint16", seq_len=16, seed=3, vocab=1000)
    tokens, targets = src.samples(0, 4, 0, 4)
    assert tokens.shape == (4, 16) and tokens.dtype == torch.int64
    assert torch.equal(targets, tokens + 1)  # consecutive ids: the window is contiguous
    assert torch.equal(src.samples(0, 4, 2, 4)[0], tokens[2:])


def _cfg(**optim) -> Config:
    opt = dict(lr=1e-3, betas=(0.9, 0.95), weight_decay=0.0, eps=1e-8, lr_schedule="cosine", warmup=10, min_lr=1e-4,
               grad_clip=1.0)
    opt.update(optim)
    return Config(name="m", source="m.scale", steps=100, seed=0, parallel=Parallel(axes=(("dp", 1),)),
                  optim=Optim(**opt), data=Data(global_batch=1, seq_len=1, vocab=8))


def test_lr_schedule_warms_up_then_decays_to_min_lr():
    f = lr_lambda(_cfg())
    assert f(0) == 1 / 11 and f(9) == 10 / 11 and f(10) == 1.0
    assert math.isclose(f(55), 0.1 + 0.9 * 0.5, rel_tol=1e-12)  # half-way through the cosine
    assert math.isclose(f(100), 0.1, rel_tol=1e-12)
    assert lr_lambda(_cfg(lr_schedule="constant"))(50) == 1.0


def test_initialisation_depends_on_names_not_order():
    def make(order):
        m = nn.Module()
        for name in order:
            m.add_module(name, nn.Linear(4, 4))
        init_parameters(m, seed=5, std=0.02, residual_out=("attn_o",), layers=2)
        return dict(m.named_parameters())
    a, b = make(["attn_q", "attn_o"]), make(["attn_o", "attn_q"])
    for name in a:
        assert torch.equal(a[name], b[name])
    assert torch.all(a["attn_q.bias"] == 0)
    # The residual output projection is scaled by 1/sqrt(2 * layers).
    assert a["attn_o.weight"].std() < a["attn_q.weight"].std()
    g1, g2 = parameter_generator(5, "x.weight"), parameter_generator(5, "y.weight")
    assert not torch.equal(torch.randn(3, generator=g1), torch.randn(3, generator=g2))


def test_mesh_rows_group_the_ranks_that_differ_only_along_the_axes():
    """The dp × ep batch groups and pp rows, for an (ep, pp, dp) axis order: rows ordered along the axes given."""
    from types import SimpleNamespace

    from runtime.mesh import rows
    grid = torch.arange(8).reshape(2, 2, 2)  # ranks by (ep, pp, dp)
    fake = SimpleNamespace(mesh=grid, mesh_dim_names=("ep", "pp", "dp"))
    assert rows(fake, ("dp", "ep")) == [[0, 4, 1, 5], [2, 6, 3, 7]]  # fixed pp; dp outer, ep inner
    assert rows(fake, ("pp",)) == [[0, 2], [1, 3], [4, 6], [5, 7]]


def test_checkpoint_fallback_is_for_damaged_files_not_for_our_defects():
    """A DCP load failure falls back to an older checkpoint only when no rank's cause is a programming error."""
    import pickle

    from torch.distributed.checkpoint.api import CheckpointException

    from runtime import checkpoint

    def defect(*errors):
        exc = CheckpointException("load failed", {r: (e, None) for r, e in enumerate(errors)})
        return any(isinstance(e, checkpoint._BUGS) for e in checkpoint._causes(exc))
    assert not defect(OSError("short read"), EOFError(), pickle.UnpicklingError("bad"))
    assert defect(OSError("short read"), KeyError("optim.state.w.exp_avg"))
    assert defect(TypeError("bad call"))


def test_every_field_of_the_runtime_contract_is_documented():
    """runtime/config.py: each field of Config and of its groups is followed by its docstring."""
    import ast as pyast
    from pathlib import Path

    from runtime import config
    tree = pyast.parse(Path(config.__file__).read_text())
    undocumented = []
    for cls in (n for n in tree.body if isinstance(n, pyast.ClassDef)):
        body = cls.body
        for i, node in enumerate(body):
            if isinstance(node, pyast.AnnAssign):
                name = node.target.id
                documented = (i + 1 < len(body) and isinstance(body[i + 1], pyast.Expr)
                              and isinstance(body[i + 1].value, pyast.Constant))
                # A group field (parallel: Parallel) is documented by its class's docstring.
                group = isinstance(node.annotation, pyast.Name) and node.annotation.id in dict(
                    (c.__name__, f) for f, c in config.GROUPS)
                if not documented and not group:
                    undocumented.append(f"{cls.name}.{name}")
    assert not undocumented, f"undocumented contract fields: {undocumented}"


def test_an_eval_config_outside_the_checked_bounds_is_refused():
    import pytest

    from runtime.config import Eval
    assert Eval(every=10, batches=2, split=0.5).split == 0.5
    for bad in (dict(every=-1), dict(batches=0), dict(split=0.6), dict(split=-0.1)):
        with pytest.raises(ValueError, match="0 <= split <= 0.5"):
            Eval(**bad)


def test_the_batch_split_of_the_program_must_match_the_mesh():
    """A program run on a mesh with another number of batch ranks than its plan's stops with one line."""
    import types

    import pytest

    from runtime.startup import check_contract
    cfg = _cfg()
    cfg = Config(name="m", source="m.scale", steps=1, seed=0, optim=cfg.optim,
                 parallel=Parallel(axes=(("dp", 2),), micro_batches=2, micro_batch_size=2, batch_ranks=2),
                 data=Data(global_batch=8, seq_len=4, vocab=8))
    check_contract(cfg, types.SimpleNamespace(data_ranks=2))
    with pytest.raises(SystemExit, match="the mesh has 4 batch rank"):
        check_contract(cfg, types.SimpleNamespace(data_ranks=4))


def test_model_parts_count_a_tied_copy_once():
    """The optimizer sees every parameter of every part; the norm, the count and saving skip a tied copy."""
    from runtime.model_parts import ModelParts

    parts = ModelParts()
    first, last = nn.Module(), nn.Module()
    first.add_module("proj", nn.Linear(2, 2))
    last.add_module("tok_embed", nn.Embedding(4, 2))
    parts.modules = [first, last]
    parts.tied_elsewhere = ("tok_embed.weight",)
    assert [n for n, _ in parts.named_parameters()] == ["proj.weight", "proj.bias", "tok_embed.weight"]
    assert [n for n, _ in parts.named_parameters(counted_once=True)] == ["proj.weight", "proj.bias"]


@pytest.mark.parametrize("n", [1, 2, 3, 10, 64, 1000, 4097])
def test_each_epoch_s_order_is_a_permutation_of_its_own(n):
    """data.Shuffle: every index once per epoch, another order the next epoch, the same order for the same key."""
    orders = [[data.Shuffle(n, 7, e)[i] for i in range(n)] for e in (0, 1)]
    assert all(sorted(o) == list(range(n)) for o in orders)
    assert orders[0] == [data.Shuffle(n, 7, 0)[i] for i in range(n)]
    if n >= 10:
        assert orders[0] != orders[1] and orders[0] != list(range(n))


def test_token_file_epochs_visit_every_window_once(tmp_path):
    """W = (tokens - 1) // seq_len windows; each epoch's samples are every window once, whatever the batch split;
    the second epoch reorders them."""
    seq, windows = 8, 24
    ids = np.arange(windows * seq + 1, dtype=np.uint16)
    path = tmp_path / "tokens.bin"
    ids.tofile(path)
    src = data.TokenFile(str(path), "uint16", seq_len=seq, seed=3, vocab=1000)
    assert src.windows == windows
    starts = [int(t[0]) for step in range(6) for t in src.samples(step, 4, 0, 4)[0]]  # 6 steps × 4 = one epoch
    assert sorted(starts) == [w * seq for w in range(windows)]
    again = [int(t[0]) for step in range(6, 12) for t in src.samples(step, 4, 0, 4)[0]]
    assert sorted(again) == sorted(starts) and again != starts
    # a step that crosses an epoch boundary (batch 5 over 24 windows) draws from both orders, each window once
    crossing = [int(t[0]) for step in range(5) for t in src.samples(step, 5, 0, 5)[0]]  # 25 samples
    assert sorted(crossing[:24]) == [w * seq for w in range(windows)]
    assert torch.equal(src.samples(3, 4, 1, 3)[0], src.samples(3, 4, 0, 4)[0][1:3])  # a dp share is a slice
