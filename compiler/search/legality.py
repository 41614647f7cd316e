"""The rules as a search asks them (compiler/search/prune.py, rule 1): a candidate with its vocabulary padded where
that alone is what a rule wants, and the refusals that hold for every family sharing what the refusing rule reads
remembered under those settings (rules.per_shape). A mixin of Search, which sets `cands` and `base`."""
from __future__ import annotations

from compiler import plan as P
from compiler.rules import per_shape
from compiler.rules.tensor_parallel import VOCAB


class Legality:
    """What the rules say of the search's candidates (see the module's docstring)."""

    def _legal(self, plan):
        # the refusals' messages may name another plan of the same settings (rules.REUSABLE): the search groups
        # them by their brief (Tally) and prints none
        problems = self.cands.requires(plan, reuse=True)
        if problems and not plan.pad_vocab and all(d.rule == VOCAB for d in problems):
            padded = P.evolve(plan, pad_vocab=True)
            if not self.cands.requires(padded, reuse=True):
                return padded, []
        return plan, problems

    def _memo_keys(self, sizes: dict, schedule: str, virtual_stages: int, sequence_parallel: bool,
                   context_parallel: str, data_parallel: str, recompute: str) -> dict:
        """What `_family_legal` remembers a refusal under, per the refusing rule's axis: a tensor-parallel rule's
        (tp, sequence parallelism, pad_vocab; tp_layers and seq_len are the search's own), a pipeline rule's that
        does not read the micro-batches (pipeline_split.PER_SHAPE: pp, schedule, virtual stages), an expert rule's
        (ep, dp, sequence parallelism, data_parallel), cp's (and packed documents'): cp, its variant and the
        settings they say cp is not built with. From the settings alone: a group's are known before any plan of
        it is made."""
        tp, pp, ep, dp = sizes.get("tp", 1), sizes.get("pp", 1), sizes.get("ep", 1), sizes.get("dp", 1)
        return {"tp": (tp, sequence_parallel, self.base.pad_vocab),
                "pp": (pp, schedule, virtual_stages),
                "ep": (ep, dp > 1, sequence_parallel, data_parallel),
                "cp": (sizes.get("cp", 1), context_parallel, tp, pp, ep, dp > 1, data_parallel, recompute,
                       self.base.compile)}

    def _remembered(self, keys: dict, memo: dict):
        """The refusals `memo` holds for any of `keys` (`_memo_keys`), or None."""
        for axis, k in keys.items():
            got = memo.get((axis, k))
            if got is not None:
                return got
        return None

    def _family_legal(self, plan, memo, keys: dict | None = None):
        """`_legal`, remembering refusals that hold for every family sharing what the refusing rule reads
        (rules.per_shape, by the refusal's axis; `_memo_keys`, given as `keys` where the caller has them). The
        rules themselves are only ever called."""
        if keys is None:
            keys = self._memo_keys(dict(plan.axes), plan.schedule, plan.virtual_stages, plan.sequence_parallel,
                                   plan.context_parallel, plan.data_parallel, plan.recompute)
        got = self._remembered(keys, memo)
        if got is not None:
            return plan, got
        plan, problems = self._legal(plan)
        for d in problems:
            if per_shape(d):
                memo.setdefault((d.axis, keys[d.axis]), []).append(d)
        return plan, problems
