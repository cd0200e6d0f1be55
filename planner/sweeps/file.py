"""Sweep files: one base scenario and the keys to vary, checked before anything runs.

A capacity question ("what if the network were 4x faster?", "when does GPipe run out of
memory?") is a scenario asked many times with a few keys changed. A sweep file names the
base scenario and the keys to vary; every combination is a *point*, which is simulated (its
plan replayed) or planned (a planner searches a plan for it) and becomes one row::

    base: ../scenarios/bert48_v100_2x8.yaml   # relative to this file
    mode: simulate                            # or plan (planner: dapple, options: {...})
    engine: simpy                             # simulate only: simpy or fast
    axes:                                     # dotted scenario keys; the product is swept
      cluster.inter_node.bandwidth: [10Gb/s, 25Gb/s, 100Gb/s]
      plan.schedule: [gpipe, dapple]
    points:                                   # optional: linked settings, crossed with axes
      - {cluster.nodes: 1, plan.stages: [...]}
    plots:                                    # optional: figures of the table (sim.report.plots)
      - {figure: memory_vs_microbatches, hue: plan.schedule}

An axis is a list of values or a mapping ``label: value`` (the table shows the label). A
value may be any YAML (a scalar or a whole mapping such as a ``plan:``); it is applied like
``--set key=value`` and checked as strictly as the file. The axes ``planner`` and
``options.<field>`` (plan mode) and ``engine`` (simulate mode) vary the sweep itself.

A sweep that cannot run (an unknown key, a value no point could use, a plot of a column the
table will not have) fails here in one line naming the key; ``planner.sweeps.run`` runs the points.
A sweep has at most ``MAX_POINTS`` points unless its ``max_points:`` raises the limit (to at
most ``MAX_POINTS_LIMIT``): the points are counted before any is made. A value is never
printed or hashed whole per point: each distinct value is written as JSON once.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from planner.planners.registry import PLANNERS
from planner.sweeps.checks import check_plots, planner_option
from sim.core.errors import DappleError, ScenarioError
from sim.core.userfiles import read_user_file, show_path, user_file_problem
from sim.engine.run import ENGINES
from sim.input.plan_file import schedule_text
from sim.input.scenario import apply_overrides, parse_scenario
from sim.input.strict import closest, did_you_mean, show_text, show_value
from sim.input.yaml_text import load_yaml

__all__ = ["SweepError", "Sweep", "Point", "load_sweep", "sweep_from_dict", "override_value", "column_value",
           "schedule_column"]

SCENARIO_SECTIONS = ("name", "cluster", "model", "training", "plan", "faults", "reliability")
MODES = ("simulate", "plan")
PROBES_PER_KEY = 16
"""Distinct values of a key tried on the base before the sweep (a typo beyond is that point's error)."""
MAX_POINTS = 100_000
"""Most points of a sweep unless its ``max_points:`` says otherwise (a point takes 0.05 s to
minutes: 100 000 are hours to months of work)."""
MAX_POINTS_LIMIT = 1_000_000
"""Highest ``max_points:`` (every point is held in memory, about 1 KiB each)."""
MAX_INT = 2**63 - 1
"""Largest integer a sweep value may be (the table's integer columns are 64-bit)."""


class SweepError(DappleError):
    """A sweep file (or its output folder) is malformed: one line naming the key."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Point:
    """One combination of settings."""

    index: int
    """Position in the sweep's order (explicit points outside, axes inside, last axis fastest)."""
    settings: tuple[tuple[str, Any], ...]
    """(key, value) pairs applied to the base scenario (or the sweep's own keys)."""
    columns: tuple[tuple[str, Any], ...]
    """(key, table value): the value, its label, or its JSON text when it is not a scalar."""
    id: str
    """Stable hash of the settings: a rerun recognises points already done by it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Sweep:
    """A checked sweep file."""

    name: str
    base: str
    """Absolute path of the base scenario (its folder resolves the scenario's relative paths)."""
    base_text: str
    """The base scenario's YAML, shipped with every point so remote workers need not read it."""
    mode: str = "simulate"
    engine: str = "simpy"
    """Simulate mode: ``simpy`` (contention) or ``fast`` (contention-free)."""
    planner: str = "dapple"
    """Plan mode: the planner's name (``planner.planners.registry``)."""
    options: tuple[tuple[str, Any], ...] = ()
    """Plan mode: ``PlannerOptions`` fields (the planner's budgets count work, so a point's plan
    is the one ``dapple-plan`` finds for it, on every run and every machine)."""
    points: tuple[Point, ...] = ()
    axis_keys: tuple[str, ...] = ()
    """Column names of the settings, in order."""
    plots: tuple[tuple[tuple[str, Any], ...], ...] = ()
    """Figures to draw from the table: (figure, file, keyword arguments...) pairs."""
    source: str = "<sweep>"


def load_sweep(path: str | Path) -> Sweep:
    """Read and check the sweep file at ``path``."""
    path = Path(path)
    text = read_user_file(path, "sweep file", SweepError)
    data = load_yaml(text, where=show_path(path), error=SweepError)
    return sweep_from_dict(data, source=show_path(path), base_dir=path.resolve().parent, default_name=path.stem)


def sweep_from_dict(
    data: Any, *, source: str = "<sweep>", base_dir: str | Path = ".", default_name: str = "sweep"
) -> Sweep:
    """Check a sweep given as a mapping (a sweep file's contents); ``base`` is relative to ``base_dir``."""
    def fail(key: str, problem: str) -> SweepError:
        return SweepError(f"{source}: {show_text(key, 200)}: {show_text(problem, 600)}")

    if not isinstance(data, dict):
        raise SweepError(f"{source}: a sweep is a mapping with base, mode and axes")
    allowed = ("name", "base", "mode", "engine", "planner", "options", "axes", "points", "plots", "max_points")
    for key in data:
        if key not in allowed:
            raise fail(show_text(str(key)), f"unknown key; {did_you_mean(key, allowed)}valid: {', '.join(allowed)}")
    if "base" not in data or not isinstance(data["base"], str) or not data["base"]:
        raise fail("base", "missing; give the base scenario's path (relative to the sweep file)")
    base, base_text = _read_base(data["base"], base_dir, fail)
    mode = _choice(data, "mode", MODES, "simulate", fail)
    if mode == "plan" and "engine" in data:
        raise fail("engine", "only for mode: simulate (the planner settles its plans with the SimPy engine)")
    if mode == "simulate":
        for key in ("planner", "options"):
            if key in data:
                raise fail(key, "only for mode: plan")

    engine = _choice(data, "engine", ENGINES, "simpy", fail)
    planner = _choice(data, "planner", tuple(sorted(PLANNERS)), "dapple", fail)
    options = data.get("options") or {}
    if not isinstance(options, dict):
        raise fail("options", "must be a mapping of planner options, e.g. {microbatch_sizes: [4, 8]}")
    checked = {}
    checked.update((name, planner_option(name, value, f"options.{name}", fail)) for name, value in options.items())
    name = data.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise fail("name", f"must be a non-empty string, got {show_value(name)}")
    limit = data.get("max_points", MAX_POINTS)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_POINTS_LIMIT:
        raise fail("max_points", f"must be an integer from 1 to {MAX_POINTS_LIMIT:,}, got {show_value(limit)}")
    axes = _axes(data.get("axes") or {}, mode, fail)
    explicit = _explicit_points(data.get("points"), mode, fail)
    clash = sorted({k for p in explicit for k, _, _ in p} & {k for k, _ in axes})
    if clash:
        raise fail(f"points.{clash[0]}", "is also an axis; vary a key in one place")
    count = max(1, len(explicit)) * math.prod(len(pairs) for _, pairs in axes)
    if count > limit:
        sizes = " x ".join([str(len(explicit))] * bool(explicit) + [str(len(pairs)) for _, pairs in axes])
        raise fail("axes", f"{sizes} = {count:,} points, more than max_points ({limit:,}); vary fewer values, or "
                           f"raise max_points (at most {MAX_POINTS_LIMIT:,})")
    points, keys = _combine(explicit, axes)
    sweep = Sweep(
        name=name, base=str(base), base_text=base_text, mode=mode, engine=engine, planner=planner,
        options=tuple(sorted(checked.items())), points=points, axis_keys=keys, source=source,
        plots=check_plots(data.get("plots"), fail, mode=mode, keys=keys, planners=_planners(planner, axes, explicit)),
    )
    _probe_keys(sweep, fail)
    return sweep


def _read_base(base: str, base_dir: str | Path, fail) -> tuple[Path, str]:
    """The base scenario's absolute path and text (read as a scenario file is, within its limits)."""
    try:
        path = (Path(base_dir) / base).resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # RuntimeError: a symlink loop (Python < 3.13)
        reason = "the path holds a NUL byte" if isinstance(exc, ValueError) else getattr(exc, "strerror", None) \
            or "a loop of symbolic links"
        raise fail("base", f"cannot read scenario {show_path(base)!r} ({reason})") from None
    problem = user_file_problem(path)
    if problem is None:
        try:
            return path, read_user_file(path, "scenario", SweepError)
        except SweepError as exc:  # changed since it was looked at, or not UTF-8
            problem = str(exc).split(": ", 1)[-1]
    raise fail("base", f"cannot read scenario {show_path(base)!r} (looked for {show_path(path)}: {problem})")


def _choice(data: dict, key: str, choices, default, fail) -> str:
    value = data.get(key, default)
    if not isinstance(value, str) or value not in choices:
        raise fail(key, f"unknown value {show_value(value)}; {did_you_mean(value, choices)}valid: {', '.join(choices)}")
    return value


def _sweep_key(key: Any, mode: str, fail, where: str) -> str:
    """A settable key: a dotted scenario key, or the sweep's own (planner, options.X, engine)."""
    if not isinstance(key, str) or not key or not all(key.split(".")):
        raise fail(where, f"{show_value(key)} is not a dotted key such as cluster.inter_node.bandwidth")
    head = key.split(".")[0]
    if (key == "engine" and mode == "simulate") or ((key == "planner" or head == "options") and mode == "plan"):
        return key
    if head not in SCENARIO_SECTIONS:
        own = "engine" if mode == "simulate" else "planner, options.<field>"
        section = closest(head, SCENARIO_SECTIONS)
        hint = f"; did you mean {'.'.join([section, *key.split('.')[1:]])!r}?" if section else ""
        raise fail(where, f"{show_value(key)} is not a scenario key (sections: {', '.join(SCENARIO_SECTIONS)}) "
                          f"nor {own}{hint}")
    return key


def _check_value(key: str, value: Any, mode: str, fail, where: str) -> None:
    if key == "planner" and (not isinstance(value, str) or value not in PLANNERS):
        raise fail(where, f"unknown planner {show_value(value)}; {did_you_mean(value, PLANNERS)}"
                          f"valid: {', '.join(sorted(PLANNERS))}")
    if key == "engine" and (not isinstance(value, str) or value not in ENGINES):
        raise fail(where, f"unknown engine {show_value(value)}; {did_you_mean(value, ENGINES)}valid: {', '.join(ENGINES)}")
    if key.startswith("options."):
        planner_option(key.split(".", 1)[1], value, where, fail)
    if isinstance(value, int) and not isinstance(value, bool) and not -MAX_INT <= value <= MAX_INT:
        raise fail(where, f"{show_value(value)} is out of range; a number in a sweep is at most 2**63 - 1 in size")
    if isinstance(value, float) and not math.isfinite(value):  # no scenario key takes one; its label would print it
        raise fail(where, f"{show_value(value)} is not a finite number; give a number such as 16")


def _axes(data: Any, mode: str, fail) -> list[tuple[str, list[tuple[Any, Any]]]]:
    """[(key, [(value, column value), ...]), ...] in file order."""
    if not isinstance(data, dict):
        raise fail("axes", "must be a mapping of dotted keys to lists of values")
    axes = []
    for key, values in data.items():
        where = f"axes.{show_text(str(key))}"
        key = _sweep_key(key, mode, fail, where)
        if isinstance(values, dict):
            pairs = [(value, str(label)) for label, value in values.items()]
        elif isinstance(values, list):
            pairs = [(value, schedule_column(value) if key == "plan.schedule" else column_value(value))
                     for value in values]
        else:
            raise fail(where, f"must be a list of values or a mapping label: value, got {show_value(values)}")
        if not pairs:
            raise fail(where, "has no values")
        for i, (value, _) in enumerate(pairs):
            _check_value(key, value, mode, fail, f"{where}[{i}]")
        axes.append((key, pairs))
    return axes


def _explicit_points(data: Any, mode: str, fail) -> list[list[tuple[str, Any, Any]]]:
    if data is None:
        return []
    if not isinstance(data, list) or not data:
        raise fail("points", "must be a non-empty list of mappings {dotted.key: value, ...}")
    points = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise fail(f"points[{i}]", f"must be a mapping of dotted keys to values, got {show_value(item)}")
        entries = []
        for key, value in item.items():
            key = _sweep_key(key, mode, fail, f"points[{i}].{show_text(str(key))}")
            _check_value(key, value, mode, fail, f"points[{i}].{key}")
            entries.append((key, value, schedule_column(value) if key == "plan.schedule" else column_value(value)))
        points.append(entries)
    return points


def schedule_column(value: Any) -> Any:
    """A schedule in a table's column as the planner's table writes it (``schedule_text``:
    ``gpipe``, ``dapple/2(s-i)-1``, ``interleaved/chunks=2``), not a name beside JSON text; a
    value that is no schedule (the scenario's reader reports it) is its JSON."""
    if isinstance(value, str) or (isinstance(value, dict) and isinstance(value.get("name"), str)):
        return schedule_text(value)
    return column_value(value)


def column_value(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value, sort_keys=True, default=str)


class _JsonOnce:
    """``json.dumps(value, sort_keys=True, default=str)``, computed once per distinct object:
    the points of a sweep share their axes' values, so a value is written once, not once a point."""

    def __init__(self) -> None:
        self._texts: dict[int, tuple[Any, str]] = {}

    def __call__(self, value: Any) -> str:
        if isinstance(value, (str, int, float, bool)) or value is None:
            return json.dumps(value, sort_keys=True, default=str)
        held = self._texts.get(id(value))
        if held is None or held[0] is not value:
            held = self._texts[id(value)] = (value, json.dumps(value, sort_keys=True, default=str))
        return held[1]


def _planners(planner: str, axes, explicit) -> set[str]:
    """Every planner a sweep's points use (its ``planner:`` and the values of a ``planner`` axis)."""
    names = {value for key, pairs in axes if key == "planner" for value, _ in pairs}
    names |= {value for point in explicit for key, value, _ in point if key == "planner"}
    return names or {planner}


def _combine(explicit, axes) -> tuple[tuple[Point, ...], tuple[str, ...]]:
    keys = list(dict.fromkeys(k for p in explicit for k, _, _ in p)) + [k for k, _ in axes]
    points = []
    text = _JsonOnce()
    for outer in explicit or [[]]:
        for combo in itertools.product(*(pairs for _, pairs in axes)):
            entries = list(outer) + [(key, value, column) for (key, _), (value, column) in zip(axes, combo)]
            # json.dumps(sorted([k, v, c] ...), sort_keys=True, default=str), each value written once
            identity = "[" + ", ".join(f"[{text(k)}, {text(v)}, {text(c)}]"
                                       for k, v, c in sorted(entries, key=lambda e: e[0])) + "]"
            points.append(
                Point(
                    index=len(points),
                    settings=tuple((k, v) for k, v, _ in entries),
                    columns=tuple((k, c) for k, _, c in entries),
                    id=hashlib.sha256(identity.encode()).hexdigest()[:16],
                )
            )
    return tuple(points), tuple(keys)


def _probe_keys(sweep: Sweep, fail) -> None:
    """A misspelt key or an unknown name fails every point: catch it now, naming the key.

    Each distinct value is applied alone to the base; only errors that no other setting can
    cure are reported here (an unknown key, an unknown choice such as a schedule's name).
    Everything else may depend on the combination, and is each point's own result."""

    raw = load_yaml(sweep.base_text, where=f"{sweep.source}: base: {show_path(sweep.base)}", error=SweepError)
    if not isinstance(raw, dict):
        raise fail("base", "the base scenario is not a mapping")
    seen: dict[str, set] = {}
    text = _JsonOnce()
    for point in sweep.points:
        for key, value in point.settings:
            tried = seen.setdefault(key, set())
            if len(tried) >= PROBES_PER_KEY or key.split(".")[0] not in SCENARIO_SECTIONS:
                continue
            identity = text(value)
            if identity in tried:
                continue
            tried.add(identity)
            override = {key: override_value(value)}
            try:
                apply_overrides(raw, override)
            except ScenarioError as exc:
                raise fail(show_text(key), str(exc).split(": ", 2)[-1]) from None
            try:
                parse_scenario(sweep.base_text, source="", base_dir=Path(sweep.base).parent, overrides=override,
                               ignore_plan=sweep.mode == "plan")  # as each point reads it
            except DappleError as exc:
                message = str(exc).removeprefix(": ")
                named = message.split(": ", 1)[0]
                related = named == key or key.startswith(named + ".") or named.startswith(key + ".")
                if related and (": unknown key" in message or ": unknown value" in message):
                    where = sweep.source if named == key else f"{sweep.source}: {show_text(key)}"
                    raise SweepError(f"{where}: {message}") from None


def override_value(value: Any) -> Any:
    """What ``apply_overrides`` gets: a scalar as YAML text, as ``--set key=value`` would give it;
    a list or mapping (a whole plan of hundreds of devices) as itself, without a YAML round trip."""
    if isinstance(value, (list, dict)):
        return copy.deepcopy(value)
    return yaml.safe_dump(value, default_flow_style=True).removesuffix("\n...\n").strip()
