"""runtime.health against a stand-in pynvml (no GPU here): every counter read on its own, an unsupported one None
(never 0), the clocks event reasons decoded, the verdict's rules, and one line, once, where NVML is missing."""
from __future__ import annotations

import sys
import types

import pytest

from runtime import health


class _NVMLError(Exception):
    pass


def _fake(values: dict, unsupported=(), missing=()) -> types.ModuleType:
    """A pynvml whose calls return `values[name]` (a function of the call's arguments or a constant), raise
    NVMLError for the names in `unsupported`, and lack the functions in `missing`."""
    m = types.ModuleType("pynvml")
    m.NVMLError = _NVMLError
    consts = dict(NVML_MEMORY_ERROR_TYPE_CORRECTED=0, NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1, NVML_VOLATILE_ECC=0,
                  NVML_AGGREGATE_ECC=1, NVML_TEMPERATURE_GPU=0, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN=1,
                  NVML_CLOCK_SM=1, NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS=0,
                  NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR=1)
    for k, v in consts.items():
        setattr(m, k, v)
    m.calls = []
    m.nvmlInit = lambda: m.calls.append("init")
    m.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    names = ("nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetCurrentClocksEventReasons",
             "nvmlDeviceGetCurrentClocksThrottleReasons", "nvmlDeviceGetTemperature",
             "nvmlDeviceGetTemperatureThreshold", "nvmlDeviceGetClockInfo", "nvmlDeviceGetMaxClockInfo",
             "nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetRetiredPages",
             "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetRemappedRows")
    for name in names:
        if name in missing:
            continue

        def call(handle, *args, _name=name):
            m.calls.append(_name)
            if _name in unsupported:
                raise _NVMLError("Not Supported")
            v = values.get(_name, 0)
            return v(*args) if callable(v) else v
        setattr(m, name, call)
    return m


HEALTHY = {
    # (error type, counter type) -> count: corrected errors only, as a healthy device may have
    "nvmlDeviceGetTotalEccErrors": lambda kind, counter: {(0, 0): 3, (0, 1): 40, (1, 0): 0, (1, 1): 0}[kind, counter],
    "nvmlDeviceGetCurrentClocksEventReasons": 0x4,  # power cap: a busy GPU at its limit
    "nvmlDeviceGetTemperature": 61, "nvmlDeviceGetTemperatureThreshold": 87,
    "nvmlDeviceGetClockInfo": 1755, "nvmlDeviceGetMaxClockInfo": 1980,
    "nvmlDeviceGetPowerUsage": 650_000, "nvmlDeviceGetEnforcedPowerLimit": 700_000,
    "nvmlDeviceGetRetiredPages": lambda cause: [], "nvmlDeviceGetRetiredPagesPendingStatus": 0,
    "nvmlDeviceGetRemappedRows": (2, 0, 0, 0),
}


def test_a_healthy_device_reads_as_plain_values_and_passes():
    reading = health.read(3, _fake(HEALTHY))
    assert reading == {
        "ecc_uncorrected_volatile": 0, "ecc_uncorrected_aggregate": 0, "ecc_corrected_volatile": 3,
        "ecc_corrected_aggregate": 40, "clocks_event_reasons": ["power cap"], "temperature_c": 61,
        "slowdown_temperature_c": 87, "sm_clock_mhz": 1755, "sm_clock_max_mhz": 1980, "power_w": 650.0,
        "power_limit_w": 700.0, "retired_pages_sbe": 0, "retired_pages_dbe": 0, "retired_pages_pending": False,
        "remapped_rows_correctable": 2, "remapped_rows_uncorrectable": 0, "remap_pending": False,
        "remap_failed": False}
    assert health.verdict(reading) == [] and health.verdict(reading, reading) == []


def test_an_unsupported_counter_is_none_never_zero():
    # an H100 retires no pages (it remaps rows); an older pynvml has only the throttle-reasons name
    nvml = _fake(HEALTHY, unsupported={"nvmlDeviceGetRetiredPages", "nvmlDeviceGetRetiredPagesPendingStatus",
                                       "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetPowerUsage"},
                 missing={"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetRemappedRows"})
    nvml.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 0x48  # HW slowdown | HW thermal slowdown
    reading = health.read(0, nvml)
    for key in ("retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending", "ecc_uncorrected_volatile",
                "ecc_corrected_aggregate", "power_w", "remapped_rows_correctable", "remap_failed"):
        assert reading[key] is None, key
    assert reading["power_limit_w"] == 700.0 and reading["clocks_event_reasons"] == ["HW slowdown",
                                                                                    "HW thermal slowdown"]
    assert health.verdict(reading) == ["clocks held down: HW slowdown, HW thermal slowdown (SM clock 1755 of 1980 MHz)"]


