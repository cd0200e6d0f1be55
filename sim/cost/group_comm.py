"""A group's collectives across servers: the path NCCL takes, not one flat ring.

A tensor-parallel group's all-reduces (or, with sequence parallelism, its all-gathers and
reduce-scatters), FSDP's parameter all-gather over a gradient group, and the context-parallel
ring run over devices that may sit on several servers. Picture two 8-GPU servers joined by
eight network cards, one per GPU (a *rail* each). A flat ring of the 16 GPUs would push
every byte of its ``2(N−1)/N`` share through the one card its crossing hop uses; NCCL does
not run it that way:

* **all-reduce, all-gather, reduce-scatter** — NCCL connects the GPUs of a server by NVLink
  *chains* and only the servers by the network (its trees are "only inter-node trees, and
  intra-node is connected using chains", NVIDIA/nccl issue #545); on two servers it picks
  the tree, whose bus bandwidth "can indeed go beyond the network bottleneck" (NVIDIA
  nccl-tests issue #196, S. Jeaugey), and its rings over eight rails send each GPU's share
  through that GPU's own card (PXN keeps traffic on its rail, "each GPU still tries to use
  its local NIC as much as possible": NVIDIA, "Doubling all2all performance with NCCL 2.12",
  2022). We cost that as the hierarchical scheme the gradient all-reduce already uses
  (Jia et al. 2018, §3; ``sim.cost.comm.hierarchical_allreduce``): over ``n`` GPUs on each
  of ``k`` servers, a ring reduce-scatter inside each server over NVLink
  (``(n−1)/n · b``), each GPU's ``1/n`` shard across the servers through its own NIC (an
  all-reduce ``2(k−1)/k · b/n``, an all-gather or reduce-scatter ``(k−1)/k · b/n``), a ring
  all-gather inside each server. An all-gather skips the first part, a reduce-scatter the
  last. Where a server has fewer NICs than GPUs, the GPUs that share a card share its
  bandwidth (``sim.cost.links.busiest_nic_flows``). It is a stand-in, not NCCL's exact
  algorithm: with eight NICs "Tree will struggle to get better performance than ring"
  (same thread), and a ring over eight rails moves NVLink and NIC bytes at once where the
  phases here run one after another, so for large messages across two servers this layout
  is somewhat slower than NCCL's best and far faster than the flat ring on one NIC;
* **the context-parallel ring** passes key/value blocks point to point to the next rank
  (``sim.cost.context_comm.context_ring``): only the hops that cross a server boundary use a NIC.
  With consecutive ranks on one server, a ring of ``c`` over ``k`` servers has ``k``
  crossing hops per step, one out of each server, each on its own card, and a step lasts
  its slowest hop: the crossing one. The engine already runs the ring hop by hop through
  the ports, so only the NICs' sharing is added here (``context_ring_flows_per_nic``).

One action's collectives of a group are summed by kind (:func:`tensor_parallel_volumes`:
bytes and count per kind) and laid out as up to three phases, in this order:
``before`` (inside each server: every reduce-scatter half), ``across`` (the NICs),
``after`` (inside each server: every all-gather half); each phase pays one link latency per
ring step. A group on one server, or with one member per server, stays the flat ring of
``sim.cost.comm`` (each member's NIC then carries its own hop: the same path). The engine
(``sim.engine.groups``) and the planner (``planner.search.costs``) both take their bytes,
steps and latencies from here. Pure Python, no SimPy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from sim.cost.comm import HALVES, CommCost, ring_bytes, ring_steps
from sim.cost.fabric_comm import fabric_calls_across
from sim.cost.links import busiest_nic_flows

if TYPE_CHECKING:
    from sim.core.model_spec import LayerSpec
    from sim.core.specs import ClusterSpec
    from sim.cost.tiers import Crossing

__all__ = ["PHASES", "across_bytes", "add_volumes", "context_ring_flows_per_nic", "is_hierarchical", "spanning_phases",
           "tensor_parallel_volumes", "within_bytes"]

PHASES = ("before", "across", "after")
"""The phases of a group's collectives across servers, in the order they run (their numbers
in the engine's flow labels are their indices)."""

_WITHIN = {"before": ("all-reduce", "reduce-scatter"), "after": ("all-reduce", "all-gather")}
"""Kinds with a ring half inside each server before the NICs (reduce-scatters) and after (all-gathers)."""

Volumes = Mapping[str, tuple[float, int]]
"""Collectives of one action by kind (``HALVES``' keys): (summed bytes, how many)."""


def is_hierarchical(members_per_node: Sequence[int]) -> bool:
    """Whether a group of ``members_per_node[j]`` devices on server j runs hierarchically: it
    spans servers and some server holds two or more (else it is the flat ring)."""
    return len(members_per_node) > 1 and max(members_per_node) > 1


