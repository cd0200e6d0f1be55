"""Which link a transfer crosses: a GPU's port inside a server, or the NICs between servers.

A cluster (``sim.core.specs.ClusterSpec``) has two kinds of port. GPUs of one server talk
through their own ports (``intra_node``: NVLink, NVSwitch, PCIe); GPUs of different servers
through the servers' NICs (``inter_node``: InfiniBand, Ethernet). A group of devices that
talks as one (a ring, a sender and its receiver) is as slow as its slowest hop, so it
crosses the inter-node link as soon as it spans two servers. That is the one rule, in two
forms:

* :func:`group_link` — for a set of real device ids (the engine's compiler, the plan's
  policies): the servers they sit on;
* :func:`span_link` — for a planner that knows only a group's *shape*: how many servers it
  spans, ``contiguous_span`` of a group of consecutive devices placed from a server's first
  (the planners place replicas in whole units of ``tensor × context`` devices that way).

And how many of a server's cross-server flows share its busiest NIC
(:func:`busiest_nic_flows`): GPU ``l`` of a server sends through NIC ``l·nics // per_node``
(``ClusterSpec.nic_of``), so the first ``g`` GPUs load NIC 0 with ``min(g, ⌈per_node/nics⌉)``
flows. A group's members by server, for its collectives' hierarchical path
(``sim.cost.group_comm``): :func:`by_server` for real device ids, :func:`members_per_node` for
a planner's shape (every ``stride``-th of consecutive devices from a server's first). Pure
Python, no SimPy.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.core.specs import ClusterSpec, LinkSpec

__all__ = ["busiest_nic_flows", "by_server", "contiguous_span", "embedding_group_link", "group_link",
           "members_per_node", "same_server", "span_link"]


def span_link(cluster: ClusterSpec, servers: int) -> LinkSpec:
    """The link a group spanning ``servers`` servers crosses: inside one, or between them."""
    return cluster.intra_node if servers <= 1 else cluster.inter_node


def same_server(cluster: ClusterSpec, devices: Iterable[int]) -> bool:
    """Whether every one of ``devices`` (global ids) sits on one server."""
    return len({cluster.node_of(d) for d in devices}) <= 1


def group_link(cluster: ClusterSpec, devices: Iterable[int]) -> LinkSpec:
    """The link a group of real device ids crosses (``span_link`` of the servers they sit on)."""
    return span_link(cluster, 1 if same_server(cluster, devices) else 2)


def contiguous_span(cluster: ClusterSpec, members: int) -> int:
    """Servers that ``members`` consecutive devices from a server's first one span: ⌈members / per_node⌉."""
    return -(-members // cluster.devices_per_node)


def busiest_nic_flows(cluster: ClusterSpec, gpus: int) -> int:
    """Cross-server flows on a server's busiest NIC when its first ``gpus`` GPUs each send one
    (``ClusterSpec.nic_of``: GPU l through NIC ``l·nics // per_node``; NIC 0 is the busiest)."""
    per_nic = -(-cluster.devices_per_node // cluster.nics_per_node)
    return max(1, min(gpus, per_nic))


def by_server(cluster: ClusterSpec, devices: Iterable[int]) -> list[list[int]]:
    """``devices`` (global ids) split by the server they sit on, servers and devices in order."""
    nodes: dict[int, list[int]] = {}
    for d in sorted(devices):
        nodes.setdefault(cluster.node_of(d), []).append(d)
    return [nodes[n] for n in sorted(nodes)]


def members_per_node(cluster: ClusterSpec, members: int, stride: int = 1) -> tuple[int, ...]:
    """How many of a group's ``members`` sit on each server it spans when they are every
    ``stride``-th of consecutive devices placed from a server's first (a tensor group: stride 1;
    a context-parallel or gradient group: stride ``tensor_parallel``, one device per tensor rank)."""
    counts: dict[int, int] = {}
    for i in range(members):
        node = i * stride // cluster.devices_per_node
        counts[node] = counts.get(node, 0) + 1
    return tuple(counts[n] for n in sorted(counts))


def embedding_group_link(plan, cluster: ClusterSpec) -> LinkSpec | None:
    """The link a tied embedding's gradient all-reduce crosses: between the first and the last
    stage's devices of one tensor rank (Megatron-LM's embedding group), inside a server if
    they share one, else between servers; None for a plan of one stage."""
    first, last = plan.stages[0].devices, plan.stages[-1].devices
    if plan.num_stages == 1 or first == last:
        return None
    links = [group_link(cluster, (a, b)) for a, b in zip(first, last)]
    return cluster.intra_node if all(link is cluster.intra_node for link in links) else cluster.inter_node
