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
    plots:                                    # optional: figures of the table (sim.plots)
      - {figure: memory_vs_microbatches, hue: plan.schedule}

An axis is a list of values or a mapping ``label: value`` (the table shows the label). A
value may be any YAML (a scalar or a whole mapping such as a ``plan:``); it is applied like
``--set key=value`` and checked as strictly as the file. The axes ``planner`` and
``options.<field>`` (plan mode) and ``engine`` (simulate mode) vary the sweep itself.

A sweep that cannot run (an unknown key, a value no point could use) fails here in one line
naming the key; ``planner.sweep`` runs the points.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sim.errors import DappleError, read_user_file

__all__ = ["SweepError", "Sweep", "Point", "load_sweep", "sweep_from_dict", "override_value", "planner_option",
           "column_value"]

SCENARIO_SECTIONS = ("name", "cluster", "model", "training", "plan", "faults")
MODES = ("simulate", "plan")
PROBES_PER_KEY = 16
"""Distinct values of a key tried on the base before the sweep (a typo beyond is that point's error)."""


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
    """Plan mode: the planner's name (``planner.registry``)."""
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
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SweepError(f"{path}: not valid YAML{where}") from None
    return sweep_from_dict(data, source=str(path), base_dir=path.resolve().parent, default_name=path.stem)


def sweep_from_dict(
    data: Any, *, source: str = "<sweep>", base_dir: str | Path = ".", default_name: str = "sweep"
) -> Sweep:
    """Check a sweep given as a mapping (a sweep file's contents); ``base`` is relative to ``base_dir``."""
    def fail(key: str, problem: str) -> SweepError:
        return SweepError(f"{source}: {key}: {problem}")

    if not isinstance(data, dict):
        raise SweepError(f"{source}: a sweep is a mapping with base, mode and axes")
    allowed = ("name", "base", "mode", "engine", "planner", "options", "axes", "points", "plots")
    for key in data:
        if key not in allowed:
            raise fail(str(key), f"unknown key; valid: {', '.join(allowed)}")
    if "base" not in data or not isinstance(data["base"], str) or not data["base"]:
        raise fail("base", "missing; give the base scenario's path (relative to the sweep file)")
    base = (Path(base_dir) / data["base"]).resolve()
    try:
        base_text = base.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        raise fail("base", f"cannot read scenario {data['base']!r} (looked for {base})") from None
    mode = _choice(data, "mode", MODES, "simulate", fail)
    if mode == "plan" and "engine" in data:
        raise fail("engine", "only for mode: simulate (the planner settles its plans with the SimPy engine)")
    if mode == "simulate":
        for key in ("planner", "options"):
            if key in data:
                raise fail(key, "only for mode: plan")
    from planner.registry import PLANNERS
    from sim.engine.run import ENGINES

    engine = _choice(data, "engine", ENGINES, "simpy", fail)
    planner = _choice(data, "planner", tuple(sorted(PLANNERS)), "dapple", fail)
    options = data.get("options") or {}
    if not isinstance(options, dict):
        raise fail("options", "must be a mapping of planner options, e.g. {microbatch_sizes: [4, 8]}")
    checked = {}
    checked.update((name, planner_option(name, value, f"options.{name}", fail)) for name, value in options.items())
    name = data.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise fail("name", f"must be a non-empty string, got {name!r}")
    axes = _axes(data.get("axes") or {}, mode, fail)
    explicit = _explicit_points(data.get("points"), mode, fail)
    clash = sorted({k for p in explicit for k, _, _ in p} & {k for k, _ in axes})
    if clash:
        raise fail(f"points.{clash[0]}", "is also an axis; vary a key in one place")
    points, keys = _combine(explicit, axes)
    sweep = Sweep(
        name=name, base=str(base), base_text=base_text, mode=mode, engine=engine, planner=planner,
        options=tuple(sorted(checked.items())), points=points, axis_keys=keys, source=source,
        plots=_plots(data.get("plots"), fail),
    )
    _probe_keys(sweep, fail)
    return sweep


def _choice(data: dict, key: str, choices, default, fail) -> str:
    value = data.get(key, default)
    if value not in choices:
        raise fail(key, f"unknown value {value!r}; valid: {', '.join(choices)}")
    return value


