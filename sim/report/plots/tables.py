"""Plots of what-if studies: a sweep table (the pandas DataFrame of ``planner.sweeps.run``: one row
per point, ``oom`` and ``error`` columns) and the planners compared.

Each figure shows, per group, the best setting that fits in memory, marking where none fits.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from sim.report.plots.capacity import time_and_cost_vs_gpus_figure
from sim.report.plots.style import GiB as _GiB
from sim.report.plots.style import figure_and_axes as _figure
from sim.report.plots.style import pyplot as _pyplot

__all__ = ["TABLE_FIGURES", "memory_vs_microbatches_figure", "oom_frontier_figure", "planner_comparison_figure",
           "throughput_vs_gpus_figure"]


def _ran(table):
    """Rows of points that ran (no ``error``)."""
    return table[table["error"].isna()] if "error" in table.columns else table


def _fits(table):
    """Boolean mask: the point ran and fits in memory."""
    ok = table["error"].isna() if "error" in table.columns else True
    if "oom" in table.columns:
        ok = ok & ~table["oom"].fillna(False).astype(bool)
    return ok if not isinstance(ok, bool) else table.index == table.index


def _groups(table, column):
    """(value, rows) per value of ``column`` (a name or a list of names) in order of appearance."""
    if not column:
        return [(None, table)]
    return list(table.groupby(column, sort=False, dropna=False, observed=True))


def _levels(table, column: str) -> list:
    """Values of ``column``: a categorical column's categories (so that colours stay the same
    across figures of parts of one table), else the values in order of appearance."""
    # pandas only when a table is built: keeps it off the import path of the rest
    import pandas as pd

    if isinstance(table[column].dtype, pd.CategoricalDtype):
        return list(table[column].cat.categories)
    return list(dict.fromkeys(table[column]))


def _gpu_axis(ax, values) -> None:
    values = sorted({float(v) for v in values})
    if len(values) > 1 and all(v > 0 and (int(v) & (int(v) - 1)) == 0 and v == int(v) for v in values):
        ax.set_xscale("log", base=2)
    ax.set_xticks(values, [f"{v:g}" for v in values])
    ax.minorticks_off()


def throughput_vs_gpus_figure(table, *, gpus: str = "cluster_devices", throughput: str = "throughput_samples_per_s",
                              hue: str | None = None, style: str | None = None, target: float | None = None,
                              title: str | None = None, legend: bool = True, ax=None) -> Any:
    """Best samples/s that fits in memory at each GPU count: one colour per ``hue`` value and
    one line style per ``style`` value (both columns of the table).

    GPU counts at which no setting fits are marked with an x on the axis; with ``target``
    (samples/s) a dashed line and, on each curve, the fewest GPUs that reach it.
    """
    # matplotlib only when a figure is drawn: keeps it off the import path of what prints text
    from matplotlib.lines import Line2D

    fig, ax = _figure(ax, (8, 4.5))
    data = _ran(table)
    colours = {value: f"C{i % 10}" for i, value in enumerate(_levels(data, hue))} if hue else {}
    dashes = {value: ("-", "--", ":", "-.")[i % 4] for i, value in enumerate(_levels(data, style))} if style else {}
    handles = []
    for label, rows in _groups(data, [c for c in (hue, style) if c] or None):
        label = label if isinstance(label, tuple) else (label,)
        colour = colours.get(label[0], "C0") if hue else "C0"
        dash = dashes.get(label[-1], "-") if style else "-"
        best = rows[_fits(rows)].groupby(gpus)[throughput].max().sort_index()
        name = " / ".join(str(v) for v in label) if hue or style else "best plan"
        (line,) = ax.plot(best.index, best.values, marker="o", color=colour, linestyle=dash, label=name)
        handles.append(line)
        none = sorted(set(rows[gpus].dropna()) - set(best.index))
        if none:
            ax.plot(none, [0] * len(none), "x", color=colour, markersize=9, markeredgewidth=2, clip_on=False)
        if target is not None and (best >= target).any():
            gpu = best[best >= target].index[0]
            ax.annotate(f"{gpu:g}", (gpu, best[gpu]), textcoords="offset points", xytext=(0, 7), ha="center",
                        color=colour, fontsize="small", fontweight="bold")
    if target is not None:
        ax.axhline(target, linestyle="--", color="0.35", linewidth=1)
        handles.append(Line2D([], [], linestyle="--", color="0.35", label=f"target {target:g} samples/s"))
    handles.append(Line2D([], [], linestyle="", marker="x", color="0.3", markeredgewidth=2, label="nothing fits"))
    _gpu_axis(ax, data[gpus].dropna())
    ax.set_ylim(bottom=0)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("samples/s")
    ax.grid(alpha=0.3)
    if legend:
        keys = " / ".join(c for c in (hue, style) if c)  # what the labels are values of: model.hidden, ...
        ax.legend(handles=handles, fontsize="small", title=keys or None, title_fontsize="small")
    ax.set_title(title or "Throughput of the best plan that fits, by GPU count")
    fig.tight_layout()
    return fig


def memory_vs_microbatches_figure(table, *, microbatches: str = "num_microbatches", memory: str = "peak_memory_bytes",
                                  hue: str | None = "schedule", capacity: float | None = None,
                                  title: str | None = None, ax=None) -> Any:
    """Peak memory per device against the number of micro-batches, one line per ``hue`` value.

    The device's capacity (``capacity`` bytes, else the table's ``memory_capacity_bytes``) is
    a red dashed line; points that run out of memory are marked with a red x.
    """
    fig, ax = _figure(ax, (8, 4.5))
    data = _ran(table)
    for i, (label, rows) in enumerate(_groups(data, hue)):
        per = rows.groupby(microbatches)[memory].max().sort_index() / _GiB
        # markers shrink line by line so that curves lying on top of each other stay visible
        ax.plot(per.index, per.values, marker="osD^v<>ph*"[i % 10], markersize=max(3.0, 9.0 - 1.5 * i),
                color=f"C{i % 10}", label="peak" if hue is None else str(label))
        over = rows[~_fits(rows)]
        if len(over):
            ax.plot(over[microbatches], over[memory] / _GiB, "x", color="red", markersize=10, markeredgewidth=2)
    if capacity is None and "memory_capacity_bytes" in data.columns and data["memory_capacity_bytes"].notna().any():
        capacity = float(data["memory_capacity_bytes"].max())
    if capacity:
        ax.axhline(capacity / _GiB, color="red", linestyle="--", linewidth=1, label="capacity (x: out of memory)")
    _gpu_axis(ax, data[microbatches].dropna())
    ax.set_ylim(bottom=0)
    ax.set_xlabel("micro-batches per iteration")
    ax.set_ylabel("peak memory per device (GiB)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", title=hue, title_fontsize="small")
    ax.set_title(title or "Peak memory against micro-batch count")
    fig.tight_layout()
    return fig


def oom_frontier_figure(table, *, model: str = "model_name", gpus: str = "cluster_devices", by: str | None = None,
                        value: str = "memory", title: str | None = None) -> Any:
    """Heat-map over (model, GPUs), one panel per ``by`` value: where each model fits.

    A cell shows the best point that fits: its peak memory as a share of capacity
    (``value="memory"``) or its samples/s (``value="throughput"``). Cells where every point
    ran out of memory (or no plan fits) are red and read OOM; cells with only errors, "err".
    """
    # matplotlib only when a figure is drawn: keeps it off the import path of what prints text
    from matplotlib.patches import Rectangle

    plt = _pyplot()
    if value not in ("memory", "throughput"):
        raise ValueError(f"value={value!r}: use 'memory' or 'throughput'")
    models = list(dict.fromkeys(table[model].dropna()))
    columns = sorted({float(g) for g in table[gpus].dropna()})
    facets = _groups(table, by)
    across = len(facets) if len(facets) <= 3 else -(-len(facets) // 2)  # four panels: two rows of two
    down = -(-len(facets) // across)
    size = (max(4.5, 0.95 * len(columns) + 2.2) * across + 1, (0.6 * len(models) + 1.6) * down + 0.5)
    fig, axes = plt.subplots(down, across, squeeze=False, sharey=True, layout="constrained", figsize=size)
    for ax in axes.flat[len(facets):]:
        ax.set_visible(False)
    image = None
    for ax, (label, rows) in zip(axes.flat, facets):
        grid = np.full((len(models), len(columns)), np.nan)
        for (name, count), cell in rows.groupby([model, gpus], sort=False):
            i, j = models.index(name), columns.index(float(count))
            fits = cell[_fits(cell)]
            if len(fits):
                if value == "memory":
                    grid[i, j] = (fits["peak_memory_bytes"] / fits["memory_capacity_bytes"]).min()
                    text = f"{grid[i, j]:.0%}"
                else:
                    grid[i, j] = fits["throughput_samples_per_s"].max()
                    text = f"{grid[i, j]:.3g}"
                colour = "white" if value == "memory" and grid[i, j] < 0.55 else "black"
            elif len(_ran(cell)):
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="#d62728", edgecolor="white", hatch="//"))
                text, colour = "OOM", "white"
            else:
                text, colour = "err", "0.3"
            ax.text(j, i, text, ha="center", va="center", fontsize="small", color=colour, fontweight="bold")
        limits = {"vmin": 0.0, "vmax": 1.0} if value == "memory" else {"vmin": 0.0, "vmax": np.nanmax(
            [np.nanmax(grid)] if not np.isnan(grid).all() else [1.0])}
        image = ax.imshow(np.ma.masked_invalid(grid), cmap="viridis", aspect="auto", **limits)
        ax.set_xticks(range(len(columns)), [f"{c:g}" for c in columns])
        ax.set_yticks(range(len(models)), models)
        ax.set_xlim(-0.5, len(columns) - 0.5)
        ax.set_ylim(len(models) - 0.5, -0.5)
        ax.set_xlabel("GPUs")
        if by is not None:
            ax.set_title(f"{label}", fontsize="medium")
    if image is not None:
        bar = fig.colorbar(image, ax=axes.ravel().tolist(), fraction=0.03, aspect=35, pad=0.02)
        bar.set_label("peak memory / capacity (best that fits)" if value == "memory" else "samples/s (best that fits)")
    fig.suptitle(title or "Where each model fits in memory" + (f", by {by}" if by else ""))
    return fig


_METRICS = {  # name -> (axis label, scale, format, higher is better)
    "throughput_samples_per_s": ("samples/s", 1.0, "{:.4g}", True),
    "iteration_time_s": ("iteration time (ms)", 1e3, "{:.4g}", False),
    "peak_memory_bytes": ("peak memory (GiB)", 1 / _GiB, "{:.3g}", False),
    "tokens_per_s": ("tokens/s", 1.0, "{:.4g}", True),
    "mfu": ("MFU (%)", 100.0, "{:.3g}", True),
}


def planner_comparison_figure(report_or_table, *, metric: str = "throughput_samples_per_s",
                              by: str | list[str] | None = None, relative_to: str | None = None,
                              title: str | None = None, ax=None) -> Any:
    """Bars per planner: ``dapple-plan --json``'s report (each planner's ``metrics``; each bar
    notes the speed-up over data parallelism), or a sweep table with a ``planner`` column, one group of bars per value of
    ``by`` (a column or a list of columns). ``relative_to`` (a planner's name) divides every
    bar by that planner's value in the same group. A group where a planner finds nothing
    that fits reads "no plan fits"."""
    label, scale, fmt, higher = _METRICS.get(metric, (metric, 1.0, "{:.4g}", True))
    notes: dict[tuple[str, int], str] = {}
    if isinstance(report_or_table, Mapping):
        report = report_or_table
        names, groups, series = list(report["planners"]), [None], {}
        for name, info in report["planners"].items():
            # the metrics sit beside the plan (a report from before the split kept them in it)
            metrics = info.get("metrics", info.get("plan"))
            # tokens/s and MFU are None for a measured profile: no bar
            series[name] = [metrics[metric] * scale if metrics and metrics.get(metric) is not None else np.nan]
            if metrics and metrics.get(metric) is None:
                notes[name, 0] = "not known"
            elif metrics and metrics.get("speedup_over_dp"):
                notes[name, 0] = f"{fmt.format(metrics[metric] * scale)}\n{metrics['speedup_over_dp']:.2f}x dp"
        default_title = f"{report.get('scenario', '')}: planners compared"
    else:
        table = report_or_table
        if "planner" not in table.columns:
            raise ValueError("planner_comparison_figure needs a table with a 'planner' column (an axis of the sweep)")
        keys = [] if by is None else [by] if isinstance(by, str) else list(by)
        names = list(dict.fromkeys(table["planner"].dropna()))
        groups = list(dict.fromkeys(tuple(row) for row in table[keys].itertuples(index=False))) if keys else [None]
        series = {}
        for name in names:
            values = []
            for group in groups:
                mask = table["planner"] == name
                for key, value in zip(keys, group or ()):
                    mask &= table[key] == value
                fits = table[mask & _fits(table)][metric].dropna()
                values.append((fits.max() if higher else fits.min()) * scale if len(fits) else np.nan)
            series[name] = values
        default_title = "Planners compared" + (f" by {', '.join(keys)}" if keys else "")
    if relative_to is not None:
        if relative_to not in series:
            raise ValueError(f"relative_to={relative_to!r} is not a planner of the table: {', '.join(names)}")
        base = np.array(series[relative_to], dtype=float)
        series = {name: list(np.array(values, dtype=float) / base) for name, values in series.items()}
        label, fmt, notes = f"{label} relative to {relative_to}", "{:.2f}x", {}
    fig, ax = _figure(ax, (min(16.0, max(6.0, 0.55 * len(names) * len(groups) + 3.0)), 4.8))
    width = 0.8 / len(names)
    top = np.nanmax([v for values in series.values() for v in values] + [0.0]) or 1.0
    for k, name in enumerate(names):
        x = np.arange(len(groups)) + (k - (len(names) - 1) / 2) * width
        values = np.array(series[name], dtype=float)
        ax.bar(x, np.nan_to_num(values), width * 0.9, color=f"C{k % 10}", label=name)
        for g, (xi, v) in enumerate(zip(x, values)):
            text = notes.get((name, g), "no plan fits") if np.isnan(v) else notes.get((name, g), fmt.format(v))
            ax.text(xi, (0 if np.isnan(v) else v) + top * 0.02, text, ha="center", va="bottom", fontsize="x-small",
                    rotation=90 if np.isnan(v) or len(groups) > 1 else 0)
    if groups == [None]:
        ax.set_xticks((np.arange(len(names)) - (len(names) - 1) / 2) * width, names)
    else:
        ax.set_xticks(range(len(groups)), ["\n".join(str(v) for v in g) for g in groups])
        ax.legend(fontsize="small", title="planner", title_fontsize="small", loc="upper left",
                  bbox_to_anchor=(1.0, 1.0))
        ax.set_xlabel(" / ".join(keys))
    if relative_to is not None:
        ax.axhline(1.0, color="0.3", linewidth=0.8)
    ax.set_ylim(0, top * 1.3)
    ax.set_ylabel(label)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(title or default_title)
    fig.tight_layout()
    return fig


TABLE_FIGURES = {
    "throughput_vs_gpus": throughput_vs_gpus_figure,
    "memory_vs_microbatches": memory_vs_microbatches_figure,
    "oom_frontier": oom_frontier_figure,
    "planner_comparison": planner_comparison_figure,
    "time_and_cost_vs_gpus": time_and_cost_vs_gpus_figure,
}
"""Figures of a sweep table by name: what a sweep file's ``plots:`` may draw."""
