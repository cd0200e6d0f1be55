"""What the three command lines share: ``--set``/``--plan`` options and the error contract.

``run_cli`` turns a user's mistake (a ``DappleError``) into one line on stderr and exit code
2, a broken schedule into that line and its rank × step grid, and an interrupt into 130;
``add_scenario_options`` and ``parse_overrides`` give ``dapple-sim``, ``dapple-plan`` and
``dapple-run`` one definition of ``--set KEY=VALUE`` and ``--plan PLAN.json``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

from sim.errors import DappleError, ScheduleError

__all__ = ["add_scenario_options", "parse_overrides", "run_cli"]


def add_scenario_options(parser: argparse.ArgumentParser, *, example: str = "plan.schedule=gpipe",
                         plan: bool = True) -> None:
    """``--set KEY=VALUE`` (read by :func:`parse_overrides`) and, with ``plan``, ``--plan PLAN.json``."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help=f"override a dotted key of the scenario, e.g. {example} (repeatable)")
    if plan:
        parser.add_argument("--plan", metavar="PLAN.json",
                            help="replace the scenario's plan with a plan file (dapple-plan's output)")


def parse_overrides(items: Sequence[str]) -> dict[str, str]:
    """``["a.b=1", ...]`` from repeated ``--set`` flags -> ``{"a.b": "1"}`` (values stay YAML text)."""
    result: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise DappleError(f"--set {item!r}: write KEY=VALUE, e.g. --set training.microbatch_size=4 or plan.schedule=gpipe")
        result[key.strip()] = value
    return result


def run_cli(prog: str, handler: Callable[[], int]) -> int:
    """Run ``handler``; turn a user's mistake into one line on stderr and exit code 2."""
    try:
        return handler()
    except ScheduleError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        if exc.detail:
            print(exc.detail, file=sys.stderr)
        return 2
    except DappleError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
