"""Expert re-placement during training (`moe(..., rebalance = replicate(every = N, extra = R))`, issue 44).

Each ep rank holds S = (E + R) / ep expert *slots* (the first dim of its Experts weights); global slot g = r·S + i is
slot i of ep rank r, and a layer's `slot_expert` (P = E + R entries, the same on every rank) names the expert each
slot holds, -1 for an empty one. A run starts, and every checkpoint is written, in the canonical placement: rank r's
first E/ep slots hold experts [r·E/ep, (r+1)·E/ep), as without re-placement, its other slots empty; a checkpoint
thus holds the experts in their canonical order and resumes on any plan (runtime.checkpoint stores the first E/ep
slots of each rank).

Every N steps (`Rebalancer.after_step`) the choices each expert took since the last re-placement, counted by
`to_slots` on every micro-batch and summed over the batch ranks (dp × ep), give a new placement (`place`), the same on
every rank since it is computed from the same sums. Where an expert's slot changes, its weights and AdamW state
move with it (`Rebalancer.apply`, one all-to-all per tensor over ep). The placement is DeepSeek's EPLB, in
runtime/eplb.py (torch-free: the compiler's cost model prices the same placement).

Same math: a token's routing never depends on the placement. `to_slots` splits the rows a rank sends to a replicated
expert between its copies (contiguous chunks, the remainder rotated by the rank), every copy holds the same weights,
and `Rebalancer.sync_grads` sums the copies' gradients over ep before the optimizer step, so that every copy takes the
same update; the gradient norm counts each expert once (`Rebalancer.counted`).

Shapes: T rows (B·S·K choices) sorted by expert, H model width, E experts, P = E + R slots.
"""
from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist
from torch import nn

from runtime import collectives, moe, recompute
from runtime.eplb import align, canonical, place, plan_moves, predicted_slot_load, rank_loads, spread


# -- the rows to their slots and back (traced calls of the generated program) --------------------------------------


class Slots(nn.Module):
    """The placement of one re-placed MoE layer, re-placed every `every` steps, beside its Experts leaf
    (`{experts}_slots`): `slot_expert`, the
    expert each of the P = E + R global slots holds (-1: empty), and the choices counted since the last re-placement,
    `load` per expert and `slot_load` per slot. Not model state: a checkpoint holds the experts in canonical order.
    Called with no input, it hands the three to `to_slots` (a call the generated program shows)."""

    def __init__(self, experts: int, slots: int, every: int):
        super().__init__()
        self.experts, self.total, self.every = experts, slots, every
        self.register_buffer("slot_expert", torch.zeros(slots, dtype=torch.int64), persistent=False)
        self.register_buffer("load", torch.zeros(experts, dtype=torch.float64), persistent=False)
        self.register_buffer("slot_load", torch.zeros(slots, dtype=torch.float64), persistent=False)

    def forward(self):
        return self.slot_expert, self.load, self.slot_load

    def extra_repr(self) -> str:
        return f"{self.experts}, {self.total}, every={self.every}"



def _slot_order(counts_E: torch.Tensor, slot_expert_P: torch.Tensor):
    """(index_T, counts_P): the rows in slot order as indices into the rows in expert order, and the rows of each
    slot. A rank's rows of an expert with c copies go to its copies in slot order, as c contiguous chunks of
    ⌊n/c⌋ rows, the n mod c larger by one starting at the copy of index (rank mod c)."""
    rank = collectives.axis_rank("ep")
    counts, slots = counts_E.tolist(), slot_expert_P.tolist()
    first = [0] * len(counts)
    for e in range(1, len(counts)):
        first[e] = first[e - 1] + counts[e - 1]
    copies = [0] * len(counts)
    for e in slots:
        if e >= 0:
            copies[e] += 1
    seen, taken = [0] * len(counts), [0] * len(counts)
    sizes, starts = [], []
    for e in slots:
        if e < 0:
            sizes.append(0)
            starts.append(0)
            continue
        n, c, j = counts[e], copies[e], seen[e]
        q = n // c + (1 if (j - rank) % c < n % c else 0)
        sizes.append(q)
        starts.append(first[e] + taken[e])
        seen[e] += 1
        taken[e] += q
    dev = counts_E.device
    size_P = torch.tensor(sizes, dtype=torch.int64, device=dev)
    start_P = torch.tensor(starts, dtype=torch.int64, device=dev)
    total = int(sum(sizes))
    begin_P = size_P.cumsum(0) - size_P
    slot_T = torch.repeat_interleave(torch.arange(len(slots), device=dev), size_P, output_size=total)
    index_T = start_P[slot_T] + torch.arange(total, device=dev) - begin_P[slot_T]
    return index_T, size_P


