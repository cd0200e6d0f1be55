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

__all__ = ["SPLIT_BACKWARD_SCHEDULES", "realisation_notes"]

SPLIT_BACKWARD_SCHEDULES = frozenset({"zb-h1", "zb-v", "dualpipe-v", "interleaved-zb"})
"""The generated schedules whose backward is split into I (input gradient) and W (weight gradient)."""


def realisation_notes(plan: PlanSpec, *, num_microbatches: int = 1) -> tuple[str, ...]:
    """One line per way the runtime's run of ``plan`` (over ``num_microbatches`` a step) holds memory
    otherwise than predicted, or times it otherwise where that is the only difference."""
    notes = []
    replicated = any(plan.num_replicas(s) > 1 for s in range(plan.num_stages))
    if plan.sharding is Sharding.GRADIENTS and replicated:
        notes.append(
            "sharding: gradients runs as FSDP2 with reshard_after_forward=False (torch has no ZeRO-2 of its own): "
            "gradients and optimizer state are 1/d as predicted and the parameters are whole from each forward "
            "to its backward as in ZeRO-2, but FSDP2 keeps its 1/d shard beside them (the shard the optimizer "
            "steps; it reshards after each backward), so at the peak a device holds (1 + 1/d) of its parameters "
            "where the prediction (ZeRO-2) holds them once, and between steps 1/d")
    if plan.sharding in (Sharding.GRADIENTS, Sharding.FULL) and replicated and num_microbatches > 1 \
            and not plan.fsdp.reduce_every_microbatch:
        notes.append(
            "plan.fsdp.reduce_every_microbatch: false runs as FSDP2's set_requires_gradient_sync(False) before the "
            "last micro-batch: from its first backward to its last a device holds its whole gradients, as predicted, "
            "but the run counts gradients at rest (its 1/d shard after the last reduce-scatter), not FSDP2's "
            "unsharded accumulation, which a CPU run does not see")
    if plan.sharding in (Sharding.GRADIENTS, Sharding.FULL) and replicated and not plan.fsdp.prefetch:
        notes.append(
            "plan.fsdp.prefetch: false cannot be asked of FSDP2, which gathers the next unit during a unit's "
            "backward when no modules to prefetch are set (torch's FSDPState._pre_backward: default_prefetch), so "
            "the run overlaps gathers the prediction exposes whole: a difference in time only (the prediction "
            "holds the same units with and without prefetch)")
    if plan.schedule in SPLIT_BACKWARD_SCHEDULES:
        notes.append(
            f"{plan.schedule} splits each backward as autograd.grad(..., retain_graph=True) for the input gradient "
            "(I) and a backward over the same graph for the weight gradient (W), so a micro-batch's whole stash is "
            "kept from its I to its W, where the prediction frees half of it at I (sim.cost.action_memory."
            "WGRAD_STASH_FRACTION, Qi et al. 2024 §2)")
    return tuple(notes)
