"""The search's precision variants (compiler/search/prune.py `search`): a file that trains in bf16 on a device with
FP8 matmuls (compiler/cost/fp8.py FP8_SPEEDUP) is searched with `precision = fp8(recipe = tensorwise, filter =
auto)` too, and the two runs' winners are ranked together, each saying which precision it takes and what the other
costs. As MoE dispatch (dispatch.py), FP8 is then chosen like any other setting, by predicted step time.

Not searched: fp32 files (fp8 computes in bf16: another numerics class, which the file's author chose; the winners
say so on a device with FP8 matmuls), devices without an FP8 rate (a100: E0392; cpu: casts only, no speedup), and
files that write `precision = fp8(...)` themselves (kept, as a fixed setting, unless `--fix precision=bf16`)."""
from __future__ import annotations

from dataclasses import replace

from compiler import spec as S
from compiler.search.result import Result, ranked_together
from compiler.search.space import FixError

SEARCHED = S.FP8(recipe="tensorwise", filter="auto")
"""The FP8 the search tries: torchao's default recipe (one scale per tensor, the only one whose FSDP2 gathers move
FP8: compiler/cost/fp8.py) with its own filter (torchao's size thresholds)."""


def has_fp8_rate(spec: S.Spec) -> bool:
    from compiler.cost.fp8 import FP8_SPEEDUP
    return spec.cluster.device.kind in FP8_SPEEDUP


def text(fp8) -> str:
    """The `precision` value as the .scale file writes it."""
    return "bf16" if fp8 is None else f"fp8(recipe = {fp8.recipe}, filter = {fp8.filter})"


def with_fp8(spec: S.Spec, fp8) -> S.Spec:
    """`spec` training in bf16 with `fp8` (an S.FP8, or None: plain bf16)."""
    return replace(spec, train=replace(spec.train, precision="bf16", fp8=fp8))


def variants(spec: S.Spec, fixed: str | None) -> tuple:
    """(the spec searched, the fp8 spec searched beside it or None, whether the first changes the file's
    precision) under `--fix precision=fixed` (None: not fixed). FixError where fp8 is fixed and cannot be had."""
    written = spec.train.fp8
    if fixed is not None and spec.train.precision != "bf16":
        raise FixError(f"--fix precision={fixed}: the file trains in {spec.train.precision}, which the search does "
                       f"not change (another numerics class): write `precision = {fixed}` in the file instead")
    if fixed == "bf16":
        return (with_fp8(spec, None), None, True) if written is not None else (spec, None, False)
    if written is not None:
        return spec, None, False  # the file's own fp8: kept like a fixed setting
    why = refusal(spec)
    if fixed == "fp8":
        if why:
            raise FixError(f"--fix precision=fp8: {why}")
        return with_fp8(spec, SEARCHED), None, True
    return spec, (None if why else with_fp8(spec, SEARCHED)), False


def refusal(spec: S.Spec) -> str | None:
    """Why the search does not try fp8 on a file that does not write it, or None where it does."""
    kind = spec.cluster.device.kind
    if spec.train.precision != "bf16":
        return (f"the file trains in {spec.train.precision}; fp8 computes in bf16, another numerics class: write "
                "`precision = bf16` to let the search try it")
    if not has_fp8_rate(spec):
        return f"{kind} has no FP8 matmul rate (compiler/cost/fp8.py FP8_SPEEDUP)"
    from compiler.fp8_checks import torchao_missing
    missing = torchao_missing()
    return f"{missing} (E0390)" if missing else None


def note(spec: S.Spec) -> str | None:
    """The line each winner of an fp32 file on a device with FP8 matmuls carries: why fp8 was not tried."""
    if spec.train.fp8 is None and spec.train.precision == "fp32" and has_fp8_rate(spec):
        return f"precision fp32, as written; fp8 not searched: {refusal(spec)}"
    return None


def linears(cands, plan, fp8) -> tuple[int, int]:
    """(linears chosen for FP8, every linear of the blocks) of `plan`'s structure (compiler/cost/fp8.py)."""
    from compiler.cost import fp8 as F
    cm = cands.cost_model(plan)
    return F.chosen_count(cm.traced, {k: c.n for k, c in cm.formulas.counts.items()}, fp8)


def mark(result: Result, fp8, changed: bool) -> Result:
    """Each winner of one run with the precision it trains in (`fp8`: the run's S.FP8 or None) and whether that
    is the search's choice rather than the file's."""
    result.winners = [replace(w, fp8=fp8, precision_changed=changed) for w in result.winners]
    return result


def merge(plain: Result, fp8: Result, top: int, one_shape: bool, cands8) -> Result:
    """The winners of the file's bf16 and of fp8 (SEARCHED) ranked together (result.ranked_together), each with a
    reason naming its precision and the other's best. `cands8`: the fp8 run's candidates (which linears its
    winners compute in FP8)."""
    from compiler.report.units import seconds

    def winner_of(w, t, other, is_fp8):
        if is_fp8:
            chosen, total = linears(cands8, w.plan, SEARCHED)
            vs = ("no plan fits in bf16" if other is None else
                  f"{other / t:.2f}× faster than bf16 at best ({seconds(other)} → {seconds(t)})" if other > t else
                  f"bf16's best is {t / other:.2f}× faster ({seconds(other)})")
            why = f"fp8 ({SEARCHED.recipe}, {chosen} of {total} linears), not the file's bf16: {vs}"
            return replace(w, reasons=tuple(w.reasons) + (why,), fp8=SEARCHED, precision_changed=True)
        vs = ("no plan fits with it" if other is None else
              f"{t / other:.2f}× faster at best ({seconds(other)})" if other < t else
              f"{other / t:.2f}× this step time at best ({seconds(other)})")
        why = f"precision bf16, as written; fp8 ({SEARCHED.recipe}, filter = {SEARCHED.filter}): {vs}"
        return replace(w, reasons=tuple(w.reasons) + (why,), fp8=None, precision_changed=False)
    return ranked_together(plain, fp8, top, one_shape, winner_of)


def source(text_: str, spec: S.Spec, fp8) -> str:
    """`text_` (`spec`'s source, its lines where they were) with its `precision` value replaced by `fp8`'s
    (`text`): what the winner trains in."""
    sp = dict(spec.train.spans)["precision"]
    lines = text_.split("\n")
    first, last = lines[sp.line - 1], lines[sp.end_line - 1]
    lines[sp.line - 1:sp.end_line] = [first[:sp.col - 1] + text(fp8) + last[sp.end_col - 1:]]
    return "\n".join(lines)
