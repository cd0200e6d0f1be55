"""Reliability: how often a run's devices fail, and how it checkpoints and restarts.

A long run on many devices is interrupted: a GPU, its memory, a link or a host fails, the job
stops, restarts from its last checkpoint and loses the work since then plus the time to
restart. ``ReliabilitySpec`` is the scenario's ``reliability:`` section as data: the per-device
failure rate (a mean time between failures per GPU; a cluster of N GPUs fails N times as
often), how checkpoints are written (their interval, the aggregate bandwidth to storage,
synchronous or asynchronous) and the restart time. ``sim.cost.goodput`` turns it into the
share of the run that failures and checkpoints take; ``sim.input.reliability_section`` reads it.

``RELIABILITY_PRESETS`` holds published failure rates, each with its source. ``llama3-405b``:
"during a 54-day snapshot period of pre-training, we experienced a total of 466 job
interruptions", 419 of them unexpected, on 16,384 H100 GPUs (Dubey et al. 2024, "The Llama 3
Herd of Models", §3.3.4 Reliability and Operational Challenges, Table 5: root-cause
categorisation of the unexpected interruptions). Per GPU: 16,384 × 54 days / 419 = 50,676 h.
The 47 planned interruptions (maintenance) are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from sim.core.errors import SpecError
from sim.core.specs import non_negative, positive, positive_int

__all__ = ["DEFAULT_MONTE_CARLO_RUNS", "RELIABILITY_PRESETS", "FailureRate", "ReliabilitySpec"]

DEFAULT_MONTE_CARLO_RUNS = 1000
"""Runs the Monte Carlo draws unless ``reliability.monte_carlo.runs`` says otherwise."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureRate:
    """A published interruption count: ``interruptions`` over ``days`` on ``gpus`` devices."""

    interruptions: int
    """Unexpected interruptions observed."""
    days: float
    """Length of the observation, days."""
    gpus: int
    """Devices the job ran on."""
    source: str
    """Where the figures come from (paper, section, table)."""

    @property
    def gpu_mtbf_s(self) -> float:
        """Mean time between failures of one device, seconds: gpus × days / interruptions."""
        return self.gpus * self.days * 86400.0 / self.interruptions


RELIABILITY_PRESETS: Mapping[str, FailureRate] = MappingProxyType({
    "llama3-405b": FailureRate(
        interruptions=419, days=54.0, gpus=16_384,
        source="Llama 3 405B pre-training: 419 unexpected interruptions in 54 days on 16,384 H100 "
               "(Dubey et al. 2024, §3.3.4, Table 5)"),
})
"""``reliability.preset`` name -> its published failure rate."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReliabilitySpec:
    """How a run fails and recovers (``reliability:``); ``sim.cost.goodput`` costs it."""

    gpu_mtbf_s: float
    """Mean time between failures of one device, seconds (the cluster's is this over its devices)."""
    source: str
    """Where the failure rate comes from, as the report prints it."""
    write_bandwidth_bytes_per_s: float
    """Aggregate bandwidth of a checkpoint to storage, bytes/s (all devices writing together)."""
    restart_s: float
    """Seconds from a failure to training again (detect, reschedule, load the checkpoint), >= 0."""
    checkpoint_interval_s: float | None = None
    """Seconds of training between two checkpoints; None: ``auto`` (Young/Daly, ``sim.cost.goodput``)."""
    async_checkpoint: bool = False
    """Whether training goes on while a checkpoint is written: only the copy of each device's
    states to host memory (``snapshot_bandwidth_bytes_per_s``) blocks it."""
    snapshot_bandwidth_bytes_per_s: float = 25e9
    """Device-to-host copy rate of one device, bytes/s, for ``async_checkpoint``: what blocks
    training is the largest device's states over it. Default 25 GB/s, an assumption (about 80%
    of PCIe 4.0 x16's 31.5 GB/s per direction)."""
    monte_carlo_runs: int = DEFAULT_MONTE_CARLO_RUNS
    """Runs the Monte Carlo draws, 1 to 100,000."""
    seed: int = 0
    """Seed of the Monte Carlo's ``numpy.random.default_rng``."""

    def __post_init__(self) -> None:
        positive("gpu_mtbf_h", self.gpu_mtbf_s)
        positive("checkpoint.write_bandwidth", self.write_bandwidth_bytes_per_s)
        positive("checkpoint.snapshot_bandwidth", self.snapshot_bandwidth_bytes_per_s)
        non_negative("restart_s", self.restart_s)
        if self.checkpoint_interval_s is not None:
            positive("checkpoint.interval", self.checkpoint_interval_s)
        positive_int("monte_carlo.runs", self.monte_carlo_runs)
        if self.monte_carlo_runs > 100_000:
            raise SpecError("monte_carlo.runs", f"must be at most 100,000, got {self.monte_carlo_runs}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise SpecError("monte_carlo.seed", f"must be an integer >= 0, got {self.seed!r}")
