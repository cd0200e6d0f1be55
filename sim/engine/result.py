"""Results of a replay: the summary users read, per-action events and memory.

A replay (the SimPy engine or the fast path) fills a ``Recorder`` for each device class:
when every op ran, when memory was allocated and freed, when each all-reduce and the
optimizer step ran. ``SimResult`` turns that into what a user looks at:

* ``summarize()`` — the typed ``sim.core.summary.Summary`` (``summary()`` is its JSON form, the
  format of ``docs/architecture.md``): iteration time, throughput, bubble fraction (share
  of device time the compute stream is idle), peak memory, MFU, out-of-memory verdict and
  one ``DeviceSummary`` per device;
* ``event_rows()`` / ``events()`` — one ``sim.core.events.EventRow`` per action and device (or a
  pandas DataFrame of their JSON, the columns of ``events.csv``);
* ``memory_timeline(device)`` — bytes over time (``sim.engine.memory``).

The Chrome trace is ``sim.engine.trace.perfetto_trace(result)``. Classes of identical devices
(``sim.engine.symmetry``) are expanded back to every device here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.core.events import EVENT_COLUMNS, EventRow
from sim.core.summary import (
    DeviceSummary,
    FailureDetail,
    FaultImpact,
    IdleGrowth,
    MemoryBreakdown,
    OomDetail,
    Summary,
)
from sim.engine.exposure import class_exposure, op_indices
from sim.engine.memory import OutOfMemory, first_out_of_memory, memory_timeline, peak_live_microbatches
from sim.engine.records import Recorder
from sim.engine.tier_traffic import fabric_traffic
from sim.engine.workload import COMPUTE, GROUP, RECV, REDUCE, SEND, Workload

__all__ = ["OutOfMemory", "SimResult"]


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
        """When a device died (``sim.core.faults.Failure``): its id, the time and its action."""
        self.baseline: SimResult | None = None
        """The same plan without faults, when the scenario has faults (set by ``sim.engine.run``)."""
        self.diverged: str | None = None
        """Why the optimistic classes of a faulted plan did not hold with contention, when they
        did not and the equitable ones were replayed instead (set by ``sim.engine.run``)."""
        self._compute_at: dict[int, Any] = {}  # id(ops) -> where its COMPUTE ops are (``busy_s``)
        self._comm_at: dict[int, Any] = {}  # id(ops) -> where its compute and communication ops are
        self.iteration_time_s = None if failure else max((r.optimizer[1] for r in records), default=0.0)
        live: dict[int, int] = {}  # classes that share their ops share their live peak
        for c in workload.classes:
            if id(c.ops) not in live:
                live[id(c.ops)] = peak_live_microbatches(c.ops)
        self._memory = [memory_timeline(c, r, live[id(c.ops)]) for c, r in zip(workload.classes, records)]

    @property
    def end_s(self) -> float:
        """Where the replay's timeline ends: the iteration, or the failure that stopped it."""
        if self.iteration_time_s is not None:
            return self.iteration_time_s
        return self.failure["time_s"] if self.failure else 0.0

    # --- memory --------------------------------------------------------------------------

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
        return first_out_of_memory(self.workload, self._memory)

    # --- summary ---------------------------------------------------------------------------

    def busy_s(self, index: int) -> float:
        """Seconds the class's compute stream works (what actually ran, stragglers included)."""
        cls, rec = self.workload.classes[index], self.records[index]
        at = self._compute_at.get(id(cls.ops))
        if at is None:  # classes that share their ops share where their compute actions are
            at = self._compute_at[id(cls.ops)] = np.array([i for i, op in enumerate(cls.ops) if op.code == COMPUTE],
                                                          dtype=np.intp)
        start = np.frombuffer(rec.op_times.start, dtype=float)[at]
        ran = np.frombuffer(rec.op_times.end, dtype=float)[at] - start
        # what never ran (a failed replay) is NaN; summed in order, as a loop would
        compute = sum(ran[start == start].tolist())
        return compute + rec.optimizer[1] - rec.optimizer[0]

    def summarize(self) -> Summary:
        """The replayed iteration as a ``Summary`` (with ``fault_impact`` when ``baseline`` is set)."""
        w, T = self.workload, self.iteration_time_s
        devices = []
        for cls, mem in zip(w.classes, self._memory):
            busy, record = self.busy_s(cls.index), self.records[cls.index]
            indices = self._comm_at.get(id(cls.ops))
            if indices is None:  # classes that share their ops share where their communication is
                indices = self._comm_at[id(cls.ops)] = op_indices(cls.ops)
            communication, exposed = class_exposure(cls, record, indices)
            devices += [
                DeviceSummary(
                    device=device, stage=cls.stages[0], stages=tuple(cls.stages), busy_s=busy,
                    idle_s=None if T is None else max(T - busy, 0.0), peak_memory_bytes=mem.peak_bytes,
                    peak_memory_time_s=mem.peak_time_s, peak_activation_microbatches=mem.peak_live_microbatches,
                    peak_activation_bytes=mem.peak_activation_bytes, bytes_sent=record.bytes_sent,
                    bytes_received=record.bytes_received, communication_s=communication,
                    exposed_communication_s=exposed,
                    memory_breakdown=MemoryBreakdown(
                        parameters=cls.states.parameters, gradients=cls.states.gradients,
                        optimizer=cls.states.optimizer, activations=mem.activations_at_peak_bytes,
                        buffers=mem.buffers_at_peak_bytes,
                    ),
                )
                for device in cls.devices
            ]
        devices.sort(key=lambda d: d.device)
        total_busy = sum(d.busy_s for d in devices)
        oom = self.out_of_memory
        finished = self.failure is None
        T = T or 0.0  # a failed replay has no iteration time (reported as None below)
        return Summary(
            name=w.name,
            engine=self.engine,
            contention=self.contention,
            iteration_time_s=T if finished else None,
            throughput_samples_per_s=w.global_batch_size / T if T > 0 and finished else None,
            bubble_fraction=(1.0 - total_busy / (len(devices) * T) if T > 0 else 0.0) if finished else None,
            peak_memory_bytes=max(d.peak_memory_bytes for d in devices),
            mfu=(w.flop_per_iteration / (T * len(devices) * w.peak_flop_per_s)
                 if w.flop_per_iteration and T > 0 and finished else None),
            oom_detail=None if oom is None else OomDetail(device=oom.device, time_s=oom.time_s,
                                                          overshoot_bytes=oom.overshoot_bytes, message=str(oom)),
            schedule=w.schedule_name,
            num_stages=w.num_stages,
            num_microbatches=w.num_microbatches,
            num_devices=len(devices),
            device_classes=len(w.classes),
            devices=tuple(devices),
            failure=None if finished else self._failure(total_busy, len(devices)),
            parallelism=w.parallelism,
            tokens_per_s=(w.global_batch_size * w.tokens_per_sample / T
                          if w.tokens_per_sample and T > 0 and finished else None),
            model_flops_per_device_per_s=(w.flop_per_iteration / (T * len(devices))
                                          if w.flop_per_iteration and T > 0 and finished else None),
            fault_impact=self._impact(devices) if self.baseline is not None and self.baseline.iteration_time_s
            else None,
            fabric=(fabric_traffic(w.fabric_traffic, w, T)
                    if w.fabric_traffic is not None and finished and T > 0 else None),
        )

    def summary(self) -> dict[str, Any]:
        """The summary JSON (``summarize().to_json()``): what ``summary.json`` holds."""
        return self.summarize().to_json()

    def _failure(self, total_busy: float, num_devices: int) -> FailureDetail:
        f = self.failure
        return FailureDetail(
            device=f["device"], time_s=f["time_s"], action=f["action"], lost_compute_s=total_busy,
            lost_device_s=f["time_s"] * num_devices,
            message=f"device {f['device']} failed at {f['time_s'] * 1e3:.3f} ms during {f['action']}: the "
                    f"iteration cannot finish; {total_busy:.3g} s of compute on {num_devices} devices is lost",
        )

    def _impact(self, devices: list[DeviceSummary]) -> FaultImpact:
        """How the faults changed the iteration and each device's idle time."""
        base = {d.device: d for d in self.baseline.summarize().devices}
        T0 = self.baseline.iteration_time_s
        rows = tuple(
            IdleGrowth(device=d.device, idle_s=d.idle_s, fault_free_idle_s=base[d.device].idle_s,
                       idle_growth_s=None if d.idle_s is None else d.idle_s - base[d.device].idle_s)
            for d in devices
        )
        return FaultImpact(
            fault_free_iteration_time_s=T0,
            slowdown=None if self.iteration_time_s is None else self.iteration_time_s / T0,
            devices=rows,
        )

    # --- events ----------------------------------------------------------------------------

    def event_rows(self, devices: list[int] | None = None) -> list[EventRow]:
        """One row per (device, action) with start and end times; all devices by default."""
        wanted = None if devices is None else set(devices)
        rows = []
        for cls, rec in zip(self.workload.classes, self.records):
            members = [d for d in cls.devices if wanted is None or d in wanted]
            for op, times in zip(cls.ops, rec.op_times):
                if times is None or op.code == GROUP:  # a group collective runs inside or beside its action's row
                    continue
                start, end = times
                for device in members:
                    rows.append(EventRow(device=device, stage=op.stage, kind=op.kind.value, microbatch=op.microbatch,
                                         action=op.text, stream=_STREAM[op.code], start_s=start, end_s=end))
            for device in members if self.failure is None else ():
                rows.append(EventRow(device=device, stage=cls.stages[0], kind="OPTIM", microbatch=None, action="OPTIM",
                                     stream="compute", start_s=rec.optimizer[0], end_s=rec.optimizer[1]))
        rows.sort(key=lambda r: (r.device, r.start_s, r.end_s))
        return rows

    def events(self, devices: list[int] | None = None):
        """Per-action events as a pandas DataFrame (pandas is imported only here)."""
        # pandas only when a table is built: keeps it off the import path of the rest
        import pandas as pd

        frame = pd.DataFrame([row.to_json() for row in self.event_rows(devices)], columns=list(EVENT_COLUMNS))
        # a column of ints and Nones would be floats (NaN for None): events.csv would read "3.0";
        # pandas' nullable integers write "3", and "" for a per-iteration action
        frame["microbatch"] = frame["microbatch"].astype("Int64")
        return frame


_STREAM = {COMPUTE: "compute", SEND: "send", RECV: "recv", REDUCE: "allreduce"}
