"""torch's pipeline-order CSV: the schedule file that ``torch.distributed.pipelining`` reads.

torch keeps a schedule as ``pipeline_order``, rank → list of actions, and moves it through a
CSV: ``_PipelineScheduleRuntime._load_csv(path, format)`` reads one row per rank, in rank
order, one action per cell in the text our IR shares (``2F0``, ``(0F7;7B3)OVERLAP_F_B``), and
``_dump_csv`` writes it back with Python's ``csv`` module (excel dialect: commas, CRLF line
ends), an empty cell for each idle slot (``None``). ``format="compute_only"`` holds F, B, I, W
and pairs, which torch lowers itself; ``"compute_comms"`` holds sends, receives and
``REDUCE_GRAD`` as well — our lowered schedules (``sim.schedule.passes.lower``) qualify.

:func:`to_csv` writes a schedule so that torch's ``_load_csv`` then ``_dump_csv`` gives back
the same bytes; :func:`parse_csv` reads ours or torch's: empty cells are skipped, and FSDP's
``UNSHARD``/``RESHARD``, which torch's lowering adds for every stage, are dropped —
dapplesim models sharding through the plan (``plan.sharding``), not through schedule actions.
Unlike the text form a CSV keeps every row: row r is rank r even when it is empty.
"""

from __future__ import annotations

import csv
import io

from sim.core.errors import ScheduleError
from sim.schedule.ir import Schedule, Step
from sim.schedule.text import parse_action, schedule_from_ranks

__all__ = ["FSDP_ACTIONS", "is_csv", "parse_csv", "to_csv"]

FSDP_ACTIONS = ("UNSHARD", "RESHARD")
"""torch action kinds that :func:`parse_csv` drops (``0UNSHARD``, ``0RESHARD``)."""


def to_csv(schedule: Schedule) -> str:
    """One CSV row per rank, one step per cell, as torch's ``_dump_csv`` writes them."""
    out = io.StringIO()
    writer = csv.writer(out)
    for steps in schedule.ranks:
        writer.writerow([str(step) for step in steps])
    return out.getvalue()


def parse_csv(text: str, *, name: str = "file") -> Schedule:
    """Read torch's pipeline-order CSV (compute-only or with communication) into a Schedule."""
    ranks: list[tuple[Step, ...]] = []
    for row_no, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        steps: list[Step] = []
        for column, cell in enumerate(row, start=1):
            cell = cell.strip()
            if not cell or cell.lstrip("0123456789") in FSDP_ACTIONS:
                continue
            if len(cell.split()) > 1:
                raise ScheduleError(
                    f"{name} row {row_no} column {column}: {cell[:40]!r}... holds several actions; a CSV cell "
                    "holds one (torch's format), while the text form, in a file not named .csv, separates them "
                    "with spaces"
                )
            try:
                steps.append(parse_action(cell))
            except ScheduleError as err:
                raise ScheduleError(f"{name} row {row_no} column {column}: {err}") from None
        ranks.append(tuple(steps))
    if not any(ranks):
        raise ScheduleError(f"{name}: no actions (expected one CSV row of actions per rank)")
    return schedule_from_ranks(ranks, name=name)


def is_csv(text: str, *, path: str | None = None) -> bool:
    """Whether a schedule file is torch's CSV rather than our text: a ``.csv`` suffix, or a
    comma outside ``#`` comments (the text form separates steps with spaces)."""
    if path is not None and path.lower().endswith(".csv"):
        return True
    return any("," in line.split("#", 1)[0] for line in text.splitlines())
