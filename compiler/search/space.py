"""The space `scalec search` walks: what is fixed, what is free, and the candidate plans (axis sizes, families,
variants) it enumerates. compiler/search/prune.py walks it; nothing here costs or checks a plan.

What is fixed and what is free. The model and the `train` section (global batch, sequence length, precision) are
fixed, but for FP8 (a bf16 file on a device with FP8 matmuls is searched with `precision = fp8(...)` too:
compiler/search/precision.py); so is the cluster: the mesh block's `nodes`, `devices_per_node`, `device` and its figures (`Spec.cluster`, or
the one `search(spec, cluster=...)` is given). Everything else
is free: the axis sizes dp, tp, pp, cp (with its attention variant, `context_parallel`) and (for a model with
`moe` layers) ep, the pipeline schedule and its virtual
stages, the micro-batch size and count, sequence parallelism, recomputation and the dp sharding (ddp, zero1, zero2,
fsdp; for zero2 and fsdp with several micro-batches and no pp, also when FSDP2 reduce-scatters: `fsdp_grad_sync`).
The file's own axes and plan settings are NOT constraints: the file is read by `check_path(cluster_only=True)`, so
its mesh may give only the cluster and its plan section may be absent or refused by the rules (only what no plan can
change is an error); `--fix KEY=VALUE` says what is fixed (`fixed` here).
`tp_layers` and `pad_vocab` are the file's, except that a tp degree the vocabulary refuses only for want of padding
(E0403 alone) is tried with `pad_vocab = true`.

Candidates. The mesh is laid out pp, dp, cp, ep, tp, outermost first (Megatron's order: tp on neighbouring devices
of a node, cp next to it, pp outermost); an axis of size 1 is left out, except dp. cp's families carry their
attention variant (all_gather, ring, all_to_all: each its own graphs, so its own pass structure; its cp sizes share it). A *family* is a mesh shape with its sequence
parallelism, micro-batch size and schedule (with its virtual stages); its *variants* are its dp shardings and
recomputations. Every candidate is checked by the rules (compiler/rules/, through `Candidates.requires`: the one
copy of every divisibility and legality rule; nothing here restates one), costed by the memory model
(`Estimate.peak_bytes` against the device, as `compile`'s E0501) and timed by compiler/cost/step_time.py.
"""
from __future__ import annotations

import copy
from dataclasses import replace

from compiler import plan as P
from compiler import spec as S
from runtime import choices  # torch-free

# Keys `--fix` accepts, with their type; the values a choice takes come from the checker's own tables.
FIX_KEYS = ("dp", "tp", "pp", "ep", "cp", "virtual_stages", "micro_batches", "micro_batch_size", "schedule",
            "sequence_parallel", "recompute", "data_parallel", "fsdp_grad_sync", "context_parallel", "dispatch",
            "offload", "precision")
OFFLOADS = ("none", "optimizer", "params", "activations")  # --fix offload=...: which offload the search may try
OFFLOAD_FRACTIONS = (0.25, 0.5, 0.75, 1.0)  # optimizer offload's fractions, least first (the first that fits wins)
PRECISIONS = ("bf16", "fp8")  # --fix precision=...: bf16 alone, or fp8 (the file's, or search/precision.py's)
DISPATCH = ("padded", "grouped")  # a dropless `moe`'s dispatch: the search tries both unless fixed (prune.search)
SCHEDULES = ("1f1b", "interleaved-1f1b", "zero-bubble", "gpipe", "dualpipev")
DP_MODES = choices.DATA_PARALLEL
GRAD_SYNCS = ("step", "micro_batch")  # fsdp_grad_sync: when FSDP2 (zero2, fsdp) reduce-scatters, without pp
RECOMPUTE = choices.RECOMPUTE
CONTEXT_PARALLEL = choices.CONTEXT_PARALLEL  # the cp attention variants, each a family of its own (its own graphs)
# The mesh's axes, outermost first. cp sits inside dp and outside ep and tp: torchtitan's dp_shard × cp × tp and
# Megatron-Core's tp-cp-ep-dp-pp (innermost first), so tp keeps the neighbouring devices and cp takes the next
# ones (a cp group stays inside a node while cp × ep × tp divides it), its KV traffic beside tp's rather than dp's.
ORDER = ("pp", "dp", "cp", "ep", "tp")


