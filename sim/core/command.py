"""What the three command lines share: ``--set``/``--plan`` options and the error contract.

``run_cli`` turns a user's mistake (a ``DappleError``) into one line on stderr and exit code
2, a broken schedule into that line and its rank × step grid, and an interrupt into 130;
``add_scenario_options`` and ``parse_overrides`` give ``dapple-sim``, ``dapple-plan`` and
``dapple-run`` one definition of ``--set KEY=VALUE`` and ``--plan PLAN.json``.

Saying what a long step is doing, the same way on every command:

* ``add_verbosity_options`` adds ``-v/--verbose`` and ``-q/--quiet`` (to a parser and to
  each of its subcommands, so both ``dapple-sim -v simulate`` and ``dapple-sim simulate -v``
  work) and ``configure_output`` applies them: ``-v`` logs every step and the seconds it
  took on stderr, ``-q`` prints the results and errors only;
* ``progress`` is a tqdm bar on stderr, only when stderr is a terminal and not ``-q``;
* ``Stopwatch`` times the phases of a command (``with watch.phase("replay"):``) and, with
  ``-v``, logs each and then where the time went (``time: replay 0.41 s (30%), plots ...``).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from typing import Callable, Sequence

from tqdm import tqdm

from sim.core.errors import DappleError, ScheduleError

__all__ = ["CommandParser", "MalformedOverride", "Stopwatch", "add_scenario_options", "add_verbosity_options",
           "configure_output", "parse_overrides", "positive_int", "progress", "quiet", "run_cli"]

_log = logging.getLogger("dapplesim")
_state = {"quiet": False}
_OURS = ("dapplesim", "sim", "planner", "runtime", "__main__")


def add_scenario_options(parser: argparse.ArgumentParser, *, example: str = "plan.schedule=gpipe",
                         plan: bool = True) -> None:
    """``--set KEY=VALUE`` (read by :func:`parse_overrides`) and, with ``plan``, ``--plan PLAN.json``."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help=f"override a dotted key of the scenario, e.g. {example} (repeatable)")
    if plan:
        parser.add_argument("--plan", metavar="PLAN.json",
                            help="replace the scenario's plan with a plan file (dapple-plan's output)")


def positive_int(text: str) -> int:
    """An integer ≥ 1 (an argparse ``type``: a bad value is argparse's usage error, exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer ≥ 1, got {value}")
    return value


class MalformedOverride:
    """A ``--set`` that is not KEY=VALUE, kept in :func:`parse_overrides`' result so that the
    scenario loader reports it naming the file it applies to (``FILE: --set 'x': write ...``)."""

    __slots__ = ("problem",)

    def __init__(self, problem: str) -> None:
        self.problem = problem

    def __repr__(self) -> str:
        return f"MalformedOverride({self.problem!r})"


def parse_overrides(items: Sequence[str]) -> dict[str, str]:
    """``["a.b=1", ...]`` from repeated ``--set`` flags -> ``{"a.b": "1"}`` (values stay YAML text).

    An item that is not KEY=VALUE maps to a ``MalformedOverride``: ``sim.input.scenario``
    reports it as the first problem of the scenario, naming the file."""
    result: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            shown = item if len(item) <= 60 else item[:57] + "..."
            result[item] = MalformedOverride(  # type: ignore[assignment]
                f"--set {shown!r}: write KEY=VALUE, e.g. --set training.microbatch_size=4 or plan.schedule=gpipe")
            continue
        result[key.strip()] = value
    return result


MESSAGE_LINE_CHARS = 2000
"""Longest line of an error message printed (the readers bound what they quote; this is the
last guard, so that no input fills a terminal)."""


def _bounded(message: str) -> str:
    return "\n".join(line if len(line) <= MESSAGE_LINE_CHARS else line[: MESSAGE_LINE_CHARS - 3] + "..."
                     for line in message.splitlines() or [""])


class CommandParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose error line is bounded as ``run_cli``'s are: an
    unknown argument of 5,000 characters is echoed in at most ``MESSAGE_LINE_CHARS``."""

    def error(self, message: str):
        super().error(_bounded(message))


