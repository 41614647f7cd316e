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


import sympy

from compiler import ops as O
from compiler import trace as T
from compiler.graph_meta import INT_BYTES


def _numel(shape) -> sympy.Expr:
    return sympy.Mul(*shape) if shape else sympy.Integer(1)


def precision_key(spec, plan) -> str:
    """The precision the activation formulas take: the train section's, with the plan's fp32 residual stream."""
    prec = spec.train.precision
    return "bf16/fp32_residual" if prec == "bf16" and plan.fp32_residual else prec


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
        self.gm, self.device = gm, device
        self.precision = precision
        self.widths = widths(precision)
        self.act = self.widths["act"]
        self.params = gm.meta[T.PARAM_SHAPES]
        self.saved: dict = {}
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
        # the storage's bytes: a piece of a split is a view of a larger tensor (a view otherwise has its base's size)
        self.saved.setdefault(("t", b), self.bytes_of(b if isinstance(b.meta.get(T.SHAPE), tuple)
                                                      and all(not isinstance(x, tuple) for x in b.meta[T.SHAPE])
                                                      else node))

    def keep_matmul_input(self, node, consumer) -> None:
        """An operand of a matmul: kept as it is (its weight is the parameter itself: model state)."""
        self.keep(node)

    def new(self, node, key, shape, width) -> None:
        self.saved[(key, node)] = _numel(shape) * width

    # -- the rules ----------------------------------------------------------------------------------------------

    def run(self, repeats=None) -> sympy.Expr:
        from runtime.layers import Repeat
        extra = sympy.Integer(0)
        for node in self.gm.graph.nodes:
            if len(self.saved) > self.count:
                self.count, self.last = len(self.saved), self.previous
            self.previous = node
            if node.op in ("placeholder", "get_attr", "output"):
                continue
            if node.op == "call_module" and isinstance(self.gm.get_submodule(node.target), Repeat):
                count, block = repeats[node.target]
                extra += count * block_saved_bytes(block, self.precision, self.device, self.recompute)
                continue
            O.of(node, self.gm).saved(self, node, list(node.args))
        if len(self.saved) > self.count:
            self.count, self.last = len(self.saved), self.previous
        return sympy.expand(sum(self.saved.values(), sympy.Integer(0)) + extra)

    def norm_input(self, x, node) -> None:
        # torch's norm kernels read a bf16 input as it is (statistics accumulated in fp32 inside)
        self.keep(x)


def saved_bytes(gm, precision: str, device: str = "cuda", repeats=None, recompute: str = "none") -> sympy.Expr:
    """Bytes one forward of `gm` (one micro-batch of µb sequences) keeps for its backward on one rank; the blocks
    of its `repeat`s under `recompute`."""
    return _Graph(gm, precision, device, recompute).run(repeats)


def attention_saved_bytes(gm, precision: str, device: str = "cuda") -> tuple:
    """(bytes, calls): what the attention ops of `gm` (the records marked `attention`) keep for their backward, per
    micro-batch of µb sequences, and how many there are; `plan` prints it per layer under context parallelism."""
    g = _Graph(gm, precision, device)
    calls = 0
    for node in gm.graph.nodes:
        op = O.find(node, gm) if node.op != "placeholder" else None
        if op is not None and op.attention:
            op.saved(g, node, list(node.args))
            calls += 1
    return sympy.expand(sum(g.saved.values(), sympy.Integer(0))), calls


class _Saves(dict):
    """A `_Graph`'s saved tensors that also lists every save, (key, bytes) per call: a tensor two operations keep
    is listed twice (each is one pack of a saved-tensor hook: runtime.offload copies it twice)."""

    def __init__(self):
        super().__init__()
        self.calls: list = []

    def __setitem__(self, key, value):
        self.calls.append((key, value))
        super().__setitem__(key, value)

    def setdefault(self, key, value):
        self.calls.append((key, value))
        return super().setdefault(key, value)


