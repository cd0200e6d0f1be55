"""Faults: what goes wrong on real clusters, written into a scenario to see what it costs.

A scenario's ``faults:`` list injects any of four faults into a replay:

* ``straggler`` — one device computes ``slowdown`` (1 to 1000) times slower from time ``from``
  (thermal throttling, a noisy neighbour): ``{type: straggler, device: 3, slowdown: 1.5, from: 0.2s}``;
* ``jitter`` — every compute action of the chosen devices (all by default) takes its time
  times a random factor of mean 1: ``normal`` (``1 + spread·N(0, 1)``, at least 0.05),
  ``lognormal`` (``exp(spread·N(0, 1) − spread²/2)``) or ``uniform`` (``1 ± spread``),
  drawn from a seeded generator so a seed always gives the same replay:
  ``{type: jitter, distribution: normal, spread: 0.05, seed: 7}``. ``per`` says who draws one
  sequence of factors: ``device`` (the default: every device its own, so every device is its own
  symmetry class), ``replica`` (the devices of one data-parallel replica, which run in lock-step
  in Megatron) or ``stage`` (every device of a pipeline rank: classes stay as without jitter).
  Draws are named by the device, or by the lowest device of its replica or device set, never
  by a class, so they do not change with ``--no-symmetry``;
* ``slow_link`` — a port's bandwidth times ``factor`` (0.001 to 1): a network card
  (``nic``, global id ``node * nics_per_node + k``), a GPU's intra-node port (``device``) or, on
  a cluster with a fabric, the uplinks of group ``index`` of a tier (``tier``, by name):
  ``{type: slow_link, nic: 1, factor: 0.25}``, ``{type: slow_link, tier: spine, index: 3, factor: 0.25}``;
* ``failure`` — a device dies at time ``at``: the iteration cannot finish, and the replay
  reports where, when and how much work the iteration loses:
  ``{type: failure, device: 5, at: 0.8s}``.

Faults are frozen specs checked here (with their dotted keys in errors); the compiled
workload (``sim.engine.compile``) applies them, and a faulty device never shares a symmetry
class with a healthy one.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from sim.core.errors import SpecError

__all__ = ["FAULT_TYPES", "Failure", "Jitter", "SlowLink", "Straggler", "jitter_factors", "jitter_key", "first_failure"]

JITTER_DISTRIBUTIONS = ("normal", "lognormal", "uniform")
JITTER_PER = ("device", "replica", "stage")
"""Who draws one sequence of jitter factors (``Jitter.per``)."""

SLOWDOWN_RANGE = (1.0, 1000.0)
"""A straggler's compute time factor: from 1 (not slow) to 1000."""
FACTOR_RANGE = (0.001, 1.0)
"""A slow link's bandwidth factor: from 0.001 (1000 times slower) to 1 (not slow)."""
MAX_FAULT_TIME_S = 1e6
"""Latest ``from`` or ``at`` (about 11.6 days; an iteration that long is not a plan)."""
MAX_SEED = 2**63 - 1
"""Largest jitter seed."""


