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

This module is the one home of those formulas (``sim.cost.links`` of which link a group crosses,
``sim.cost.group_comm`` of a tensor-parallel or FSDP group's path across servers, ``sim.cost.context_comm``
of the context ring): the compiler (``sim.engine.collectives``, ``sim.engine.groups``) turns their bytes,
steps and latencies into flows through ports, the planners (``planner.search.costs``,
``planner.planners.exhaustive``) into seconds, and a test (``tests/test_one_home_comm.py``)
replays each collective alone in the engine against them. Each cost is a :class:`CommCost`
(or a tuple of them, one per phase that runs after the other). Pure Python, no SimPy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sim.core.parallelism import Sharding
from sim.cost.fabric_comm import fabric_across
from sim.cost.links import busiest_nic_flows
from sim.cost.measured_comm import measured_sync_terms, measured_terms

if TYPE_CHECKING:
    from sim.core.model_spec import LayerSpec, ModelSpec
    from sim.core.specs import ClusterSpec, LinkSpec

__all__ = ["HALVES", "CommCost", "all_to_all", "all_to_all_s", "node_limited_fraction", "collective_s",
           "cross_server_flow_bytes", "fsdp_gather", "gradient_sync",
           "gradient_sync_bytes", "hierarchical_allreduce", "hierarchical_allreduce_s", "inside_halves",
           "pipeline_gather_s", "point_to_point_s", "ring_bytes", "ring_collective", "ring_flow_bytes", "ring_s", "ring_steps",
           "tensor_parallel_bytes_and_steps", "tensor_parallel_cost", "tied_allreduce_s"]

