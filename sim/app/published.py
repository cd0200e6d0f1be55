"""``dapple-sim published``: the shipped presets against published training runs, nothing fitted.

Someone sizing a 500-GPU run has no measurements of their own yet; the presets must predict
well as shipped. This command is how that is checked: a suite file
(``scenarios/published/suite.yaml``) lists published numbers, each with its source (paper,
table, row), the scenario file that sets up the run and what to read from its replay:

* ``iteration_time`` — the replay's iteration time;
* ``state_memory`` — parameters, gradients and optimizer state of the first device of the
  middle pipeline rank (what a stage of transformer blocks holds: no embedding, no head);
* ``activation_memory`` — the peak of stashed activations on device 0 (the first pipeline
  rank keeps the most micro-batches in flight).

Every scenario is replayed once, with the fast path (these plans have one replica per stage:
no gradient all-reduce competes with the pipeline's transfers, and the SimPy engine gives the
same times), and each row gets its relative error ``predicted / published − 1``. Rows are
grouped by source and table, each group with its mean and worst absolute error.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.core.errors import DappleError, ScenarioError
from sim.core.jsonio import write_json
from sim.core.units import parse_bytes, parse_time
from sim.core.userfiles import read_user_file, show_path
from sim.engine.run import run_scenario
from sim.input.scenario import load_scenario
from sim.input.strict import StrictReader
from sim.input.yaml_text import load_yaml
from sim.report.plots.style import pyplot

__all__ = ["DEFAULT_SUITE", "METRICS", "GroupStats", "PublishedRow", "RowResult", "format_results", "group_stats",
           "read_suite", "run_suite", "suite_json", "write_outputs"]

DEFAULT_SUITE = Path(__file__).resolve().parents[2] / "scenarios" / "published" / "suite.yaml"
"""The suite shipped with the project."""

METRICS = {"iteration_time": (parse_time, "s", 1.0), "state_memory": (parse_bytes, "GiB", 2.0**30),
           "activation_memory": (parse_bytes, "GiB", 2.0**30)}
"""Metric -> (how its published value is read, the unit it is shown in, that unit in SI)."""
_BOUNDS = {parse_time: (1e-6, 1e6, "1us to 1e6s"), parse_bytes: (1.0, 2.0**50, "1B to 1PiB")}
"""Range of a published value: a time, or a size."""

_ROW_KEYS = {"scenario", "metric", "published", "source", "table", "row"}


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishedRow:
    """One published number and where it comes from."""

    scenario: Path
    """The scenario file that sets up the run."""
    metric: str
    """What to read from the replay (``METRICS``)."""
    published: float
    """The published value, SI (seconds, bytes)."""
    source: str
    """The paper."""
    table: str
    """Its table or figure."""
    row: str
    """The row (model and configuration) in it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RowResult:
    """A published row and the simulator's prediction of it."""

    row: PublishedRow
    predicted: float
    """SI, as ``row.published``."""

    @property
    def error(self) -> float:
        """Relative error, ``predicted / published − 1``."""
        return self.predicted / self.row.published - 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupStats:
    """The rows of one source's table."""

    source: str
    table: str
    rows: int
    mean_abs_error: float
    """Mean of |relative error|."""
    worst_abs_error: float
    """Largest |relative error|."""


def read_suite(path: str | Path = DEFAULT_SUITE) -> tuple[PublishedRow, ...]:
    """The suite file's rows, checked key by key (one line naming the file and key per mistake)."""
    path = Path(path)
    reader = StrictReader(show_path(path), path.parent)
    data = reader.mapping(load_yaml(read_user_file(path, "suite file", ScenarioError), where=show_path(path)), "")
    reader.keys(data, "", allowed={"sources", "rows"}, required={"sources", "rows"})
    sources = reader.mapping(data["sources"], "sources")
    for key, text in sources.items():
        if not isinstance(text, str) or not text:
            raise reader.fail(f"sources.{key}", "must be the paper's reference, a non-empty string")
    if not isinstance(data["rows"], list) or not data["rows"]:
        raise reader.fail("rows", "must be a non-empty list of {scenario, metric, published, source, table, row}")
    rows = []
    for i, item in enumerate(data["rows"]):
        key = f"rows[{i}]"
        item = reader.mapping(item, key)
        reader.keys(item, key, allowed=_ROW_KEYS, required=_ROW_KEYS)
        metric = reader.string(item, key, "metric", choices=METRICS)
        source = reader.string(item, key, "source", choices=set(sources))
        rows.append(PublishedRow(
            scenario=reader.path(item["scenario"], f"{key}.scenario", data_fallback=False),
            metric=metric,
            published=reader.quantity(item, key, "published", METRICS[metric][0],
                                      bounds=_BOUNDS[METRICS[metric][0]]),
            source=sources[source],
            table=reader.string(item, key, "table"),
            row=reader.string(item, key, "row"),
        ))
    return tuple(rows)


