"""Where the runtime realises a plan differently from what the simulator models, in words.

The simulator models each ``sharding`` and ``recompute`` mode as its paper defines it
(``sim.cost.memory``); the runtime runs it with torch's nearest building block
(``runtime.model.sharding``, ``runtime.model.recompute``). Where the two differ in what a
device holds, ``dapple-run validate`` says so in one line next to its comparison, so that a
gap in memory by kind is read as the realisation's, not the cost model's. Torch-free: the
command prints these before any process starts.
"""

from __future__ import annotations

from sim.core.parallelism import Sharding
from sim.core.plan import PlanSpec

__all__ = ["realisation_notes"]


def realisation_notes(plan: PlanSpec) -> tuple[str, ...]:
    """One line per way the runtime's run of ``plan`` holds memory otherwise than predicted."""
    notes = []
    replicated = any(plan.num_replicas(s) > 1 for s in range(plan.num_stages))
    if plan.sharding is Sharding.GRADIENTS and replicated:
        notes.append(
            "sharding: gradients runs as FSDP2 with reshard_after_forward=False (torch has no ZeRO-2 of its own): "
            "gradients and optimizer state are 1/d as predicted and the parameters are whole from each forward "
            "to its backward as in ZeRO-2, but FSDP2 keeps its 1/d shard beside them (the shard the optimizer "
            "steps; it reshards after each backward), so at the peak a device holds (1 + 1/d) of its parameters "
            "where the prediction (ZeRO-2) holds them once, and between steps 1/d")
    return tuple(notes)
