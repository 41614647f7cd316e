"""Offload, priced: what a plan's `offload` moves to the host, the host<->device copies of one step (ledger entries of
their own, op `d2h` and `h2d` over the group "host") and what the step pays for them and for the optimizer step the
host runs. Torch-free; the rows themselves are compiler/layout/state.py's (a row whose location is the host).

What each setting moves, per rank (n: the parameters of the rank's optimizer shard, elements):

- `optimizer(fraction = f)`, Megatron-LM's fractional optimizer offload (`--optimizer-cpu-offload
  --optimizer-offload-fraction`): f·n of the optimizer's state (the fp32 master where the optimizer keeps one, and
  AdamW's two moments) lies on the host, beside two pinned fp32 buffers of the same f·n elements: the gradients
  copied down and, where the optimizer keeps no master (fp32 programs, FSDP2's sharded fp32 parameter), the
  parameters the host steps. Each step: the gradients of the host's share device -> host (G bytes, or 4 for FSDP2's
  main gradient), the host's AdamW over them, the updated parameters host -> device (in the device parameter's
  dtype: the bf16 compute copy under ddp and zero1, the fp32 sharded parameter under FSDP2 and fp32). The copies
  are of the whole tensors runtime.offload.HostAdamW takes (`host_elements`: at least f·n), so the runtime's
  counts equal the ledger's (measured); the rows and the host's AdamW are priced at f·n.
- `params`, FSDP2's CPUOffloadPolicy (fsdp only): the sharded parameters, gradients and optimizer state on the host;
  each unit's shard copied to the device before each of its all-gathers (the ledger's gathers: forward and backward
  of every micro-batch), its gradient shard copied back after each reduce-scatter, the optimizer step on the host.
- `activations(modules = [...])`: what the named block modules save for their backward goes to the host in forward
  (a pack hook) and comes back in backward; the device keeps the blocks in flight of a copy (`WINDOW_BLOCKS`).
  The copies are per save, as the hook packs (a tensor two ops save crosses twice; measured), the device relieved
  of each storage once (`block_parts`).

How the step overlaps them (`host_tail`, `activation_exposed`):
- optimizer: the host's chain (gradients down, AdamW on the host, parameters up) runs while the device steps the
  other 1 - f: the step's optimizer part is max(device AdamW of 1 - f, the chain). The chain's copies do not
  overlap the host's AdamW (one bucket of state: Megatron's HybridDeviceOptimizer steps after its copies).
- params: the shards' copies to the device ride ahead of their all-gathers and the gradients' behind their
  reduce-scatters, under the compute of the micro-batches as FSDP2 prefetches (one unit's copy each way is
  exposed, and what the compute cannot hold); the host's AdamW over every parameter is exposed (the device waits
  for the next step's shards).
- activations: copies on their own stream, under each micro-batch's compute up to the host link: exposed is what
  the link needs beyond the compute, and the first block's copy back in backward.
"""
from __future__ import annotations

import sympy

from compiler import trace as T
from compiler.layout import state as ST

KINDS = ("attention", "mlp")  # the block module kinds `offload_modules` names
# the traced graphs' node names of each kind's modules (compiler/layers: attention's "attn_*" or "mla_*", an MLP's
# "mlp_*", a MoE layer's "moe_*", "experts*" and its shared expert "shared_*")
PREFIXES = {"attention": ("attn", "mla"), "mlp": ("mlp", "moe", "experts", "shared")}
WINDOW_BLOCKS = 2
"""Blocks whose offloaded activations are on the device at once: the one computing and the one whose copy is in
flight (to the host in forward, back in backward, prefetched one block ahead)."""
HOST = "host"  # the ledger's group of a host<->device copy


def fraction(plan) -> float:
    """The share of the optimizer's state on the host: offload_fraction under `optimizer`, all under `params`."""
    if plan.offload == "optimizer":
        return float(plan.offload_fraction)
    return 1.0 if plan.offload == "params" else 0.0


