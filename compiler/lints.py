"""Cross-setting lints: settings that are each legal but together cannot do what they say, or that change nothing
in this plan, and the model facts they read (each `moe` layer's capacity, sliding windows, positions encoded
twice, a tp axis listed so that its groups cross nodes, device figures in other units). Each becomes a warning (or
an error where the run would fail) at the setting's text; resolution (compiler/check.py) calls them once the
sections they read are resolved.
"""
from __future__ import annotations


from runtime import choices  # torch-free: the names the language shares with the runtime

from compiler import ast
from compiler import spec as S
from compiler.binder import Checker, span_of
from compiler.layout import groups as layout_groups
from compiler.language import (FIGURE_RANGES, MAX_COUNT, MAX_EVAL_SPLIT, MAX_TIMEOUT, MIN_TIMEOUT, PLAN_SETTINGS,
                               SUSPICIOUS_LR, TP_LAYERS)
from compiler.symbols import capacity


def positions_twice(c: Checker, layers: list) -> None:
    """Learned absolute positions beside rotary embeddings: both run, but a model has one of them (GPT-2 the first,
    Llama the second); the two together are almost surely a half-converted file."""
    pos = next((x for x in layers if isinstance(x, S.Positional)), None)
    rotary = next((x for x in S.walk(layers) if isinstance(x, (S.Attention, S.MLA)) and x.rope_theta), None)
    if pos is not None and rotary is not None:
        c.warn("W0138", "learned positions and rotary embeddings together: positions are encoded twice", pos.span,
               label="learned absolute positions", help=f"the attention at {rotary.span} has rotary embeddings "
               f"(rope_theta = {rotary.rope_theta:g}); remove `positional(...)`, or `rope_theta` for GPT-style "
               "learned positions")



def tp_placement(c: Checker, mesh) -> None:
    """W0413: tp's groups cross nodes though tp fits in one. The axes are listed outermost first and the last
    varies fastest over the ranks (runtime/mesh.py builds the DeviceMesh so; compiler/layout/groups.py reads the
    same order), so tp's group is tp ranks `stride` apart, stride the product of the axes listed after it; whether
    it stays in a node is the Cluster's to say (compiler/layout/cluster.py `crosses`: when tp × stride divides
    devices_per_node). tp's all-reduces sit on every layer's critical path, and between nodes they run at the
    network's bandwidth, a tenth of NVLink's. `mesh`: the mesh section as compiler/check.py resolved it (its axes,
    its cluster and axis_spans)."""
    names = [a for a, _ in mesh.axes]
    cluster = mesh.cluster
    if "tp" not in names or cluster.nodes < 2:
        return
    i = names.index("tp")
    tp = layout_groups.groups(mesh.axes)["tp"]
    (stride, n), per_node = tp.pattern[0], cluster.devices_per_node
    if n < 2 or not cluster.crosses(tp) or n > per_node or per_node % n:
        return  # inside a node already, or too large for one whatever the order
    inner = ", ".join(f"{a} = {k}" for a, k in mesh.axes[i + 1:] if k > 1)
    c.warn("W0413", f"tp = {n} is listed before {inner}, so each tp group takes ranks {stride} apart and crosses "
           f"nodes of {per_node} devices", mesh.axis_spans["tp"], label="tp's all-reduces cross nodes",
           help=f"axes are listed outermost first and the last varies fastest over the ranks: list `axis tp = {n}` "
                f"last and its groups stay inside a node (`scalec plan` shows each axis's link)")




def device_figures(c: Checker, sec: ast.Section) -> None:
    """A device figure written as a number far outside any device: a warning at it (the cost model would plan for
    it as written, and say nothing while the memory check passes a plan no device can hold)."""
    for st in sec.body:
        if not (isinstance(st, ast.Assign) and st.key.id in FIGURE_RANGES and isinstance(st.value, ast.Number)):
            continue
        low, high, unit = FIGURE_RANGES[st.key.id]
        v = float(st.value.value)
        if v > 0 and ((low is not None and v < low) or (high is not None and v > high)):
            c.warn("W0139", f"`{st.key.id} = {v:g}` is far outside any device", st.value.span,
                   label="in other units?", help=f"{st.key.id} is in {unit}")



