"""The hand-written side of bench/gpu.py: a nanoGPT-style model and training loop in plain PyTorch.

    python -m bench.handwritten --arch '{"vocab": ..., ...}' --optim '{"lr": ..., ...}' --steps N --metrics FILE
                                [--compile] [--device cuda|cpu] [--precision bf16|fp32] [--seed N]

One architecture class covers both families bench/gpu.py measures (`Arch`): GPT-2 (layernorm, GELU MLP, biases,
learned positions, tied head) and Llama-style (RMSNorm, SwiGLU, grouped-query attention, no biases, no positions,
untied head). It is what a user would write beside nanoGPT: q, k and v as one fused linear, SwiGLU's gate and up
projections as one fused linear, SDPA for attention (causal, `enable_gqa`), the loss in fp32 on the logits.

The loop: tokens and targets made on the device (`torch.randint`, no host copy), bf16 autocast where asked, AdamW
(fused on CUDA; the decay / no-decay split of the 1-D parameters as runtime/optimizer.py does), the same learning-rate
schedule (linear warm-up, then constant or cosine to min_lr), global-norm clipping (torch's foreach path), and one
host read per step (the loss, as the generated programs do). With `--compile` the whole model is `torch.compile`d.
Each step writes one JSON line to --metrics: step, loss, step_time (s, wall clock from the start of the step to the
loss read), and on CUDA peak_memory_bytes (max_memory_allocated, its peak counter reset at the start of each step,
as runtime/memory.py does for the generated programs).
"""
from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True, kw_only=True)
class Arch:
    """A transformer of either family; the fields bench/gpu.py writes into both the .scale text and this model."""

    vocab: int
    hidden: int
    heads: int
    kv_heads: int
    layers: int
    ffn: int
    seq: int
    norm: str  # "layernorm" (eps 1e-5, with bias when `bias`) or "rmsnorm" (eps 1e-6)
    act: str  # "gelu" (exact) or "swiglu"
    bias: bool  # biases in every linear (and layernorm)
    tied: bool  # the head shares the token embedding's weight
    positional: bool  # learned absolute positions added to the token embedding
    rope: float = 0.0  # rotary embeddings' base (rotate-half layout, as Llama); 0: none


def _norm(a: Arch) -> nn.Module:
    if a.norm == "rmsnorm":
        return nn.RMSNorm(a.hidden, eps=1e-6)
    return nn.LayerNorm(a.hidden, eps=1e-5, bias=a.bias)


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Block(nn.Module):
    def __init__(self, a: Arch):
        super().__init__()
        self.a, self.head_dim = a, a.hidden // a.heads
        kv = a.kv_heads * self.head_dim
        self.ln_1 = _norm(a)
        self.qkv = nn.Linear(a.hidden, a.hidden + 2 * kv, bias=a.bias)
        self.proj = nn.Linear(a.hidden, a.hidden, bias=a.bias)
        self.ln_2 = _norm(a)
        self.fc = nn.Linear(a.hidden, (2 if a.act == "swiglu" else 1) * a.ffn, bias=a.bias)
        self.down = nn.Linear(a.ffn, a.hidden, bias=a.bias)

    def forward(self, x, cos_sin=None):
        a, B, T, C = self.a, *x.shape
        kv = a.kv_heads * self.head_dim
        q, k, v = self.qkv(self.ln_1(x)).split([C, kv, kv], dim=-1)
        q = q.view(B, T, a.heads, self.head_dim).transpose(1, 2)
        k = k.view(B, T, a.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, T, a.kv_heads, self.head_dim).transpose(1, 2)
        if cos_sin is not None:
            cos, sin = (t.to(q.dtype) for t in cos_sin)
            q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=a.kv_heads != a.heads)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        h = self.fc(self.ln_2(x))
        if a.act == "swiglu":
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h)
        return x + self.down(h)


