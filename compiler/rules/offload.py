"""What `plan { offload }` needs (runtime/offload.py builds each kind), checked on any plan: a written one or a
search's candidate. Each refusal names the combination that cannot run as asked, and what to write instead.

- `params` is FSDP2's CPUOffloadPolicy: it needs FSDP2, `data_parallel = fsdp` or `zero2` over dp > 1 (ddp and
  zero1 have no sharded parameters for the policy to hold; over one dp rank the program wraps nothing).
- `optimizer` steps a share of the optimizer's state on the host beside DDP's or zero1's optimizer; under FSDP2
  (fsdp, zero2 over dp > 1) the optimizer's state is the parameters' shard's, and the way to put it on the host is
  FSDP2's own policy, `offload = params`.
- `activations` sends the blocks' saved tensors to the host through saved-tensor hooks around each block: under
  recomputation the block saves nothing through them (torch's checkpoint keeps its inputs, and selective
  recomputation its saved outputs, itself); and in a compiled block the hooks that tell attention's tensors from
  the MLP's do not run per call, so the plan is not compiled (compiler.plan.Plan.compiles) and a written
  `compile = true` is refused.

No NVMe location: no library made for it (DeepSpeed's ZeRO-Infinity aio, NVIDIA's GDS) is installed here, so the
language has no `location` argument to refuse.

This module imports no torch (compiler/rules/__init__.py).
"""
from __future__ import annotations

from compiler import spec as S
from compiler.diagnostics import Diagnostic, plan_error

AXIS = None  # no axis of its own: the refusals read the data-parallel mode, recomputation and compilation


def requires(spec: S.Spec, plan) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    if plan.offload == "params" and not plan.shards_grads:
        dp = plan.size("dp")
        why = (f"`data_parallel = {plan.data_parallel}` holds whole parameters" if dp > 1 else
               "over one dp rank nothing is sharded, and the program wraps no FSDP2 unit")
        out.append(plan_error(plan, "offload", "E0330", "`offload = params` is FSDP2's CPUOffloadPolicy, and this plan "
                              "has no FSDP2", label=why,
                              help="write `data_parallel = fsdp` (or zero2) over `axis dp` of 2 or more; under ddp "
                                   "or zero1, `offload = optimizer(fraction = 1)` moves the optimizer's state",
                              axis=AXIS, rule="offload.params"))
    if plan.offload == "optimizer" and plan.shards_grads:
        out.append(plan_error(plan, "offload", "E0331", f"`offload = optimizer` under `data_parallel = "
                              f"{plan.data_parallel}`: FSDP2 steps the optimizer on its parameter shards",
                              label="the state is the shards'",
                              help="write `offload = params`: FSDP2's CPUOffloadPolicy keeps the shards, their "
                                   "gradients and the optimizer's state on the host and steps it there (all of it: "
                                   "FSDP2 has no fraction); or `data_parallel = zero1` for a fraction",
                              axis=AXIS, rule="offload.optimizer_under_fsdp"))
    if plan.offload == "activations":
        if plan.recompute != "none":
            out.append(plan_error(plan, "offload", "E0332", f"activation offload under `recompute = "
                                  f"{plan.recompute}`: the blocks save nothing for it to move",
                                  label="no effect",
                                  help="recomputation already keeps only each block's input (full) or its matmul "
                                       "outputs (selective); write `recompute = none`, or leave the offload out",
                                  axis=AXIS, rule="offload.activations_recompute"))
        if plan.compile and plan.span("compile") is not None:  # not written: the program is not compiled
            out.append(plan_error(plan, "compile", "E0333", "activation offload in a compiled program",
                                  label="the hooks choosing the modules do not run inside a compiled block",
                                  help="write `compile = false`, or leave it out (activation offload turns the "
                                       "GPUs' default off)", axis=AXIS, rule="offload.activations_compile"))
    return out


def reads(plan) -> tuple:
    """What `requires`' verdict reads of a plan (compiler/rules/__init__.py READS)."""
    return (plan.offload, plan.data_parallel, plan.size("dp") > 1, plan.recompute, plan.compile,
            plan.span("compile") is not None)
