"""Flows: the traffic of a compiled plan, grouped into flow kinds over classes of ports.

A *flow* is one transfer from one device to another: ``(src, dst, label, bytes)``. Between
neighbouring stages on different ranks the traffic is *split-concat*: each sender ships
every receiver the part of its slice that the receiver's slice needs
(``sim.cost.sample_overlaps``), forward activations one way and their gradients back; the
gradient all-reduce adds its own flows (``sim.engine.collectives``).

Each flow crosses two *ports*: inside a server, the sender's out-port and the receiver's
in-port (``cluster.intra_node``, one per GPU, full duplex); between servers, the sender's
NIC out and the receiver's NIC in (``cluster.inter_node``, ``nics_per_node`` per server).
Devices that behave identically are merged into classes (``sim.engine.symmetry``), and so
are ports: real flows with the same label between the same two device classes become one
*flow kind*, which crosses *port classes* with a weight (how many real flows of the kind
cross one port of the class).
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from sim.cost import sample_overlaps
from sim.engine.workload import FlowKind, PortClass

if TYPE_CHECKING:
    from sim.engine.classes import FaultView

__all__ = ["PortTable", "flow_kinds", "flow_paths", "kinds_by_class", "p2p_flows", "static_rates"]


def p2p_flows(plan, model, microbatch_size: int) -> list[tuple[int, int, tuple, float]]:
    """Split-concat between neighbouring stages on different ranks: (src, dst, label, bytes).

    The micro-batch splits over each stage's data-parallel replicas; with tensor or context
    parallelism the device at one position of a replica (its tensor and context rank) sends
    its share to the device at the same position of each overlapping replica of the next
    stage (Megatron sends each tensor rank's 1/t of the activation; ``model`` is that share).
    """
    flows = []
    ranks = plan.stage_ranks
    for s in range(plan.num_stages - 1):
        if ranks[s] == ranks[s + 1]:
            continue
        per_sample = model.boundary_bytes[plan.stages[s].layers[1]]
        senders, receivers = plan.replicas(s), plan.replicas(s + 1)
        for position in range(plan.group_size):
            column = tuple(replica[position] for replica in senders)
            target = tuple(replica[position] for replica in receivers)
            for src, dst, start, end in sample_overlaps(microbatch_size, column, target):
                flows.append((src, dst, ("F", s), per_sample * (end - start)))
                flows.append((dst, src, ("B", s + 1), per_sample * (end - start)))
    return flows


class PortTable:
    """Real port ids, their classes and bandwidths (a degraded port has its own class)."""

    def __init__(self, cluster, class_of, card_of, devices, nic_ids):
        self.cluster = cluster
        self.class_of = class_of
        self.card_of = card_of
        self.ids: dict[tuple, int] = {}
        self.info: list[tuple[str, float, int]] = []  # name, bandwidth, size
        sizes = defaultdict(int)
        for d in devices:
            sizes[("out", class_of[d])] += 1
            sizes[("in", class_of[d])] += 1
        for n in nic_ids:
            sizes[("nic-out", card_of[n])] += 1
            sizes[("nic-in", card_of[n])] += 1
        self.sizes = sizes

    def class_ids(self, real: tuple[tuple, tuple], bandwidths: tuple[float, float]) -> tuple[int, int]:
        """The port classes of a path's real ports (a GPU's ports by its class, a NIC's by its card's)."""
        (out_name, out_port), (in_name, in_port) = real
        of = self.class_of if out_name == "out" else self.card_of
        ids = self.ids
        first, second = (out_name, of[out_port]), (in_name, of[in_port])
        a = ids[first] if first in ids else self._id(first, bandwidths[0])
        b = ids[second] if second in ids else self._id(second, bandwidths[1])
        return a, b

    def link(self, src: int, dst: int):
        """The ``LinkSpec`` of a transfer src -> dst."""
        c = self.cluster
        return c.intra_node if c.node_of(src) == c.node_of(dst) else c.inter_node

    def _id(self, key: tuple, bandwidth: float) -> int:
        if key not in self.ids:
            self.ids[key] = len(self.info)
            self.info.append((f"{key[0]}:{key[1]}", bandwidth, self.sizes[key]))
        return self.ids[key]

    def classes(self) -> tuple[PortClass, ...]:
        return tuple(
            PortClass(index=i, name=name, bandwidth_bytes_per_s=bw, size=size) for i, (name, bw, size) in enumerate(self.info)
        )


def _operation(label: tuple, src: int, together: dict[int, int]) -> tuple:
    """Flows issued together: the sends of one boundary by a class of identical devices (they
    always send at the same instant), or one all-reduce phase."""
    return label if label[0] == "AR" else (label, together[src])


def flow_paths(flows, cluster, faults: FaultView) -> list[tuple[tuple, tuple[float, float], float]]:
    """Each flow's (real port keys, their bandwidths, latency): inside a server the sender's
    out-port and the receiver's in-port, between servers their NICs; a slow link's factor applied."""
    per_node, nics = cluster.devices_per_node, cluster.nics_per_node
    intra, inter = cluster.intra_node, cluster.inter_node
    intra_bw, inter_bw = (intra.bandwidth_bytes_per_s,) * 2, (inter.bandwidth_bytes_per_s,) * 2
    slow_ports, slow_nics = faults.slow_ports, faults.slow_nics
    paths = []
    for src, dst, _, _ in flows:
        node = src // per_node
        if node == dst // per_node:
            real = (("out", src), ("in", dst))
            bandwidths = intra_bw if not slow_ports else tuple(
                intra.bandwidth_bytes_per_s * slow_ports.get(d, 1.0) for d in (src, dst))
            paths.append((real, bandwidths, intra.latency_s))
        else:  # ``ClusterSpec.nic_of``, spelled out on this per-flow path
            out = node * nics + (src % per_node) * nics // per_node
            into = (dst // per_node) * nics + (dst % per_node) * nics // per_node
            real = (("nic-out", out), ("nic-in", into))
            bandwidths = inter_bw if not slow_nics else tuple(
                inter.bandwidth_bytes_per_s * slow_nics.get(n, 1.0) for n in (out, into))
            paths.append((real, bandwidths, inter.latency_s))
    return paths


def static_rates(flows, paths, together) -> list[float]:
    """Each flow's rate when only the operation it belongs to runs (``_operation``): its slowest
    port's bandwidth over the real flows of that operation crossing it."""
    op_port_load: dict[tuple, dict[tuple, int]] = defaultdict(lambda: defaultdict(int))
    operations = [_operation(label, src, together) for src, _, label, _ in flows]
    for operation, (real, _, _) in zip(operations, paths):
        load = op_port_load[operation]
        for port in real:
            load[port] += 1
    return [min(bw / op_port_load[operation][port] for bw, port in zip(bandwidths, real))
            for operation, (real, bandwidths, _) in zip(operations, paths)]