def to_slots(rows_TH: torch.Tensor, counts_E: torch.Tensor, slot_expert_P: torch.Tensor, load_E: torch.Tensor,
             slot_load_P: torch.Tensor):
    """The rows in expert order -> (rows in slot order, rows per slot (P,)), for the grouped all-to-all over ep to
    the slots' ranks. Counts this forward's choices into the layer's `load_E` and `slot_load_P` (a training forward
    only: not while recomputing, nor in evaluation)."""
    index_T, counts_P = _slot_order(counts_E, slot_expert_P)
    if moe.recording() and torch.is_grad_enabled() and not recompute.recomputing():
        with torch.no_grad():
            load_E.add_(counts_E.to(load_E.dtype))
            slot_load_P.add_(counts_P.to(slot_load_P.dtype))
    return rows_TH[index_T], counts_P


def from_slots(y_TH: torch.Tensor, counts_E: torch.Tensor, slot_expert_P: torch.Tensor) -> torch.Tensor:
    """The experts' output rows in slot order -> in expert order (to_slots' inverse)."""
    index_T, _ = _slot_order(counts_E, slot_expert_P)
    back_T = torch.empty_like(index_T).scatter_(0, index_T, torch.arange(index_T.numel(), device=index_T.device))
    return y_TH[back_T]


# -- training: gradients, norms, moves -----------------------------------------------------------------------------


class _Counted:
    """A parameter as the gradient norm sees it (runtime.tensor_parallel.clip_grad_norm reads `.grad`): each expert
    counted once, its first copy's rows only (replicas and empty slots zero)."""

    def __init__(self, grad: torch.Tensor):
        self.grad = grad


def _move_rows(t: torch.Tensor, sends: list, recvs: list, local: list, group) -> int:
    """Rows of `t` (dim 0) moved between ep ranks in place: `sends[d]` my rows to rank d, `recvs[s]` the rows they
    become here from rank s, `local` (from, to) rows within this rank. One all-to-all; returns the bytes received
    (at most the rank's slots: each slot takes at most one expert; a replicated expert's source may send to several)."""
    me = dist.get_rank(group)
    flat = t.reshape(t.shape[0], -1)
    old = flat.clone()
    send = [old[idx] if d != me and idx else old.new_zeros(0, flat.shape[1]) for d, idx in enumerate(sends)]
    got = old.new_empty(sum(len(idx) for s, idx in enumerate(recvs) if s != me), flat.shape[1])
    buf = torch.cat(send) if send else old.new_zeros(0, flat.shape[1])
    collectives.count_moved("all_to_all", "ep", buf)
    dist.all_to_all_single(got, buf, [len(idx) if s != me else 0 for s, idx in enumerate(recvs)],
                           [len(idx) if d != me else 0 for d, idx in enumerate(sends)], group=group)
    at = 0
    for s, idx in enumerate(recvs):
        if s != me and idx:
            flat[idx] = got[at:at + len(idx)]
            at += len(idx)
    for src, dst in local:
        flat[dst] = old[src]
    return got.numel() * got.element_size()


# A new placement replaces the current one only where it leaves a per-rank load spread (max/mean) lower by more than
# this factor on the same measured load: a load that drifts by a few rows does not move experts back and forth.
KEEP = 1.01


