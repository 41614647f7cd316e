"""Every op of one traced graph as seconds on a device: the step-time model's compute part (compiler/cost/step_time.py
says how the parts make a step).

A matmul runs at the device's achievable rate for its shape, never faster than its operands stream from memory; any
other op moves its bytes at the memory bandwidth; no op is faster than the device's per-op overhead. `Segment`
compiles a graph's sizes once into one function of the axis sizes and the micro-batch size; ring attention's steps
overlap their transfers with their blocks' compute (`ring_steps`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import sympy

from compiler import ops as O
from compiler import trace as T
from compiler.cost.links import Link, collective_s

# Memory-bound kernels (elementwise, norms, casts, the loss's softmax) of an eager program reach about this fraction of
# the datasheet bandwidth: a large copy reaches ~90% on H100, reductions less. Set from our H100 reference programs
# (../shared/reference/gpu-measured.json: with 1.0 the model gave 0.67-0.76 of their measured step times);
# not measured per kernel.
MEMORY_EFFICIENCY = 0.8
# Attention as Megatron-LM computed it in 2021 (`attention = "materialised"`, used to compare with their published
# figures; our programs call SDPA, whose fused kernels never write the scores): per score element of b·heads·s², the
# forward writes the 2-byte scores (baddbmm), reads and writes them in the fused scale-mask-softmax, reads them and
# writes them and a 1-byte mask in dropout, and reads them in the second bmm: 13 bytes; the backward reads the
# probabilities and writes their gradient (bmm), reads the gradient and mask and writes it (dropout), reads the
# probabilities and gradient and writes the scores' gradient (softmax), and reads that twice (two bmms): 19 bytes.
SCORE_BYTES_FORWARD = 13
SCORE_BYTES_BACKWARD = 19


# -- ops of one traced graph, compiled --------------------------------------------------------------------------


def _name(node) -> str:
    t = node.target
    return t if isinstance(t, str) else getattr(t, "__name__", str(t))


def _numel(shape) -> sympy.Expr:
    """Elements of a shape; of a tuple of shapes (a node with several outputs), their sum."""
    if any(isinstance(d, (tuple, list)) for d in shape):
        return sum((_numel(d) for d in shape if isinstance(d, (tuple, list))), sympy.Integer(0))
    return sympy.Mul(*shape) if shape else sympy.Integer(1)


_COMPILED: dict = {}
"""(args, a segment's bound expressions) -> their compiled function (`Segment._fn`), shared by equal segments."""


class Segment:
    """One traced graph's ops as numbers: `times(env, ...)` evaluates every op's sizes at once (one compiled function
    of dp, tp, ep, pp and the micro-batch size) and turns them into seconds on a device."""

    def __init__(self, gm, sub: dict, args: tuple, precision: str):
        from compiler.cost import flops as F
        from compiler.cost.activations import widths
        width = widths(precision)
        needs = F.needs_grad(gm)
        exprs: list = []
        self.ops: list = []   # (kind, index into values, grads, has_weight, is_attention, name)
        self.rings: list = []  # indices into self.ops of the ring attentions (context_parallel = ring)

        def dtype_bytes(n):
            d = n.meta.get(T.DTYPE)
            if isinstance(d, (tuple, list)):
                d = next((x for x in d if x in ("act", "res", "fp32")), None)
            return width.get(d, 0) if d is not None else 0

        def tensor_bytes(n):
            shape = n.meta.get(T.SHAPE)
            return _numel(shape) * dtype_bytes(n) if isinstance(shape, tuple) else sympy.Integer(0)

        # Compiled (runtime.compile): inductor fuses the memory-bound ops between two matmuls (or collectives) into
        # one kernel, which reads what the group takes from outside it and writes what leaves it, once each.
        group_of: dict = {}   # node -> index of its fused group (memory-bound ops and views)
        alias: dict = {}      # view -> the node whose storage it shows
        groups: list = []     # per group: its nodes
        fresh = True
        for node in gm.graph.nodes:
            if node.op in ("placeholder", "get_attr", "output"):
                continue
            op = O.find(node, gm)
            if op is not None and op.free:
                src = next(iter(node.all_input_nodes), None)
                alias[node] = alias.get(src, src) if src is not None else node
                if src in group_of:
                    group_of[node] = group_of[src]
                continue
            if (T.COLLECTIVE in node.meta or node.meta.get(T.FLOPS, 0) != 0
                    or (node.op == "call_module" and type(gm.get_submodule(node.target)).__name__ == "Repeat")):
                fresh = True
                continue
            if fresh:
                groups.append([])
                fresh = False
            group_of[node] = len(groups) - 1
            groups[-1].append(node)

        def base(n):
            return alias.get(n, n)

        def consumers(n):  # users, seen through views
            for u in n.users:
                if u in alias:
                    yield from consumers(u)
                else:
                    yield u

        self.groups: list = []  # index into the values of each fused group's bytes
        for i, members in enumerate(groups):
            inside = set(members)
            reads = {base(a) for m in members for a in m.all_input_nodes if base(a) not in inside}
            leaves = {m for m in members if any(u.op == "output" or group_of.get(u) != i for u in consumers(m))}
            moved = sum((tensor_bytes(n) for n in reads | leaves), sympy.Integer(0))
            # the loss reads its logits twice (the maximum, then the sum of exponentials)
            moved += sum((tensor_bytes(base(a)) for m in members if (mo := O.find(m, gm)) is not None
                          and mo.loss is not None for a in m.all_input_nodes[:1] if base(a) not in inside),
                         sympy.Integer(0))
            self.groups.append(len(exprs))
            exprs.append(moved)

        for node in gm.graph.nodes:
            if node.op in ("placeholder", "get_attr", "output"):
                continue
            op = O.find(node, gm)
            if T.COLLECTIVE in node.meta and (op is None or not op.computes):
                continue  # a collective alone: costed as communication (the vocabulary-parallel ops also compute)
            name = _name(node)
            if node.op == "call_module":
                mod = gm.get_submodule(node.target)
                if type(mod).__name__ == "Repeat":
                    continue
            flops = node.meta.get(T.FLOPS, 0)
            if flops != 0:
                batch, m, n_, k, weight = op.dims(node, gm) if op is not None and op.dims else self._dims(node)
                bwd = F.node_backward(node, gm, needs)
                grads = int(sympy.cancel(bwd / flops)) if bwd != 0 else 0
                # no casts: bf16 programs compute in bf16 weights without autocast (runtime/precision.py)
                cast = sympy.Integer(0)
                if op is not None and op.name == "cp_ring_attention":
                    self.rings.append(len(self.ops))
                self.ops.append(("matmul", len(exprs), grads, weight is not None, op is not None and op.attention,
                                 name))
                exprs += [flops, batch, m, n_, k, cast]
            elif op is None or not op.free:
                moved = sum((tensor_bytes(a) for a in node.all_input_nodes), sympy.Integer(0)) + tensor_bytes(node)
                if op is not None and op.loss is not None:
                    moved += 2 * sum((tensor_bytes(a) for a in node.all_input_nodes), sympy.Integer(0))
                # fused when compiled (costed in its group) unless it is one of the vocabulary-parallel ops
                self.ops.append(("memory" if node not in group_of else "fused", len(exprs), 0, False, False, name))
                exprs.append(moved)
        self._times: dict = {}  # `times` per argument; dev by id: a Segment lives in one Simulator's model
        exprs = tuple(sympy.sympify(e).xreplace(sub) for e in exprs)
        # which of `args` the times read (a search shares one segment's times between the plans that differ only
        # in the others: dp and pp, usually)
        free = set().union(*(e.free_symbols for e in exprs)) if exprs else set()
        self.reads = frozenset(i for i, a in enumerate(args) if a in free)
        key = (tuple(args), exprs)
        self._fn = _COMPILED.get(key)
        if self._fn is None:  # a search's pass structures share most segments: each compiled once (issue 37)
            self._fn = _COMPILED[key] = (sympy.lambdify(args, list(exprs), modules="math") if exprs else
                                         (lambda *a: []))

    @staticmethod
    def _dims(node):
        """(batch, M, N, K, None) of a node with FLOPs whose record gives no dims: one matmul by its output."""
        out = node.meta[T.SHAPE]
        mm = _numel(out[:-1])
        return 1, mm, out[-1], node.meta[T.FLOPS] / (2 * mm * out[-1]), None

    def times(self, env, dev, act_bytes: int, materialised: bool = False, compiled: bool = False) -> "OpTimes":
        """Seconds of one micro-batch through this graph on `dev` (`materialised`: attention scores written out,
        see SCORE_BYTES_FORWARD; `compiled`: the memory-bound ops run as fused groups); kept per argument (a
        search asks again for each recomputation and schedule of the same sizes)."""
        key = (env, id(dev), act_bytes, materialised, compiled)
        got = self._times.get(key)
        if got is None:
            got = self._times[key] = self._times_of(env, dev, act_bytes, materialised, compiled)
        return got

    def _times_of(self, env, dev, act_bytes: int, materialised: bool, compiled: bool) -> "OpTimes":
        v = self._fn(*env)
        over = dev.op_overhead_us * 1e-6
        hbm = dev.hbm_gbps * 1e9 * MEMORY_EFFICIENCY
        rate = dev.peak_tflops * 1e12 * dev.matmul_efficiency
        attention_rate = dev.peak_tflops * 1e12 * dev.attention_efficiency  # SDPA's fused kernels
        fwd = bwd = wgrad = attention = memory = 0.0
        ops = 0
        groups = [(v[i], False) for i in self.groups] if compiled else []
        ring_f = ring_b = 0.0
        rings = set(self.rings)
        for moved, _ in groups:
            t = max(moved / hbm, over)
            fwd += t
            memory += t
            bwd += max(2 * moved / hbm, over)
            ops += 2
        for j, (kind, i, grads, has_weight, is_attention, _) in enumerate(self.ops):
            if kind == "fused" and compiled:
                continue
            if kind in ("memory", "fused"):
                t = max(v[i] / hbm, over)
                fwd += t
                memory += t
                bwd += max(2 * v[i] / hbm, over)
                ops += 2
                continue
            flops, batch, m, n, k, cast = v[i:i + 6]
            util = 1.0
            if dev.tile > 1:
                tiles = batch * math.ceil(m / dev.tile) * math.ceil(n / dev.tile)
                waves = math.ceil(tiles / dev.units)
                util = batch * m * n / (waves * dev.units * dev.tile * dev.tile)
            streamed = batch * (m * k + k * n + m * n) * act_bytes / hbm
            r = rate if not is_attention or materialised else attention_rate
            one = max(flops / (r * util), streamed, over)
            t_cast = cast / hbm
            fwd += one + t_cast
            memory += t_cast
            bwd += grads * one
            if has_weight:
                wgrad += one
            if is_attention:
                if materialised:
                    scores = batch * m * n
                    fwd += scores * SCORE_BYTES_FORWARD / hbm
                    bwd += scores * SCORE_BYTES_BACKWARD / hbm
                    one += scores * SCORE_BYTES_FORWARD / hbm
                if j in rings:  # selective recomputation keeps the ring's output (compiler/ops.py `_ring_kept`)
                    ring_f += one
                    ring_b += grads * one
                else:
                    attention += one
            ops += 1 + grads
        n = len(self.rings)
        return OpTimes(fwd, bwd, wgrad, attention + memory, ops, ring_f / n if n else 0.0, ring_b / n if n else 0.0)


@dataclass(frozen=True)
class OpTimes:
    forward: float
    backward: float       # input and weight gradients
    weight: float         # of which the weight gradients (zero-bubble's W)
    selective: float      # what selective recomputation re-runs: the attention core and the memory-bound ops
    ops: int
    ring_forward: float = 0.0   # one ring attention's compute (context_parallel = ring), forward, of this graph's
    ring_backward: float = 0.0  # ... and backward: what its transfers overlap (`ring_steps`)

    def __add__(self, o):
        return OpTimes(self.forward + o.forward, self.backward + o.backward, self.weight + o.weight,
                       self.selective + o.selective, self.ops + o.ops)

    def __mul__(self, k):
        return OpTimes(self.forward * k, self.backward * k, self.weight * k, self.selective * k, self.ops * k)


ZERO = OpTimes(0.0, 0.0, 0.0, 0.0, 0)


def ring_steps(cp: int, block_bytes: float, forward_s: float, backward_s: float, link: Link) -> dict:
    """The steps of one ring attention (runtime/context_parallel.py `_RingAttention`) as (transfer, compute) pairs in
    seconds, "forward" and "backward": each step's transfer is in flight while the block held is computed, so a
    step takes max(transfer, compute) and its exposed communication is max(0, transfer − compute) (`ring_exposed`).

    `block_bytes`: one rank's keys (the values are as large; a message carries both, or both their gradients);
    `forward_s`, `backward_s`: the whole ring attention's compute, split over its blocks as the FLOPs count them
    (compiler/ops.py `_ring_shape`): the own block S/cp keys a query, each other rank's half of that, so the own
    block is 2/(cp + 1) of it and each other one 1/(cp + 1). Forward, step i's transfer (the block held, sent on)
    overlaps block i's compute, cp − 1 of them. Backward, step 0's keys and values overlap block 0; at each later
    step the previous block's gradients (sent once added to) and the next keys and values (if any) overlap its
    block; the last gradients' hop home overlaps nothing.

    It assumes what the runtime provides on GPU: the P2P runs on NCCL's own stream beside the compute, the link at
    its full rate while the device computes. On CPU (gloo) the transfer runs in gloo's threads, competing with the
    compute for the cores, so the overlap is whatever those threads give (bench/context_parallel.py measures it)."""
    msg = collective_s("send_recv", 2 * block_bytes, link)  # keys and values (or their gradients): one message
    own, other = 2 / (cp + 1), 1 / (cp + 1)
    forward = [(msg, forward_s * (own if i == 0 else other)) for i in range(cp - 1)]
    backward = [(msg if i == 0 else msg * (1 + (i < cp - 1)), backward_s * (own if i == 0 else other))
                for i in range(cp)] + [(msg, 0.0)]
    return {"forward": forward, "backward": backward}


def ring_exposed(steps) -> float:
    """Seconds of a ring's communication not hidden under its compute: Σ max(0, transfer − compute) over its steps."""
    return sum(max(0.0, t - c) for t, c in steps)
