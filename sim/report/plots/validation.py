"""Comparison charts: a validation report's prediction over its measurement, and a faulty
replay against its fault-free twin.

``validation_gantt_figure`` draws the predicted and the measured timelines one above the
other on the same time axis (one row per device, in ``sim.report.plots.timeline.gantt_figure``'s
colours and key), and
``validation_memory_figure`` the predicted and measured peak memory of every device with the
relative error. Both read a ``sim.core.validation_report.ValidationReport``
(``sim.report.analysis.validation.compare``'s, or a recorded one read back with
``ValidationReport.from_json``), so a recorded report can be drawn again without the simulator
or torch.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from sim.core.events import EventRow
from sim.core.validation_report import ValidationReport
from sim.core.validation_sides import RunSide
from sim.report.plots.gantt import add_key, draw_gantt
from sim.report.plots.style import GiB as _GiB
from sim.report.plots.style import format_duration, time_unit
from sim.report.plots.style import pyplot as _pyplot

__all__ = ["draw_rows", "fault_impact_figure", "validation_figure", "validation_gantt_figure", "validation_memory_figure"]


def draw_rows(ax, rows: Sequence[EventRow], *, num_microbatches: int | None = None, end_s: float | None = None,
              key: bool = True) -> list:
    """Draw event rows (a validation report side's ``events``) as a Gantt chart on ``ax``, with
    the same colours and key as ``sim.report.plots.timeline.gantt_figure``; the time axis runs
    to ``end_s`` (default: the last event's end)."""
    devices = sorted({row.device for row in rows})
    count = num_microbatches or 1 + max((row.microbatch or 0 for row in rows), default=0)
    end = end_s if end_s is not None else max((row.end_s for row in rows), default=0.0)
    return draw_gantt(ax, rows, [(d, 1) for d in devices], count, end, key=key)


def _step_end_s(side: RunSide) -> float:
    """When the drawn step ended: its last event (the slowest rank's optimizer step). A
    measured side draws one step (the median one), whose time need not be the median."""
    return max((row.end_s for row in side.events), default=side.iteration_time_s)


def validation_gantt_figure(report: ValidationReport) -> Any:
    """Predicted (top) and measured (bottom) timelines of one step on a shared time axis.

    Each panel's dotted line is the end of the step it draws: for the prediction its
    iteration time, for the measurement the step whose time is the median (with an even
    number of steps the upper of the two middle ones, so the title gives both).
    """
    plt = _pyplot()
    predicted, measured = report.predicted, report.measured
    num_devices = len(predicted.devices)
    fig, axes = plt.subplots(2, 1, sharex=True, figsize=(12, 1.0 * num_devices + 2.8))
    end_s = max(_step_end_s(predicted), _step_end_s(measured), predicted.iteration_time_s)
    num_mb = 1 + max((row.microbatch or 0 for side in (predicted, measured) for row in side.events), default=0)
    handles = []
    for ax, side, label in ((axes[0], predicted, "predicted"), (axes[1], measured, "measured")):
        handles += draw_rows(ax, side.events, num_microbatches=num_mb, end_s=end_s, key=False)
        step_s = _step_end_s(side) if label == "measured" else side.iteration_time_s
        ax.axvline(step_s * 1e3, color="black", linestyle=":", linewidth=1)
        if label == "measured":
            steps = len(side.iteration_times_s or ())
            title = (f"measured: the median step, {step_s * 1e3:.2f} ms (median of {steps} steps: "
                     f"{side.iteration_time_s * 1e3:.2f} ms)")
        else:
            title = f"predicted: {step_s * 1e3:.2f} ms per iteration"
        ax.set_title(title, loc="left", fontsize="medium")
        ax.set_xlabel("")
    add_key(axes[0], handles)
    unit = time_unit(end_s * 1.01)[1]  # the unit draw_gantt's ticks read in
    axes[1].set_xlabel(f"time since the step started ({unit}); dotted: the end of the step drawn")
    error = report.error.iteration_time_frac
    fig.suptitle(f"{report.scenario or ''} ({report.schedule or ''}): iteration time error "
                 f"{error:+.1%}" if error is not None else report.scenario or "")
    fig.tight_layout()
    return fig


def validation_memory_figure(report: ValidationReport) -> Any:
    """Predicted and measured peak memory per device, with the relative error over each pair."""
    plt = _pyplot()
    predicted = report.predicted.devices
    measured = {d.device: d for d in report.measured.devices}
    errors = {e.device: e.peak_memory_frac for e in report.error.devices}
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(predicted) + 2), 4.2))
    unit, name = (_GiB, "GiB") if max(d.peak_memory_bytes for d in predicted) > _GiB else (2.0**20, "MiB")
    top = 0.0
    for i, device in enumerate(predicted):
        p = device.peak_memory_bytes / unit
        m = (measured[device.device].peak_memory_bytes or 0) / unit
        top = max(top, p, m)
        ax.bar(i - 0.2, p, width=0.4, color="tab:blue", label="predicted" if i == 0 else None)
        ax.bar(i + 0.2, m, width=0.4, color="tab:orange", label="measured" if i == 0 else None)
        if errors.get(device.device) is not None:
            ax.annotate(f"{errors[device.device]:+.1%}", (i, max(p, m)), ha="center", va="bottom")
    ax.set_xticks(range(len(predicted)), [f"dev {d.device}" for d in predicted])
    kind = "parameters, gradients, optimizer state\nand saved activations" if report.memory == "counted" \
        else "allocator peak"
    ax.set_ylabel(f"peak memory ({name})")
    ax.set_ylim(0, top * 1.25 or 1.0)  # room for the error labels and the key above the bars
    ax.set_title(f"peak memory per device ({kind})", fontsize="medium")
    ax.legend(loc="upper center", ncol=2, fontsize="small", frameon=False)
    fig.tight_layout()
    return fig