def shard_elements(plan, params: float, experts: float) -> float:
    """Elements of a rank's optimizer shard: its dense parameters over their group, its experts over theirs
    (state.groups)."""
    where = ST.groups(plan)
    return (params - experts) / where[ST.DENSE][1] + experts / where[ST.EXPERT][1]


def _shard_formula(plan, params, experts):
    """shard_elements as a formula of the user's sizes (params(), experts(): the rank's, as the ledger's)."""
    from compiler.symbols import size
    where = ST.groups(plan)
    sym = lambda name: sympy.Integer(1) if not name else sympy.Mul(*[size(a) for a in name.split("×")])  # noqa: E731
    return sympy.expand((params() - experts()) / sym(where[ST.DENSE][0]) + experts() / sym(where[ST.EXPERT][0]))


# -- the optimizer's host share ------------------------------------------------------------------------------


def _top_params(traced) -> list:
    """The top graph's parameter names and its repeats' names, in the order the generated Model registers them
    (the order of their first use: the embedding, the repeats, the final norm; a tied head's weight is the
    embedding's)."""
    from runtime.layers import Repeat
    gm = traced.top
    names, out = list(gm.meta[T.PARAM_SHAPES]), []
    for node in gm.graph.nodes:
        if node.op == "call_module" and isinstance(gm.get_submodule(node.target), Repeat):
            out.append(("repeat", node.target))
        elif node.op in ("call_module", "get_attr"):
            out += [n for n in names if n not in out and (n == node.target or n.rsplit(".", 1)[0] == node.target)]
    return out + [n for n in names if n not in out]


def rank_params(model, nb) -> list:
    """(elements Formula, dims) of each parameter the ledger's rank holds, in runtime.optimizer's order (the
    module's, the ≥2-D ones first: precision.decay_groups): the whole model without pp (`nb` None), else pp rank
    0's prologue and the blocks of each repeat it holds (`nb`, the ledger's)."""
    from compiler.cost.formulas import Formula
    fo, traced = model.formulas, model.traced
    names = list(traced.blocks)
    block = {name: [(p.elements, p.dims) for p in fo.param_shapes.of(("block", i))] for i, name in enumerate(names)}
    out = []
    if nb is None:
        shapes = traced.top.meta[T.PARAM_SHAPES]
        for item in _top_params(traced):
            if isinstance(item, tuple):
                out += block[item[1]] * fo.counts[item[1]].n
            else:
                shape = shapes[item]
                out.append((Formula(sympy.Mul(*shape) if shape else sympy.Integer(1), fo.sub), len(shape)))
    else:
        out += [(p.elements, p.dims) for p in fo.param_shapes.of("prologue")]
        for name in names:
            out += block[name] * nb.get(name, 0)
    return [x for x in out if x[1] >= 2] + [x for x in out if x[1] < 2]


def host_elements(model, plan, env, nb) -> tuple:
    """(elements, their formula's maker) of the parameters whose optimizer state the ledger's rank steps on the
    host: runtime.offload.HostAdamW's choice, computed with its own functions on the rank's parameters
    (`rank_params`): under zero1 dp rank 0's partition (runtime.precision.partition_sizes), of it the shortest
    prefix holding `fraction` of its elements, whole tensors (runtime.offload.host_prefix)."""
    from runtime.offload import host_prefix
    from runtime.precision import partition_sizes
    params = rank_params(model, nb)
    sizes = [int(f(env)) for f, _ in params]
    z = ST.groups(plan)[ST.DENSE][1] if plan.data_parallel == "zero1" else 1
    owner = partition_sizes(sizes, z) if z > 1 else [0] * len(sizes)
    mine = [i for i, r in enumerate(owner) if r == 0]
    chosen = mine[:host_prefix([sizes[i] for i in mine], fraction(plan))]
    return (sum(sizes[i] for i in chosen),
            lambda: sympy.expand(sum((params[i][0].expr for i in chosen), sympy.Integer(0))))


# -- the ledger's copies ----------------------------------------------------------------------------------------


