"""Strict reading of a user's mapping: every error names the file and the dotted key.

A ``StrictReader`` wraps one source file. Its helpers read one key each (an integer, a
string from a fixed set, a quantity with units, a path) and raise ``ScenarioError`` with
``FILE: dotted.key: problem; what would be valid``. Unknown keys get a did-you-mean
suggestion from ``difflib``. Spec constructors raise ``SpecError`` keyed by their field;
``StrictReader.build`` prefixes the section so the user sees the full dotted key.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Callable

from sim.errors import DappleError, ScenarioError, SpecError
from sim.units import parse_bandwidth, parse_bytes, parse_flop_rate, parse_time

__all__ = ["DATA_DIR", "MISSING", "StrictReader", "device_ids", "join_key", "show_value"]

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
"""Files shipped with the package (profiles); a relative path not found beside the scenario is looked up here."""

MISSING = object()
"""Marks an argument the caller did not give (``None`` can be a real value)."""


class StrictReader:
    """Reads one file: every error it raises starts with the file name and the dotted key."""

    def __init__(self, source: str, base_dir: Path) -> None:
        self.source = source
        self.base_dir = base_dir

    def fail(self, key: str, problem: str) -> ScenarioError:
        return ScenarioError(f"{self.source}: {key}: {problem}")

    def mapping(self, value: Any, key: str) -> dict:
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a mapping of keys, got {show_value(value)}")
        return value

    def keys(self, data: dict, key: str, *, allowed: set[str], required: set[str] = frozenset()) -> None:
        for name in sorted(data, key=str):
            if name not in allowed:
                guess = difflib.get_close_matches(str(name), sorted(allowed), n=1)
                hint = f"did you mean {guess[0]!r}? " if guess else ""
                raise self.fail(join_key(key, name), f"unknown key; {hint}valid: {', '.join(sorted(allowed))}")
        for name in sorted(required):
            if name not in data or data[name] is None:
                raise self.fail(join_key(key, name), "missing; add it")

    def integer(self, data: dict, key: str, name: str, default: Any = MISSING, *, minimum: int = 1) -> int:
        value = data.get(name, default)
        if value is MISSING:
            raise self.fail(join_key(key, name), f"missing; add an integer >= {minimum}")
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(join_key(key, name), f"must be an integer >= {minimum}, got {show_value(value)}")
        if value < minimum:
            raise self.fail(join_key(key, name), f"must be an integer >= {minimum}, got {value}")
        return value

    def string(self, data: dict, key: str, name: str, default: Any = MISSING, *, choices=None) -> str:
        value = data.get(name, default)
        if value is MISSING:
            raise self.fail(join_key(key, name), "missing; add it")
        if not isinstance(value, str) or not value:
            raise self.fail(join_key(key, name), f"must be a non-empty string, got {show_value(value)}")
        if choices is not None and value not in choices:
            guess = difflib.get_close_matches(value, sorted(choices), n=1)
            hint = f"did you mean {guess[0]!r}? " if guess else ""
            raise self.fail(join_key(key, name), f"unknown value {value!r}; {hint}valid: {', '.join(sorted(choices))}")
        return value

    def number(self, data: dict, key: str, name: str, default: Any = MISSING) -> float:
        """A plain number (no unit), such as an efficiency or a slowdown factor."""
        value = data.get(name, default)
        if value is MISSING:
            raise self.fail(join_key(key, name), "missing; add a number")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(join_key(key, name), f"must be a number, got {show_value(value)}")
        return float(value)

    def boolean(self, data: dict, key: str, name: str, default: bool) -> bool:
        value = data.get(name, default)
        if not isinstance(value, bool):
            raise self.fail(join_key(key, name), f"must be true or false, got {show_value(value)}")
        return value

    def quantity(self, data: dict, key: str, name: str, parse: Callable, default: Any = MISSING) -> float:
        value = data.get(name, default)
        if value is MISSING or value is None:
            raise self.fail(join_key(key, name), f"missing; add it with a unit, e.g. {EXAMPLES[parse]}")
        try:
            number = parse(value)
        except DappleError as exc:
            raise self.fail(join_key(key, name), str(exc)) from None
        if number <= 0 and parse is not parse_time:
            raise self.fail(join_key(key, name), f"must be positive, got {show_value(value)}")
        if number < 0:
            raise self.fail(join_key(key, name), f"must not be negative, got {show_value(value)}")
        return number

    def path(self, value: Any, key: str, *, data_fallback: bool) -> Path:
        if not isinstance(value, str) or not value:
            raise self.fail(key, f"must be a file path, got {show_value(value)}")
        candidate = Path(value)
        if not candidate.is_absolute():
            candidate = self.base_dir / candidate
        if not candidate.is_file() and data_fallback and not Path(value).is_absolute():
            shipped = DATA_DIR / value
            if shipped.is_file():
                return shipped
        if not candidate.is_file():
            where = f" (also looked in {DATA_DIR})" if data_fallback else ""
            raise self.fail(key, f"file {value!r} not found beside the scenario{where}")
        return candidate

    def build(self, key: str, constructor: Callable, **fields: Any):
        """Call a spec constructor, turning its ``SpecError`` into a keyed scenario error."""
        try:
            return constructor(**fields)
        except SpecError as exc:
            raise self.fail(join_key(key, exc.key), exc.problem) from None


def device_ids(reader: StrictReader, value: Any, key: str, count: int) -> tuple[int, ...]:
    """Device ids from a list (``[0, 1, 2]``), an integer, or ranges text (``"0-7, 16-23"``);
    ids must be below ``count`` (checked before a range is expanded)."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if isinstance(value, str):
        devices: list[int] = []
        for part in value.split(","):
            lo, _, hi = part.strip().partition("-")
            if not lo.strip().isdigit() or (hi and not hi.strip().isdigit()):
                raise reader.fail(key, f"cannot read {value!r}; write a list [0, 1] or ranges '0-7, 16-23'")
            first, last = int(lo), int(hi) if hi else int(lo)
            if last < first:
                raise reader.fail(key, f"range {part.strip()!r} runs backwards; write low-high")
            if last >= count:
                raise reader.fail(key, f"device {last} does not exist; the cluster has devices 0 to {count - 1}")
            devices.extend(range(first, last + 1))
        return tuple(devices)
    if not isinstance(value, list) or not value:
        raise reader.fail(key, f"must be a non-empty list of device ids, got {show_value(value)}")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int):
            raise reader.fail(key, f"device ids are integers, got {show_value(item)} in {show_value(value)}")
        if not 0 <= item < count:
            raise reader.fail(key, f"device {item} does not exist; the cluster has devices 0 to {count - 1}")
    return tuple(value)


EXAMPLES = {parse_bytes: "16GiB", parse_bandwidth: "25GB/s", parse_flop_rate: "125TFLOP/s", parse_time: "5us"}


def join_key(prefix: str, name: Any) -> str:
    return f"{prefix}.{name}" if prefix else str(name)


def show_value(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
