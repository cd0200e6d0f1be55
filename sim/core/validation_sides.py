"""The two sides of a validation: one step of a plan, predicted and measured, in one vocabulary.

A prediction (``sim.engine.result.SimResult``) and a measured run (``dapple-run``'s run
summary) become the same type, a ``RunSide``: the iteration time, each device's peak memory
(``DeviceSide``, with its bytes by kind, ``MemoryByKind``) and compute seconds, each stage's
compute (``StageCompute``) and one ``sim.core.events.EventRow`` per action. What counts as
memory depends on what can be measured (``sim.report.analysis.validation``'s module doc);
both sides count it alike. ``sim.report.analysis.validation.run_side`` builds one, summing
the compute from the events, so that a side's numbers always agree with its rows.

Each type has one ``to_json()`` (the keys of ``validation.json``'s ``predicted`` and
``measured``) and a ``from_json`` that reads a recorded report back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from sim.core.events import EventRow

__all__ = ["MEMORY_KINDS", "ByKind", "DeviceSide", "MemoryByKind", "RunSide", "StageCompute"]

MEMORY_KINDS = ("parameters", "gradients", "optimizer", "activations")
"""The kinds of ``sim.core.summary.MemoryBreakdown`` a counted run measures (its buffers are not)."""


def _tuple(values) -> tuple | None:
    return None if values is None else tuple(values)


def _list(values) -> list | None:
    return None if values is None else list(values)


class ByKind:
    """A value per memory kind (``MEMORY_KINDS``, one field each): how the bytes by kind and the
    errors by kind are read, written and read back."""

    __slots__ = ()

    def kind(self, name: str) -> float | None:
        """The value of kind ``name`` (one of ``MEMORY_KINDS``)."""
        return getattr(self, name)

    def to_json(self) -> dict[str, Any]:
        return {kind: getattr(self, kind) for kind in MEMORY_KINDS}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None):
        """The kinds of a mapping (a run summary's ``memory_breakdown_bytes``, a report's errors;
        other keys are not read); None for None."""
        return None if data is None else cls(**{kind: data.get(kind) for kind in MEMORY_KINDS})


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryByKind(ByKind):
    """One device's bytes by kind (``MEMORY_KINDS``): model states and activations at their peak."""

    parameters: float | None
    """Parameter bytes the device stores."""
    gradients: float | None
    """Gradient bytes the device stores."""
    optimizer: float | None
    """Optimizer-state bytes the device stores."""
    activations: float | None
    """Saved-activation bytes at their peak; None where the run did not count them."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceSide:
    """One device in one step, predicted or measured."""

    device: int
    """The device (global rank)."""
    stages: tuple[int, ...] | None
    """The stages it runs; None where the measurement does not say."""
    peak_memory_bytes: float | None
    """Peak memory, bytes: the allocator's peak, or static bytes plus saved activations on a
    counted run (``ValidationReport.memory``); None where not measured."""
    peak_activation_bytes: float | None
    """Peak of the saved activations, bytes; None where not counted."""
    memory_breakdown_bytes: MemoryByKind | None
    """Its bytes by kind; None where the side does not break them down."""
    compute_s: float = 0.0
    """Seconds of F, B, I and W actions in the step (``sim.report.analysis.validation.run_side``
    sums them from the side's events)."""

    def to_json(self) -> dict[str, Any]:
        kinds = self.memory_breakdown_bytes
        return {"device": self.device, "stages": _list(self.stages), "peak_memory_bytes": self.peak_memory_bytes,
                "peak_activation_bytes": self.peak_activation_bytes,
                "memory_breakdown_bytes": None if kinds is None else kinds.to_json(), "compute_s": self.compute_s}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DeviceSide:
        return cls(device=data["device"], stages=_tuple(data.get("stages")),
                   peak_memory_bytes=data.get("peak_memory_bytes"),
                   peak_activation_bytes=data.get("peak_activation_bytes"),
                   memory_breakdown_bytes=MemoryByKind.from_json(data.get("memory_breakdown_bytes")),
                   compute_s=data.get("compute_s", 0.0))


@dataclass(frozen=True, slots=True, kw_only=True)
class StageCompute:
    """One stage's compute in one step."""

    stage: int
    """The stage."""
    compute_s: float
    """Seconds of F, B, I and W actions on one of its devices (the mean over its replicas)."""

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "compute_s": self.compute_s}


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSide:
    """One side of a comparison: the predicted or the measured step."""

    iteration_time_s: float | None
    """The iteration time, seconds: the prediction's, or the median of the measured steps."""
    iteration_times_s: tuple[float, ...] | None
    """Every measured step's time, seconds; None for the prediction."""
    devices: tuple[DeviceSide, ...]
    """Every device, by device id."""
    stages: tuple[StageCompute, ...]
    """Every stage with compute, by stage."""
    events: tuple[EventRow, ...]
    """Every action of the step (a measurement's: the median step's), by device and start."""

    def to_json(self) -> dict[str, Any]:
        data = {"iteration_time_s": self.iteration_time_s, "devices": [d.to_json() for d in self.devices],
                "events": [row.to_json() for row in self.events], "stages": [s.to_json() for s in self.stages]}
        if self.iteration_times_s is not None:
            data["iteration_times_s"] = list(self.iteration_times_s)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunSide:
        return cls(iteration_time_s=data["iteration_time_s"], iteration_times_s=_tuple(data.get("iteration_times_s")),
                   devices=tuple(DeviceSide.from_json(d) for d in data["devices"]),
                   stages=tuple(StageCompute(stage=s["stage"], compute_s=s["compute_s"]) for s in data["stages"]),
                   events=tuple(EventRow.from_json(row) for row in data["events"]))