def copies(model, plan, params_rank, experts_rank, params, experts, activations=None, host=None) -> list:
    """The host<->device copies of one step on the rank, as ledger entries (op d2h or h2d, group "host"; per rank
    and step, bytes of all the calls). `params`, `experts`: the rank's parameters as formulas (the ledger's);
    `activations`: (bytes per micro-batch, its formula's maker) of what the rank's blocks offload; `host`:
    (elements, their formula's maker) of the parameters the host steps (`host_elements`; f of the shard without)."""
    from compiler.cost.ledger import Collective
    if plan.offload == "none":
        return []
    out = []
    span = plan.span("offload")
    n = shard_elements(plan, params_rank, experts_rank)
    formula = lambda: _shard_formula(plan, params, experts)  # noqa: E731
    prec = model.spec.train.precision
    if plan.offload in ("optimizer", "params"):
        f = fraction(plan)
        if f <= 0:
            return []
        share = sympy.nsimplify(f)
        fsdp2 = plan.shards_grads
        g = 4 if fsdp2 else ST.grad_bytes(prec, plan.grad_reduce)
        # the device's parameter of the fraction: the bf16 compute copy where the optimizer keeps the master
        # (bf16 ddp, zero1), else the fp32 parameter (FSDP2's sharded one, fp32 programs')
        w = 2 if prec == "bf16" and not fsdp2 else 4
        if plan.offload == "params":
            gathers = plan.micro_batches * 2  # fsdp: every micro-batch's forward and backward (the ledger's)
            syncs = plan.micro_batches if plan.syncs_each_micro_batch else 1
            out.append(Collective(op="h2d", axis=HOST, dtype_bytes=4, span=span, direction="forward",
                                  reason="parameter offload (FSDP2 CPUOffloadPolicy): each unit's fp32 shard to the "
                                         "device before each of its all-gathers, forward and backward",
                                  times=gathers, bytes=int(4 * n * gathers), measured=False,
                                  element_formula=formula))
            out.append(Collective(op="d2h", axis=HOST, dtype_bytes=4, span=span, direction="backward",
                                  reason="parameter offload: each unit's reduce-scattered gradient shard to the host",
                                  times=syncs, bytes=int(4 * n * syncs), measured=False, element_formula=formula))
            return out
        # the whole tensors HostAdamW takes (`host_elements`): what runtime.offload counts, so measured
        moved, part = host if host is not None else (f * n, lambda: sympy.expand(share * formula()))
        out.append(Collective(op="d2h", axis=HOST, dtype_bytes=g, span=span, direction="step",
                              reason=f"optimizer offload {f:.0%}: the host's share of the gradients, to its AdamW",
                              times=1, bytes=int(g * moved), measured=host is not None, element_formula=part))
        out.append(Collective(op="h2d", axis=HOST, dtype_bytes=w, span=span, direction="step",
                              reason=f"optimizer offload {f:.0%}: the parameters the host updated, back",
                              times=1, bytes=int(w * moved), measured=host is not None, element_formula=part))
        return out
    if activations is None:
        return out
    per_mb, formula_of = activations
    m = plan.micro_batches
    if per_mb <= 0:
        return out
    for op, direction, what in (("d2h", "forward", "to the host in forward"),
                                ("h2d", "backward", "back for backward")):
        # dtype_bytes 1: the formula is in bytes (activations of several dtypes)
        out.append(Collective(op=op, axis=HOST, dtype_bytes=1, span=span, direction=direction,
                              reason=f"activation offload: the saved activations of "
                                     f"{', '.join(plan.offload_modules) or 'every block module'} {what}, "
                                     "per micro-batch",
                              times=m, bytes=int(per_mb * m), measured=True, element_formula=formula_of))
    return out


# -- activations ------------------------------------------------------------------------------------------------


def _block_share(gm, precision: str, device: str, modules: tuple):
    """(copied, moved, every) of one block without recomputation (activations.saved_by_prefix): `modules` empty,
    every op's saves."""
    from compiler.cost import activations as A
    return A.saved_by_prefix(gm, precision, device, tuple(p for k in modules for p in PREFIXES[k]))


