"""Context parallelism over the `cp` mesh axis: each rank of a cp group holds 1/cp of every sequence.

The sequence is cut into 2·cp chunks and cp rank i holds chunks i and 2·cp − 1 − i (the "head-tail" balancer of
Megatron-Core and torchtitan): under a causal mask every rank then has the same work, the first chunk's few keys per
query paired with the last chunk's many. Everything position-dependent follows the permutation, so each token keeps
its true position:
  - `chunks(x, dim)`: this rank's tokens and targets of a batch (runtime.model_parts, before the model sees them);
  - `positions(n, device)`: the true positions of this rank's n tokens (the learned `positional` lookup);
  - `rotate(q, k, theta, scaling, interleaved)`: rotary embeddings at those positions;
  - `attention(q, k, v, gqa)`: causal attention of this rank's queries against the keys and values gathered over cp
    (`context_parallel = all_gather`: the pass inserts the all-gathers, collectives.all_gather_fwd_reduce_scatter_bwd
    along the sequence, before it), each query reading the keys at or before its true position. On CPU and CUDA a
    dense additive mask with scaled_dot_product_attention, made once per (length, cp rank, device, dtype).
  - `ring_attention(q, k, v, gqa)` (`context_parallel = ring`): the keys and values passed around cp instead;
  - `heads_to_sequence(x)`, `sequence_to_heads(x)` (`context_parallel = all_to_all`, Ulysses): all-to-alls to
    heads / cp over the whole sequence in natural order, and back.

The all-gather concatenates the ranks' chunks in rank order, so the gathered keys are at positions
`gathered_positions()`: rank 0's two chunks, then rank 1's, ... The loss needs nothing: every rank holds as many
tokens, so the mean of the ranks' token means is the sequence's mean (the batch group averages over cp).
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F

from runtime import collectives, faults, recompute, rotary

AXIS = "cp"


def _order(n: int, rank: int) -> list:
    """The chunk indices (of 2n) rank `rank` of n holds, in the order it holds them."""
    return [rank, 2 * n - 1 - rank]


def _make_positions(local: int, n: int, rank: int, device: torch.device) -> torch.Tensor:
    if local % 2:
        raise ValueError(f"context parallelism: {local} tokens per rank do not split into two chunks")
    c = local // 2
    return torch.cat([torch.arange(i * c, (i + 1) * c, device=device) for i in _order(n, rank)])


_cached_positions = functools.lru_cache(maxsize=64)(_make_positions)


def _positions(local: int, n: int, rank: int, device: torch.device) -> torch.Tensor:
    """`_make_positions`, made once per (length, cp size, rank, device) in an eager program; inside a compiled
    region (runtime.compile) made in the graph instead: dynamo traces through a cache (warning that it does), and
    the arange is a constant of the region, which inductor folds or computes in a kernel."""
    return (_make_positions if torch.compiler.is_compiling() else _cached_positions)(local, n, rank, device)


def positions(local: int, device: torch.device | None = None, axis: str = AXIS) -> torch.Tensor:
    """The true positions (int64) of this cp rank's `local` tokens: chunks i and 2·cp − 1 − i of the sequence."""
    n = collectives.axis_size(axis)
    if n == 1:
        return torch.arange(local, device=device)
    return _positions(local, n, collectives.axis_rank(axis), torch.device(device) if device is not None else
                      torch.device("cpu"))


def gathered_positions(local: int, device: torch.device, axis: str = AXIS) -> torch.Tensor:
    """The positions of the keys gathered over cp (every rank's `local` tokens, in rank order)."""
    n = collectives.axis_size(axis)
    return torch.cat([_positions(local, n, r, device) for r in range(n)]) if n > 1 else torch.arange(local,
                                                                                                     device=device)


def chunks(x: torch.Tensor, dim: int = 1, axis: str = AXIS) -> torch.Tensor:
    """This cp rank's tokens of `x` along `dim` (the sequence): chunks i and 2·cp − 1 − i of 2·cp, contiguous."""
    n = collectives.axis_size(axis)
    if n == 1:
        return x
    if x.shape[dim] % (2 * n):
        raise ValueError(f"context parallelism over {n} ranks: a sequence of {x.shape[dim]} tokens does not cut into "
                         f"{2 * n} equal chunks")
    parts = x.chunk(2 * n, dim)
    return torch.cat([parts[i] for i in _order(n, collectives.axis_rank(axis))], dim).contiguous()


