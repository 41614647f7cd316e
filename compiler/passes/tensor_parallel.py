"""Tensor and sequence parallelism over the `tp` mesh axis (Shoeybi et al. 2019; Korthikanti et al. 2022).

Policy, `tp_policy`: reads one traced segment and finds, from its dataflow alone,
  - regions: a set of *column* linears whose outputs reach exactly one *row* linear through operations that keep
    a head or inner-width shard intact (head split/merge, a norm over each head's own features, attention,
    activations, the SwiGLU product). In our
    vocabulary these are attention (q, k, v → o) and the MLP (up, gate → down), but nothing here is matched by
    name;
  - the vocabulary: the token embedding, the LM head and the loss.
Mechanism, `tensor_parallel_pass`: given those decisions, swaps each leaf for its local shape, and inserts the
collectives as explicit calls to runtime/collectives.py:
  - before a region, on its input: identity forward / all-reduce backward (sequence parallel: all-gather along
    the sequence forward / reduce-scatter backward);
  - after the row linear: all-reduce forward / identity backward (sequence parallel: reduce-scatter / all-gather),
    then the row's bias, added once;
  - a per-head norm inside a region (`qk_norm`) keeps its scale whole on every rank; each rank's gradient of it
    covers only its heads, so it is summed over tp after the backward (as sequence parallelism's norms);
  - embedding: masked local lookup, then all-reduce (sequence parallel: reduce-scatter); the positional
    embedding is split along the sequence under sequence parallelism;
  - LM head: as a column linear over the vocabulary, and a cross-entropy that never gathers the logits (with
    packed documents, runtime/packed.py, the one whose targets after a separator count zero).
Each inserted node carries `node.meta[COLLECTIVE]` (what moves, why, from which .scale line) for the ledger and for
the comment on the generated call.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import sympy
import torch
import torch.fx as fxm
import torch.nn.functional as F
from torch import fx, nn

from compiler import ops as _ops
from compiler import spec as S
from compiler import trace as T
from compiler.diagnostics import Diagnostic
from compiler.symbols import size
from runtime import collectives as C
from runtime import layers as _layers
from runtime import packed as _packed

AXIS = "tp"


def _shard_preserving() -> dict:
    """The allow-list (compiler/ops/ records marked `shard`): operations through which a head / inner-width shard
    flows unchanged, by name. Anything else between a layer's column and row linears makes the layer unshardable
    (E0407), never silently replicated."""
    return _ops.shard_preserving()


@dataclass(frozen=True)
class Region:
    kind: str            # "attention" | "mlp": the .scale layer the row linear belongs to
    columns: tuple       # node names
    row: str             # node name


@dataclass(frozen=True)
class Decision:
    regions: tuple
    embedding: str | None = None   # call_module node of the token embedding
    positional: str | None = None  # call_module node of the positional embedding
    head: str | None = None        # LM head node (call_module Linear, or F.linear on the tied weight)
    head_bias: str | None = None   # Bias node on tied logits
    loss: str | None = None        # the cross_entropy node


# -- policy -------------------------------------------------------------------------------------------------------


def _is_linear(gm: fx.GraphModule, n: fx.Node) -> bool:
    return n.op == "call_module" and isinstance(gm.get_submodule(n.target), nn.Linear)


def _per_head_norm(gm: fx.GraphModule, n: fx.Node) -> bool:
    """A norm module over the last dim of a tensor whose heads are a dim of their own, (B, S, H, D): it normalises
    each head's features apart, so a shard of whole heads flows through it (Qwen 3's q_norm and k_norm). A norm
    over a flat hidden dim (B, S, H·D) mixes the heads a shard splits, and is not."""
    if n.op != "call_module" or not isinstance(gm.get_submodule(n.target), (nn.LayerNorm, nn.RMSNorm)):
        return False
    x = n.args[0] if n.args else None
    shape = x.meta.get(T.SHAPE) if isinstance(x, fxm.Node) else None
    return shape is not None and len(shape) >= 4 and len(gm.get_submodule(n.target).normalized_shape) == 1


def _preserving(n: fx.Node, gm: fx.GraphModule | None = None) -> bool:
    if n.op == "call_module":
        return gm is not None and _per_head_norm(gm, n)
    op = _ops.find(n) if n.op in ("call_function", "call_method") else None
    return op is not None and op.shard


def _side_inputs(n: fx.Node) -> list:
    """The arguments a shard-preserving call takes whole on every rank (its record's `side`: MLA's shared rotary
    key), not head shards."""
    op = _ops.find(n) if n.op in ("call_function", "call_method") else None
    side = op.side if op is not None else ()
    return [a for i, a in enumerate(n.args) if i in side and isinstance(a, fxm.Node)]


def _shard_inputs(n: fx.Node) -> list:
    side = _side_inputs(n)
    return [a for a in n.all_input_nodes if a not in side]


def _column_sources(gm: fx.GraphModule, v) -> set | None:
    """The linears that feed value `v` through shard-preserving operations only, or None if anything else does."""
    if not isinstance(v, fxm.Node):
        return set()
    if _is_linear(gm, v):
        return {v}
    if not _preserving(v, gm):
        return None
    found: set = set()
    for a in _shard_inputs(v):
        s = _column_sources(gm, a)
        if s is None:
            return None
        found |= s
    return found


def _reaches_only(gm: fx.GraphModule, start: fx.Node, row: fx.Node) -> bool:
    """Every use of `start`, followed through shard-preserving operations, ends at `row`."""
    for user in start.users:
        if user is row:
            continue
        if not _preserving(user, gm) or not _reaches_only(gm, user, row):
            return False
    return True


def _kind(n: fx.Node) -> str | None:
    layer = n.meta.get(T.LAYER)
    # a `moe`'s shared expert is an MLP (its routed experts are not linears: they shard over ep, not tp)
    return {S.Attention: "attention", S.MLA: "attention", S.MLP: "mlp", S.MoE: "mlp"}.get(type(layer))


def tp_policy(gm: fx.GraphModule, plan) -> Decision:
    regions = []
    for node in gm.graph.nodes:
        if not _is_linear(gm, node):
            continue
        cols = _column_sources(gm, node.args[0])
        if not cols or not all(_reaches_only(gm, c, node) for c in cols):
            continue
        if any(c.meta.get(T.LAYER) is not node.meta.get(T.LAYER) for c in cols):
            continue  # one layer's output linear straight into the next layer (`attention(...)  mlp(...)`)
        kind = _kind(node)
        if kind in plan.tp_layers:
            order = {n: i for i, n in enumerate(gm.graph.nodes)}
            regions.append(Region(kind, tuple(c.name for c in sorted(cols, key=order.get)), node.name))
    found: dict = {}
    if "vocab" in plan.tp_layers:
        for node in gm.graph.nodes:
            layer = node.meta.get(T.LAYER)
            if isinstance(layer, S.Embedding) and node.op == "call_module":
                found["embedding"] = node.name
            elif isinstance(layer, S.Positional) and node.op == "call_module":
                found["positional"] = node.name
            elif isinstance(layer, S.LMHead) and (_is_linear(gm, node) or node.target is F.linear):
                found["head"] = node.name
            elif isinstance(layer, S.LMHead) and node.op == "call_module" and isinstance(
                    gm.get_submodule(node.target), _layers.Bias):
                found["head_bias"] = node.name
            elif isinstance(layer, S.CrossEntropy) and node.target in (F.cross_entropy, _packed.cross_entropy):
                found["loss"] = node.name
    return Decision(tuple(regions), **found)


def _describe_op(n: fx.Node) -> str:
    if n.target is operator.getitem:
        return "indexing or slicing (`x[...]`)"
    name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))
    return f"`{name}`" + (" (a method call)" if n.op == "call_method" else "")


def unsharded(gm: fx.GraphModule, plan, decision: Decision) -> list[Diagnostic]:
    """Fail closed. Each layer kind declares its leaves' roles (compiler/layers: q, k, v `column`, o `row`, ...),
    tagged on the traced nodes; the policy finds regions from the dataflow alone. For every layer the plan asks tp
    to shard (`tp_layers`), each declared column and row linear must sit in a region in that role; otherwise the
    layer is an error at its line, naming the first operation between its linears that the pass does not know to
    keep a head / inner-width shard. Without this, the layer would run replicated while the plan says tp."""
    role_in_region = {}
    for r in decision.regions:
        role_in_region.update({name: "column" for name in r.columns})
        role_in_region[r.row] = "row"
    layers: dict = {}
    for node in gm.graph.nodes:
        kind = _kind(node)
        declared = node.meta.get(T.TP_ROLE)
        if kind in plan.tp_layers and declared in ("column", "row") and role_in_region.get(node.name) != declared:
            layers.setdefault(id(node.meta[T.LAYER]), (node.meta[T.LAYER], kind))
    out = []
    for layer, kind in layers.values():
        nodes = [n for n in gm.graph.nodes if n.meta.get(T.LAYER) is layer]
        odd = next((n for n in nodes if n.op in ("call_function", "call_method") and not _preserving(n)), None)
        what = (f"{_describe_op(odd)} between its column and row linears is not an operation the tensor-parallel "
                "pass knows to keep a head shard whole" if odd is not None else
                "its linears do not pair into the column → row regions its kind declares")
        where = "" if plan.span(f"axis {AXIS}") else f" in the plan {plan.describe()}"
        out.append(Diagnostic("E0407", f"tp = {plan.size(AXIS)} cannot shard this {kind}{where}: {what}",
                              layer.span, label="would run replicated on every tp rank",
                              help=f"leave it out of tp: `tp_layers = ({', '.join(k for k in plan.tp_layers if k != kind)})`"
                                   f", or use tp = 1; supported between the linears: "
                                   + ", ".join(sorted(set(_shard_preserving().values())))))
    return out


# -- mechanism ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Collective:
    """node.meta[T.COLLECTIVE]: what an inserted call moves. `payload` names the tensor whose full size is the
    bytes counted: the call's input or its output; `count` is how many such tensors move per call."""

    forward: str | None   # collective op run forward, or None
    backward: str | None  # collective op run backward, or None
    axis: str
    reason: str
    payload: str = "input"
    dtype: str = "act"    # "act": the compute precision; "fp32": always fp32; "int64": counts
    count: int = 1
    worst: tuple = ()     # (direction, factor): a variable-split all-to-all whose payload's size is an
                          # expectation, at most factor × that (expert_parallel's grouped dispatch)
    counts: tuple = ()    # (direction, count): where a direction moves another number of tensors than `count`
                          # (context parallelism's ring: its backward sends the gradients too)
    elements: object = None  # the elements one call moves (sympy), where that is not a tensor's size: the node
                             # dispatch's rows across nodes (expert_parallel._by_node). A call moving several things
                             # carries a tuple of notes (node.meta[T.COLLECTIVE])
    fp8: str = ""         # under precision = fp8 (runtime/moe_nodes.py set_fp8): "rows" move 1 byte per element
                          # (float8), "scales" are moved only then (fp32); "": whatever the precision


