"""Collectives in closed form: what a gradient all-reduce moves and how long it takes.

Picture n workers in a circle, each holding a gradient of ``nbytes``. In a *ring* all-reduce
each cuts its gradient into n shards and, step by step, passes one shard to its right-hand
neighbour: after n−1 steps of adding what arrives (reduce-scatter) every worker holds one
fully summed shard, and after n−1 more steps of copying (all-gather) everyone holds all of
them. Each worker sends ``2(n−1)/n · nbytes`` in ``2(n−1)`` steps, whatever n is
(Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations",
JPDC 2009). Alpha-beta cost: ``steps · latency + bytes / bandwidth``.

Across servers the scheme is *hierarchical* (the NCCL/Horovod scheme; Jia et al., "Highly
Scalable Deep Learning Training System with Mixed-Precision", 2018, §3): a ring
reduce-scatter inside each server, a ring all-reduce of each GPU's shard across the k
servers through the NICs (``2(k−1)/k · nbytes / n`` per GPU), then a ring all-gather inside
each server.

These are the one home of those formulas: the compiler (``sim.engine.collectives``) turns
them into flows through ports, the planners (``planner.costs``, ``planner.exhaustive``) into
seconds. Pure Python, no SimPy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.specs import ClusterSpec

__all__ = ["hierarchical_allreduce_s", "ring_bytes", "ring_s", "ring_steps"]


def ring_bytes(members: int, nbytes: float, *, halves: int = 2) -> float:
    """Bytes each of ``members`` sends in a ring over ``nbytes`` each: ``halves·(n−1)/n·nbytes``.

    ``halves=2``: a whole all-reduce; ``halves=1``: only its reduce-scatter or all-gather.
    """
    return halves * (members - 1) / members * nbytes


def ring_steps(members: int, *, halves: int = 2) -> int:
    """Sequential steps of that ring, each paying one link latency: ``halves·(n−1)``."""
    return halves * (members - 1)


def ring_s(members: int, nbytes: float, bandwidth_bytes_per_s: float, latency_s: float, *,
           halves: int = 2) -> float:
    """Alpha-beta seconds of that ring alone: ``bytes / bandwidth + steps · latency``."""
    return (ring_bytes(members, nbytes, halves=halves) / bandwidth_bytes_per_s
            + ring_steps(members, halves=halves) * latency_s)


def hierarchical_allreduce_s(grad_bytes: float, per_node: int, nodes: int, cluster: ClusterSpec) -> float:
    """Seconds to all-reduce ``grad_bytes`` over ``per_node`` GPUs on each of ``nodes`` servers.

    The ring inside a server (both halves: reduce-scatter and all-gather) at one GPU port's
    bandwidth, plus the cross-server ring through ``min(nics_per_node, per_node)`` NICs per
    server, all at full bandwidth (no contention).
    """
    if grad_bytes == 0 or per_node * nodes <= 1:
        return 0.0
    intra, inter = cluster.intra_node, cluster.inter_node
    time = 0.0
    if per_node > 1:
        time += ring_s(per_node, grad_bytes, intra.bandwidth_bytes_per_s, intra.latency_s)
    if nodes > 1:
        nics = min(cluster.nics_per_node, per_node)
        time += ring_s(nodes, grad_bytes, nics * inter.bandwidth_bytes_per_s, inter.latency_s)
    return time
