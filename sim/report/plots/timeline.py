"""Plots of one replay: a Gantt chart of what every device did, memory over time, and
several replays of one plan (its schedules) stacked on one time axis.

One function per figure, each returning a matplotlib ``Figure`` (the CLI saves them;
notebooks show them); each takes a ``SimResult``.

In the Gantt chart each row is a device (one per class of identical devices when there are
many, labelled with how many it stands for), drawn by ``sim.report.plots.gantt``: colour by kind
(forward, backward, I, W), the micro-batch's number in each bar, interleaved chunks hatched,
a lane under each row with the device's collectives, exposed strong and hidden faint
(:func:`communication_lanes`, from the records ``sim.engine.exposure`` reads), and a key on
every chart.
"""

from __future__ import annotations

from typing import Any, Mapping

from sim.core.units import format_bytes
from sim.engine.result import SimResult
from sim.report.plots.gantt import KINDS, LEGEND, add_key, draw_gantt, gantt_key, merge_keys
from sim.report.plots.lanes import communication_lanes
from sim.report.plots.rows import PlotRows, plot_rows
from sim.report.plots.style import GiB as _GiB
from sim.report.plots.style import format_duration, set_time_axis, wrap_to_width
from sim.report.plots.style import pyplot as _pyplot

__all__ = ["CAPACITY_IN_VIEW", "KINDS", "LEGEND", "add_key", "communication_lanes", "draw_gantt", "gantt_figure", "gantt_key", "memory_figure",
           "rows_to_plot", "schedule_comparison_figure"]


def rows_to_plot(result: SimResult, limit: int = 32) -> list[tuple[int, int]]:
    """(device, devices it stands for) of each row a chart draws (``sim.report.plots.rows.plot_rows``)."""
    return [(row.device, row.count) for row in plot_rows(result, limit).rows]


MEMORY_LINES = 16
"""Most curves a memory chart draws (its key names each): evenly spaced rows of the Gantt chart's."""

MAX_HEIGHT_IN = 14.0
"""The tallest a figure is drawn, inches: a Gantt chart's rows shrink to fit it."""


def _row_in(rows: int, fixed_in: float, per_row_in: float = 0.4) -> float:
    """Inches a row, ``per_row_in`` unless that would make the figure taller than ``MAX_HEIGHT_IN``."""
    return min(per_row_in, (MAX_HEIGHT_IN - fixed_in) / max(rows, 1))


def gantt_figure(result: SimResult, *, title: str | None = None, ax=None) -> Any:
    """Gantt chart: one row per device (or device class, or stage: ``sim.report.plots.rows``), time
    in the unit its length asks for (``sim.report.plots.style.time_unit``), with its key."""
    plt = _pyplot()
    chosen = plot_rows(result)
    rows = [(r.device, r.count) for r in chosen.rows]
    s = result.summarize()
    if title is None and s.failure is not None:
        title = f"{s.name}: {s.schedule}, {s.failure.message}"
    title = title or (f"{s.name}: {s.schedule}, {s.num_microbatches} micro-batches, "
                      f"{format_duration(s.iteration_time_s)} per iteration, bubble {s.bubble_fraction:.1%}")
    if chosen.note:
        title += f" ({chosen.note})"
    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(12, _row_in(len(rows), 2.0) * len(rows) + 1.6))
        left_in = _left_in(chosen)
        title = wrap_to_width(title, fig.get_figwidth() - left_in)
        _fixed_margins(fig, left_in=left_in, title_lines=title.count("\n") + 1)  # before drawing: bars' widths
    else:
        fig = ax.figure
    events = result.event_rows([d for d, _ in rows])
    draw_gantt(ax, events, rows, result.workload.num_microbatches, result.end_s,
               communication=communication_lanes(result, [d for d, _ in rows]),
               labels=[r.label for r in chosen.rows])
    ax.set_title(title, loc="left", fontsize="medium")
    if not own:
        fig.tight_layout()
    return fig


