"""What follows a rank's compute in a step: the once-per-step collectives, exposed or hidden behind the compute
(compiler/cost/step_time.py's `Simulator.predict` and `after_pipeline`, the search's family bound)."""
from __future__ import annotations

from compiler.cost.links import collective_s


def data_parallel_exposed(cm, plan, entries, lk, scale, per, last_backward) -> list:
    """(axis, exposed seconds) of the once-per-step collectives: data parallelism's and sequence parallelism's
    partial gradients, for a rank holding `scale` × the described rank's parameters.

    One device's link carries them all, one after another. Under pp they follow the pipeline step (the runtime
    all-reduces the stages' gradients in one coalesced call): all exposed. Otherwise FSDP's gathers run ahead
    of the compute of every micro-batch (prefetch), DDP's all-reduce and FSDP's reduce-scatter during the last
    micro-batch's backward (FSDP's reduce-scatter in every micro-batch's under fsdp_grad_sync = micro_batch);
    what the windows cannot hold is exposed: max(gathers + syncs - all compute, the syncs of the last backward -
    last backward), plus the first unit's gather and the last bucket (or unit) that waits for backward to
    end (the bucket: plan.ddp_bucket_bytes; FSDP2's prefetch, plan.fsdp_prefetch, at least one unit). A
    broadcast (ZeRO-1's updated parameters) follows the optimizer: exposed."""
    m = plan.micro_batches
    units = max(sum(c.n for c in cm.formulas.counts.values()), 1) + 1  # FSDP units: each block and the root
    timed = []
    for c in entries:
        link = lk.get(c.axis)
        if link is None:
            continue
        t = collective_s(c.op, c.bytes / max(c.times, 1) * scale, link) * c.times
        if cm.formulas.piped or c.axis == "tp" or c.op == "broadcast":
            kind = "exposed"
        elif c.op == "all_gather":
            kind = "gather"
        else:
            kind = "sync"
        timed.append((c, t, kind))
    gathers = sum(t for _, t, k in timed if k == "gather")
    syncs = sum(t for _, t, k in timed if k == "sync")
    # what the last micro-batch's backward must hold: a sync issued in every micro-batch's backward (FSDP's
    # reduce-scatter under fsdp_grad_sync = micro_batch) holds one micro-batch's share there, the others having
    # run under the earlier backwards (the whole-window bound still counts all of them)
    last = sum(t / max(c.times, 1) for c, t, k in timed if k == "sync")
    overlapped = gathers + syncs
    out = [(c.axis, t) for c, t, k in timed if k == "exposed"]
    if overlapped > 0:
        window = m * (per.forward + per.backward)
        tail = sum(t / (max(c.times, 1) * units) for c, t, k in timed if k == "gather")
        tail += sum(t * min(1.0, plan.ddp_bucket_bytes / max(c.bytes, 1)) if c.op == "all_reduce"
                    else t / (max(c.times, 1) * units) for c, t, k in timed if k == "sync")
        total = max(overlapped - window, last - last_backward, 0.0) + tail
        out += [(c.axis, total * t / overlapped) for c, t, k in timed if k != "exposed"]
    return out