def _check_range(key: str, value: Any, low: float, high: float) -> None:
    """``value`` a number in [low, high], compared before any conversion (no overflow, NaN out)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        shown = repr(value) if not isinstance(value, int) or value.bit_length() <= 200 else "a huge integer"
        raise SpecError(key, f"must be a number from {low:g} to {high:g}, got {shown}")


def _check_device(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpecError(key, f"must be a device id (an integer >= 0), got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Straggler:
    """One device computing slower from some time on."""

    device: int
    slowdown: float
    """Compute time factor, 1 to 1000 (1.5 = 50% slower)."""
    from_s: float = 0.0
    """Actions that start at or after this time are slow; 0 to 1e6 seconds."""

    def __post_init__(self) -> None:
        _check_device("device", self.device)
        _check_range("slowdown", self.slowdown, *SLOWDOWN_RANGE)
        _check_range("from", self.from_s, 0.0, MAX_FAULT_TIME_S)


@dataclass(frozen=True, slots=True, kw_only=True)
class Jitter:
    """Seeded random noise on compute times."""

    distribution: str = "normal"
    spread: float = 0.05
    """Relative spread: standard deviation (normal, lognormal) or half-width (uniform)."""
    seed: int = 0
    devices: tuple[int, ...] | None = None
    """Devices whose actions jitter; None: every device."""
    per: str = "device"
    """Who draws one sequence of factors: each ``device`` its own; every device of a data-parallel
    ``replica`` (its tensor and context group) the same; every device of a ``stage`` (a pipeline
    rank's device set) the same. Coarser draws keep more devices in one symmetry class."""

    def __post_init__(self) -> None:
        if self.per not in JITTER_PER:
            raise SpecError("per", f"unknown {self.per!r}; valid: {', '.join(JITTER_PER)}")
        if self.distribution not in JITTER_DISTRIBUTIONS:
            raise SpecError("distribution", f"unknown {self.distribution!r}; valid: {', '.join(JITTER_DISTRIBUTIONS)}")
        if isinstance(self.spread, bool) or not isinstance(self.spread, (int, float)) or not 0 <= self.spread <= 10:
            raise SpecError("spread", f"must be a number in [0, 10], got {self.spread!r}")
        if self.distribution == "uniform" and self.spread >= 1:
            raise SpecError("spread", f"a uniform spread must be below 1 (times stay positive), got {self.spread!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SEED:
            raise SpecError("seed", f"must be an integer from 0 to 2**63 - 1, got {self.seed!r}")
        for device in self.devices or ():
            _check_device("devices", device)

    def applies_to(self, device: int) -> bool:
        return self.devices is None or device in self.devices


@dataclass(frozen=True, slots=True, kw_only=True)
class SlowLink:
    """A degraded port at ``factor`` of its bandwidth: a NIC, a GPU's intra-node port, or the
    uplinks of one group of a fabric's tier (``sim.core.fabric``; both directions)."""

    factor: float
    """Bandwidth factor, 0.001 to 1."""
    nic: int | None = None
    device: int | None = None
    tier: int | None = None
    """The fabric tier (0: the leaf) whose group's uplinks are slow; with ``index``."""
    index: int | None = None
    """Which of the tier's uplinks (``sim.cost.tiers.uplink_group``: the group, times the rails
    plus the rail on a rail-optimised leaf tier)."""

    def __post_init__(self) -> None:
        _check_range("factor", self.factor, *FACTOR_RANGE)
        if (self.tier is None) != (self.index is None):
            raise SpecError("index", "a slow uplink names both its tier and its index")
        if (self.nic is not None) + (self.device is not None) + (self.tier is not None) != 1:
            raise SpecError("nic", "give exactly one of nic (a network card), device (a GPU's intra-node port) "
                                   "or tier and index (a group's uplinks)")
        if self.tier is not None:
            _check_device("tier", self.tier)
            _check_device("index", self.index)
        if self.nic is not None:
            _check_device("nic", self.nic)
        if self.device is not None:
            _check_device("device", self.device)


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    """A device that dies at a time."""

    device: int
    at_s: float
    """When, 0 to 1e6 seconds."""

    def __post_init__(self) -> None:
        _check_device("device", self.device)
        _check_range("at", self.at_s, 0.0, MAX_FAULT_TIME_S)


FAULT_TYPES = {"straggler": Straggler, "jitter": Jitter, "slow_link": SlowLink, "failure": Failure}
"""``type:`` name -> spec class."""


def jitter_key(jitter: Jitter, device: int, first: int) -> int | str:
    """What names a device's draws: the device itself (``per: device``), or the lowest device of
    its replica (``replica``) or of its stage's device set (``stage``), ``first``."""
    return device if jitter.per == "device" else f"{jitter.per}:{first}"


def jitter_factors(jitter: Jitter, key: int | str, count: int) -> list[float]:
    """``count`` factors for the compute actions drawn under ``key`` (:func:`jitter_key`; a device
    id for ``per: device``), in order: the same seed and key give the same factors."""
    rng = random.Random(f"{jitter.seed}:{key}")
    s = jitter.spread
    if jitter.distribution == "uniform":
        return [1.0 + rng.uniform(-s, s) for _ in range(count)]
    if jitter.distribution == "lognormal":
        return [math.exp(s * z - s * s / 2) for z in _normals(rng, count)]
    return [max(0.05, 1.0 + s * z) for z in _normals(rng, count)]


def _normals(rng: random.Random, count: int) -> list[float]:
    """``count`` standard normal draws from ``rng``: Box-Muller on pairs of ``rng.random()``,
    in the form (Lambert Meertens') that CPython's ``random.gauss`` uses, so the draws are the
    ones ``rng.gauss(0.0, 1.0)`` gives there, at less than half its cost (16,384 devices draw
    two million of them)."""
    uniform, out = rng.random, []
    for _ in range((count + 1) // 2):
        angle = uniform() * math.tau
        radius = math.sqrt(-2.0 * math.log(1.0 - uniform()))
        out.append(math.cos(angle) * radius)
        out.append(math.sin(angle) * radius)
    del out[count:]
    return out


def first_failure(faults) -> int | None:
    """Index in ``faults`` of the first ``Failure``, or None: a failure stops every iteration."""
    return next((i for i, fault in enumerate(faults) if isinstance(fault, Failure)), None)
