"""Plots of one replay: a Gantt chart of what every device did, memory over time, and
several replays of one plan (its schedules) stacked on one time axis.

One function per figure, each returning a matplotlib ``Figure`` (the CLI saves them;
notebooks show them); each takes a ``SimResult``.

In the Gantt chart each row is a device (one per class of identical devices when there are
many, labelled with how many it stands for). Forward passes are light, backward passes dark,
in the colour of their micro-batch; a weight-gradient pass (W) is hatched; the gradient
all-reduce is a grey bar under the row and the optimizer step a black one.
"""

from __future__ import annotations

from typing import Any, Mapping

from sim.engine.result import SimResult
from sim.plots.style import GiB as _GiB
from sim.plots.style import pyplot as _pyplot

__all__ = ["LEGEND", "draw_gantt", "gantt_figure", "memory_figure", "rows_to_plot", "schedule_comparison_figure"]


def rows_to_plot(result: SimResult, limit: int = 32) -> list[tuple[int, int]]:
    """(device, devices it stands for): every device if few, else one per class."""
    classes = result.workload.classes
    if result.workload.num_devices <= limit:
        return [(d, 1) for d in result.workload.devices]
    rows = sorted((cls.devices[0], len(cls.devices)) for cls in classes)
    return rows[:limit]


def _colour(cmap, microbatch: int | None, num_microbatches: int):
    if microbatch is None:
        return "0.5"
    return cmap((microbatch % 20) / 20.0 if num_microbatches > 10 else microbatch / max(num_microbatches, 10))


def gantt_figure(result: SimResult, *, title: str | None = None, ax=None) -> Any:
    """Gantt chart: one row per device, time in milliseconds."""
    plt = _pyplot()
    rows = rows_to_plot(result)
    if ax is None:
        fig, ax = plt.subplots(figsize=(12, 0.45 * len(rows) + 1.5))
    else:
        fig = ax.figure
    events = result.event_rows([d for d, _ in rows])
    draw_gantt(ax, events, rows, result.workload.num_microbatches, result.end_s)
    s = result.summarize()
    if title is None and s.failure is not None:
        title = f"{s.name}: {s.schedule}, {s.failure.message}"
    ax.set_title(title or f"{s.name}: {s.schedule}, {s.iteration_time_s * 1e3:.1f} ms per iteration, "
                 f"bubble {s.bubble_fraction:.1%}")
    fig.tight_layout()
    return fig


def draw_gantt(ax, events, rows: list[tuple[int, int]], num_mb: int, end_s: float) -> None:
    """Bars of compute ``events`` (event-row dicts) on one row per (device, devices it stands for)."""
    plt = _pyplot()
    cmap = plt.get_cmap("tab20")
    index = {d: i for i, (d, _) in enumerate(rows)}
    for row in events:
        y = index.get(row["device"])
        start, width = row["start_s"] * 1e3, (row["end_s"] - row["start_s"]) * 1e3
        if y is None or width <= 0:
            continue
        kind = row["kind"]
        if kind in ("F", "B", "I", "W"):
            colour = _colour(cmap, row["microbatch"], num_mb)
            alpha = 0.45 if kind == "F" else 1.0
            ax.barh(y, width, left=start, height=0.7, color=colour, alpha=alpha, edgecolor="white", linewidth=0.3,
                    hatch="///" if kind == "W" else None)
        elif kind == "REDUCE_GRAD":
            ax.barh(y + 0.42, width, left=start, height=0.14, color="0.55")
        elif kind == "OPTIM":
            ax.barh(y, width, left=start, height=0.7, color="black")
    labels = [f"dev {d}" + (f" (x{n})" if n > 1 else "") for d, n in rows]
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_xlim(0, end_s * 1e3 * 1.01)


