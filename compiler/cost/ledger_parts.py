"""CostModel's ledger of one plan on one rank (compiler/cost/ledger.py's types), entry by entry: the collectives the
passes inserted (each site's formula at the plan's sizes, again in backward where recomputation re-runs it), tp's
partial gradients, the pipeline's sends, data parallelism's traffic, FP8's gathers and offload's host copies. A mixin
of compiler/cost/__init__.py's CostModel, which gives it `spec`, `formulas` and `precision`; `_step_entries` is the
ledger's once-per-step entries alone, what a search's time bound reads."""
from __future__ import annotations

import functools

import sympy

from compiler import spec as S
from compiler.cost import fp8 as FP8
from compiler.cost import memory as MEM
from compiler.cost import rebalance as REB
from compiler.cost.formulas import AXES, recompute_mode, reruns
from compiler.cost.ledger import Collective, Ledger, site_width
from compiler.symbols import MICRO_BATCH, size

BYTES = {"fp32": 4, "bf16": 2}
"""Bytes of one element of a compute precision."""


def _partial_reason(spec, plan, qk: bool) -> str:
    """Why tp leaves gradients partial: sequence parallelism's chunks (norms, row biases), per-head q/k norms'
    heads (each rank normalises only its own heads with the shared scale; `qk`: the model has them), or both."""
    sp = "sequence parallelism: each rank's norm and row-bias gradients cover only its sequence chunk"
    heads = "each rank's q/k norm gradients cover only its heads"
    if plan.sequence_parallel:
        return sp + ("; " + heads if qk else "")
    return "tensor parallelism: " + heads


