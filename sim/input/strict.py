"""Strict reading of a user's mapping: every error names the file and the dotted key.

A ``StrictReader`` wraps one source file. Its helpers read one key each (an integer, a
string from a fixed set, a quantity with units, a path) and raise ``ScenarioError`` with
``FILE: dotted.key: problem; what would be valid``. Unknown keys get a did-you-mean
suggestion from ``difflib``. Spec constructors raise ``SpecError`` keyed by their field;
``StrictReader.build`` prefixes the section so the user sees the full dotted key.

Every number has a range, checked where it is read (``docs/scenario.md`` lists them): an
integer is at most ``MAX_INTEGER`` unless its reader says otherwise, a plain number is read
with its range (``number``), a quantity with its kind's range (``QUANTITY_RANGES``) or its
own. A value is compared with its range before it is converted, so a 400-digit integer is out
of range rather than an overflow. What a message echoes of a user's value is bounded
(``show_value``, ``show_text``): a value that aliases expand to 10⁹ items, or a key of 100 000
characters, is shown in at most 60 characters without ever being expanded.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Callable

from sim.core.errors import DappleError, ScenarioError, SpecError
from sim.core.units import parse_bandwidth, parse_bytes, parse_flop_rate, parse_time
from sim.core.userfiles import INPUT_MAX_BYTES, show_path, user_file_problem

__all__ = ["DATA_DIR", "MAX_INTEGER", "MISSING", "QUANTITY_RANGES", "StrictReader", "closest", "device_ids", "did_you_mean",
           "join_key",
           "show_text", "show_value"]

MAX_INTEGER = 10**9
"""Largest integer a key takes unless its reader gives another bound (batch sizes, degrees)."""

QUANTITY_RANGES: dict[Callable, tuple[float, float, str]] = {
    parse_bytes: (2.0**20, 2.0**50, "1MiB to 1PiB"),
    parse_bandwidth: (1.0, 1e15, "1B/s to 1PB/s"),
    parse_flop_rate: (1e9, 1e18, "1GFLOP/s to 1000PFLOP/s"),
    parse_time: (0.0, 10.0, "0s to 10s"),
}
"""Each quantity kind's valid range, inclusive, and how the message says it; a reader may
give a key its own (overheads 0s to 1s, fault times 0s to 1e6s)."""

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
        """``FILE: key: problem`` in one line; a spec's problem that quotes a huge value is cut."""
        return ScenarioError(f"{self.source}: {show_text(key, 200)}: {show_text(problem, MESSAGE_CHARS)}")

    def mapping(self, value: Any, key: str) -> dict:
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a mapping of keys, got {show_value(value)}")
        return value

    def keys(self, data: dict, key: str, *, allowed: set[str], required: set[str] = frozenset()) -> None:
        for name in sorted(data, key=lambda k: k[:200] if isinstance(k, str) else show_value(k, 200)):
            if name not in allowed:
                shown = show_text(str(name)) if isinstance(name, str) else show_value(name)
                raise self.fail(join_key(key, shown), f"unknown key; {did_you_mean(shown, allowed)}valid: {', '.join(sorted(allowed))}")
        for name in sorted(required):
            if name not in data or data[name] is None:
                raise self.fail(join_key(key, name), "missing; add it")

    def integer(self, data: dict, key: str, name: str, default: Any = MISSING, *, minimum: int = 1,
                maximum: int = MAX_INTEGER) -> int:
        value = data.get(name, default)
        if value is MISSING:
            raise self.fail(join_key(key, name), f"missing; add an integer >= {minimum}")
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(join_key(key, name), f"must be an integer >= {minimum}, got {show_value(value)}")
        if value < minimum:
            raise self.fail(join_key(key, name), f"must be an integer >= {minimum}, got {show_value(value)}")
        if value > maximum:
            raise self.fail(join_key(key, name), f"must be an integer from {minimum} to {maximum:,}, "
                                                 f"got {show_value(value)}")
        return value

    def string(self, data: dict, key: str, name: str, default: Any = MISSING, *, choices=None) -> str:
        value = data.get(name, default)
        if value is MISSING:
            raise self.fail(join_key(key, name), "missing; add it")
        if not isinstance(value, str) or not value:
            raise self.fail(join_key(key, name), f"must be a non-empty string, got {show_value(value)}")
        if choices is not None and value not in choices:
            raise self.fail(join_key(key, name), f"unknown value {show_value(value)}; {did_you_mean(value, choices)}"
                                                 f"valid: {', '.join(sorted(choices))}")
        return value

    def number(self, data: dict, key: str, name: str, default: Any = MISSING, *, low: float, high: float,
               low_open: bool = False) -> float:
        """A plain number (no unit), such as an efficiency or a slowdown factor, in
        ``[low, high]`` (``(low, high]`` with ``low_open``); NaN and infinities are out of range."""
        value = data.get(name, default)
        span = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        if value is MISSING:
            raise self.fail(join_key(key, name), f"missing; add a number in {span}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(join_key(key, name), f"must be a number in {span}, got {show_value(value)}")
        if not (low < value if low_open else low <= value) or not value <= high:  # compared before float(): no overflow
            raise self.fail(join_key(key, name), f"must be a number in {span}, got {show_value(value)}")
        return float(value)

    def boolean(self, data: dict, key: str, name: str, default: bool) -> bool:
        value = data.get(name, default)
        if not isinstance(value, bool):
            raise self.fail(join_key(key, name), f"must be true or false, got {show_value(value)}")
        return value

    def quantity(self, data: dict, key: str, name: str, parse: Callable, default: Any = MISSING, *,
                 bounds: tuple[float, float, str] | None = None, allow_zero: bool = False) -> float:
        """A quantity with its unit, in ``bounds`` (low, high, how the range reads), by
        default its kind's ``QUANTITY_RANGES``; ``allow_zero`` lets a size or rate be 0."""
        value = data.get(name, default)
        if value is MISSING or value is None:
            raise self.fail(join_key(key, name), f"missing; add it with a unit, e.g. {EXAMPLES[parse]}")
        try:
            number = parse(value)
        except DappleError as exc:
            raise self.fail(join_key(key, name), str(exc)) from None
        if allow_zero and number == 0:
            return 0.0
        if number <= 0 and parse is not parse_time:
            raise self.fail(join_key(key, name), f"must be positive, got {show_value(value)}")
        if number < 0:
            raise self.fail(join_key(key, name), f"must not be negative, got {show_value(value)}")
        low, high, span = bounds or QUANTITY_RANGES[parse]
        if not low <= number <= high:
            raise self.fail(join_key(key, name), f"must be from {span}, got {show_value(value)}")
        return number

    def path(self, value: Any, key: str, *, data_fallback: bool, max_bytes: int = INPUT_MAX_BYTES) -> Path:
        """A regular file of at most ``max_bytes`` (a device, a FIFO or a folder is refused here,
        before anyone opens it)."""
        if not isinstance(value, str) or not value:
            raise self.fail(key, f"must be a file path, got {show_value(value)}")
        if "\0" in value:
            raise self.fail(key, f"the path {show_value(value)} holds a NUL byte")
        candidate = Path(value)
        if not candidate.is_absolute():
            candidate = self.base_dir / candidate
        problem = user_file_problem(candidate, max_bytes=max_bytes)
        if problem is not None and _not_there(problem) and data_fallback and not Path(value).is_absolute():
            shipped = DATA_DIR / value
            if user_file_problem(shipped, max_bytes=max_bytes) is None:
                return shipped
        if problem is None:
            return candidate
        if _not_there(problem):
            where = f" (also looked in {DATA_DIR})" if data_fallback else ""
            raise self.fail(key, f"file {show_path(value)!r} not found beside the scenario{where}")
        raise self.fail(key, f"cannot read {show_path(value)!r}: {problem}")

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
            if not _decimal(lo) or (hi and not _decimal(hi)):
                raise reader.fail(key, f"cannot read {show_value(value)}; write a list [0, 1] or ranges '0-7, 16-23'")
            first, last = int(lo), int(hi) if hi else int(lo)
            if last < first:
                raise reader.fail(key, f"range {show_text(part.strip())!r} runs backwards; write low-high")
            if last >= count:
                raise reader.fail(key, f"device {last} does not exist; the cluster has devices 0 to {count - 1}")
            if len(devices) + last - first + 1 > count:  # counted before the range is expanded
                raise reader.fail(key, _too_many(count))
            devices.extend(range(first, last + 1))
        return tuple(devices)
    if not isinstance(value, list) or not value:
        raise reader.fail(key, f"must be a non-empty list of device ids, got {show_value(value)}")
    if len(value) > count:
        raise reader.fail(key, _too_many(count))
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int):
            raise reader.fail(key, f"device ids are integers, got {show_value(item)} in {show_value(value)}")
        if not 0 <= item < count:
            raise reader.fail(key, f"device {item} does not exist; the cluster has devices 0 to {count - 1}")
    return tuple(value)