def _names(gm: fx.GraphModule) -> dict:
    return {n.name: n for n in gm.graph.nodes}


def insert_call(gm: fx.GraphModule, after: fx.Node, fn, args: tuple, origin: fx.Node, note: Collective | None,
            name: str) -> fx.Node:
    with gm.graph.inserting_after(after):
        n = gm.graph.create_node("call_function", fn, args, {}, name=name)
    for key in (T.SPAN, T.LAYER):
        if key in origin.meta:
            n.meta[key] = origin.meta[key]
    if note is not None:
        n.meta[T.COLLECTIVE] = note
    return n


def _get_attr(gm: fx.GraphModule, before: fx.Node, target: str, origin: fx.Node) -> fx.Node:
    with gm.graph.inserting_before(before):
        n = gm.graph.get_attr(target)
    for key in (T.SPAN, T.LAYER):
        if key in origin.meta:
            n.meta[key] = origin.meta[key]
    return n


def _entry(gm: fx.GraphModule, value: fx.Node, sp: bool, origin: fx.Node, reason: str) -> fx.Node:
    """The collective in front of column-parallel work on `value` (replicated, or sequence-sharded under SP)."""
    if sp:
        note = Collective("all_gather", "reduce_scatter", AXIS, f"sequence-parallel input of {reason}",
                          payload="output")
        return insert_call(gm, value, C.all_gather_fwd_reduce_scatter_bwd, (value, AXIS, 1), origin, note,
                       f"{value.name}_gathered")
    note = Collective(None, "all_reduce", AXIS, f"column-parallel input of {reason}: its gradient is partial")
    return insert_call(gm, value, C.identity_fwd_all_reduce_bwd, (value, AXIS), origin, note, f"{value.name}_tp")


