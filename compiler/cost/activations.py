"""What a forward keeps for its backward, node by node, as formulas of the spec's sizes and the micro-batch size.

Autograd keeps, for each operation, the tensors its backward formula reads (torch's derivatives.yaml and our own
autograd Functions in runtime/). The rules below say which, for every operation our layers emit, and in which
dtype; a tensor several operations keep (a linear's input that its norm's output also is) counts once, by the
storage it lives in: a view (transpose, unflatten, a flatten that needs no copy) shares its base's storage.

Under bf16 (runtime/precision.py, Megatron's policy: bf16 weights, no autocast) every kept tensor is in its
node's DTYPE (compiler/trace.py): the compute precision, fp32 where the program casts (the loss), the residual
stream bf16 or, with the plan's fp32_residual, fp32. No weight copies and no per-call casts are kept. `precision`
is "fp32", "bf16" or "bf16/fp32_residual" (`precision_key`).

Device differences (`device`): scaled_dot_product_attention's flash kernels on CUDA and on CPU both keep q, k, v,
the output and a log-sum-exp per row and head (fp32), never the s×s scores; nn.RMSNorm is fused on CUDA (keeps its
input and the reciprocal RMS per row) but composite on CPU (also keeps the normalised input, fp32). The CPU figures
are what tests/test_memory.py counts with torch.autograd.graph.saved_tensors_hooks.
"""
from __future__ import annotations

import operator

import sympy

from compiler.lazy import lazy

T = lazy("compiler.trace")

INT_BYTES = 8  # token ids, targets, positions and slots are int64


def _numel(shape) -> sympy.Expr:
    return sympy.Mul(*shape) if shape else sympy.Integer(1)


def precision_key(spec) -> str:
    """The precision the activation formulas take: the train section's, with the plan's fp32 residual stream."""
    prec = spec.train.precision
    return "bf16/fp32_residual" if prec == "bf16" and getattr(spec.plan, "fp32_residual", False) else prec


def widths(precision: str) -> dict:
    """Bytes per element of each DTYPE kind under `precision` (module docstring)."""
    bf16 = precision.startswith("bf16")
    return {"act": 2 if bf16 else 4, "res": 4 if not bf16 or precision.endswith("fp32_residual") else 2,
            "fp32": 4, "int": INT_BYTES}


def width_of(node, precision: str) -> int:
    """Bytes per element of `node`'s output (4 for a kind without one: a float of unknown kind)."""
    return widths(precision).get(node.meta.get(T.DTYPE), 4)


