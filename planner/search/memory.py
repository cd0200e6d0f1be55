"""Memory before time: a candidate's peak bytes per device, from the engine's own costs.

A replay is the planner's costliest step, and a candidate that runs out of memory wastes it.
``plan_peak_bytes`` computes what the engine would find without running time: every
device class's parameters, gradients and optimizer state (the resolved plan's stage costs,
``sim.schedule.resolved``, the very ones ``sim.engine.compile`` reads: ``sim.cost.memory.stage_state_bytes``
through ``sim.cost.compute.stage_cost``), then walks its pipeline rank's actions in the schedule's
order with the same allocations and frees as the engine's ops (``sim.cost.action_memory.compute_memory``),
ZeRO-2/3 and FSDP holding the live units' unsharded parameters and gradient during an action
(``sim.engine.memory.held_by_stage``, the engine's own: ``sim.cost.memory.stage_held_bytes``).

Receive buffers are left out, so the figure is at most the engine's peak: a candidate over
capacity here runs out of memory in the replay too, and is rejected without one; one under
it is replayed, and the replay has the last word.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.parallelism import Recompute
from sim.cost.action_memory import compute_memory
from sim.engine.memory import held_by_stage
from sim.schedule.ir import ActionKind, OverlapFB
from sim.schedule.resolved import ResolvedPlan

__all__ = ["MemoryEstimate", "plan_peak_bytes"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryEstimate:
    """The most a device of the plan holds, and where."""

    peak_bytes: float
    """Its parameters, gradients and optimizer state plus its activations at their peak, bytes."""
    device: int
    """The first device of the pipeline rank that peaks."""
    static_bytes: float
    """That device's parameters, gradients and optimizer state, bytes (``StageCost.static_bytes``
    summed over its stages, as the engine's ``DeviceClass.static_bytes``)."""
    activation_bytes: float
    """Its activations (and the units' unsharded parameters and gradient) at the peak, bytes."""


def plan_peak_bytes(resolved: ResolvedPlan) -> MemoryEstimate:
    """The peak bytes of the most loaded device of ``resolved``'s plan under its schedule, from
    its stage costs (``sim.schedule.resolved``: the engine's, on each stage's largest slice)."""
    plan, schedule = resolved.plan, resolved.schedule
    full = plan.recompute is Recompute.FULL
    costs = list(zip(resolved.stage_costs, held_by_stage(resolved)))
    ranks = plan.stage_ranks
    best = None
    for rank, group in enumerate(plan.device_groups):
        static = sum(costs[s][0].static_bytes for s in range(plan.num_stages) if ranks[s] == rank)
        held = peak = 0.0
        for step in schedule.ranks[rank]:
            parts = (step.forward, step.backward) if type(step) is OverlapFB else (step,)
            for action in parts:
                if action.kind not in _COMPUTE:
                    continue
                cost, unsharded = costs[action.stage]
                alloc, free = compute_memory(action.kind, cost, full)
                held += alloc
                gather = unsharded.forward_bytes if action.kind is ActionKind.F else (
                    0.0 if action.kind is ActionKind.W else unsharded.backward_bytes)
                peak = max(peak, held + gather)
                held -= free
        if best is None or static + peak > best.peak_bytes:
            best = MemoryEstimate(peak_bytes=static + peak, device=min(group), static_bytes=static,
                                  activation_bytes=peak)
    return best


_COMPUTE = frozenset({ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W})