class FixError(ValueError):
    """A `--fix` that cannot be read: the CLI prints it as a usage error."""


def parse_fixes(items) -> dict:
    """`["tp=8", "schedule=1f1b", ...]` -> {"tp": 8, "schedule": "1f1b"}; FixError on an unknown key or value, and on
    one key fixed twice to different values (`--fix tp=2 --fix tp=4`: the last would win without a word)."""
    out: dict = {}
    seen: dict = {}  # key -> (the first --fix that set it, its value)
    for item in items or ():
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip().strip('"')
        if not eq or key not in FIX_KEYS:
            raise FixError(f"--fix {item!r}: expected KEY=VALUE with KEY one of {', '.join(FIX_KEYS)}")
        if key in ("dp", "tp", "pp", "ep", "cp", "virtual_stages", "micro_batches", "micro_batch_size"):
            if not value.isdigit() or int(value) < 1:
                raise FixError(f"--fix {item!r}: {key} takes a positive integer")
            out[key] = int(value)
        elif key == "sequence_parallel":
            if value not in ("true", "false"):
                raise FixError(f"--fix {item!r}: sequence_parallel takes true or false")
            out[key] = value == "true"
        else:
            choices = {"schedule": SCHEDULES, "recompute": RECOMPUTE, "data_parallel": DP_MODES,
                       "fsdp_grad_sync": GRAD_SYNCS, "context_parallel": CONTEXT_PARALLEL, "dispatch": DISPATCH,
                       "offload": OFFLOADS, "precision": PRECISIONS}[key]
            if value not in choices:
                raise FixError(f"--fix {item!r}: {key} takes one of {', '.join(choices)}")
            out[key] = value
        if key in seen and seen[key][1] != out[key]:  # two answers to one question: neither wins silently
            raise FixError(f"--fix {item!r}: {key} is already fixed by --fix {seen[key][0]!r}; fix each key once")
        seen.setdefault(key, (item, out[key]))
    return out


# -- what identifies a plan's family, group and variant -------------------------------------------------------


def divisors_of(n: int) -> list:
    return [d for d in range(1, n + 1) if n % d == 0]


def group_of(plan) -> tuple:
    """What a family is without its micro-batch size."""
    # without pp a step of one micro-batch holds no accumulated gradient at its peak: a group of its own
    return (plan.axes, plan.schedule, plan.virtual_stages, plan.sequence_parallel, plan.pad_vocab,
            plan.size("pp") == 1 and plan.micro_batches == 1, plan.context_parallel)


def variant_of(plan) -> tuple:
    """(data_parallel, fsdp_grad_sync) of a plan, as Space.modes names its dp variants."""
    return (plan.data_parallel, plan.fsdp_grad_sync)


def family_of(plan) -> tuple:
    return (plan.axes, plan.micro_batches, plan.schedule, plan.virtual_stages, plan.sequence_parallel,
            plan.context_parallel)


def placement_key(plan) -> tuple:
    """A variant, whatever its placement (pruning rule 9 varies it last): its family, dp variant and
    recomputation."""
    return family_of(plan) + (variant_of(plan), plan.recompute)


def _axes(sizes: dict) -> tuple:
    return tuple((a, sizes[a]) for a in ORDER if sizes.get(a, 1) > 1 or a == "dp")


class Group(tuple):
    """One group of families (`Space.groups`): iterates as (a plan maker, the micro-batch counts); `sizes` (the mesh
    shape), `axes`, `schedule`, `virtual_stages`, `sequence_parallel` and `context_parallel` say which group it is
    without making a plan (the search refuses most groups by what these alone decide)."""

    def __new__(cls, make, ms, sizes: dict, axes: tuple, schedule: str, virtual_stages: int,
                sequence_parallel: bool, context_parallel: str):
        group = super().__new__(cls, (make, ms))
        group.sizes, group.axes, group.schedule, group.virtual_stages = sizes, axes, schedule, virtual_stages
        group.sequence_parallel, group.context_parallel = sequence_parallel, context_parallel
        return group


