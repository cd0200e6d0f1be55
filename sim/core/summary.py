"""What a replay predicts, as types: the summary of one iteration and of every device.

A replay (``sim.engine``) produces one ``Summary``; every package reads its fields and none
re-keys another's dict. JSON is made from it at the edge, once, by ``Summary.to_json()``,
whose keys are the summary format of ``docs/architecture.md`` (what ``dapple-sim simulate
--json`` prints and ``summary.json`` holds):

* ``iteration_time_s``, ``throughput_samples_per_s``, ``bubble_fraction`` (share of device
  time the compute streams are idle), ``peak_memory_bytes``, ``mfu``, ``oom`` and
  ``oom_detail``, the plan's shape, and one ``DeviceSummary`` per device in device order;
* ``failure`` when a device died and the iteration could not finish (``sim.core.faults.Failure``),
  and ``fault_impact`` when the scenario has faults: the same plan without them, compared;
* ``fabric`` when the cluster has a fabric: bytes and utilisation per tier, the busiest links
  (``sim.core.fabric_traffic``);
* ``run`` when the scenario sets a run length: days, GPU-hours, cost, energy, goodput
  (``sim.core.run_estimate``).

``metrics_row`` is the one flat view of a summary that tables use (the sweep's columns, the
planner's entries).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.core.fabric_traffic import FabricTraffic
from sim.core.run_estimate import RunEstimate

__all__ = ["DeviceSummary", "FailureDetail", "FaultImpact", "IdleGrowth", "MemoryBreakdown", "OomDetail", "Parallelism",
           "Summary", "metrics_row", "stage_groups"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Parallelism:
    """The plan's degrees: how many devices share each dimension of the work."""

    tensor: int
    context: int
    pipeline: int
    """Pipeline ranks (distinct device sets)."""
    data: int
    """Data-parallel replicas of the widest stage (stages may differ: DAPPLE's uneven plans)."""
    sharding: str
    sequence_parallel: bool

    def to_json(self) -> dict[str, Any]:
        return {"tensor": self.tensor, "context": self.context, "pipeline": self.pipeline, "data": self.data,
                "sharding": self.sharding, "sequence_parallel": self.sequence_parallel}


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBreakdown:
    """A device's bytes by kind at its peak: states at rest, then what the iteration adds."""

    parameters: float
    gradients: float
    optimizer: float
    activations: float
    """Stashed activations held at the peak."""
    buffers: float
    """Communication buffers held at the peak: received activations and gradients, gathered parameters."""

    def to_json(self) -> dict[str, Any]:
        return {"parameters": self.parameters, "gradients": self.gradients, "optimizer": self.optimizer,
                "activations": self.activations, "buffers": self.buffers}


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceSummary:
    """One device over the iteration."""

    device: int
    stage: int
    """The first (lowest) stage the device runs."""
    stages: tuple[int, ...]
    """Every stage it runs (several under an interleaved schedule)."""
    busy_s: float
    """Seconds its compute stream works, optimizer step included."""
    idle_s: float | None
    """Iteration time minus ``busy_s``; None when the iteration did not finish."""
    peak_memory_bytes: float
    peak_memory_time_s: float
    peak_activation_microbatches: int
    """Most micro-batches whose activations it holds at once."""
    peak_activation_bytes: float
    """Peak of the stashed activations alone (no parameters, no receive buffers)."""
    bytes_sent: float
    bytes_received: float
    memory_breakdown: MemoryBreakdown | None = None
    """``peak_memory_bytes`` by kind (``memory_breakdown_bytes`` in JSON)."""
    communication_s: float = 0.0
    """Seconds its gradient reductions and group collectives are in flight (their union;
    ``sim.engine.exposure``)."""
    exposed_communication_s: float = 0.0
    """Seconds of ``communication_s`` while its compute stream is not busy: what overlap did not hide."""

    @property
    def overlap_fraction(self) -> float | None:
        """Share of its communication hidden behind compute; None without communication."""
        c = self.communication_s
        return 1.0 - self.exposed_communication_s / c if c > 0 else None

    def to_json(self) -> dict[str, Any]:
        return {
            "communication_s": self.communication_s, "exposed_communication_s": self.exposed_communication_s,
            "overlap_fraction": self.overlap_fraction,
            "memory_breakdown_bytes": None if self.memory_breakdown is None else self.memory_breakdown.to_json(),
            "device": self.device, "stage": self.stage, "stages": list(self.stages), "busy_s": self.busy_s,
            "idle_s": self.idle_s, "peak_memory_bytes": self.peak_memory_bytes,
            "peak_memory_time_s": self.peak_memory_time_s,
            "peak_activation_microbatches": self.peak_activation_microbatches,
            "peak_activation_bytes": self.peak_activation_bytes, "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class OomDetail:
    """The first moment a device needs more memory than it has."""

    device: int
    time_s: float
    overshoot_bytes: float
    """Peak bytes minus capacity."""
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "time_s": self.time_s, "overshoot_bytes": self.overshoot_bytes,
                "message": self.message}


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureDetail:
    """A device died during the iteration, which therefore cannot finish."""

    device: int
    time_s: float
    action: str
    """The action it was running (IR text) or ``idle``."""
    lost_compute_s: float
    """Compute-stream seconds of every device spent on the lost iteration."""
    lost_device_s: float
    """Device-seconds from the iteration's start to the failure."""
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "time_s": self.time_s, "action": self.action,
                "lost_compute_s": self.lost_compute_s, "lost_device_s": self.lost_device_s, "message": self.message}