def fault_impact_figure(result) -> Any:
    """Idle time per device with and without the scenario's faults (``SimResult.baseline``)."""
    plt = _pyplot()
    impact = result.summarize().fault_impact
    rows = impact.devices
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(rows) + 2), 4))
    xs = range(len(rows))
    unit_s, unit = time_unit(max([r.fault_free_idle_s for r in rows] + [r.idle_s or 0.0 for r in rows], default=0.0))
    ax.bar([x - 0.2 for x in xs], [r.fault_free_idle_s / unit_s for r in rows], width=0.4, color="0.6",
           label=f"fault-free ({format_duration(impact.fault_free_iteration_time_s)} per iteration)")
    ax.bar([x + 0.2 for x in xs], [(r.idle_s or 0.0) / unit_s for r in rows], width=0.4, color="tab:red",
           label=f"with faults ({format_duration(result.iteration_time_s)})" if result.iteration_time_s else "with faults")
    ax.set_xticks(list(xs), [f"{r.device}" for r in rows])
    ax.set_xlabel("device")
    ax.set_ylabel(f"idle time per iteration ({unit})")
    ax.set_title(f"{result.workload.name}: idle time with and without faults"
                 + (f" ({impact.slowdown:.2f}x slower)" if impact.slowdown else ""))
    ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    return fig