class Space:
    """The candidates of one file under `--fix`: the mesh shapes of its world size, each shape's families (grouped
    by what the micro-batch size does not change) and each family's dp variants. Plans come out undecided, from the
    file's own (`base`) with every free setting at its least: recompute none and ddp, unless fixed."""

    def __init__(self, spec: S.Spec, fixed: dict):
        self.fixed = dict(fixed)
        # a written order(...) names the file's axes, which the candidates replace: only `auto` applies to them all
        self.base = replace(spec.plan, layout=(), stages=(), tp=(), ep=(), spans=(),
                            placement="auto" if spec.plan.placement == "auto" else None,
                            offload="none", offload_fraction=1.0, offload_modules=())  # offload: `offloads`
        self.world = spec.cluster.world_size
        self.moe = any(isinstance(x, S.MoE) for x in S.walk(spec.model.layers))
        reps = [x for x in spec.model.layers if isinstance(x, S.Repeat)]
        self.blocks = int(spec.value(reps[0].count)) if len(reps) == 1 else 1

    def shapes(self):
        """Every (pp, dp, cp, ep, tp) of the world size, respecting `--fix`. Every cp size is enumerated; which
        combinations are built is the rules' to say (compiler/rules/context_parallel.py), never this loop's."""
        f = self.fixed
        eps = divisors_of(self.world) if self.moe else [1]
        for tp in divisors_of(self.world):
            for pp in divisors_of(self.world // tp):
                for cp in divisors_of(self.world // (tp * pp)):
                    for ep in eps:
                        if (self.world // (tp * pp * cp)) % ep:
                            continue
                        dp = self.world // (tp * pp * cp * ep)
                        sizes = {"pp": pp, "dp": dp, "cp": cp, "ep": ep, "tp": tp}
                        if any(a in f and f[a] != n for a, n in sizes.items()):
                            continue
                        yield sizes

    def groups(self, sizes: dict):
        """The families of one mesh shape, grouped by what the micro-batch size does not change: for each schedule
        (with its virtual stages) and sequence parallelism, (a plan maker, the micro-batch counts)."""
        f = self.fixed
        pp, dp, ep, tp = sizes["pp"], sizes["dp"], sizes["ep"], sizes["tp"]
        per_rank = self.base.global_batch // (dp * ep) if self.base.global_batch % (dp * ep) == 0 else 0
        sps = [f["sequence_parallel"]] if "sequence_parallel" in f else ([True, False] if tp > 1 else [False])
        ms = []
        for b in (divisors_of(per_rank) if per_rank else [1]):
            m = per_rank // b if per_rank else 1
            if f.get("micro_batch_size", b) == b and f.get("micro_batches", m) == m:
                ms.append(m)
        if pp == 1:
            scheds = [("1f1b", 1)]
        else:
            scheds = [("1f1b", 1), ("zero-bubble", 1)]
            scheds += [("interleaved-1f1b", v) for v in range(2, self.blocks // pp + 1)]
            scheds += [("gpipe", 1)]
            # DualPipeV: two stages per rank in a V, at least 2·pp micro-batches (compiler/rules/pipeline_split.py
            # refuses the rest, and too few blocks for 2·pp stages)
            scheds += [("dualpipev", 2)]
        axes = _axes(sizes)
        if sizes.get("cp", 1) > 1:  # each attention variant is its own graphs: a group of its own
            cpvs = [f["context_parallel"]] if "context_parallel" in f else list(CONTEXT_PARALLEL)
        else:
            cpvs = ["all_gather"]  # without cp the setting is moot (W0310): the default, one group
        for (sched, v), cpv in ((x, c) for x in scheds for c in cpvs):
            if pp > 1 and "schedule" in f and f["schedule"] != sched:
                continue
            if f.get("virtual_stages", v) != v:
                continue
            for sp in sps:
                def make(m, sched=sched, v=v, sp=sp, cpv=cpv):
                    return P.evolve(self.base, axes=axes, micro_batches=m, schedule=sched, virtual_stages=v,
                                    sequence_parallel=sp, context_parallel=cpv,
                                    recompute=f.get("recompute", "none"),
                                    data_parallel=f.get("data_parallel", "ddp"),
                                    fsdp_grad_sync=f.get("fsdp_grad_sync", "step"))
                if ms:
                    yield Group(make, ms, sizes, axes, sched, v, sp, cpv)

    def families(self, sizes: dict) -> list:
        """Every family of one mesh shape (plans with recompute none and ddp, or the fixed ones)."""
        return [make(m) for make, ms in self.groups(sizes) for m in ms]

    def modes(self, plan) -> list:
        """The dp variants of a family, least sharded first (the last is the most frugal, rule 7): (data_parallel,
        fsdp_grad_sync), each dp sharding (only ddp with dp = 1), FSDP2's (zero2, fsdp) with its gradients
        reduce-scattered once per step and, where that is a choice (several micro-batches, no pp), every
        micro-batch (sharded between micro-batches: less memory, m× the reduce-scatters), unless fixed."""
        return self._modes(plan.size("dp"), plan.micro_batches, plan.size("pp"))

    def _modes(self, dp: int, m: int, pp: int) -> list:
        """`modes` of a family with dp, m micro-batches and pp: all it reads of the plan (`size` counts with it
        without building a plan per family)."""
        f = self.fixed
        kinds = [f["data_parallel"]] if "data_parallel" in f else (list(DP_MODES) if dp > 1 else ["ddp"])
        out = []
        for kind in kinds:
            syncs = [f.get("fsdp_grad_sync", "step")]
            if "fsdp_grad_sync" not in f and choices.zero_stage(kind, dp) >= 2 and m > 1 and pp == 1:
                syncs = list(GRAD_SYNCS)
            out += [(kind, s) for s in syncs]
        return out

    def offloads(self, data_parallel: str, dp: int) -> list:
        """The offloads a variant whose dp sharding is `data_parallel` may take when it fits no other way (pruning
        rule 10), least first, as (offload, fraction): optimizer offload at each of OFFLOAD_FRACTIONS, FSDP2's
        parameter offload (fsdp only), every block module's activations; only the fixed kind under `--fix
        offload=...`, none under `--fix offload=none`."""
        kind = self.fixed.get("offload")
        out = [("optimizer", f) for f in OFFLOAD_FRACTIONS]
        if choices.zero_stage(data_parallel, dp) == 3:
            out.append(("params", 1.0))
        out.append(("activations", 1.0))
        return [o for o in out if kind is None or o[0] == kind]

    def recomputes(self) -> list:
        """The recomputation modes a variant may take, least first (pruning rule 5 escalates in this order)."""
        return [self.fixed["recompute"]] if "recompute" in self.fixed else list(RECOMPUTE)

    def size(self, groups) -> int:
        """How many candidates `groups` (of `groups()`) describe: families × dp variants × recomputations. Counted
        from each group's mesh shape (a family's dp variants read only dp, pp and its micro-batches): building each
        of the tens of thousands of families' plans just to count them took a second of the 175B search; one plan
        per group gave the shape, and the group's own `sizes` now."""
        total, known = 0, {}
        for g in groups:
            total += self._variants(g.sizes["dp"], g.sizes["pp"], g[1], known)
        return total * len(self.recomputes())

    def size_of(self, sizes: dict, groups) -> int:
        """`size` of groups of the one mesh shape `sizes`."""
        known: dict = {}
        return sum(self._variants(sizes["dp"], sizes["pp"], ms, known) for _, ms in groups) * len(self.recomputes())

    def _variants(self, dp: int, pp: int, ms, known: dict) -> int:
        """The dp variants of a group's families (micro-batch counts `ms`, distinct): `_modes` reads of m only
        whether it is above 1, so every count but 1 has as many (a search counts a million families)."""
        def count(many: bool) -> int:
            key = (dp, pp, many)
            if key not in known:
                known[key] = len(self._modes(dp, 2 if many else 1, pp))
            return known[key]
        one = 1 in ms
        return (len(ms) - one) * count(True) + (count(False) if one else 0)

    def families_with(self, fixed: dict) -> int:
        """How many families the enumeration gives with only `fixed` fixed (why `--fix` leaves none)."""
        other = copy.copy(self)
        other.fixed = dict(fixed)
        return sum(len(ms) for sizes in other.shapes() for _, ms in other.groups(sizes))