def _decimal(text: str) -> bool:
    """``text`` (stripped) is an ASCII decimal of at most 18 digits (``'²'.isdigit()`` is true)."""
    text = text.strip()
    return text.isascii() and text.isdigit() and len(text) <= 18


def _too_many(count: int) -> str:
    return (f"lists more device ids than the cluster's {count} devices; a device belongs to one stage, "
            "listed once")


def _not_there(problem: str) -> bool:
    """A path problem the user sees as "not found" (a folder is not a file either)."""
    return problem == "no such file" or problem.startswith("it is a folder")


EXAMPLES = {parse_bytes: "16GiB", parse_bandwidth: "25GB/s", parse_flop_rate: "125TFLOP/s", parse_time: "5us"}


def join_key(prefix: str, name: Any) -> str:
    return f"{prefix}.{name}" if prefix else str(name)


def closest(word: Any, choices) -> str | None:
    """The choice closest to a misspelt ``word`` (difflib's ratio at least 0.6), or None."""
    guess = difflib.get_close_matches(show_text(str(word)), sorted(choices), n=1)
    return guess[0] if guess else None


def did_you_mean(word: Any, choices) -> str:
    """``"did you mean 'x'? "`` (:func:`closest`), or ``""`` when no choice is close: the
    start of an error's hint."""
    guess = closest(word, choices)
    return f"did you mean {guess!r}? " if guess else ""


