"""What a rank's executor is told and what it reports: options, a step's record, a failure.

``ExecOptions`` says how a rank executes (seeds, memory counting, timeouts, injected
faults); ``StepRecord`` is what it measured in one step; ``ActionError`` names the rank and
the action that failed (a communication timeout inside a collective included), which the
launcher's report prints as one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["ActionError", "ExecOptions", "StepRecord"]


class ActionError(RuntimeError):
    """A rank failed while running an action; the message names both."""

    def __init__(self, rank: int, action: str, step: int, cause: BaseException) -> None:
        super().__init__(f"rank {rank} failed at action {action} (step {step}): {type(cause).__name__}: {cause}")
        self.rank, self.action, self.step = rank, action, step


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecOptions:
    """How a rank executes (not what: that is the scenario)."""

    seed: int = 0
    """Seed of the weights and of the synthetic data."""
    track_memory: bool = True
    """Count saved activations with saved-tensor hooks during the steps that ask for it (the
    session counts the first step only: the same schedule on the same shapes saves the same
    tensors every step, and the hooks cost a Python call per saved tensor)."""
    timeout_s: float = 45.0
    """Longest wait for any receive or collective before the rank gives up."""
    lookahead: int = 2
    """Receives posted ahead of the action that consumes them."""
    fail_at: tuple[int, str, str] | None = None
    """(rank, action text, ``raise``, ``exit``, ``term`` or ``stop``): inject a failure at that action of
    the first step (``term``/``stop``: the rank sends itself SIGTERM or SIGSTOP)."""
    lr: float = 1e-3
    """Learning rate of the optimizer."""


@dataclass(slots=True, kw_only=True)
class StepRecord:
    """What one rank measured in one step."""

    time_s: float
    """From the barrier at the step's start to the end of the optimizer step."""
    loss: float
    """This rank's share of the step's loss (sum of its scaled slice losses; 0 off the last stage and
    on a replica's devices after its first: a tensor-parallel group counts its loss once)."""
    state_bytes: dict[str, int]
    """Parameters, gradients and optimizer state at the step's end, by kind (this device's shards)."""
    peak_activation_bytes: float | None
    """Peak bytes of saved activations, when this step counted them."""
    allocator_peak_bytes: float | None
    """``torch.cuda.max_memory_allocated`` during the step (GPU only)."""
    rows: list[dict[str, Any]]
    """Trace rows in ``SimResult.event_rows`` format."""
    grads: dict[str, torch.Tensor] | None = None
    """Gradients by parameter name before the optimizer step (only when asked)."""
    gathered_bytes: int = 0
    """Parameters FSDP2 held gathered (unsharded) at the activation peak, beside ``state_bytes``'s
    shards: counted under ``sharding: gradients`` only (``runtime.measure.memory``), when this
    step counted activations."""