def _sweep_key(key: Any, mode: str, fail, where: str) -> str:
    """A settable key: a dotted scenario key, or the sweep's own (planner, options.X, engine)."""
    if not isinstance(key, str) or not key or not all(key.split(".")):
        raise fail(where, f"{key!r} is not a dotted key such as cluster.inter_node.bandwidth")
    head = key.split(".")[0]
    if (key == "engine" and mode == "simulate") or ((key == "planner" or head == "options") and mode == "plan"):
        return key
    if head not in SCENARIO_SECTIONS:
        own = "engine" if mode == "simulate" else "planner, options.<field>"
        raise fail(where, f"{key!r} is not a scenario key (sections: {', '.join(SCENARIO_SECTIONS)}) nor {own}")
    return key


def _check_value(key: str, value: Any, mode: str, fail, where: str) -> None:
    from planner.registry import PLANNERS
    from sim.engine.run import ENGINES

    if key == "planner" and value not in PLANNERS:
        raise fail(where, f"unknown planner {value!r}; valid: {', '.join(sorted(PLANNERS))}")
    if key == "engine" and value not in ENGINES:
        raise fail(where, f"unknown engine {value!r}; valid: {', '.join(ENGINES)}")
    if key.startswith("options."):
        planner_option(key.split(".", 1)[1], value, where, fail)


def _axes(data: Any, mode: str, fail) -> list[tuple[str, list[tuple[Any, Any]]]]:
    """[(key, [(value, column value), ...]), ...] in file order."""
    if not isinstance(data, dict):
        raise fail("axes", "must be a mapping of dotted keys to lists of values")
    axes = []
    for key, values in data.items():
        where = f"axes.{key}"
        key = _sweep_key(key, mode, fail, where)
        if isinstance(values, dict):
            pairs = [(value, str(label)) for label, value in values.items()]
        elif isinstance(values, list):
            pairs = [(value, column_value(value)) for value in values]
        else:
            raise fail(where, f"must be a list of values or a mapping label: value, got {values!r}")
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
            raise fail(f"points[{i}]", f"must be a mapping of dotted keys to values, got {item!r}")
        entries = []
        for key, value in item.items():
            key = _sweep_key(key, mode, fail, f"points[{i}].{key}")
            _check_value(key, value, mode, fail, f"points[{i}].{key}")
            entries.append((key, value, column_value(value)))
        points.append(entries)
    return points


