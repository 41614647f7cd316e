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


def network_text(price, where: str, fabric: str, efficiency: float) -> str:
    """The table of `price` (compiler.cost.network.Price); `where` says which ranks (a group, the first N), `fabric`
    and `efficiency` the NIC figure used."""
    g = price.group
    share = f", {g.share:.3g} of the NIC's bandwidth per device there" if g.share != 1 else ""
    lines = [f"{price.op} of {_size(price.bytes)} ({price.bytes} bytes) over {price.ranks} ranks ({where}): "
             f"{g.per_domain} per scale-up domain, crossing {g.tier}{share}",
             f"fabric {fabric}: NICs at {efficiency:.3g} of their line rate",
             "",
             f"  {'algorithm':<10} {'time':>12} {'algbw GB/s':>11} {'busbw GB/s':>11}  tier"]
    for a in price.algorithms:
        mark = "*" if a.name == price.chosen else " "
        lines.append(f"{mark} {a.name:<10} {_seconds(a.seconds):>12} {a.algbw_gbps:>11.1f} {a.busbw_gbps:>11.1f}  "
                     f"{a.tier}")
    lines += ["", f"NCCL would pick: {price.chosen} (the fastest of those it could use)", LIMITS]
    return "\n".join(lines) + "\n"