def block_parts(model, plan, mode: str) -> tuple:
    """Per repeat (in the formulas' order), (copied, moved): Formulas of the bytes one block's hooks copy to the host
    per micro-batch under `activations(modules)` with recomputation `mode` (a SAVED_MODES key), and of those that
    leave the device. Without recomputation, from each save the named modules' ops make (`_block_share`: a tensor
    two of them save is copied twice, and leaves the device once); `modules` empty, every op's. Under selective
    recomputation, that share of what the block keeps; under full recomputation the block keeps only its input,
    which no module holds: all of it with `modules` empty, else nothing. (The runtime's copies are measured
    without recomputation: tests/e2e/test_offload.py.)"""
    from compiler.cost import activations as A
    from compiler.cost.formulas import Formula
    modules = tuple(sorted(set(plan.offload_modules)))
    key = ("offloaded", modules, mode)
    got = model._rank_parts.get(key)
    if got is None:
        spec, prec = model.spec, model.precision
        device = "cpu" if spec.cluster.device.kind == "cpu" else "cuda"
        out = []
        for gm in model.traced.blocks.values():
            whole = A.block_saved_bytes(gm, prec, device, mode)
            if mode == "full":
                copied = moved = whole if not modules else sympy.Integer(0)
            else:
                copied, moved, every = _block_share(gm, prec, device, modules)
                if mode != "none":
                    share = moved / every if every != 0 else 0
                    copied = moved = sympy.expand(whole * share)
            out.append(tuple(Formula(sympy.sympify(e), model.formulas.sub) for e in (copied, moved)))
        got = model._rank_parts[key] = tuple(out)
    return got


def block_bytes(model, plan, mode: str) -> tuple:
    """Per repeat, the Formula of the bytes one block copies to the host per micro-batch (`block_parts`)."""
    return tuple(c for c, _ in block_parts(model, plan, mode))


def blocks_held(model, plan, env, stages) -> tuple:
    """((repeat index in the traced blocks' order, blocks), ...) the rank's stages hold (`stages`: (first, end)
    block ranges), or every block without pp."""
    fo = model.formulas
    names = list(model.traced.blocks)
    if not stages:
        return tuple((i, fo.counts[name].n) for i, name in enumerate(names))
    out: dict = {}
    for lo, hi in stages:
        for i, k in fo.held(lo, hi):
            j = names.index(fo.edges[i][0])
            out[j] = out.get(j, 0) + k
    return tuple(sorted(out.items()))


def ledger_copies(model, plan, env, nb, params_rank, experts_rank, b_sym) -> list:
    """`copies` as CostModel._ledger lists them: `nb`, the blocks of each repeat the rank holds (None without pp:
    all); `b_sym`, the micro-batch's sequences as a formula."""
    from compiler.symbols import MICRO_BATCH
    fo = model.formulas
    pa, ex = fo.params, fo.experts
    names = list(model.traced.blocks)
    if nb is None:
        params = lambda: pa.whole.expr  # noqa: E731
        experts = lambda: ex.whole.expr  # noqa: E731
        held = tuple((i, fo.counts[name].n) for i, name in enumerate(names))
        counted = tuple((i, fo.counts[name].expr) for i, name in enumerate(names))
    else:
        k = [nb[name] for name, _, _ in fo.edges]
        params = lambda: sympy.expand(pa.prologue.expr + sum(c * f.expr for c, f in zip(k, pa.block)))  # noqa: E731
        experts = lambda: sympy.expand(ex.prologue.expr + sum(c * f.expr for c, f in zip(k, ex.block)))  # noqa: E731
        held = counted = tuple((i, nb[name]) for i, name in enumerate(names) if nb.get(name))
    acts = None
    if plan.offload == "activations":
        from compiler.cost.formulas import saved_mode
        per = block_bytes(model, plan, saved_mode(plan))
        total = sum(c * per[i](env) for i, c in held)
        acts = (total, lambda: sympy.expand(sum(c * per[i].expr for i, c in counted).xreplace({MICRO_BATCH: b_sym})))
    host = host_elements(model, plan, env, nb) if plan.offload == "optimizer" and fraction(plan) > 0 else None
    return copies(model, plan, params_rank, experts_rank, params, experts, acts, host)


