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
    from sim.engine.compile import FaultView

__all__ = ["PortTable", "flow_kinds", "kinds_by_class", "p2p_flows"]


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

    def __init__(self, cluster, class_of, card_of, devices, nic_ids, faults: FaultView):
        self.cluster = cluster
        self.class_of = class_of
        self.card_of = card_of
        self.faults = faults
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

    def path(self, src: int, dst: int) -> tuple[tuple[tuple, tuple], tuple[int, int], tuple[float, float], float]:
        """(real port keys, port class ids, their bandwidths, latency) of a transfer src -> dst."""
        c, f = self.cluster, self.faults
        if c.node_of(src) == c.node_of(dst):
            real = (("out", src), ("in", dst))
            keys = (("out", self.class_of[src]), ("in", self.class_of[dst]))
            link = c.intra_node
            factors = (f.slow_ports.get(src, 1.0), f.slow_ports.get(dst, 1.0))
        else:
            nics = (c.nic_of(src), c.nic_of(dst))
            real = (("nic-out", nics[0]), ("nic-in", nics[1]))
            keys = (("nic-out", self.card_of[nics[0]]), ("nic-in", self.card_of[nics[1]]))
            link = c.inter_node
            factors = (f.nic_factor(nics[0]), f.nic_factor(nics[1]))
        bandwidths = tuple(link.bandwidth_bytes_per_s * factor for factor in factors)
        ids = tuple(self._id(key, bw) for key, bw in zip(keys, bandwidths))
        return real, ids, bandwidths, link.latency_s

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


def flow_kinds(flows, class_of, together, ports: PortTable) -> list[FlowKind]:
    """Group real flows into kinds (same label, classes and bytes), sorted by their key.

    A kind's static rate is what its slowest port gives it when only the operation it
    belongs to runs (``_operation``): the port's bandwidth over the real flows of that
    operation crossing it. ``together`` maps a device to its class with the reduction on,
    so that the operations are the same with ``symmetric=False``.
    """
    grouped: dict[tuple, list] = defaultdict(list)
    op_port_load: dict[tuple, dict[tuple, int]] = defaultdict(lambda: defaultdict(int))
    paths = []
    for src, dst, label, nbytes in flows:
        real, ids, bandwidths, latency = ports.path(src, dst)
        paths.append((real, ids, bandwidths, latency))
        grouped[(label, class_of[src], class_of[dst], round(nbytes, 6))].append(len(paths) - 1)
        for port in real:
            op_port_load[_operation(label, src, together)][port] += 1
    counts = defaultdict(int)
    for d in class_of:
        counts[class_of[d]] += 1
    kinds = []
    for (label, src_class, dst_class, _), members in sorted(grouped.items(), key=lambda item: repr(item[0])):
        src, dst, _, nbytes = flows[members[0]]
        real, ids, bandwidths, latency = paths[members[0]]
        per_port = defaultdict(int)
        for m in members:
            for port_id in paths[m][1]:
                per_port[port_id] += 1
        weights = tuple((pid, per_port[pid] / ports.info[pid][2]) for pid in ids)
        loads = op_port_load[_operation(label, src, together)]
        static_rate = min(bw / loads[port] for bw, port in zip(bandwidths, real))
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
                static_rate_bytes_per_s=static_rate,
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
