"""The search's MoE dispatch variants (compiler/search/prune.py `search`): a dropless `moe` of padded dispatch is
searched grouped too (the same routing and outputs), and the two runs' winners are ranked together."""
from __future__ import annotations

from dataclasses import replace

from compiler import spec as S
from compiler.search.result import Result, ranked_together
from compiler.search.space import ORDER


def grouped_dispatch(spec: S.Spec) -> S.Spec | None:
    """`spec` with each dropless `moe` of padded dispatch (capacity_factor = none, dispatch as the default or
    written `padded`) dispatched grouped instead; None when it has none (nothing for the search to vary)."""
    def one(x):
        if isinstance(x, S.MoE) and x.capacity_factor == "none" and x.dispatch == "padded":
            return replace(x, dispatch="grouped")
        if isinstance(x, (S.Residual, S.Repeat)):
            return replace(x, body=tuple(one(y) for y in x.body))
        return x
    layers = tuple(one(x) for x in spec.model.layers)
    if layers == spec.model.layers:
        return None
    return replace(spec, model=replace(spec.model, layers=layers))


def every_axis_fixed(fixed: dict, spec: S.Spec) -> bool:
    """Whether every axis is fixed (the winners are then plans of one shape, not distinct layouts)."""
    moe = any(isinstance(x, S.MoE) for x in S.walk(spec.model.layers))
    return all(a in fixed for a in ORDER if a != "ep" or moe)


def merge(padded: Result, grouped: Result, top: int, one_shape: bool) -> Result:
    """The winners of the file's padded dispatch and of grouped dispatch ranked together (result.ranked_together),
    each with a reason naming its dispatch and the other's best."""
    def winner_of(w, t, other, is_grouped):
        vs = (f"{other / t:.2f}× this step time at best" if other is not None else "no plan fits with it")
        why = ("dispatch = grouped, not the file's padded (its dropless `moe`: the same result, no padded slot per "
               f"token); padded: {vs}" if is_grouped else f"dispatch padded, as written; grouped: {vs}")
        return replace(w, reasons=tuple(w.reasons) + (why,), dispatch="grouped" if is_grouped else None)
    return ranked_together(padded, grouped, top, one_shape, winner_of)


def dispatched(search_class, spec: S.Spec, top: int, fixed: dict, dispatch: str | None, cands, headroom) -> Result:
    """One search of `spec` (prune.search runs one per precision): where it has a dropless `moe` of padded dispatch
    that `--fix dispatch` leaves free, grouped dispatch's too, merged; only grouped's under `--fix
    dispatch=grouped`."""
    from compiler.search.offloaded import run
    grouped = grouped_dispatch(spec) if dispatch != "padded" else None
    if grouped is None:
        return run(search_class, spec, top, fixed, cands, headroom)
    if dispatch == "grouped":
        result = run(search_class, grouped, top, fixed, None, headroom)
        result.winners = [replace(w, dispatch="grouped") for w in result.winners]
        return result
    return merge(run(search_class, spec, top, fixed, cands, headroom),
                 run(search_class, grouped, top, fixed, None, headroom), top, every_axis_fixed(fixed, spec))