class Rebalancer:
    """The re-placement of every rebalanced MoE layer of this rank's `modules` (each Experts leaf `X` with its Slots
    `X_slots`), each every `Slots.every` steps; `opt`'s AdamW state moves with the weights. `nodes`: the nodes the
    ep group spans (hierarchical placement when more than one)."""

    def __init__(self, modules, opt, ctx, nodes: int = 1, log=print):
        self.layers = []  # (name, Slots, Experts)
        for module in modules:
            named = dict(module.named_modules())
            for name, s in named.items():
                if isinstance(s, Slots):
                    experts = name.removesuffix("_slots")
                    self.layers.append((experts.removeprefix("module."), s, named[experts]))
        self.opt, self.ctx, self.nodes, self.log = opt, ctx, nodes, log
        self.group = ctx.mesh["ep"].get_group() if ctx.axis_size("ep") > 1 else None
        self.ranks = collectives.axis_size("ep")
        self.me = collectives.axis_rank("ep")
        self.moved = 0  # bytes this rank received in moves, over the run
        self._held: dict = {}  # id(Slots) -> what the step reads of its placement (`_of`), until it moves

    def _of(self, s: Slots, x) -> tuple:
        """(placement, [(local slot, row of the replicas' buffer)], first-copy mask of the local slots), read from
        the device once per placement, not every step."""
        got = self._held.get(id(s))
        if got is None:
            slots, n = s.slot_expert.tolist(), x.w_up.shape[0]
            local = slots[self.me * n:(self.me + 1) * n]
            rows = sorted({e for e in slots if e >= 0 and slots.count(e) > 1})
            at = [(i, rows.index(e)) for i, e in enumerate(local) if e in rows]
            keep = torch.tensor([e >= 0 and slots.index(e) == self.me * n + i for i, e in enumerate(local)],
                                device=s.slot_expert.device)
            got = self._held[id(s)] = (slots, at, keep)
        return got

    # the gradients

    @torch.no_grad()
    def sync_grads(self) -> None:
        """Each replicated expert's gradient summed over its copies (one all-reduce over ep per weight, of R rows: the
        replicated experts' in increasing order, zero where this rank holds no copy), written back into every copy."""
        for _, s, x in self.layers:
            extra = s.total - s.experts
            if extra == 0:
                continue
            _, at, _ = self._of(s, x)
            for p in x.parameters():
                if p.grad is None:
                    continue
                buf = p.grad.new_zeros((extra,) + tuple(p.grad.shape[1:]))
                for i, k in at:
                    buf[k] += p.grad[i]
                collectives.count_moved("all_reduce", "ep", buf)
                dist.all_reduce(buf, group=self.group)
                for i, k in at:
                    p.grad[i] = buf[k]

    def counted(self, named: list) -> list:
        """`named` (name, parameter) as the gradient norm should count them: a rebalanced layer's weights with only
        each expert's first copy (runtime.tensor_parallel.clip_grad_norm sums the squares over ep)."""
        if not self.layers:
            return named
        mask = {id(p): self._of(s, x)[2] for _, s, x in self.layers for p in x.parameters()}
        out = []
        for name, p in named:
            k = mask.get(id(p))
            if k is None or p.grad is None:
                out.append((name, p))
            else:
                out.append((name, _Counted(p.grad * k.reshape((-1,) + (1,) * (p.grad.ndim - 1)).to(p.grad.dtype))))
        return out

    # the moves

    def _tensors(self, p) -> list:
        """The parameter and its AdamW state shaped like it (exp_avg, exp_avg_sq): what moves with an expert."""
        st = self.opt.state.get(p, {})
        return [p.data] + [v for _, v in sorted(st.items()) if torch.is_tensor(v) and v.shape == p.shape]

    @torch.no_grad()
    def apply(self, s: Slots, x, new: list[int]) -> int:
        """Move a layer's experts to placement `new`; returns the bytes this rank received."""
        old = self._of(s, x)[0]
        if old == new:
            return 0
        sends, recvs, local = plan_moves(old, new, self.ranks)[self.me]
        sent = 0
        for p in x.parameters():
            for t in self._tensors(p):
                sent += _move_rows(t, sends, recvs, local, self.group)
        s.slot_expert.copy_(torch.tensor(new, dtype=s.slot_expert.dtype))
        self._held.pop(id(s))
        return sent

    @torch.no_grad()
    def after_step(self, step: int) -> None:
        """After optimizer step `step` (from 0): every `Slots.every` steps, the loads since the last re-placement
        summed over the batch ranks, each layer re-placed, the spread logged (measured before, predicted after)."""
        for name, s, x in self.layers:
            if (step + 1) % s.every:
                continue
            counts = torch.cat([s.load.double(), s.slot_load.double()])
            if self.ctx.batch_group is not None and dist.get_world_size(self.ctx.batch_group) > 1:
                dist.all_reduce(counts, group=self.ctx.batch_group)
            load, slot_load = counts[:s.experts].tolist(), counts[s.experts:].tolist()
            current = self._of(s, x)[0]
            new = align(place(load, self.ranks, x.w_up.shape[0], self.nodes), current, self.ranks, self.nodes)
            before = spread(rank_loads(slot_load, self.ranks))
            after = spread(rank_loads(predicted_slot_load(load, new), self.ranks))
            kept = spread(rank_loads(predicted_slot_load(load, current), self.ranks))
            if kept <= after * KEEP:  # not worth the moves: the current placement is as even, near enough
                new, after = current, kept
            sent = self.apply(s, x, new)
            self.moved += sent
            s.load.zero_()
            s.slot_load.zero_()
            if self.ctx.is_logger:
                self.log(f"scalec: rebalance after step {step + 1}: {name}: per-rank expert load max/mean "
                         f"{before:.2f} (measured) -> {after:.2f} (placed), {sent:,} bytes moved into this rank",
                         flush=True)

    @contextlib.contextmanager
    def canonical(self):
        """Every layer in its canonical placement inside (a checkpoint's canonical expert order), back after."""
        was = [self._of(s, x)[0] for _, s, x in self.layers]
        for _, s, x in self.layers:
            self.apply(s, x, canonical(s.experts, self.ranks, x.w_up.shape[0]))
        try:
            yield
        finally:
            for (_, s, x), placement in zip(self.layers, was):
                self.apply(s, x, placement)


def ep_nodes(ctx) -> int:
    """The nodes this rank's ep group spans (ranks grouped by LOCAL_WORLD_SIZE, torchrun's ranks per node)."""
    if ctx.axis_size("ep") == 1:
        return 1
    group = ctx.mesh["ep"].get_group()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "0")) or dist.get_world_size()
    return len({r // per_node for r in dist.get_process_group_ranks(group)})


@torch.no_grad()
def reset(module) -> None:
    """Every Slots of `module` in the canonical placement, its loads zero (buffers come out of to_empty
    uninitialised)."""
    for s in module.modules():
        if isinstance(s, Slots):
            ranks = collectives.axis_size("ep")
            s.slot_expert.copy_(torch.tensor(canonical(s.experts, ranks, s.total // ranks)))
            s.load.zero_()
            s.slot_load.zero_()