def arg_of(call, name: str, index: int):
    """The value expression of argument `name` (or the `index`-th positional one) of a call, or None."""
    for i, arg in enumerate(getattr(call, "args", ())):
        if (arg.name is not None and arg.name.id == name) or (arg.name is None and i == index):
            return arg.value
    return None


def train_checks(c: Checker, train: S.Train, written: dict) -> None:
    """Training settings that are each legal but together cannot do what they say, or that would fail only when the
    program starts: a schedule whose floor is above its peak, a warm-up longer than the run, a timeout the runtime's
    clocks cannot hold, checkpoint and log intervals the run never reaches."""
    opt, sched, steps = train.optimizer, train.schedule, train.steps
    at = {k: span_of(v) for k, v in written.items()}
    if "timeout" in written and train.timeout > MAX_TIMEOUT:
        c.error("E0130", f"a timeout of {train.timeout:g} s is longer than the watchdog can wait",
                at["timeout"], label=f"more than {MAX_TIMEOUT:g} s (a week)",
                help=f"at most {MAX_TIMEOUT:g} s (\"7 days\"); a collective that legitimately takes longer than "
                     "its step is a hang. `timeout = 0` turns the watchdog off")
    elif "timeout" in written and 0 < train.timeout < MIN_TIMEOUT:
        c.warn("W0140", f"a timeout of {train.timeout:g} s is shorter than a healthy start-up or step can take",
               at["timeout"], label="the watchdog would end a healthy run",
               help=f"the watchdog bounds the rendezvous of all ranks and every collective: give at least "
                    f"{MIN_TIMEOUT:g} s (\"10 min\" is the default; a bare number is seconds); `timeout = 0` turns "
                    "it off")
    before = c.errors()
    counts = [(k, getattr(train, k), at.get(k)) for k in ("steps", "log_every", "checkpoint_every", "restarts",
                                                          "eval_every", "eval_batches")]
    counts.append(("warmup", sched.warmup, span_of(arg_of(written.get("lr_schedule"), "warmup", 0))))
    for key, n, where in counts:
        if isinstance(n, int) and n > MAX_COUNT and where is not None:  # checkpoint_every may be `auto`
            c.error("E0120", f"`{key}` = {n} is more than a run counts", where, label="too large",
                    help=f"at most {MAX_COUNT}")
    if c.errors() > before:
        return  # the checks below compare these numbers
    call = written.get("optimizer")
    if opt.eps <= 0 and (e := arg_of(call, "eps", 3)) is not None:
        c.error("E0120", "Adam's eps must be positive", span_of(e), label="divides by the root of the second moment",
                help="the usual value is `eps = 1e-8`")
    if opt.lr > SUSPICIOUS_LR:
        c.warn("W0131", f"a learning rate of {opt.lr:g} is far above any AdamW rate", span_of(arg_of(call, "lr", 0))
               or at.get("optimizer"), label="the first step would blow the weights up",
               help="AdamW's peak rates are 1e-6 .. 1e-2: was `3e-3` meant?")
    call = written.get("lr_schedule")
    if sched.kind == "cosine" and sched.min_lr > opt.lr:
        c.error("E0131", f"the schedule's floor min_lr = {sched.min_lr:g} is above the peak lr = {opt.lr:g}",
                span_of(arg_of(call, "min_lr", 1)) or at.get("lr_schedule"), label="above `lr`",
                help="cosine decays from `lr` down to `min_lr`: make min_lr smaller than lr (e.g. lr / 10), or use "
                     "`constant(...)`")
    if sched.warmup >= steps and sched.warmup > 0:
        c.warn("W0130", f"a warm-up of {sched.warmup} steps is not over in a run of {steps}",
               span_of(arg_of(call, "warmup", 0)) or at.get("lr_schedule"), label=f"warmup ≥ steps = {steps}",
               help=f"the learning rate never reaches lr = {opt.lr:g}; use a warm-up shorter than `steps` (a few "
                    "percent of it)")
    if "checkpoint_every" in written and train.checkpoint_every:
        if not train.checkpoint_dir:
            c.warn("W0132", "`checkpoint_every` without `checkpoint_dir`: no checkpoint is written",
                   at["checkpoint_every"], label="has no effect",
                   help='add `checkpoint_dir = "ckpt"` to write checkpoints, or remove `checkpoint_every`')
        elif train.checkpoint_every != "auto" and train.checkpoint_every >= steps:
            c.warn("W0133", f"checkpoint_every = {train.checkpoint_every} is not shorter than the run ({steps} steps):"
                   " only the last step is checkpointed", at["checkpoint_every"], label="has no effect",
                   help="the last step is always checkpointed; use fewer steps between checkpoints, or remove it")
    if "checkpoint_async" in written and train.checkpoint_async:
        why = ("no `checkpoint_dir`: no checkpoint is written" if not train.checkpoint_dir else
               "only the last step is checkpointed, and a run waits for its last checkpoint"
               if train.checkpoint_every != "auto" and not 0 < train.checkpoint_every < steps else "")
        if why:
            c.warn("W0142", f"checkpoint_async has nothing to overlap: {why}", at["checkpoint_async"],
                   label="has no effect", help="asynchronous saves overlap the steps after a checkpoint that is not "
                   "the last: write checkpoints every `checkpoint_every` steps into `checkpoint_dir`, or remove it")
    if "restarts" in written and train.restarts and not train.checkpoint_dir:
        c.warn("W0134", f"restarts = {train.restarts} without `checkpoint_dir`: each restart begins again at step 0",
               at["restarts"], label="nothing to resume from",
               help='add `checkpoint_dir = "ckpt"` so that a restart resumes from the last checkpoint')
    if "log_every" in written and train.log_every > steps:
        c.warn("W0135", f"log_every = {train.log_every} is longer than the run ({steps} steps): only the first and "
               "last steps are logged", at["log_every"], label="has no effect",
               help="the first and last steps are always logged; use a shorter interval, or remove it")
    _eval_checks(c, train, at)


