"""Validation: the simulator's prediction against a measured run, side by side.

A prediction (``SimResult``) and a measurement (``dapple-run``'s run summary) describe the
same plan in the same vocabulary: an iteration time, per-device peak memory, and one event
row per action and device (``sim.core.events.EventRow``): one ``RunSide`` each
(``predicted_view``, ``measured_view``; ``sim.core.validation_sides``). ``compare``
lines them up and reports relative errors ``(predicted − measured) / measured`` (a
``ValidationReport``, ``sim.core.validation_report``):

* the iteration time (the measured median over steps);
* each stage's compute time (the F, B, I and W actions of one step, per device);
* each action, matched by device and action text: duration and start-time errors;
* each device's peak memory. What counts as memory depends on what can be measured: on a
  GPU the allocator sees everything, so the prediction's full peak is compared; on a CPU
  the runtime counts parameters, gradients, optimizer state and saved activations (with
  saved-tensor hooks), so the prediction's static bytes plus its activation peak is
  compared (``memory="counted"``) — receive buffers are not counted on either side; and
  each device's memory by kind (``MEMORY_KINDS``: parameters, gradients, optimizer state,
  activations at their peak), when the measurement reports it.

The report is typed; its one JSON is ``ValidationReport.to_json()``, made by the command
that writes it, and ``ValidationReport.from_json`` reads a recorded one back, so notebooks
draw and print it (``format_report``) without the simulator or torch.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import replace
from typing import Any, Iterable, Mapping, Sequence

from sim.core.events import EventRow
from sim.core.units import format_bytes, format_time
from sim.core.validation_report import (
    ActionComparison,
    ActionErrors,
    DeviceError,
    MemoryErrorByKind,
    StageError,
    ValidationErrors,
    ValidationReport,
    turn_drift,
)
from sim.core.validation_sides import MEMORY_KINDS, DeviceSide, MemoryByKind, RunSide, StageCompute
from sim.engine.result import SimResult

__all__ = ["MEMORY_KINDS", "MEMORY_MODES", "compare", "drift_warning", "format_report", "measured_view", "predicted_view", "run_side"]

MEMORY_MODES = ("counted", "allocator")
"""``counted``: static + saved activations (CPU runs); ``allocator``: everything (GPU runs)."""

_COMPUTE = ("F", "B", "I", "W")


def run_side(*, iteration_time_s: float | None, devices: Iterable[DeviceSide], events: Iterable[EventRow],
             iteration_times_s: Sequence[float] | None = None) -> RunSide:
    """One side of a comparison, with each device's and each stage's compute summed from ``events``."""
    events = tuple(events)
    busy = _compute_by_device(events)
    return RunSide(iteration_time_s=iteration_time_s,
                   iteration_times_s=None if iteration_times_s is None else tuple(iteration_times_s),
                   devices=tuple(replace(d, compute_s=busy.get(d.device, 0.0)) for d in devices),
                   stages=tuple(StageCompute(stage=s, compute_s=v) for s, v in sorted(_compute_by_stage(events).items())),
                   events=events)


def predicted_view(result: SimResult, *, memory: str = "counted") -> RunSide:
    """The prediction as a side of the comparison (``memory``: one of ``MEMORY_MODES``)."""
    if memory not in MEMORY_MODES:
        raise ValueError(f"memory must be one of {MEMORY_MODES}, got {memory!r}")
    summary = result.summarize()
    statics = {d: cls.static_bytes for cls in result.workload.classes for d in cls.devices}
    devices = []
    for entry in summary.devices:
        peak = entry.peak_memory_bytes if memory == "allocator" else statics[entry.device] + entry.peak_activation_bytes
        kinds = None
        if entry.memory_breakdown is not None:
            states = entry.memory_breakdown
            kinds = MemoryByKind(parameters=states.parameters, gradients=states.gradients, optimizer=states.optimizer,
                                 activations=entry.peak_activation_bytes)
        devices.append(DeviceSide(device=entry.device, stages=tuple(entry.stages), peak_memory_bytes=peak,
                                  peak_activation_bytes=entry.peak_activation_bytes, memory_breakdown_bytes=kinds))
    return run_side(iteration_time_s=result.iteration_time_s, devices=devices, events=result.event_rows())


def measured_view(summary: Mapping[str, Any]) -> RunSide:
    """A measured run as a side of the comparison, from its summary's JSON (``dapple-run run
    --json``: ``median_iteration_time_s`` (or ``iteration_time_s``), ``iteration_times_s``,
    ``devices`` with ``device`` and ``peak_memory_bytes``, and ``events``)."""
    measured_time = summary.get("median_iteration_time_s", summary.get("iteration_time_s"))
    devices = [DeviceSide(device=d["device"], stages=None if d.get("stages") is None else tuple(d["stages"]),
                          peak_memory_bytes=d.get("peak_memory_bytes"),
                          peak_activation_bytes=d.get("peak_activation_bytes"),
                          memory_breakdown_bytes=MemoryByKind.from_json(d.get("memory_breakdown_bytes")))
               for d in summary["devices"]]
    return run_side(iteration_time_s=measured_time, iteration_times_s=summary.get("iteration_times_s", [measured_time]),
                    devices=devices, events=(EventRow.from_json(row) for row in summary["events"]))


def _compute_by_device(rows: Sequence[EventRow]) -> dict[int, float]:
    busy: dict[int, float] = defaultdict(float)
    for row in rows:
        if row.kind in _COMPUTE:
            busy[row.device] += row.end_s - row.start_s
    return dict(busy)


def _compute_by_stage(rows: Sequence[EventRow]) -> dict[int, float]:
    """Per stage: compute seconds of one step on one device (mean over the stage's replicas)."""
    per: dict[tuple[int, int], float] = defaultdict(float)
    for row in rows:
        if row.kind in _COMPUTE:
            per[(row.stage, row.device)] += row.end_s - row.start_s
    stages: dict[int, list[float]] = defaultdict(list)
    for (stage, _), seconds in per.items():
        stages[stage].append(seconds)
    return {stage: statistics.fmean(values) for stage, values in stages.items()}


def _frac(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or measured is None or measured == 0:
        return None
    return (predicted - measured) / measured


def _actions(predicted: Sequence[EventRow], measured: Sequence[EventRow], iteration_s: float) -> ActionErrors:
    mine = {(r.device, r.action): r for r in predicted}
    pairs = [(mine[(r.device, r.action)], r) for r in measured if (r.device, r.action) in mine]
    compute = [(p, m) for p, m in pairs if m.kind in (*_COMPUTE, "OPTIM") and m.end_s > m.start_s]
    by_kind: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    for p, m in compute:
        by_kind[(m.stage, m.kind)].append((p.end_s - p.start_s, m.end_s - m.start_s))
    starts = [abs(p.start_s - m.start_s) for p, m in pairs]
    durations = [abs((p.end_s - p.start_s) - (m.end_s - m.start_s)) / (m.end_s - m.start_s) for p, m in compute]
    rows = []
    for (stage, kind), values in sorted(by_kind.items()):
        mean_p, mean_m = statistics.fmean(p for p, _ in values), statistics.fmean(m for _, m in values)
        rows.append(ActionComparison(stage=stage, kind=kind, count=len(values), predicted_mean_s=mean_p,
                                     measured_mean_s=mean_m, frac=_frac(mean_p, mean_m)))
    return ActionErrors(
        matched=len(pairs), unmatched=len(measured) - len(pairs),
        start_mean_abs_s=statistics.fmean(starts) if starts else None,
        start_mean_abs_frac_of_iteration=statistics.fmean(starts) / iteration_s if starts and iteration_s else None,
        duration_mean_abs_frac=statistics.fmean(durations) if durations else None,
        by_stage_and_kind=tuple(rows))


def compare(predicted: RunSide, measured: RunSide, **context: Any) -> ValidationReport:
    """``predicted`` (``predicted_view``) against ``measured`` (``measured_view``): their errors.

    ``context`` is the report's context (``ValidationReport``'s fields from ``scenario`` on).
    """
    measured_devices = {d.device: d for d in measured.devices}
    device_errors = tuple(
        DeviceError(device=d.device, peak_memory_frac=_frac(d.peak_memory_bytes, m.peak_memory_bytes),
                    compute_frac=_frac(d.compute_s, m.compute_s),
                    memory_by_kind_frac=_by_kind(d.memory_breakdown_bytes, m.memory_breakdown_bytes))
        for d in predicted.devices if (m := measured_devices.get(d.device)) is not None
    )
    by_kind = [abs(v) for e in device_errors if e.memory_by_kind_frac is not None
               for v in (e.memory_by_kind_frac.kind(kind) for kind in MEMORY_KINDS) if v is not None]
    measured_stages = {s.stage: s.compute_s for s in measured.stages}
    memory = [abs(e.peak_memory_frac) for e in device_errors if e.peak_memory_frac is not None]
    error = ValidationErrors(
        iteration_time_frac=_frac(predicted.iteration_time_s, measured.iteration_time_s),
        peak_memory_frac=max(memory) if memory else None,
        memory_by_kind_frac=max(by_kind) if by_kind else None,
        devices=device_errors,
        stages=tuple(StageError(stage=s.stage, compute_frac=_frac(s.compute_s, measured_stages.get(s.stage)))
                     for s in predicted.stages),
        actions=_actions(predicted.events, measured.events, measured.iteration_time_s or 0.0),
    )
    drift = turn_drift(tuple(context.get("turns") or ()), error.iteration_time_frac)
    return ValidationReport(predicted=predicted, measured=measured, error=error, drift=drift, **context)


def _by_kind(predicted: MemoryByKind | None, measured: MemoryByKind | None) -> MemoryErrorByKind | None:
    """Per kind, (predicted − measured) / measured; a kind both sides hold none of is exact (0)."""
    if predicted is None or measured is None:
        return None
    fracs = {}
    for kind in MEMORY_KINDS:
        p, m = predicted.kind(kind), measured.kind(kind)
        fracs[kind] = 0.0 if p == 0 and m == 0 else _frac(p, m)
    return MemoryErrorByKind(**fracs)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _row(label: str, pred: str, meas: str, err: str, note: str = "") -> str:
    return f"  {label:<22} {pred:>10} {meas:>10} {err:>8}" + (f"   {note}" if note else "")


def format_report(report: ValidationReport) -> str:
    """The human-readable table of a ``compare`` report: a header, then predicted, measured
    and error per row; with turns of profile and run, one row per turn under it, so that
    the headline's two numbers can be found in the rows (its prediction is one turn's, its
    measurement the median of every step)."""
    p, m, e = report.predicted, report.measured, report.error
    steps = len(m.iteration_times_s or ()) or _text(report.steps)
    turns = report.turns or ()
    chosen = report.profile.turn if report.profile is not None else None
    if turns and chosen:
        headline = f"turn {chosen}'s prediction (the median turn) vs the median of all {steps} steps"
    else:
        headline = f"vs the median of {steps} measured steps"
    lines = [
        f"{_text(report.scenario)}: {_text(report.schedule)}, predicted vs measured "
        f"({_text(report.backend)}, {_text(report.nproc)} processes, {_text(report.steps)} steps)",
        _row("", "predicted", "measured", "error"),
        _row("iteration time", format_time(p.iteration_time_s), format_time(m.iteration_time_s),
             _pct(e.iteration_time_frac), headline),
    ]
    measured_stages = {s.stage: s.compute_s for s in m.stages}
    for stage, err in zip(p.stages, e.stages):
        lines.append(_row(f"stage {stage.stage} compute", format_time(stage.compute_s),
                          format_time(measured_stages.get(stage.stage, 0.0)), _pct(err.compute_frac),
                          "F/B/I/W time in one step, per device" if stage is p.stages[0] else ""))
    lines += _memory_rows(report)
    if turns:
        lines += _turn_rows(report, chosen, steps)
    if report.rounds:
        errors = [r.iteration_time_frac for r in report.rounds]
        lines.append(f"  {len(errors)} rounds: iteration-time error median {_pct(e.iteration_time_frac_median)} "
                     f"(from {_pct(min(errors))} to {_pct(max(errors))}); this table is round "
                     f"{report.median_round}, the one nearest the median")
    actions = e.actions
    if actions.duration_mean_abs_frac is not None:
        lines.append(f"  actions: {actions.matched} matched, mean |duration error| "
                     f"{actions.duration_mean_abs_frac:.1%}, mean |start error| "
                     f"{format_time(actions.start_mean_abs_s)} ({actions.start_mean_abs_frac_of_iteration:.1%} "
                     "of an iteration)")
    return "\n".join(lines)


def drift_warning(report: ValidationReport) -> str | None:
    """One line when the machine's speed drifted between turns by more than the error reported
    (``sim.core.validation_report.Drift``): that error is then the machine's as much as the
    simulator's. None otherwise."""
    drift = report.drift
    if drift is None or not drift.exceeds_error:
        return None
    return (f"the machine's speed drifted {drift.spread_frac:.0%} between turns (a turn's measured step "
            f"{format_time(drift.fastest_s)} to {format_time(drift.slowest_s)}), more than the "
            f"{_pct(report.error.iteration_time_frac)} error reported: rerun on an idle machine")


def _memory_rows(report: ValidationReport) -> list[str]:
    """Each device's peak memory and, where both sides break it down, its bytes by kind."""
    lines = []
    measured_devices = {d.device: d for d in report.measured.devices}
    for device, err in zip(report.predicted.devices, report.error.devices):
        measured = measured_devices[device.device]
        lines.append(_row(f"device {device.device} peak memory", format_bytes(device.peak_memory_bytes),
                          format_bytes(measured.peak_memory_bytes or 0), _pct(err.peak_memory_frac)))
        kinds, measured_kinds = device.memory_breakdown_bytes, measured.memory_breakdown_bytes
        for kind in MEMORY_KINDS if kinds and measured_kinds and err.memory_by_kind_frac else ():
            lines.append(_row(f"  {kind}", format_bytes(kinds.kind(kind) or 0),
                              format_bytes(measured_kinds.kind(kind) or 0), _pct(err.memory_by_kind_frac.kind(kind))))
    return lines


def _turn_rows(report: ValidationReport, chosen: int | None, steps: int | str) -> list[str]:
    """One row per turn of profile and run, then the row of all steps and the turns' spread."""
    turns = report.turns or ()
    errors = [t.iteration_time_frac for t in turns]
    measured = [t.measured_s for t in turns]
    lines = [f"  {len(turns)} turns of profile and run; each turn's profile predicts the steps run right "
             "after it (their median):", _row("  turn", "predicted", "measured", "error")]
    for turn in turns:
        mark = "the prediction above" if turn.turn == chosen else ""
        lines.append(_row(f"  {turn.turn}", format_time(turn.predicted_s), format_time(turn.measured_s),
                          _pct(turn.iteration_time_frac), mark))
    lines.append(_row("  all steps", "", format_time(report.measured.iteration_time_s), "",
                      f"the median of all {steps} steps, the measurement above"))
    lines.append(f"  the turns' own errors: median {_pct(statistics.median(errors))}, from {_pct(min(errors))} "
                 f"to {_pct(max(errors))}; measured iteration {format_time(min(measured))} to "
                 f"{format_time(max(measured))} across turns (how much the machine drifted)")
    return lines
