"""What every schedule generator shares: its argument checks and how it assembles a Schedule.

Each check raises a one-line :class:`~sim.core.errors.ScheduleError` naming the generator, the
argument and its value, as ``generate`` promises for every name in its table.
"""

from __future__ import annotations

from collections.abc import Callable

from sim.core.errors import ScheduleError
from sim.schedule.ir import Action, Schedule, Step

__all__ = ["check_chunks", "check_sizes", "multi_chunk", "single_chunk"]


def check_sizes(name: str, num_stages: int, num_microbatches: int) -> None:
    """Both sizes must be integers >= 1 (``num_stages`` is the number of ranks)."""
    for key, value in (("num_stages", num_stages), ("num_microbatches", num_microbatches)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ScheduleError(f"{name}: {key}={value!r} must be an integer >= 1")


def check_chunks(name: str, chunks: object) -> None:
    """Model chunks per rank must be an integer >= 1."""
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise ScheduleError(f"{name}: chunks={chunks!r} must be an integer >= 1")


def single_chunk(name: str, num_stages: int, num_microbatches: int, orders: list[list[Action]]) -> Schedule:
    """A schedule whose rank r runs stage r."""
    return Schedule(
        name=name,
        num_stages=num_stages,
        num_microbatches=num_microbatches,
        stage_ranks=tuple(range(num_stages)),
        ranks=tuple(tuple(order) for order in orders),
    )


def multi_chunk(
    name: str, num_ranks: int, num_microbatches: int, chunks: int, rank_of: Callable[[int], int],
    orders: list[list[Step]],
) -> Schedule:
    """A schedule of ``num_ranks · chunks`` stages, stage s on rank ``rank_of(s)``."""
    return Schedule(
        name=name,
        num_stages=num_ranks * chunks,
        num_microbatches=num_microbatches,
        stage_ranks=tuple(rank_of(s) for s in range(num_ranks * chunks)),
        ranks=tuple(tuple(order) for order in orders),
    )
