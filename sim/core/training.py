"""How much one iteration trains on: the global batch and its micro-batches (``training:``).

Megatron-LM's global batch is split into micro-batches per data-parallel replica; here a
micro-batch is counted as it enters the pipeline, before its stage splits it over its replicas
(Megatron-LM's per-replica micro-batch size times the data-parallel degree). The run's length,
in steps or tokens, rides along for the whole-run estimate (``sim.core.run_estimate``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.core.errors import SpecError
from sim.core.specs import positive, positive_int

__all__ = ["MAX_MICROBATCHES", "TrainingSpec"]

MAX_MICROBATCHES = 2**14
"""Most micro-batches per iteration (16 384: a schedule lists every one of them on every rank, and a
replay of 100 000 took over 20 s and 1.7 GB; the shipped scenarios use at most 3 072)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingSpec:
    """How many samples one iteration trains on and how they are cut into micro-batches."""

    global_batch_size: int
    """Samples per iteration (per optimizer step), over the whole cluster."""
    microbatch_size: int
    """Samples per micro-batch as it enters the pipeline; each stage splits it over its replicas.

    (Megatron-LM's per-replica micro-batch size times the data-parallel degree.)
    """
    steps: int | None = None
    """Optimizer steps (iterations) of the whole run: ``training.steps``, or ``training.tokens``
    divided by the tokens of one step and rounded up; None: no run length (no "Run" report)."""
    tokens: float | None = None
    """The run's training tokens as the file gave them (``training.tokens``); None when it gave
    ``steps`` or neither."""

    def __post_init__(self) -> None:
        positive_int("global_batch_size", self.global_batch_size)
        positive_int("microbatch_size", self.microbatch_size)
        if self.steps is not None:
            positive_int("steps", self.steps)
        if self.tokens is not None:
            positive("tokens", self.tokens)
        if self.global_batch_size // self.microbatch_size > MAX_MICROBATCHES:
            raise SpecError(
                "global_batch_size",
                f"{self.global_batch_size} / {self.microbatch_size} is {self.global_batch_size // self.microbatch_size} "
                f"micro-batches, more than the {MAX_MICROBATCHES} a schedule can hold; raise microbatch_size",
            )
        if self.global_batch_size % self.microbatch_size:
            raise SpecError(
                "microbatch_size",
                f"{self.microbatch_size} does not divide global_batch_size {self.global_batch_size}; "
                f"use a divisor such as {_nearest_divisors(self.global_batch_size, self.microbatch_size)}",
            )

    @property
    def num_microbatches(self) -> int:
        return self.global_batch_size // self.microbatch_size


def _nearest_divisors(n: int, near: int) -> str:
    """The divisors of ``n`` just below and just above ``near``, as text (``2 or 4``)."""
    small = [d for d in range(1, min(math.isqrt(n), 10**6) + 1) if n % d == 0]
    divisors = sorted(set(small) | {n // d for d in small})
    below = max(d for d in divisors if d <= near)
    above = [d for d in divisors if d > near]
    return f"{below} or {above[0]}" if above else str(below)
