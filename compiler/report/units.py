"""One formatter each for counts, bytes, FLOPs and durations, used by every report and message.

Each keeps the exact text the reports printed before they shared it (the goldens pin it); where two reports wrote
one quantity differently, the difference is a keyword argument here, named for what it changes, not a second
function.
"""
from __future__ import annotations

_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def count(n: float, unit: str = "") -> str:
    """`n` with an SI prefix and 4 significant digits: 1.749e+11 parameters -> `174.9 G`, 2e9 with `B` -> `2 GB`."""
    for scale, prefix in _PREFIXES:
        if abs(n) >= scale:
            return f"{n / scale:.4g} {prefix}{unit}"
    return f"{n:.4g} {unit}".rstrip()


def nbytes(n: float, *, gigabytes: bool = False, unit: bool = True) -> str:
    """A size in bytes (SI prefixes, 1 GB = 1e9 B, as devices are sold): `23.13 GB`, `512 kB`.

    `gigabytes`: always in GB with 3 significant digits (`81.2 GB`), as search's one-line verdicts compare a peak
    with a device; `unit=False` leaves the ` GB` off (`81.2 GB of 80`)."""
    if not gigabytes:
        return count(n, "B")
    return f"{n / 1e9:.3g}" + (" GB" if unit else "")


def flops(n: float, *, scientific: bool = False, what: str = "FLOP") -> str:
    """A number of floating-point operations with an SI prefix (`314.5 PFLOP`) or, `scientific`, to 5 significant
    digits (`3.1450e+20 FLOP`), as `plan` prints the exact figure; `what` names them (`hardware FLOP`)."""
    return f"{n:.4e} {what}" if scientific else count(n, what)


def seconds(t: float, *, smallest: str = "µs") -> str:
    """A duration as a person reads it: `14.6 s`, `352 ms`, `41 µs`, 3 significant digits.

    `smallest="ms"` writes what is under a millisecond in ms too (`0.412 ms`), as `scalec plan` always has; search
    goes down to µs."""
    if smallest == "ms":
        return f"{t * 1e3:.3g} ms" if t < 1 else f"{t:.3g} s"
    if t >= 1:
        return f"{t:.3g} s"
    if t >= 1e-3:
        return f"{t * 1e3:.3g} ms"
    return f"{t * 1e6:.3g} µs"
