"""Units: the one place where text such as ``16GiB``, ``25Gb/s`` or ``5us`` becomes a number.

Inside dapplesim every quantity is SI and carries its unit in its name: seconds (``_s``),
bytes (``_bytes``), FLOP (``_flop``), FLOP/s (``_flop_per_s``), bytes/s (``_bytes_per_s``).
Users write quantities the way vendors print them, and this module converts them:

===========  ===============================================  ======================
kind         accepted suffixes                                example -> SI value
===========  ===============================================  ======================
bytes        B, kB/MB/GB/TB (10^3), KiB/MiB/GiB/TiB (2^10)     ``16GiB`` -> 17179869184
bandwidth    B/s and b/s with the same prefixes; ``b`` = bits  ``25Gb/s`` -> 3.125e9 B/s
compute      FLOP/s, FLOPS with k/M/G/T/P prefixes             ``125TFLOP/s`` -> 1.25e14
time         s, ms, us (or µs), ns, min, h, d                  ``5us`` -> 5e-06
power        W, kW, MW                                        ``0.7kW`` -> 700.0 W
count        none, k, M, B or G (10^9), T                     ``15T`` -> 1.5e13
===========  ===============================================  ======================

A bare number is accepted only where the caller says which unit it is in (``default_unit``),
so that ``memory: 16`` is an error rather than sixteen bytes. Case matters where it carries
meaning (``b`` is a bit, ``B`` a byte; ``m`` is milli, ``M`` mega).
"""

from __future__ import annotations

import math
import re

from sim.core.errors import UnitError

__all__ = [
    "parse_bytes",
    "parse_bandwidth",
    "parse_flop_rate",
    "parse_time",
    "parse_quantity",
    "parse_power",
    "parse_count",
    "format_bytes",
    "format_time",
    "format_bandwidth",
    "format_flop_rate",
]

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60.0, "h": 3600.0, "d": 86400.0}
_POWER = {"W": 1.0, "kW": 1e3, "MW": 1e6}
_COUNT = {"": 1.0, "k": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}

_NUMBER = r"(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"
_QUANTITY = re.compile(_NUMBER + r"\s*(?P<unit>\S*)$")

_BYTE_UNITS = {p + "B": f for p, f in {**_DECIMAL, **_BINARY}.items()}
_BANDWIDTH_UNITS = {
    **{p + "B/s": f for p, f in {**_DECIMAL, **_BINARY}.items()},
    **{p + "b/s": f / 8.0 for p, f in {**_DECIMAL, **_BINARY}.items()},
    **{p + "bps": f / 8.0 for p, f in _DECIMAL.items()},
}
_FLOP_UNITS = {
    **{p + "FLOP/s": f for p, f in _DECIMAL.items()},
    **{p + "FLOPS": f for p, f in _DECIMAL.items()},
    **{p + "FLOP/S": f for p, f in _DECIMAL.items()},
}

_KINDS = {
    "bytes": (_BYTE_UNITS, "16GiB, 512MB or 4096B"),
    "bandwidth": (_BANDWIDTH_UNITS, "25GB/s (bytes) or 100Gb/s (bits)"),
    "compute": (_FLOP_UNITS, "125TFLOP/s or 15.7TFLOPS"),
    "time": (_TIME, "5us, 2ms or 0.5s"),
    "power": (_POWER, "700W or 0.7kW"),
    "count": (_COUNT, "15T, 1.5e13 or 300B"),
}


def parse_quantity(value: object, kind: str, *, default_unit: str | None = None) -> float:
    """Convert ``value`` (text such as ``25Gb/s`` or a number) of ``kind`` to its SI value.

    ``kind`` is one of ``bytes``, ``bandwidth``, ``compute``, ``time``. A bare number (or a
    numeric string without a unit) is read in ``default_unit``; without one it is an error.
    Raises ``UnitError`` naming the value and examples of valid spellings.
    """
    units, examples = _KINDS[kind]
    if isinstance(value, bool):
        raise UnitError(f"{value!r} is not a {kind} quantity; write e.g. {examples}")
    shown = _shown(value)
    if isinstance(value, (int, float)):
        try:
            number, unit = float(value), ""
        except OverflowError:  # an integer of more than 308 digits
            raise UnitError(f"{shown} is not a finite {kind}; write e.g. {examples}") from None
    elif isinstance(value, str):
        match = _QUANTITY.match(value.strip()) if len(value) <= _MAX_CHARS else None
        if match is None:
            raise UnitError(f"cannot read {shown} as {kind}; write e.g. {examples}")
        number, unit = float(match["num"]), match["unit"]
    else:
        raise UnitError(f"{shown} is not a {kind} quantity; write e.g. {examples}")
    if unit == "":
        if default_unit is None:
            raise UnitError(f"{shown} has no unit; write e.g. {examples}")
        unit = default_unit
    factor = units.get(unit)
    if factor is None:
        hint = _unit_hint(unit, kind)
        raise UnitError(f"unknown {kind} unit {_shown(unit)} in {shown}{hint}; write e.g. {examples}")
    result = number * factor
    if not math.isfinite(result):
        raise UnitError(f"{shown} is not a finite {kind}; write e.g. {examples}")
    return result