def validation_figure(run: ValidationReport | Mapping[str, Any], *, title: str | None = None,
                      placeholder: bool | None = None) -> Any:
    """Predicted against measured for one validation run (``dapple-run validate``): iteration
    time, compute time and peak memory per device, and both Gantt charts.

    ``run`` is a report, or a recorded one's JSON (read with ``ValidationReport.from_json``;
    a notebook's recording may flag itself ``placeholder``, which the title then says unless
    ``placeholder`` is given).
    """
    if isinstance(run, Mapping):
        placeholder = bool(run.get("placeholder")) if placeholder is None else placeholder
        run = ValidationReport.from_json(run)
    plt = _pyplot()
    predicted, measured, error = run.predicted, run.measured, run.error
    fig = plt.figure(figsize=(12, 9.5))
    grid = fig.add_gridspec(3, 3, height_ratios=[1.15, 1, 1], hspace=0.55, wspace=0.32, right=0.84)
    colours = {"predicted": "C0", "measured": "C1"}

    ax = fig.add_subplot(grid[0, 0])
    times = [predicted.iteration_time_s * 1e3, measured.iteration_time_s * 1e3]
    ax.bar(["predicted", "measured"], times, color=[colours["predicted"], colours["measured"]])
    for x, t in enumerate(times):
        ax.text(x, t, f"{t:.3g} ms", ha="center", va="bottom", fontsize="small")
    frac = error.iteration_time_frac
    ax.set_title("iteration time" + (f" (error {frac:+.1%})" if frac is not None else ""), fontsize="medium")
    ax.set_ylabel("ms")
    ax.set_ylim(0, max(times) * 1.2)

    devices = sorted({d.device for d in predicted.devices} | {d.device for d in measured.devices})
    peak = max([d.peak_memory_bytes for d in predicted.devices + measured.devices if d.peak_memory_bytes is not None]
               + [1.0])
    unit, div = ("GiB", _GiB) if peak >= _GiB else ("MiB", 2.0**20)
    for column, (key, name, scale) in enumerate((("compute_s", "compute per device (ms)", 1e3),
                                                 ("peak_memory_bytes", f"peak memory per device ({unit})", 1 / div)),
                                                start=1):
        ax = fig.add_subplot(grid[0, column])
        x = np.arange(len(devices))
        for k, (label, side) in enumerate((("predicted", predicted), ("measured", measured))):
            by_device = {d.device: getattr(d, key) for d in side.devices}
            values = [by_device.get(d) for d in devices]
            ax.bar(x + (k - 0.5) * 0.4, [np.nan if v is None else v * scale for v in values], 0.38,
                   color=colours[label], label=label)
        ax.set_xticks(x, [f"dev {d}" for d in devices])
        ax.set_title(name, fontsize="medium")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.25)  # room for the legend above the bars
        ax.legend(fontsize="x-small", loc="upper center", ncol=2, frameon=False)

    _draw_both_gantts(fig, grid, run, devices, colours)
    flag = "  [PLACEHOLDER DATA]" if placeholder else ""
    fig.suptitle(title or f"{run.scenario or ''}: {run.schedule or ''} on {run.nproc or '?'} "
                 f"{run.backend or ''} processes, {run.steps or '?'} steps{flag}", fontsize="large")
    return fig


def _draw_both_gantts(fig, grid, run: ValidationReport, devices: list[int], colours: dict[str, str]) -> None:
    """The predicted and the measured Gantt chart in the grid's last two rows, on one time axis."""
    predicted, measured = run.predicted, run.measured
    end_s = max([r.end_s for r in predicted.events + measured.events]
                + [predicted.iteration_time_s, measured.iteration_time_s])
    rows = [(d, 1) for d in devices]
    first, handles, gantts = None, [], []
    for row, (label, side) in enumerate((("predicted", predicted), ("measured", measured)), start=1):
        ax = fig.add_subplot(grid[row, :], sharex=first)
        first = first or ax
        gantts.append(ax)
        num_mb = max([e.microbatch for e in side.events if e.microbatch is not None] + [0]) + 1
        handles += draw_gantt(ax, list(side.events), rows, num_mb, end_s, key=False)
        if label == "measured" and side.events:  # one step drawn, the median one: its time need not be the median
            heading = (f"measured: the median step, {_step_end_s(side) * 1e3:.3g} ms (median of the steps "
                       f"{side.iteration_time_s * 1e3:.3g} ms)")
        else:
            heading = f"{label}: {side.iteration_time_s * 1e3:.3g} ms"
        ax.set_title(heading, loc="left", fontsize="medium", color=colours[label])
    add_key(gantts[0], handles)