def column_value(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def _combine(explicit, axes) -> tuple[tuple[Point, ...], tuple[str, ...]]:
    keys = list(dict.fromkeys(k for p in explicit for k, _, _ in p)) + [k for k, _ in axes]
    points = []
    for outer in explicit or [[]]:
        for combo in itertools.product(*(pairs for _, pairs in axes)):
            entries = list(outer) + [(key, value, column) for (key, _), (value, column) in zip(axes, combo)]
            identity = json.dumps(sorted([k, v, c] for k, v, c in entries), sort_keys=True, default=str)
            points.append(
                Point(
                    index=len(points),
                    settings=tuple((k, v) for k, v, _ in entries),
                    columns=tuple((k, c) for k, _, c in entries),
                    id=hashlib.sha256(identity.encode()).hexdigest()[:16],
                )
            )
    return tuple(points), tuple(keys)


def planner_option(name: str, value: Any, where: str, fail) -> Any:
    """A ``PlannerOptions`` field from YAML; returns a hashable value."""
    from planner.space import PLACEMENTS, PlannerOptions
    from sim.schedule.generators import DAPPLE_POLICIES, GENERATORS
    from sim.schedule.policy import DapplePolicy

    fields = list(PlannerOptions.__dataclass_fields__)
    if name == "fast_budget_s":
        raise fail(where, "the planner's budget counts work now, not seconds: give fast_budget_ops, the actions "
                          "the fast path may replay beyond fast_top (an integer >= 0)")
    if name not in fields:
        raise fail(where, f"unknown planner option; valid: {', '.join(sorted(fields))}")

    def ints(v, low: int) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= low

    if name == "schedules":
        items = value if isinstance(value, list) else [value]
        out = []
        for item in items:
            item = {"name": item} if isinstance(item, str) else item
            if not isinstance(item, dict) or item.get("name") not in GENERATORS or set(item) - {"name", "policy"} \
                    or item.get("policy", DapplePolicy.S_MINUS_I.value) not in DAPPLE_POLICIES:
                raise fail(where, f"{item!r}: give schedule names ({', '.join(sorted(GENERATORS))}) or "
                                  f"{{name: dapple, policy: {DAPPLE_POLICIES[1]}}}")
            out.append((item["name"], tuple(sorted((k, v) for k, v in item.items() if k != "name"))))
        return tuple(out)
    if name == "placements":
        items = value if isinstance(value, list) else [value]
        if not items or any(p not in PLACEMENTS for p in items):
            raise fail(where, f"must list placements from {', '.join(PLACEMENTS)}, got {value!r}")
        return tuple(items)
    if name == "recompute":
        items = value if isinstance(value, list) else [value]
        if not items or any(not isinstance(v, bool) for v in items):
            raise fail(where, f"must be true, false or a list of them, got {value!r}")
        return tuple(items)
    if name == "interleaved":
        if not isinstance(value, bool):
            raise fail(where, f"must be true or false, got {value!r}")
        return value
    if name == "microbatch_sizes":
        items = value if isinstance(value, list) else [value]
        if value is not None and (not items or not all(ints(v, 1) for v in items)):
            raise fail(where, f"must be a list of positive integers, got {value!r}")
        return None if value is None else tuple(items)
    if name == "max_stages":
        if value is not None and not ints(value, 1):
            raise fail(where, f"must be a positive integer, got {value!r}")
        return value
    low = 0 if name in ("engine_top", "fast_budget_ops") else 1
    if not ints(value, low):  # engine_top, fast_top, fast_budget_ops, fast_max
        raise fail(where, f"must be an integer >= {low}, got {value!r}")
    return value


def _plots(data: Any, fail) -> tuple:
    import inspect

    from sim.plots.tables import TABLE_FIGURES

    if data is None:
        return ()
    if not isinstance(data, list):
        raise fail("plots", "must be a list of {figure: NAME, file: NAME.png, ...arguments}")
    plots = []
    for i, item in enumerate(data):
        where = f"plots[{i}]"
        if not isinstance(item, dict) or item.get("figure") not in TABLE_FIGURES:
            raise fail(where, f"needs figure: one of {', '.join(sorted(TABLE_FIGURES))}")
        params = inspect.signature(TABLE_FIGURES[item["figure"]]).parameters
        allowed = sorted(p for p, spec in params.items() if spec.kind is spec.KEYWORD_ONLY and p != "ax")
        for key in item:
            if key not in ("figure", "file") and key not in allowed:
                raise fail(f"{where}.{key}", f"unknown argument of {item['figure']}; valid: {', '.join(allowed)}")
        if not isinstance(item.get("file", "x.png"), str) or not item.get("file", "x.png").endswith(".png"):
            raise fail(f"{where}.file", "must be a file name ending in .png")
        plots.append(tuple(item.items()))
    return tuple(plots)


def _probe_keys(sweep: Sweep, fail) -> None:
    """A misspelt key or an unknown name fails every point: catch it now, naming the key.

    Each distinct value is applied alone to the base; only errors that no other setting can
    cure are reported here (an unknown key, an unknown choice such as a schedule's name).
    Everything else may depend on the combination, and is each point's own result."""
    from sim.errors import ScenarioError
    from sim.input.scenario import apply_overrides, parse_scenario

    raw = yaml.safe_load(sweep.base_text)
    if not isinstance(raw, dict):
        raise fail("base", "the base scenario is not a mapping")
    seen: dict[str, set] = {}
    for point in sweep.points:
        for key, value in point.settings:
            identity = json.dumps(value, sort_keys=True, default=str)
            tried = seen.setdefault(key, set())
            if identity in tried or len(tried) >= PROBES_PER_KEY or key.split(".")[0] not in SCENARIO_SECTIONS:
                continue
            tried.add(identity)
            override = {key: override_value(value)}
            try:
                apply_overrides(raw, override)
            except ScenarioError as exc:
                raise fail(key, str(exc).split(": ", 2)[-1]) from None
            try:
                parse_scenario(sweep.base_text, source="", base_dir=Path(sweep.base).parent, overrides=override)
            except ScenarioError as exc:
                message = str(exc).removeprefix(": ")
                named = message.split(": ", 1)[0]
                related = named == key or key.startswith(named + ".") or named.startswith(key + ".")
                if related and (": unknown key" in message or ": unknown value" in message):
                    where = sweep.source if named == key else f"{sweep.source}: {key}"
                    raise SweepError(f"{where}: {message}") from None




def override_value(value: Any) -> Any:
    """What ``apply_overrides`` gets: a scalar as YAML text, as ``--set key=value`` would give it;
    a list or mapping (a whole plan of hundreds of devices) as itself, without a YAML round trip."""
    if isinstance(value, (list, dict)):
        return copy.deepcopy(value)
    return yaml.safe_dump(value, default_flow_style=True).removesuffix("\n...\n").strip()