def tensor_parallel_volumes(layers: Sequence[LayerSpec], phase: str | tuple[str, ...], samples: int = 1, *,
                            beside: bool | None = None) -> dict[str, tuple[float, int]]:
    """``layers``' tensor-parallel collectives in ``phase`` (``sim.cost.tensor_comm.PHASES``, one or
    several) on ``samples`` samples, by kind: (bytes each collective gathers or reduces, summed; count)
    (``LayerSpec.tp_collectives``; Shoeybi et al. 2019, §3; Korthikanti et al. 2022, §4.2.2);
    ``beside`` True or False: only those that are, or are not, marked to run beside a column-parallel
    linear's backward (``sim.cost.comm.tensor_parallel_bytes_and_steps``)."""
    phases = (phase,) if isinstance(phase, str) else phase
    volumes: dict[str, tuple[float, int]] = {}
    for layer in layers:
        for c in layer.tp_collectives:
            if c.phase in phases and (beside is None or c.beside is beside):
                nbytes, count = volumes.get(c.kind, (0.0, 0))
                volumes[c.kind] = (nbytes + c.bytes * samples, count + 1)
    return volumes


def add_volumes(a: Volumes, b: Volumes) -> dict[str, tuple[float, int]]:
    """Two actions' collectives together (a full recompute adds the forward's to the backward's)."""
    none = (0.0, 0)
    return {kind: (a.get(kind, none)[0] + b.get(kind, none)[0], a.get(kind, none)[1] + b.get(kind, none)[1])
            for kind in sorted({*a, *b})}


def within_bytes(volumes: Volumes, members: int, phase: str) -> tuple[float, int]:
    """Bytes each of a server's ``members`` GPUs sends in ring ``phase`` (``before`` or
    ``after``) inside the server, and its ring steps: one ring half of every kind that has one."""
    nbytes, steps = 0.0, 0
    for kind in _WITHIN[phase]:
        b, count = volumes.get(kind, (0.0, 0))
        nbytes += ring_bytes(members, b, halves=1)
        steps += count * ring_steps(members, halves=1)
    return nbytes, steps


def across_bytes(volumes: Volumes, servers: int, members: int) -> tuple[float, int]:
    """Bytes each GPU of a server of ``members`` sends through its NIC across ``servers``
    servers (the ring over the servers of its ``1/members`` shard: all-reduce ``2(k−1)/k``,
    the others ``(k−1)/k``), and the ring steps."""
    nbytes, steps = 0.0, 0
    for kind in sorted(volumes):
        b, count = volumes[kind]
        nbytes += ring_bytes(servers, b, halves=HALVES[kind]) / members
        steps += count * ring_steps(servers, halves=HALVES[kind])
    return nbytes, steps


def spanning_phases(volumes: Volumes, members_per_node: Sequence[int], cluster: ClusterSpec, *,
                    flows_per_nic: int | None = None, crossing: Crossing | None = None) -> dict[str, CommCost]:
    """The phases (``PHASES``' names that carry bytes) of a hierarchical group's collectives.

    Inside each server the widest server sets the time and steps; across, each GPU of the
    smallest server carries the largest shard (as ``sim.cost.comm.hierarchical_allreduce``).
    ``flows_per_nic``: cross-server flows on the busiest NIC (default: the smallest server's
    GPUs, ``busiest_nic_flows``). Collectives move at each link's collective bandwidth. On a
    fabric the across phase is each kind's NCCL algorithm and protocol over the tiers ``crossing``
    (default: ``sim.cost.fabric_comm.nominal_crossing``), by the size of one call
    (``fabric_calls_across``), as the gradient all-reduce's is.
    """
    k, widest, smallest = len(members_per_node), max(members_per_node), min(members_per_node)
    intra, inter = cluster.intra_node, cluster.inter_node
    flows = busiest_nic_flows(cluster, smallest) if flows_per_nic is None else flows_per_nic
    phases = {}
    for name in PHASES:
        if name == "across":
            nbytes, steps = across_bytes(volumes, k, smallest)
            link, rate = inter, inter.bandwidth_bytes_per_s / flows
        else:
            nbytes, steps = within_bytes(volumes, widest, name)
            link, rate = intra, intra.bandwidth_bytes_per_s
        if nbytes > 0 or steps > 0:
            phases[name] = CommCost(bytes_per_device=nbytes, flow_bytes=nbytes / link.collective_efficiency,
                                    steps=steps, link=link, across_servers=link is inter, rate_bytes_per_s=rate)
    if cluster.fabric is not None and "across" in phases:
        calls = [(kind, ring_bytes(k, b, halves=HALVES[kind]) / smallest, b / count, count)
                 for kind, (b, count) in sorted(volumes.items()) if count > 0]
        phases["across"] = fabric_calls_across(phases["across"], calls, members_per_node, cluster, flows, crossing)
    return phases


def context_ring_flows_per_nic(cluster: ClusterSpec, tensor_parallel: int) -> int:
    """Ring-attention flows on a server's busiest NIC when a replica's context-parallel rings
    span servers: each of the ``tensor_parallel`` rings (one per tensor rank) has one hop out
    of each server it spans, sent by consecutive GPUs (``busiest_nic_flows``)."""
    return busiest_nic_flows(cluster, tensor_parallel)
