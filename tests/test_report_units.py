"""The one formatter each of counts, bytes, FLOPs and seconds (compiler/report/units.py): the texts the goldens of
`plan` and `search` rely on, including where the two reports deliberately differ."""
from __future__ import annotations

import pytest

from compiler.report.units import count, flops, nbytes, seconds


@pytest.mark.parametrize("n, unit, text", [
    (0, "", "0"), (999, "B", "999 B"), (1000, "B", "1 kB"), (174_558_289_920, "", "174.6 G"),
    (23_126_000_000, "B", "23.13 GB"), (3.2e15, "FLOP", "3.2 PFLOP"), (-2.5e6, "B", "-2.5 MB"),
])
def test_count_scales_by_si_prefixes_to_four_digits(n, unit, text):
    assert count(n, unit) == text


def test_bytes_either_scale_or_stay_in_gigabytes():
    assert nbytes(81_234_000_000) == "81.23 GB"           # the plan's tables: 4 digits, any prefix
    assert nbytes(81_234_000_000, gigabytes=True) == "81.2 GB"  # search's verdicts: GB to 3 digits
    assert nbytes(512_000, gigabytes=True) == "0.000512 GB"
    assert nbytes(80e9, gigabytes=True, unit=False) == "80"


def test_flops_in_si_or_scientific():
    assert flops(3.145e17) == "314.5 PFLOP"
    assert flops(3.145e20) == "3.145e+05 PFLOP"  # P is the largest prefix: beyond it, 4 digits in exponent form
    assert flops(3.14496e20, scientific=True) == "3.1450e+20 FLOP"
    assert flops(1e18, scientific=True, what="hardware FLOP") == "1.0000e+18 hardware FLOP"


@pytest.mark.parametrize("t, search, plan", [
    (14.62, "14.6 s", "14.6 s"), (1.0, "1 s", "1 s"), (0.352, "352 ms", "352 ms"), (1e-3, "1 ms", "1 ms"),
    (0.000412, "412 µs", "0.412 ms"), (4.1e-5, "41 µs", "0.041 ms"),
])
def test_seconds_go_down_to_microseconds_except_in_plan(t, search, plan):
    assert seconds(t) == search
    assert seconds(t, smallest="ms") == plan
