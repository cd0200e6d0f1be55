"""Flows: the traffic of a compiled plan, grouped into flow kinds over classes of ports.

A *flow* is one transfer from one device to another: ``(src, dst, label, bytes)``. Between
neighbouring stages on different ranks the traffic is *split-concat*: each sender ships
every receiver the part of its slice that the receiver's slice needs
(``sim.cost.split.sample_overlaps``), forward activations one way and their gradients back; the
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

from sim.cost.links import group_link
from sim.cost.split import sample_overlaps
from sim.engine.workload import FlowKind, PortClass

if TYPE_CHECKING:
    from sim.engine.fault_view import FaultView

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
    """Real port ids, their classes and bandwidths (a degraded port has its own class).

    A port's class is its GPU's class (intra-node ports) or its card's (NICs), further split by
    ``split`` (real port key -> sub-class, ``port_split``) where the device classes alone do not
    say which flows a port carries."""

    def __init__(self, cluster, class_of, card_of, devices, nic_ids, split: dict | None = None):
        self.cluster = cluster
        self.class_of = class_of
        self.card_of = card_of
        self.split = split
        self.ids: dict[tuple, int] = {}
        self.info: list[tuple[str, float, int]] = []  # name, bandwidth, size
        sizes = defaultdict(int)
        sub = (lambda key: split.get(key, 0)) if split else (lambda key: 0)
        for d in devices:
            sizes[("out", class_of[d], sub(("out", d)))] += 1
            sizes[("in", class_of[d], sub(("in", d)))] += 1
        for n in nic_ids:
            sizes[("nic-out", card_of[n], sub(("nic-out", n)))] += 1
            sizes[("nic-in", card_of[n], sub(("nic-in", n)))] += 1
        self.sizes = sizes

    def class_ids(self, real: tuple[tuple, tuple], bandwidths: tuple[float, float]) -> tuple[int, int]:
        """The port classes of a path's real ports (a GPU's ports by its class, a NIC's by its card's)."""
        (out_name, out_port), (in_name, in_port) = real
        of = self.class_of if out_name == "out" else self.card_of
        ids, split = self.ids, self.split
        first = (out_name, of[out_port], split.get(real[0], 0) if split else 0)
        second = (in_name, of[in_port], split.get(real[1], 0) if split else 0)
        a = ids[first] if first in ids else self._id(first, bandwidths[0])
        b = ids[second] if second in ids else self._id(second, bandwidths[1])
        return a, b

    def link(self, src: int, dst: int):
        """The ``LinkSpec`` of a transfer src -> dst (``sim.cost.links.group_link``)."""
        return group_link(self.cluster, (src, dst))

    def _id(self, key: tuple, bandwidth: float) -> int:
        if key not in self.ids:
            self.ids[key] = len(self.info)
            self.info.append((f"{key[0]}:{key[1]}" + (f"/{key[2]}" if key[2] else ""), bandwidth, self.sizes[key]))
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
        # ``sim.cost.links.group_link``'s rule (one server: its GPU ports), spelled out on this per-flow path
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


def port_split(flows, paths, class_of, card_of, max_rounds: int = 8) -> dict[tuple, int]:
    """Split ports of one class by the flows they really carry (for ``Symmetry.optimistic``).

    Colour refinement over real ports only: a port's colour is its device's or card's class,
    then the multiset of (flow label, sending and receiving classes, bytes, direction, the
    colour of the port at the flow's other end) of the flows crossing it, until nothing
    splits. Returns each real port's sub-class (0 for most). Still splitting after
    ``max_rounds``, every port gets its own.
    """
    key_id: dict[tuple, int] = {}
    keys = [key_id.setdefault((label, class_of[src], class_of[dst], round(nbytes, 6)), len(key_id))
            for src, dst, label, nbytes in flows]
    colour: dict[tuple, object] = {}
    for real, _, _ in paths:
        for name, port in real:
            if (name, port) not in colour:
                colour[(name, port)] = (name, class_of[port] if name in ("out", "in") else card_of[port])
    ports = list(colour)
    ids: dict = {}
    colour = {p: ids.setdefault(colour[p], len(ids)) for p in ports}
    count = len(ids)
    for _ in range(max_rounds):
        seen: dict[tuple, list] = defaultdict(list)
        for k, (real, _, _) in zip(keys, paths):
            a, b = real
            seen[a].append((k, 0, colour[b]))
            seen[b].append((k, 1, colour[a]))
        ids = {}
        colour = {p: ids.setdefault((colour[p], tuple(sorted(seen[p]))), len(ids)) for p in ports}
        if len(ids) == count:
            break
        count = len(ids)
    else:
        return {p: i + 1 for i, p in enumerate(ports)}
    first: dict[tuple, int] = {}  # the first colour met of each (name, class) is sub-class 0
    base = {}
    for p in ports:
        name, port = p
        group = (name, class_of[port] if name in ("out", "in") else card_of[port])
        base.setdefault(group, {}).setdefault(colour[p], len(base[group]))
        first[p] = base[group][colour[p]]
    return first


def flow_kinds(flows, paths, rates, class_of, ports: PortTable, *, by_rate: bool = False,
               by_path: bool = False) -> list[FlowKind]:
    """Group real flows into kinds (same label, classes and bytes), sorted by their key.

    ``rates`` are the flows' static rates (:func:`static_rates`); a kind's is its first flow's.
    With ``by_rate`` flows of different rates or latencies are different kinds (classes of a
    contention-free replay, ``sim.engine.symmetry.refine_behaviour``, may mix them). With
    ``by_path`` flows that cross different port classes are different kinds, *siblings*
    (``FlowKind.sibling``) that the replay checks move together (``Symmetry.optimistic``).
    """
    grouped: dict[tuple, list] = defaultdict(list)
    port_ids = [ports.class_ids(real, bandwidths) for real, bandwidths, _ in paths]  # numbered in flow order
    for i, ((src, dst, label, nbytes), (_, _, latency)) in enumerate(zip(flows, paths)):
        key = (label, class_of[src], class_of[dst], round(nbytes, 6))
        grouped[key + ((rates[i], latency) if by_rate else ()) + ((port_ids[i],) if by_path else ())].append(i)
    # kinds split by path: siblings are those of one label, classes, bytes and link (intra- or
    # inter-node); the replay checks that each sibling group leaves together
    def family(key: tuple, members: list) -> tuple:
        src, dst, _, _ = flows[members[0]]
        return key[:4] + (ports.link(src, dst) is ports.cluster.intra_node,)

    siblings: dict[tuple, int] = {}
    if by_path:
        paths_of: dict[tuple, int] = defaultdict(int)
        for key, members in grouped.items():
            paths_of[family(key, members)] += 1
        for key in sorted((k for k, n in paths_of.items() if n > 1), key=repr):
            if key[0][0] != "AR":  # an all-reduce ends at one instant for all: its flows need not agree
                siblings[key] = len(siblings)
    counts = defaultdict(int)
    for d in class_of:
        counts[class_of[d]] += 1
    # per-device bytes and charges of kinds split by path go whole to the first of them (the
    # others carry 0): the same sums, without rounding a device's bytes into fractions
    whole: dict[tuple, int] = defaultdict(int)
    if by_path:
        for key, members in grouped.items():
            whole[family(key, members)] += len(members)
    kinds = []
    for key, members in sorted(grouped.items(), key=lambda item: (repr(item[0][:4]), item[0][4:])):
        label, src_class, dst_class = key[:3]
        src, dst, _, nbytes = flows[members[0]]
        counted = whole.pop(family(key, members), 0) if by_path else len(members)
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
                send_bytes_per_device=nbytes * counted / counts[src_class],
                recv_bytes_per_device=nbytes * counted / counts[dst_class],
                issue_s=link.send_issue_s(nbytes) * counted / counts[src_class],
                receive_s=(link.recv_overhead_s if nbytes > 0 else 0.0) * counted / counts[dst_class],
                sibling=siblings.get(family(key, members), -1) if by_path else -1,
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
