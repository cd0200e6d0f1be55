"""Measured steps as the simulator writes its replays: a Chrome/Perfetto trace and events.csv.

A run's event rows (``runtime.execution.executor``: one ``sim.core.events.EventRow`` per action and
device, seconds from the step's start, the simulator's rows; they travel in the run's summary as
their JSON and are read back here) become the trace-event JSON that ui.perfetto.dev and
chrome://tracing open, laid out as ``sim.engine.trace`` lays out a prediction (one process
per device, one thread per stream: compute, send, recv, allreduce), so that the predicted
and the measured trace of one plan open side by side; and ``events.csv`` in the simulator's
columns.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Iterable, Mapping

from sim.core import jsonio
from sim.core.events import EVENT_COLUMNS, EventRow
from sim.engine.trace import STREAM_THREADS, perfetto_trace, trace_event

__all__ = ["EVENT_COLUMNS", "measured_rows", "measured_trace", "write_events", "write_traces"]


def measured_rows(rows: Iterable[Mapping[str, Any]]) -> list[EventRow]:
    """A run's event rows as they travel in its summary (their JSON), read back as ``EventRow``."""
    return [EventRow.from_json(row) for row in rows]


def measured_trace(rows: Iterable[Mapping[str, Any]], *, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """Chrome trace-event JSON of measured event rows (their JSON, as a run's summary holds them):
    process ``device N (measured)`` per device and the simulator's thread per stream
    (``sim.engine.trace``), a complete event (``ph: X``) per action, microseconds from the
    step's start."""
    rows = measured_rows(rows)
    devices = sorted({row.device for row in rows})
    events: list[dict[str, Any]] = []
    for device in devices:
        events.append({"ph": "M", "name": "process_name", "pid": device,
                       "args": {"name": f"device {device} (measured)"}})
        for stream, tid in STREAM_THREADS.items():
            events.append({"ph": "M", "name": "thread_name", "pid": device, "tid": tid, "args": {"name": stream}})
    events += [trace_event(row, max(0.0, row.end_s - row.start_s)) for row in rows]
    return {"traceEvents": events, "displayTimeUnit": "ms", "metadata": {"source": "measured", **(metadata or {})}}


def write_events(rows: Iterable[Mapping[str, Any]], path) -> None:
    """Event rows (their JSON, as a run's summary holds them) as ``events.csv``, the simulator's
    columns (an empty cell: no micro-batch)."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(EVENT_COLUMNS))
        writer.writeheader()
        writer.writerows(row.to_json() for row in measured_rows(rows))


def write_traces(predicted, measured: dict[str, Any], out: Path, *, scenario: str) -> dict[str, str]:
    """``trace_predicted.json`` and ``trace_measured.json`` in ``out``: Chrome/Perfetto traces
    of the prediction and of the median measured step, laid out alike (one process per device,
    one thread per stream) so that they open side by side in ui.perfetto.dev."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"predicted": out / "trace_predicted.json", "measured": out / "trace_measured.json"}
    traces = {"predicted": perfetto_trace(predicted),
              "measured": measured_trace(measured["events"], metadata={"scenario": scenario,
                                                                       "step": measured.get("events_step")})}
    for side, path in paths.items():
        path.write_text(jsonio.dumps(traces[side], separators=(",", ":")) + "\n", encoding="utf-8")
    return {side: str(path) for side, path in paths.items()}
