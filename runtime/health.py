"""GPU health read through NVML (`pynvml`, the `nvidia-ml-py` package: `pip install 'scalec[gpu]'`), and the rules
that call a device unhealthy.

`read(index)` returns one dict of plain values for NVML device `index` (`nvml_index` maps this rank's CUDA device
to it): every counter read on its own, so a device or driver without one (NVMLError: not supported, no permission;
an older pynvml without the function) gives None for it, never a zero that looks like a healthy reading
(codecarbon#1316: a silent 0 where a counter was unreadable). `verdict(reading, previous)` lists the reasons the
reading (against the window before, where there is one) calls the device unhealthy; an empty list is healthy.
`Monitor` is what the trainer holds: one per rank, read each window, and one line, once per run, where nothing can
be read (no pynvml, no CUDA device, NVML will not start).

The rules, each from NVIDIA's documentation or DCGM's health checks (the `m`emory and `t`hermal watches of
`dcgmi health`):
- new uncorrected ECC errors (volatile count up since the window before; at the first reading, any since the driver
  loaded): NVML `nvmlDeviceGetTotalEccErrors`; DCGM's memory watch fails on any double-bit (uncorrectable) error.
- a row remapping that failed (`nvmlDeviceGetRemappedRows`' failureOccurred: "set if a row remapping ever failed";
  DCGM fails on it, the GPU needs service). A pending remapping is reported but not unhealthy: NVML says it "won't
  affect future work" until the reset that applies it.
- new pages retired for double-bit errors, or 60 retired pages or more (DCGM_LIMIT_MAX_RETIRED_PAGES = 60, DCGM's
  GpuHardwareLimits.h; pre-Ampere devices retire pages, Ampere and later remap rows).
- clocks held down by the hardware: HW slowdown, HW thermal slowdown, HW power brake (NVML's clocks event
  reasons: "reducing the core clocks by a factor of 2 or more"), or SW thermal slowdown (the driver lowering
  clocks above the thermal limit); the SW power cap, sync boost, idle and application clocks are a healthy GPU's
  (a busy GPU at its power limit is working as designed).
- the GPU's temperature at or above its slowdown threshold (`NVML_TEMPERATURE_THRESHOLD_SLOWDOWN`).

No torch at import; pynvml is imported where used.
"""
from __future__ import annotations

import sys

RETIRED_PAGES_LIMIT = 60
"""DCGM's DCGM_LIMIT_MAX_RETIRED_PAGES: a device with this many retired pages fails DCGM's memory health check."""

REASONS = ((0x1, "idle"), (0x2, "applications clocks"), (0x4, "power cap"), (0x8, "HW slowdown"),
           (0x10, "sync boost"), (0x20, "SW thermal slowdown"), (0x40, "HW thermal slowdown"),
           (0x80, "HW power brake"), (0x100, "display clocks"))
"""NVML's clocks event reasons (nvmlClocksEventReason*, formerly nvmlClocksThrottleReason*), bit and name."""

UNHEALTHY_REASONS = ("HW slowdown", "SW thermal slowdown", "HW thermal slowdown", "HW power brake")
"""Clocks event reasons that make a device unhealthy (module docstring)."""

MISSING_NVML = "health: no NVML (pip install nvidia-ml-py) — GPU health not read"


def decode(mask: int) -> list[str]:
    """The names of the clocks event reasons set in `mask`, and `unknown 0x...` for bits NVML added since."""
    names = [name for bit, name in REASONS if mask & bit]
    rest = mask & ~sum(bit for bit, _ in REASONS)
    if rest:
        names.append(f"unknown {rest:#x}")
    return names


def _guarded(nvml, name: str, *args):
    """`nvml.name(*args)`, or None where the device, the driver or this pynvml lacks it."""
    fn = getattr(nvml, name, None)
    if fn is None:
        return None
    try:
        return fn(*args)
    except nvml.NVMLError:
        return None


def _first(nvml, names: tuple, *args):
    """The first of `names` this pynvml has, called (the clocks event reasons were renamed in driver 535)."""
    for name in names:
        if getattr(nvml, name, None) is not None:
            return _guarded(nvml, name, *args)
    return None


def _count(value) -> int | None:
    return None if value is None else int(value)