@dataclass(frozen=True, slots=True, kw_only=True)
class IdleGrowth:
    """How a device's idle time changed with the faults."""

    device: int
    idle_s: float | None
    fault_free_idle_s: float | None
    idle_growth_s: float | None

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "idle_s": self.idle_s, "fault_free_idle_s": self.fault_free_idle_s,
                "idle_growth_s": self.idle_growth_s}


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultImpact:
    """The iteration with the scenario's faults against the same plan without them."""

    fault_free_iteration_time_s: float
    slowdown: float | None
    """Iteration time over the fault-free one; None when the iteration did not finish."""
    devices: tuple[IdleGrowth, ...]

    def to_json(self) -> dict[str, Any]:
        return {"fault_free_iteration_time_s": self.fault_free_iteration_time_s, "slowdown": self.slowdown,
                "devices": [d.to_json() for d in self.devices]}


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    """One replayed iteration of a plan."""

    name: str
    """The scenario's name."""
    engine: str
    """``simpy`` or ``fast``."""
    contention: bool
    iteration_time_s: float | None
    """None when a device failed and the iteration could not finish."""
    throughput_samples_per_s: float | None
    bubble_fraction: float | None
    peak_memory_bytes: float
    mfu: float | None
    """Model FLOPs utilisation, when the model's FLOPs are known (generated models)."""
    oom_detail: OomDetail | None
    schedule: str
    num_stages: int
    num_microbatches: int
    num_devices: int
    device_classes: int
    """Classes of identical devices the replay ran (``sim.engine.symmetry``)."""
    devices: tuple[DeviceSummary, ...]
    failure: FailureDetail | None = None
    fault_impact: FaultImpact | None = None
    parallelism: Parallelism | None = None
    tokens_per_s: float | None = None
    """Training tokens per second (transformers: samples × sequence length)."""
    model_flops_per_device_per_s: float | None = None
    """Model FLOPs (as MFU counts them) per device per second."""
    run: RunEstimate | None = None
    """The whole run at this iteration (``sim.cost.capacity.estimate_run``), when the scenario
    sets ``training.tokens`` or ``steps``; the JSON's ``run`` section only then."""
    fabric: FabricTraffic | None = None
    """Bytes and utilisation per fabric tier and the busiest links (``sim.core.fabric_traffic``),
    when the cluster has a fabric and the iteration finished; the JSON's ``fabric`` section only then."""

    @property
    def oom(self) -> bool:
        return self.oom_detail is not None

    @property
    def most_exposed(self) -> DeviceSummary:
        """The device with the most exposed communication (the lowest id among equals)."""
        return max(self.devices, key=lambda d: (d.exposed_communication_s, -d.device))

    @property
    def exposed_communication_s(self) -> float:
        """The worst device's exposed communication, seconds."""
        return self.most_exposed.exposed_communication_s

    @property
    def overlap_fraction(self) -> float | None:
        """The overlap fraction of the device with the most exposed communication."""
        return self.most_exposed.overlap_fraction

    def device(self, device: int) -> DeviceSummary:
        """The summary of ``device`` (a device the plan uses)."""
        for entry in self.devices:
            if entry.device == device:
                return entry
        raise KeyError(f"device {device} is not used by the plan")

    def to_json(self) -> dict[str, Any]:
        """The summary JSON: ``failure`` and ``fault_impact`` appear only when there is one."""
        data: dict[str, Any] = {
            "name": self.name, "engine": self.engine, "contention": self.contention,
            "iteration_time_s": self.iteration_time_s, "throughput_samples_per_s": self.throughput_samples_per_s,
            "bubble_fraction": self.bubble_fraction, "peak_memory_bytes": self.peak_memory_bytes, "mfu": self.mfu,
            "oom": self.oom, "oom_detail": None if self.oom_detail is None else self.oom_detail.to_json(),
            "schedule": self.schedule, "num_stages": self.num_stages, "num_microbatches": self.num_microbatches,
            "num_devices": self.num_devices, "device_classes": self.device_classes,
            "devices": [d.to_json() for d in self.devices],
            "parallelism": None if self.parallelism is None else self.parallelism.to_json(),
            "tokens_per_s": self.tokens_per_s,
            "model_flops_per_device_per_s": self.model_flops_per_device_per_s,
            "exposed_communication_s": self.exposed_communication_s, "overlap_fraction": self.overlap_fraction,
        }
        if self.failure is not None:
            data["failure"] = self.failure.to_json()
        if self.fault_impact is not None:
            data["fault_impact"] = self.fault_impact.to_json()
        if self.run is not None:
            data["run"] = self.run.to_json()
        if self.fabric is not None:
            data["fabric"] = self.fabric.to_json()
        return data