def memory_figure(result: SimResult, *, title: str | None = None, ax=None) -> Any:
    """Memory of each device (or class representative) over time, with the capacity."""
    plt = _pyplot()
    if ax is None:
        fig, ax = plt.subplots(figsize=(12, 4))
    else:
        fig = ax.figure
    # identical devices have identical curves: one line per class
    rows = sorted((cls.devices[0], len(cls.devices)) for cls in result.workload.classes)[:16]
    for device, count in rows:
        times, values = result.memory_timeline(device)
        times = [t * 1e3 for t in times] + [result.end_s * 1e3]
        values = [v / _GiB for v in values] + [values[-1] / _GiB]
        ax.step(times, values, where="post", label=f"dev {device}" + (f" (x{count})" if count > 1 else ""))
    ax.axhline(result.workload.device_memory_bytes / _GiB, color="red", linestyle="--", label="capacity")
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("memory (GiB)")
    ax.legend(loc="upper right", fontsize="small", ncol=2)
    ax.set_title(title or f"{result.workload.name}: memory per device")
    fig.tight_layout()
    return fig


# --- comparing schedules --------------------------------------------------------------------

LEGEND = ("light: forward  dark: backward  hatched: weight gradient (W)  grey under the row: "
           "gradient all-reduce  black: optimizer step")


def _class_rows(result: SimResult) -> list[tuple[int, int]]:
    """One row per class of identical devices: (first device, devices it stands for)."""
    return sorted((cls.devices[0], len(cls.devices)) for cls in result.workload.classes)


def schedule_comparison_figure(results: Mapping[str, SimResult], *, title: str | None = None) -> Any:
    """Gantt charts of several replays stacked on one time axis, each above its memory timeline.

    ``results`` maps a label (the schedule) to a replay, typically of the same plan; identical
    replicas share a row, so the differences between schedules are what stands out.
    """
    plt = _pyplot()
    if not results:
        raise ValueError("schedule_comparison_figure needs at least one result")
    names = list(results)
    heights = []
    for name in names:
        heights += [0.42 * len(_class_rows(results[name])) + 0.75, 1.6]
    fig, axes = plt.subplots(len(heights), 1, figsize=(12, 0.62 * sum(heights) + 1.4), sharex=True,
                             gridspec_kw={"height_ratios": heights})
    end_s = max(r.iteration_time_s for r in results.values())
    # one memory scale for all panels; zoomed on the curves unless one comes near the capacity
    peak_gib = max(r.summarize().peak_memory_bytes for r in results.values()) / _GiB
    low_gib = min(min(r.memory_timeline(d)[1]) for r in results.values() for d, _ in _class_rows(r)) / _GiB
    capacity_gib = max(r.workload.device_memory_bytes for r in results.values()) / _GiB
    show_capacity = peak_gib > 0.8 * capacity_gib
    top_gib = max(peak_gib, capacity_gib) * 1.06 if show_capacity else peak_gib + 0.15 * max(peak_gib - low_gib, 0.1)
    bottom_gib = 0.0 if show_capacity else max(0.0, low_gib - 0.15 * max(peak_gib - low_gib, 0.1))
    for i, name in enumerate(names):
        result, gantt_ax, memory_ax = results[name], axes[2 * i], axes[2 * i + 1]
        s = result.summarize()
        draw_gantt(gantt_ax, result.event_rows(), _class_rows(result), result.workload.num_microbatches, end_s)
        oom = "  OUT OF MEMORY" if s.oom else ""
        gantt_ax.set_title(f"{name}: {s.iteration_time_s * 1e3:.1f} ms per iteration, bubble "
                           f"{s.bubble_fraction:.1%}, peak memory {s.peak_memory_bytes / _GiB:.2f} GiB{oom}",
                           loc="left", fontsize="medium", color="red" if oom else "black")
        memory_figure(result, ax=memory_ax)
        memory_ax.set_title("")
        note = "" if show_capacity else f" (capacity {capacity_gib:.3g} GiB, above the scale)"
        memory_ax.set_title("memory" + note, loc="left", fontsize="small", color="0.3")
        memory_ax.set_ylim(bottom_gib, top_gib)
        memory_ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize="x-small", ncol=4, frameon=False,
                         borderaxespad=0.1)
        for ax in (gantt_ax, memory_ax):
            ax.set_xlabel("")
    axes[-1].set_xlabel("time (ms)")
    axes[-1].set_xlim(0, end_s * 1e3 * 1.01)
    fig.suptitle(title or f"{next(iter(results.values())).workload.name}: schedules compared", fontsize="large")
    fig.text(0.5, 0.005, LEGEND, ha="center", va="bottom", fontsize="small", color="0.3")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    return fig