class _Graph:
    """One traced graph's saved tensors: key (storage) -> bytes."""

    def __init__(self, gm, precision: str, device: str, recompute: str = "none"):
        self.recompute = recompute
        import torch.nn.functional as F
        from runtime import collectives as C
        from runtime import moe
        self.gm, self.device = gm, device
        self.precision = precision
        self.widths = widths(precision)
        self.act = self.widths["act"]
        self.params = gm.meta[T.PARAM_SHAPES]
        self.saved: dict = {}
        self.F, self.C, self.moe = F, C, moe
        self.views = {}  # node -> the node whose storage it shares
        self.count, self.last, self.previous = 0, None, None  # the last node that kept something

    # -- storage and dtype --------------------------------------------------------------------------------------

    def base(self, node):
        while node in self.views:
            node = self.views[node]
        return node

    def bytes_of(self, node) -> sympy.Expr:
        return _numel(node.meta[T.SHAPE]) * self.widths.get(node.meta.get(T.DTYPE), 4)

    def keep(self, node) -> None:
        """The node's value kept as it is (its storage)."""
        b = self.base(node)
        self.saved.setdefault(("t", b), self.bytes_of(node))

    def keep_matmul_input(self, node, consumer) -> None:
        """An operand of a matmul: kept as it is (its weight is the parameter itself: model state)."""
        self.keep(node)

    def new(self, node, key, shape, width) -> None:
        self.saved[(key, node)] = _numel(shape) * width

    # -- the rules ----------------------------------------------------------------------------------------------

    def run(self, repeats=None) -> sympy.Expr:
        from torch import nn
        from runtime.layers import Bias, Repeat
        from runtime import rotary
        F, C, moe = self.F, self.C, self.moe
        extra = sympy.Integer(0)
        for node in self.gm.graph.nodes:
            if len(self.saved) > self.count:
                self.count, self.last = len(self.saved), self.previous
            self.previous = node
            t = node.target
            args = [a for a in node.args]
            if node.op in ("placeholder", "get_attr", "output"):
                continue
            if node.op == "call_module":
                mod = self.gm.get_submodule(t)
                x = args[0]
                if isinstance(mod, nn.Linear):
                    self.keep_matmul_input(x, node)
                elif isinstance(mod, nn.LayerNorm):
                    self._norm_input(x, node)
                    rows = _numel(x.meta[T.SHAPE][:-1])
                    # mean and reciprocal std: fp32 on CUDA; on CPU in the input's dtype
                    stat = 4 if self.device == "cuda" else self.widths.get(x.meta.get(T.DTYPE), 4)
                    self.new(node, "stats", (rows,), 2 * stat)
                elif isinstance(mod, nn.RMSNorm):
                    rows = _numel(x.meta[T.SHAPE][:-1])
                    if self.device == "cuda":  # fused: its input and the reciprocal RMS per row
                        self._norm_input(x, node)
                        self.new(node, "stats", (rows,), 4)
                    else:  # composite: its input upcast to fp32 (a copy when bf16), the reciprocal RMS and x·rstd
                        if self.widths.get(x.meta.get(T.DTYPE), 4) < 4:
                            self.new(node, "upcast", x.meta[T.SHAPE], 4)
                        else:
                            self._norm_input(x, node)
                        self.new(node, "stats", (rows,), 4)
                        self.new(node, "normed", x.meta[T.SHAPE], 4)
                elif isinstance(mod, nn.Embedding):
                    self.keep(x)  # the ids
                elif isinstance(mod, Bias):
                    pass
                elif isinstance(mod, moe.Experts):
                    self._experts(node, mod, x)
                elif isinstance(mod, Repeat):
                    count, block = repeats[t]
                    extra += count * block_saved_bytes(block, self.precision, self.device, self.recompute)
                else:
                    raise NotImplementedError(f"no saved-tensor rule for module {type(mod).__name__}")
                continue
            if t in ("unflatten", "transpose", "view", "view_as") or t is getattr:
                if isinstance(args[0], type(node)):
                    self.views[node] = args[0]
            elif t == "flatten":
                src = args[0]
                # A flatten of a transposed tensor copies, except scaled_dot_product_attention's output, which the
                # flash kernels lay out as (batch, seq, heads, dim): transposing it back is contiguous.
                if src.target == "transpose" and src.args[0].target is not F.scaled_dot_product_attention:
                    continue
                self.views[node] = src
            elif t in ("float", "to", "contiguous"):
                if node.meta.get(T.DTYPE) == args[0].meta.get(T.DTYPE) and t != "contiguous":
                    self.views[node] = args[0]
            elif t is operator.getitem:
                pass  # an element of a tuple result: its own storage
            elif t is F.linear:
                self.keep_matmul_input(args[0], node)
            elif t is F.scaled_dot_product_attention:
                q, k, v = args[:3]
                for a in (q, k, v):
                    self.keep_matmul_input(a, node)
                b, h, s, _ = node.meta[T.SHAPE]
                self.saved[("t", node)] = _numel(node.meta[T.SHAPE]) * self.act  # the output
                self.new(node, "lse", (b, h, s), 4)
            elif t in (F.gelu, F.silu):
                self.keep(args[0])
            elif t in (F.relu, torch_tanh()):
                self.keep(node)
            elif t in (operator.mul, "mul"):
                for a in args[:2]:
                    if hasattr(a, "meta") and a.meta.get(T.SHAPE) is not None:
                        self.keep(a)
            elif t in (operator.add, operator.sub, "add", "sub"):
                pass
            elif t is F.cross_entropy:
                logits, targets = args[:2]
                self.new(node, "log_softmax", logits.meta[T.SHAPE], 4)
                self.keep(targets)
            elif t is C.vocab_parallel_cross_entropy:
                logits = args[0]
                n = logits.meta[T.SHAPE][0]
                self.new(node, "softmax", logits.meta[T.SHAPE], 4)
                self.new(node, "mine", (n,), 1)
                self.new(node, "local", (n,), INT_BYTES)
            elif t is C.vocab_parallel_lookup:
                tokens = args[0]
                self.new(node, "ids", tokens.meta[T.SHAPE], INT_BYTES)   # the shifted, masked ids
                self.new(node, "outside", tokens.meta[T.SHAPE], 1)       # the mask of foreign ids
            elif t is C.identity_fwd_all_reduce_bwd:
                self.views[node] = args[0]
            elif t in (C.all_reduce_fwd_identity_bwd, C.all_gather_fwd_reduce_scatter_bwd,
                       C.reduce_scatter_fwd_all_gather_bwd, C.split_fwd_all_gather_bwd,
                       moe.all_to_all_dispatch, moe.all_to_all_combine):
                pass  # a new tensor; the collective's backward keeps nothing
            elif t is torch_arange():
                pass
            elif t is rotary.rotate:  # its cosines and sines, (S, D) each in the queries' dtype
                b, h, s, d = args[0].meta[T.SHAPE]
                self.new(node, "angles", (2, s, d), self.act)
            elif t is moe.route:
                self._route(node, args)
            elif t is moe.dispatch:
                b, s, k = args[1].meta[T.SHAPE]
                self.new(node, "index", (b, s * k), INT_BYTES)  # scatter_add's index: a copy of the (strided) slots
            elif t is moe.combine:
                self._combine(node, args)
            else:
                raise NotImplementedError(f"no saved-tensor rule for {getattr(t, '__name__', t)} at {node.name}")
        if len(self.saved) > self.count:
            self.count, self.last = len(self.saved), self.previous
        return sympy.expand(sum(self.saved.values(), sympy.Integer(0)) + extra)

    def _norm_input(self, x, node) -> None:
        # torch's norm kernels read a bf16 input as it is (statistics accumulated in fp32 inside)
        self.keep(x)

    def _experts(self, node, mod, x) -> None:
        e, n, _ = x.meta[T.SHAPE]
        f = self.params[f"{node.target}.w_up"][2]
        self.keep_matmul_input(x, node)
        hidden = e * n * f * self.act
        # GELU: its input, and its output (the down matmul's input); SwiGLU: the gate (silu's input), silu's output,
        # the up projection (the product's operands) and their product (the down matmul's input).
        self.saved[("experts", node)] = hidden * (4 if mod.act == "swiglu" else 2)

    def _route(self, node, args) -> None:
        logits = args[0]
        b, s, e = logits.meta[T.SHAPE]
        k = args[1]
        self.new(node, "probs", (b, s, e), 4)             # softmax's output (fp32)
        self.new(node, "topk", (b, s, k), INT_BYTES)      # topk's indices
        if k > 1:
            self.new(node, "norm", (b, s, k), 4)          # the division's operands: gates and their sum
            self.new(node, "sum", (b, s, 1), 4)
        self.new(node, "aux", (b, e), 4)                  # the aux loss's product: the mean probabilities

    def _combine(self, node, args) -> None:
        y, slot, gate = args[:3]
        e, n, h = y.meta[T.SHAPE]
        b, s, k = slot.meta[T.SHAPE]
        self.new(node, "index", (b, s * k), INT_BYTES)     # gather's index: a copy of the (strided) slots
        self.new(node, "outputs", (b, e * n / b + 1, h), self.act)  # gather's input: the outputs + a zero slot
        self.new(node, "picked", (b, s, k, h), self.act)   # the product's operands: the picked outputs,
        self.new(node, "weights", (b, s, k), self.act)     # and the gates in the compute dtype
        if len(args) > 3 and args[3] is not None:          # dropped = identity: Σ gate × dropped, times the token
            self.new(node, "dropped", (b, s, k), self.act)
            self.new(node, "gate_sum", (b, s, 1), self.act)
            self.keep(args[3])