def _left_in(chosen: PlotRows, points: float = 10.0) -> float:
    """Inches the row labels (``stage 3 · 128 devices``) need left of the axes: about 0.6 of
    the font's size a character and the ticks' pad, at least the 0.95 of a small run."""
    widest = max((len(r.label) for r in chosen.rows), default=0)
    return max(0.95, 0.25 + widest * 0.6 * points / 72)


def _fixed_margins(fig, *, right_in: float = 2.45, left_in: float = 0.95, title_lines: int = 1) -> None:
    """Margins in inches (room for device labels on the left, the key on the right and the
    title's lines on top) instead of ``tight_layout``, which draws the whole figure once more
    only to measure it: a third of a Gantt chart's time."""
    width, height = fig.get_size_inches()
    top_in = 0.4 + 0.2 * (title_lines - 1)
    fig.subplots_adjust(left=left_in / width, right=1 - right_in / width, bottom=0.55 / height, top=1 - top_in / height)


CAPACITY_IN_VIEW = 0.8
"""Memory charts include the capacity line (and zero) when a curve passes this share of it;
below, they zoom on the curves and the key gives the capacity."""


def _memory_unit(peak_bytes: float) -> tuple[float, str]:
    return (_GiB, "GiB") if peak_bytes >= 0.5 * _GiB else (2.0**20, "MiB")


def _memory_rows(result: SimResult, lines: int = MEMORY_LINES, *, by_class: bool = False) -> list:
    """The rows a memory chart draws: the Gantt chart's (``plot_rows``), at most ``lines`` of them
    evenly spaced, the first and the last included."""
    rows = plot_rows(result, by_class=by_class).rows
    if len(rows) <= lines:
        return list(rows)
    return [rows[round(i * (len(rows) - 1) / (lines - 1))] for i in range(lines)]