def _eval_checks(c: Checker, train: S.Train, at: dict) -> None:
    """The evaluation settings: a share held out that is no fraction, an evaluation of a token file with nothing
    held out (it would evaluate on training data, or on nothing), and settings that evaluate nothing."""
    split = train.eval_split
    if "eval_split" in at and not 0 < split <= MAX_EVAL_SPLIT:
        c.error("E0120", f"eval_split = {split:g} is not a share in (0, {MAX_EVAL_SPLIT:g}]", at["eval_split"],
                label="a fraction of the file's windows",
                help="the share of the token file held out for evaluation: 0.01 .. 0.1 is usual (`eval_split = "
                     "0.05` holds out the last 5% of its windows)")
    tokens = train.data.kind == "tokens"
    if not train.eval_every:
        for key in ("eval_batches", "eval_split"):
            if key in at:
                c.warn("W0141", f"`{key}` without `eval_every`: no evaluation runs", at[key], label="has no effect",
                       help="add `eval_every = N` to evaluate every N steps (and after the last)"
                            + (", or remove it" if key == "eval_batches" else
                               "; without it the whole file is trained on" if tokens else ", or remove it"))
        return
    if tokens and "eval_split" not in at:
        c.error("E0133", "`eval_every` on a token file with nothing held out: evaluation needs data the run never "
                "trains on", at["eval_every"], label="no `eval_split`",
                help="add `eval_split = 0.05` (the last 5% of the file's windows are held out and never trained "
                     "on), or remove `eval_every`")
    elif not tokens and "eval_split" in at:
        c.warn("W0141", "`eval_split` with synthetic data: its held-out batches are a seed stream of their own",
               at["eval_split"], label="has no effect",
               help="eval_split holds out the tail of a token file (`data = tokens(...)`); remove it")