def stage_groups(devices) -> list[tuple[tuple[int, ...], list[DeviceSummary]]]:
    """``devices`` (``DeviceSummary``s) grouped by the stages they run, in stage order, each
    group in device order: what a report shows when a plan has too many device classes for a
    row each (the text report's table, the figures' rows)."""
    by_stages: dict[tuple[int, ...], list[DeviceSummary]] = {}
    for row in devices:
        by_stages.setdefault(tuple(row.stages), []).append(row)
    return [(stages, sorted(rows, key=lambda r: r.device)) for stages, rows in sorted(by_stages.items())]


def metrics_row(summary: Summary) -> dict[str, Any]:
    """The flat metrics of a summary, as the sweep's table and the planner's entries show them."""
    oom = summary.oom_detail
    return {
        "schedule": summary.schedule, "num_stages": summary.num_stages, "num_devices": summary.num_devices,
        "num_microbatches": summary.num_microbatches, "iteration_time_s": summary.iteration_time_s,
        "throughput_samples_per_s": summary.throughput_samples_per_s, "bubble_fraction": summary.bubble_fraction,
        "mfu": summary.mfu, "peak_memory_bytes": summary.peak_memory_bytes,
        "min_peak_memory_bytes": min(d.peak_memory_bytes for d in summary.devices),
        "oom": summary.oom, "oom_device": None if oom is None else oom.device,
        "oom_overshoot_bytes": None if oom is None else oom.overshoot_bytes,
    }
