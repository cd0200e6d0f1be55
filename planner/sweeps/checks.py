"""What a sweep file's planner options and plots may hold, checked before any point runs.

``planner_option`` reads one ``PlannerOptions`` field from YAML (``options:`` or an
``options.<field>`` axis) into the hashable value the planner takes; ``check_plots`` checks the
``plots:`` list: each figure of ``sim.report.plots.tables``, each argument of its type, and each
column it names one the table will have, so a typo does not surface after every point ran.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

from planner.search.space import PLACEMENTS, REPLICA_FIRST, PlannerOptions
from planner.sweeps.columns import COLUMNS, PLAN_COLUMNS, RUN_COLUMNS, TAIL_COLUMNS
from sim.core.parallelism import Recompute, Sharding
from sim.input.strict import did_you_mean, show_text, show_value
from sim.report.plots.tables import TABLE_FIGURES
from sim.schedule.generators import DAPPLE_POLICIES, GENERATORS
from sim.schedule.policy import DapplePolicy

__all__ = ["check_plots", "planner_option"]

_COLUMN_ARGUMENTS = {"gpus", "throughput", "hue", "style", "microbatches", "memory", "model", "by", "metric"}
"""Arguments of ``sim.report.plots.tables``' figures that name a column of the table."""


def planner_option(name: str, value: Any, where: str, fail) -> Any:
    """A ``PlannerOptions`` field from YAML; returns a hashable value."""
    fields = list(PlannerOptions.__dataclass_fields__)
    if name == "fast_budget_s":
        raise fail(where, "the planner's budget counts work now, not seconds: give fast_budget_ops, the actions "
                          "the fast path may replay beyond fast_top (an integer >= 0)")
    if name not in fields:
        raise fail(where, f"unknown planner option; {did_you_mean(name, fields)}valid: {', '.join(sorted(fields))}")

    def ints(v, low: int) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and low <= v <= 10**9

    if name == "schedules":
        items = value if isinstance(value, list) else [value]
        out = []
        for item in items:
            item = {"name": item} if isinstance(item, str) else item
            if not isinstance(item, dict) or not isinstance(item.get("name"), str) or item["name"] not in GENERATORS \
                    or set(item) - {"name", "policy"} \
                    or item.get("policy", DapplePolicy.S_MINUS_I.value) not in DAPPLE_POLICIES:
                raise fail(where, f"{show_value(item)}: give schedule names ({', '.join(sorted(GENERATORS))}) or "
                                  f"{{name: dapple, policy: {DAPPLE_POLICIES[1]}}}")
            out.append((item["name"], tuple(sorted((k, v) for k, v in item.items() if k != "name"))))
        return tuple(out)
    if name == "placements":
        items = value if isinstance(value, list) else [value]
        if not items or any(p not in (*PLACEMENTS, REPLICA_FIRST) for p in items):
            raise fail(where, f"must list placements from {', '.join((*PLACEMENTS, REPLICA_FIRST))}, "
                              f"got {show_value(value)}")
        return tuple(items)
    if name == "recompute":
        items = value if isinstance(value, list) else [value]
        modes = {"none", "selective", "full"}
        if not items or any(not isinstance(v, bool) and v not in modes for v in items):
            raise fail(where, f"must be true, false, none, selective, full or a list of them, got {show_value(value)}")
        return tuple(Recompute.of(v) for v in items)
    if name == "interleaved":
        if not isinstance(value, bool):
            raise fail(where, f"must be true or false, got {show_value(value)}")
        return value
    if name == "microbatch_sizes":
        items = value if isinstance(value, list) else [value]
        if value is not None and (not items or not all(ints(v, 1) for v in items)):
            raise fail(where, f"must be a list of positive integers, got {show_value(value)}")
        return None if value is None else tuple(items)
    if name == "sharding":
        items = value if isinstance(value, list) else [value]
        modes = [m.value for m in Sharding]
        if not items or any(v not in modes for v in items):
            raise fail(where, f"must be one of {', '.join(modes)} or a list of them, got {show_value(value)}")
        return tuple(Sharding(v) for v in items)
    if name in ("tensor_parallel", "context_parallel", "chunks"):
        items = value if isinstance(value, list) else [value]
        if value is None and name != "chunks":
            return None
        if not items or not all(ints(v, 1) for v in items):
            raise fail(where, f"must be a positive integer or a list of them, got {show_value(value)}")
        return tuple(items)
    if name == "max_stages":
        if value is not None and not ints(value, 1):
            raise fail(where, f"must be a positive integer, got {show_value(value)}")
        return value
    low = 0 if name in ("engine_top", "fast_budget_ops") else 1
    if not ints(value, low):  # engine_top, fast_top, fast_budget_ops, fast_max
        raise fail(where, f"must be an integer from {low} to 10**9, got {show_value(value)}")
    return value