_MAX_CHARS = 100
"""Longest quantity text read (``16GiB`` is 5 characters)."""


def _shown(value: object) -> str:
    """``repr(value)`` for a message, at most 60 characters, never a 4300-digit integer's text."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"<an integer of {len(str(abs(value))) if value.bit_length() < 13_000 else 'over 3900'} digits>"
    if isinstance(value, str):
        value = value[:60]
    text = repr(value) if isinstance(value, (str, int, float)) else f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


def _unit_hint(unit: str, kind: str) -> str:
    """Say which kind a misplaced unit belongs to (``25GB/s`` given where bytes are expected)."""
    for other, (units, _) in _KINDS.items():
        if other != kind and unit in units:
            return f" (that is a {other} unit)"
    return ""


def parse_bytes(value: object, *, default_unit: str | None = None) -> float:
    """Bytes from ``16GiB``, ``80GB``, ``4096B`` (decimal k/M/G/T, binary Ki/Mi/Gi/Ti)."""
    return parse_quantity(value, "bytes", default_unit=default_unit)


def parse_bandwidth(value: object, *, default_unit: str | None = None) -> float:
    """Bytes per second from ``25GB/s`` (bytes) or ``25Gb/s`` / ``25Gbps`` (bits: divided by 8)."""
    return parse_quantity(value, "bandwidth", default_unit=default_unit)


def parse_flop_rate(value: object, *, default_unit: str | None = None) -> float:
    """FLOP per second from ``125TFLOP/s`` or ``125TFLOPS``."""
    return parse_quantity(value, "compute", default_unit=default_unit)


def parse_time(value: object, *, default_unit: str | None = None) -> float:
    """Seconds from ``5us``, ``2ms``, ``0.5s`` (also ``ns``, ``µs``, ``min``, ``h``)."""
    return parse_quantity(value, "time", default_unit=default_unit)


def parse_power(value: object, *, default_unit: str | None = None) -> float:
    """Watts from ``700W``, ``0.7kW`` or ``1.2MW``."""
    return parse_quantity(value, "power", default_unit=default_unit)


def parse_count(value: object) -> float:
    """A plain count from ``1.5e13``, ``15T``, ``300B`` (billion) or ``2M`` (token counts)."""
    return parse_quantity(value, "count", default_unit="")


def _format(value: float, steps: list[tuple[float, str]], digits: int) -> str:
    for factor, suffix in steps:
        if abs(value) >= factor:
            return f"{value / factor:.{digits}g}{suffix}"
    factor, suffix = steps[-1]
    return f"{value / factor:.{digits}g}{suffix}"


def format_bytes(value_bytes: float, digits: int = 4) -> str:
    """``17179869184`` -> ``16GiB`` (binary prefixes, as memory is sold and reported)."""
    steps = [(2.0**40, "TiB"), (2.0**30, "GiB"), (2.0**20, "MiB"), (2.0**10, "KiB"), (1.0, "B")]
    return _format(value_bytes, steps, digits)


def format_time(value_s: float, digits: int = 4) -> str:
    """``0.0123`` -> ``12.3ms``."""
    steps = [(1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns")]
    return _format(value_s, steps, digits)


def format_bandwidth(value_bytes_per_s: float, digits: int = 4) -> str:
    """``3.125e9`` -> ``3.125GB/s`` (decimal prefixes, as links are sold)."""
    steps = [(1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s"), (1.0, "B/s")]
    return _format(value_bytes_per_s, steps, digits)


def format_flop_rate(value_flop_per_s: float, digits: int = 4) -> str:
    """``1.25e14`` -> ``125TFLOP/s``."""
    steps = [(1e15, "PFLOP/s"), (1e12, "TFLOP/s"), (1e9, "GFLOP/s"), (1.0, "FLOP/s")]
    return _format(value_flop_per_s, steps, digits)