def test_the_rules():
    base = health.read(0, _fake(HEALTHY))
    worse = dict(base, ecc_uncorrected_volatile=2, retired_pages_dbe=1, remap_failed=True, temperature_c=88,
                 clocks_event_reasons=["SW thermal slowdown", "power cap"])
    assert health.verdict(worse, base) == [
        "2 uncorrected ECC errors since the last window", "a row remapping failed (the GPU needs service)",
        "1 page retired for double-bit ECC errors since the last window",
        "clocks held down: SW thermal slowdown (SM clock 1755 of 1980 MHz)",
        "88 °C, at or above the slowdown threshold 87 °C"]
    # errors counted before the first window are the driver's since it loaded; unchanged ones are not new
    assert health.verdict(dict(base, ecc_uncorrected_volatile=1)) == ["1 uncorrected ECC error since the driver loaded"]
    assert health.verdict(dict(base, ecc_uncorrected_volatile=1), dict(base, ecc_uncorrected_volatile=1)) == []
    assert health.verdict(dict(base, retired_pages_sbe=59, retired_pages_dbe=1), dict(base, retired_pages_sbe=59,
                                                                                      retired_pages_dbe=1)) == [
        "60 retired pages (DCGM's limit: 60)"]
    # sync boost, idle, application clocks, the SW power cap, a pending remap: a healthy device
    assert health.verdict(dict(base, clocks_event_reasons=health.decode(0x17), remap_pending=True)) == []
    assert health.decode(0x8 | 0x200) == ["HW slowdown", "unknown 0x200"]


def test_monitor_says_once_what_is_missing(monkeypatch):
    said = []
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    gpu = types.SimpleNamespace(type="cuda", index=0)
    mon = health.Monitor(gpu, say=said.append)
    for _ in range(3):
        assert mon.check() == []
        mon.tell()
    assert said == [health.MISSING_NVML]
    cpu = health.Monitor(types.SimpleNamespace(type="cpu", index=None), say=said.append)
    cpu.tell(), cpu.tell()
    assert said[1:] == ["health: no CUDA device — GPU health not read"]


def test_monitor_reads_each_window_against_the_last(monkeypatch):
    counts = iter([0, 0, 1, 1])
    values = dict(HEALTHY, nvmlDeviceGetTotalEccErrors=lambda kind, counter: next(counts) if (kind, counter) == (1, 0)
                  else 0)
    nvml = _fake(values)
    monkeypatch.setattr(health, "nvml_index", lambda nvml, i: i)
    mon = health.Monitor(types.SimpleNamespace(type="cuda", index=2), nvml=nvml, say=pytest.fail)
    assert nvml.calls[0] == "init" and mon.index == 2
    assert [mon.check() for _ in range(4)] == [[], [], ["1 uncorrected ECC error since the last window"], []]
    mon.tell()  # nothing missing: nothing said


def test_a_device_nvml_cannot_open_is_said_once_and_never_read_again(monkeypatch):
    said = []
    nvml = _fake(HEALTHY)

    def gone(i):
        raise _NVMLError("GPU is lost")
    nvml.nvmlDeviceGetHandleByIndex = gone
    monkeypatch.setattr(health, "nvml_index", lambda nvml, i: i)
    mon = health.Monitor(types.SimpleNamespace(type="cuda", index=1), nvml=nvml, say=said.append)
    assert [mon.check() for _ in range(3)] == [[], [], []]
    mon.tell()
    assert said == ["health: NVML cannot read device 1 (GPU is lost) — GPU health not read"]


def test_the_names_and_bits_are_nvml_s_own():
    """Where nvidia-ml-py is installed (the `gpu` extra): every function and constant read here exists in it, and the
    reasons' bits are its nvmlClocksEventReason* values."""
    pynvml = pytest.importorskip("pynvml")
    import inspect
    import re
    src = inspect.getsource(health)
    names = set(re.findall(r'"(nvml\w+|NVML_\w+)"', src)) | set(re.findall(r"nvml\.(nvml\w+|NVML_\w+)", src))
    assert names and not [n for n in names if not hasattr(pynvml, n)]
    ours = dict((name, bit) for bit, name in health.REASONS)
    theirs = {"idle": "GpuIdle", "applications clocks": "ApplicationsClocksSetting", "power cap": "SwPowerCap",
              "HW slowdown": "HwSlowdown", "sync boost": "SyncBoost", "SW thermal slowdown": "SwThermalSlowdown",
              "HW thermal slowdown": "HwThermalSlowdown", "HW power brake": "HwPowerBrakeSlowdown",
              "display clocks": "DisplayClockSetting"}
    assert {n: getattr(pynvml, "nvmlClocksEventReason" + t) for n, t in theirs.items()} == ours
