"""Measured steps as the simulator writes its replays: a Chrome/Perfetto trace and events.csv.

A run's event rows (``runtime.execution.executor``: one per action and device, seconds from the step's
start, ``SimResult.event_rows``'s format) become the trace-event JSON that ui.perfetto.dev and
chrome://tracing open, laid out as ``sim.engine.trace`` lays out a prediction (one process
per device, one thread per stream: compute, send, recv, allreduce), so that the predicted
and the measured trace of one plan open side by side; and ``events.csv`` in the simulator's
columns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.core import jsonio

__all__ = ["EVENT_COLUMNS", "measured_trace", "write_events", "write_traces"]

EVENT_COLUMNS = ("device", "stage", "kind", "microbatch", "action", "stream", "start_s", "end_s")
"""The columns of an event row and of ``events.csv`` (``SimResult.events``'s)."""


def measured_trace(rows: list[dict[str, Any]], *, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """Chrome trace-event JSON of measured event rows: process ``device N (measured)`` per
    device and the simulator's thread per stream (``sim.engine.trace``), a complete event
    (``ph: X``) per action, microseconds from the step's start."""
    from sim.engine.trace import (
        _THREADS as THREADS,  # one layout for predicted and measured traces
    )

    devices = sorted({row["device"] for row in rows})
    events: list[dict[str, Any]] = []
    for device in devices:
        events.append({"ph": "M", "name": "process_name", "pid": device,
                       "args": {"name": f"device {device} (measured)"}})
        for stream, tid in THREADS.items():
            events.append({"ph": "M", "name": "thread_name", "pid": device, "tid": tid, "args": {"name": stream}})
    for row in rows:
        events.append(
            {"ph": "X", "name": row["action"], "cat": row["kind"], "pid": row["device"], "tid": THREADS[row["stream"]],
             "ts": row["start_s"] * 1e6, "dur": max(0.0, row["end_s"] - row["start_s"]) * 1e6,
             "args": {"microbatch": row["microbatch"], "stage": row["stage"]}}
        )
    return {"traceEvents": events, "displayTimeUnit": "ms", "metadata": {"source": "measured", **(metadata or {})}}


def write_events(rows: list[dict[str, Any]], path) -> None:
    """Event rows as ``events.csv``, the simulator's columns (an empty cell: no micro-batch)."""
    import csv

    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(EVENT_COLUMNS), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def write_traces(predicted, measured: dict[str, Any], out: Path, *, scenario: str) -> dict[str, str]:
    """``trace_predicted.json`` and ``trace_measured.json`` in ``out``: Chrome/Perfetto traces
    of the prediction and of the median measured step, laid out alike (one process per device,
    one thread per stream) so that they open side by side in ui.perfetto.dev."""
    from sim.engine.trace import perfetto_trace

    out.mkdir(parents=True, exist_ok=True)
    paths = {"predicted": out / "trace_predicted.json", "measured": out / "trace_measured.json"}
    traces = {"predicted": perfetto_trace(predicted),
              "measured": measured_trace(measured["events"], metadata={"scenario": scenario,
                                                                       "step": measured.get("events_step")})}
    for side, path in paths.items():
        path.write_text(jsonio.dumps(traces[side], separators=(",", ":")) + "\n", encoding="utf-8")
    return {side: str(path) for side, path in paths.items()}
