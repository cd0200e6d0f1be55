"""Results of a replay: the summary users read, per-action events, memory, and a Perfetto trace.

A replay (the SimPy engine or the fast path) fills a ``Recorder`` for each device class:
when every op ran, when memory was allocated and freed, when each all-reduce and the
optimizer step ran. ``SimResult`` turns that into what a user looks at:

* ``summary()`` — the JSON of ARCHITECTURE.md: ``iteration_time_s``,
  ``throughput_samples_per_s``, ``bubble_fraction`` (share of device time the compute stream
  is idle), ``peak_memory_bytes``, ``mfu``, ``oom`` and one entry per device;
* ``events()`` — one row per action and device (a pandas DataFrame);
* ``memory_timeline(device)`` — bytes over time, the peak and when it happens;
* ``perfetto_trace()`` — Chrome/Perfetto JSON with compute, send, receive and all-reduce
  tracks per device and a memory counter track.

Classes of identical devices (``sim.engine.symmetry``) are expanded back to every device here.
Memory events at the same instant apply frees before allocations, as an allocator would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sim.units import format_bytes
from sim.engine.workload import COMPUTE, RECV, REDUCE, SEND, Workload

__all__ = ["Recorder", "SimResult", "OutOfMemory"]


@dataclass(slots=True)
class Recorder:
    """What happened to one device class during a replay (mutable, filled by the replay)."""

    op_times: list[tuple[float, float] | None]
    """Per op: (start_s, end_s), None if it never ran (a failed replay). SEND: send stream
    busy; RECV: waiting; REDUCE: the all-reduce."""
    memory: list[tuple[float, float]] = field(default_factory=list)
    """(time_s, bytes delta) of activations (stash) per device of the class, in any order."""
    buffers: list[tuple[float, float]] = field(default_factory=list)
    """(time_s, bytes delta) of receive buffers per device of the class, in any order."""
    optimizer: tuple[float, float] = (0.0, 0.0)
    """Start and end of the optimizer step."""
    bytes_sent: float = 0.0
    bytes_received: float = 0.0


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
class _Memory:
    times_s: tuple[float, ...]
    bytes: tuple[float, ...]
    peak_bytes: float
    peak_time_s: float
    peak_live_microbatches: int
    final_bytes: float
    peak_activation_bytes: float
    """Peak of the stashed activations alone (no parameters, no receive buffers)."""


class SimResult:
    """A finished replay of ``workload``."""

    def __init__(
        self, workload: Workload, records: list[Recorder], *, engine: str, contention: bool, failure: dict | None = None
    ) -> None:
        self.workload = workload
        self.records = records
        self.engine = engine
        self.contention = contention
        self.failure = failure
        """When a device died (``sim.faults.Failure``): its id, the time and its action."""
        self.baseline: SimResult | None = None
        """The same plan without faults, when the scenario has faults (set by ``sim.engine.run``)."""
        self.iteration_time_s = None if failure else max((r.optimizer[1] for r in records), default=0.0)
        self._memory = [self._memory_of(c.index) for c in workload.classes]

    @property
    def end_s(self) -> float:
        """Where the replay's timeline ends: the iteration, or the failure that stopped it."""
        if self.iteration_time_s is not None:
            return self.iteration_time_s
        return self.failure["time_s"] if self.failure else 0.0

    # --- memory --------------------------------------------------------------------------

    def _memory_of(self, index: int) -> _Memory:
        cls, rec = self.workload.classes[index], self.records[index]
        events = sorted(rec.memory + rec.buffers, key=lambda e: (e[0], e[1] > 0))
        total, times, values = cls.static_bytes, [0.0], [cls.static_bytes]
        peak, peak_t = total, 0.0
        for t, delta in events:
            total += delta
            if t == times[-1]:
                values[-1] = total  # frees come first at one instant, so the last value is its peak
            else:
                times.append(t)
                values.append(total)
            if total > peak:
                peak, peak_t = total, t
        stash = stash_peak = 0.0
        for _, delta in sorted(rec.memory, key=lambda e: (e[0], e[1] > 0)):
            stash += delta
            stash_peak = max(stash_peak, stash)
        live = best = 0
        for op in cls.ops:
            live += op.live_delta
            best = max(best, live)
        return _Memory(
            times_s=tuple(times), bytes=tuple(values), peak_bytes=peak, peak_time_s=peak_t,
            peak_live_microbatches=best, final_bytes=total, peak_activation_bytes=stash_peak,
        )

    def class_of(self, device: int) -> int:
        for cls in self.workload.classes:
            if device in cls.devices:
                return cls.index
        raise KeyError(f"device {device} is not used by the plan")

    def memory_timeline(self, device: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(times_s, bytes) of ``device``'s memory, a step function starting at rest."""
        mem = self._memory[self.class_of(device)]
        return mem.times_s, mem.bytes

    @property
    def out_of_memory(self) -> OutOfMemory | None:
        capacity = self.workload.device_memory_bytes
        first = None
        for cls, mem in zip(self.workload.classes, self._memory):
            if mem.peak_bytes <= capacity:
                continue
            when = next(t for t, b in zip(mem.times_s, mem.bytes) if b > capacity)
            if first is None or (when, cls.devices[0]) < (first.time_s, first.device):
                first = OutOfMemory(device=cls.devices[0], time_s=when, overshoot_bytes=mem.peak_bytes - capacity)
        return first

    # --- summary ---------------------------------------------------------------------------

    def busy_s(self, index: int) -> float:
        """Seconds the class's compute stream works (what actually ran, stragglers included)."""
        cls, rec = self.workload.classes[index], self.records[index]
        compute = sum(t[1] - t[0] for op, t in zip(cls.ops, rec.op_times) if op.code == COMPUTE and t is not None)
        return compute + rec.optimizer[1] - rec.optimizer[0]

    def summary(self) -> dict[str, Any]:
        w, T = self.workload, self.iteration_time_s
        devices = []
        for cls, mem in zip(w.classes, self._memory):
            busy = self.busy_s(cls.index)
            for device in cls.devices:
                devices.append(
                    {
                        "device": device,
                        "stage": cls.stages[0],
                        "stages": list(cls.stages),
                        "busy_s": busy,
                        "idle_s": None if T is None else max(T - busy, 0.0),
                        "peak_memory_bytes": mem.peak_bytes,
                        "peak_memory_time_s": mem.peak_time_s,
                        "peak_activation_microbatches": mem.peak_live_microbatches,
                        "peak_activation_bytes": mem.peak_activation_bytes,
                        "bytes_sent": self.records[cls.index].bytes_sent,
                        "bytes_received": self.records[cls.index].bytes_received,
                    }
                )
        devices.sort(key=lambda d: d["device"])
        total_busy = sum(d["busy_s"] for d in devices)
        oom = self.out_of_memory
        T = T or 0.0  # a failed replay has no iteration time (reported as None below)
        summary = {
            "name": w.name,
            "engine": self.engine,
            "contention": self.contention,
            "iteration_time_s": T,
            "throughput_samples_per_s": w.global_batch_size / T if T > 0 else None,
            "bubble_fraction": 1.0 - total_busy / (len(devices) * T) if T > 0 else 0.0,
            "peak_memory_bytes": max(d["peak_memory_bytes"] for d in devices),
            "mfu": w.flop_per_iteration / (T * len(devices) * w.peak_flop_per_s) if w.flop_per_iteration and T > 0 else None,
            "oom": oom is not None,
            "oom_detail": None if oom is None else {"device": oom.device, "time_s": oom.time_s, "overshoot_bytes": oom.overshoot_bytes, "message": str(oom)},
            "schedule": w.schedule_name,
            "num_stages": w.num_stages,
            "num_microbatches": w.num_microbatches,
            "num_devices": len(devices),
            "device_classes": len(w.classes),
            "devices": devices,
        }
        if self.failure is not None:
            summary.update(iteration_time_s=None, throughput_samples_per_s=None, bubble_fraction=None, mfu=None)
            summary["failure"] = {**self.failure, "lost_compute_s": total_busy,
                                  "lost_device_s": self.failure["time_s"] * len(devices),
                                  "message": f"device {self.failure['device']} failed at "
                                             f"{self.failure['time_s'] * 1e3:.3f} ms during {self.failure['action']}: "
                                             f"the iteration cannot finish; {total_busy:.3g} s of compute on "
                                             f"{len(devices)} devices is lost"}
        if self.baseline is not None and self.baseline.iteration_time_s:
            summary["fault_impact"] = self._impact(devices)
        return summary

    def _impact(self, devices: list[dict]) -> dict[str, Any]:
        """How the faults changed the iteration and each device's idle time."""
        base = {d["device"]: d for d in self.baseline.summary()["devices"]}
        T0 = self.baseline.iteration_time_s
        rows = [
            {"device": d["device"], "idle_s": d["idle_s"], "fault_free_idle_s": base[d["device"]]["idle_s"],
             "idle_growth_s": None if d["idle_s"] is None else d["idle_s"] - base[d["device"]]["idle_s"]}
            for d in devices
        ]
        return {
            "fault_free_iteration_time_s": T0,
            "slowdown": None if self.iteration_time_s is None else self.iteration_time_s / T0,
            "devices": rows,
        }

    # --- events and trace ------------------------------------------------------------------

    def event_rows(self, devices: list[int] | None = None) -> list[dict[str, Any]]:
        """One dict per (device, action) with start and end times; all devices by default."""
        wanted = None if devices is None else set(devices)
        rows = []
        for cls, rec in zip(self.workload.classes, self.records):
            members = [d for d in cls.devices if wanted is None or d in wanted]
            for op, times in zip(cls.ops, rec.op_times):
                if times is None:
                    continue
                start, end = times
                for device in members:
                    rows.append(
                        {"device": device, "stage": op.stage, "kind": op.kind.value, "microbatch": op.microbatch,
                         "action": op.text, "stream": _STREAM[op.code], "start_s": start, "end_s": end}
                    )
            for device in members if self.failure is None else ():
                rows.append(
                    {"device": device, "stage": cls.stages[0], "kind": "OPTIM", "microbatch": None,
                     "action": "OPTIM", "stream": "compute", "start_s": rec.optimizer[0], "end_s": rec.optimizer[1]}
                )
        rows.sort(key=lambda r: (r["device"], r["start_s"], r["end_s"]))
        return rows

    def events(self, devices: list[int] | None = None):
        """Per-action events as a pandas DataFrame (pandas is imported only here)."""
        import pandas as pd

        columns = ["device", "stage", "kind", "microbatch", "action", "stream", "start_s", "end_s"]
        return pd.DataFrame(self.event_rows(devices), columns=columns)

    def traced_devices(self, limit: int = 64) -> list[int]:
        """Every device when there are at most ``limit``; otherwise one per class."""
        if self.workload.num_devices <= limit:
            return list(self.workload.devices)
        return sorted(cls.devices[0] for cls in self.workload.classes)

    def perfetto_trace(self, devices: list[int] | None = None) -> dict[str, Any]:
        """Chrome trace-event JSON (open in ui.perfetto.dev): one process per device."""
        devices = self.traced_devices() if devices is None else devices
        events: list[dict[str, Any]] = []
        tids = {"compute": 0, "send": 1, "recv": 2, "allreduce": 3}
        for device in devices:
            events.append({"ph": "M", "name": "process_name", "pid": device, "args": {"name": f"device {device}"}})
            for stream, tid in tids.items():
                events.append({"ph": "M", "name": "thread_name", "pid": device, "tid": tid, "args": {"name": stream}})
        for row in self.event_rows(devices):
            if row["end_s"] <= row["start_s"] and row["stream"] != "compute":
                continue
            events.append(
                {"ph": "X", "name": row["action"], "cat": row["kind"], "pid": row["device"], "tid": tids[row["stream"]],
                 "ts": row["start_s"] * 1e6, "dur": (row["end_s"] - row["start_s"]) * 1e6,
                 "args": {"microbatch": row["microbatch"], "stage": row["stage"]}}
            )
        for device in devices:
            for t, value in zip(*self.memory_timeline(device)):
                events.append({"ph": "C", "name": "memory", "pid": device, "ts": t * 1e6, "args": {"bytes": value}})
        metadata = {"engine": self.engine, "contention": self.contention, "devices_traced": len(devices),
                    "devices_total": self.workload.num_devices}
        return {"traceEvents": events, "displayTimeUnit": "ms", "metadata": metadata}


_STREAM = {COMPUTE: "compute", SEND: "send", RECV: "recv", REDUCE: "allreduce"}
