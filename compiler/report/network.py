"""`scalec network`'s text: one collective on the described fabric, per NCCL algorithm and the one NCCL would pick,
in nccl-tests' terms (compiler/cost/network.py prices it), with the limits of the model said."""
from __future__ import annotations

LIMITS = ("Large messages (bandwidth-bound) are modelled well, small ones (latency-bound) roughly: NCCL's "
          "protocols (LL, LL128, Simple) and channel counts are not modelled; NVLSTree, CollNet (IB SHARP) and "
          "PAT are not offered. busbw follows nccl-tests (doc/PERFORMANCE.md).")


def _size(nbytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} B"


def _seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"


def sharing_text(group, groups: int, cluster) -> str:
    """The contention assumed for `group` (a compiler.cost.network.GroupSpan), one of `groups` run at once on
    `cluster`'s topology (compiler/layout/contention.py)."""
    if not group.crosses:
        return f"contention: none, {'its' if groups == 1 else 'each group'} inside one scale-up domain"
    if cluster.topology.domains(cluster.nodes) is None:  # a torus, rails without PXN: switches that do not nest
        return (f"contention: the topology's share, every rank crossing at once ({groups} group"
                f"{'s' if groups != 1 else ''} at once)")
    at_once = "alone" if groups == 1 else f"one of {groups} groups run at once"
    who = "it alone uses" if group.sharing == 1 else f"{group.sharing} groups share"
    amount = f"{group.share:.3g} of a NIC" if group.share < 1 else "a whole NIC"
    return f"contention: {at_once}; {who} the uplink that limits it, {amount} per flow"


def network_text(price, where: str, fabric: str, efficiency: float, device: str = "", sharing: str = "") -> str:
    """The table of `price` (compiler.cost.network.Price); `where` says which ranks (a group, the first N), `fabric`
    and `efficiency` the NIC figure used, `device` the device's kind, `sharing` the contention assumed
    (`sharing_text`; '' where no topology is written)."""
    g = price.group
    share = f", {g.share:.3g} of each NIC's bandwidth there" if g.share != 1 else ""
    lines = [f"{price.op} of {_size(price.bytes)} ({price.bytes} bytes) over {price.ranks} ranks ({where}): "
             f"{g.per_domain}{f'-{g.most}' if g.most else ''} per scale-up domain, crossing {g.tier}{share}",
             f"fabric {fabric}: NICs at {efficiency:.3g} of their line rate",
             *([sharing] if sharing else []),
             "",
             f"  {'algorithm':<10} {'time':>12} {'algbw GB/s':>11} {'busbw GB/s':>11}  tier"]
    for a in price.algorithms:
        mark = "*" if a.name == price.chosen else " "
        lines.append(f"{mark} {a.name:<10} {_seconds(a.seconds):>12} {a.algbw_gbps:>11.1f} {a.busbw_gbps:>11.1f}  "
                     f"{a.tier}")
    lines += ["", f"NCCL would pick: {price.chosen} (the fastest of those it could use)", LIMITS]
    if device == "cpu":
        lines.append("On CPU the program runs gloo, not NCCL: its ring at the device's measured figures.")
    return "\n".join(lines) + "\n"


def network_output(spec, args) -> str:
    """What `scalec network` prints for `spec` (its Cluster and the mesh's axes) and the command's `args` (op, size,
    ranks, group, json, measured). A bad value is a ValueError, its message for the user."""
    import json

    from compiler.cost import network as N
    cluster = spec.cluster
    fabric = getattr(cluster, "fabric", None)
    if args.measured and args.size:
        raise ValueError("--size with --measured: the sizes are the measurement's (drop --size)")
    if args.measured:
        with open(args.measured, encoding="utf-8") as f:
            listed, rows = N.parse_nccl_tests(f.read())
        ranks = args.ranks if args.ranks or args.group else listed or None
        group_rows, where = N.rows_of(spec.plan.axes, cluster.world_size, ranks, args.group)
        n = len(group_rows[0])
        if listed and listed != n:
            raise ValueError(f"the measurement lists {listed} ranks, {where} hold {n}: give --ranks {listed}")
        efficiency, used = N.fit_efficiency(cluster, args.op, rows, group_rows)
        fitted = N.with_efficiency(cluster, efficiency)
        model = [N.price_on(fitted, args.op, r.bytes, group_rows) for r in used]
        if args.json:
            return json.dumps({"op": args.op, "ranks": n, "fabric_efficiency": round(efficiency, 4),
                               "stored_efficiency": N.fabric_efficiency(fabric),
                               "rows": [{"bytes": r.bytes, "measured_busbw_gbps": r.busbw_gbps,
                                         "model_busbw_gbps": p.algorithms[0].busbw_gbps}
                                        for r, p in zip(used, model)]}, indent=1) + "\n"
        return measured_text(args.op, n, where, used, model, efficiency, N.fabric_name(fabric),
                             N.fabric_efficiency(fabric))
    rows, where = N.rows_of(spec.plan.axes, cluster.world_size, args.ranks, args.group)
    price = N.price_on(cluster, args.op, N.parse_size(args.size or "1GB"), rows)
    if args.json:
        return json.dumps(price.json(), indent=1) + "\n"
    topology = getattr(cluster, "topology", None)
    sharing = sharing_text(price.group, len(rows), cluster) if topology is not None else ""
    return network_text(price, where, N.fabric_name(fabric), N.fabric_efficiency(fabric), cluster.device.kind,
                        sharing)


def measured_text(op: str, n: int, where: str, used: tuple, model: list, efficiency: float, fabric: str,
                  stored: float) -> str:
    """`scalec network --measured`: the fitted NIC efficiency, and the rows it was fitted to against the model."""
    lines = [f"{op} measured over {n} ranks ({where}): the {len(used)} largest sizes (the bandwidth regime) fitted",
             "", f"  {'size':>10} {'measured busbw':>15} {'model busbw':>12}  algorithm"]
    for r, p in zip(used, model):
        fitted = p.algorithms[0]
        lines.append(f"  {_size(r.bytes):>10} {r.busbw_gbps:>15.1f} {fitted.busbw_gbps:>12.1f}  {fitted.name}")
    lines += ["", f"The fabric's NICs reach {efficiency:.3f} of their line rate (stored for {fabric.split()[0]}: {stored:.3g}).",
              f"The figure to put in the file, as the fabric's efficiency in the mesh section: {efficiency:.3f}"]
    return "\n".join(lines) + "\n"
