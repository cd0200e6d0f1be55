"""Validation: the simulator's prediction against a measured run, side by side.

A prediction (``SimResult``) and a measurement (``dapple-run``'s run summary) describe the
same plan in the same vocabulary: an iteration time, per-device peak memory, and one event
row per action and device (``sim.core.events.EventRow``; the report holds their JSON). ``compare`` lines them up and
reports relative errors ``(predicted − measured) / measured``:

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

Everything here is plain data in and out (``report`` is JSON-ready), so the recorded
report can be read back by notebooks without the simulator or torch.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from sim.engine.result import SimResult
from sim.core.units import format_bytes, format_time

__all__ = ["MEMORY_KINDS", "MEMORY_MODES", "compare", "format_report", "predicted_view"]

MEMORY_KINDS = ("parameters", "gradients", "optimizer", "activations")
"""The kinds of ``sim.core.summary.MemoryBreakdown`` a counted run measures (its buffers are not)."""

MEMORY_MODES = ("counted", "allocator")
"""``counted``: static + saved activations (CPU runs); ``allocator``: everything (GPU runs)."""

_COMPUTE = ("F", "B", "I", "W")


def predicted_view(result: SimResult, *, memory: str = "counted") -> dict[str, Any]:
    """The prediction in the measured summary's shape (iteration time, devices, events)."""
    if memory not in MEMORY_MODES:
        raise ValueError(f"memory must be one of {MEMORY_MODES}, got {memory!r}")
    summary = result.summarize()
    statics = {d: cls.static_bytes for cls in result.workload.classes for d in cls.devices}
    rows = [row.to_json() for row in result.event_rows()]  # the report is JSON-ready: rows as their JSON
    devices = []
    for entry in summary.devices:
        peak = entry.peak_memory_bytes if memory == "allocator" else statics[entry.device] + entry.peak_activation_bytes
        kinds = None
        if entry.memory_breakdown is not None:
            kinds = {kind: getattr(entry.memory_breakdown, kind) for kind in MEMORY_KINDS[:3]}
            kinds["activations"] = entry.peak_activation_bytes
        devices.append({"device": entry.device, "stages": list(entry.stages), "peak_memory_bytes": peak,
                        "peak_activation_bytes": entry.peak_activation_bytes, "memory_breakdown_bytes": kinds})
    return {"iteration_time_s": result.iteration_time_s, "devices": devices, "events": rows}


def _compute_by_device(rows: list[dict]) -> dict[int, float]:
    busy: dict[int, float] = defaultdict(float)
    for row in rows:
        if row["kind"] in _COMPUTE:
            busy[row["device"]] += row["end_s"] - row["start_s"]
    return dict(busy)


def _compute_by_stage(rows: list[dict]) -> dict[int, float]:
    """Per stage: compute seconds of one step on one device (mean over the stage's replicas)."""
    per: dict[tuple[int, int], float] = defaultdict(float)
    for row in rows:
        if row["kind"] in _COMPUTE:
            per[(row["stage"], row["device"])] += row["end_s"] - row["start_s"]
    stages: dict[int, list[float]] = defaultdict(list)
    for (stage, _), seconds in per.items():
        stages[stage].append(seconds)
    return {stage: statistics.fmean(values) for stage, values in stages.items()}


