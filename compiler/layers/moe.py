"""`moe(hidden, ffn, experts, top_k, ...)`: a mixture of experts in place of an MLP. Its experts are sharded over
ep (compiler/passes/expert_parallel.py), not over tp: the router and the experts are replicated over tp. Its shared
expert (`shared_ffn`) is an MLP beside them, a dense part under ep, sharded over tp as an `mlp` is (TP_ROLES)."""
from __future__ import annotations

from dataclasses import dataclass, field

from compiler import ast
from compiler.binder import (Param, arg_span, call_of, to_bool, one_of, to_float, or_none, to_int, to_pos_int,
                             to_size)
from compiler.diagnostics import Span
from compiler.symbols import Size
from compiler.symbols import size as size_symbol


@dataclass(frozen=True, kw_only=True)
class MoE:
    """Mixture of experts in place of an MLP: a router picks `top_k` of `experts` MLPs for each token; each expert
    takes at most `capacity` tokens of each sequence, the others' choices are dropped."""
    hidden: Size
    ffn: Size
    experts: Size
    top_k: int
    capacity_factor: float | str
    """A multiple of a balanced share, or "none": dropless, capacity = seq (compiler/layers/moe.py DROPLESS)."""
    act: str  # "gelu" | "swiglu"
    aux_loss: float
    """Weight of the auxiliary load-balancing loss (Switch/GShard); 0 turns it off."""
    dropped: str
    """`residual`: a dropped choice adds nothing, the token goes on through the enclosing residual (Switch);
    `identity`: it adds the gate-weighted token itself."""
    capacity: Size
    """Slots per expert per sequence, a size symbol (`capacity`, `capacity_2`, ...) whose value the checker sets
    from the sequence length: min(seq_len, ceil(capacity_factor · top_k · seq_len / experts))."""
    span: Span
    renormalize: bool | None = None
    """Whether the gates of a token's top_k choices are renormalised to sum to 1 (else each is its softmax
    probability over all the experts); None: as before the setting existed, renormalised when top_k > 1."""
    capacity_span: Span | None = field(default=None, compare=False)
    """Where `capacity_factor` is written (None when defaulted): what a warning on the capacity points at."""
    shared_ffn: Size | None = None
    """Inner width of the shared expert, an always-on MLP (the experts' act, no biases) whose output every token
    adds to the routed experts' (Qwen-MoE, DeepSeekMoE); None: no shared expert."""
    shared_gate: str = "none"
    """`none`: the shared expert's output is added as is; `sigmoid`: scaled per token by sigmoid(x · w), w a
    hidden-wide vector (Qwen2-MoE's shared_expert_gate)."""
    scoring: str = "softmax"
    """An expert's score: `softmax` over the experts, or `sigmoid` of its own logit (DeepSeek-V3)."""
    groups: int = 1
    """Group-limited routing (DeepSeek-V3's n_group): the experts cut into this many groups..."""
    topk_groups: int = 1
    """...of which a token chooses its experts within the best this many (a group's score: its two best experts')."""
    routed_scale: float = 1.0
    """The routed gates multiplied by it (DeepSeek-V3's routed_scaling_factor)."""
    bias_update: float = 0.0
    """Auxiliary-loss-free balancing (DeepSeek-V3): a per-expert bias on the scores a token chooses by, moved by this
    much after each step against the step's load (runtime.moe.ExpertBias); 0: none."""
    dispatch: str = "padded"
    """Dropless routing's way to the experts: `padded`, every expert a buffer of `capacity` (= seq) slots per
    sequence; `grouped`, the tokens sorted by expert, variable all-to-alls over ep, grouped matmuls (issue 25)."""
    rebalance: tuple | None = None
    """Expert re-placement during training (`rebalance = replicate(every = N, extra = R)`, issue 44): (N, R), every
    N steps the experts re-placed from their measured load, the R hottest given replicas (runtime/rebalance.py);
    None: the experts stay where expert parallelism first put them."""
    rebalance_span: Span | None = field(default=None, compare=False)
    """Where `rebalance` is written: what its diagnostics point at."""


