"""Memory of a device over one iteration, from what a replay recorded.

A replay records, per device class, ``(time_s, bytes delta)`` events of stashed activations
and of receive buffers (``sim.engine.records.Recorder``). Starting from the bytes held at rest
(parameters, gradients, optimizer state: ``DeviceClass.static_bytes``), their running sum is
the device's memory as a step function of time. Events at the same instant apply frees before
allocations, as an allocator would, so a buffer handed from one action to the next does not
count twice. Under ZeRO-2/3 and FSDP a compute op also holds, while it runs, the unsharded
parameters and gradient of the units live at once (``held_by_stage``: ``sim.cost.memory.stage_held_bytes``).
A device runs out of memory the first time that sum passes its usable capacity
(``DeviceSpec.usable_memory_bytes``: its memory less what the CUDA context, NCCL and the
allocator reserve).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sim.core.units import format_bytes
from sim.cost.memory import HeldBytes, stage_held_bytes

if TYPE_CHECKING:
    from sim.engine.records import Recorder
    from sim.engine.workload import DeviceClass, Workload
    from sim.schedule.resolved import ResolvedPlan

__all__ = ["MemoryTimeline", "OutOfMemory", "first_out_of_memory", "held_by_stage", "memory_timeline"]


def held_by_stage(resolved: ResolvedPlan) -> tuple[HeldBytes, ...]:
    """What each stage's compute actions hold unsharded while they run, on one device
    (``sim.cost.memory.stage_held_bytes`` on the stage's layers, its gradient group, the plan's
    sharding and ``plan.fsdp``): the engine's ops and the planner's count read the same."""
    plan = resolved.plan
    return tuple(stage_held_bytes(resolved.model, *stage.layers, data_parallel=len(plan.gradient_groups(s)[0]),
                                  sharding=plan.sharding, fsdp=plan.fsdp, num_microbatches=resolved.num_microbatches)
                 for s, stage in enumerate(plan.stages))


@dataclass(frozen=True, slots=True, kw_only=True)
class OutOfMemory:
    """The first moment a device needs more memory than it has."""

    device: int
    time_s: float
    overshoot_bytes: float
    """Peak bytes minus the usable capacity."""
    usable_bytes: float = 0.0
    """The usable capacity it passed (``DeviceSpec.usable_memory_bytes``), bytes."""
    memory_bytes: float = 0.0
    """The device's whole memory, bytes."""

    def __str__(self) -> str:
        usable = ""
        if self.usable_bytes < self.memory_bytes:
            usable = f" of its {format_bytes(self.usable_bytes)} usable of {format_bytes(self.memory_bytes)}"
        return (
            f"device {self.device} runs out of memory at {self.time_s * 1e3:.3f} ms "
            f"(needs {format_bytes(self.overshoot_bytes)} more than it has{usable})"
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


def peak_live_microbatches(ops) -> int:
    """Most micro-batches whose activations are alive at once along ``ops`` (+1 per F, −1 per B or W)."""
    live = best = 0
    for op in ops:
        live += op.live_delta
        if live > best:
            best = live
    return best


def memory_timeline(cls: DeviceClass, record: Recorder, live_peak: int | None = None) -> MemoryTimeline:
    """The memory of one device of ``cls`` from its class's ``record`` (``live_peak``: its ops'
    ``peak_live_microbatches``, when the caller has it).

    Vectorised (numpy): a stable sort puts the events in time order, frees before allocations
    at one instant, each group in recorded order (activations, then buffers); the running
    sums are sequential (``cumsum``), so every value equals a plain loop's to the last bit.
    """
    stash_t, stash_d = record.memory.times, record.memory.deltas  # lists, or arrays (``sim.engine.vector``)
    times = np.concatenate((np.asarray(stash_t, dtype=float), np.asarray(record.buffers.times, dtype=float)))
    deltas = np.concatenate((np.asarray(stash_d, dtype=float), np.asarray(record.buffers.deltas, dtype=float)))
    order = np.lexsort((deltas > 0, times))  # by time, then frees first; stable within each
    times, deltas = times[order], deltas[order]
    is_stash = order < len(stash_t)
    totals = np.cumsum(np.concatenate(([cls.static_bytes], deltas)))
    at = np.concatenate(([0.0], times))
    # one value per instant: the last of its events (frees come first, so that is its peak)
    last = np.ones(len(at), dtype=bool)
    last[:-1] = at[1:] != at[:-1]
    peak_index = int(np.argmax(totals))  # the first time the peak is reached
    held_stash = np.cumsum(np.where(is_stash, deltas, 0.0))
    held_buffers = np.cumsum(np.where(is_stash, 0.0, deltas))
    at_peak = (0.0, 0.0) if peak_index == 0 else (float(held_stash[peak_index - 1]),
                                                   float(held_buffers[peak_index - 1]))
    # the stash's own running sum, in its own time order: ``held_stash`` (adding 0.0 changes no value)
    stash_peak = max(0.0, float(held_stash.max())) if len(stash_t) else 0.0
    best = peak_live_microbatches(cls.ops) if live_peak is None else live_peak
    return MemoryTimeline(
        times_s=tuple(at[last].tolist()), bytes=tuple(totals[last].tolist()), peak_bytes=float(totals[peak_index]),
        peak_time_s=float(at[peak_index]), peak_live_microbatches=best, final_bytes=float(totals[-1]),
        peak_activation_bytes=stash_peak, activations_at_peak_bytes=at_peak[0], buffers_at_peak_bytes=at_peak[1],
    )


def first_out_of_memory(workload: Workload, timelines: list[MemoryTimeline]) -> OutOfMemory | None:
    """The earliest moment (then the lowest device id) any class passes the device's usable capacity."""
    capacity = workload.capacity_bytes
    first = None
    for cls, mem in zip(workload.classes, timelines):
        if mem.peak_bytes <= capacity:
            continue
        when = next(t for t, b in zip(mem.times_s, mem.bytes) if b > capacity)
        if first is None or (when, cls.devices[0]) < (first.time_s, first.device):
            first = OutOfMemory(device=cls.devices[0], time_s=when, overshoot_bytes=mem.peak_bytes - capacity,
                                usable_bytes=capacity, memory_bytes=workload.device_memory_bytes)
    return first