def _frac(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or measured is None or measured == 0:
        return None
    return (predicted - measured) / measured


def _actions(predicted: list[dict], measured: list[dict], iteration_s: float) -> dict[str, Any]:
    mine = {(r["device"], r["action"]): r for r in predicted}
    pairs = [(mine[(r["device"], r["action"])], r) for r in measured if (r["device"], r["action"]) in mine]
    compute = [(p, m) for p, m in pairs if m["kind"] in (*_COMPUTE, "OPTIM") and m["end_s"] > m["start_s"]]
    by_kind: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    for p, m in compute:
        by_kind[(m["stage"], m["kind"])].append((p["end_s"] - p["start_s"], m["end_s"] - m["start_s"]))
    starts = [abs(p["start_s"] - m["start_s"]) for p, m in pairs]
    durations = [abs((p["end_s"] - p["start_s"]) - (m["end_s"] - m["start_s"])) / (m["end_s"] - m["start_s"])
                 for p, m in compute]
    return {
        "matched": len(pairs),
        "unmatched": len(measured) - len(pairs),
        "start_mean_abs_s": statistics.fmean(starts) if starts else None,
        "start_mean_abs_frac_of_iteration": statistics.fmean(starts) / iteration_s if starts and iteration_s else None,
        "duration_mean_abs_frac": statistics.fmean(durations) if durations else None,
        "by_stage_and_kind": [
            {"stage": stage, "kind": kind, "count": len(values),
             "predicted_mean_s": statistics.fmean(p for p, _ in values),
             "measured_mean_s": statistics.fmean(m for _, m in values),
             "frac": _frac(statistics.fmean(p for p, _ in values), statistics.fmean(m for _, m in values))}
            for (stage, kind), values in sorted(by_kind.items())
        ],
    }


def compare(predicted: dict[str, Any], measured: dict[str, Any], **context: Any) -> dict[str, Any]:
    """A JSON-ready report of ``predicted`` (``predicted_view``) against ``measured``.

    ``measured`` needs ``median_iteration_time_s`` (or ``iteration_time_s``), ``devices``
    (``device``, ``peak_memory_bytes``) and ``events``; ``context`` is copied to the top.
    """
    measured_time = measured.get("median_iteration_time_s", measured.get("iteration_time_s"))
    measured_view = {
        "iteration_time_s": measured_time,
        "iteration_times_s": measured.get("iteration_times_s", [measured_time]),
        "devices": [{k: d.get(k) for k in ("device", "stages", "peak_memory_bytes", "peak_activation_bytes",
                                           "memory_breakdown_bytes")}
                    for d in measured["devices"]],
        "events": measured["events"],
    }
    sides = {"predicted": predicted, "measured": measured_view}
    for side in sides.values():
        busy = _compute_by_device(side["events"])
        for device in side["devices"]:
            device["compute_s"] = busy.get(device["device"], 0.0)
        side["stages"] = [{"stage": s, "compute_s": v} for s, v in sorted(_compute_by_stage(side["events"]).items())]
    measured_devices = {d["device"]: d for d in measured_view["devices"]}
    device_errors = [
        {"device": d["device"],
         "peak_memory_frac": _frac(d["peak_memory_bytes"], measured_devices[d["device"]]["peak_memory_bytes"]),
         "compute_frac": _frac(d["compute_s"], measured_devices[d["device"]]["compute_s"]),
         "memory_by_kind_frac": _by_kind(d.get("memory_breakdown_bytes"),
                                         measured_devices[d["device"]].get("memory_breakdown_bytes"))}
        for d in predicted["devices"] if d["device"] in measured_devices
    ]
    by_kind = [abs(v) for e in device_errors for v in (e["memory_by_kind_frac"] or {}).values() if v is not None]
    measured_stages = {s["stage"]: s["compute_s"] for s in measured_view["stages"]}
    memory = [abs(e["peak_memory_frac"]) for e in device_errors if e["peak_memory_frac"] is not None]
    error = {
        "iteration_time_frac": _frac(predicted["iteration_time_s"], measured_time),
        "peak_memory_frac": max(memory) if memory else None,
        "memory_by_kind_frac": max(by_kind) if by_kind else None,
        "devices": device_errors,
        "stages": [{"stage": s["stage"], "compute_frac": _frac(s["compute_s"], measured_stages.get(s["stage"]))}
                   for s in predicted["stages"]],
        "actions": _actions(predicted["events"], measured_view["events"], measured_time or 0.0),
    }
    return {**context, "predicted": predicted, "measured": measured_view, "error": error}


def _by_kind(predicted: dict | None, measured: dict | None) -> dict[str, float | None] | None:
    """Per kind, (predicted − measured) / measured; a kind both sides hold none of is exact (0)."""
    if not predicted or not measured:
        return None
    fracs = {}
    for kind in MEMORY_KINDS:
        p, m = predicted.get(kind), measured.get(kind)
        fracs[kind] = 0.0 if p == 0 and m == 0 else _frac(p, m)
    return fracs


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def format_report(report: dict[str, Any]) -> str:
    """The human-readable table of a ``compare`` report: a header, then predicted, measured
    and error per row; with turns of profile and run, one row per turn under it, so that
    the headline's two numbers can be found in the rows (its prediction is one turn's, its
    measurement the median of every step)."""
    p, m, e = report["predicted"], report["measured"], report["error"]
    steps = len(m.get("iteration_times_s") or []) or report.get("steps", "")
    turns = report.get("slices") or []
    chosen = (report.get("profile") or {}).get("slice")
    width = 22
    row = lambda label, pred, meas, err, note="": (  # noqa: E731
        f"  {label:<{width}} {pred:>10} {meas:>10} {err:>8}" + (f"   {note}" if note else ""))
    if turns and chosen:
        headline = f"turn {chosen}'s prediction (the median turn) vs the median of all {steps} steps"
    else:
        headline = f"vs the median of {steps} measured steps"
    lines = [
        f"{report.get('scenario', '')}: {report.get('schedule', '')}, predicted vs measured "
        f"({report.get('backend', '')}, {report.get('nproc', '')} processes, {report.get('steps', '')} steps)",
        row("", "predicted", "measured", "error"),
        row("iteration time", format_time(p["iteration_time_s"]), format_time(m["iteration_time_s"]),
            _pct(e["iteration_time_frac"]), headline),
    ]
    measured_stages = {s["stage"]: s["compute_s"] for s in m["stages"]}
    for stage, err in zip(p["stages"], e["stages"]):
        lines.append(row(f"stage {stage['stage']} compute", format_time(stage["compute_s"]),
                         format_time(measured_stages.get(stage["stage"], 0.0)), _pct(err["compute_frac"]),
                         "F/B/I/W time in one step, per device" if stage is p["stages"][0] else ""))
    measured_devices = {d["device"]: d for d in m["devices"]}
    for device, err in zip(p["devices"], e["devices"]):
        lines.append(row(f"device {device['device']} peak memory", format_bytes(device["peak_memory_bytes"]),
                         format_bytes(measured_devices[device["device"]]["peak_memory_bytes"] or 0),
                         _pct(err["peak_memory_frac"])))
        kinds, measured_kinds = device.get("memory_breakdown_bytes"), \
            measured_devices[device["device"]].get("memory_breakdown_bytes")
        for kind in MEMORY_KINDS if kinds and measured_kinds and err.get("memory_by_kind_frac") else ():
            lines.append(row(f"  {kind}", format_bytes(kinds[kind] or 0), format_bytes(measured_kinds[kind] or 0),
                             _pct(err["memory_by_kind_frac"][kind])))
    if turns:
        errors = [t["iteration_time_frac"] for t in turns]
        measured = [t["measured_s"] for t in turns]
        lines.append(f"  {len(turns)} turns of profile and run; each turn's profile predicts the steps run right "
                     "after it (their median):")
        lines.append(row("  turn", "predicted", "measured", "error"))
        for turn in turns:
            mark = "the prediction above" if turn["slice"] == chosen else ""
            lines.append(row(f"  {turn['slice']}", format_time(turn["predicted_s"]), format_time(turn["measured_s"]),
                             _pct(turn["iteration_time_frac"]), mark))
        lines.append(row("  all steps", "", format_time(m["iteration_time_s"]), "",
                         f"the median of all {steps} steps, the measurement above"))
        lines.append(f"  the turns' own errors: median {_pct(statistics.median(errors))}, from {_pct(min(errors))} "
                     f"to {_pct(max(errors))}; measured iteration {format_time(min(measured))} to "
                     f"{format_time(max(measured))} across turns (how much the machine drifted)")
    if report.get("rounds"):
        errors = [r["iteration_time_frac"] for r in report["rounds"]]
        lines.append(f"  {len(errors)} rounds: iteration-time error median {_pct(e['iteration_time_frac_median'])} "
                     f"(from {_pct(min(errors))} to {_pct(max(errors))}); this table is round "
                     f"{report['median_round']}, the one nearest the median")
    actions = e["actions"]
    if actions["duration_mean_abs_frac"] is not None:
        lines.append(f"  actions: {actions['matched']} matched, mean |duration error| "
                     f"{actions['duration_mean_abs_frac']:.1%}, mean |start error| "
                     f"{format_time(actions['start_mean_abs_s'])} ({actions['start_mean_abs_frac_of_iteration']:.1%} "
                     "of an iteration)")
    return "\n".join(lines)
