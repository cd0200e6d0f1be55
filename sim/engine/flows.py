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

from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Callable

import numpy as np

from sim.cost.links import group_link
from sim.cost.split import sample_overlaps
from sim.cost.tiers import uplink_capacity_bytes_per_s
from sim.engine.flow_table import PORT_NAMES, FlowTable, RoundedBytes, row_ids
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
        # which replicas overlap depends on their counts, not on the position: once per boundary
        overlaps = sample_overlaps(microbatch_size, tuple(range(len(senders))), tuple(range(len(receivers))))
        for position in range(plan.group_size):
            for a, b, start, end in overlaps:
                src, dst = senders[a][position], receivers[b][position]
                flows.append((src, dst, ("F", s), per_sample * (end - start)))
                flows.append((dst, src, ("B", s + 1), per_sample * (end - start)))
    return flows


class PortTable:
    """Real port ids, their classes and bandwidths (a degraded port has its own class).

    A port's class is its GPU's class (intra-node ports) or its card's (NICs), further split by
    ``split`` (real port key -> sub-class, ``port_split``) where the device classes alone do not
    say which flows a port carries."""

    def __init__(self, cluster, class_of, card_of, devices, nic_ids, split: dict | None = None, *,
                 each_uplink: bool = False):
        self.cluster = cluster
        self.each_uplink = each_uplink
        """Every fabric uplink its own class (a replay without symmetry); else one class per tier and
        direction, a slow uplink apart (``uplink_ids``)."""
        self.class_of = class_of
        self.card_of = card_of
        self.split = split
        self.ids: dict[tuple, int] = {}
        self.info: list[tuple[str, float, int]] = []  # name, bandwidth, size
        sizes = defaultdict(int)
        if split:
            for d in devices:
                sizes[("out", class_of[d], split.get(("out", d), 0))] += 1
                sizes[("in", class_of[d], split.get(("in", d), 0))] += 1
            for n in nic_ids:
                sizes[("nic-out", card_of[n], split.get(("nic-out", n), 0))] += 1
                sizes[("nic-in", card_of[n], split.get(("nic-in", n), 0))] += 1
        else:  # one port class per device class (card class): its size is the class's
            for names, owners, of in ((("out", "in"), devices, class_of), (("nic-out", "nic-in"), nic_ids, card_of)):
                for owner, size in Counter(of[o] for o in owners).items():
                    for name in names:
                        sizes[(name, owner, 0)] = size
        self.sizes = sizes

    def path_ids(self, table: FlowTable) -> np.ndarray:
        """``(n, 2)`` port classes of every flow's two real ports (a GPU's ports by its class, a
        NIC's by its card's, then by ``split``), classes numbered by first appearance in flow
        order, a flow's out-port before its in-port."""
        codes = table.port.ravel()  # flow 0's out, flow 0's in, flow 1's out, ...
        kind, port = codes & 3, codes >> 2
        intra = kind < 2
        owner = np.where(intra, table.device_array(self.class_of)[np.where(intra, port, 0)],
                         table.device_array(self.card_of)[np.where(intra, 0, port)])
        sub = np.zeros(len(codes), dtype=np.int64)
        if self.split:
            sub = np.fromiter((self.split.get((PORT_NAMES[k], p), 0) for k, p in zip(kind.tolist(), port.tolist())),
                              dtype=np.int64, count=len(codes))
        key = (owner * 4 + kind) * (int(sub.max(initial=0)) + 1) + sub
        unique, first, where = np.unique(key, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")  # in order of first appearance, as the flows meet them
        at = first[order]
        ids = np.empty(len(unique), dtype=np.int64)
        ids[order] = [self._id((PORT_NAMES[k], o, b), bw) for k, o, b, bw in
                      zip(kind[at].tolist(), owner[at].tolist(), sub[at].tolist(), table.bandwidth.ravel()[at].tolist())]
        return ids[where.reshape(-1)].reshape(-1, 2)

    def uplink_ids(self, table: FlowTable) -> np.ndarray:
        """``(n, 2m)`` port classes of the fabric uplinks each flow crosses (``FlowTable.uplink``), -1
        where none. The healthy uplinks of one tier and direction that carry alike (as many flows
        between each pair of device classes: :func:`_uplink_loads`) are one class, each a
        size-weighted share of the flows crossing them; a slow one is its own. Uplinks loaded
        differently (a rack of two stages' servers under one placement, another's under another)
        are different classes: one class would spread a stage's flows over uplinks that never carry them."""
        real, bandwidth = table.uplink, table.uplink_bandwidth
        names = [t.name for t in self.cluster.fabric.tiers]
        modelled = table.modelled
        keys = {}
        for column in range(real.shape[1]):
            tier, direction = modelled[column // 2], ("up", "down")[column % 2]
            healthy = uplink_capacity_bytes_per_s(self.cluster, tier)
            loads, alike = _uplink_loads(table, self.class_of, real[:, column]), {}
            for r, bw in sorted(set(zip(real[:, column].tolist(), bandwidth[:, column].tolist()))):
                if r >= 0:
                    own = r + 1 if self.each_uplink or bw != healthy else 0
                    sub = 0 if own else alike.setdefault(loads[r], len(alike))
                    keys[r] = (f"{names[tier]}-{direction}", own, sub), bw
        for key, _ in keys.values():
            self.sizes[key] = self.sizes.get(key, 0) + 1
        ids = {r: self._id(key, bw) for r, (key, bw) in sorted(keys.items())}
        lookup = np.full(int(real.max(initial=0)) + 2, -1, dtype=np.int64)
        for r, i in ids.items():
            lookup[r + 1] = i
        return lookup[real + 1]

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


def _uplink_loads(table: FlowTable, class_of, column: np.ndarray) -> dict[int, tuple]:
    """Per real uplink of one ``FlowTable.uplink`` column, what it carries: ``(pair, flows)`` for
    each pair of sending and receiving device classes whose flows cross it, sorted."""
    crossing = column >= 0
    classes = table.device_array(class_of)
    pair = row_ids([classes[table.src[crossing]], classes[table.dst[crossing]]]) if crossing.any() else \
        np.zeros(0, dtype=np.int64)
    width = int(pair.max(initial=0)) + 1
    codes, counts = np.unique(column[crossing] * width + pair, return_counts=True)
    loads: dict[int, list] = defaultdict(list)
    for code, n in zip(codes.tolist(), counts.tolist()):
        loads[code // width].append((code % width, n))
    return {r: tuple(load) for r, load in loads.items()}


def flow_paths(flows, cluster, faults: FaultView) -> FlowTable:
    """Each flow's two real ports, their bandwidths and its latency (``sim.engine.flow_table``):
    inside a server the sender's out-port and the receiver's in-port, between servers their
    NICs; a slow link's factor applied."""
    return FlowTable(flows, cluster, faults)


def static_rates(table: FlowTable, together: dict[int, int]) -> list[float]:
    """Each flow's rate when only the operation it belongs to runs (``FlowTable.static_rates``):
    its slowest port's bandwidth shared with the real flows of that operation crossing it, as
    processor sharing ends them (``FlowTable._shared_load``)."""
    return table.static_rates(together)


def port_split(flows, paths, class_of, card_of, max_rounds: int = 8) -> dict[tuple, int]:
    """Split ports of one class by the flows they really carry (for ``Symmetry.optimistic``).

    Colour refinement over real ports only: a port's colour is its device's or card's class,
    then the multiset of (flow label, sending and receiving classes, bytes, direction, the
    colour of the port at the flow's other end) of the flows crossing it, until nothing
    splits. Returns each real port's sub-class (0 for most). Still splitting after
    ``max_rounds``, every port gets its own.
    """
    key_id: dict[tuple, int] = {}
    rounded = RoundedBytes()
    keys = [key_id.setdefault((label, class_of[src], class_of[dst], rounded.of(nbytes)), len(key_id))
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


def flow_kinds(table: FlowTable, rates: list[float], class_of, ports: PortTable, *, by_rate: bool = False,
               by_path: bool = False, gather: tuple[frozenset, Callable[[float], float]] | None = None
               ) -> list[FlowKind]:
    """Group real flows into kinds (same label, classes and bytes), sorted by their key.

    ``rates`` are the flows' static rates (:func:`static_rates`); a kind's is its first flow's.
    With ``by_rate`` flows of different rates or latencies are different kinds (classes of a
    contention-free replay, ``sim.engine.symmetry.refine_behaviour``, may mix them). With
    ``by_path`` flows that cross different port classes are different kinds, *siblings*
    (``FlowKind.sibling``) that the replay checks move together (``Symmetry.optimistic``).

    The flows are grouped with numpy (:func:`_group`); each kind's key, figures and port
    weights are then its first flow's and its members' counts, as flow by flow.
    """
    flows = table.flows
    gathered, gather_s = gather if gather is not None else (frozenset(), None)
    port_ids = ports.path_ids(table)  # numbered in flow order
    if table.uplink is not None:  # and the fabric's uplinks after them (-1 where a flow crosses none)
        port_ids = np.concatenate([port_ids, ports.uplink_ids(table)], axis=1)
    members_of, count, per_port = _group(table, rates, class_of, port_ids, by_rate=by_rate, by_path=by_path)
    path_of = port_ids.tolist()
    rounded, grouped = RoundedBytes(), {}
    for g, m in enumerate(members_of):  # each kind's key is its first flow's
        src, dst, label, nbytes = flows[m]
        key = (label, class_of[src], class_of[dst], rounded.of(nbytes))
        split = by_path or table.uplink is not None  # a fabric's kinds differ by the uplinks they cross
        grouped[key + ((rates[m], table.latencies[m]) if by_rate else ()) + ((tuple(path_of[m]),) if split else ())] = g

    # kinds split by path: siblings are those of one label, classes, bytes and link (intra- or
    # inter-node); the replay checks that each sibling group leaves together
    def family(key: tuple, first: int) -> tuple:
        src, dst, _, _ = flows[first]
        return key[:4] + (ports.link(src, dst) is ports.cluster.intra_node,)

    siblings: dict[tuple, int] = {}
    whole: dict[tuple, int] = defaultdict(int)
    if by_path:
        paths_of: dict[tuple, int] = defaultdict(int)
        for key, g in grouped.items():
            paths_of[family(key, members_of[g])] += 1
        for key in sorted((k for k, n in paths_of.items() if n > 1), key=repr):
            if key[0][0] != "AR":  # an all-reduce ends at one instant for all: its flows need not agree
                siblings[key] = len(siblings)
        # per-device bytes and charges of kinds split by path go whole to the first of them (the
        # others carry 0): the same sums, without rounding a device's bytes into fractions
        for key, g in grouped.items():
            whole[family(key, members_of[g])] += count[g]
    counts = defaultdict(int)
    for d in class_of:
        counts[class_of[d]] += 1
    kinds = []
    for key, g in sorted(grouped.items(), key=lambda item: (repr(item[0][:4]), item[0][4:])):
        label, src_class, dst_class = key[:3]
        first = members_of[g]
        src, dst, _, nbytes = flows[first]
        counted = whole.pop(family(key, first), 0) if by_path else count[g]
        weights = tuple((pid, n / ports.info[pid][2]) for pid, n in zip(path_of[first], per_port[g]) if pid >= 0)
        link = ports.link(src, dst)
        # a pipeline transfer's receivers all-gather it over their tensor group before the compute
        gather_extra = gather_s(nbytes) if label in gathered and nbytes > 0 else 0.0
        kinds.append(
            FlowKind(
                index=len(kinds),
                label=label,
                src_class=src_class,
                dst_class=dst_class,
                bytes=nbytes,
                latency_s=table.latencies[first],
                ports=weights,
                static_rate_bytes_per_s=rates[first],
                send_bytes_per_device=nbytes * counted / counts[src_class],
                recv_bytes_per_device=nbytes * counted / counts[dst_class],
                issue_s=link.send_issue_s(nbytes) * counted / counts[src_class],
                receive_s=((link.recv_overhead_s if nbytes > 0 else 0.0) + gather_extra) * counted / counts[dst_class],
                sibling=siblings.get(family(key, first), -1) if by_path else -1,
            )
        )
    return kinds


def _group(table: FlowTable, rates: list[float], class_of, port_ids: np.ndarray, *, by_rate: bool,
           by_path: bool) -> tuple[list[int], list[int], list[list[int]]]:
    """The flows grouped into kinds: each group's first flow (groups in the order their first
    flows come), its number of flows, and how many of its flows cross each of its first flow's two
    port classes.

    Two flows are of one kind when their labels, classes and rounded bytes (``RoundedBytes``)
    are equal, and with ``by_rate`` their rates and latencies, with ``by_path`` their port
    classes: rows of columns, equal rows one group (``row_ids``).
    """
    classes = table.device_array(class_of)
    columns = [table.label, classes[table.src], classes[table.dst], table.bytes_id()]
    if by_rate:
        columns += [np.asarray(rates, dtype=np.float64), table.latency]
    if by_path:
        columns += [port_ids[:, 0], port_ids[:, 1]]
    columns += [port_ids[:, c] for c in range(2, port_ids.shape[1])]  # a fabric's uplinks: kinds never mix paths
    _, first, where = np.unique(row_ids(columns), return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # group ids by first appearance
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    group = rank[where.reshape(-1)]
    count = np.bincount(group, minlength=len(order)).tolist()
    width = int(port_ids.max(initial=0)) + 1
    firsts = first[order]  # each group's flows on its first flow's port classes
    asked = np.arange(len(order)).reshape(-1, 1) * width + port_ids[firsts]
    if port_ids.shape[1] == 2:
        pairs, pair_count = np.unique(np.concatenate([group * width + port_ids[:, 0], group * width + port_ids[:, 1]]),
                                      return_counts=True)
        return firsts.tolist(), count, pair_count[np.searchsorted(pairs, asked)].tolist()
    crossed = port_ids >= 0  # a fabric's uplink columns are -1 where a flow crosses none
    pairs, pair_count = np.unique((group.reshape(-1, 1) * width + port_ids)[crossed], return_counts=True)
    found = pair_count[np.minimum(np.searchsorted(pairs, asked), len(pairs) - 1)]
    return firsts.tolist(), count, np.where(port_ids[firsts] >= 0, found, 0).tolist()


def kinds_by_class(kinds: list[FlowKind]) -> tuple[dict, dict]:
    """Point-to-point kinds leaving and entering each class, by label."""
    out_kinds: dict[int, dict] = defaultdict(lambda: defaultdict(list))
    in_kinds: dict[int, dict] = defaultdict(lambda: defaultdict(list))
    for k in kinds:
        if k.label[0] in ("F", "B"):
            out_kinds[k.src_class][k.label].append(k.index)
            in_kinds[k.dst_class][k.label].append(k.index)
    return out_kinds, in_kinds
