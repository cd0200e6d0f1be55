"""Planners by name: an unknown name is an error that lists the valid ones."""

from __future__ import annotations

from typing import Callable

from planner.planners.baselines import dp_planner, even_planner, megatron_planner
from planner.planners.dapple import dapple_planner
from planner.planners.exhaustive import exhaustive_planner
from planner.planners.pipedream import pipedream_planner
from planner.search.ranking import PlannerResult
from sim.core.errors import DappleError

__all__ = ["PLANNERS", "DEFAULT_PLANNERS", "get_planner"]

PLANNERS: dict[str, Callable[..., PlannerResult]] = {
    "dapple": dapple_planner,
    "megatron": megatron_planner,
    "pipedream": pipedream_planner,
    "even": even_planner,
    "dp": dp_planner,
    "exhaustive": exhaustive_planner,
}
"""Name -> ``fn(scenario, options, progress=None) -> PlannerResult``."""

DEFAULT_PLANNERS = ("dapple", "megatron", "pipedream", "even", "dp")
"""What ``dapple-plan`` runs without ``--planner``."""


def get_planner(name: str) -> Callable[..., PlannerResult]:
    if name not in PLANNERS:
        raise DappleError(f"unknown planner {name!r}; valid: {', '.join(sorted(PLANNERS))}")
    return PLANNERS[name]
