"""Memory of a device over one iteration, from what a replay recorded.

A replay records, per device class, ``(time_s, bytes delta)`` events of stashed activations
and of receive buffers (``sim.engine.result.Recorder``). Starting from the bytes held at rest
(parameters, gradients, optimizer state: ``DeviceClass.static_bytes``), their running sum is
the device's memory as a step function of time. Events at the same instant apply frees before
allocations, as an allocator would, so a buffer handed from one action to the next does not
count twice. A device runs out of memory the first time that sum passes its capacity.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING

from sim.units import format_bytes

if TYPE_CHECKING:
    from sim.engine.result import Recorder
    from sim.engine.workload import DeviceClass, Workload

__all__ = ["MemoryTimeline", "OutOfMemory", "first_out_of_memory", "memory_timeline"]


@dataclass(frozen=True, slots=True, kw_only=True)
class OutOfMemory:
    """The first moment a device needs more memory than it has."""

    device: int
    time_s: float
    overshoot_bytes: float
    """Peak bytes minus capacity."""

    def __str__(self) -> str:
        return (
            f"device {self.device} runs out of memory at {self.time_s * 1e3:.3f} ms "
            f"(needs {format_bytes(self.overshoot_bytes)} more than it has)"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryTimeline:
    """Bytes held by one device of a class over the iteration."""

    times_s: tuple[float, ...]
    bytes: tuple[float, ...]
    """Bytes from each time on (a step function starting at rest at time 0)."""
    peak_bytes: float
    peak_time_s: float
    peak_live_microbatches: int
    """Most micro-batches whose activations are alive at once (+1 per F, −1 per B or W)."""
    final_bytes: float
    peak_activation_bytes: float
    """Peak of the stashed activations alone (no parameters, no receive buffers)."""
    activations_at_peak_bytes: float = 0.0
    """Stashed activations held when the total peaks."""
    buffers_at_peak_bytes: float = 0.0
    """Communication buffers (received data, gathered parameters) held when the total peaks."""


def _frees_first(events: list[tuple]) -> list[tuple]:
    """``events`` (time first, bytes delta second) sorted by time, frees before allocations at one
    instant, each group in its given order: a stable sort by time of the frees, then the rest."""
    return sorted([e for e in events if not e[1] > 0] + [e for e in events if e[1] > 0], key=itemgetter(0))


def memory_timeline(cls: DeviceClass, record: Recorder) -> MemoryTimeline:
    """The memory of one device of ``cls`` from its class's ``record``."""
    events = _frees_first([(t, d, 0) for t, d in record.memory] + [(t, d, 1) for t, d in record.buffers])
    total, times, values = cls.static_bytes, [0.0], [cls.static_bytes]
    peak, peak_t = total, 0.0
    held, at_peak = [0.0, 0.0], (0.0, 0.0)  # activations, buffers
    for t, delta, kind in events:
        total += delta
        held[kind] += delta
        if t == times[-1]:
            values[-1] = total  # frees come first at one instant, so the last value is its peak
        else:
            times.append(t)
            values.append(total)
        if total > peak:
            peak, peak_t, at_peak = total, t, (held[0], held[1])
    stash = stash_peak = 0.0
    for _, delta in _frees_first(record.memory):
        stash += delta
        stash_peak = max(stash_peak, stash)
    live = best = 0
    for op in cls.ops:
        live += op.live_delta
        best = max(best, live)
    return MemoryTimeline(
        times_s=tuple(times), bytes=tuple(values), peak_bytes=peak, peak_time_s=peak_t,
        peak_live_microbatches=best, final_bytes=total, peak_activation_bytes=stash_peak,
        activations_at_peak_bytes=at_peak[0], buffers_at_peak_bytes=at_peak[1],
    )


def first_out_of_memory(workload: Workload, timelines: list[MemoryTimeline]) -> OutOfMemory | None:
    """The earliest moment (then the lowest device id) any class passes the device capacity."""
    capacity = workload.device_memory_bytes
    first = None
    for cls, mem in zip(workload.classes, timelines):
        if mem.peak_bytes <= capacity:
            continue
        when = next(t for t, b in zip(mem.times_s, mem.bytes) if b > capacity)
        if first is None or (when, cls.devices[0]) < (first.time_s, first.device):
            first = OutOfMemory(device=cls.devices[0], time_s=when, overshoot_bytes=mem.peak_bytes - capacity)
    return first
