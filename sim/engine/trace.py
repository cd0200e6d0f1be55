"""A replay as a Chrome trace (the trace-event JSON that ui.perfetto.dev and chrome://tracing open).

One process per device, with a thread per stream (compute, send, receive, all-reduce, and the
group collectives: tensor-, context-parallel, FSDP's and ZeRO's gathers, which ``event_rows``
leaves inside their action's row) holding a complete event (``ph: X``) per action, and a ``memory`` counter track (``ph: C``) with the
device's bytes over time. Times are microseconds, as the format wants. Large clusters trace
one device per class of identical devices unless every device is asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sim.core.events import EventRow
from sim.engine.workload import GROUP

if TYPE_CHECKING:
    from sim.engine.result import SimResult

__all__ = ["STREAM_THREADS", "perfetto_trace", "trace_event", "traced_devices"]

TRACE_ALL_LIMIT = 64
"""Clusters of at most this many devices trace every device by default."""

STREAM_THREADS = {"compute": 0, "send": 1, "recv": 2, "allreduce": 3, "group": 4}
"""A device's thread id per stream, for predicted and measured traces alike."""


def trace_event(row: EventRow, duration_s: float) -> dict[str, Any]:
    """The complete event (``ph: X``) of ``row`` lasting ``duration_s``, microseconds."""
    return {"ph": "X", "name": row.action, "cat": row.kind, "pid": row.device, "tid": STREAM_THREADS[row.stream],
            "ts": row.start_s * 1e6, "dur": duration_s * 1e6, "args": {"microbatch": row.microbatch, "stage": row.stage}}


def traced_devices(result: SimResult, limit: int = TRACE_ALL_LIMIT) -> list[int]:
    """Every device when there are at most ``limit``; otherwise one per class."""
    if result.workload.num_devices <= limit:
        return list(result.workload.devices)
    return sorted(cls.devices[0] for cls in result.workload.classes)


def _group_events(result: SimResult, devices: list[int]) -> list[dict[str, Any]]:
    """The group collectives of ``devices`` as complete events on their ``group`` thread, named
    after the action they run beside or after (``collective 0F3``, ``collective 0PARAM_GATHER0``)."""
    wanted, events = set(devices), []
    for cls, record in zip(result.workload.classes, result.records):
        members = [d for d in cls.devices if d in wanted]
        if not members:
            continue
        for op, times in zip(cls.ops, record.op_times):
            if op.code != GROUP or times is None or not times[1] > times[0]:  # NaN: never ran
                continue
            for device in members:
                events.append({"ph": "X", "name": f"collective {op.text}", "cat": "GROUP", "pid": device,
                               "tid": STREAM_THREADS["group"], "ts": times[0] * 1e6, "dur": (times[1] - times[0]) * 1e6,
                               "args": {"microbatch": op.microbatch, "stage": op.stage, "overlap": op.overlap}})
    return events


def perfetto_trace(result: SimResult, devices: list[int] | None = None) -> dict[str, Any]:
    """Chrome trace-event JSON of ``result`` for ``devices`` (default: ``traced_devices``)."""
    devices = traced_devices(result) if devices is None else devices
    events: list[dict[str, Any]] = []
    for device in devices:
        events.append({"ph": "M", "name": "process_name", "pid": device, "args": {"name": f"device {device}"}})
        for stream, tid in STREAM_THREADS.items():
            events.append({"ph": "M", "name": "thread_name", "pid": device, "tid": tid, "args": {"name": stream}})
    for row in result.event_rows(devices):
        if row.end_s <= row.start_s and row.stream != "compute":
            continue
        events.append(trace_event(row, row.end_s - row.start_s))
    events += _group_events(result, devices)
    for device in devices:
        for t, value in zip(*result.memory_timeline(device)):
            events.append({"ph": "C", "name": "memory", "pid": device, "ts": t * 1e6, "args": {"bytes": value}})
    metadata = {"engine": result.engine, "contention": result.contention, "devices_traced": len(devices),
                "devices_total": result.workload.num_devices}
    return {"traceEvents": events, "displayTimeUnit": "ms", "metadata": metadata}
