"""Packed documents (runtime/packed.py) on one process: a packed sequence equals its documents run one by one.

The convention (Megatron's reset_position_ids, reset_attention_mask, eod_mask_loss): a separator ends its document,
positions restart after it, a query reads only its own document's keys, and the target after a separator is not
predicted; the loss is the sum over predicted targets divided by the micro-batch's tokens."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from compiler.check import check_text
from compiler.model import build
from runtime import packed, rotary
from runtime.data import write_tokens
from runtime.layers import init_parameters

SEP = 0


def _sequence(lengths: list, seed: int = 0, last_open: bool = True) -> torch.Tensor:
    """Documents of `lengths` tokens (their separator included), the last without its separator when
    `last_open` (a window cuts it)."""
    g = torch.Generator().manual_seed(seed)
    parts = []
    for i, n in enumerate(lengths):
        open_end = last_open and i == len(lengths) - 1
        body = torch.randint(1, 64, (n if open_end else n - 1,), generator=g)
        parts.append(body if open_end else torch.cat([body, torch.tensor([SEP])]))
    return torch.cat(parts)


def test_documents_positions_and_targets():
    tokens = torch.tensor([[5, 6, SEP, 7, SEP, SEP, 8, 9]])
    docs = packed.documents(tokens, SEP)
    assert docs.tolist() == [[0, 0, 0, 1, 1, 2, 3, 3]]
    assert packed.restart_positions(docs).tolist() == [[0, 1, 2, 0, 1, 0, 0, 1]]
    targets = torch.tensor([[6, SEP, 7, SEP, SEP, 8, 9, 4]])
    assert packed.mask_targets(tokens, targets, SEP).tolist() == [[6, SEP, -100, SEP, -100, -100, 9, 4]]


@pytest.mark.parametrize("gqa", [False, True])
def test_attention_equals_each_document_alone(gqa):
    torch.manual_seed(0)
    lengths = [5, 9, 3, 7]
    s, h, kv, d = sum(lengths), 4, 2 if gqa else 4, 8
    tokens = torch.stack([_sequence(lengths, 0), _sequence(lengths[::-1], 1)])
    q = torch.randn(2, h, s, d, requires_grad=True)
    k = torch.randn(2, kv, s, d, requires_grad=True)
    v = torch.randn(2, kv, s, d, requires_grad=True)
    w = torch.randn(2, h, s, d)
    with packed.batch(packed.documents(tokens, SEP)):
        qr, kr = packed.rotate(q, k, 10000.0)
        out = packed.attention(qr, kr, v, gqa)
    (out * w).sum().backward()
    got = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    pieces = []
    for row, ls in enumerate((lengths, lengths[::-1])):
        lo, row_out = 0, []
        for n in ls:  # each document alone: positions 0..n-1, causal within it
            sl = slice(lo, lo + n)
            qd, kd = rotary.rotate(q[row:row + 1, :, sl], k[row:row + 1, :, sl], 10000.0)
            row_out.append(F.scaled_dot_product_attention(qd, kd, v[row:row + 1, :, sl], is_causal=True,
                                                          enable_gqa=gqa))
            lo += n
        pieces.append(torch.cat(row_out, dim=2))
    ref = torch.cat(pieces)
    (ref * w).sum().backward()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for a, t in zip(got, (q, k, v)):
        torch.testing.assert_close(a, t.grad, rtol=1e-5, atol=1e-5)


MODEL = """
model m {{
  vocab = 64  hidden = 32  heads = 4  layers = 2
  embedding(vocab, hidden)
  positional(32, hidden)
  repeat layers {{
    residual {{ rmsnorm(hidden)  attention(hidden, heads, kv_heads = 2, rope_theta = 10000) }}
    residual {{ rmsnorm(hidden)  mlp(hidden, 4 * hidden, act = swiglu) }}
  }}
  rmsnorm(hidden)
  lm_head(vocab, hidden, tied = true)
  cross_entropy
}}
mesh {{ axis dp = 1  devices_per_node = 1 }}
train {{ global_batch = 2  seq_len = 24  steps = 1  optimizer = adamw(lr = 1e-3)
        data = tokens(path = "docs.bin"{sep}) }}