def _draw_memory(ax, result: SimResult, scale: float, name: str, *, capacity_in_view: bool,
                 capacity_note: bool = True, keyed: int = MEMORY_LINES, by_class: bool = False) -> None:
    """One step line per row (``_memory_rows``) and the capacity: a red dashed line when in view,
    else (unless ``capacity_note`` is False: a title says it) its value in the key. Past ten
    lines the colours run along the rows (viridis, first dark), so that none repeats; past
    ``keyed`` lines the key names the first and the last only."""
    # matplotlib only when a figure is drawn: keeps it off the import path of what prints text
    from matplotlib import colormaps
    from matplotlib.lines import Line2D

    rows = _memory_rows(result, by_class=by_class)
    ramp = colormaps["viridis"] if len(rows) > 10 else None
    for i, row in enumerate(rows):
        times, values = result.memory_timeline(row.device)
        times = [t * 1e3 for t in times] + [result.end_s * 1e3]
        values = [v / scale for v in values] + [values[-1] / scale]
        colour = None if ramp is None else ramp(0.9 * i / max(len(rows) - 1, 1))
        if len(rows) <= keyed:
            label = row.label
        else:  # the first and the last row named, the rest between them in colour
            label = {0: f"{row.label} (dark)", len(rows) - 1: f"{row.label} (light)"}.get(i, "_")
        ax.step(times, values, where="post", color=colour, label=label)

    capacity = result.workload.capacity_bytes
    label = f"capacity {format_bytes(capacity)}"
    if capacity < result.workload.device_memory_bytes:
        label = f"usable {format_bytes(capacity)} of {format_bytes(result.workload.device_memory_bytes)}"
    handles, _ = ax.get_legend_handles_labels()
    if capacity_in_view:
        handles.append(ax.axhline(capacity / scale, color="red", linestyle="--", label=label))
    elif capacity_note:
        share = result.summarize().peak_memory_bytes / capacity
        percent = f"{share:.0%}" if share >= 0.01 else f"{share:.2%}"
        handles.append(Line2D([], [], color="red", linestyle="--", label=f"{label},\n"
                              f"above the scale (zoomed\non the curves; peak {percent} of it)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize="x-small", frameon=False,
              borderaxespad=0.0)
    ax.set_ylabel(f"memory ({name})")


def memory_figure(result: SimResult, *, title: str | None = None, ax=None) -> Any:
    """Memory of each device (or class representative) over time, scaled to the curves.

    The device's capacity is a red dashed line when a curve comes near it (above
    ``CAPACITY_IN_VIEW`` of it); otherwise the axis stays on the curves, so that a small run
    is not a flat line at the bottom, and the key gives the capacity. GiB, or MiB for peaks
    under half a GiB.
    """
    plt = _pyplot()
    own = ax is None
    rows = _memory_rows(result)
    if own:  # tall enough for a key line a curve and the capacity's three
        fig, ax = plt.subplots(figsize=(12, max(4.0, 0.16 * len(rows) + 1.9)))
        _fixed_margins(fig, right_in=2.4)
    else:
        fig = ax.figure
    values = [v for row in rows for v in result.memory_timeline(row.device)[1]]
    peak, low = max(values, default=0.0), min(values, default=0.0)
    capacity = result.workload.capacity_bytes
    scale, name = _memory_unit(peak)
    in_view = peak > CAPACITY_IN_VIEW * capacity
    _draw_memory(ax, result, scale, name, capacity_in_view=in_view)
    if in_view:
        ax.set_ylim(0, max(peak, capacity) / scale * 1.06)
    else:
        pad = 0.15 * max(peak - low, 0.05 * peak)
        ax.set_ylim(max(0.0, low - pad) / scale, (peak + pad) / scale)
    ax.set_xlim(0, result.end_s * 1e3 * 1.01)
    set_time_axis(ax, result.end_s * 1.01)
    ax.set_title(wrap_to_width(title or f"{result.workload.name}: memory per device", fig.get_figwidth() - 0.95),
                 loc="left", fontsize="medium")
    if not own:
        fig.tight_layout()
    return fig


# --- comparing schedules --------------------------------------------------------------------


def _memory_scale(results: Mapping[str, SimResult], summaries: Mapping) -> tuple[float, float, bool]:
    """(bottom, top) GiB of one memory scale for every panel, and whether the capacity is in view:
    zoomed on the curves unless one comes near the capacity."""
    peak_gib = max(s.peak_memory_bytes for s in summaries.values()) / _GiB
    low_gib = min(min(r.memory_timeline(row.device)[1]) for r in results.values()
                  for row in _memory_rows(r, by_class=True)) / _GiB
    capacity_gib = max(r.workload.capacity_bytes for r in results.values()) / _GiB
    show_capacity = peak_gib > CAPACITY_IN_VIEW * capacity_gib
    top_gib = max(peak_gib, capacity_gib) * 1.06 if show_capacity else peak_gib + 0.15 * max(peak_gib - low_gib, 0.1)
    bottom_gib = 0.0 if show_capacity else max(0.0, low_gib - 0.15 * max(peak_gib - low_gib, 0.1))
    return bottom_gib, top_gib, show_capacity


def schedule_comparison_figure(results: Mapping[str, SimResult], *, title: str | None = None) -> Any:
    """Gantt charts of several replays stacked on one time axis, each above its memory timeline.

    ``results`` maps a label (the schedule) to a replay, typically of the same plan; identical
    replicas share a row (``sim.report.plots.rows``), so the differences between schedules are
    what stands out. The rows shrink so that the figure stays within ``MAX_HEIGHT_IN``.
    """
    plt = _pyplot()
    if not results:
        raise ValueError("schedule_comparison_figure needs at least one result")
    names = list(results)
    chosen = {name: plot_rows(results[name], by_class=True) for name in names}
    total_rows = sum(len(c.rows) for c in chosen.values())
    per_row = _row_in(total_rows, len(names) * 1.75 + 2.6, per_row_in=0.26) / 0.62
    heights = []
    for name in names:
        heights += [per_row * len(chosen[name].rows) + 0.75, 1.6]
    fig, axes = plt.subplots(len(heights), 1, figsize=(12, min(0.62 * sum(heights) + 1.4, MAX_HEIGHT_IN)),
                             sharex=True, gridspec_kw={"height_ratios": heights})
    end_s = max(r.iteration_time_s for r in results.values())
    summaries = {name: r.summarize() for name, r in results.items()}  # a summary a device: once each
    bottom_gib, top_gib, show_capacity = _memory_scale(results, summaries)
    handles: list = []
    for i, name in enumerate(names):
        result, gantt_ax, memory_ax = results[name], axes[2 * i], axes[2 * i + 1]
        s = summaries[name]
        rows = [(r.device, r.count) for r in chosen[name].rows]
        handles += draw_gantt(gantt_ax, result.event_rows([d for d, _ in rows]), rows,
                              result.workload.num_microbatches, end_s, key=False,
                              communication=communication_lanes(result, [d for d, _ in rows]),
                              labels=[r.label for r in chosen[name].rows])
        gantt_ax.tick_params(axis="y", labelsize=min(10.0, 72 * 0.62 * per_row * 0.8))
        oom = "  OUT OF MEMORY" if s.oom else ""
        note = f" ({chosen[name].note})" if chosen[name].note else ""
        gantt_ax.set_title(f"{name}: {format_duration(s.iteration_time_s)} per iteration, bubble "
                           f"{s.bubble_fraction:.1%}, peak memory {s.peak_memory_bytes / _GiB:.2f} GiB{oom}{note}",
                           loc="left", fontsize="medium", color="red" if oom else "black")
        _draw_memory(memory_ax, result, _GiB, "GiB", capacity_in_view=show_capacity, capacity_note=False, keyed=4,
                     by_class=True)
        capacity_gib = result.workload.capacity_bytes / _GiB
        total_gib = result.workload.device_memory_bytes / _GiB
        usable = f"usable {capacity_gib:.3g} of {total_gib:.3g} GiB" if capacity_gib < total_gib \
            else f"capacity {capacity_gib:.3g} GiB"
        memory_ax.set_title("memory" + ("" if show_capacity else f" ({usable}, above the scale)"), loc="left",
                            fontsize="small", color="0.3")
        memory_ax.set_ylim(bottom_gib, top_gib)
        for ax in (gantt_ax, memory_ax):
            ax.set_xlabel("")
    axes[-1].set_xlim(0, end_s * 1e3 * 1.01)
    for ax in axes:  # shared x axis: one locator, labels on the bottom panel
        set_time_axis(ax, end_s * 1.01, label=ax is axes[-1])
    heading = wrap_to_width(title or f"{next(iter(results.values())).workload.name}: schedules compared",
                            fig.get_figwidth() - 0.5, points=12, max_lines=2)
    fig.suptitle(heading, fontsize="large")
    key = merge_keys(handles)  # one key for every panel, under the time axis
    columns = min(len(key), 4)
    fig.legend(handles=key, loc="lower center", ncol=columns, fontsize="small", frameon=False)
    lines = max(h.get_label().count("\n") + 1 for h in key)
    key_rows = -(-len(key) // columns) + lines - 1
    _stacked_margins(fig, len(heights), left_in=max(_left_in(c) for c in chosen.values()),
                     bottom_in=0.2 * key_rows + 0.1 + 0.5,
                     top_in=0.6 + 0.24 * (heading.count("\n") + 1))  # the heading, then the first panel's title
    return fig


def _stacked_margins(fig, panels: int, *, left_in: float, bottom_in: float, top_in: float,
                     right_in: float = 2.45, gap_in: float = 0.42) -> None:
    """Margins and gaps in inches for stacked panels (the row labels on the left, the key
    under the time axis, the memory panels' keys on the right, each panel's title in the gap
    above it) instead of ``tight_layout``, which draws the whole figure once more only to
    measure it."""
    width, height = fig.get_size_inches()
    usable_in = max(height - top_in - bottom_in, 0.5 * height)
    axis_in = max((usable_in - (panels - 1) * gap_in) / panels, 0.05)
    fig.subplots_adjust(left=left_in / width, right=1 - right_in / width, bottom=bottom_in / height,
                        top=1 - top_in / height, hspace=gap_in / axis_in)
