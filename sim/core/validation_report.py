"""A validation report: the errors of a prediction against a measured run, and the run's context.

``sim.report.analysis.validation.compare`` sets two sides (``RunSide``,
``validation_sides``) against each other and reports ``ValidationErrors``: relative errors ``(predicted −
measured) / measured`` per iteration, stage (``StageError``), device (``DeviceError``, by
memory kind ``MemoryErrorByKind``) and action (``ActionErrors``, ``ActionComparison`` per
stage and kind); None where the measurement has nothing to divide by. ``dapple-run
validate`` (``runtime.validation.loop``) adds what it measured the prediction on
(``ValidationProfile``), each turn of profile and run on its own (``TurnComparison``) and,
with ``--rounds``, every round (``RoundComparison``): a ``ValidationReport``.

The turns also say how steady the machine was (``Drift``, ``turn_drift``): every turn runs the
same steps of the same plan, so the spread of the turns' measured step times is the machine's
speed moving, not the model erring. When that spread is larger than the error reported, the
error says more about the machine than about the simulator.

Every type here is plain data with exactly one ``to_json()``: the command that prints or
writes a report makes its JSON there, once (``validation.json``, ``--json``); the text table
and the charts read the types. ``ValidationReport.from_json`` reads a recorded report back
(a recording made before some keys existed reads them as None).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Mapping

from sim.core.validation_sides import ByKind, RunSide

__all__ = ["ActionComparison", "ActionErrors", "DeviceError", "Drift", "MemoryErrorByKind", "RoundComparison",
           "StageError", "TurnComparison", "ValidationErrors", "ValidationProfile", "ValidationReport", "turn_drift"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryErrorByKind(ByKind):
    """One device's relative memory error by kind, ``(predicted − measured) / measured``; a kind
    that both sides hold none of is exact (0), one with nothing measured is None."""

    parameters: float | None
    """Error of the parameter bytes (a fraction)."""
    gradients: float | None
    """Error of the gradient bytes (a fraction)."""
    optimizer: float | None
    """Error of the optimizer-state bytes (a fraction)."""
    activations: float | None
    """Error of the saved-activation peak (a fraction)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceError:
    """One device's relative errors (fractions; None where nothing was measured)."""

    device: int
    """The device."""
    peak_memory_frac: float | None
    """Error of the peak memory."""
    compute_frac: float | None
    """Error of the step's compute seconds."""
    memory_by_kind_frac: MemoryErrorByKind | None
    """Errors by memory kind; None unless both sides break their memory down."""

    def to_json(self) -> dict[str, Any]:
        kinds = self.memory_by_kind_frac
        return {"device": self.device, "peak_memory_frac": self.peak_memory_frac, "compute_frac": self.compute_frac,
                "memory_by_kind_frac": None if kinds is None else kinds.to_json()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DeviceError:
        return cls(device=data["device"], peak_memory_frac=data.get("peak_memory_frac"),
                   compute_frac=data.get("compute_frac"),
                   memory_by_kind_frac=MemoryErrorByKind.from_json(data.get("memory_by_kind_frac")))


@dataclass(frozen=True, slots=True, kw_only=True)
class StageError:
    """One stage's compute error."""

    stage: int
    """The stage."""
    compute_frac: float | None
    """Error of its compute seconds per device (a fraction); None where the measurement has none."""

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "compute_frac": self.compute_frac}


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionComparison:
    """The actions of one kind on one stage that both sides ran (matched by device and action text)."""

    stage: int
    """The stage."""
    kind: str
    """The action kind (``F``, ``B``, ``I``, ``W``, ``OPTIM``)."""
    count: int
    """How many matched actions."""
    predicted_mean_s: float
    """Their mean predicted duration, seconds."""
    measured_mean_s: float
    """Their mean measured duration, seconds."""
    frac: float | None
    """Error of the mean duration (a fraction)."""

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "kind": self.kind, "count": self.count, "predicted_mean_s": self.predicted_mean_s,
                "measured_mean_s": self.measured_mean_s, "frac": self.frac}


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionErrors:
    """Action by action: the measured step's actions matched with the predicted ones."""

    matched: int
    """Measured actions with a predicted twin (same device, same action text)."""
    unmatched: int
    """Measured actions without one."""
    start_mean_abs_s: float | None
    """Mean |predicted − measured start| of the matched actions, seconds."""
    start_mean_abs_frac_of_iteration: float | None
    """``start_mean_abs_s`` over the measured iteration time (a fraction)."""
    duration_mean_abs_frac: float | None
    """Mean |duration error| of the matched compute actions with a measured duration (a fraction)."""
    by_stage_and_kind: tuple[ActionComparison, ...]
    """Per stage and kind, by stage then kind."""

    def to_json(self) -> dict[str, Any]:
        return {"matched": self.matched, "unmatched": self.unmatched, "start_mean_abs_s": self.start_mean_abs_s,
                "start_mean_abs_frac_of_iteration": self.start_mean_abs_frac_of_iteration,
                "duration_mean_abs_frac": self.duration_mean_abs_frac,
                "by_stage_and_kind": [row.to_json() for row in self.by_stage_and_kind]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ActionErrors:
        return cls(matched=data["matched"], unmatched=data["unmatched"], start_mean_abs_s=data["start_mean_abs_s"],
                   start_mean_abs_frac_of_iteration=data["start_mean_abs_frac_of_iteration"],
                   duration_mean_abs_frac=data["duration_mean_abs_frac"],
                   by_stage_and_kind=tuple(ActionComparison(**row) for row in data["by_stage_and_kind"]))


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationErrors:
    """Every relative error of a comparison, ``(predicted − measured) / measured`` (fractions)."""

    iteration_time_frac: float | None
    """Error of the iteration time."""
    peak_memory_frac: float | None
    """The largest |error| of a device's peak memory."""
    memory_by_kind_frac: float | None
    """The largest |error| of a device's memory of one kind; None unless both sides break it down."""
    devices: tuple[DeviceError, ...]
    """Per predicted device that was measured."""
    stages: tuple[StageError, ...]
    """Per predicted stage."""
    actions: ActionErrors
    """Action by action."""
    iteration_time_frac_median: float | None = None
    """With rounds: the median over the rounds of ``iteration_time_frac``; None (not written) otherwise."""

    def to_json(self) -> dict[str, Any]:
        data = {"iteration_time_frac": self.iteration_time_frac, "peak_memory_frac": self.peak_memory_frac,
                "memory_by_kind_frac": self.memory_by_kind_frac, "devices": [d.to_json() for d in self.devices],
                "stages": [s.to_json() for s in self.stages], "actions": self.actions.to_json()}
        if self.iteration_time_frac_median is not None:
            data["iteration_time_frac_median"] = self.iteration_time_frac_median
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ValidationErrors:
        return cls(iteration_time_frac=data["iteration_time_frac"], peak_memory_frac=data["peak_memory_frac"],
                   memory_by_kind_frac=data.get("memory_by_kind_frac"),
                   devices=tuple(DeviceError.from_json(d) for d in data["devices"]),
                   stages=tuple(StageError(stage=s["stage"], compute_frac=s["compute_frac"]) for s in data["stages"]),
                   actions=ActionErrors.from_json(data["actions"]),
                   iteration_time_frac_median=data.get("iteration_time_frac_median"))


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnComparison:
    """One turn of profile and run: its own profile's prediction against the steps run right after it."""

    turn: int
    """The turn, from 1 (``slice`` in the JSON)."""
    predicted_s: float
    """The iteration time its profile predicts, seconds."""
    measured_s: float
    """The median of the steps run after it, seconds."""
    iteration_time_frac: float
    """``(predicted_s − measured_s) / measured_s``."""

    def to_json(self) -> dict[str, Any]:
        return {"slice": self.turn, "predicted_s": self.predicted_s, "measured_s": self.measured_s,
                "iteration_time_frac": self.iteration_time_frac}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TurnComparison:
        return cls(turn=data["slice"], predicted_s=data["predicted_s"], measured_s=data["measured_s"],
                   iteration_time_frac=data["iteration_time_frac"])


@dataclass(frozen=True, slots=True, kw_only=True)
class Drift:
    """How far the machine's speed moved between turns of profile and run.

    Measured step times, not the turns' predictions: each turn runs the same steps of the same
    plan, so their spread is the machine alone, while a prediction also carries the noise of a
    short profile."""

    spread_frac: float
    """(slowest − fastest turn's measured step time) / the median of the turns' (a fraction)."""
    fastest_s: float
    """The fastest turn's measured step time (the median of its steps), seconds."""
    slowest_s: float
    """The slowest turn's, seconds."""
    exceeds_error: bool
    """Whether ``spread_frac`` is larger than |the reported iteration-time error|: the error is
    then within what the machine's drift alone moves, and a rerun on an idle machine says more."""

    def to_json(self) -> dict[str, Any]:
        return {"spread_frac": self.spread_frac, "fastest_s": self.fastest_s, "slowest_s": self.slowest_s,
                "exceeds_error": self.exceeds_error}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Drift:
        return cls(**{key: data[key] for key in ("spread_frac", "fastest_s", "slowest_s", "exceeds_error")})


def turn_drift(turns: tuple[TurnComparison, ...], iteration_time_frac: float | None) -> Drift | None:
    """The turns' drift (``Drift``) against the reported error; None for fewer than two turns."""
    if len(turns) < 2:
        return None
    measured = [turn.measured_s for turn in turns]
    fastest, slowest = min(measured), max(measured)
    spread = (slowest - fastest) / statistics.median(measured)
    exceeds = iteration_time_frac is not None and spread > abs(iteration_time_frac)
    return Drift(spread_frac=spread, fastest_s=fastest, slowest_s=slowest, exceeds_error=exceeds)


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundComparison:
    """One round of ``dapple-run validate --rounds``: its prediction against its measurement."""

    round: int
    """The round, from 1."""
    predicted_s: float
    """Its predicted iteration time, seconds."""
    measured_s: float | None
    """Its measured iteration time (the median of its steps), seconds."""
    iteration_time_frac: float | None
    """Its iteration-time error (a fraction)."""

    def to_json(self) -> dict[str, Any]:
        return {"round": self.round, "predicted_s": self.predicted_s, "measured_s": self.measured_s,
                "iteration_time_frac": self.iteration_time_frac}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RoundComparison:
        return cls(**{key: data[key] for key in ("round", "predicted_s", "measured_s", "iteration_time_frac")})


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationProfile:
    """What the prediction was simulated on: the measured links, layers, optimizer step and overhead."""

    batch_size: int
    """Samples per layer in the profile (the largest slice of the least replicated stage)."""
    links: Mapping[str, Any] | None
    """The links measured between two processes, as ``runtime.measure.profile_run`` reports them
    (``links.json``); None where not measured."""
    optimizer_s: float
    """Seconds of the slowest rank's optimizer step, from cold caches."""
    optimizer_bandwidth_bytes_per_s: float
    """The memory bandwidth that makes the simulator's charge for that step match it, bytes/s."""
    action_overhead_s: float
    """The measured per-action overhead, seconds (never below 0)."""
    scenario: str | None
    """Path of the measured scenario (the median turn's)."""
    layers: tuple[Mapping[str, Any], ...]
    """Every layer of the median turn, as ``runtime.measure.profiler.LayerProfile``'s fields
    (seconds and bytes, for its ``batch_size``)."""
    num_turns: int
    """Turns of profile and run (``slices`` in the JSON)."""
    turn: int
    """The turn whose prediction is the report's, from 1 (the median prediction; ``slice``)."""

    def to_json(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "links": self.links,
                "optimizer": {"optimizer_s": self.optimizer_s,
                              "implied_bandwidth_bytes_per_s": self.optimizer_bandwidth_bytes_per_s},
                "action_overhead_s": self.action_overhead_s, "scenario": self.scenario,
                "layers": [dict(layer) for layer in self.layers], "slices": self.num_turns, "slice": self.turn}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ValidationProfile:
        optimizer = data["optimizer"]
        return cls(batch_size=data["batch_size"], links=data.get("links"), optimizer_s=optimizer["optimizer_s"],
                   optimizer_bandwidth_bytes_per_s=optimizer["implied_bandwidth_bytes_per_s"],
                   action_overhead_s=data.get("action_overhead_s", 0.0), scenario=data.get("scenario"),
                   layers=tuple(data.get("layers", ())), num_turns=data.get("slices", 1), turn=data.get("slice", 1))


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationReport:
    """A prediction against a measured run of the same plan: both sides, their errors, the context.

    The context (``scenario`` .. ``memory``) is None where the comparison was made without it
    (a test's, a notebook's); None context, ``collapsed``, ``traces``, ``rounds`` and
    ``median_round`` and ``drift`` are not written to the JSON.
    """

    predicted: RunSide
    """The simulated step."""
    measured: RunSide
    """The measured run: its median iteration time, every step's time, the median step's events."""
    error: ValidationErrors
    """Every relative error."""
    scenario: str | None = None
    """The scenario's name."""
    schedule: str | None = None
    """The plan's schedule."""
    backend: str | None = None
    """The ``torch.distributed`` backend of the run (``gloo``, ``nccl``)."""
    nproc: int | None = None
    """Processes the run had."""
    steps: int | None = None
    """Measured steps (after the warm-up)."""
    memory: str | None = None
    """What counts as memory (``sim.report.analysis.validation.MEMORY_MODES``)."""
    profile: ValidationProfile | None = None
    """What the prediction was simulated on."""
    turns: tuple[TurnComparison, ...] | None = None
    """Each turn's own prediction and steps (``slices``): empty for a single turn."""
    traces: Mapping[str, str] | None = None
    """Paths of the Chrome/Perfetto traces, ``predicted`` and ``measured``."""
    collapsed: str | None = None
    """Why a tensor-parallel plan's devices come in groups (``runtime.validation.collapse``)."""
    rounds: tuple[RoundComparison, ...] | None = None
    """With ``--rounds``: every round; this report is the round ``median_round``."""
    median_round: int | None = None
    """With ``--rounds``: the round with the median iteration-time error, from 1."""
    drift: Drift | None = None
    """How far the machine's speed moved between the turns (``turn_drift``); None for a single
    turn, and in a recording made before reports had it."""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {key: getattr(self, key) for key in _CONTEXT if getattr(self, key) is not None}
        data |= {"predicted": self.predicted.to_json(), "measured": self.measured.to_json(),
                 "error": self.error.to_json()}
        if self.profile is not None:
            data["profile"] = self.profile.to_json()
        if self.turns is not None:
            data["slices"] = [turn.to_json() for turn in self.turns]
        if self.traces is not None:
            data["traces"] = dict(self.traces)
        if self.rounds is not None:
            data["rounds"] = [r.to_json() for r in self.rounds]
            data["median_round"] = self.median_round
        if self.drift is not None:
            data["drift"] = self.drift.to_json()
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ValidationReport:
        """A recorded report (``validation.json``, a notebook's recording; other keys are not read)."""
        return cls(
            predicted=RunSide.from_json(data["predicted"]), measured=RunSide.from_json(data["measured"]),
            error=ValidationErrors.from_json(data["error"]), **{key: data.get(key) for key in _CONTEXT},
            profile=ValidationProfile.from_json(data["profile"]) if data.get("profile") else None,
            turns=None if data.get("slices") is None else tuple(TurnComparison.from_json(t) for t in data["slices"]),
            traces=data.get("traces"),
            rounds=None if data.get("rounds") is None else tuple(RoundComparison.from_json(r) for r in data["rounds"]),
            median_round=data.get("median_round"),
            drift=Drift.from_json(data["drift"]) if data.get("drift") else None)


_CONTEXT = ("scenario", "schedule", "backend", "nproc", "steps", "memory", "collapsed")
"""The report's plain context fields, written under their own names where set."""
