"""Evaluating a candidate: replay it, or say in kind why it cannot run.

``evaluate`` turns a ``planner.search.space.Candidate`` into a checked plan and replays it with the
fast path or the SimPy engine. The ``Evaluation`` it returns carries the plan, the training
sizes and the replay's typed ``Summary``, built once; a candidate that cannot run carries a
``Rejection`` instead, whose ``kind`` the planners' reports count:

* ``out_of_memory`` — a device is over its capacity: by ``planner.search.memory``'s count before any
  replay (the candidate is then not replayed), or in the replay;
* ``invalid_plan`` — the candidate is not a plan of this model on this cluster (too many
  replicas, a micro-batch that does not divide the global batch, ...);
* ``invalid_schedule`` — the schedule cannot run this plan (a micro-batch count the
  interleaved schedule does not take, ...);
* ``device_failure`` — a ``failure`` fault stops the iteration, so no plan finishes it.

``evaluation_row`` is the one view of an evaluation that the command line, the sweeps and
the planners' plots share, an ``EvaluationRow``: the plan file (what ``--plan`` reads back,
the plan alone) and beside it the ``PlanMetrics`` (the candidate's description, layout and
placement, its short line and degrees, and its headline metrics: iteration time, samples/s,
tokens/s, MFU, peak memory). Metrics go beside a plan, never inside it.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterable

from planner.search.describe import devices_used, plan_summary, stage_replicas
from planner.search.memory import MemoryEstimate, plan_peak_bytes
from planner.search.space import Candidate, to_scenario
from sim.core.errors import DappleError, ScheduleError
from sim.core.faults import first_failure
from sim.core.plan import PlanSpec
from sim.core.summary import Summary
from sim.core.training import TrainingSpec
from sim.core.units import format_bytes
from sim.engine.run import run_scenario
from sim.input.plan_file import plan_to_dict
from sim.input.scenario import Scenario

__all__ = ["Evaluation", "EvaluationRow", "PlanMetrics", "Rejection", "RejectionKind", "check_plannable",
           "count_rejections", "evaluate", "evaluation_row"]


class RejectionKind(str, Enum):
    """Why a candidate cannot run (its value is what reports and JSON show)."""

    OUT_OF_MEMORY = "out_of_memory"
    INVALID_PLAN = "invalid_plan"
    INVALID_SCHEDULE = "invalid_schedule"
    DEVICE_FAILURE = "device_failure"


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejection:
    """A candidate that cannot run: the kind, and the one-line reason a user reads."""

    kind: RejectionKind
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Evaluation:
    """A candidate's replay, or why it cannot run."""

    candidate: Candidate
    engine: str
    """``fast`` or ``simpy``."""
    plan: PlanSpec | None = None
    """The checked plan (None when the candidate is not a valid plan)."""
    training: TrainingSpec | None = None
    summary: Summary | None = None
    """The replay's summary (None when nothing was replayed)."""
    rejection: Rejection | None = None
    replayed_ops: int = 0
    """Actions of every device the replay compiled (a class's ops once per member device): the
    work it cost, which grows with the cluster even where symmetry makes the replay cheap
    (``PlannerOptions`` budgets it)."""
    estimate: MemoryEstimate | None = None
    """``planner.search.memory``'s count of the peak, made before the replay."""

    @property
    def ok(self) -> bool:
        return self.rejection is None

    @property
    def rejected(self) -> str | None:
        """Why the candidate cannot run (one line); None if it runs."""
        return None if self.rejection is None else self.rejection.message

    @property
    def iteration_time_s(self) -> float:
        """The replayed iteration time; infinite when the candidate cannot run."""
        if self.summary is None or self.summary.iteration_time_s is None:
            return math.inf
        return self.summary.iteration_time_s

    @property
    def peak_memory_bytes(self) -> float:
        return 0.0 if self.summary is None else self.summary.peak_memory_bytes

    @property
    def memory_bytes(self) -> float | None:
        """The peak the replay found, else the one counted before it (None: not a valid plan)."""
        if self.summary is not None:
            return self.summary.peak_memory_bytes
        return None if self.estimate is None else self.estimate.peak_bytes

    @property
    def throughput_samples_per_s(self) -> float:
        return 0.0 if self.summary is None else self.summary.throughput_samples_per_s or 0.0

    def plan_file(self) -> dict[str, Any]:
        """The plan-file form of the evaluated plan (what ``--plan`` reads)."""
        if self.plan is None or self.training is None:
            raise ValueError("a candidate that is not a valid plan has no plan file")
        return plan_to_dict(self.plan, self.training)