def _exit(gm: fx.GraphModule, value: fx.Node, sp: bool, origin: fx.Node, reason: str) -> fx.Node:
    """The collective completing a partial sum (replicated result, or sequence-sharded under SP)."""
    if sp:
        note = Collective("reduce_scatter", "all_gather", AXIS, f"sequence-parallel output of {reason}")
        return insert_call(gm, value, C.reduce_scatter_fwd_all_gather_bwd, (value, AXIS, 1), origin, note,
                       f"{value.name}_scattered")
    note = Collective("all_reduce", None, AXIS, f"row-parallel output of {reason}: each rank holds a partial sum")
    return insert_call(gm, value, C.all_reduce_fwd_identity_bwd, (value, AXIS), origin, note, f"{value.name}_sum")


def _local(expr, tp_sym, padded: bool):
    return sympy.ceiling(expr / tp_sym) if padded else expr / tp_sym


def _shard_region(gm: fx.GraphModule, region: Region, sp: bool, tp: int, meta: dict) -> None:
    nodes = _names(gm)
    tp_sym = size(AXIS)
    shapes = gm.meta[T.PARAM_SHAPES]
    cols = [nodes[c] for c in region.columns]
    row = nodes[region.row]
    what = f"{region.kind} ({', '.join(c.target for c in cols)} → {row.target})"
    # One collective per distinct input of the column linears (q, k and v share theirs).
    for value in dict.fromkeys(c.args[0] for c in cols):
        entry = _entry(gm, value, sp, cols[0], what)
        for c in cols:
            if c.args[0] is value:
                c.args = (entry,) + tuple(c.args[1:])
    # A whole (replicated) input of the heads' call, MLA's shared rotary key: each rank's gradient of it covers only
    # its heads, so it enters like a column input (identity forward, all-reduce backward; gathered under SP).
    for n in _region_nodes(cols, row):
        for value in _side_inputs(n):
            n.replace_input_with(value, _entry(gm, value, sp, n, f"{what}'s shared input"))
    for c in cols:
        old = gm.get_submodule(c.target)
        setattr(gm, c.target, nn.Linear(old.in_features, old.out_features // tp, bias=old.bias is not None,
                                        device="meta"))
        out_dim, in_dim = shapes[f"{c.target}.weight"]
        shapes[f"{c.target}.weight"] = (out_dim / tp_sym, in_dim)
        meta["shards"][f"{c.target}.weight"] = (0, old.out_features)
        if old.bias is not None:
            shapes[f"{c.target}.bias"] = (out_dim / tp_sym,)
            meta["shards"][f"{c.target}.bias"] = (0, old.out_features)
    # The row linear: its matmul on the local input slice, the reduction, then its bias once.
    old = gm.get_submodule(row.target)
    setattr(gm, row.target, nn.Linear(old.in_features // tp, old.out_features, bias=old.bias is not None,
                                      device="meta"))
    out_dim, in_dim = shapes[f"{row.target}.weight"]
    shapes[f"{row.target}.weight"] = (out_dim, in_dim / tp_sym)
    meta["shards"][f"{row.target}.weight"] = (1, old.in_features)
    w = _get_attr(gm, row, f"{row.target}.weight", row)
    partial = insert_call(gm, row, F.linear, (row.args[0], w), row, None, f"{row.target}_partial")
    out = _exit(gm, partial, sp, row, what)
    if old.bias is not None:
        b = _get_attr(gm, row, f"{row.target}.bias", row)
        out = insert_call(gm, out, operator.add, (out, b), row, None, f"{row.target}_out")
        if sp:  # added to this rank's sequence chunk only: its gradient is partial over tp
            meta["partial_grads"].append(f"{row.target}.bias")
    row.replace_all_uses_with(out)
    gm.graph.erase_node(row)
    for norm in _region_norms(gm, cols, out):
        for pname, _ in gm.get_submodule(norm.target).named_parameters():
            meta["partial_grads"].append(f"{norm.target}.{pname}")


