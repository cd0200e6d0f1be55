"""Communication in closed form: what every collective moves and how long it takes.

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
(``sim.core.specs.LinkSpec``) is that share: collectives move at ``collective_bandwidth_bytes_per_s``,
point-to-point transfers at the full ``bandwidth``. The engine's flows go through ports of
the full bandwidth, so a collective's flow is charged ``ring_bytes / collective_efficiency``
(``ring_flow_bytes``): alone on a port it takes the time the ring takes at the collective bandwidth.

These are the one home of those formulas: the compiler (``sim.engine.collectives``) turns
them into flows through ports, the planners (``planner.search.costs``, ``planner.planners.exhaustive``) into
seconds. Pure Python, no SimPy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sim.core.parallelism import BlockShape, Recompute

if TYPE_CHECKING:
    from sim.core.model_spec import ModelSpec
    from sim.core.specs import ClusterSpec, LinkSpec

__all__ = ["TensorParallelCollective", "embedding_group_link", "hierarchical_allreduce_s", "ring_bytes", "ring_flow_bytes",
           "ring_s", "ring_steps", "tensor_parallel_collectives", "tied_allreduce_s"]




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


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorParallelCollective:
    """One collective over a tensor-parallel group, per block and sample."""

    kind: str
    """``all-reduce``, ``all-gather`` or ``reduce-scatter``."""
    phase: str
    """``forward``, ``backward`` or ``recompute`` (the forward a full recompute runs again)."""
    bytes: float
    """The full activation each rank contributes or receives: e·s·h per sample (all-gather and
    reduce-scatter: the gathered size; each rank holds 1/t of it)."""


def tensor_parallel_collectives(shape: BlockShape, *, tensor_parallel: int, sequence_parallel: bool = False,
                                recompute: Recompute = Recompute.NONE) -> tuple[TensorParallelCollective, ...]:
    """The collectives of one block for one sample over a tensor-parallel group (none if t = 1).

    Megatron-LM (Shoeybi et al. 2019, §3, Figure 3): operator g all-reduces the output of the
    attention's output projection and of the MLP's second linear in the forward (2 all-reduces),
    operator f all-reduces the input gradients of the QKV projection and the MLP's first linear
    in the backward (2 more). Sequence parallelism (Korthikanti et al. §4.2.2, Figure 5) turns
    each all-reduce into an all-gather before the column-parallel linear and a reduce-scatter
    after the row-parallel one (same bytes on the wire); the backward does the conjugates. A
    fully recomputed forward repeats the forward's collectives inside the backward.
    """
    if tensor_parallel <= 1:
        return ()
    nbytes = float(shape.element_bytes * shape.seq_len * shape.hidden)
    forward = ("all-gather", "reduce-scatter") * 2 if sequence_parallel else ("all-reduce",) * 2
    backward = ("all-gather", "reduce-scatter") * 2 if sequence_parallel else ("all-reduce",) * 2
    result = [TensorParallelCollective(kind=k, phase="forward", bytes=nbytes) for k in forward]
    if recompute is Recompute.FULL:
        result += [TensorParallelCollective(kind=k, phase="recompute", bytes=nbytes) for k in forward]
    result += [TensorParallelCollective(kind=k, phase="backward", bytes=nbytes) for k in backward]
    return tuple(result)


def tied_allreduce_s(model: ModelSpec, start: int, end: int, link: LinkSpec | None) -> float:
    """Seconds of the tied embedding's gradient all-reduce for a stage of layers ``[start, end)``.

    A stage that holds one end of a tied embedding (the embedding or the head, not both) sums
    the matrix's gradient with the other end's before the optimizer step: Megatron-LM's
    ``_allreduce_embedding_grads`` over its embedding group (the first and last pipeline
    stage's devices of one tensor rank), a ring of 2 over ``link`` at its collective bandwidth
    (``sim.cost.comm.ring_s``), alone on the link. 0 without a link, or when the stage holds
    both ends or none.
    """
    if link is None or model.tied_ends(start, end) != 1:
        return 0.0
    grad_bytes = model.tied_bytes * model.grad_bytes_per_param_byte
    return ring_s(2, grad_bytes, link.collective_bandwidth_bytes_per_s, link.latency_s)