def evaluate(scenario: Scenario, candidate: Candidate, *, engine: str = "fast",
             resolved: dict[Candidate, Scenario] | None = None) -> Evaluation:
    """Replay ``candidate`` on ``scenario``'s cluster and model (``fast`` or ``simpy``).

    The candidate is resolved once (``planner.search.space.to_scenario``: its schedule, lowered
    schedule and stage costs), and that one resolution feeds the memory count and the replay.
    ``resolved`` maps the candidates resolved so far to their scenarios and is filled in here:
    a search passes the same mapping to the fast path's and the SimPy engine's evaluations, so a
    candidate that both score is resolved once.
    """
    try:
        scenario_of = resolved.get(candidate) if resolved is not None else None
        if scenario_of is None:
            scenario_of = to_scenario(scenario, candidate)
            if resolved is not None:
                resolved[candidate] = scenario_of
        estimate = plan_peak_bytes(scenario_of.resolved)
        device = scenario.cluster.device
        capacity = device.usable_memory_bytes
        if estimate.peak_bytes > capacity:
            usable = f" usable of {format_bytes(device.memory_bytes)}" if capacity < device.memory_bytes else ""
            message = (f"device {estimate.device} runs out of memory: it needs {format_bytes(estimate.peak_bytes)} "
                       f"of {format_bytes(capacity)}{usable} ({format_bytes(estimate.static_bytes)} of model states, "
                       f"{format_bytes(estimate.activation_bytes)} of activations)")
            return Evaluation(candidate=candidate, engine=engine, plan=scenario_of.plan, training=scenario_of.training,
                              estimate=estimate,
                              rejection=Rejection(kind=RejectionKind.OUT_OF_MEMORY, message=message))
        # DEBUG: a planner replays hundreds of candidates, and one INFO line each would drown ``-v``
        result = run_scenario(scenario_of, engine=engine, log_level=logging.DEBUG)
    except ScheduleError as exc:
        return _rejected(candidate, engine, RejectionKind.INVALID_SCHEDULE, exc)
    except DappleError as exc:
        return _rejected(candidate, engine, RejectionKind.INVALID_PLAN, exc)
    summary = result.summarize()
    rejection = None
    if summary.failure is not None:
        rejection = Rejection(kind=RejectionKind.DEVICE_FAILURE, message=summary.failure.message)
    elif summary.oom_detail is not None:
        rejection = Rejection(kind=RejectionKind.OUT_OF_MEMORY, message=summary.oom_detail.message)
    return Evaluation(
        candidate=candidate, engine=engine, plan=scenario_of.plan, training=scenario_of.training, summary=summary,
        rejection=rejection, replayed_ops=sum(len(cls.ops) * len(cls.devices) for cls in result.workload.classes), estimate=estimate,
    )


def check_plannable(scenario: Scenario) -> None:
    """A scenario whose faults stop every iteration has no plan to find: one line saying so."""
    failing = first_failure(scenario.faults)
    if failing is not None:
        raise DappleError(
            f"{scenario.path or scenario.name}: faults[{failing}]: a device failure stops every plan's iteration, "
            "so there is no plan to choose; remove the failure to plan (dapple-sim simulate shows what it costs)"
        )


def _rejected(candidate: Candidate, engine: str, kind: RejectionKind, exc: DappleError) -> Evaluation:
    return Evaluation(candidate=candidate, engine=engine, rejection=Rejection(kind=kind, message=str(exc)))