def read(index: int, nvml=None) -> dict:
    """Every health counter of NVML device `index` as plain values (None: not readable on this device). NVML must be
    initialised (`Monitor` does it). Watts and MHz, degrees Celsius, counts."""
    if nvml is None:
        import pynvml as nvml
    h = nvml.nvmlDeviceGetHandleByIndex(index)
    unc, cor = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    vol, agg = nvml.NVML_VOLATILE_ECC, nvml.NVML_AGGREGATE_ECC
    out = {
        "ecc_uncorrected_volatile": _count(_guarded(nvml, "nvmlDeviceGetTotalEccErrors", h, unc, vol)),
        "ecc_uncorrected_aggregate": _count(_guarded(nvml, "nvmlDeviceGetTotalEccErrors", h, unc, agg)),
        "ecc_corrected_volatile": _count(_guarded(nvml, "nvmlDeviceGetTotalEccErrors", h, cor, vol)),
        "ecc_corrected_aggregate": _count(_guarded(nvml, "nvmlDeviceGetTotalEccErrors", h, cor, agg)),
    }
    mask = _first(nvml, ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"), h)
    out["clocks_event_reasons"] = None if mask is None else decode(int(mask))
    out["temperature_c"] = _count(_guarded(nvml, "nvmlDeviceGetTemperature", h, nvml.NVML_TEMPERATURE_GPU))
    out["slowdown_temperature_c"] = _count(_guarded(nvml, "nvmlDeviceGetTemperatureThreshold", h,
                                                    nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN))
    out["sm_clock_mhz"] = _count(_guarded(nvml, "nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_SM))
    out["sm_clock_max_mhz"] = _count(_guarded(nvml, "nvmlDeviceGetMaxClockInfo", h, nvml.NVML_CLOCK_SM))
    power = _guarded(nvml, "nvmlDeviceGetPowerUsage", h)  # milliwatts
    limit = _guarded(nvml, "nvmlDeviceGetEnforcedPowerLimit", h)
    out["power_w"] = None if power is None else power / 1000.0
    out["power_limit_w"] = None if limit is None else limit / 1000.0
    for key, cause in (("retired_pages_sbe", "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS"),
                       ("retired_pages_dbe", "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR")):
        pages = _guarded(nvml, "nvmlDeviceGetRetiredPages", h, getattr(nvml, cause)) if hasattr(nvml, cause) else None
        out[key] = None if pages is None else len(pages)
    pending = _guarded(nvml, "nvmlDeviceGetRetiredPagesPendingStatus", h)
    out["retired_pages_pending"] = None if pending is None else bool(pending)
    rows = _guarded(nvml, "nvmlDeviceGetRemappedRows", h)  # (correctable, uncorrectable, pending, failure)
    keys = ("remapped_rows_correctable", "remapped_rows_uncorrectable", "remap_pending", "remap_failed")
    for i, key in enumerate(keys):
        out[key] = None if rows is None else (int(rows[i]) if i < 2 else bool(rows[i]))
    return out


def _grew(reading: dict, previous: dict | None, key: str) -> int:
    """How much counter `key` grew since `previous` (at the first reading: its value); 0 where unreadable."""
    now = reading.get(key)
    if now is None:
        return 0
    before = (previous or {}).get(key)
    return now - before if before is not None else (now if previous is None else 0)


def verdict(reading: dict, previous: dict | None = None) -> list[str]:
    """The reasons `reading` is unhealthy (module docstring's rules), against the window before (`previous`, None
    at the first reading); empty: healthy, or nothing readable that says otherwise."""
    reasons = []
    new = _grew(reading, previous, "ecc_uncorrected_volatile")
    if new > 0:
        since = "since the last window" if previous is not None else "since the driver loaded"
        reasons.append(f"{new} uncorrected ECC error{'s' if new != 1 else ''} {since}")
    if reading.get("remap_failed"):
        reasons.append("a row remapping failed (the GPU needs service)")
    dbe = _grew(reading, previous, "retired_pages_dbe")
    if dbe > 0 and previous is not None:
        reasons.append(f"{dbe} page{'s' if dbe != 1 else ''} retired for double-bit ECC errors since the last window")
    pages = [reading.get(k) for k in ("retired_pages_sbe", "retired_pages_dbe")]
    if any(p is not None for p in pages) and sum(p or 0 for p in pages) >= RETIRED_PAGES_LIMIT:
        reasons.append(f"{sum(p or 0 for p in pages)} retired pages (DCGM's limit: {RETIRED_PAGES_LIMIT})")
    slowed = [r for r in reading.get("clocks_event_reasons") or () if r in UNHEALTHY_REASONS]
    if slowed:
        clock = reading.get("sm_clock_mhz"), reading.get("sm_clock_max_mhz")
        at = f" (SM clock {clock[0]} of {clock[1]} MHz)" if None not in clock else ""
        reasons.append(f"clocks held down: {', '.join(slowed)}{at}")
    temp, limit = reading.get("temperature_c"), reading.get("slowdown_temperature_c")
    if temp is not None and limit is not None and temp >= limit:
        reasons.append(f"{temp} °C, at or above the slowdown threshold {limit} °C")
    return reasons


def nvml_index(nvml, device_index: int) -> int:
    """The NVML index of CUDA device `device_index`: by its UUID (CUDA_VISIBLE_DEVICES renumbers CUDA's devices,
    never NVML's), else the same number."""
    try:
        import torch
        uuid = str(torch.cuda.get_device_properties(device_index).uuid)
        h = nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
        return int(nvml.nvmlDeviceGetIndex(h))
    except (AttributeError, RuntimeError, nvml.NVMLError):
        return device_index


class Monitor:
    """This rank's device, read each window: `check()` returns the verdict's reasons (empty when healthy or when
    nothing can be read). Where NVML cannot be read, `missing` says why, printed once (`say`) and never again."""

    def __init__(self, device, nvml=None, say=None):
        self.missing, self.index, self.nvml = None, None, None
        self.previous, self.reading = None, None
        self._say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        if getattr(device, "type", device) != "cuda":
            self.missing = "health: no CUDA device — GPU health not read"
        else:
            try:
                if nvml is None:
                    import pynvml as nvml
            except ImportError:
                self.missing = MISSING_NVML
            else:
                try:
                    nvml.nvmlInit()
                except nvml.NVMLError as exc:
                    self.missing = f"health: NVML did not start ({exc}) — GPU health not read"
                else:
                    self.nvml = nvml
                    self.index = nvml_index(nvml, getattr(device, "index", None) or 0)
        self._told = False

    def tell(self) -> None:
        """Print why health is not read, once per run (the caller decides which rank speaks)."""
        if self.missing and not self._told:
            self._told = True
            self._say(self.missing)

    def check(self) -> list[str]:
        """Read the device and return the reasons it is unhealthy now (`verdict` against the last window)."""
        if self.nvml is None:
            return []
        try:
            reading = read(self.index, self.nvml)
        except self.nvml.NVMLError as exc:  # the device itself is gone from NVML: say so once, read no more
            self.missing = f"health: NVML cannot read device {self.index} ({exc}) — GPU health not read"
            self.nvml = None
            self.tell()
            return []
        self.previous, self.reading = self.reading, reading
        return verdict(self.reading, self.previous)
