"""Units: the conversions written out, and the errors a user sees for a typo."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.core.errors import UnitError
from sim.core.units import format_bytes, parse_bandwidth, parse_bytes, parse_flop_rate, parse_time


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16GiB", 16 * 2**30),
        ("80GB", 80e9),
        ("512MiB", 512 * 2**20),
        ("4096B", 4096.0),
        ("1.5kB", 1500.0),
        ("2 TiB", 2 * 2**40),
    ],
)
def test_bytes(text, expected):
    assert parse_bytes(text) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("25GB/s", 25e9),
        ("25Gb/s", 25e9 / 8),  # bits
        ("25Gbps", 25e9 / 8),
        ("400Gb/s", 50e9),
        ("900GB/s", 900e9),
        ("16GiB/s", 16 * 2**30),
    ],
)
def test_bandwidth(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("125TFLOP/s", 125e12), ("15.7TFLOPS", 15.7e12), ("1PFLOP/s", 1e15), ("989e12FLOP/s", 989e12)],
)
def test_flop_rate(text, expected):
    assert parse_flop_rate(text) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("5us", 5e-6), ("5µs", 5e-6), ("2ms", 2e-3), ("0.5s", 0.5), ("100ns", 1e-7), ("-5us", -5e-6)],
)
def test_time(text, expected):
    assert parse_time(text) == pytest.approx(expected, rel=1e-12)


def test_bare_number_needs_a_default_unit():
    with pytest.raises(UnitError, match="has no unit"):
        parse_bytes(16)
    assert parse_bytes(16, default_unit="GiB") == 16 * 2**30
    assert parse_time("3", default_unit="ms") == pytest.approx(3e-3)


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (parse_bytes, "16GB/s", "that is a bandwidth unit"),
        (parse_bandwidth, "25GB", "that is a bytes unit"),
        (parse_bandwidth, "25Gbs", "unknown bandwidth unit 'Gbs'"),
        (parse_time, "5 parsecs", "unknown time unit"),
        (parse_flop_rate, "lots", "cannot read"),
        (parse_bytes, True, "not a bytes quantity"),
        (parse_bytes, [16], "not a bytes quantity"),
        (parse_bytes, "1e400GB", "not a finite"),
    ],
)
def test_errors_name_the_problem(parse, text, message):
    with pytest.raises(UnitError, match=message):
        parse(text)


def test_case_carries_meaning():
    assert parse_bandwidth("8Mb/s") == pytest.approx(1e6)  # megabits
    assert parse_bandwidth("8MB/s") == pytest.approx(8e6)  # megabytes
    assert parse_time("1ms") != parse_time("1s")


@given(st.floats(min_value=1.0, max_value=1e15, allow_nan=False))
def test_format_bytes_round_trips(value):
    assert parse_bytes(format_bytes(value, digits=12)) == pytest.approx(value, rel=1e-9)