def no_effect_checks(c: Checker, spec: S.Spec, axes_written: bool) -> None:
    """Plan settings written with a value that changes nothing in this mesh: a warning at the setting, so that a user
    who believes it does something learns that it does not (tests/test_settings_reach_output.py holds every setting
    to this: it changes the program, or the check says why not)."""
    plan = spec.plan
    at = dict(plan.spans)
    if spec.train.precision == "fp32":  # settings of the bf16 policy (runtime.precision)
        if "grad_reduce" in at and plan.grad_reduce != PLAN_SETTINGS["grad_reduce"].default:
            c.warn("W0302", f"grad_reduce = {plan.grad_reduce} under `precision = fp32`: gradients are fp32",
                   at["grad_reduce"], label="has no effect",
                   help="grad_reduce chooses how bf16 programs accumulate and reduce gradients; set "
                        "`precision = bf16`, or remove it")
        if plan.fp32_residual and "fp32_residual" in at:
            c.warn("W0303", "fp32_residual under `precision = fp32`: every activation is fp32 already",
                   at["fp32_residual"], label="has no effect",
                   help="fp32_residual keeps a bf16 program's residual stream in fp32; set `precision = bf16`, or "
                        "remove it")
    _offload_effect(c, spec, at)
    if not axes_written:
        return  # axes not written (a search chooses them): no setting can be said to lack an axis
    tp, pp, dp = plan.size("tp"), plan.size("pp"), plan.size("dp")

    def warn(code: str, key: str, message: str, help: str) -> None:
        if key in at:
            c.warn(code, message, at[key], label="has no effect", help=help)

    if "ep_dispatch" in at:
        grouped = [x for x in S.walk(spec.model.layers) if isinstance(x, S.MoE) and x.dispatch == "grouped"]
        why = ("ep = 1: no expert is on another rank" if plan.size("ep") == 1 else
               "no `moe` has `dispatch = grouped`" if not grouped else
               "every grouped `moe` has `rebalance`, whose re-placed experts are sent directly"
               if all(m.rebalance is not None for m in grouped) else
               "the mesh writes a `placement`, which may move ranks between nodes" if plan.placement is not None else
               f"each ep group of {plan.size('ep')} ranks lies inside one node of {spec.cluster.devices_per_node}, "
               "or does not cut into whole nodes" if not layout_groups.ep_split(tuple(plan.axes),
                                                                               spec.cluster.devices_per_node)
               else "")
        if why:
            warn("W0725", "ep_dispatch", f"ep_dispatch = {plan.ep_dispatch} has no effect: {why}",
                 "it chooses how a grouped moe's tokens cross nodes to their experts; remove it, or use it where the "
                 "ep group spans nodes")
    steps = int(spec.value(spec.train.steps))
    for m in (x for x in S.walk(spec.model.layers) if isinstance(x, S.MoE) and x.rebalance is not None):
        if plan.size("ep") > 1 and m.rebalance[0] >= steps > 0:
            c.warn("W0724", f"rebalance every {m.rebalance[0]} steps in a run of {steps}: no step runs on a "
                   "re-placed layout", m.rebalance_span, label="has no effect",
                   help="the experts are re-placed after every N steps, from the load those steps measured; use an "
                        f"`every` shorter than the run (e.g. every = {max(1, steps // 10)}), or remove `rebalance`")
        if plan.size("ep") == 1:
            c.warn("W0721", "rebalance without expert parallelism: the mesh has no `ep` axis (or ep = 1)",
                   m.rebalance_span, label="has no effect",
                   help="re-placement moves experts between ep ranks, and one rank holds them all; add `axis ep = 2` "
                        "(or more), or remove `rebalance`")
    if plan.size("cp") == 1 and "context_parallel" in at:
        warn("W0310", "context_parallel", "context_parallel without context parallelism: the mesh has no `cp` axis "
             "(or cp = 1)", "context_parallel says how attention runs over a sequence sharded over cp; add "
             "`axis cp = 2` (or more), or remove the setting")
    if tp == 1:
        no_tp = "the mesh has no `tp` axis (or tp = 1)"
        if plan.sequence_parallel:
            warn("W0410", "sequence_parallel", f"sequence parallelism without tensor parallelism: {no_tp}",
                 "sequence parallelism splits norms and residuals over the tp ranks; add `axis tp = 2` (or more), "
                 "or remove the setting")
        if plan.pad_vocab:
            warn("W0411", "pad_vocab", f"pad_vocab without tensor parallelism: {no_tp}",
                 "the vocabulary is padded to a multiple of tp, and tp = 1 divides every vocabulary; remove it")
        if set(plan.tp_layers) != set(TP_LAYERS):
            warn("W0412", "tp_layers", f"tp_layers without tensor parallelism: {no_tp}",
                 "tp_layers says what a tp axis shards; add `axis tp = ...`, or remove the setting")
    elif plan.pad_vocab:
        vocab = int(spec.value(next(x for x in spec.model.layers if isinstance(x, S.Embedding)).vocab))
        if "vocab" not in plan.tp_layers:
            warn("W0411", "pad_vocab", "pad_vocab, but the vocabulary is not sharded (`vocab` is not in tp_layers)",
                 "padding applies to a vocabulary split over tp; remove it, or add `vocab` to tp_layers")
        elif vocab % tp == 0:
            warn("W0411", "pad_vocab", f"pad_vocab, but tp = {tp} divides the vocabulary ({vocab}): nothing is padded",
                 "padding is only needed when tp does not divide the vocabulary; remove it")
    if pp == 1:
        no_pp = "the mesh has no `pp` axis (or pp = 1)"
        if plan.schedule != PLAN_SETTINGS["schedule"].default:
            warn("W0612", "schedule", f"a pipeline schedule without pipeline parallelism: {no_pp}",
                 "the schedule orders the micro-batches of pipeline stages; add `axis pp = 2` (or more), or remove it")
        if plan.virtual_stages > 1 and (plan.span("virtual_stages") or plan.schedule not in choices.V_SHAPED):
            warn("W0613", "virtual_stages", f"virtual stages without pipeline parallelism: {no_pp}",
                 "virtual stages interleave the blocks of several stages on each pp rank; add `axis pp = ...`, or "
                 "remove it")
        if plan.layout:
            warn("W0614", "layout", f"a stage layout without pipeline parallelism: {no_pp}",
                 "a layout gives the blocks of each pipeline stage; add `axis pp = ...`, or remove it")
    if dp == 1 and plan.data_parallel != PLAN_SETTINGS["data_parallel"].default:
        warn("W0301", "data_parallel", f"data_parallel = {plan.data_parallel} shards over dp, and dp = 1",
             "ZeRO and FSDP shard the model state over the dp ranks; with one there is nothing to shard: add dp "
             "ranks, or remove the setting")
    if plan.fsdp_grad_sync != PLAN_SETTINGS["fsdp_grad_sync"].default:
        why = ("data_parallel is not fsdp or zero2" if choices.ZERO_STAGE[plan.data_parallel] < 2 else
               "dp = 1: nothing is sharded" if dp == 1 else
               "micro_batches = 1: every step reduce-scatters once" if plan.micro_batches == 1 else
               "with pp the pipeline schedule reduce-scatters once, after the last micro-batch" if pp > 1 else "")
        if why:
            warn("W0306", "fsdp_grad_sync", f"fsdp_grad_sync = {plan.fsdp_grad_sync} has no effect: {why}",
                 "it chooses when FSDP2 (fsdp, zero2 over dp > 1, no pp) reduce-scatters the gradients of a step of "
                 "several micro-batches; remove it, or use it with such a plan")
    if plan.recompute != "none" and not any(isinstance(x, S.Repeat) for x in spec.model.layers):
        warn("W0136", "recompute", "recompute, but the model has no `repeat` of blocks to recompute",
             "recomputation applies to each block of the model's `repeat`; write the blocks as `repeat n { ... }`")


