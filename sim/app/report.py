"""Reporting a replay: what ``dapple-sim simulate`` writes and prints.

``write_outputs`` saves the summary, the Perfetto trace, the per-action events and the
plots, each through ``sim.core.userfiles.open_output`` (an output path that is a folder, a device
or a full disk is one line naming the file) and the JSON through ``sim.core.jsonio`` (never NaN or
Infinity); ``format_summary`` is the short table printed on stdout, ending with ``format_run``'s "Run"
block when the scenario sets a run length (``sim.cost.capacity``: days, GPU-hours, cost,
energy, goodput, every assumption under the answer). The replay itself is
``sim.engine.run.run_scenario``.
"""

from __future__ import annotations

from pathlib import Path

from sim.core.errors import DappleError
from sim.core.fabric_traffic import FabricTraffic
from sim.core.jsonio import write_json
from sim.core.run_estimate import RunEstimate, RunTotals
from sim.core.summary import Summary, stage_groups
from sim.core.units import format_bytes, format_time
from sim.core.userfiles import open_output, show_path
from sim.engine.result import SimResult
from sim.engine.trace import perfetto_trace, traced_devices
from sim.report.plots.tiers import tiers_figure
from sim.report.plots.timeline import gantt_figure, memory_figure
from sim.report.plots.validation import fault_impact_figure

__all__ = ["format_fabric", "format_run", "format_summary", "write_outputs"]