def run_cli(prog: str, handler: Callable[[], int]) -> int:
    """Run ``handler``; turn a user's mistake into one line on stderr and exit code 2."""
    try:
        return handler()
    except ScheduleError as exc:
        print(f"{prog}: error: {_bounded(str(exc))}", file=sys.stderr)
        if exc.detail:
            print(exc.detail, file=sys.stderr)
        return 2
    except DappleError as exc:
        print(f"{prog}: error: {_bounded(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


# --- saying what a long step is doing -------------------------------------------------------


def add_verbosity_options(parser: argparse.ArgumentParser, *, subcommand: bool = False) -> None:
    """``-v/--verbose`` and ``-q/--quiet``. On a subcommand's parser (``subcommand=True``) they
    default to nothing, so that a flag given before the subcommand is not reset by it."""
    default = argparse.SUPPRESS if subcommand else False
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-v", "--verbose", action="store_true", default=default,
                       help="log each step and the seconds it took on stderr (where the time goes)")
    group.add_argument("-q", "--quiet", action="store_true", default=default,
                       help="print the results and errors only: no progress bars, no notes")


def configure_output(prog: str, args: argparse.Namespace) -> None:
    """Apply ``-v``/``-q``: the log level of stderr's messages and whether progress bars show."""
    verbose, silent = getattr(args, "verbose", False), getattr(args, "quiet", False)
    _state["quiet"] = bool(silent)
    level = logging.INFO if verbose else logging.ERROR if silent else logging.WARNING
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_dapplesim", False):
            root.removeHandler(handler)
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter(f"{prog}: %(message)s"))
    # our packages speak at INFO with -v; other libraries (dask, matplotlib) only when they warn
    handler.addFilter(lambda record: record.levelno >= logging.WARNING
                      or record.name.split(".", 1)[0] in _OURS)
    handler._dapplesim = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)


class _StderrHandler(logging.StreamHandler):
    """A stream handler on whatever ``sys.stderr`` is when a record comes (a test's capture,
    a redirected stream), not on the one it was made with."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def quiet() -> bool:
    """Whether ``-q`` was given (notes on stderr are then left out)."""
    return _state["quiet"]


def _bars_wanted() -> bool:
    return not _state["quiet"] and sys.stderr.isatty()


@contextlib.contextmanager
def progress(desc: str, total: int | None = None, *, unit: str = "step") -> Iterator[Callable[..., None] | None]:
    """A tqdm bar on stderr while the block runs, when stderr is a terminal and not ``-q``.

    Yields ``tick(n=1, desc=None)`` (advance, optionally renaming the bar), or None when no
    bar is shown, so callers can pass it on as an optional hook.
    """
    bar = None
    if _bars_wanted():
        try:
            columns = os.get_terminal_size(sys.stderr.fileno()).columns
        except (OSError, ValueError):
            columns = 0
        # a terminal that reports no size (a pty nobody sized) would hide the bar: 100 x 50 then
        sized = {} if columns > 0 else {"ncols": 100, "nrows": 50}
        bar = tqdm(desc=desc, total=total, unit=unit, leave=False, file=sys.stderr, dynamic_ncols=columns > 0,
                   **sized)
    if bar is None:
        yield None
        return

    def tick(n: int = 1, desc: str | None = None) -> None:
        if desc is not None:  # a new step's name is shown at once (a step may finish before the next refresh)
            bar.set_description_str(desc, refresh=True)
        bar.update(n)

    try:
        yield tick
    finally:
        bar.close()


class Stopwatch:
    """Seconds per phase of one command, logged with ``-v``.

    ``with watch.phase("replay"):`` times a block (and says it began, so that a long one is
    not silent); ``watch.report()`` logs where the time went, largest share first.
    """

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.phases: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str, *, into: str | None = None) -> Iterator[None]:
        """Time the block as ``name``; with ``into``, count it under that total (``into="plots"``
        for each of several figures) and log only its end."""
        if into is None:
            _log.info("%s ...", name)
        start = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - start
            total = into or name
            self.phases[total] = self.phases.get(total, 0.0) + seconds
            _log.info("%s: %.2f s", name, seconds)

    def add(self, name: str, seconds: float) -> None:
        """Count ``seconds`` spent elsewhere (a worker, a callback) under ``name``."""
        self.phases[name] = self.phases.get(name, 0.0) + seconds

    def report(self) -> str:
        """``time: replay 0.41 s (30%), plots 0.93 s (68%), total 1.37 s`` (phases in the order
        they ended); logged at INFO."""
        total = time.perf_counter() - self.started
        parts = [f"{name} {seconds:.2f} s ({seconds / total:.0%})" if total > 0 else f"{name} {seconds:.2f} s"
                 for name, seconds in self.phases.items()]  # in the order they ended
        text = "time: " + ", ".join(parts + [f"total {total:.2f} s"])
        _log.info("%s", text)
        return text