# The layer classes whose saved activations `offload = activations(modules = ...)` names (runtime/offload.py tells
# them apart by their leaves' prefix: attn_ for attention and mla, mlp_ for mlp)
OFFLOAD_KINDS = {"attention": (S.Attention, S.MLA), "mlp": (S.MLP,)}


def _offload_effect(c: Checker, spec: S.Spec, at: dict) -> None:
    """`offload` written where it moves nothing: no share of the optimizer (fraction 0), or activations of modules
    no block of the model holds (W0330)."""
    plan = spec.plan
    if "offload" not in at:
        return
    if plan.offload == "optimizer" and plan.offload_fraction == 0:
        c.warn("W0330", "`offload = optimizer(fraction = 0)` keeps the whole optimizer on the device", at["offload"],
               label="has no effect", help="a fraction above 0 moves that share of the optimizer's state to the host; "
                                           "or write `offload = none`")
    if plan.offload == "activations":
        in_blocks = [x for r in spec.model.layers if isinstance(r, S.Repeat) for x in S.walk(r.body)]
        kinds = plan.offload_modules or tuple(OFFLOAD_KINDS)
        if not in_blocks:
            c.warn("W0330", "activation offload, but the model has no `repeat` of blocks", at["offload"],
                   label="has no effect", help="activations are offloaded from each block of the model's `repeat`; "
                                               "write the blocks as `repeat n { ... }`")
        elif plan.offload_modules and not any(isinstance(x, OFFLOAD_KINDS[k]) for x in in_blocks for k in kinds):
            c.warn("W0330", f"activation offload of {', '.join(kinds)}, and the model's blocks have none",
                   at["offload"], label="has no effect",
                   help="name modules the blocks hold (attention, mlp), or leave `modules` out for every one")


