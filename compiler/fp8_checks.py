"""The checks of `precision = fp8(recipe, filter)` (runtime/fp8.py: torchao's float8 training), each located at
the `precision` setting:

- E0390 (check): torchao does not import here: the program could not convert a linear.
- E0392 (check): the mesh's device has no FP8 matmuls (A100: torch._scaled_mm needs compute capability 8.9;
  compiler/cost/fp8.py FP8_SPEEDUP lists the devices that have them, and cpu runs torch's CPU kernel).
- E0391 (compile, cpu): this torch's CPU _scaled_mm does not run (torch 2.13's does): probed once.
- W0391 (compile): on a device with an FP8 rate, the chosen linears' casts are predicted to cost more than their
  faster matmuls save (compiler/cost/fp8.py): FP8 makes this model slower.
- W0390 (compile): the filter chooses no linear of the model (`auto` on a small model: every matmul under
  torchao's thresholds): the program trains in plain bf16.
"""
from __future__ import annotations

import functools
import importlib.util

from compiler import spec as S
from compiler.diagnostics import Diagnostic

FP8_DEVICES = ("cpu", "h100", "h800", "h200", "b200", "gb200")
"""Device kinds whose FP8 matmul torchao calls: Hopper and Blackwell (compiler/cost/fp8.py FP8_SPEEDUP: 2× bf16's
dense peak), and cpu (torch's CPU _scaled_mm: the numerics, no speedup)."""


def torchao_missing() -> str | None:
    """Why torchao's float8 training cannot be imported here, or None when it can (found, not imported: `check`
    stays fast and torch-free)."""
    # the top package only: finding `torchao.float8` would import torchao (seconds, and its kernel libraries' logs)
    return None if importlib.util.find_spec("torchao") is not None else "torchao is not installed"


def spec_checks(c, spec: S.Spec) -> None:
    """The checks `scalec check` can make: torchao importable, a device with FP8 matmuls."""
    fp8 = spec.train.fp8
    if fp8 is None:
        return
    at = dict(spec.train.spans).get("precision")
    missing = torchao_missing()
    if missing:
        c.error("E0390", f"`precision = fp8(...)` trains with torchao's float8 training: {missing}", at,
                label="needs torchao",
                help="install it (`pip install 'scalec[fp8]'`, torchao >= 0.18), or train in `precision = bf16`")
    kind = spec.cluster.device.kind
    if kind not in FP8_DEVICES:
        c.error("E0392", f"{kind} has no FP8 matmuls: `precision = fp8(...)` cannot run there", at,
                label=f"on {kind}",
                help=f"FP8 tensor cores start with compute capability 8.9 (Ada, Hopper; torch._scaled_mm needs "
                     f"it): use `precision = bf16` on {kind}, or a device among {', '.join(FP8_DEVICES[1:])}")


@functools.cache
def cpu_scaled_mm() -> str | None:
    """Why torch's CPU _scaled_mm does not run here (a 16 × 16 float8 product), or None when it does."""
    import torch
    try:
        a = torch.ones(16, 16).to(torch.float8_e4m3fn)
        one = torch.ones((), dtype=torch.float32)
        torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    except (RuntimeError, AttributeError, NotImplementedError, TypeError) as e:
        return f"torch {torch.__version__}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    return None


def compiled_checks(compiled) -> tuple[list, list]:
    """(errors, warnings) of a compiled plan under fp8: the CPU kernel runs (cpu), the filter chooses a linear."""
    from compiler.cost import fp8 as FP8
    spec = compiled.spec
    fp8 = spec.train.fp8
    if fp8 is None:
        return [], []
    at = dict(spec.train.spans).get("precision")
    errors, warnings = [], []
    if spec.cluster.device.kind == "cpu" and (why := cpu_scaled_mm()):
        errors.append(Diagnostic("E0391", f"FP8 matmuls do not run on this CPU: {why}", at,
                                 label="needs torch._scaled_mm on CPU",
                                 help="torch 2.13 runs float8 matmuls on CPU: install it, or train in "
                                      "`precision = bf16`"))
    kind = spec.cluster.device.kind
    if kind in FP8.FP8_SPEEDUP and not FP8.no_linear(compiled.traced, fp8):
        counts = {name: c.n for name, c in compiled.model.formulas.counts.items()}
        parts = FP8.per_block(compiled)
        saved = sum(counts[name] * s for name, (s, _) in parts.items())
        casts = sum(counts[name] * c for name, (_, c) in parts.items())
        if casts >= saved:
            warnings.append(Diagnostic("W0391", f"fp8 is predicted slower than bf16 on {kind}: its casts cost "
                                                f"{casts * 1e3:.3g} ms a micro-batch, its matmuls save "
                                                f"{saved * 1e3:.3g} ms", at, severity="warning",
                                       label="the matmuls are too small to gain",
                                       help="FP8 pays on large matmuls only (torchtitan#1207: small models ran "
                                            "slower); `filter = auto` keeps the small linears in bf16, or train in "
                                            "`precision = bf16`"))
    if FP8.no_linear(compiled.traced, fp8):
        rule = ("torchao's thresholds (tensorwise: K > 4096 or N > 1024)" if fp8.recipe == "tensorwise" else
                "torchao's thresholds (rowwise: N > 2048, K > 1024, and not both N ≤ 4096 and K ≤ 2048)")
        warnings.append(Diagnostic("W0390", f"fp8(filter = {fp8.filter}) chooses no linear: every matmul trains "
                                            "in bf16", at, severity="warning", label="no linear in FP8",
                                   help=f"`auto` converts only a block's linears whose shape gains by {rule}, "
                                        "dims multiples of 16; `filter = all` converts every one whose dims are "
                                        "multiples of 16 (slower where small), or train in `precision = bf16`"
                                   if fp8.filter == "auto" else
                                   "no block linear has both dims multiples of 16 (FP8 kernels need them): train "
                                   "in `precision = bf16`"))
    return errors, warnings
