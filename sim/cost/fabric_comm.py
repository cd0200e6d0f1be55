"""A collective's cross-server phase on a fabric, by the algorithm NCCL would run over its tiers.

Without a fabric the cross-server part of a hierarchical all-reduce is a ring of each GPU's
shard over the servers (``sim.cost.comm.hierarchical_allreduce``), at the NIC's bandwidth and
one link latency a step. On a multi-tier fabric (``sim.core.fabric``) NCCL's tuner picks, by
size, between that ring, its double binary tree and (on NVSwitch Hopper servers) the NVLS tree
(``sim.cost.nccl``: NVIDIA/nccl ``src/graph/tuning.cc``, ``src/enqueue.cc`` ``topoGetAlgoInfo``),
and the group gets on the network only what the tiers it crosses carry: climbing to tier ``t``
(``sim.cost.tiers.group_crossing``) every GPU below sends at its NIC's share over the product of
the oversubscriptions of tiers ``0 .. t−1``, and pays the switches' latency of tiers ``0 .. t``.

:func:`across_choice` prices the group's all-reduce by NCCL's model with that inter tier:
``InterTier(bandwidth = NIC share / oversubscription, latency = link + tier latencies)``, under
``cluster.fabric.collective_algorithm`` (``auto``: the tuner's minimum; ``ring``/``tree`` forced).
The split between the two models (:func:`fabric_across`):

* *bandwidth* stays the flows' where the engine models it: the phase's bytes are the ring's
  shard bytes times the algorithm's **bytes factor**, NCCL's bandwidth time of the chosen
  algorithm over its Simple ring's in the same tiers (1 for the ring; for the Simple tree
  ``n/(2(n−1)) / (0.92 · 0.5)``, about 1.1 on 16 nodes: both reach about half the bus bandwidth,
  the tree 0.92 of it and less at medium sizes), and the engine pushes them through the
  NIC and uplink ports (an oversubscribed tier's uplinks are ports, ``sim.cost.tiers.modelled_tiers``),
  so contention between groups is the flows'. The closed form (the planner's tables and
  ``CommCost.seconds``) divides the NIC share's rate by the crossing's oversubscription instead;
* *latency* is NCCL's: the chosen algorithm's ``latency_s`` (``2(k−1)`` network steps of a ring,
  ``2·log2(k)`` of a tree, each at NCCL's per-hop constant plus the wire and tier latencies)
  replaces the ring's ``steps × link latency``. The phases inside the servers keep their own
  ring latencies (an NVLink microsecond a step NCCL's intra chain counts as well: a small overcount).

The other collectives that cross servers take the same path: FSDP/ZeRO-3's parameter
all-gathers and gradient reduce-scatter, and a tensor-parallel group's collectives
(:func:`fabric_calls_across`, each kind by the size of one call). Across nodes NCCL runs an
all-gather or reduce-scatter as a **ring only** (tuning.cc ``ncclTopoTuneModel``: NVLS and
CollNet Direct get no bandwidth across nodes without CollNet, PAT is for one GPU a node), so
only the protocol is chosen by size: LL (half the bus bandwidth, the least latency) for small
calls, LL128, or Simple for large ones; the bytes factor is then the protocol's (2 under LL).

Pure Python, no SimPy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from sim.cost.links import busiest_nic_flows
from sim.cost.nccl import InterTier, NcclCost, cluster_tiers, collective, device_generation
from sim.cost.tiers import INSIDE_SERVER, Crossing, group_crossing

if TYPE_CHECKING:
    from sim.core.specs import ClusterSpec

__all__ = ["AcrossChoice", "across_choice", "choice_text", "fabric_across", "fabric_calls_across", "nominal_crossing"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AcrossChoice:
    """How a group's all-reduce crosses the fabric: NCCL's algorithm and what it changes."""

    algorithm: str
    """``ring``, ``tree`` or ``nvls_tree`` (``sim.cost.nccl.NcclCost.algorithm``)."""
    protocol: str
    """NCCL's protocol with it (``LL``, ``LL128``, ``Simple``)."""
    bytes_factor: float
    """The cross-server bytes over the ring's: NCCL's bandwidth time of the algorithm over its
    Simple ring's on the same tiers (1 for a ring run under Simple), dimensionless."""
    latency_s: float
    """NCCL's latency of the algorithm on those tiers, seconds: the cross-server phase's latency."""
    crossing: Crossing
    """The tier the group's cross-server traffic climbs to (``sim.cost.tiers.group_crossing``)."""
    nccl: NcclCost
    """NCCL's whole price of the collective on those tiers (the chosen candidate)."""


def nominal_crossing(cluster: ClusterSpec, servers: int) -> Crossing:
    """Where a group of one GPU on each of ``servers`` consecutive servers from the first, all of
    one rail, crosses: the planner's shape of a group (it knows how many servers, not which)."""
    return group_crossing(cluster, [j * cluster.devices_per_node for j in range(servers)])


def _tier_latency_s(cluster: ClusterSpec, crossing: Crossing) -> float:
    """The switches' latency a transfer climbing to ``crossing.tier`` pays: tiers 0 to it
    (as the engine's flows add it, ``sim.engine.flow_table``), seconds."""
    if cluster.fabric is None or crossing.tier == INSIDE_SERVER:
        return 0.0
    return sum(t.latency_s for t in cluster.fabric.tiers[:crossing.tier + 1])


