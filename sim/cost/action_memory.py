"""What a compute action allocates as it starts and frees as it ends, on one device.

A forward keeps its stash until its backward (``sim.cost.memory.stage_activation_bytes`` says
how much); a backward holds what it rebuilds (full recompute's segment, a layer's workspace)
and frees the stash; a split backward (zero-bubble's I and W) frees part at I and the rest at
W. The engine's ops and the planner's count before a replay both read ``compute_memory``, so
a stage's memory over time is the same whichever asks.
"""

from __future__ import annotations

from sim.schedule.ir import ActionKind

__all__ = ["WGRAD_STASH_FRACTION", "compute_memory"]

WGRAD_STASH_FRACTION = 0.5
"""Share of a stage's stash a split backward keeps from I until W: the layer inputs that the
weight gradients need (Qi et al., ICLR'24, §2, Table 1 counts W's memory as about half of B's)."""


def compute_memory(kind: ActionKind, cost, recompute: bool) -> tuple[float, float]:
    """(bytes a compute action allocates as it starts, bytes it frees as it ends) on one device: a
    forward keeps its stash; with full recompute the forward stashes its layers' inputs and the backward
    holds ``StageCost.rebuilt_bytes`` beyond it; a split backward frees ``1 − WGRAD_STASH_FRACTION`` of
    what it kept at I, the rest at W. The engine's ops and the planner's count (``planner.search.memory``)
    read it."""
    rebuilt = cost.rebuilt_bytes  # a recompute's segment, a layer's backward workspace
    kept = rebuilt if recompute else cost.stash_bytes + rebuilt  # what the backward holds
    extra = cost.stash_bytes if recompute else 0.0  # full recompute's checkpoints, freed at the end
    f = WGRAD_STASH_FRACTION
    if kind is ActionKind.F:
        return cost.stash_bytes, 0.0
    if kind is ActionKind.B:
        return rebuilt, kept + extra
    if kind is ActionKind.I:
        return rebuilt, (1 - f) * kept + extra
    return 0.0, f * kept  # W