class GPT(nn.Module):
    def __init__(self, a: Arch):
        super().__init__()
        self.a = a
        self.wte = nn.Embedding(a.vocab, a.hidden)
        self.wpe = nn.Embedding(a.seq, a.hidden) if a.positional else None
        self.blocks = nn.ModuleList(Block(a) for _ in range(a.layers))
        self.ln_f = _norm(a)
        self.head = None if a.tied else nn.Linear(a.hidden, a.vocab, bias=False)
        for name, p in self.named_parameters():  # GPT-2's init: N(0, 0.02), residual outputs scaled by depth
            if p.ndim >= 2:
                std = 0.02 / math.sqrt(2 * a.layers) if name.endswith(("proj.weight", "down.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, tokens, targets):
        x = self.wte(tokens)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        cos_sin = None
        if self.a.rope:  # one table of angles per forward, shared by the blocks
            d = self.a.hidden // self.a.heads
            inv = 1.0 / (self.a.rope ** (torch.arange(0, d, 2, device=tokens.device).float() / d))
            angles = torch.outer(torch.arange(tokens.shape[1], device=tokens.device).float(), inv)
            angles = torch.cat((angles, angles), dim=-1)
            cos_sin = (angles.cos(), angles.sin())
        for block in self.blocks:
            x = block(x, cos_sin)
        x = self.ln_f(x)
        logits = F.linear(x, self.wte.weight) if self.head is None else self.head(x)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def lr_multiplier(optim: dict, steps: int):
    """runtime/optimizer.py's schedule: linear warm-up, then constant or cosine to min_lr at the last step."""
    warmup, floor = optim.get("warmup", 0), optim.get("min_lr", 0.0) / optim["lr"]

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if optim.get("lr_schedule", "constant") == "constant":
            return 1.0
        progress = (step - warmup) / max(1, steps - warmup)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return f


def train(a: Arch, optim: dict, steps: int, batch: int, device: str, precision: str, compile_model: bool,
          seed: int, metrics_path: str | None) -> list[dict]:
    torch.manual_seed(seed)
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    if cuda and dev.index is not None:  # torch 2.11 refuses set_device("cuda") without an index
        torch.cuda.set_device(dev)
    model = GPT(a).to(dev)
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": optim["weight_decay"]},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=optim["lr"], betas=tuple(optim["betas"]), eps=optim["eps"], fused=cuda)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_multiplier(optim, steps))
    run = torch.compile(model) if compile_model else model
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=precision == "bf16")
    gen = torch.Generator(device=dev).manual_seed(seed)
    records, out = [], open(metrics_path, "w") if metrics_path else None
    for step in range(steps):
        t0 = time.perf_counter()
        if cuda:
            torch.cuda.reset_peak_memory_stats(dev)
        seq = torch.randint(0, a.vocab, (batch, a.seq + 1), device=dev, generator=gen)
        with autocast:
            loss = run(seq[:, :-1], seq[:, 1:])
        loss.backward()
        if optim.get("grad_clip"):
            torch.nn.utils.clip_grad_norm_(params, optim["grad_clip"], foreach=True)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        loss_value = loss.item()
        dt = time.perf_counter() - t0
        record = {"step": step + 1, "loss": loss_value, "step_time": dt, "tokens_per_s": batch * a.seq / dt}
        if cuda:
            record["peak_memory_bytes"] = torch.cuda.max_memory_allocated(dev)
        records.append(record)
        if out:
            out.write(json.dumps(record) + "\n")
            out.flush()
    if out:
        out.close()
    return records


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", required=True, help="Arch fields as JSON")
    p.add_argument("--optim", required=True, help="lr, betas, eps, weight_decay, grad_clip, lr_schedule, warmup, "
                                                   "min_lr as JSON")
    p.add_argument("--batch", type=int, required=True, help="sequences per step")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--metrics", help="one JSON line per step")
    p.add_argument("--compile", action="store_true", help="torch.compile the whole model")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args(argv)
    records = train(Arch(**json.loads(args.arch)), json.loads(args.optim), args.steps, args.batch, args.device,
                    args.precision, args.compile, args.seed, args.metrics)
    last = records[-1]
    print(f"handwritten: {args.steps} steps, last loss {last['loss']:.4f}, last step {last['step_time'] * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