SHOWN_CHARS = 60
"""Most characters of a user's value an error message shows."""
MESSAGE_CHARS = 600
"""Most characters of a problem's text (a spec's message may quote a whole value)."""


_LINE_BREAKS = {ord(c): repr(c)[1:-1] for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"}
"""What ``str.splitlines`` breaks at, each to its escape: an echoed key stays on the error's one line."""


def show_text(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` on one line (a line break written as its escape, ``\\n``) cut to ``limit``
    characters (a key of 100 000 characters is not echoed whole)."""
    text = text[: limit + 1].translate(_LINE_BREAKS)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def show_value(value: Any, limit: int = SHOWN_CHARS) -> str:
    """A short ``repr`` of ``value``: at most ``limit`` characters, built without expanding
    the value (a list that aliases repeat 10⁹ times costs as much as its first few items)."""
    parts: list[str] = []
    _shown(value, parts, limit + 1, depth=0)
    return show_text("".join(parts), limit)


def _shown(value: Any, parts: list[str], budget: int, depth: int) -> int:
    """Append ``value``'s repr to ``parts`` until ``budget`` characters are spent; returns what is left."""
    if budget <= 0:
        return 0
    if isinstance(value, (list, tuple, dict)) and depth < 20:
        opening, closing = ("{", "}") if isinstance(value, dict) else ("[", "]") if isinstance(value, list) else ("(", ")")
        parts.append(opening)
        budget -= 1
        items = value.items() if isinstance(value, dict) else value
        for index, item in enumerate(items):
            if budget <= 0:
                return 0
            if index:
                parts.append(", ")
                budget -= 2
            if isinstance(value, dict):
                budget = _shown(item[0], parts, budget, depth + 1)
                parts.append(": ")
                budget = _shown(item[1], parts, budget - 2, depth + 1)
            else:
                budget = _shown(item, parts, budget, depth + 1)
        parts.append(",)" if isinstance(value, tuple) and len(value) == 1 else closing)
        return budget - 1
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        text = f"<an integer of {len(str(abs(value))) if value.bit_length() < 13_000 else 'over 3900'} digits>"
    elif isinstance(value, str):
        text = repr(value[:budget])
    elif isinstance(value, (list, tuple, dict)):
        text = "[...]"
    else:
        text = repr(value)
    parts.append(text[:budget])
    return budget - len(text)