def write_outputs(result: SimResult, out_dir: str | Path, *, trace_all: bool = False,
                  summary: Summary | None = None) -> list[Path]:
    """Write summary.json, trace.json, events.csv, gantt.png and memory.png into ``out_dir``
    (and faults.png, idle time with and without the faults, when the scenario has faults;
    tiers.png, traffic per fabric tier, when the cluster has a fabric);
    ``summary`` (with its ``run``) is what summary.json holds, by default ``result``'s own."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or "the path holds a NUL byte"
        raise DappleError(f"--out {show_path(out)}: cannot create the folder ({reason})") from None
    written = []
    path = out / "summary.json"
    write_json(path, result.summary() if summary is None else summary.to_json(), indent=2, sort_keys=True)
    written.append(path)
    trace = out / "trace.json"
    devices = list(result.workload.devices) if trace_all else None
    write_json(trace, perfetto_trace(result, devices), separators=(",", ":"))
    written.append(trace)
    events = out / "events.csv"
    with open_output(events, "events") as handle:
        result.events(traced_devices(result) if not trace_all else None).to_csv(handle, index=False)
    written.append(events)
    figures = [("gantt.png", gantt_figure), ("memory.png", memory_figure)]
    if result.baseline is not None and result.baseline.iteration_time_s and result.iteration_time_s:
        figures.append(("faults.png", fault_impact_figure))
    if result.workload.fabric_traffic is not None and result.iteration_time_s:
        figures.append(("tiers.png", tiers_figure))
    for name, figure in figures:
        # matplotlib only when a figure is drawn: keeps it off the import path of what prints text
        import matplotlib.pyplot as plt

        fig = figure(result)
        try:
            with open_output(out / name, "plot", binary=True) as handle:
                fig.savefig(handle, dpi=110, format="png")
        finally:
            plt.close(fig)
        written.append(out / name)
    return written


def format_summary(summary: Summary, result: SimResult, *, notes: tuple[str, ...] = ()) -> str:
    """A short human-readable report: headline numbers, then one row per class of devices;
    ``notes`` (what the model was built with, e.g. its padded vocabulary) under the first line."""
    capacity = format_bytes(result.workload.device_memory_bytes)
    if result.workload.capacity_bytes < result.workload.device_memory_bytes:
        capacity += f" ({format_bytes(result.workload.capacity_bytes)} usable)"
    mode = summary.engine + (", contention" if summary.contention else ", no contention")
    lines = [
        f"{summary.name}: {summary.schedule}, {summary.num_stages} stages, "
        f"{summary.num_microbatches} micro-batches, {summary.num_devices} devices in "
        f"{summary.device_classes} classes ({mode})",
        *notes,
    ]
    if result.diverged is not None and summary.device_classes * 2 > summary.num_devices:
        lines.append(
            f"note: with contention the fault reached devices that share a port with one it touched "
            f"({result.diverged}), so {summary.device_classes} of {summary.num_devices} devices were replayed "
            "in their own classes; --no-contention (or --engine fast) splits only the devices that wait for it"
        )
    if summary.failure is not None:
        lines.append(f"FAILED: {summary.failure.message}")
    else:
        lines.append(
            f"iteration {format_time(summary.iteration_time_s)}   throughput "
            f"{summary.throughput_samples_per_s:.4g} samples/s   bubble {summary.bubble_fraction:.1%}   "
            f"peak memory {format_bytes(summary.peak_memory_bytes)} of {capacity}"
            + (f"   MFU {summary.mfu:.1%}" if summary.mfu is not None else "")
        )
    worst = summary.most_exposed
    if worst.communication_s > 0:  # what overlap hid (``sim.engine.exposure``)
        lines.append(
            f"communication: device {worst.device} exposes {format_time(worst.exposed_communication_s)} of "
            f"{format_time(worst.communication_s)} ({worst.overlap_fraction:.0%} hidden behind compute)"
        )
    impact = summary.fault_impact
    if impact is not None and impact.slowdown is not None:
        grown = sorted(impact.devices, key=lambda d: -(d.idle_growth_s or 0))[:3]
        most = "idle time grew most on " if (grown[0].idle_growth_s or 0) > 0 else \
            "idle time fell on every device, least on "
        lines.append(
            f"faults: {impact.slowdown:.3f}x the fault-free {format_time(impact.fault_free_iteration_time_s)}; "
            + most + ", ".join(f"device {d.device} ({_signed_time(d.idle_growth_s)})" for d in grown)
        )
    if summary.oom_detail is not None:
        lines.append(f"OUT OF MEMORY: {summary.oom_detail.message}")
    if summary.fabric is not None:
        lines += format_fabric(summary.fabric)
    run = () if summary.run is None else format_run(summary.run)
    if len(result.workload.classes) > MAX_CLASS_ROWS:
        lines += _stage_rows(summary, result)
        return "\n".join([*lines, *run])
    lines.append(f"  {'devices':<14} {'stage':>5} {'busy':>10} {'idle':>10} {'peak memory':>12} {'live mb':>7}")
    for cls in result.workload.classes:
        row = summary.device(cls.devices[0])
        stages = ",".join(map(str, row.stages))
        idle = "-" if row.idle_s is None else format_time(row.idle_s)
        lines.append(
            f"  {_ranges(list(cls.devices)):<14} {stages:>5} {format_time(row.busy_s):>10} "
            f"{idle:>10} {format_bytes(row.peak_memory_bytes):>12} "
            f"{row.peak_activation_microbatches:>7}"
        )
    return "\n".join([*lines, *run])


def format_fabric(fabric: FabricTraffic) -> list[str]:
    """The fabric block: per tier its bytes (by group kind), capacity and utilisation, then the busiest links."""
    lines = ["fabric (per direction, per iteration):"]
    for tier in fabric.tiers:
        kinds = ", ".join(f"{kind} {format_bytes(b)}" for kind, b in tier.bytes_by_kind) or "nothing"
        lines.append(f"  {tier.name:<10} {format_bytes(tier.bytes):>10}   capacity "
                     f"{format_bytes(tier.capacity_bytes_per_s)}/s   utilisation {tier.utilisation:.1%}   ({kinds})")
    if fabric.busiest:
        lines.append("  busiest links: " + ", ".join(f"{b.name} {b.utilisation:.1%}" for b in fabric.busiest))
    return lines


MAX_CLASS_ROWS = 32
"""More classes than this are reported one row per stage (``--json`` has every device)."""


def _stage_rows(summary: Summary, result: SimResult) -> list[str]:
    """One row per stage: its devices, the range of their busy and idle times, the largest peak."""
    lines = [f"  {'devices':<14} {'stage':>5} {'busy':>19} {'idle':>19} {'peak memory':>12} {'live mb':>7}"]
    for stages, rows in stage_groups(summary.devices):
        busy = [r.busy_s for r in rows]
        idle = [r.idle_s for r in rows if r.idle_s is not None]
        span = (lambda values: "-" if not values else format_time(min(values)) if min(values) == max(values)
                else f"{format_time(min(values))}-{format_time(max(values))}")
        lines.append(
            f"  {_ranges([r.device for r in rows]):<14} {','.join(map(str, stages)):>5} {span(busy):>19} "
            f"{span(idle):>19} {format_bytes(max(r.peak_memory_bytes for r in rows)):>12} "
            f"{max(r.peak_activation_microbatches for r in rows):>7}"
        )
    lines.append(f"  ({len(result.workload.classes)} device classes, a row per stage: busy and idle from least "
                 "to most, the largest peak; --json or --out for every device)")
    return lines


def _signed_time(seconds: float) -> str:
    return ("+" if seconds >= 0 else "-") + format_time(abs(seconds))


def _ranges(ids: list[int]) -> str:
    parts, start = [], None
    for i, value in enumerate(ids):
        if start is None:
            start = value
        if i + 1 == len(ids) or ids[i + 1] != value + 1:
            parts.append(f"{start}-{value}" if value != start else f"{start}")
            start = None
    text = ",".join(parts)
    return text if len(text) <= 14 else text[:11] + "..."


def format_run(run: RunEstimate) -> list[str]:
    """The block's lines: totals without failures, with failures when modelled, assumptions."""
    tokens = "" if run.tokens is None else f" ({run.tokens:.4g} tokens)"
    free, expected = run.failure_free, run.expected
    lines = [f"Run: {run.steps:,} steps{tokens} on {run.devices:,} devices"]
    days = f"{free.days:,.4g} days without failures"
    if expected is not None and run.monte_carlo is not None:
        carlo = run.monte_carlo
        days += (f"; {expected.days:,.4g} days expected with failures (Monte Carlo: mean {carlo.mean_s / 86400:,.4g}, "
                 f"p5-p95 {carlo.p5_s / 86400:,.4g}-{carlo.p95_s / 86400:,.4g} over {carlo.runs:,} runs, "
                 f"seed {carlo.seed})")
    lines.append(f"  time to train  {days}")
    lines.append(f"  GPU-hours      {_both(free, expected, lambda t: t.gpu_hours, '{:,.0f}')}")
    lines.append("  cost           " + (_both(free, expected, lambda t: t.cost, "{:,.0f}") if free.cost is not None
                                        else "no price set (cluster.price_per_gpu_hour)"))
    if free.energy_kwh is not None:
        lines.append(f"  energy         {_both(free, expected, lambda t: t.energy_kwh / 1000, _figures)} MWh")
    if free.carbon_kg is not None:
        lines.append(f"  carbon         {_both(free, expected, lambda t: t.carbon_kg / 1000, _figures)} t CO2e")
    if run.goodput is not None and run.checkpoint is not None:
        good, plan = run.goodput, run.checkpoint
        lines.append(f"  goodput        {good.goodput:.1%} ({good.expected_failures:,.3g} failures expected, cluster "
                     f"MTBF {good.cluster_mtbf_s / 3600:.3g} h; first order {1 - good.first_order_lost_fraction:.1%})")
        why = {"daly": "Daly 2006's optimum", "young": "Young 1974 on the blocking part, no shorter than a write",
               "given": "reliability.checkpoint.interval"}[plan.rule]
        lines.append(f"  checkpoint     every {plan.interval_s / 60:.3g} min ({why}; Young {plan.young_interval_s / 60:.3g}"
                     f" min, Daly {plan.daly_interval_s / 60:.3g} min), {format_bytes(plan.size_bytes)}, "
                     f"blocks {plan.blocking_s:.3g} s")
    lines.append("  assumptions:")
    lines += [f"    - {note}" for note in run.assumptions]
    return lines


def _figures(value: float) -> str:
    """Four significant figures, thousands separated, never an exponent: ``20,470``, ``3.142``."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def _both(free: RunTotals, expected: RunTotals | None, value, shape) -> str:
    """``value`` of the failure-free totals, and of the expected ones when there are any;
    ``shape`` a format string or a function."""
    show = shape if callable(shape) else shape.format
    text = show(value(free))
    return text if expected is None else f"{text} ({show(value(expected))} expected)"
