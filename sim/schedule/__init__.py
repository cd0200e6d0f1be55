"""Pipeline schedules as data: the IR, its generators, lowering passes and the validator.

``generate("dapple", 4, 8)`` builds a compute schedule, ``lower`` adds sends, receives and
gradient reductions, ``validate`` rejects anything malformed or deadlocking, and
``str(schedule)`` / ``parse_schedule`` move it to and from the schedule file format (torch's
action text, one line per rank).
"""

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
from sim.schedule.validate import format_grid, validate

__all__ = [
    "COMM_KINDS",
    "COMPUTE_KINDS",
    "DAPPLE_POLICIES",
    "GENERATORS",
    "Action",
    "ActionKind",
    "Schedule",
    "dependencies",
    "format_grid",
    "generate",
    "lower",
    "parse_action",
    "parse_schedule",
    "strip_communication",
    "validate",
]
