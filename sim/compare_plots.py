"""Comparison charts: a validation report's prediction over its measurement, and a faulty
replay against its fault-free twin.

``validation_gantt_figure`` draws the predicted and the measured timelines one above the
other on the same time axis (one row per device; forwards light and backwards dark in the
colour of their micro-batch, as ``sim.plots.gantt_figure`` does), and
``validation_memory_figure`` the predicted and measured peak memory of every device with the
relative error. Both read only the JSON report (``sim.validation.compare``), so a recorded
report can be drawn again without the simulator or torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["draw_rows", "fault_impact_figure", "validation_gantt_figure", "validation_memory_figure"]

_GiB = 2.0**30


def _pyplot():
    from sim.plots import _pyplot as pyplot

    return pyplot()


def draw_rows(ax, rows: list[dict[str, Any]], *, num_microbatches: int | None = None) -> None:
    """Draw event rows (``SimResult.event_rows`` format) as a Gantt chart on ``ax``."""
    plt = _pyplot()
    cmap = plt.get_cmap("tab20")
    devices = sorted({row["device"] for row in rows})
    index = {d: i for i, d in enumerate(devices)}
    mbs = num_microbatches or 1 + max((row["microbatch"] or 0 for row in rows), default=0)
    for row in rows:
        start, width = row["start_s"] * 1e3, (row["end_s"] - row["start_s"]) * 1e3
        if width <= 0:
            continue
        y = index[row["device"]]
        kind = row["kind"]
        if kind in ("F", "B", "I", "W"):
            m = row["microbatch"] or 0
            colour = cmap((m % 20) / 20.0 if mbs > 10 else m / max(mbs, 10))
            ax.barh(y, width, left=start, height=0.7, color=colour, alpha=0.45 if kind == "F" else 1.0,
                    edgecolor="white", linewidth=0.3, hatch="///" if kind == "W" else None)
        elif kind == "REDUCE_GRAD":
            ax.barh(y + 0.42, width, left=start, height=0.14, color="0.55")
    ax.set_yticks(range(len(devices)), [f"dev {d}" for d in devices])
    ax.invert_yaxis()


def validation_gantt_figure(report: dict[str, Any]) -> Any:
    """Predicted (top) and measured (bottom) timelines of one step on a shared time axis."""
    plt = _pyplot()
    predicted, measured = report["predicted"], report["measured"]
    num_devices = len(predicted["devices"])
    fig, axes = plt.subplots(2, 1, sharex=True, figsize=(12, 1.2 * num_devices + 2.5))
    for ax, side, label in ((axes[0], predicted, "predicted"), (axes[1], measured, "measured")):
        draw_rows(ax, side["events"])
        ax.axvline(side["iteration_time_s"] * 1e3, color="black", linestyle=":", linewidth=1)
        ax.set_title(f"{label}: {side['iteration_time_s'] * 1e3:.2f} ms per iteration")
    axes[1].set_xlabel("time since the step started (ms)")
    error = report["error"]["iteration_time_frac"]
    fig.suptitle(f"{report.get('scenario', '')} ({report.get('schedule', '')}): iteration time error "
                 f"{error:+.1%}" if error is not None else report.get("scenario", ""))
    fig.tight_layout()
    return fig


def validation_memory_figure(report: dict[str, Any]) -> Any:
    """Predicted and measured peak memory per device, with the relative error over each pair."""
    plt = _pyplot()
    predicted = report["predicted"]["devices"]
    measured = {d["device"]: d for d in report["measured"]["devices"]}
    errors = {e["device"]: e["peak_memory_frac"] for e in report["error"]["devices"]}
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(predicted) + 2), 4))
    unit, name = (_GiB, "GiB") if max(d["peak_memory_bytes"] for d in predicted) > _GiB else (2.0**20, "MiB")
    for i, device in enumerate(predicted):
        p = device["peak_memory_bytes"] / unit
        m = (measured[device["device"]]["peak_memory_bytes"] or 0) / unit
        ax.bar(i - 0.2, p, width=0.4, color="tab:blue", label="predicted" if i == 0 else None)
        ax.bar(i + 0.2, m, width=0.4, color="tab:orange", label="measured" if i == 0 else None)
        if errors.get(device["device"]) is not None:
            ax.annotate(f"{errors[device['device']]:+.1%}", (i, max(p, m)), ha="center", va="bottom")
    ax.set_xticks(range(len(predicted)), [f"dev {d['device']}" for d in predicted])
    kind = "parameters, gradients, optimizer state and saved activations" if report.get("memory") == "counted" \
        else "allocator peak"
    ax.set_ylabel(f"peak memory ({name})")
    ax.set_title(f"peak memory per device ({kind})", fontsize="medium")
    ax.legend(loc="lower right")
    fig.tight_layout()
    return fig


def fault_impact_figure(result) -> Any:
    """Idle time per device with and without the scenario's faults (``SimResult.baseline``)."""
    plt = _pyplot()
    impact = result.summary()["fault_impact"]
    rows = impact["devices"]
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(rows) + 2), 4))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["fault_free_idle_s"] * 1e3 for r in rows], width=0.4, color="0.6",
           label=f"fault-free ({impact['fault_free_iteration_time_s'] * 1e3:.1f} ms per iteration)")
    ax.bar([x + 0.2 for x in xs], [(r["idle_s"] or 0.0) * 1e3 for r in rows], width=0.4, color="tab:red",
           label=f"with faults ({result.iteration_time_s * 1e3:.1f} ms)" if result.iteration_time_s else "with faults")
    ax.set_xticks(list(xs), [f"{r['device']}" for r in rows])
    ax.set_xlabel("device")
    ax.set_ylabel("idle time per iteration (ms)")
    ax.set_title(f"{result.workload.name}: idle time with and without faults"
                 + (f" ({impact['slowdown']:.2f}x slower)" if impact["slowdown"] else ""))
    ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    return fig