class _Packs(_Graph):
    """`_Graph` with every save listed (`_Saves`), a view kept counted at its own size (a piece of a split is
    packed as the piece, not its base's storage)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.saved = _Saves()

    def keep(self, node) -> None:
        at = len(self.saved.calls)
        super().keep(node)
        shape = node.meta.get(T.SHAPE)
        if isinstance(shape, tuple) and all(not isinstance(x, tuple) for x in shape):
            self.saved.calls[at] = (self.saved.calls[at][0], self.bytes_of(node))


def saved_by_prefix(gm, precision: str, device: str, prefixes: tuple) -> tuple:
    """(copied, moved, every) of one block `gm` without recomputation, for a saved-tensor hook that takes what is
    saved while a leaf whose name starts with one of `prefixes` last started (every op with `prefixes` empty;
    runtime.offload.ActivationOffload: an op between leaves belongs to the leaf before it, the attention core to
    the value projection, the activation function to the up projection): `copied`, the bytes of each save those
    ops make, a tensor saved by two of them twice (the hook packs, and copies, each save); `moved`, the storages
    only those ops keep (what leaves the device: one another op keeps stays); `every`, all the block keeps, each
    storage once. offload's share of a block's activations (compiler/cost/offload.py)."""
    from compiler import ops as O
    g = _Packs(gm, precision, device)
    chosen, current = {}, not prefixes
    copied = sympy.Integer(0)
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr", "output"):
            continue
        if node.op == "call_module" and prefixes:
            current = str(node.target).startswith(prefixes)
        at = len(g.saved.calls)
        O.of(node, gm).saved(g, node, list(node.args))
        for key, nbytes in g.saved.calls[at:]:
            chosen[key] = chosen.get(key, True) and current
            copied += nbytes if current else 0
    moved = sum((b for k, b in g.saved.items() if chosen[k]), sympy.Integer(0))
    return sympy.expand(copied), sympy.expand(moved), sympy.expand(sum(g.saved.values(), sympy.Integer(0)))


def last_saving_node(gm):
    """The last node of `gm` whose operation keeps a tensor for backward."""
    g = _Graph(gm, "bf16", "cuda")
    g.run()
    return g.last


def _kept_by_selective(node, gm) -> bool:
    """Under selective recomputation these keep their outputs (computing them again costs matmul time or
    communication; the records marked `selective`, runtime/recompute.py's policy); everything else in a block is
    recomputed in backward from them and the block's input, the sequence-parallel all-gathers too (gathered again,
    as Megatron's sequence-parallel linears keep their input sharded; the ledger and the step time count the
    gather's second run)."""
    op = O.find(node, gm)
    return op is not None and op.selective


def _passes_through(node, gm) -> bool:
    """Operations whose backward needs none of their inputs' values (sums, views, casts, collectives, a bias: the
    records marked `passes_grad`), and the output."""
    if node.op == "output":
        return True
    op = O.find(node, gm)
    return op is not None and op.passes_grad


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
    (torch.utils.checkpoint around the block): its input only, the fp32 residual stream. `selective` (torch's selective
    checkpoint, runtime/recompute.py's policy): its input and the outputs of its matmuls and of its collectives but
    the all-gathers (gathered again in backward). `selective/compiled` (the same policy traced into a compiled
    region, runtime.compile): only those outputs the backward needs, directly or to recompute from; the partitioner
    drops the rest (a residual branch's last matmul, whose output only joins the stream: measured on CPU with
    saved_tensors_hooks, tests/test_memory_compiled.py). `none`: what each operation keeps (saved_bytes), compiled
    or not (measured equal to 0.01% on CPU, the same test)."""
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
        op = O.of(node, gm)
        if op.kept is not None:
            kept += op.kept(node, gm, needed, act)
        elif needed:
            kept += _numel(node.meta[T.SHAPE]) * width_of(node, precision)
    return sympy.expand(kept)


def loss_working_set(gm, precision: str) -> list:
    """The largest transient of the loss, on top of everything kept: the logits' moment (its record's `loss`).
    Cross-entropy's backward holds the fp32 gradient of the log-softmax and its input's gradient together (8 bytes
    per logit); its forward holds the logits, their fp32 copy (bf16 only) and, vocabulary-parallel, the shifted
    logits and their exponentials (the kept softmax is counted as kept). One formula per moment: the largest is the
    working set."""
    moments = []
    copy = 2 + 4 if precision.startswith("bf16") else 4  # the logits (and their fp32 copy under bf16)
    for node in gm.graph.nodes:
        op = O.find(node, gm)
        if op is not None and op.loss is not None:
            moments += op.loss(_numel(node.args[0].meta[T.SHAPE]), copy)
    return moments


def weight_output_grads(gm, precision: str) -> sympy.Expr:
    """Bytes a split backward (zero-bubble's I, then W) keeps between its halves besides the activations: the
    gradient of each weight's matmul output, which the weight half needs (its record's `wgrad`)."""
    w = widths(precision)
    total = sympy.Integer(0)
    for node in gm.graph.nodes:
        op = O.find(node, gm)
        if op is not None and op.wgrad is not None:
            total += op.wgrad(node, gm, w)
    return sympy.expand(total)


def backward_working_set(gm, precision: str) -> list:
    """The largest gradients one step of the backward holds at once in `gm` (a block, or a pipeline piece), on top
    of what is kept: an operation's output gradient and its input gradients, plus the residual stream's gradient
    (fp32) that flows beside it; a tensor-parallel all-reduce of a gradient holds a copy too. The blocks of a
    `repeat` inside `gm` are not entered (each is its own graph)."""
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
        op = O.find(node, gm)
        if op is not None and op.loss is not None:
            continue  # the loss's own working set (loss_working_set)
        out = nbytes(node)
        ins = sum(nbytes(a) for a in node.all_input_nodes)
        copy = out if op is not None and op.copy else 0
        if out:
            best.append(out + ins + copy)
    return [b + residual for b in best] if best else [sympy.Integer(0)]