def torch_tanh():
    import torch
    return torch.tanh


def torch_arange():
    import torch
    return torch.arange


def saved_bytes(gm, precision: str, device: str = "cuda", repeats=None, recompute: str = "none") -> sympy.Expr:
    """Bytes one forward of `gm` (one micro-batch of µb sequences) keeps for its backward on one rank; the blocks
    of its `repeat`s under `recompute`."""
    return _Graph(gm, precision, device, recompute).run(repeats)


def last_saving_node(gm):
    """The last node of `gm` whose operation keeps a tensor for backward."""
    g = _Graph(gm, "bf16", "cuda")
    g.run()
    return g.last


# Under selective recomputation these keep their outputs (computing them again costs matmul time or
# communication); everything else in a block is recomputed in backward from them and the block's input, the
# sequence-parallel all-gathers too (runtime.recompute.RECOMPUTE: gathered again, as Megatron's sequence-parallel
# linears keep their input sharded; the ledger and the step time count the gather's second run).
def _kept_by_selective(node, gm) -> bool:
    import torch.nn.functional as F
    from torch import nn
    from runtime import collectives as C
    from runtime import moe
    if node.op == "call_module":
        return isinstance(gm.get_submodule(node.target), (nn.Linear, moe.Experts))
    return node.target in (F.linear, C.all_reduce_fwd_identity_bwd, C.reduce_scatter_fwd_all_gather_bwd,
                           moe.all_to_all_dispatch, moe.all_to_all_combine)


