"""One point of a what-if sweep: its scenario simulated or planned, as one table row.

A point is a base scenario with some dotted keys set (``planner.sweeps.file.Point``). In
``simulate`` mode it is replayed with the sweep's engine; in ``plan`` mode the sweep's planner
searches it, and the row holds the plan found (``plan_json`` is a plan file) or why none fits.
The metric columns come from ``sim.core.summary.metrics_row`` and the plan's from
``planner.search.evaluation.evaluation_row``, the same views ``dapple-sim`` and ``dapple-plan`` print.
A point never raises: a bad value or an impossible plan is its ``error``, in one line.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Mapping

from planner.planners.registry import get_planner
from planner.search.evaluation import evaluation_row
from planner.search.space import PlannerOptions
from planner.sweeps.checks import planner_option
from planner.sweeps.file import Point, Sweep, SweepError, override_value, schedule_column
from sim.core import jsonio
from sim.core.errors import DappleError
from sim.core.parallelism import Recompute
from sim.core.summary import Summary, metrics_row
from sim.cost.capacity import estimate_run
from sim.engine.run import run_scenario
from sim.input.scenario import parse_scenario

__all__ = ["one_line", "run_point"]

log = logging.getLogger(__name__)


def run_point(sweep: Sweep, point: Point) -> dict[str, Any]:
    """Simulate or plan one point; returns its table row (never raises for a bad point)."""
    started = time.perf_counter()
    row: dict[str, Any] = {"point": point.id, **dict(point.columns)}
    try:
        row.update(_run(sweep, point))
    except DappleError as exc:
        row["error"] = one_line(str(exc))
    except Exception as exc:  # an engine bug must not stop a thousand-point study
        log.debug("point %s failed", point.id, exc_info=True)
        row["error"] = one_line(f"{exc.__class__.__name__}: {exc}")
    row["wall_s"] = time.perf_counter() - started
    return row


def one_line(text: str) -> str:
    """``text`` on one line of at most 500 characters (what a table cell shows)."""
    return " ".join(text.split())[:500]


def _run(sweep: Sweep, point: Point) -> dict[str, Any]:
    settings = dict(point.settings)
    planner = settings.pop("planner", sweep.planner)
    engine = settings.pop("engine", sweep.engine)
    options = dict(sweep.options)
    for key in [k for k in settings if k.startswith("options.")]:
        name = key.split(".", 1)[1]
        options[name] = planner_option(name, settings.pop(key), key, lambda k, p: SweepError(f"{k}: {p}"))
    overrides = {key: override_value(value) for key, value in settings.items()}
    # a plan-mode point is read as dapple-plan reads its scenario: without the file's plan, and
    # so with the micro-batch size optional (the planner chooses its own)
    scenario = parse_scenario(sweep.base_text, source=Path(sweep.base).name, base_dir=Path(sweep.base).parent,
                              overrides=overrides, ignore_plan=sweep.mode == "plan")
    cluster, training = scenario.cluster, scenario.training
    row = {
        "scenario": scenario.name, "model_name": scenario.model.name, "device_name": cluster.device.name,
        "num_nodes": cluster.nodes, "cluster_devices": cluster.num_devices,
        "global_batch_size": training.global_batch_size, "microbatch_size": training.microbatch_size,
        "memory_capacity_bytes": cluster.device.usable_memory_bytes,
    }
    if sweep.mode == "simulate":
        result = run_scenario(scenario, engine=engine, log_level=logging.DEBUG)  # one line per point: DEBUG
        summary = result.summarize()
        row.update(metrics_row(summary), recompute=scenario.plan.recompute is Recompute.FULL)
        return {**row, **run_columns(scenario, summary)}
    return {**row, **_plan(scenario, planner, options)}


def run_columns(scenario, summary: Summary | None) -> dict[str, Any]:
    """The ``RUN_COLUMNS`` of a point (``sim.cost.capacity.estimate_run``); empty without a run length."""
    run = None if summary is None else estimate_run(scenario, summary)
    if run is None:
        return {}
    free, expected = run.failure_free, run.expected or run.failure_free
    return {"days": free.days, "expected_days": expected.days, "gpu_hours": free.gpu_hours,
            "expected_gpu_hours": expected.gpu_hours, "cost": expected.cost,
            "energy_mwh": None if expected.energy_kwh is None else expected.energy_kwh / 1e3,
            "goodput": None if run.goodput is None else run.goodput.goodput}


def _plan(scenario, planner: str, options: Mapping[str, Any]) -> dict[str, Any]:
    found = get_planner(planner)(scenario, PlannerOptions(**options))
    if found.best is None:  # nothing fits: a result of the study, not a failure
        return {"oom": True, "planner_note": found.note}
    best = found.best
    row = evaluation_row(best)
    return {
        **metrics_row(best.summary), **run_columns(scenario, best.summary),
        "microbatch_size": best.candidate.microbatch_size,
        "recompute": bool(best.candidate.recompute), "schedule": schedule_column(row.plan["schedule"]),
        "plan_description": row.metrics.description, "plan_placement": row.metrics.placement,
        "plan_json": jsonio.dumps(row.plan, sort_keys=True), "planner_note": found.note or None,
    }