SPEC = MoE
# `rebalance = replicate(...)`: the one kind of expert re-placement (runtime/rebalance.py)
REBALANCES = {"replicate": {"every": Param(to_int, 100, "steps between two re-placements"),
                            "extra": Param(to_int, 0, "replicas of the hottest experts, beyond one copy each: "
                                                      "(experts + extra) / ep slots per ep rank")}}
LEAF = "moe"  # its leaves' prefix: moe_router, moe_experts, moe_shared_up, ...
SCHEMA = {"moe": {"hidden": Param(to_size, doc="model width"), "ffn": Param(to_size, doc="inner width of each expert"),
                  "experts": Param(to_size, doc="number of experts"),
                  "top_k": Param(to_pos_int, 2, "experts per token"),
                  "capacity_factor": Param(lambda c, e, w: DROPLESS if isinstance(e, ast.Name) and e.id == "none"
                                           else c.as_float(e, w), 1.25,
                                           "slots per expert as a multiple of a balanced share of the tokens; "
                                           "none: dropless (every choice reaches its expert)"),
                  "act": Param(one_of("gelu", "swiglu"), "gelu", "activation of the expert MLPs"),
                  "aux_loss": Param(to_float, 0.01, "weight of the load-balancing loss"),
                  "dropped": Param(one_of("residual", "identity"), "residual",
                                   "what a choice over capacity contributes: nothing (residual) or the token "
                                   "(identity)"),
                  "renormalize": Param(to_bool, lambda a: a["top_k"] > 1 if a["top_k"] is not None else None,
                                       "the gates of a token's top_k choices divided by their sum (GShard, "
                                       "Mixtral, Qwen3-MoE), or each its softmax probability over all the experts "
                                       "(Switch, Qwen2-MoE); default: true when top_k > 1"),
                  "shared_ffn": Param(or_none(to_size), None,
                                      "inner width of a shared expert every token passes through beside its routed "
                                      "experts (none: no shared expert)"),
                  "shared_gate": Param(one_of("none", "sigmoid"), "none",
                                       "the shared expert's output added as is (none), or scaled per token by "
                                       "sigmoid(x · w) (Qwen2-MoE)"),
                  "scoring": Param(one_of("softmax", "sigmoid"), "softmax",
                                   "an expert's score: its softmax probability over all the experts, or its own "
                                   "sigmoid (DeepSeek-V3)"),
                  "groups": Param(to_pos_int, 1, "expert groups for group-limited routing (DeepSeek-V3's n_group)"),
                  "topk_groups": Param(to_pos_int, 1, "the best groups a token may choose its experts from "
                                                    "(DeepSeek-V3's topk_group)"),
                  "routed_scale": Param(to_float, 1.0, "the routed experts' gates multiplied by it "
                                                     "(DeepSeek-V3's routed_scaling_factor)"),
                  "bias_update": Param(to_float, 0.0, "auxiliary-loss-free balancing: a per-expert bias on the "
                                                    "choice, moved this much after each step against the load "
                                                    "(DeepSeek-V3's γ, 0.001); 0: none"),
                  "dispatch": Param(one_of("padded", "grouped"), "padded",
                                    "how dropless routing reaches the experts: buffers padded to the worst case "
                                    "(padded), or the tokens sorted by expert, variable all-to-alls over ep and "
                                    "grouped matmuls (grouped: hardware FLOPs equal to the model's); grouped needs "
                                    "capacity_factor = none"),
                  "rebalance": Param(call_of(REBALANCES, "re-placement", none_is_absent=True), None,
                                     "expert re-placement during training: `replicate(every = N, extra = R)` "
                                     "re-places the experts over the ep ranks every N steps from their measured "
                                     "load, the R hottest with a replica each (DeepSeek's EPLB); none: never")}}
# The routed experts and the router are replicated over tp (the experts shard over ep). A shared expert is an MLP:
# column-parallel up and gate, row-parallel down, as `mlp` shards (`moe_shared_up`, `moe_shared_gate`,
# `moe_shared_down`); its sigmoid gate (`moe_shared_sigmoid`) is replicated.
TP_ROLES = {"up": "column", "gate": "column", "down": "row"}

# `capacity_factor = none`: dropless routing (Mixtral, Qwen-MoE). Every expert gets a slot for every token of each
# sequence (an expert takes a token at most once): capacity = seq, the worst case, so no choice is ever dropped and
# the buffers and all-to-alls keep static shapes (E × B·S × H), which the ledger counts.
DROPLESS = "none"