class LedgerParts:
    """The ledger of a plan on a rank, for CostModel (`_ledger`, `_step_entries`)."""

    @functools.cached_property
    def _qk_norms(self) -> bool:
        """Whether an attention layer of the model normalises its queries and keys per head."""
        return any(isinstance(x, S.Attention) and x.qk_norm != "none" for x in S.walk(self.spec.model.layers))

    def _ledger(self, plan, env, pp_rank, nb, on_rank, params_rank, experts_rank) -> Ledger:
        """The collectives of one optimizer step on one rank: those the passes inserted, the pipeline's sends, then
        data parallelism's, FP8's and offload's."""
        from compiler.cost import activations as A
        widths = A.widths(self.precision)
        act_bytes, res_bytes = widths["act"], widths["res"]
        b_sym = self._micro_batch_sym(plan)
        entries = []
        for site, f in self.formulas.sites:
            times, per_step = self._times_of(plan, site.where, nb, on_rank)
            if not times:
                continue
            dtype = site_width(site, act_bytes, res_bytes, self.spec.train.fp8 is not None)
            if dtype is None:
                continue
            worst = None if site.worst is None else int(f(env) * dtype * times * site.worst.xreplace(
                {size(a): n for a, n in zip(AXES, env)}))
            entries.append(Collective(op=site.op, axis=site.axis, dtype_bytes=dtype, span=site.span,
                                      reason=site.reason, direction=site.direction, times=times,
                                      bytes=int(f(env) * dtype * times), worst_bytes=worst,
                                      element_formula=lambda e=site.elements: e.xreplace({MICRO_BATCH: b_sym}),
                                      per_step_formula=per_step))
            again = reruns(plan, site)
            if again:
                why = ("full recomputation re-runs the block's forward" if recompute_mode(plan) == "full" else
                       "selective recomputation gathers the sequence-parallel input again rather than keep it whole")
                entries.append(Collective(op=site.op, axis=site.axis, dtype_bytes=dtype, span=site.span,
                                          reason=f"{site.reason}; again in backward: {why}", direction="backward",
                                          times=times * again, bytes=int(f(env) * dtype * times * again),
                                          element_formula=lambda e=site.elements: e.xreplace({MICRO_BATCH: b_sym}),
                                          per_step_formula=per_step))
        entries += self._partial(plan, env, nb, on_rank)
        if nb is not None:
            self._transfers(plan, env, pp_rank, entries, b_sym)
        self._data_parallel(plan, env, nb, params_rank, experts_rank, entries, on_rank)
        entries += self._offload_copies(plan, env, nb, params_rank, experts_rank, b_sym)
        entries += REB.ledger_rows(self.spec, plan)  # expert re-placement: replicas' gradients, moves, loads
        return Ledger(tuple(entries))

    def _offload_copies(self, plan, env, nb, params_rank, experts_rank, b_sym) -> list:
        """Offload's host<->device copies (compiler/cost/offload.py), or none."""
        if plan.offload == "none":
            return []
        from compiler.cost import offload
        return offload.ledger_copies(self, plan, env, nb, params_rank, experts_rank, b_sym)

    def _step_entries(self, plan, env, nb, on_rank, params_rank, experts_rank) -> tuple:
        """The ledger's once-per-step entries (`_ledger`'s of direction "step"), in its order, without the rest."""
        entries = self._partial(plan, env, nb, on_rank)
        self._data_parallel(plan, env, nb, params_rank, experts_rank, entries, on_rank)
        if plan.offload != "none":  # the micro-batch's formula only where offload's copies read it
            entries += self._offload_copies(plan, env, nb, params_rank, experts_rank, self._micro_batch_sym(plan))
        entries += REB.ledger_rows(self.spec, plan)
        return tuple(c for c in entries if c.direction == "step")

    def _micro_batch_sym(self, plan):
        """A rank's micro-batch size as a formula of the batch axes (the ledger's element formulas read it)."""
        axes = dict(plan.axes)
        ranks = sympy.Mul(*[size(a) for a in ("dp", "ep") if a in axes])
        return self.spec.train.global_batch / (ranks * plan.micro_batches)

    def _times_of(self, plan, where, nb, on_rank) -> tuple:
        """(times per step, a formula of it or None) of what sits at `where` (a block of a repeat, or a top-level
        segment) on the rank: `nb` its blocks per repeat under pp (None: every block), `on_rank` the segments."""
        m = plan.micro_batches
        kind, name = where
        if kind == "block":
            if nb is not None:
                return m * nb[name], None
            count_sym, count = self.formulas.counts[name]
            return m * count, (lambda: m * count_sym)
        return (m, None) if on_rank.get(name, False) else (0, None)

    def _partial(self, plan, env, nb, on_rank) -> list:
        """tp's partial gradients' all-reduce, once per step (a list of it, or empty)."""
        spec = self.spec
        dp = env[0]
        m = plan.micro_batches
        entries: list = []
        partial_n, parts = 0, []
        for where, f in self.formulas.partial:
            times, _ = self._times_of(plan, where, nb, on_rank)
            if times:
                k = times // m
                partial_n += k * f(env)
                parts.append((f.expr, self.formulas.counts[where[1]].expr if where[0] == "block" and nb is None
                              else k))
        if partial_n:
            fsdp = plan.shards_grads
            if fsdp:
                partial_n = partial_n / dp  # FSDP holds 1/dp of each gradient: only that shard is summed over tp
            def partial_formula(parts=tuple(parts), fsdp=fsdp):
                total = sum((e * k for e, k in parts), sympy.Integer(0))
                return total / size("dp") if fsdp else total
            # FSDP2 casts its reduced shards back to the fp32 parameters
            g = 4 if fsdp else MEM.grad_bytes(spec.train.precision, plan.grad_reduce)
            entries.append(Collective(op="all_reduce", axis="tp", dtype_bytes=g, span=plan.span("axis tp"),
                                      reason=_partial_reason(spec, plan, self._qk_norms), direction="step", times=1,
                                      bytes=int(partial_n * g), element_formula=partial_formula))
        return entries

    def _transfers(self, plan, env, pp_rank, entries, b_sym) -> None:
        """Stage boundaries of the stages a rank holds (pp rank r holds stages r, r + pp, ...: several under
        interleaving; r and 2·pp-1-r under dualpipev): the residual stream of each micro-batch goes forward, its gradient backward (b·s·h
        elements; sequence-sharded under SP), carried by torch.distributed.pipelining's send/recv, which the
        runtime counts. The boundary sends the residual stream in its dtype: bf16 under bf16, fp32 with
        fp32_residual (runtime/precision.py)."""
        n = plan.size("pp") * plan.virtual_stages
        m = plan.micro_batches
        elements = self.formulas.send(env)
        from compiler.cost import activations as A
        width = A.widths(self.precision)["res"]
        span = plan.span("axis pp")
        expr = self.formulas.send_expr
        lay = plan.stage_layout
        for stage in lay.stages_of(pp_rank):
            # a neighbour on the same rank (dualpipev's two stages at the V's bottom) is no transfer
            after = stage < n - 1 and lay.rank_of(stage + 1) != pp_rank
            before = stage > 0 and lay.rank_of(stage - 1) != pp_rank
            for direction, what, cond in (("forward", "activations to the next stage", after),
                                          ("forward", "activations from the previous stage", before),
                                          ("backward", "gradients to the previous stage", before),
                                          ("backward", "gradients from the next stage", after)):
                if cond:
                    entries.append(Collective(op="send_recv", axis="pp", dtype_bytes=width, span=span,
                                              reason=f"pipeline stage {stage}: {what}, per micro-batch",
                                              direction=direction, times=m, bytes=int(elements * width * m),
                                              element_formula=lambda: expr.xreplace({MICRO_BATCH: b_sym})))

    def _fp8_gathered(self, plan, nb):
        """(elements, their formula, weights) of the weights FSDP2 gathers in FP8 on one rank (compiler/cost/fp8.py),
        `nb`: the blocks held per repeat under pp (None: every block); None where nothing is gathered in FP8."""
        fp8 = self.spec.train.fp8
        if not FP8.gathers_fp8(fp8, plan):
            return None
        per = FP8.linears(self.traced, fp8)
        held = ({name: (c.n, c.expr) for name, c in self.formulas.counts.items()} if nb is None
                else {name: (nb[name], nb[name]) for name in per})
        n8 = sum(held[name][0] * sum(x.n * x.k for x in xs) for name, xs in per.items())
        if not n8:
            return None
        expr = sympy.expand(sum(held[name][1] * sum(x.n * x.k for x in xs) for name, xs in per.items()))
        return n8, (lambda: expr), sum(held[name][0] * len(xs) for name, xs in per.items())

    def _data_parallel(self, plan, env, nb, params_rank, experts_rank, entries, on_rank=None) -> None:
        spec = self.spec
        dp, ep, pp = plan.size("dp"), plan.size("ep"), plan.size("pp")
        pa, ex = self.formulas.params, self.formulas.experts
        if nb is None:
            params = lambda: pa.whole.expr  # noqa: E731
            experts = lambda: ex.whole.expr  # noqa: E731
        else:
            held = [nb[name] for name, _, _ in self.formulas.edges]
            # the last stage's layers where the rank holds them (dualpipev's V puts them on rank 0, beside the first)
            last = pa.epilogue.expr if (on_rank or {}).get("epilogue") else 0
            params = lambda: sympy.expand(pa.prologue.expr + sum(k * f.expr for k, f in zip(held, pa.block)) + last)  # noqa: E731
            experts = lambda: sympy.expand(ex.prologue.expr + sum(k * f.expr for k, f in zip(held, ex.block)))  # noqa: E731
        span = plan.span("axis dp")
        # Pipeline stages are not wrapped in DDP: one coalesced all-reduce follows the pipeline step.
        how = "one coalesced all-reduce after the pipeline step" if pp > 1 else "DDP, bucketed"
        # Gradients move in grad_reduce's dtype (fp32 main gradients unless bf16), weights in the compute precision
        # (zero1's broadcasts, FSDP2's gathers under its MixedPrecisionPolicy): runtime/precision.py.
        g, w = MEM.grad_bytes(spec.train.precision, plan.grad_reduce), BYTES[spec.train.precision]

        def add(op, axis, n_elements, times, span, reason, formula, width=None):
            width = width or g
            entries.append(Collective(op=op, axis=axis, dtype_bytes=width, span=span, reason=reason, times=times,
                                      bytes=int(n_elements * width * times), measured=False,
                                      element_formula=formula))
        if plan.shards_grads:
            # FSDP2 (runtime.train._wrap_data_parallel); with ep, the dense weights shard over dp × ep and the
            # experts over dp alone (_shard_experts): one unit each, gathered and reduced over its own ranks
            # under cp the whole model shards over dp × cp (runtime.mesh's dense_mesh: torchtitan's folding)
            cp = plan.size("cp")  # under cp and ep: the dense weights over dp × cp × ep, the experts over dp × cp
            parts = ((("dp×cp×ep" if cp > 1 else "dp×ep", plan.span("axis ep"), "the dense ", "the dense ",
                       params_rank - experts_rank, lambda: sympy.expand(params() - experts())),
                      ("dp×cp" if cp > 1 else "dp", span, "the experts' ", "the experts' ", experts_rank, experts))
                     if ep > 1 else
                     (("dp×cp" if plan.size("cp") > 1 else "dp", span, "each block's ", "the ", params_rank,
                       params),))
            # zero2: once per micro-batch without pp (FSDP2 reshards after each backward), once per step under
            # pp (torch's pipelining keeps units gathered until the last backward); fsdp: forward and backward
            gathers = (plan.micro_batches * 2 if plan.shards_params
                       else 1 if pp > 1 else plan.micro_batches)
            each = plan.syncs_each_micro_batch
            fp8 = self._fp8_gathered(plan, nb)  # precision = fp8: the chosen weights gathered in FP8
            for axis, at, whose, whose_g, n, formula in parts:
                gathered, gathered_formula = n, formula
                if fp8 is not None and whose != "the experts' ":
                    n8, f8, count = fp8
                    gathered = n - n8
                    gathered_formula = lambda f=formula, f8=f8: sympy.expand(f() - f8())  # noqa: E731
                    add("all_gather", axis, n8, gathers, plan.span("precision"),
                        "FSDP, precision = fp8: gather the FP8 linears' weights in float8 (1 byte each)", f8,
                        width=FP8.FP8_BYTES)
                    add("all_reduce", axis, count, gathers, plan.span("precision"),
                        "FSDP, precision = fp8: each FP8 weight's amax before its cast, one fp32 per weight",
                        lambda c=count: sympy.Integer(c), width=4)
                add("all_gather", axis, gathered, gathers, at,
                    f"FSDP: gather {whose}weights for forward and again for backward, every micro-batch"
                    if plan.shards_params else
                    f"ZeRO-2 (FSDP2, kept gathered to backward): gather {whose}weights once per micro-batch",
                    gathered_formula, width=w)
                # once per step (the last micro-batch's backward), or every micro-batch (fsdp_grad_sync)
                add("reduce_scatter", axis, n, plan.micro_batches if each else 1,
                    (plan.span("fsdp_grad_sync") or at) if each else at,
                    f"FSDP: reduce and shard each micro-batch's {whose_g.removeprefix('the ')}gradients "
                    "(fsdp_grad_sync = micro_batch)"
                    if each else f"FSDP: reduce and shard {whose_g}gradients", formula)
            return
        if ep > 1:
            # under cp too, the batch group is dp × cp × ep and the experts' replicas dp × cp (runtime.mesh's
            # batch_group and expert_group; the rules keep zero1, zero2 and fsdp out of it)
            cp = plan.size("cp")
            add("all_reduce", "dp×cp×ep" if cp > 1 else "dp×ep", params_rank - experts_rank, 1, plan.span("axis ep"),
                f"average the dense gradients over every batch shard, dp × {'cp × ' if cp > 1 else ''}ep ({how})",
                lambda: sympy.expand(params() - experts()))
            if dp > 1 or cp > 1:
                who = "dp×cp" if dp > 1 and cp > 1 else "cp" if cp > 1 else "dp"
                add("all_reduce", who, experts_rank, 1, span or plan.span("axis cp"),
                    f"sum the expert gradients over the {who.replace('×', ' × ')} ranks holding the same experts",
                    experts)
        elif plan.size("cp") > 1:
            # context parallelism shards no weight: each cp rank's gradients cover its tokens of every sequence, and
            # DDP averages them over the batch group, dp × cp (runtime.mesh; the rules keep ep and zero out of it)
            axis = "dp×cp" if dp > 1 else "cp"
            add("all_reduce", axis, params_rank, 1, span or plan.span("axis cp"),
                f"average the gradients over every token shard, {'dp × cp' if dp > 1 else 'cp'} ({how})", params)
        elif dp > 1:
            # measured on gloo by counting torch.distributed's calls (ZeroRedundancyOptimizer and FSDP2 call them)
            add("all_reduce", "dp", params_rank, 1, span, f"average the gradients of the dp replicas ({how})",
                params)
        if plan.zero_stage == 1:
            # with ep too, over dp alone (runtime.train._zero1_group): the dense state is replicated over ep; under
            # cp over dp × cp, the batch group
            add("broadcast", "dp×cp" if plan.size("cp") > 1 else "dp", params_rank, 1, span, "ZeRO-1: each rank broadcasts the parameters it "
                "updated (one bucket per rank)", params, width=w)


