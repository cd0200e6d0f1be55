"""Plots of a replay: a Gantt chart of what every device did, and memory over time.

One function per figure, each taking a ``SimResult`` and returning a matplotlib ``Figure``
(the CLI saves them; notebooks show them). matplotlib is imported inside the functions so
that the core stays light, and with the non-interactive Agg backend when nothing else was
chosen, so plots work on machines without a screen.

In the Gantt chart each row is a device (one per class of identical devices when there are
many, labelled with how many it stands for). Forward passes are light, backward passes dark,
in the colour of their micro-batch; a weight-gradient pass (W) is hatched; the gradient
all-reduce is a grey bar under the row and the optimizer step a black one.
"""

from __future__ import annotations

from typing import Any

from sim.result import SimResult

__all__ = ["gantt_figure", "memory_figure", "rows_to_plot"]

_GiB = 2.0**30


def _pyplot():
    import matplotlib

    if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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
    cmap = plt.get_cmap("tab20")
    events = result.event_rows([d for d, _ in rows])
    index = {d: i for i, (d, _) in enumerate(rows)}
    num_mb = result.workload.num_microbatches
    for row in events:
        y = index[row["device"]]
        start, width = row["start_s"] * 1e3, (row["end_s"] - row["start_s"]) * 1e3
        if width <= 0:
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
    ax.set_xlim(0, result.iteration_time_s * 1e3 * 1.01)
    s = result.summary()
    ax.set_title(title or f"{s['name']}: {s['schedule']}, {s['iteration_time_s'] * 1e3:.1f} ms per iteration, "
                 f"bubble {s['bubble_fraction']:.1%}")
    fig.tight_layout()
    return fig


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
        times = [t * 1e3 for t in times] + [result.iteration_time_s * 1e3]
        values = [v / _GiB for v in values] + [values[-1] / _GiB]
        ax.step(times, values, where="post", label=f"dev {device}" + (f" (x{count})" if count > 1 else ""))
    ax.axhline(result.workload.device_memory_bytes / _GiB, color="red", linestyle="--", label="capacity")
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("memory (GiB)")
    ax.legend(loc="upper right", fontsize="small", ncol=2)
    ax.set_title(title or f"{result.workload.name}: memory per device")
    fig.tight_layout()
    return fig
