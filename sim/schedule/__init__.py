"""Pipeline schedules as data: the IR, its generators, lowering passes and the checker.

``generate("dapple", 4, 8)`` builds a compute schedule, ``lower`` adds sends, receives and
gradient reductions, ``check_schedule`` rejects anything malformed or deadlocking, and
``str(schedule)`` / ``parse_schedule`` move it to and from the schedule file format (torch's
action text, one line per rank); ``to_csv`` / ``parse_csv`` do the same for torch's
pipeline-order CSV.
"""

from sim.schedule.check import check_schedule, format_grid
from sim.schedule.generators import DAPPLE_POLICIES, GENERATORS, generate
from sim.schedule.ir import (
    COMM_KINDS,
    COMPUTE_KINDS,
    Action,
    ActionKind,
    OverlapFB,
    Schedule,
    Step,
    dependencies,
)
from sim.schedule.passes import lower, strip_communication
from sim.schedule.policy import DapplePolicy, choose_dapple_policies
from sim.schedule.text import parse_action, parse_schedule
from sim.schedule.torch_csv import parse_csv, to_csv

__all__ = [
    "COMM_KINDS",
    "COMPUTE_KINDS",
    "DAPPLE_POLICIES",
    "GENERATORS",
    "Action",
    "ActionKind",
    "DapplePolicy",
    "OverlapFB",
    "Schedule",
    "Step",
    "check_schedule",
    "choose_dapple_policies",
    "dependencies",
    "format_grid",
    "generate",
    "lower",
    "parse_action",
    "parse_csv",
    "parse_schedule",
    "strip_communication",
    "to_csv",
]
