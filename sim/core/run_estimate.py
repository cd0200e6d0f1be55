"""What a whole training run takes, as types: days, GPU-hours, cost, energy and goodput.

``sim.cost.capacity.estimate_run`` builds a ``RunEstimate`` from a scenario's run length
(``training.tokens`` or ``steps``), its cluster's price and power figures, its reliability
section and one replayed iteration. Every number is a field whose name carries its unit, and
``assumptions`` lists, as sentences, every figure the estimate rests on and where it comes
from, so the report can print them next to the answer. ``to_json`` is the summary JSON's
``run`` section (present only when the scenario sets a run length).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["CheckpointPlan", "Goodput", "MonteCarlo", "RunEstimate", "RunTotals"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunTotals:
    """A run's wall time and what it consumes over it."""

    time_s: float
    """Wall-clock seconds of the run."""
    gpu_hours: float
    """Device-hours: every device of the cluster, used by the plan or not, times the wall time."""
    cost: float | None
    """``gpu_hours × cluster.price_per_gpu_hour``; None without a price."""
    energy_kwh: float | None
    """Facility energy (devices, hosts, times PUE), kWh; None without ``device.power_w``."""
    carbon_kg: float | None
    """``energy × cluster.carbon_g_per_kwh``, kg CO2e; None without an intensity or energy."""

    @property
    def days(self) -> float:
        return self.time_s / 86400.0

    def to_json(self) -> dict[str, Any]:
        return {"time_s": self.time_s, "days": self.days, "gpu_hours": self.gpu_hours, "cost": self.cost,
                "energy_kwh": self.energy_kwh, "carbon_kg": self.carbon_kg}


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointPlan:
    """How often the run checkpoints and what one checkpoint costs."""

    size_bytes: float
    """The model states a checkpoint writes: parameters and optimizer state (fp32 master weights
    included), each tensor once (``sim.cost.capacity.checkpoint_bytes``)."""
    write_s: float
    """Seconds to write one checkpoint to storage: ``size_bytes / write_bandwidth``."""
    blocking_s: float
    """Seconds a checkpoint stops training: ``write_s`` when synchronous; the largest device's
    states over the snapshot bandwidth when asynchronous."""
    interval_s: float
    """Seconds of training between checkpoints, the one used."""
    young_interval_s: float
    """Young (1974): sqrt(2 δ M), δ = ``blocking_s``, M the cluster's MTBF."""
    daly_interval_s: float
    """Daly (2006)'s higher-order optimum (``sim.cost.goodput.daly_interval_s``)."""
    rule: str
    """Why ``interval_s``: ``daly``, ``young`` (asynchronous: Young's on the blocking part, no
    shorter than a write), or ``given`` (the file's ``checkpoint.interval``)."""

    def to_json(self) -> dict[str, Any]:
        return {"size_bytes": self.size_bytes, "write_s": self.write_s, "blocking_s": self.blocking_s,
                "interval_s": self.interval_s, "young_interval_s": self.young_interval_s,
                "daly_interval_s": self.daly_interval_s, "rule": self.rule}


@dataclass(frozen=True, slots=True, kw_only=True)
class Goodput:
    """What failures and checkpoints take from the run, in closed form."""

    cluster_mtbf_s: float
    """Mean time between failures of the whole cluster: per-device MTBF / devices, seconds."""
    expected_failures: float
    """Failures expected over the run (exact renewal model)."""
    first_order_lost_fraction: float
    """δ/τ + (τ/2 + restart + lost write)/M: the share of the run lost, to first order."""
    expected_time_s: float
    """Expected wall time with failures (exact renewal model, ``sim.cost.goodput.expected_run_time_s``)."""
    goodput: float
    """Failure-free training time over ``expected_time_s``, in (0, 1]."""

    def to_json(self) -> dict[str, Any]:
        return {"cluster_mtbf_s": self.cluster_mtbf_s, "expected_failures": self.expected_failures,
                "first_order_lost_fraction": self.first_order_lost_fraction,
                "expected_time_s": self.expected_time_s, "goodput": self.goodput}


@dataclass(frozen=True, slots=True, kw_only=True)
class MonteCarlo:
    """The run's wall time over ``runs`` seeded draws of its failures."""

    runs: int
    seed: int
    mean_s: float
    p5_s: float
    p50_s: float
    p95_s: float
    mean_failures: float
    """Failures per run, averaged over the runs."""

    def to_json(self) -> dict[str, Any]:
        return {"runs": self.runs, "seed": self.seed, "mean_s": self.mean_s, "p5_s": self.p5_s,
                "p50_s": self.p50_s, "p95_s": self.p95_s, "mean_failures": self.mean_failures}


@dataclass(frozen=True, slots=True, kw_only=True)
class RunEstimate:
    """A training run: its length, totals without and with failures, and every assumption."""

    steps: int
    """Optimizer steps of the run."""
    tokens: float | None
    """Tokens it trains on (steps × tokens per step); None for a model without a sequence."""
    iteration_time_s: float
    """Seconds per step (the replayed iteration)."""
    devices: int
    """Devices of the cluster (all of them are paid for)."""
    busy_share: float
    """Mean over the cluster's devices of busy time over iteration time (unused devices: 0)."""
    failure_free: RunTotals
    """The run if nothing fails and nothing checkpoints."""
    checkpoint: CheckpointPlan | None = None
    goodput: Goodput | None = None
    expected: RunTotals | None = None
    """The run with failures, restarts and checkpoints (its expected wall time)."""
    monte_carlo: MonteCarlo | None = None
    assumptions: tuple[str, ...] = ()
    """Every figure the estimate rests on, with its source or the default it took."""

    def to_json(self) -> dict[str, Any]:
        part = (lambda value: None if value is None else value.to_json())
        return {"steps": self.steps, "tokens": self.tokens, "iteration_time_s": self.iteration_time_s,
                "devices": self.devices, "busy_share": self.busy_share,
                "failure_free": self.failure_free.to_json(), "checkpoint": part(self.checkpoint),
                "goodput": part(self.goodput), "expected": part(self.expected),
                "monte_carlo": part(self.monte_carlo), "assumptions": list(self.assumptions)}