def across_choice(members_per_node: Sequence[int], nbytes: float, cluster: ClusterSpec, *,
                  flows_per_nic: int | None = None, crossing: Crossing | None = None,
                  kind: str = "all-reduce") -> AcrossChoice:
    """NCCL's ``kind`` (an all-reduce; an all-gather or reduce-scatter of ``nbytes`` gathered) over
    ``members_per_node[j]`` GPUs on server j across the fabric's tiers (the module docstring).
    ``flows_per_nic``: cross-server flows on the busiest NIC (default: the smallest server's GPUs,
    ``busiest_nic_flows``); ``crossing``: where the group's cross-server ring goes (default:
    ``nominal_crossing``). Across servers NCCL runs an all-gather or reduce-scatter as a ring only
    (tuning.cc: NVLS and CollNet Direct get no bandwidth across nodes without CollNet, PAT only
    with one GPU a node), so only its protocol is chosen, by size."""
    k, widest, smallest = len(members_per_node), max(members_per_node), min(members_per_node)
    crossing = nominal_crossing(cluster, k) if crossing is None else crossing
    flows = busiest_nic_flows(cluster, smallest) if flows_per_nic is None else flows_per_nic
    intra, _ = cluster_tiers(cluster, members_per_node)
    link = cluster.inter_node
    # each GPU's share of its server's NICs (``cluster_tiers``), over what the tiers above let through
    share = smallest * link.collective_bandwidth_bytes_per_s / flows / widest / crossing.oversubscription
    inter = InterTier(bandwidth_bytes_per_s=share, latency_s=link.latency_s + _tier_latency_s(cluster, crossing))
    kwargs = dict(generation=device_generation(cluster.device.name))
    algorithm = cluster.fabric.collective_algorithm if cluster.fabric is not None else "auto"
    if kind != "all-reduce":
        algorithm = "ring"  # the tree runs all-reduce only: a forced ``tree`` leaves other kinds NCCL's ring
    chosen = collective(kind, widest, k, nbytes, intra, inter, algorithm=algorithm, **kwargs)
    ring = collective(kind, widest, k, nbytes, intra, inter, algorithm="ring", protocols=("Simple",), **kwargs)
    ring_s, chosen_s = ring.seconds - ring.latency_s, chosen.seconds - chosen.latency_s
    factor = chosen_s / ring_s if ring_s > 0 else 1.0
    return AcrossChoice(algorithm=chosen.algorithm, protocol=chosen.protocol, bytes_factor=factor,
                        latency_s=chosen.latency_s, crossing=crossing, nccl=chosen)


def fabric_across(ring_phase, members_per_node: Sequence[int], nbytes: float, cluster: ClusterSpec, flows: int,
                  crossing: Crossing | None = None, kind: str = "all-reduce"):
    """``ring_phase`` (the cross-server ring's ``sim.cost.comm.CommCost``) as the fabric runs it:
    its bytes times ``across_choice``'s factor, its rate over the crossing's oversubscription, NCCL's latency."""
    return fabric_calls_across(ring_phase, [(kind, 1.0, nbytes, 1)], members_per_node, cluster, flows, crossing)


def fabric_calls_across(ring_phase, calls: Sequence[tuple[str, float, float, int]], members_per_node: Sequence[int],
                        cluster: ClusterSpec, flows: int, crossing: Crossing | None = None):
    """``ring_phase``, the cross-server phase of several collectives of a group (a tensor-parallel
    action's, FSDP's gathers: ``sim.cost.group_comm.spanning_phases``), as the fabric runs them.
    ``calls``: per kind (kind, the ring's bytes per device of all its calls, bytes of one call
    (NCCL's size, by which it picks the protocol), how many calls). Each kind's bytes times its
    ``across_choice`` factor; the latency every call's NCCL latency; the rate over the crossing's
    oversubscription (as :func:`fabric_across`)."""
    ring_bytes = scaled = latency_s = 0.0
    oversubscription = 1.0
    for kind, nbytes, per_call_bytes, count in calls:
        choice = across_choice(members_per_node, per_call_bytes, cluster, flows_per_nic=flows, crossing=crossing,
                               kind=kind)
        ring_bytes += nbytes
        scaled += nbytes * choice.bytes_factor
        latency_s += count * choice.latency_s
        oversubscription = choice.crossing.oversubscription
    factor = scaled / ring_bytes if ring_bytes > 0 else 1.0
    return replace(ring_phase, bytes_per_device=ring_phase.bytes_per_device * factor,
                   flow_bytes=ring_phase.flow_bytes * factor,
                   rate_bytes_per_s=ring_phase.rate_bytes_per_s / oversubscription, measured_latency_s=latency_s)


def choice_text(nbytes_text: str, choice: AcrossChoice, kind: str = "all-reduce") -> str:
    """``DP all-reduce 1.6 GiB: ring`` (``tree``, ``nvls_tree``; ``DP reduce-scatter``: ZeRO-3's), with where it crosses."""
    where = "" if choice.crossing.tier == INSIDE_SERVER else f" across the {choice.crossing.name}"
    return f"DP {kind} {nbytes_text}: {choice.algorithm}{where}"