# Operations whose backward needs none of their inputs' values: sums, views, casts, collectives, a bias.
def _passes_through(node, gm) -> bool:
    import torch
    import torch.nn.functional as F  # noqa: F401
    from runtime import collectives as C
    from runtime.layers import Bias
    if node.op == "output":
        return True
    if node.op == "call_module":
        return isinstance(gm.get_submodule(node.target), Bias)
    return (node.target in (operator.add, operator.sub, operator.neg, torch.add, torch.sub, getattr,
                            operator.getitem, C.all_reduce_fwd_identity_bwd, C.all_gather_fwd_reduce_scatter_bwd,
                            C.reduce_scatter_fwd_all_gather_bwd, C.identity_fwd_all_reduce_bwd,
                            C.split_fwd_all_gather_bwd)
            or node.target in ("add", "sub", "unflatten", "transpose", "view", "view_as", "reshape", "flatten",
                               "contiguous", "float", "to", "type_as"))


def _needed_in_backward(node, gm) -> bool:
    """Whether the backward of the block needs `node`'s value, itself or to recompute an input of an operation
    whose backward needs it: some path of users through operations that pass gradients through without reading
    their inputs (`_passes_through`) reaches one that does read them. A path stops at an output the policy saves
    (`_kept_by_selective`): the recomputation starts from that saved value, so a row-parallel matmul's partial sum,
    read only by its reduce-scatter or all-reduce (saved), is not needed even though the stream it joins is."""
    todo, seen = list(node.users), set()
    while todo:
        user = todo.pop()
        if user in seen:
            continue
        seen.add(user)
        if not _passes_through(user, gm):
            return True
        if not _kept_by_selective(user, gm):
            todo += list(user.users)
    return False


def block_saved_bytes(gm, precision: str, device: str = "cuda", recompute: str = "none") -> sympy.Expr:
    """What one block (the body of a `repeat`) keeps per micro-batch until its backward. `full`
    (torch.utils.checkpoint around the block): its input only, the fp32 residual stream. `selective` (torch's
    selective checkpoint, runtime/recompute.py's policy): its input and the outputs of its matmuls and of its
    collectives but the all-gathers (gathered again in backward). `selective/compiled` (the same policy traced into a compiled region, runtime.compile): only those
    outputs the backward needs, directly or to recompute from; the partitioner drops the rest (a residual branch's
    last matmul, whose output only joins the stream: measured on CPU with saved_tensors_hooks, tests/
    test_memory_compiled.py). `none`: what each operation keeps (saved_bytes), compiled or not (measured equal
    to 0.01% on CPU, the same test)."""
    if recompute == "none":
        return saved_bytes(gm, precision, device)
    compiled = recompute == "selective/compiled"
    x = next(n for n in gm.graph.nodes if n.op == "placeholder")
    kept = _numel(x.meta[T.SHAPE]) * width_of(x, precision)  # the residual stream
    if recompute == "full":
        return sympy.expand(kept)
    act = widths(precision)["act"]
    for node in gm.graph.nodes:
        if not _kept_by_selective(node, gm):
            continue
        needed = not compiled or _needed_in_backward(node, gm)
        if node.op == "call_module" and type(gm.get_submodule(node.target)).__name__ == "Experts":
            mod = gm.get_submodule(node.target)
            e, n, h = node.meta[T.SHAPE]
            f = gm.meta[T.PARAM_SHAPES][f"{node.target}.w_up"][2]
            # up (and gate): the experts' own backward recomputes their activation from it, whatever reads the
            # output; the down matmul's output only where the backward needs it
            kept += (e * n * f * (2 if mod.act == "swiglu" else 1) + (e * n * h if needed else 0)) * act
        elif needed:
            kept += _numel(node.meta[T.SHAPE]) * width_of(node, precision)
    return sympy.expand(kept)