def _measure(metric: str, scenario, summary) -> float:
    groups = scenario.plan.device_groups
    by_id = {d.device: d for d in summary.devices}
    if metric == "iteration_time":
        return summary.iteration_time_s
    if metric == "state_memory":
        b = by_id[groups[len(groups) // 2][0]].memory_breakdown
        return b.parameters + b.gradients + b.optimizer
    return by_id[groups[0][0]].peak_activation_bytes


def run_suite(rows: tuple[PublishedRow, ...]) -> tuple[RowResult, ...]:
    """Replay every scenario the rows name (each once, fast path) and read each row's metric."""
    replays: dict[Path, tuple[Any, Any]] = {}
    results = []
    for row in rows:
        if row.scenario not in replays:
            scenario = load_scenario(row.scenario)
            if scenario.plan is None:
                raise ScenarioError(f"{row.scenario}: plan: missing; a published run needs its plan")
            replays[row.scenario] = (scenario, run_scenario(scenario, engine="fast").summarize())
        scenario, summary = replays[row.scenario]
        results.append(RowResult(row=row, predicted=_measure(row.metric, scenario, summary)))
    return tuple(results)


def group_stats(results: tuple[RowResult, ...]) -> tuple[GroupStats, ...]:
    """Mean and worst |error| per (source, table), in the order the tables first appear."""
    groups: dict[tuple[str, str], list[float]] = {}
    for r in results:
        groups.setdefault((r.row.source, r.row.table), []).append(abs(r.error))
    return tuple(GroupStats(source=source, table=table, rows=len(errors), mean_abs_error=sum(errors) / len(errors),
                            worst_abs_error=max(errors)) for (source, table), errors in groups.items())


def _shown(value: float, metric: str) -> str:
    unit, scale = METRICS[metric][1], METRICS[metric][2]
    return f"{value / scale:.2f} {unit}"


def format_results(results: tuple[RowResult, ...]) -> str:
    """The table ``dapple-sim published`` prints: one line per row, then each group's mean and worst."""
    width = max(len(f"{r.row.table}: {r.row.row}") for r in results)
    lines = [f"{'published run':<{width}}  {'predicted':>11}  {'published':>11}  {'error':>7}"]
    for r in results:
        lines.append(f"{r.row.table + ': ' + r.row.row:<{width}}  {_shown(r.predicted, r.row.metric):>11}  "
                     f"{_shown(r.row.published, r.row.metric):>11}  {r.error:>+7.1%}")
    for g in group_stats(results):
        lines.append(f"{g.table} ({g.source}): {g.rows} rows, mean |error| {g.mean_abs_error:.1%}, "
                     f"worst {g.worst_abs_error:.1%}")
    return "\n".join(lines)


def suite_json(results: tuple[RowResult, ...]) -> dict[str, Any]:
    """``--json``: every row (SI values) and every group's statistics."""
    return {
        "rows": [{"scenario": r.row.scenario.name, "metric": r.row.metric, "unit": "s" if r.row.metric == "iteration_time"
                  else "bytes", "predicted": r.predicted, "published": r.row.published, "error_frac": r.error,
                  "source": r.row.source, "table": r.row.table, "row": r.row.row} for r in results],
        "groups": [{"source": g.source, "table": g.table, "rows": g.rows, "mean_abs_error_frac": g.mean_abs_error,
                    "worst_abs_error_frac": g.worst_abs_error} for g in group_stats(results)],
    }


def write_outputs(results: tuple[RowResult, ...], out: str | Path) -> None:
    """``--out DIR``: ``published.json`` and ``published.png`` (each row's error, by table)."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DappleError(f"--out {out}: cannot create the folder ({exc.strerror})") from None
    write_json(out / "published.json", suite_json(results))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(results) + 1.5))
    labels = [f"{r.row.table}: {r.row.row}" for r in results][::-1]
    errors = [100 * r.error for r in results][::-1]
    tables = sorted({r.row.table for r in results})
    colours = {t: f"C{i}" for i, t in enumerate(tables)}
    ax.barh(labels, errors, color=[colours[r.row.table] for r in results][::-1])
    for x in (-10, -5, 5, 10):
        ax.axvline(x, color="grey", lw=0.6, ls=":" if abs(x) == 10 else "--")
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel("predicted / published − 1 (%)")
    ax.set_title("Shipped presets against published runs")
    ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    try:
        fig.savefig(out / "published.png", dpi=100)
    except OSError as exc:
        raise DappleError(f"--out {out}: cannot write published.png ({exc.strerror})") from None
    finally:
        plt.close(fig)