def expected_nodes(experts: int, top_k: int, groups: int, topk_groups: int, nodes: int) -> sympy.Rational:
    """The expected number of distinct nodes a token's `top_k` choices land on (the rows the node dispatch sends
    across nodes per token: runtime/moe_nodes.py), exactly, as a fraction. The experts are spread evenly over
    `nodes` in order (node d holds experts [d·E/nodes, (d+1)·E/nodes): compiler/passes/expert_parallel.py's
    placement) and cut into `groups` groups of consecutive experts; a token chooses among the experts of its
    `topk_groups` best groups (runtime.moe._choose; one group: all experts). Balanced routing: every set of
    `topk_groups` groups equally likely, then every set of `top_k` of their experts. A node is visited unless every
    choice misses it: P(d) = 1 - C(M - a_d, K) / C(M, K), M the chosen groups' experts, a_d how many of them d holds;
    a_d depends on which of the groups overlapping d are chosen, weighted hypergeometrically. DeepSeek-V3 (256
    experts, 8 groups, top 8 within the best 4, 8 nodes of one group each): 4·(1 - C(96, 8)/C(128, 8)) ≈ 3.64 nodes
    where the direct dispatch sends 8 rows (technical report §3.2.2: "at most 4 nodes")."""
    from fractions import Fraction
    from itertools import combinations
    from math import comb
    per_group, per_node = experts // groups, experts // nodes
    pool = topk_groups * per_group
    total = Fraction(0)
    for d in range(nodes):
        lo, hi = d * per_node, (d + 1) * per_node
        overlap = [max(0, min(hi, (j + 1) * per_group) - max(lo, j * per_group)) for j in range(groups)]
        touched = [o for o in overlap if o]
        others = groups - len(touched)
        if len(set(touched)) == 1:  # every group it touches holds as many of its experts: count them, not sets
            chosen = ((i, touched[0] * i, comb(len(touched), i)) for i in range(len(touched) + 1))
        else:
            chosen = ((len(s), sum(s), 1) for i in range(len(touched) + 1) for s in combinations(touched, i))
        for i, held, ways in chosen:
            if i > topk_groups or topk_groups - i > others:
                continue
            weight = Fraction(ways * comb(others, topk_groups - i), comb(groups, topk_groups))
            total += weight * (1 - Fraction(comb(pool - held, top_k), comb(pool, top_k)))
    return sympy.Rational(total.numerator, total.denominator)