def loss_working_set(gm, precision: str) -> list:
    """The largest transient of the loss, on top of everything kept: the logits' moment. Cross-entropy's backward
    holds the fp32 gradient of the log-softmax and its input's gradient together (8 bytes per logit); its forward
    holds the logits, their fp32 copy (bf16 only) and, vocabulary-parallel, the shifted logits and their
    exponentials (the kept softmax is counted as kept). One formula per moment: the largest is the working set."""
    import torch.nn.functional as F
    from runtime import collectives as C
    moments = []
    copy = 2 + 4 if precision.startswith("bf16") else 4  # the logits (and their fp32 copy under bf16)
    for node in gm.graph.nodes:
        if node.target is F.cross_entropy:
            n = _numel(node.args[0].meta[T.SHAPE])
            moments += [copy * n, 8 * n]
        elif node.target is C.vocab_parallel_cross_entropy:
            n = _numel(node.args[0].meta[T.SHAPE])
            moments += [(copy + 2 * 4) * n, 8 * n]
    return moments


def weight_output_grads(gm, precision: str) -> sympy.Expr:
    """Bytes a split backward (zero-bubble's I, then W) keeps between its halves besides the activations: the
    gradient of each weight's matmul output, which the weight half needs (in the output's dtype)."""
    from torch import nn
    import torch.nn.functional as F
    from runtime import moe
    act = widths(precision)["act"]
    total = sympy.Integer(0)
    for node in gm.graph.nodes:
        if node.op == "call_module":
            mod = gm.get_submodule(node.target)
            if isinstance(mod, nn.Linear):
                total += _numel(node.meta[T.SHAPE]) * act
            elif isinstance(mod, moe.Experts):
                e, n, h = node.meta[T.SHAPE]
                f = gm.meta[T.PARAM_SHAPES][f"{node.target}.w_up"][2]
                total += (e * n * f * (2 if mod.act == "swiglu" else 1) + e * n * h) * act
        elif node.target is F.linear:
            total += _numel(node.meta[T.SHAPE]) * width_of(node, precision)
    return sympy.expand(total)


def backward_working_set(gm, precision: str) -> list:
    """The largest gradients one step of the backward holds at once in `gm` (a block, or a pipeline piece), on top
    of what is kept: an operation's output gradient and its input gradients, plus the residual stream's gradient
    (fp32) that flows beside it; a tensor-parallel all-reduce of a gradient holds a copy too. The blocks of a
    `repeat` inside `gm` are not entered (each is its own graph)."""
    import torch.nn.functional as F
    from runtime import collectives as C
    w = widths(precision)

    def nbytes(n):
        kind = n.meta.get(T.DTYPE)
        shape = n.meta.get(T.SHAPE)
        if shape is None or kind not in ("act", "res", "fp32"):
            return 0
        return _numel(shape) * w[kind]

    best = []
    residual = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder" and node.meta.get(T.DTYPE) == "res" and node.meta.get(T.SHAPE):
            residual = nbytes(node)
        if node.op not in ("call_module", "call_function", "call_method"):
            continue
        if node.target in (F.cross_entropy, C.vocab_parallel_cross_entropy):
            continue  # the loss's own working set (loss_working_set)
        out = nbytes(node)
        ins = sum(nbytes(a) for a in node.all_input_nodes)
        copy = out if node.target is C.identity_fwd_all_reduce_bwd else 0
        if out:
            best.append(out + ins + copy)
    return [b + residual for b in best] if best else [sympy.Integer(0)]
