"""Context parallelism's ring: what ring attention's key/value blocks cost per action.

With context parallelism each of a group's c devices holds 1/c of every sequence, and its
queries need every earlier key: each attention layer passes the key/value blocks around the
group as a ring, c − 1 steps in which every device sends the block it holds to the next device
and receives the previous one's (Liu, Zaharia and Abbeel 2023, "Ring Attention with Blockwise
Transformers", §3; Megatron-Core's ``cp_comm_type="p2p"``). The backward sends the blocks again
with their gradients, twice the bytes. ``LayerSpec.cp_ring_bytes`` is one layer's c − 1 blocks
for one sample.

Priced two ways: by the link's alpha-beta figures (the bytes point to point at the full
bandwidth, c − 1 latencies an action), or, on a link with a measured ``ring-shift`` fit
(``dapple-run profile`` times ``batch_isend_irecv`` of a block to the next rank and from the
previous, as ``runtime.model.ring_attention`` does), every layer's c − 1 shifts at the fit's
latency and the bytes at its bandwidth (``sim.cost.measured_comm.measured_ring_terms``). Pure
Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.cost.comm import CommCost
from sim.cost.measured_comm import measured_ring_terms

if TYPE_CHECKING:
    from sim.core.specs import ClusterSpec, LinkSpec

__all__ = ["context_ring", "context_ring_s"]


def context_ring_s(nbytes: float, context_parallel: int, link: LinkSpec, *, flows_per_port: int = 1,
                   rings: int = 1) -> float:
    """Seconds of ring attention's blocks alone: ``nbytes`` (all c − 1 steps' key/value blocks,
    ``LayerSpec.cp_ring_bytes`` × samples) point to point at ``link``'s full bandwidth, plus c − 1
    latencies (Liu et al. 2023, §3; each device sends its blocks to the next of its group).
    Across servers ``link`` is the crossing hop's (the slowest of each step), its NIC shared by
    ``flows_per_port`` rings' crossing hops (``sim.cost.group_comm.context_ring_flows_per_nic``).
    On a link with a measured ``ring-shift`` fit (``dapple-run profile``) each of the ``rings``
    layers' rings pays its c − 1 shifts at the fit's latency and the bytes at its bandwidth
    (``sim.cost.measured_comm.measured_ring_terms``): what gloo's ``batch_isend_irecv`` costs, a
    per-call cost of milliseconds that the alpha-beta form (one ring's latencies an action) leaves out."""
    measured = measured_ring_terms(link.collectives, context_parallel, nbytes, (context_parallel - 1) * rings)
    if measured is not None:
        return measured[0] + measured[1] * flows_per_port
    return nbytes * flows_per_port / link.bandwidth_bytes_per_s + (context_parallel - 1) * link.latency_s


def context_ring(ring_bytes_per_sample: float, samples: int, context_parallel: int, link: LinkSpec,
                 cluster: ClusterSpec, *, rings: int = 1) -> tuple[CommCost, CommCost]:
    """(forward, backward) of the context-parallel ring for one action: the forward passes keys
    and values, the backward keys, values and their gradients (twice the bytes), c − 1 steps each.
    On a link with a measured ``ring-shift`` fit, ``rings`` layers' rings of c − 1 shifts each at
    its latency and bandwidth (``context_ring_s``): the flow is charged the bytes that take the
    measured byte time at the port's bandwidth, as ``sim.cost.comm.ring_collective`` does."""
    steps, across, rate = context_parallel - 1, link is cluster.inter_node, link.bandwidth_bytes_per_s
    costs = []
    for nbytes in (ring_bytes_per_sample * samples, 2 * ring_bytes_per_sample * samples):
        measured = measured_ring_terms(link.collectives, context_parallel, nbytes, steps * rings)
        costs.append(CommCost(bytes_per_device=nbytes, flow_bytes=nbytes, steps=steps, link=link, across_servers=across,
                              rate_bytes_per_s=rate) if measured is None else
                     CommCost(bytes_per_device=nbytes, flow_bytes=measured[1] * rate, steps=steps * rings, link=link,
                              across_servers=across, rate_bytes_per_s=rate, measured_latency_s=measured[0]))
    return costs[0], costs[1]