def windows_cover_the_sequence(c: Checker, model: S.Model, train: S.Train) -> None:
    """A sliding window at least as long as the training sequences masks nothing the causal mask keeps: the
    attention is full causal and the setting changes nothing (but the program's kernel, and `plan`'s FLOPs)."""
    seq = int(c.number(train.seq_len))
    for a in (x for x in S.walk(model.layers) if isinstance(x, S.Attention) and x.window is not None):
        w = int(c.number(a.window))
        if w >= seq:
            c.warn("W0207", f"a window of {w} tokens covers the whole {seq}-token sequence: this attention is full "
                   "causal", a.window_span or a.span, label="has no effect",
                   help=f"sliding windows matter for sequences longer than the window; remove `window`, or train "
                        f"with seq_len above {w}")


def bind_capacities(c: Checker, model: S.Model, train: S.Train) -> None:
    """Each `moe` layer's capacity (slots per expert per sequence), from the sequence length."""
    for m in (x for x in S.walk(model.layers) if isinstance(x, S.MoE)):
        seq, experts = int(c.number(train.seq_len)), int(c.number(m.experts))
        slots = c.values[m.capacity] = capacity(seq, experts, m.top_k, m.capacity_factor)
        choices = m.top_k * seq
        if m.capacity_factor != "none" and 10 * experts * slots < choices:  # W0718: less than a tenth kept
            c.warn("W0718", f"capacity_factor = {m.capacity_factor:g} keeps at most {experts * slots:,} of the "
                   f"{choices:,} choices of each sequence ({experts * slots / choices:.0%}), the rest dropped",
                   m.capacity_span or m.span, label=f"{experts} experts × {slots} slot{'s' if slots > 1 else ''} "
                   f"for top_k {m.top_k} × seq_len {seq}",
                   help="capacity_factor is a multiple of a balanced share (top_k · seq_len / experts slots per "
                        "expert): 1.0 keeps every choice of a balanced load, 1.25 leaves room for imbalance (GShard, "
                        "Switch), `none` drops nothing")


def resilience_checks(c: Checker, spec: S.Spec) -> None:
    """The resilience section's settings where they cannot act: an action on stragglers nobody detects, a window no
    run reaches, a node excluded from a one-node mesh, a re-plan or restart with no checkpoint to resume from."""
    r, train = spec.resilience, spec.train
    at = dict(r.spans)
    if not r.written:
        return
    if not r.detect and "on_straggler" in at:
        c.warn("W0150", f"on_straggler = {r.on_straggler} with `stragglers = off`: no straggler is ever named",
               at["on_straggler"], label="has no effect",
               help="the action follows a named straggler; write `stragglers = detect(...)`, or remove it")
    if r.detect and "stragglers" in at and r.window > train.steps:
        c.warn("W0152", f"a straggler window of {r.window} steps is longer than the run ({train.steps} steps): no "
               "rank is ever scored", at["stragglers"], label="has no effect",
               help="ranks are scored every `window` steps; use a shorter window, or `stragglers = off`")
    if r.on_straggler == "report" or not r.detect:
        return
    where = at["on_straggler"]
    if spec.cluster.nodes == 1:
        c.error("E0151", f"on_straggler = {r.on_straggler} on a one-node mesh: excluding the straggler's node leaves "
                "none to run on", where, label="the only node",
                help="excluding a node needs another to run on: write `on_straggler = report`, or a mesh of several "
                     "nodes")
    elif not train.checkpoint_dir:
        if r.on_straggler == "replan":
            c.error("E0152", "on_straggler = replan without `checkpoint_dir`: there is no checkpoint to reshard onto "
                    "the new plan", where, label="nothing to resume from",
                    help='add `checkpoint_dir = "ckpt"` to the train section, or write `on_straggler = report`')
        else:
            c.warn("W0151", "on_straggler = restart without `checkpoint_dir`: the restart without the node begins "
                   "again at step 0", where, label="nothing to resume from",
                   help='add `checkpoint_dir = "ckpt"` so that the restart resumes from the last checkpoint')