def rotate(q_BHSD: torch.Tensor, k_BKSD: torch.Tensor, theta: float, scaling=None, interleaved: bool = False,
           axis: str = AXIS):
    """rotary.rotate at this cp rank's true positions (its queries and keys before the gather)."""
    pos = positions(q_BHSD.shape[2], q_BHSD.device, axis)
    return rotary.rotate(q_BHSD, k_BKSD, theta, scaling, interleaved=interleaved, positions=pos)


def _make_mask(local: int, n: int, rank: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    q = _positions(local, n, rank, device)
    k = torch.cat([_positions(local, n, r, device) for r in range(n)])
    keep = k[None, :] <= q[:, None]
    return torch.zeros(keep.shape, device=device, dtype=dtype).masked_fill(~keep, float("-inf"))


_mask = functools.lru_cache(maxsize=16)(_make_mask)


def _shared_mask(local: int, n: int, rank: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """`_mask`, inside a compiled region (runtime.compile): dynamo calls this once when it traces and takes the
    tensor as a constant of the region, so every layer reads and keeps for backward the one cached mask, as the
    eager program does (made in the graph, the partitioner kept a copy per layer without recomputation: measured,
    tests/test_memory_compiled.py). Marked so by `mark_compiled_constants`, before anything is compiled."""
    return _mask(local, n, rank, device, dtype)


def mark_compiled_constants() -> None:
    """Tell dynamo that `_shared_mask`'s result is a constant of each compiled region (`assume_constant_result`).
    runtime.compile calls it before it compiles anything. Not a decorator at import: `torch._dynamo` is imported
    on first access, and that import was 0.7 s of CPU on every import of this module, the compiler's among them
    (compiler/ops/attention.py keys its op records by this module's functions: `scalec search` and `plan` paid it
    without compiling anything)."""
    torch._dynamo.assume_constant_result(_shared_mask)


def causal_mask(local: int, device: torch.device, dtype: torch.dtype, axis: str = AXIS) -> torch.Tensor:
    """(local, cp · local), added to the scores: 0 where this rank's query may read a gathered key (the key's true
    position at or before the query's), -inf elsewhere. Additive, in the scores' dtype, and made once per (length,
    rank, device, dtype): scaled_dot_product_attention keeps it for backward as it is (a boolean mask would be
    converted, and the copy kept, at every call)."""
    n, rank = collectives.axis_size(axis), collectives.axis_rank(axis)
    return (_shared_mask if torch.compiler.is_compiling() else _mask)(local, n, rank, device, dtype)


def attention(q_BHSD: torch.Tensor, k_BKTD: torch.Tensor, v_BKTD: torch.Tensor, gqa: bool, axis: str = AXIS,
              scale: float | None = None) -> torch.Tensor:
    """Causal attention of this rank's queries (B, H, S/cp, D) over the keys and values of the whole sequence
    (B, K, S, D), gathered over cp in rank order: each query reads the keys at or before its true position.
    (B, H, S/cp, Dv) out; `scale` None is 1/sqrt(D)."""
    mask = causal_mask(q_BHSD.shape[2], q_BHSD.device, q_BHSD.dtype, axis)
    return F.scaled_dot_product_attention(q_BHSD, k_BKTD, v_BKTD, attn_mask=mask, enable_gqa=gqa, scale=scale)


# -- context_parallel = ring: the keys and values passed around the cp group ---------------------------------------


class _Transfer:
    """One step of the ring in flight: `x` sent to the next cp rank and the previous one's (same shape) being
    received, P2P (torch.distributed.batch_isend_irecv), counted as one send_recv of `x`'s bytes when posted.
    `wait()` returns what was received; the wait is the blocking region the fault watchdog names."""
    __slots__ = ("sent", "got", "works", "what", "site")

    def __init__(self, x: torch.Tensor, axis: str, site, what: str):
        group = collectives._group(axis)
        n, rank = collectives.axis_size(axis), collectives.axis_rank(axis)
        self.sent = x = x.contiguous()  # held until the wait: the send reads it meanwhile
        self.got = torch.empty_like(x)
        self.what, self.site = f"send_recv over {axis} ({what})", faults.axis_site(site, axis)
        collectives._count("send_recv", axis, x)
        ops = [dist.P2POp(dist.isend, x, dist.get_global_rank(group, (rank + 1) % n), group),
               dist.P2POp(dist.irecv, self.got, dist.get_global_rank(group, (rank - 1) % n), group)]
        with faults.op(self.what, self.site):  # posting: the last operation queued, should the device hang
            self.works = dist.batch_isend_irecv(ops)

    def wait(self) -> torch.Tensor:
        with faults.op(self.what, self.site):
            for work in self.works:
                work.wait()
        self.sent = None
        return self.got


def _block(n: int, rank: int, owner: int, local: int):
    """Which of this rank's queries (rows) read which keys (cols) of `owner`'s block, and whether a mask is needed.
    With the head-tail layout a block is never wholly masked: the own block is the causal diagonal; an earlier
    rank's block is read whole by every query in its first chunk (the earlier chunk), its last chunk by none; a
    later rank's block is read whole by this rank's last chunk and not at all by its first."""
    c = local // 2
    if owner == rank:
        return slice(None), slice(None), True
    if owner < rank:
        return slice(None), slice(0, c), False
    return slice(c, None), slice(None), False


@functools.lru_cache(maxsize=16)
def _diagonal_mask(local: int, n: int, rank: int, device: torch.device) -> torch.Tensor:
    q = _positions(local, n, rank, device)
    return torch.zeros(local, local, device=device).masked_fill(q[None, :] > q[:, None], float("-inf"))


def _expand(k: torch.Tensor, heads: int) -> torch.Tensor:
    g = heads // k.shape[1]
    return k if g == 1 else k.repeat_interleave(g, dim=1)


@torch.library.custom_op("scalec::ring_attention_forward", mutates_args=())
def _ring_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, axis: str, scale: float, file: str,
                  line: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ring's forward (the output and its log-sum-exp per row and head, fp32 at least), one operator to torch:
    selective recomputation (runtime.recompute, `keep`) saves its two outputs as it saves a collective's, so the
    block's recomputation reads them back instead of sending the keys and values round again, and keeps none of
    the blocks' scores or partial products (which it would, as matmul outputs, were the steps visible to it).
    `file`, `line`: the generated program's call (faults.caller_site), "" and 0 for none."""
    site = (file, line) if file else None
    n, rank = collectives.axis_size(axis), collectives.axis_rank(axis)
    b, h, s, _ = q.shape
    acc = torch.promote_types(q.dtype, torch.float32)  # the accumulators: fp32 at least
    qf = q.to(acc)
    out = torch.zeros(b, h, s, v.shape[-1], device=q.device, dtype=acc)
    lse = torch.full((b, h, s), float("-inf"), device=q.device, dtype=acc)
    kv = torch.stack((k, v))
    for step in range(n):
        owner = (rank - step) % n
        # the block held goes on to the next rank while this rank computes with it
        ahead = _Transfer(kv, axis, site, f"ring attention, forward step {step + 1}") if step < n - 1 else None
        rows, cols, masked = _block(n, rank, owner, s)
        kb, vb = _expand(kv[0].to(acc), h)[:, :, cols], _expand(kv[1].to(acc), h)[:, :, cols]
        scores = qf[:, :, rows] @ kb.transpose(-1, -2) * scale
        if masked:
            scores = scores + _diagonal_mask(s, n, rank, q.device).to(acc)
        merged = torch.logaddexp(lse[:, :, rows], torch.logsumexp(scores, -1))
        out[:, :, rows] = (out[:, :, rows] * (lse[:, :, rows] - merged).exp().unsqueeze(-1)
                           + (scores - merged.unsqueeze(-1)).exp() @ vb)
        lse[:, :, rows] = merged
        kv = ahead.wait() if ahead is not None else None
    return out.to(q.dtype), lse


@_ring_forward.register_fake
def _(q, k, v, axis, scale, file, line):
    acc = torch.promote_types(q.dtype, torch.float32)
    return q.new_empty((*q.shape[:3], v.shape[-1])), q.new_empty(q.shape[:3], dtype=acc)


recompute.keep(torch.ops.scalec.ring_attention_forward.default)


class _RingAttention(torch.autograd.Function):
    """Causal attention over keys and values passed around the cp ring (cp − 1 steps forward), each block's partial
    output merged by the log-sum-exp rule (fp32 accumulators). Backward recomputes each block's probabilities
    from the saved log-sum-exp (the flash-attention rule) while the keys and values go round again, with their
    gradients travelling along and one more hop home: 2·(cp − 1) + 2·cp blocks of the keys' size sent.

    The transfers overlap the compute: each step posts the send of the block it holds (and the receive of the next)
    before computing with it, and waits only when it needs the next block; backward, the keys and values likewise,
    and each block's travelling gradients, sent once this rank has added its share, are waited for only when the
    next block's share is ready to be added (the final hop home after the last block). The arithmetic and its order
    are the unoverlapped ring's, so the result is the same to the bit; on CUDA the P2P runs on NCCL's own stream, on
    CPU gloo in its threads."""

    @staticmethod
    def forward(ctx, q, k, v, axis, scale, site):
        out, lse = _ring_forward(q, k, v, axis, scale, *(site or ("", 0)))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.axis, ctx.scale, ctx.site = axis, scale, site
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v, out, lse = ctx.saved_tensors
        axis, scale, site = ctx.axis, ctx.scale, ctx.site
        n, rank = collectives.axis_size(axis), collectives.axis_rank(axis)
        b, h, s, _ = q.shape
        kvh = k.shape[1]
        acc = torch.promote_types(q.dtype, torch.float32)
        qf, gf = q.to(acc), g.to(acc)
        dot = (gf * out.to(acc)).sum(-1)   # rowsum(dO ∘ O)
        dq = torch.zeros_like(qf)
        kv = torch.stack((k, v))
        dkv = torch.zeros_like(kv)         # the gradients of the block held, travelling with it
        back = None                        # those gradients in flight from the previous rank
        for step in range(n):
            owner = (rank - step) % n
            ahead = (_Transfer(kv, axis, site, f"ring attention, backward step {step + 1}: keys and values")
                     if step < n - 1 else None)
            rows, cols, masked = _block(n, rank, owner, s)
            kb, vb = _expand(kv[0].to(acc), h)[:, :, cols], _expand(kv[1].to(acc), h)[:, :, cols]
            qr, gr = qf[:, :, rows], gf[:, :, rows]
            scores = qr @ kb.transpose(-1, -2) * scale
            if masked:
                scores = scores + _diagonal_mask(s, n, rank, q.device).to(acc)
            p = (scores - lse[:, :, rows].unsqueeze(-1)).exp()
            dv = p.transpose(-1, -2) @ gr
            ds = p * (gr @ vb.transpose(-1, -2) - dot[:, :, rows].unsqueeze(-1))
            dq[:, :, rows] += ds @ kb * scale
            dk = ds.transpose(-1, -2) @ qr * scale
            if kvh != h:  # grouped-query: each key head's gradient sums its group of query heads
                dk = dk.unflatten(1, (kvh, h // kvh)).sum(2)
                dv = dv.unflatten(1, (kvh, h // kvh)).sum(2)
            if back is not None:  # this block's gradients so far, needed only now
                dkv = back.wait()
            dkv[0][:, :, cols] += dk.to(dkv.dtype)
            dkv[1][:, :, cols] += dv.to(dkv.dtype)
            back = _Transfer(dkv, axis, site, f"ring attention, backward step {step + 1}: gradients" if step < n - 1
                             else "ring attention, backward: gradients home")  # the last: the next rank's, home
            if ahead is not None:
                kv = ahead.wait()
        dkv = back.wait()
        return dq.to(q.dtype), dkv[0], dkv[1], None, None, None


def ring_attention(q_BHSD: torch.Tensor, k_BKSD: torch.Tensor, v_BKSD: torch.Tensor, gqa: bool, axis: str = AXIS,
                   scale: float | None = None) -> torch.Tensor:
    """Causal attention of this rank's queries (B, H, S/cp, D) over the whole sequence, the keys and values
    (B, K, S/cp, D) passed around the cp group (`context_parallel = ring`): cp − 1 steps, each reading the block
    received by the true positions, the partial outputs merged by their log-sum-exp. (B, H, S/cp, Dv) out."""
    scale = 1.0 / q_BHSD.shape[-1] ** 0.5 if scale is None else scale
    if collectives.axis_size(axis) == 1:
        return F.scaled_dot_product_attention(q_BHSD, k_BKSD, v_BKSD, is_causal=True, enable_gqa=gqa, scale=scale)
    return _RingAttention.apply(q_BHSD, k_BKSD, v_BKSD, axis, scale, faults.caller_site())


# -- context_parallel = all_to_all (Ulysses): heads scattered, the sequence gathered ------------------------------


def _natural(n: int) -> list:
    """For each chunk of the sequence (of 2n), where it sits in the order gathered over cp (rank 0's two chunks,
    then rank 1's, ...)."""
    gathered = [c for r in range(n) for c in _order(n, r)]
    return [gathered.index(c) for c in range(2 * n)]


def _exchange(x: torch.Tensor, axis: str, site, what: str) -> torch.Tensor:
    """all_to_all_single over `axis` with equal splits along dim 0, counted as one all_to_all of `x`'s bytes."""
    x = x.contiguous()
    splits = [x.shape[0] // collectives.axis_size(axis)] * collectives.axis_size(axis)
    collectives._count("all_to_all", axis, x)
    with faults.op(f"all_to_all over {axis} ({what})", faults.axis_site(site, axis)):
        return collectives._F.wait_tensor(collectives._F.all_to_all_single(x, splits, splits,
                                                                           collectives._name(axis)))


def _to_sequence(x: torch.Tensor, axis: str, site, what: str) -> torch.Tensor:
    n = collectives.axis_size(axis)
    b, h, s, d = x.shape
    if h % n:
        raise ValueError(f"context parallelism (all_to_all): {h} heads do not divide over {axis} = {n}")
    got = _exchange(x.unflatten(1, (n, h // n)).movedim(1, 0), axis, site, what)  # (source rank, B, H/n, S/n, D)
    whole = got.movedim(0, 2).reshape(b, h // n, 2 * n, s // 2, d)                 # chunks in rank order
    return whole[:, :, _natural(n)].flatten(2, 3)


def _to_heads(x: torch.Tensor, axis: str, site, what: str) -> torch.Tensor:
    n = collectives.axis_size(axis)
    b, hl, s, d = x.shape
    mine = x.unflatten(2, (2 * n, s // (2 * n)))[:, :, [c for r in range(n) for c in _order(n, r)]]
    got = _exchange(mine.reshape(b, hl, n, s // n, d).movedim(2, 0), axis, site, what)  # (source rank, B, H/n, ...)
    return got.movedim(0, 1).reshape(b, n * hl, s // n, d)


class _HeadsToSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, axis, site):
        ctx.axis, ctx.site = axis, site
        return _to_sequence(x, axis, site, "heads to sequence, forward")

    @staticmethod
    def backward(ctx, g):
        return _to_heads(g, ctx.axis, ctx.site, "heads to sequence, backward"), None, None


class _SequenceToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, axis, site):
        ctx.axis, ctx.site = axis, site
        return _to_heads(x, axis, site, "sequence to heads, forward")

    @staticmethod
    def backward(ctx, g):
        return _to_sequence(g, ctx.axis, ctx.site, "sequence to heads, backward"), None, None


def heads_to_sequence(x_BHSD: torch.Tensor, axis: str = AXIS) -> torch.Tensor:
    """Forward: all-to-all over `axis`, (B, H, S/cp, D) -> (B, H/cp, S, D): this rank's heads over the whole
    sequence, in natural order (the head-tail chunks put back). Backward: the inverse all-to-all."""
    if collectives.axis_size(axis) == 1:
        return x_BHSD
    return _HeadsToSequence.apply(x_BHSD, axis, faults.caller_site())


def sequence_to_heads(x_BHSD: torch.Tensor, axis: str = AXIS) -> torch.Tensor:
    """Forward: all-to-all over `axis`, (B, H/cp, S, D) in natural order -> (B, H, S/cp, D): every head at this
    rank's chunks (i and 2·cp − 1 − i). Backward: the inverse all-to-all."""
    if collectives.axis_size(axis) == 1:
        return x_BHSD
    return _SequenceToHeads.apply(x_BHSD, axis, faults.caller_site())