def activation_bytes(model, plan, env, held) -> tuple:
    """(bytes one micro-batch's forward copies to the host on the rank, those of them that leave the device, one
    block's largest of those: the window's unit), at env."""
    from compiler.cost.formulas import saved_mode
    per = block_parts(model, plan, saved_mode(plan))
    copied = sum(k * per[i][0](env) for i, k in held)
    moved = sum(k * per[i][1](env) for i, k in held)
    largest = max((per[i][1](env) for i, _ in held), default=0)
    return copied, moved, largest


def device_kept(acts: float, moved: float, largest: float) -> float:
    """What the device keeps of `acts` (the rank's activations at its peak) when `moved` of them go to the host:
    the rest, and the WINDOW_BLOCKS blocks (of at most `largest` each) in flight of a copy."""
    return acts - moved + min(moved, WINDOW_BLOCKS * largest)


# -- the step ---------------------------------------------------------------------------------------------------


def host_adam_s(dev, elements: float) -> float:
    """The host's AdamW over `elements` parameters (devices.py `host_adam_params_per_s`: a device's share of its
    host)."""
    return elements / dev.host_adam_params_per_s if elements else 0.0


def copy_s(dev, nbytes: float) -> float:
    """`nbytes` over the device's host link, one direction (devices.py `host_gbps`)."""
    return nbytes / (dev.host_gbps * 1e9) if nbytes else 0.0


def host_tail(plan, dev, elements: float, device_adam_s: float, copies_bytes: tuple) -> tuple:
    """(the optimizer part of the step, the host's AdamW in it, the copies' seconds in it) for a rank whose
    optimizer shard is `elements` and whose device AdamW over all of it takes `device_adam_s`; `copies_bytes`:
    (down, up) bytes of the step's optimizer copies (the ledger's). Without optimizer or parameter offload, the
    device's AdamW."""
    f = fraction(plan)
    if f <= 0:
        return device_adam_s, 0.0, 0.0
    host = host_adam_s(dev, f * elements)
    if plan.offload == "params":
        return host, host, 0.0  # the copies ride with the gathers and reduce-scatters (`params_exposed`)
    moved = copy_s(dev, copies_bytes[0]) + copy_s(dev, copies_bytes[1])
    return max((1 - f) * device_adam_s, moved + host), host, moved


def overlapped_exposed(total_s: float, window_s: float, unit_s: float) -> float:
    """Copies of `total_s` on the host link under compute of `window_s`: what the window cannot hold, and one
    unit's copy (`unit_s`) that nothing hides (the first ahead of its compute, or the last after it)."""
    return max(0.0, total_s - window_s) + min(unit_s, total_s)


def step_part(plan, dev, entries, scale: float, elements: float, device_adam_s: float, busy_s: float,
              units: int) -> tuple:
    """(the optimizer's part of the step, the host's AdamW in it, the copies' seconds the step waits for outside
    it) of a rank holding `scale` × the ledger's rank's parameters, `elements` of them in its optimizer shard, whose
    device AdamW over all of them takes `device_adam_s` and whose compute takes `busy_s`; `entries`: the ledger's
    host copies (`copies`), `units`: the units a `params` or `activations` copy is cut into (FSDP's units, the
    blocks), the one whose copy nothing hides."""
    host = [c for c in entries if c.axis == HOST]
    if plan.offload == "optimizer":
        down = sum(c.bytes for c in host if c.op == "d2h") * scale
        up = sum(c.bytes for c in host if c.op == "h2d") * scale
        opt, adam, _ = host_tail(plan, dev, elements, device_adam_s, (down, up))
        return opt, adam, 0.0
    total = sum(copy_s(dev, c.bytes * scale) for c in host)
    calls = sum(c.times for c in host)
    exposed = overlapped_exposed(total, busy_s, total / max(calls * max(units, 1), 1)) if total else 0.0
    if plan.offload == "params":
        adam = host_adam_s(dev, elements)
        return adam, adam, exposed
    return device_adam_s, 0.0, exposed