"""


def test_model_equals_each_document_alone(tmp_path):
    """The whole model (learned and rotary positions, GQA): the packed loss and gradients are those of each
    document run alone, the target after each separator left out, summed and divided by the packed tokens."""
    write_tokens(str(tmp_path / "docs.bin"), np.arange(200) % 64, "uint16", 64)
    where = str(tmp_path / "m.scale")
    models = []
    for sep in (f", document_separator = {SEP}", ""):
        model = build(check_text(MODEL.format(sep=sep), where), device="cpu")
        init_parameters(model, seed=0, std=0.2, residual_out=(), layers=2)
        models.append(model)
    pk, alone = models
    lengths = [6, 10, 4, 5]  # 25 tokens: 24 inputs and the last one's target
    seq = torch.stack([_sequence(lengths, 3), _sequence(lengths[::-1], 4)])
    tokens, targets = seq[:, :-1], seq[:, 1:]
    with packed.batch(packed.documents(tokens, SEP)):
        loss = pk(tokens, packed.mask_targets(tokens, targets, SEP))
    loss.backward()
    total = torch.zeros(())
    for row in range(2):
        ends = [i for i, t in enumerate(tokens[row].tolist()) if t == SEP]
        lo = 0
        for end in ends + [tokens.shape[1]]:
            # the document's inputs up to its separator, which is predicted; the separator's own target is not
            n = end - lo
            if n:
                part = alone(tokens[row:row + 1, lo:end], targets[row:row + 1, lo:end]) * n
                total = total + part
            lo = end + 1
    ref = total / tokens.numel()
    ref.backward()
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    grads = dict(alone.named_parameters())
    for name, p in pk.named_parameters():
        torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-5, atol=1e-6, msg=name)


def _vocab_parallel_loss(rank, C):
    """tp: the vocabulary-parallel loss with `ignore` equals packed.cross_entropy on the whole logits, loss and
    gradient (the ignored targets count zero, the sum divided by every token)."""
    torch.manual_seed(0)
    vocab, tokens = 7, 10  # 7 does not divide by 2: each rank holds 4 columns, the last one padding
    logits = torch.randn(tokens, vocab, dtype=torch.float64)
    targets = torch.randint(0, vocab, (tokens,))
    targets[[0, 3, 4]] = packed.IGNORE
    full = logits.clone().requires_grad_()
    ref = packed.cross_entropy(full, targets)
    ref.backward()
    padded = torch.cat([logits, torch.zeros(tokens, 1, dtype=torch.float64)], 1)
    local = padded[:, rank * 4:(rank + 1) * 4].clone().requires_grad_()
    loss = C.vocab_parallel_cross_entropy(local, targets, "tp", vocab, ignore=packed.IGNORE)
    loss.backward()
    assert torch.allclose(loss, ref, rtol=1e-12, atol=0), (loss, ref)
    grad_ref = torch.cat([full.grad, torch.zeros(tokens, 1, dtype=torch.float64)], 1)[:, rank * 4:(rank + 1) * 4]
    assert torch.allclose(local.grad, grad_ref, rtol=1e-12, atol=1e-15)
    assert local.grad[[0, 3, 4]].abs().max() == 0


@pytest.mark.e2e  # gloo ranks
def test_vocab_parallel_loss_ignores_targets_after_a_separator():
    from tests import multirank
    multirank.spawn(_vocab_parallel_loss, 2)


@pytest.mark.parametrize("mesh,plan,refused", [
    ("axis tp = 2", "sequence_parallel = true", None),
    ("axis pp = 2", "micro_batches = 2", None),
    ("axis cp = 2", "context_parallel = all_to_all", None),
    ("axis cp = 2", "context_parallel = all_gather", None),
    ("axis cp = 2", "context_parallel = ring", "context_parallel = ring"),
    ("axis tp = 2", "compile = true", "compiling a program"),
])
def test_plans_packed_documents_compose_with(tmp_path, mesh, plan, refused):
    """compiler/rules/packed.py: tp (+ sp), pp, cp all_gather and all_to_all take packed documents; ring and
    compile are refused (E0318) at the setting that asks for them."""
    from compiler.diagnostics import ScaleError
    write_tokens(str(tmp_path / "docs.bin"), np.arange(200) % 64, "uint16", 64)
    text = (MODEL.format(sep=f", document_separator = {SEP}")
            .replace("mesh { axis dp = 1  devices_per_node = 1 }", f"mesh {{ {mesh}  devices_per_node = 2 }}\n"
                     f"plan {{ {plan} }}").replace("seq_len = 24", "seq_len = 32"))
    where = str(tmp_path / "m.scale")
    if refused is None:
        check_text(text, where)
        return
    with pytest.raises(ScaleError) as err:
        check_text(text, where)
    errors = [d for d in err.value.diagnostics if d.severity == "error"]
    assert [d.code for d in errors] == ["E0318"] and refused in errors[0].message