def flow_kinds(flows, paths, rates, class_of, ports: PortTable, *, by_rate: bool = False) -> list[FlowKind]:
    """Group real flows into kinds (same label, classes and bytes), sorted by their key.

    ``rates`` are the flows' static rates (:func:`static_rates`); a kind's is its first flow's.
    With ``by_rate`` flows of different rates or latencies are different kinds (classes of a
    contention-free replay, ``sim.engine.symmetry.refine_behaviour``, may mix them).
    """
    grouped: dict[tuple, list] = defaultdict(list)
    port_ids = [ports.class_ids(real, bandwidths) for real, bandwidths, _ in paths]  # numbered in flow order
    for i, ((src, dst, label, nbytes), (_, _, latency)) in enumerate(zip(flows, paths)):
        key = (label, class_of[src], class_of[dst], round(nbytes, 6))
        grouped[key + ((rates[i], latency) if by_rate else ())].append(i)
    counts = defaultdict(int)
    for d in class_of:
        counts[class_of[d]] += 1
    kinds = []
    for (label, src_class, dst_class, *_), members in sorted(grouped.items(),
                                                            key=lambda item: (repr(item[0][:4]), item[0][4:])):
        src, dst, _, nbytes = flows[members[0]]
        latency, ids = paths[members[0]][2], port_ids[members[0]]
        per_port = defaultdict(int)
        for m in members:
            for port_id in port_ids[m]:
                per_port[port_id] += 1
        weights = tuple((pid, per_port[pid] / ports.info[pid][2]) for pid in ids)
        link = ports.link(src, dst)
        kinds.append(
            FlowKind(
                index=len(kinds),
                label=label,
                src_class=src_class,
                dst_class=dst_class,
                bytes=nbytes,
                latency_s=latency,
                ports=weights,
                static_rate_bytes_per_s=rates[members[0]],
                send_bytes_per_device=nbytes * len(members) / counts[src_class],
                recv_bytes_per_device=nbytes * len(members) / counts[dst_class],
                issue_s=link.send_issue_s(nbytes) * len(members) / counts[src_class],
                receive_s=(link.recv_overhead_s if nbytes > 0 else 0.0) * len(members) / counts[dst_class],
            )
        )
    return kinds


def kinds_by_class(kinds: list[FlowKind]) -> tuple[dict, dict]:
    """Point-to-point kinds leaving and entering each class, by label."""
    out_kinds: dict[int, dict] = defaultdict(lambda: defaultdict(list))
    in_kinds: dict[int, dict] = defaultdict(lambda: defaultdict(list))
    for k in kinds:
        if k.label[0] in ("F", "B"):
            out_kinds[k.src_class][k.label].append(k.index)
            in_kinds[k.dst_class][k.label].append(k.index)
    return out_kinds, in_kinds