def check_plots(data: Any, fail, *, mode: str, keys: tuple[str, ...], planners: set[str]) -> tuple:
    """The ``plots:`` list, checked before any point runs: each argument has its figure's type,
    and one that names a column names a column the table will have."""
    if data is None:
        return ()
    if not isinstance(data, list):
        raise fail("plots", "must be a list of {figure: NAME, file: NAME.png, ...arguments}")
    columns = {"point", *keys, *COLUMNS, *RUN_COLUMNS, *(PLAN_COLUMNS if mode == "plan" else ()), *TAIL_COLUMNS}
    plots = []
    for i, item in enumerate(data):
        where = f"plots[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("figure"), str) or item["figure"] not in TABLE_FIGURES:
            raise fail(where, f"needs figure: one of {', '.join(sorted(TABLE_FIGURES))}")
        params = inspect.signature(TABLE_FIGURES[item["figure"]]).parameters
        allowed = sorted(p for p, spec in params.items() if spec.kind is spec.KEYWORD_ONLY and p != "ax")
        for key, value in item.items():
            if key in ("figure", "file"):
                continue
            if key not in allowed:
                raise fail(f"{where}.{show_text(str(key))}", f"unknown argument of {item['figure']}; "
                                                             f"{did_you_mean(key, allowed)}valid: {', '.join(allowed)}")
            annotation = params[key].annotation
            if isinstance(annotation, str) and not _fits_annotation(annotation, value):
                raise fail(f"{where}.{key}", f"must be {annotation.replace(' | ', ' or ')}, got {show_value(value)}")
            named = [value] if isinstance(value, str) else value if isinstance(value, list) else []
            for column in named if key in _COLUMN_ARGUMENTS else ():
                if column not in columns:
                    raise fail(f"{where}.{key}", f"{show_value(column)} is not a column of the table; columns: "
                                                 f"the axes ({', '.join(keys) or 'none'}) and {', '.join(COLUMNS)}")
        file = item.get("file", "x.png")
        if not isinstance(file, str) or not file.endswith(".png") or "/" in file or "\\" in file or "\0" in file \
                or len(file.encode()) > 255:
            raise fail(f"{where}.file", "must be a file name ending in .png (no folder, at most 255 bytes)")
        if item["figure"] == "planner_comparison":
            if "planner" not in keys:
                raise fail(where, "planner_comparison needs a planner axis (axes: {planner: [dapple, dp, ...]})")
            relative_to = item.get("relative_to")
            if relative_to is not None and relative_to not in planners:
                raise fail(f"{where}.relative_to", f"{show_value(relative_to)} is not a planner of the sweep; "
                                                   f"valid: {', '.join(sorted(planners))}")
        if item["figure"] == "oom_frontier" and item.get("value", "memory") not in ("memory", "throughput"):
            raise fail(f"{where}.value", f"must be memory or throughput, got {show_value(item['value'])}")
        plots.append(tuple(item.items()))
    return tuple(plots)


def _fits_annotation(annotation: str, value: Any) -> bool:
    """Whether ``value`` has a type ``annotation`` (``str | list[str] | None``, ``float | None``,
    ``bool``) allows; an annotation not understood here allows anything."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    tests = {"None": value is None, "str": isinstance(value, str), "bool": isinstance(value, bool),
             "float": number, "int": number and isinstance(value, int),
             "list[str]": isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)}
    kinds = [kind.strip() for kind in annotation.split("|")]
    return any(tests.get(kind, True) for kind in kinds)