def _region_nodes(cols: list, end: fx.Node) -> list:
    """The nodes between a region's column linears and its row linear, in graph order."""
    seen, todo = set(), list(cols)
    while todo:
        n = todo.pop()
        if n in seen or n is end:
            continue
        seen.add(n)
        todo.extend(n.users)
    return sorted(seen - set(cols), key=lambda n: list(n.graph.nodes).index(n))


def _region_norms(gm: fx.GraphModule, cols: list, end: fx.Node) -> list:
    """The per-head norms between a region's column linears and its end, in graph order: replicated modules whose
    gradient on each rank covers only that rank's heads."""
    seen, todo, found = set(), list(cols), []
    while todo:
        n = todo.pop()
        if n in seen or n is end:
            continue
        seen.add(n)
        if _per_head_norm(gm, n):
            found.append(n)
        todo.extend(n.users)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    return sorted(found, key=order.get)


def _shard_vocab(gm: fx.GraphModule, d: Decision, spec: S.Spec, sp: bool, tp: int, meta: dict) -> None:
    nodes = _names(gm)
    tp_sym = size(AXIS)
    shapes = gm.meta[T.PARAM_SHAPES]
    vocab = spec.value(spec.model.embedding.vocab)
    padded = vocab % tp != 0
    local_vocab = -(-vocab // tp)
    v_expr = spec.model.embedding.vocab
    if d.embedding:
        emb = nodes[d.embedding]
        old = gm.get_submodule(emb.target)
        # given its (meta) weight, the module skips its random initialisation, whose first call on the meta device
        # imports torch._dynamo (1.4-5 s measured here)
        setattr(gm, emb.target, nn.Embedding(local_vocab, old.embedding_dim,
                                             _weight=torch.empty(local_vocab, old.embedding_dim, device="meta")))
        shapes[f"{emb.target}.weight"] = (_local(v_expr, tp_sym, padded), shapes[f"{emb.target}.weight"][1])
        meta["shards"][f"{emb.target}.weight"] = (0, vocab)
        w = _get_attr(gm, emb, f"{emb.target}.weight", emb)
        part = insert_call(gm, emb, C.vocab_parallel_lookup, (emb.args[0], w, AXIS), emb, None, f"{emb.target}_partial")
        what = "the vocabulary-parallel embedding: each rank looked up only the tokens of its vocabulary slice"
        if sp:
            note = Collective("reduce_scatter", "all_gather", AXIS, what)
            out = insert_call(gm, part, C.reduce_scatter_fwd_all_gather_bwd, (part, AXIS, 1), emb, note,
                          f"{emb.target}_scattered")
        else:
            note = Collective("all_reduce", None, AXIS, what)
            out = insert_call(gm, part, C.all_reduce_fwd_identity_bwd, (part, AXIS), emb, note, f"{emb.target}_sum")
        emb.replace_all_uses_with(out)
        gm.graph.erase_node(emb)
    if d.positional and sp:
        pos = nodes[d.positional]
        note = Collective(None, "all_gather", AXIS, "sequence parallelism: this rank's positions; the gradient is "
                          "gathered back whole", payload="input")
        users = list(pos.users)
        # (S, H) from the positions 0..S-1; packed documents look up each row's positions, (B, S, H)
        dim = 1 if pos.args[0].target is _packed.positions else 0
        split = insert_call(gm, pos, C.split_fwd_all_gather_bwd, (pos, AXIS, dim), pos, note, f"{pos.name}_split")
        for u in users:
            u.replace_input_with(pos, split)
    if d.head:
        head = nodes[d.head]
        entry = _entry(gm, head.args[0], sp, head, "the vocabulary-parallel LM head")
        head.args = (entry,) + tuple(head.args[1:])
        if head.op == "call_module":
            old = gm.get_submodule(head.target)
            setattr(gm, head.target, nn.Linear(old.in_features, local_vocab, bias=old.bias is not None,
                                               device="meta"))
            shapes[f"{head.target}.weight"] = (_local(v_expr, tp_sym, padded), shapes[f"{head.target}.weight"][1])
            meta["shards"][f"{head.target}.weight"] = (0, vocab)
            if old.bias is not None:
                shapes[f"{head.target}.bias"] = (_local(v_expr, tp_sym, padded),)
                meta["shards"][f"{head.target}.bias"] = (0, vocab)
    if d.head_bias:
        hb = nodes[d.head_bias]
        with torch.device("meta"):  # never allocated: a vocabulary can be billions of entries
            setattr(gm, hb.target, _layers.Bias(local_vocab))
        shapes[f"{hb.target}.bias"] = (_local(v_expr, tp_sym, padded),)
        meta["shards"][f"{hb.target}.bias"] = (0, vocab)
    if d.loss:
        loss = nodes[d.loss]
        note = Collective("all_reduce", None, AXIS, "vocabulary-parallel cross-entropy: max, sum of exponentials "
                          "and target logit of each token (the logits are never gathered)", payload="targets",
                          dtype="fp32", count=3)
        # packed documents: the targets after a separator count zero, the sum divided by every token (runtime.packed)
        new = insert_call(gm, loss, C.vocab_parallel_cross_entropy, (loss.args[0], loss.args[1], AXIS, vocab), loss,
                      note, "loss")
        if loss.target is _packed.cross_entropy:
            new.kwargs = {"ignore": _packed.IGNORE}
        loss.replace_all_uses_with(new)
        gm.graph.erase_node(loss)


def _sequence_parallel_moes(gm: fx.GraphModule) -> set:
    """Under SP, each `moe` routes whole sequences as it does without SP: its input is all-gathered along the
    sequence (backward: this rank's chunk of the gradient, which every rank computed whole), the router, the
    experts and a shared expert run on the whole sequence as under tp alone, and the layer's output is cut back to
    this rank's chunk (backward: the chunks' gradients gathered). Capacity, the auxiliary loss and the expert bias's
    load then see the sequences the single device sees (routing a chunk per rank would change all three). Returns
    the names of the shared experts' row linears, whose regions take tp's collectives, not SP's."""
    layers: dict = {}
    for n in gm.graph.nodes:
        if isinstance(n.meta.get(T.LAYER), S.MoE):
            layers.setdefault(id(n.meta[T.LAYER]), []).append(n)
    rows = set()
    for nodes in layers.values():
        inside = set(nodes)
        layer = nodes[0].meta[T.LAYER]
        inputs = list(dict.fromkeys(a for n in nodes for a in n.all_input_nodes
                                    if a not in inside and a.op != "get_attr"))
        outputs = [n for n in nodes if any(u not in inside for u in n.users)]
        if len(inputs) != 1 or len(outputs) != 1:
            raise ValueError(f"sequence parallelism: the `moe` at {layer.span} has {len(inputs)} inputs and "
                             f"{len(outputs)} outputs; expected one of each")
        (x,), (y,) = inputs, outputs
        first = nodes[0]  # collected in graph order
        note = Collective("all_gather", None, AXIS, "sequence-parallel input of a moe: routed over whole "
                          "sequences", payload="output")
        with gm.graph.inserting_before(first):
            whole = gm.graph.create_node("call_function", C.all_gather_fwd_split_bwd, (x, AXIS, 1), {},
                                         name=f"{x.name}_whole")
        whole.meta.update({k: first.meta[k] for k in (T.SPAN, T.LAYER) if k in first.meta}, **{T.COLLECTIVE: note})
        for n in nodes:
            n.replace_input_with(x, whole)
        users = [u for u in y.users if u not in inside]
        note = Collective(None, "all_gather", AXIS, "sequence-parallel output of a moe: this rank's chunk; the "
                          "gradient gathered whole", payload="input")
        cut = insert_call(gm, y, C.split_fwd_all_gather_bwd, (y, AXIS, 1), y, note, f"{y.name}_chunk")
        for u in users:
            u.replace_input_with(y, cut)
        rows |= {n.name for n in nodes if n.meta.get(T.TP_ROLE) == "row"}
    return rows


def _sequence_parallel_norms(gm: fx.GraphModule, meta: dict) -> None:
    """Under SP, norms see one sequence chunk per rank: their scale and bias gradients are partial over tp (a
    per-head norm inside a region is listed already: its rank sees the whole sequence but only its heads)."""
    for node in gm.graph.nodes:
        # and so are the replicated linears of an MLA (q_a, kv_a: before its column linears, on one chunk each)
        mla_linear = isinstance(node.meta.get(T.LAYER), S.MLA) and _is_linear(gm, node) \
            and node.meta.get(T.TP_ROLE) not in ("column", "row")
        if node.op == "call_module" and (mla_linear or isinstance(gm.get_submodule(node.target),
                                                                  (nn.LayerNorm, nn.RMSNorm))):
            for pname, p in gm.get_submodule(node.target).named_parameters():
                if f"{node.target}.{pname}" not in meta["partial_grads"]:
                    meta["partial_grads"].append(f"{node.target}.{pname}")


def tensor_parallel_pass(traced: T.Traced, plan) -> T.Traced:
    """Carry out `plan.tp`, the policy's decision for each segment (compiler/pipeline.decide)."""
    tp = plan.size(AXIS)
    if tp == 1:
        return traced
    spec = traced.spec
    sp = plan.sequence_parallel
    for cls, gm in traced.segments():
        meta = {"shards": {}, "partial_grads": []}
        decision = plan.decision("tp", cls)
        whole = _sequence_parallel_moes(gm) if sp else set()
        for region in decision.regions:
            _shard_region(gm, region, sp and region.row not in whole, tp, meta)
        _shard_vocab(gm, decision, spec, sp, tp, meta)
        if sp:
            _sequence_parallel_norms(gm, meta)
            if cls != "Model":
                gm.meta[T.INPUTS] = {k: (v[0], v[1] / size(AXIS), *v[2:]) for k, v in gm.meta[T.INPUTS].items()}
        gm.meta[T.TP_SHARDS] = meta["shards"]
        gm.meta[T.TP_PARTIAL_GRADS] = tuple(meta["partial_grads"])
        gm.graph.lint()
        gm.recompile()
    traced.annotate()
    return traced


# -- what tensor parallelism requires (kept at the end of the file: the rules, not the pass) ------------------------
