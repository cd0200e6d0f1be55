"""Project errors: a user's mistake is a ``DappleError`` (a ``ValueError``), a bug is anything else.

The command line catches ``DappleError`` and prints its message as one line (exit code 2);
any other exception is ours and keeps its traceback.
"""

from __future__ import annotations

__all__ = ["DappleError", "ScenarioError", "ScheduleError", "SpecError", "UnitError"]


class DappleError(ValueError):
    """Bad input from a user: the message names what is wrong and how to fix it."""


class UnitError(DappleError):
    """A quantity such as ``16GiB`` or ``25Gb/s`` could not be read."""


class SpecError(DappleError):
    """A spec field holds an invalid value; ``key`` is the field's (dotted) name.

    Spec constructors raise it; the scenario loader adds the file and the section in front
    of ``key`` so that the user sees ``run.yaml: cluster.nodes: ...``.
    """

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem


class ScenarioError(DappleError):
    """A scenario file (or an override of one of its keys) is malformed or impossible."""


class ScheduleError(DappleError):
    """A schedule is malformed or would deadlock.

    ``detail`` holds extra lines (the rank × step grid) shown after the one-line message.
    """

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail
