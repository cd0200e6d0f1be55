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

A ring does not reach a port's full bandwidth: NCCL's measured bus bandwidth (nccl-tests'
``all_reduce_perf``, which reports it in the convention of ``ring_bytes``) on 8 A100 over
NVSwitch is about 230 GB/s at 1 GiB against 300 GB/s per port and direction, and H100
NVSwitch servers reach about 75–80% of theirs. A link's ``collective_efficiency``
(``sim.specs.LinkSpec``) is that share: collectives move at ``collective_bandwidth_bytes_per_s``,
point-to-point transfers at the full ``bandwidth``. The engine's flows go through ports of
the full bandwidth, so a collective's flow is charged ``ring_bytes / collective_efficiency``
(``ring_flow_bytes``): alone on a port it takes the time the ring takes at the collective bandwidth.

These are the one home of those formulas: the compiler (``sim.engine.collectives``) turns
them into flows through ports, the planners (``planner.costs``, ``planner.exhaustive``) into
seconds. Pure Python, no SimPy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.specs import ClusterSpec, LinkSpec

__all__ = ["embedding_group_link", "hierarchical_allreduce_s", "ring_bytes", "ring_flow_bytes", "ring_s", "ring_steps"]


def ring_bytes(members: int, nbytes: float, *, halves: int = 2) -> float:
    """Bytes each of ``members`` sends in a ring over ``nbytes`` each: ``halves·(n−1)/n·nbytes``.

    ``halves=2``: a whole all-reduce; ``halves=1``: only its reduce-scatter or all-gather.
    """
    return halves * (members - 1) / members * nbytes


def ring_flow_bytes(members: int, nbytes: float, link: LinkSpec, *, halves: int = 2) -> float:
    """Bytes a ring's flow is charged through ports of ``link``'s full bandwidth, so that it
    moves at the link's collective bandwidth: ``ring_bytes / collective_efficiency``."""
    return ring_bytes(members, nbytes, halves=halves) / link.collective_efficiency


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
    collective bandwidth, plus the cross-server ring through ``min(nics_per_node, per_node)``
    NICs per server, no contention.
    """
    if grad_bytes == 0 or per_node * nodes <= 1:
        return 0.0
    intra, inter = cluster.intra_node, cluster.inter_node
    time = 0.0
    if per_node > 1:
        time += ring_s(per_node, grad_bytes, intra.collective_bandwidth_bytes_per_s, intra.latency_s)
    if nodes > 1:
        nics = min(cluster.nics_per_node, per_node)
        time += ring_s(nodes, grad_bytes, nics * inter.collective_bandwidth_bytes_per_s, inter.latency_s)
    return time


def embedding_group_link(plan, cluster: ClusterSpec) -> LinkSpec | None:
    """The link a tied embedding's gradient all-reduce crosses: between the first and the last
    stage's devices of one tensor rank (Megatron-LM's embedding group), inside a server if
    they share one, else between servers; None for a plan of one stage."""
    first, last = plan.stages[0].devices, plan.stages[-1].devices
    if plan.num_stages == 1 or first == last:
        return None
    same = all(cluster.node_of(a) == cluster.node_of(b) for a, b in zip(first, last))
    return cluster.intra_node if same else cluster.inter_node
