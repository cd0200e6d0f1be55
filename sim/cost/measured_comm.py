"""Collectives priced from what was measured on the link, not from the ring formulas.

A link with measured collectives (``sim.core.measured_collectives``, written by
``dapple-run profile``) holds, per kind and group size ``m``, a fit ``latency + bytes /
bandwidth`` of one call. A collective of ``nbytes`` over ``n`` members in ``calls`` calls
(FSDP2 gathers and reduce-scatters one unit, one layer, per call) then costs

    calls · (latency · steps(n)/steps(m) + overhead)  +  nbytes / bandwidth · share(n)/share(m)

where, for the ring kinds, ``steps(n) = halves·(n−1)`` and ``share(n) = (n−1)/n`` scale the
fit to a group size it was not measured at (the ring's step count and per-device bytes:
Patarasuk & Yuan 2009, as ``sim.cost.comm.ring_steps`` and ``ring_bytes``; the halves cancel
in the ratio), ``overhead`` is FSDP2's per-call cost (``fsdp=True`` only), and a broadcast
or point-to-point send is taken as measured. Ring attention's ring (``measured_ring_terms``) is
``steps`` shifts, each a ``ring-shift`` fit's call on one step's block: ``steps · latency +
nbytes / bandwidth`` for ``nbytes`` over all the steps. The nearest measured group size is used
(``MeasuredCollectives.nearest``). ``sim.cost.comm`` builds its phases from these two
terms, so the engine, the planners and ``dapple-sim check`` all see the same seconds.
Pure Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.core.parallelism import Sharding

if TYPE_CHECKING:
    from sim.core.measured_collectives import MeasuredCollectives

__all__ = ["PARAM_KINDS", "RING_KINDS", "SYNC_CALLS", "measured_ring_terms", "measured_sync_terms", "measured_terms"]

RING_KINDS = ("all-reduce", "all-gather", "reduce-scatter")
"""Kinds whose fit is scaled to other group sizes as a ring's steps and bytes scale."""


def measured_terms(measured: MeasuredCollectives | None, kind: str, members: int, nbytes: float, *,
                   calls: int = 1, fsdp: bool = False) -> tuple[float, float] | None:
    """(latency seconds, byte seconds) of ``calls`` calls of ``kind`` over ``members`` moving
    ``nbytes`` of buffer in all (the module docstring's formula); None when ``measured`` is
    None or holds no fit of ``kind``; (0, 0) for a single member."""
    fit = None if measured is None else measured.nearest(kind, members)
    if fit is None:
        return None
    if members < 2:
        return 0.0, 0.0
    steps, share = 1.0, 1.0
    if kind in RING_KINDS:
        steps = (members - 1) / (fit.ranks - 1)
        share = ((members - 1) / members) / ((fit.ranks - 1) / fit.ranks)
    overhead = measured.fsdp_call_overhead_s if fsdp else 0.0
    return calls * (fit.latency_s * steps + overhead), nbytes / fit.bandwidth_bytes_per_s * share


def measured_ring_terms(measured: MeasuredCollectives | None, members: int, nbytes: float,
                        steps: int) -> tuple[float, float] | None:
    """(latency seconds, byte seconds) of ``steps`` steps of a context-parallel ring over
    ``members`` moving ``nbytes`` in all (every step's block summed): ``steps`` latencies of the
    ``ring-shift`` fit and ``nbytes`` at its bandwidth (the module docstring); None when
    ``measured`` is None or holds no such fit."""
    fit = None if measured is None else measured.nearest("ring-shift", members)
    if fit is None:
        return None
    return steps * fit.latency_s, nbytes / fit.bandwidth_bytes_per_s


SYNC_CALLS = {
    Sharding.NONE: (("all-reduce", False, False),),
    Sharding.OPTIMIZER: (("all-reduce", False, False), ("broadcast", True, False)),
    Sharding.GRADIENTS: (("reduce-scatter", True, True), ("all-gather", True, True)),
    Sharding.FULL: (("reduce-scatter", True, True),),
}
"""What the runtime calls to synchronise a stage under each sharding, as (kind, one call per
unit, FSDP2's): DDP's all-reduce; ZeRO-1's all-reduce then ``ZeroRedundancyOptimizer``'s
broadcasts of the updated shards (Rajbhandari et al. 2020, §5.1); FSDP2
(``runtime.model.sharding``) a reduce-scatter per unit and, under ``gradients`` (no reshard
after the forward), one all-gather per unit for the forward (``full``'s gathers are per
action: ``sim.cost.comm.fsdp_gather``). A step of several micro-batches under ``gradients``
gathers once per micro-batch; this counts one (a lower bound)."""

PARAM_KINDS = ("all-gather", "broadcast")
"""The kinds of ``SYNC_CALLS`` that move the updated parameters (their bytes, not the gradients')."""


def measured_sync_terms(measured: MeasuredCollectives | None, members: int, grad_bytes: float, sharding: Sharding, *,
                        units: int = 1, param_bytes: float | None = None) -> tuple[float, float] | None:
    """(latency seconds, byte seconds) of a stage's gradient synchronisation over ``members``:
    ``SYNC_CALLS[sharding]`` back to back, each over ``grad_bytes`` or, for the calls that move
    the updated parameters (``PARAM_KINDS``), ``param_bytes`` (default ``grad_bytes``) (``units``
    calls for the per-unit kinds; ``measured_terms``); None where nothing or not every kind was measured."""
    latency = byte_s = 0.0
    for kind, per_unit, fsdp in SYNC_CALLS[sharding]:
        nbytes = param_bytes if kind in PARAM_KINDS and param_bytes is not None else grad_bytes
        terms = measured_terms(measured, kind, members, nbytes, calls=units if per_unit else 1, fsdp=fsdp)
        if terms is None:
            return None
        latency, byte_s = latency + terms[0], byte_s + terms[1]
    return latency, byte_s