# Names of the size symbols bound for each `moe` layer (its capacity per sequence): capacity, capacity_2, ...
CAPACITY = "capacity"


def resolve(c, st, a: dict, kind: str):
    experts = int(c.number(a["experts"]))
    ok = True
    if a["top_k"] > experts:
        c.error("E0702", f"top_k = {a['top_k']} is more than the {experts} experts", arg_span(st, 3, "top_k"),
                label=f"{a['top_k']} > {experts}", help="each token picks distinct experts: use top_k ≤ experts "
                "(Switch routes to 1, GShard to 2)")
        ok = False
    if a["capacity_factor"] not in (None, DROPLESS) and a["capacity_factor"] <= 0:
        c.error("E0703", f"capacity_factor must be positive, not {a['capacity_factor']:g}",
                arg_span(st, 4, "capacity_factor"), label="no expert could take a token",
                help="1.0 gives each expert exactly a balanced share of the tokens; 1.25 leaves room for imbalance")
        ok = False
    if a["dispatch"] == "grouped" and a["capacity_factor"] != DROPLESS:
        c.error("E0717", f"dispatch = grouped with capacity_factor = {a['capacity_factor']:g}: grouped dispatch is "
                "dropless", arg_span(st, 16, "dispatch"), label="sorts every choice to its expert, none dropped",
                help="write `capacity_factor = none` with `dispatch = grouped`, or remove `dispatch` to keep the "
                     "capacity and drop the choices over it")
        ok = False
    rebalance = a["rebalance"][1] if a["rebalance"] is not None else None
    if rebalance is not None:
        at = arg_span(st, 17, "rebalance")
        if rebalance["every"] < 1 or rebalance["extra"] < 0:
            said = (f"every = {rebalance['every']}: the experts would never be re-placed" if rebalance["every"] < 1
                    else f"extra = {rebalance['extra']} replicas")
            c.error("E0719", f"rebalance {said}", at, label="out of range",
                    help="every is a number of steps, at least 1, and extra a number of replicas, at least 0 "
                         "(e.g. `rebalance = replicate(every = 100, extra = 8)`)")
            ok = False
        if a["dispatch"] != "grouped":
            c.error("E0720", "rebalance with padded dispatch: every expert computes its whole buffer whatever its "
                    "load", at, label="nothing to even out",
                    help="re-placement evens the rows each ep rank computes, which only `dispatch = grouped` (with "
                         "`capacity_factor = none`) makes follow the load; add them, or remove `rebalance`")
            ok = False
    groups, chosen = a["groups"], a["topk_groups"]
    if experts % groups or experts // groups < 2 <= groups:
        c.error("E0713", f"{groups} expert groups do not split the {experts} experts into groups of two or more",
                arg_span(st, 12, "groups"), label=f"{experts} experts / {groups} groups",
                help="groups must divide the experts, each group holding at least two (DeepSeek-V3: 256 experts "
                     "in 8 groups)")
        ok = False
    elif chosen > groups or (groups > 1 and chosen * (experts // groups) < a["top_k"]):
        said = (f"topk_groups = {chosen} is more than the {groups} groups" if chosen > groups else
                f"a token chooses {a['top_k']} experts among the {chosen * (experts // groups)} of its best {chosen} "
                f"group{'s' if chosen > 1 else ''}")
        c.error("E0714", said, arg_span(st, 13, "topk_groups"), label="too few experts to choose from",
                help="topk_groups is at most groups, and topk_groups · experts / groups at least top_k "
                     "(DeepSeek-V3: top 8 of the 128 experts in 4 of 8 groups)")
        ok = False
    if a["routed_scale"] is not None and a["routed_scale"] <= 0:
        c.error("E0120", "routed_scale must be positive", arg_span(st, 14, "routed_scale"),
                label="multiplies every routed gate", help="DeepSeek-V3 scales its gates by 2.5; 1.0 leaves them")
        ok = False
    if not ok:
        return None
    written = {arg.name.id for arg in st.args if arg.name is not None} | {k for k, arg in zip(SCHEMA[kind], st.args)
                                                                          if arg.name is None}
    if a["bias_update"] and a["top_k"] == experts:
        c.warn("W0716", f"bias_update with every token going to all {experts} experts (top_k = {experts})",
               arg_span(st, 15, "bias_update"), label="the bias changes no choice",
               help="with top_k = experts every expert takes every token; use a smaller top_k, or remove "
                    "`bias_update`")
    if "topk_groups" in written and (groups == 1 or chosen == groups):
        c.warn("W0715", f"topk_groups = {chosen} with {groups} group{'s' if groups > 1 else ''}: every expert may be "
               "chosen", arg_span(st, 13, "topk_groups"), label="limits nothing",
               help="cut the experts into groups (`groups = 8`) and let a token choose from fewer of them "
                    "(`topk_groups = 4`), or remove `topk_groups`")
    if "dropped" in written and a["capacity_factor"] == DROPLESS:
        c.warn("W0709", "`dropped` says what a dropped choice contributes, and dropless routing drops none",
               arg_span(st, 7, "dropped"), label="has no effect under `capacity_factor = none`",
               help="remove `dropped`, or give the experts a capacity factor (e.g. `capacity_factor = 1.25`)")
    if "aux_loss" in written and a["aux_loss"] and a["top_k"] == experts:
        c.warn("W0710", f"a load-balancing loss when every token goes to all {experts} experts (top_k = {experts})",
               arg_span(st, 6, "aux_loss"), label="constant: its gradient is 0",
               help="with top_k = experts the load is always balanced; use a smaller top_k, or `aux_loss = 0`")
    if "renormalize" in written and a["renormalize"] and a["top_k"] == 1:
        c.warn("W0712", "renormalize = true with top_k = 1: every gate is 1", arg_span(st, 8, "renormalize"),
               label="the router's choice no longer scales the expert's output",
               help="the router then learns only from the load-balancing loss; remove `renormalize` (top-1 gates "
                    "are the chosen expert's probability, as in Switch), or route to top_k > 1")
    if "shared_gate" in written and a["shared_gate"] != "none" and a["shared_ffn"] is None:
        c.warn("W0711", f"shared_gate = {a['shared_gate']} without a shared expert", arg_span(st, 10, "shared_gate"),
               label="gates nothing", help="give the shared expert a width (e.g. `shared_ffn = 4 * ffn`), or remove "
               "`shared_gate`")
    c.moe_layers += 1
    name = CAPACITY if c.moe_layers == 1 else f"{CAPACITY}_{c.moe_layers}"
    return MoE(hidden=a["hidden"], ffn=a["ffn"], experts=a["experts"], top_k=a["top_k"],
               capacity_factor=a["capacity_factor"], act=a["act"], aux_loss=a["aux_loss"], dropped=a["dropped"],
               renormalize=a["renormalize"], shared_ffn=a["shared_ffn"], shared_gate=a["shared_gate"] if a["shared_ffn"] is not None else "none",
               capacity=size_symbol(name), span=st.span, scoring=a["scoring"], groups=groups,
               topk_groups=chosen, routed_scale=a["routed_scale"], bias_update=a["bias_update"] or 0.0,
               dispatch=a["dispatch"],
               rebalance=(rebalance["every"], rebalance["extra"]) if rebalance is not None else None,
               rebalance_span=arg_span(st, 17, "rebalance") if rebalance is not None else None,
               capacity_span=arg_span(st, 4, "capacity_factor") if "capacity_factor" in written else None)


def build(seg, m: MoE, p: str):
    """The single-device layer (compiler/model.py's Segment `seg` holds its leaves `{p}_router`, `{p}_experts`,
    `{p}_bias` and the shared expert's): route, then dispatch, experts and combine (padded) or sort_tokens, experts
    and unsort_combine (grouped), each routing step one traced call. Returns its run(segment, x) -> x; torch is
    imported here (the checker reads this module)."""
    from compiler.layers.calls import kept_whole
    from runtime import moe as RM

    # Traced as calls: the router's data-dependent choices never reach Python control flow, and the emitted program
    # calls the same functions.
    route, dispatch, combine = kept_whole(RM.route), kept_whole(RM.dispatch), kept_whole(RM.combine)
    sort_tokens, unsort_combine = kept_whole(RM.sort_tokens), kept_whole(RM.unsort_combine)
    router = seg.linear(f"{p}_router", m.hidden, m.experts, False, m.span)
    shapes = {"w_up": (m.experts, m.hidden, m.ffn), "w_gate": (m.experts, m.hidden, m.ffn),
              "w_down": (m.experts, m.ffn, m.hidden)}
    n_experts, capacity = seg.number(m.experts), seg.number(m.capacity)
    experts = seg.leaf(f"{p}_experts", RM.Experts(n_experts, seg.number(m.hidden), seg.number(m.ffn), m.act), shapes,
                       m.span)
    top_k, aux, identity = m.top_k, m.aux_loss, m.dropped == "identity"
    shared = _shared_expert(seg, m, p) if m.shared_ffn is not None else None
    # written into the call only where it differs from route's default (renormalised when top_k > 1)
    renorm = {} if m.renormalize is None or m.renormalize == (top_k > 1) else {"renormalize": m.renormalize}
    # DeepSeek-V3's router, likewise written only where it is not Mixtral's
    renorm.update({k: v for k, v, default in (("scoring", m.scoring, "softmax"), ("groups", m.groups, 1),
                                              ("topk_groups", m.topk_groups, 1),
                                              ("scale", m.routed_scale, 1.0)) if v != default})

    # DeepSeek-V3's expert bias: a leaf holding it and the step's load, handed to the router by a call
    bias = seg.leaf(f"{p}_bias", RM.ExpertBias(n_experts, m.bias_update), {}, m.span) if m.bias_update else None

    if m.dispatch == "grouped":  # dropless without padding: capacity = seq, so route drops no choice
        def run(seg, x_BSH):
            kw = renorm if bias is None else {**renorm, "bias": getattr(seg, bias)()}
            slot_BSK, gate_BSK = route(getattr(seg, router)(x_BSH), top_k, capacity, aux, **kw)
            rows_TH, counts_E = sort_tokens(x_BSH, slot_BSK, n_experts, capacity)
            y_TH = getattr(seg, experts)(rows_TH, counts_E)
            y_BSH = unsort_combine(y_TH, slot_BSK, gate_BSK, capacity)
            return y_BSH if shared is None else y_BSH + shared(seg, x_BSH)
        return run

    def run(seg, x_BSH):
        kw = renorm if bias is None else {**renorm, "bias": getattr(seg, bias)()}
        slot_BSK, gate_BSK = route(getattr(seg, router)(x_BSH), top_k, capacity, aux, **kw)
        y_ENH = getattr(seg, experts)(dispatch(x_BSH, slot_BSK, n_experts, capacity))
        # dropped = identity: combine also passes a dropped choice's token itself on.
        y_BSH = combine(y_ENH, slot_BSK, gate_BSK, *((x_BSH,) if identity else ()))
        return y_BSH if shared is None else y_BSH + shared(seg, x_BSH)
    return run


def _shared_expert(seg, m: MoE, p: str):
    """The shared expert: an MLP of width `shared_ffn` without biases, in the experts' act, that every token passes
    through (leaves `{p}_shared_up`, `_gate`, `_down`, which tp shards as an MLP's), its output scaled per token by
    sigmoid(x · w) under `shared_gate = sigmoid` (leaf `{p}_shared_sigmoid`, hidden → 1)."""
    import torch
    import torch.nn.functional as F

    up = seg.linear(f"{p}_shared_up", m.hidden, m.shared_ffn, False, m.span)
    gate = seg.linear(f"{p}_shared_gate", m.hidden, m.shared_ffn, False, m.span) if m.act == "swiglu" else None
    down = seg.linear(f"{p}_shared_down", m.shared_ffn, m.hidden, False, m.span)
    seg.residual_out.append(down)
    weigh = seg.linear(f"{p}_shared_sigmoid", m.hidden, 1, False, m.span) if m.shared_gate == "sigmoid" else None

    def shared(seg, x_BSH):
        h_BSF = getattr(seg, up)(x_BSH)
        h_BSF = F.silu(getattr(seg, gate)(x_BSH)) * h_BSF if gate is not None else F.gelu(h_BSF)
        y_BSH = getattr(seg, down)(h_BSF)
        return y_BSH if weigh is None else torch.sigmoid(getattr(seg, weigh)(x_BSH)) * y_BSH
    return shared