HALVES = {"all-reduce": 2, "all-gather": 1, "reduce-scatter": 1}
"""Ring halves each collective kind takes: an all-reduce is a reduce-scatter then an all-gather
(Patarasuk & Yuan 2009, §3), each ``(n−1)/n`` of the bytes in ``n−1`` steps."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CommCost:
    """One phase of communication alone on its ports: what each device sends and how long it takes."""

    bytes_per_device: float
    """Bytes the busiest device sends in the phase (a ring's ``halves·(n−1)/n`` share), bytes."""
    flow_bytes: float
    """Bytes its flow is charged through ports of the link's full bandwidth: ``bytes_per_device``
    over the link's ``collective_efficiency`` for a collective, as is for a point-to-point send."""
    steps: int
    """Sequential steps, each paying one link latency."""
    link: LinkSpec
    """The link the phase crosses (``sim.cost.links``)."""
    across_servers: bool
    """Whether ``link`` is the inter-node one (the NICs) rather than a GPU's port in a server."""
    rate_bytes_per_s: float
    """Rate of the busiest device's flow alone: the port's bandwidth over the flows sharing it, bytes/s."""
    measured_latency_s: float | None = None
    """The phase's latency from the link's measured collectives (``sim.cost.measured_comm``) or
    NCCL's model on a fabric (``sim.cost.fabric_comm``), seconds; None: one link latency per step."""

    @property
    def latency_s(self) -> float:
        """The phase's latency: one link latency per step, or the measured one, seconds."""
        return self.steps * self.link.latency_s if self.measured_latency_s is None else self.measured_latency_s

    @property
    def seconds(self) -> float:
        """Alpha-beta time of the phase alone: ``flow_bytes / rate + steps · latency``, seconds."""
        return self.flow_bytes / self.rate_bytes_per_s + self.latency_s


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


def collective_s(nbytes: float, steps: int, link: LinkSpec) -> float:
    """Seconds of a collective phase alone whose busiest device sends ``nbytes`` in ``steps``
    ring steps over ``link``: at the collective bandwidth, plus a latency per step (the
    planners' hot path; ``CommCost.seconds`` of ``ring_collective``)."""
    return nbytes / link.collective_efficiency / link.bandwidth_bytes_per_s + steps * link.latency_s


def _cost(nbytes: float, flow_bytes: float, steps: int, link: LinkSpec, cluster: ClusterSpec,
          rate: float | None = None) -> CommCost:
    across = link is cluster.inter_node
    return CommCost(bytes_per_device=nbytes, flow_bytes=flow_bytes, steps=steps, link=link, across_servers=across,
                    rate_bytes_per_s=link.bandwidth_bytes_per_s if rate is None else rate)


def ring_collective(kind: str, members: int, nbytes: float, link: LinkSpec, cluster: ClusterSpec, *,
                    calls: int = 1, fsdp: bool = False) -> CommCost:
    """A ring ``kind`` (``HALVES``'s keys) over ``members`` devices of ``nbytes`` each, alone on ``link``.

    On a link with measured collectives (``LinkSpec.collectives``) the phase takes the measured
    seconds of ``calls`` calls (FSDP2's per-call overhead too with ``fsdp``;
    ``sim.cost.measured_comm.measured_terms``): its flow is charged the bytes that take the
    measured byte time at the port's bandwidth."""
    halves = HALVES[kind]
    measured = measured_terms(link.collectives, kind, members, nbytes, calls=calls, fsdp=fsdp)
    if measured is not None:
        latency, byte_s = measured
        return CommCost(bytes_per_device=ring_bytes(members, nbytes, halves=halves), link=link,
                        flow_bytes=byte_s * link.bandwidth_bytes_per_s, steps=ring_steps(members, halves=halves),
                        across_servers=link is cluster.inter_node, rate_bytes_per_s=link.bandwidth_bytes_per_s,
                        measured_latency_s=latency)
    return _cost(ring_bytes(members, nbytes, halves=halves), ring_flow_bytes(members, nbytes, link, halves=halves),
                 ring_steps(members, halves=halves), link, cluster)


def inside_halves(servers: int) -> int:
    """Ring halves inside each server of a hierarchical all-reduce: the whole ring on one
    server (2), its reduce-scatter before and all-gather after the cross-server ring on several (1 each)."""
    return 2 if servers == 1 else 1


def cross_server_flow_bytes(servers: int, grad_bytes: float, cluster: ClusterSpec, gpus: int) -> float:
    """Bytes each of a server's ``gpus`` GPUs is charged in the cross-server ring of a hierarchical
    all-reduce: the ring's share over ``servers`` servers of its 1/``gpus`` shard."""
    return ring_flow_bytes(servers, grad_bytes, cluster.inter_node) / gpus


def hierarchical_allreduce(members_per_node: Sequence[int], grad_bytes: float, cluster: ClusterSpec, *,
                           flows_per_nic: int | None = None, crossing=None,
                           scatter: bool = False) -> tuple[CommCost, ...]:
    """The phases of an all-reduce of ``grad_bytes`` over ``members_per_node[j]`` GPUs on server j.

    The engine's layout (Jia et al. 2018, §3): one server, one ring all-reduce; several, a ring
    reduce-scatter inside each (the widest server sets the time and steps), a ring all-reduce
    of each GPU's shard across the k servers through the NICs (each GPU of the smallest server
    carries the largest shard, 1/n of it), a ring all-gather inside each. ``flows_per_nic``:
    cross-server flows on the busiest NIC (default: the smallest server's GPUs through
    ``sim.cost.links.busiest_nic_flows``; 1 gives every flow a NIC of its own). Empty for one GPU. On a
    fabric the cross-server phase is NCCL's algorithm over the tiers ``crossing`` (``fabric_comm``);
    ``scatter``: the layout stands for a reduce-scatter of twice ``grad_bytes`` (ZeRO-3's,
    ``gradient_sync_bytes``: the same ring bytes), which NCCL runs across nodes as a ring only."""
    k, widest, smallest = len(members_per_node), max(members_per_node), min(members_per_node)
    if k * widest <= 1:
        return ()
    intra, inter = cluster.intra_node, cluster.inter_node
    inside = inside_halves(k)
    phases = []
    if widest > 1:
        phases.append(ring_collective("all-reduce" if inside == 2 else "reduce-scatter", widest, grad_bytes,
                                      intra, cluster))
    if k > 1:
        flows = busiest_nic_flows(cluster, smallest) if flows_per_nic is None else flows_per_nic
        across = _cost(ring_bytes(k, grad_bytes) / smallest, cross_server_flow_bytes(k, grad_bytes, cluster, smallest),
                       ring_steps(k), inter, cluster, inter.bandwidth_bytes_per_s / flows)
        if cluster.fabric is not None:
            across = fabric_across(across, members_per_node, grad_bytes * (2 if scatter else 1), cluster, flows,
                                   crossing, kind="reduce-scatter" if scatter else "all-reduce")
        phases.append(across)
        if widest > 1:
            phases.append(ring_collective("all-gather", widest, grad_bytes, intra, cluster))
    return tuple(phases)


def hierarchical_allreduce_s(grad_bytes: float, per_node: int, nodes: int, cluster: ClusterSpec) -> float:
    """Seconds of ``hierarchical_allreduce`` over ``per_node`` GPUs on each of ``nodes`` servers."""
    return sum(phase.seconds for phase in hierarchical_allreduce([per_node] * nodes, grad_bytes, cluster))


def gradient_sync_bytes(grad_bytes: float, sharding: Sharding, *, param_bytes: float | None = None) -> float:
    """Bytes of the all-reduce layout a stage's gradient synchronisation runs under ``sharding``.

    ``none``: the all-reduce of the ``grad_bytes`` gradients; ``optimizer``/``gradients``
    (ZeRO-1/2, Megatron's distributed optimizer; Rajbhandari et al. 2020, §5.1–5.2): a
    reduce-scatter of the g gradient bytes, then an all-gather of the p bytes of the updated
    parameters (``param_bytes``, default g). They differ when the gradients keep another dtype:
    Megatron-Core reduce-scatters ``grad_data`` in ``grad_dtype`` (fp32 under bf16) and gathers
    ``param_data`` in ``param_dtype`` (megatron/core/distributed/param_and_grad_buffer.py,
    megatron/core/optimizer/distrib_optimizer.py ``_dispatch_gather_model_params`` at
    core_r0.8.0); DeepSpeed ZeRO-1/2 gathers the 16-bit partitions. On a ring of n a device
    sends (n−1)/n·g + (n−1)/n·p = 2(n−1)/n·(g + p)/2 bytes in 2(n−1) steps: the all-reduce of
    (g + p)/2 bytes, its traffic and steps (g itself where p = g). ``full`` (ZeRO-3/FSDP,
    §5.3): only the reduce-scatter is left (the parameters are gathered per action,
    ``fsdp_gather``), laid out as an all-reduce of half the bytes.
    """
    if sharding is Sharding.FULL:
        return grad_bytes * 0.5
    if sharding is Sharding.NONE or param_bytes is None:
        return grad_bytes
    return 0.5 * (grad_bytes + param_bytes)


def gradient_sync(members_per_node: Sequence[int], grad_bytes: float, sharding: Sharding, cluster: ClusterSpec, *,
                  flows_per_nic: int | None = None, units: int = 1, crossing=None,
                  param_bytes: float | None = None) -> tuple[CommCost, ...]:
    """The phases of a stage's gradient synchronisation: ``hierarchical_allreduce`` of
    ``gradient_sync_bytes`` (``crossing``: its cross-server ring's, on a fabric; ``param_bytes``:
    the bytes ZeRO-1/2 all-gathers, default ``grad_bytes``). On one server whose link has
    measured collectives, one phase of what the runtime calls (``measured_sync_terms``)."""
    link, members = cluster.intra_node, members_per_node[0]
    terms = measured_sync_terms(link.collectives, members, grad_bytes, sharding, units=units,
                                param_bytes=param_bytes) if len(members_per_node) == 1 and members > 1 else None
    if terms is not None:
        return (CommCost(bytes_per_device=ring_bytes(members, grad_bytes), flow_bytes=terms[1] * link.bandwidth_bytes_per_s,
                         steps=ring_steps(members), link=link, across_servers=False,
                         rate_bytes_per_s=link.bandwidth_bytes_per_s, measured_latency_s=terms[0]),)
    return hierarchical_allreduce(members_per_node, gradient_sync_bytes(grad_bytes, sharding, param_bytes=param_bytes),
                                  cluster, flows_per_nic=flows_per_nic, crossing=crossing,
                                  scatter=sharding is Sharding.FULL)


def tensor_parallel_bytes_and_steps(layers: Sequence[LayerSpec], tensor_parallel: int, phase: str | tuple[str, ...],
                                    samples: int = 1, *, beside: bool | None = None) -> tuple[float, int]:
    """Bytes one device sends and ring steps of ``layers``' tensor-parallel collectives in ``phase``
    (``sim.cost.tensor_comm.PHASES``, one or several) on ``samples`` samples (``LayerSpec.tp_collectives``;
    a full recompute adds the forward's to the backward); ``beside`` True or False: only those that
    are, or are not, marked to run beside a column-parallel linear's backward."""
    phases = (phase,) if isinstance(phase, str) else phase
    nbytes, steps = 0.0, 0
    for layer in layers:
        for c in layer.tp_collectives:
            if c.phase in phases and (beside is None or c.beside is beside):
                halves = HALVES[c.kind]
                nbytes += ring_bytes(tensor_parallel, c.bytes * samples, halves=halves)
                steps += ring_steps(tensor_parallel, halves=halves)
    return nbytes, steps


def tensor_parallel_cost(nbytes: float, steps: int, link: LinkSpec, cluster: ClusterSpec) -> CommCost:
    """One action's tensor-parallel collectives as one phase: ``nbytes`` and ``steps`` of
    ``tensor_parallel_bytes_and_steps`` over the group's ``link``, at its collective bandwidth."""
    return _cost(nbytes, nbytes / link.collective_efficiency, steps, link, cluster)


def node_limited_fraction(experts, servers: int) -> float:
    """Share of an expert all-to-all's across-server bytes that node-limited routing sends.

    Without it each of a token's top_k copies goes to its expert's server, so (N − 1)/N of them
    cross servers in a group spanning N servers. DeepSeek-V3 (§2.1.2) sends each token to
    experts on at most M = ``experts.node_limit`` servers, "dispatched to the same node only once
    over IB" and forwarded inside it over NVLink (§3.2.2): m = min(M, N, top_k) server copies,
    of which (N − 1)/N are remote. So the across bytes scale by m / top_k (DeepSeek-V3: M 4,
    N 8, top-8: 1/2); 1 without a limit (``experts`` None or ``node_limit`` None)."""
    limit = getattr(experts, "node_limit", None)
    if limit is None:
        return 1.0
    return min(limit, servers, experts.top_k) / experts.top_k


def all_to_all(members_per_node: Sequence[int], nbytes: float, cluster: ClusterSpec, *,
               across_fraction: float = 1.0) -> tuple[CommCost, ...]:
    """An MoE block's all-to-all (token dispatch or combine) over an expert-parallel group whose
    members sit ``members_per_node`` to a server, each holding ``nbytes`` (its routed token copies,
    ``LayerSpec.a2a_bytes`` × samples), alone: its phases inside and across servers, which run
    at the same time.

    With tokens spread evenly, each of the n members sends nbytes/n to every other: (g − 1)/n of
    its bytes to the g − 1 others of its server through its GPU port, (n − g)/n through its NIC
    to the other servers, the NIC shared by the server's members that cross
    (``busiest_nic_flows``); so a group on one server moves (n − 1)/n · nbytes over NVLink (the
    brief's (EP − 1)/EP). NCCL posts every peer's send and receive in one group
    (``ncclGroupStart``/``ncclGroupEnd``, as ``torch.distributed.all_to_all_single`` and nccl-tests'
    ``alltoall.cu`` do), so each phase pays one link latency, at the link's collective bandwidth.
    DeepSeek-V3's node-limited routing (§2.1.2: a token goes to at most 4 servers, its copies
    deduplicated over InfiniBand and forwarded over NVLink, §3.2.2) cuts the across bytes by
    ``across_fraction`` (``node_limited_fraction``); the NVLink phase is left as it is.
    """
    n, widest = sum(members_per_node), max(members_per_node)
    phases = []
    if widest > 1 and nbytes > 0:
        inside = (widest - 1) / n * nbytes
        phases.append(_cost(inside, inside / cluster.intra_node.collective_efficiency, 1, cluster.intra_node, cluster))
    if len(members_per_node) > 1 and nbytes > 0:
        link = cluster.inter_node
        across = (n - min(members_per_node)) / n * nbytes * across_fraction
        rate = link.bandwidth_bytes_per_s / busiest_nic_flows(cluster, widest)
        phases.append(_cost(across, across / link.collective_efficiency, 1, link, cluster, rate))
    return tuple(phases)


def all_to_all_s(members_per_node: Sequence[int], nbytes: float, cluster: ClusterSpec, *,
                 across_fraction: float = 1.0) -> float:
    """Seconds of that all-to-all alone: its slower phase (``all_to_all``), 0 for one member."""
    phases = all_to_all(members_per_node, nbytes, cluster, across_fraction=across_fraction)
    return max((phase.seconds for phase in phases), default=0.0)


def fsdp_gather(members: int, param_bytes: float, link: LinkSpec, cluster: ClusterSpec, *, units: int = 1,
                crossing=None) -> CommCost:
    """FSDP's per-action all-gather of a stage's ``param_bytes`` over its ``members`` shards
    (Rajbhandari et al. 2020, §5.3; FSDP2's ``fully_shard``): a ring all-gather, alone on ``link``;
    ``units`` calls (one per layer) where the link's collectives are measured. ``crossing``: a group
    of one member on each server, on a fabric: NCCL's ring all-gather (its protocol by size) over
    the tiers it crosses (``sim.cost.fabric_comm.fabric_across``), as a gradient ring of such a group."""
    ring = ring_collective("all-gather", members, param_bytes, link, cluster, calls=units, fsdp=True)
    if crossing is None or cluster.fabric is None or ring.measured_latency_s is not None or members < 2:
        return ring
    return fabric_across(ring, [1] * members, param_bytes, cluster, busiest_nic_flows(cluster, 1), crossing,
                         kind="all-gather")


def pipeline_gather_s(share_bytes: float, tensor_parallel: int, link: LinkSpec) -> float:
    """Seconds a receiving stage's tensor group all-gathers a pipeline transfer that crossed split
    over its ``tensor_parallel`` ranks, ``share_bytes`` each (the flows' 1/t, ``sim.engine.flows``):
    Megatron-LM's scatter/gather (Narayanan et al. 2021, SC21 §4.1; megatron/p2p_communication.py
    at 6fd7818, ``_communicate``: ``gather_split_1d_tensor`` after the exchange, before the
    compute; at cfd2e21, 2022, only without sequence parallelism). A ring all-gather alone on
    ``link``: ``(t−1)·share / (B·efficiency) + (t−1)·latency``."""
    if tensor_parallel <= 1 or share_bytes <= 0:
        return 0.0
    return collective_s(ring_bytes(tensor_parallel, share_bytes * tensor_parallel, halves=1),
                        ring_steps(tensor_parallel, halves=1), link)


def point_to_point_s(nbytes: float, link: LinkSpec, *, flows_per_port: int = 1) -> float:
    """Seconds of one point-to-point send of ``nbytes`` alone: latency plus bytes at the port's
    full bandwidth, shared by ``flows_per_port`` flows (the alpha-beta model; ``LinkSpec``)."""
    return link.latency_s + nbytes * flows_per_port / link.bandwidth_bytes_per_s


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
