"""Pipeline schedules as data: the IR, its generators, lowering passes and the checker.

``generate("dapple", 4, 8)`` builds a compute schedule, ``lower`` adds sends, receives and
gradient reductions, ``check_schedule`` rejects anything malformed or deadlocking, and
``str(schedule)`` / ``parse_schedule`` move it to and from the schedule file format (torch's
action text, one line per rank).
"""

from sim.schedule.check import check_schedule, format_grid
from sim.schedule.generators import DAPPLE_POLICIES, GENERATORS, generate
from sim.schedule.ir import (
    COMM_KINDS,
    COMPUTE_KINDS,
    Action,
    ActionKind,
    Schedule,
    dependencies,
    parse_action,
    parse_schedule,
)
from sim.schedule.passes import lower, strip_communication
from sim.schedule.policy import DapplePolicy

__all__ = [
    "COMM_KINDS",
    "COMPUTE_KINDS",
    "DAPPLE_POLICIES",
    "GENERATORS",
    "Action",
    "ActionKind",
    "DapplePolicy",
    "Schedule",
    "check_schedule",
    "dependencies",
    "format_grid",
    "generate",
    "lower",
    "parse_action",
    "parse_schedule",
    "strip_communication",
]