def count_rejections(evaluations: Iterable[Evaluation]) -> dict[str, int]:
    """Rejected evaluations by kind (``{"out_of_memory": 12, ...}``, kinds in sorted order)."""
    counts = Counter(e.rejection.kind.value for e in evaluations if e.rejection is not None)
    return dict(sorted(counts.items()))


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanMetrics:
    """What a replayed plan is and costs, in the words and numbers reports show beside its plan."""

    description: str
    """The candidate in words: stages, their layers and replicas (``Candidate.describe``)."""
    layout: str
    """Tensor and context degrees, sequence parallelism, sharding, recompute in words
    (``tensor 8 · sharding optimizer``); empty for a data × pipeline plan."""
    placement: str
    """How stages were laid on devices: ``fresh``, ``append`` or ``scatter`` (DAPPLE §4.2)."""
    iteration_time_s: float
    """The replayed iteration time, seconds."""
    throughput_samples_per_s: float
    """Global batch over the iteration time, samples per second."""
    peak_memory_bytes: float
    """The largest device's peak memory in the replay, bytes."""
    speedup_over_dp: float | None = None
    """Pure data parallelism's iteration time over this one's; None when it was not compared
    or pure data parallelism does not fit."""
    summary: str = ""
    """The plan in one short line (``planner.search.describe.plan_summary``:
    ``TP 8 × PP 8 (interleaved, 3 chunks) × DP 16 · ZeRO-1 · micro-batch 1 × 96``)."""
    tokens_per_s: float | None = None
    """Training tokens per second (the replay's ``Summary.tokens_per_s``); None when the model
    has no sequence length (a measured profile)."""
    mfu: float | None = None
    """Model FLOPs utilisation, a fraction of the devices' peak (``Summary.mfu``); None when the
    model's FLOPs are not known (a measured profile)."""
    tensor_parallel: int = 1
    """Devices that split every layer's matrices (Megatron-LM's ``--tensor-model-parallel-size``)."""
    context_parallel: int = 1
    """Devices that split every sequence (``--context-parallel-size``)."""
    expert_parallel: int = 1
    """Devices an MoE block's routed experts split over (``--expert-model-parallel-size``);
    written to JSON only above 1, as the plan file writes it."""
    pipeline_parallel: int = 1
    """Device sets the pipeline runs on (``--pipeline-model-parallel-size``; an interleaved
    plan's stages are ``pipeline_parallel × chunks``)."""
    chunks: int = 1
    """Model chunks per device set (the interleaved schedule's virtual stages)."""
    data_parallel: int = 1
    """Replicas of the most replicated stage."""
    data_parallel_min: int = 1
    """Replicas of the least replicated stage (below ``data_parallel`` in DAPPLE's uneven plans)."""
    devices_used: int = 0
    """Devices the plan runs on."""
    idle_devices: int | None = None
    """The cluster's devices the plan leaves idle; None when the cluster's size was not given."""

    def to_json(self) -> dict[str, Any]:
        data = self._to_json()
        if self.expert_parallel > 1:
            data["expert_parallel"] = self.expert_parallel
        return data

    def _to_json(self) -> dict[str, Any]:
        return {"description": self.description, "layout": self.layout, "placement": self.placement,
                "iteration_time_s": self.iteration_time_s, "throughput_samples_per_s": self.throughput_samples_per_s,
                "peak_memory_bytes": self.peak_memory_bytes, "speedup_over_dp": self.speedup_over_dp,
                "summary": self.summary, "tokens_per_s": _finite(self.tokens_per_s), "mfu": _finite(self.mfu),
                "tensor_parallel": self.tensor_parallel, "context_parallel": self.context_parallel,
                "pipeline_parallel": self.pipeline_parallel, "chunks": self.chunks,
                "data_parallel": self.data_parallel, "data_parallel_min": self.data_parallel_min,
                "devices_used": self.devices_used, "idle_devices": self.idle_devices}


def _finite(value: float | None) -> float | None:
    """``value``, or None for a number JSON cannot hold (``sim.core.jsonio`` refuses NaN)."""
    return value if value is not None and math.isfinite(value) else None


@dataclass(frozen=True, slots=True, kw_only=True)
class EvaluationRow:
    """A runnable evaluation as reports show it: the plan file, and beside it its metrics."""

    plan: dict[str, Any]
    """The plan file of the evaluated plan (``sim.input.plan_file.plan_to_dict``): the plan alone,
    what ``--plan`` reads back."""
    metrics: PlanMetrics
    """The candidate in words and its replayed metrics."""

    def to_json(self) -> dict[str, Any]:
        return {"plan": self.plan, "metrics": self.metrics.to_json()}


def evaluation_row(evaluation: Evaluation, *, cluster_devices: int | None = None) -> EvaluationRow:
    """The plan file of a runnable evaluation, and beside it its description, degrees and metrics.

    ``cluster_devices`` is the scenario's cluster size, from which ``idle_devices`` is counted
    (None: not counted, and the short line says nothing of idle devices)."""
    candidate, summary = evaluation.candidate, evaluation.summary
    sets = stage_replicas(candidate)
    used = devices_used(candidate)
    return EvaluationRow(plan=evaluation.plan_file(), metrics=PlanMetrics(
        description=candidate.describe(), layout=candidate.layout(), placement=candidate.placement,
        iteration_time_s=evaluation.iteration_time_s, throughput_samples_per_s=evaluation.throughput_samples_per_s,
        peak_memory_bytes=evaluation.peak_memory_bytes,
        summary=plan_summary(candidate, global_batch_size=evaluation.training.global_batch_size,
                             cluster_devices=cluster_devices),
        tokens_per_s=None if summary is None else summary.tokens_per_s, mfu=None if summary is None else summary.mfu,
        tensor_parallel=candidate.tensor_parallel, context_parallel=candidate.context_parallel,
        expert_parallel=candidate.expert_parallel,
        pipeline_parallel=len(sets), chunks=candidate.chunks, data_parallel=max(sets), data_parallel_min=min(sets),
        devices_used=used, idle_devices=None if cluster_devices is None else cluster_devices - used,
    ))
