"""A compilation's flows as columns: the ports each crosses and its rate alone, for every flow at once.

A 16,384-GPU plan compiles to some 80,000 flows ``(src, dst, label, bytes)``
(``sim.engine.flows``), and the compiler asks the same questions of each of them: which two
ports it crosses, at what bandwidth and latency, and how fast it goes when only its own
operation runs. Asked flow by flow in Python, those questions cost most of a compilation;
:class:`FlowTable` holds the answers as numpy columns, computed once, so the compiler's
passes over the flows (its static rates here, its flow kinds in ``sim.engine.flows``) are a
few array operations. Every number is the one the per-flow rule gives: the same products
and quotients of the same floats, only computed for all flows together.

A port is an integer code: ``4 · device + 0`` a GPU's out-port, ``4 · device + 1`` its
in-port (inside a server), ``4 · nic + 2`` a NIC's out side, ``4 · nic + 3`` its in side
(between servers), :data:`PORT_NAMES` in that order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from sim.cost.tiers import modelled_tiers, uplink_capacity_bytes_per_s, uplink_count

if TYPE_CHECKING:
    from sim.engine.fault_view import FaultView

__all__ = ["PORT_NAMES", "FlowTable", "RoundedBytes", "row_ids"]

PORT_NAMES = ("out", "in", "nic-out", "nic-in")
"""The kinds of real port, by the low two bits of a port code."""


class RoundedBytes(dict):
    """``round(nbytes, 6)``, the byte count flows are told apart by, computed once per distinct
    float: a compilation rounds every flow's bytes (hundreds of thousands at 16,384 GPUs) but
    holds few distinct counts. The same values as ``round``: an int, or a zero (``-0.0`` rounds
    to itself), is rounded afresh, as a dict would mistake ``2`` for ``2.0`` and ``-0.0`` for ``0.0``."""

    __slots__ = ()

    def of(self, nbytes: float) -> float:
        if type(nbytes) is float and nbytes:
            return self[nbytes]
        return round(nbytes, 6)

    def __missing__(self, nbytes: float) -> float:
        value = self[nbytes] = round(nbytes, 6)
        return value


class FlowTable:
    """Every flow's devices, label, bytes, ports, their bandwidths and the latency, as columns.

    The path rule is ``sim.cost.links.group_link``'s (one server: the GPUs' own ports, else
    their NICs, ``ClusterSpec.nic_of``: GPU ``l`` of a server through NIC ``l·nics // per_node``),
    with a slow link's factor applied to the port or NIC it names.
    """

    def __init__(self, flows: list, cluster, faults: FaultView) -> None:
        n = len(flows)
        self.flows = flows
        src, dst, labels, nbytes = zip(*flows) if flows else ((), (), (), ())
        self.src = np.array(src, dtype=np.int64)
        """Sending device of each flow (global id)."""
        self.dst = np.array(dst, dtype=np.int64)
        """Receiving device of each flow (global id)."""
        self.labels = list(dict.fromkeys(labels))
        """The distinct labels, by first appearance."""
        ids = {label: i for i, label in enumerate(self.labels)}
        self.label = np.fromiter(map(ids.__getitem__, labels), dtype=np.int64, count=n)
        """Each flow's label as a small int: its index in ``labels``."""
        self.nbytes = np.array(nbytes, dtype=np.float64)
        """Bytes of each flow (as floats; the flows keep the exact values)."""
        self._bytes_id: np.ndarray | None = None
        per_node, nics = cluster.devices_per_node, cluster.nics_per_node
        intra, inter = cluster.intra_node, cluster.inter_node
        node = self.src // per_node
        self.intra = node == self.dst // per_node
        """Whether each flow stays on one server (its GPUs' ports) or crosses the NICs."""
        nic_out = node * nics + (self.src % per_node) * nics // per_node
        nic_in = (self.dst // per_node) * nics + (self.dst % per_node) * nics // per_node
        self.port = np.stack([np.where(self.intra, 4 * self.src, 4 * nic_out + 2),
                              np.where(self.intra, 4 * self.dst + 1, 4 * nic_in + 3)], axis=1)
        """``(n, 2)`` port codes: the port each flow leaves by and the one it enters by."""
        port_factor = _factors(faults.slow_ports, int(max(self.src.max(initial=0), self.dst.max(initial=0))) + 1)
        nic_factor = _factors(faults.slow_nics, int(max(nic_out.max(initial=0), nic_in.max(initial=0))) + 1)
        # a healthy port's factor is 1.0, and ``bandwidth * 1.0`` is the bandwidth itself
        self.bandwidth = np.stack([
            np.where(self.intra, intra.bandwidth_bytes_per_s * port_factor[self.src],
                     inter.bandwidth_bytes_per_s * nic_factor[nic_out]),
            np.where(self.intra, intra.bandwidth_bytes_per_s * port_factor[self.dst],
                     inter.bandwidth_bytes_per_s * nic_factor[nic_in]),
        ], axis=1)
        """``(n, 2)`` bandwidths (bytes/s) of the two ports, a slow link's factor applied."""
        self.latency = np.where(self.intra, intra.latency_s, inter.latency_s)
        """Latency (s) of each flow's link (and of the fabric's tiers it climbs through)."""
        self.climb: np.ndarray | None = None
        """The fabric tier each flow climbs to (``sim.cost.tiers.climb``; -1 inside a server);
        None without a fabric."""
        self.uplink: np.ndarray | None = None
        """``(n, 2m)`` real uplink ids each flow crosses, up out of its sender's group and down into
        its receiver's, for each of the ``m`` modelled tiers (``sim.cost.tiers.modelled_tiers``),
        -1 where it does not climb that high; None when no tier is modelled."""
        self.uplink_bandwidth: np.ndarray | None = None
        """``(n, 2m)`` bandwidths (bytes/s) of those uplinks, a slow link's factor applied; inf where none."""
        self.modelled: tuple[int, ...] = ()
        """The fabric tiers whose uplinks are ports (``sim.cost.tiers.modelled_tiers``), in ``uplink``'s order."""
        self.tier_groups: list[tuple[np.ndarray, np.ndarray]] = []
        """Per fabric tier, the group (``sim.cost.tiers.uplink_group``) of each flow's sender and of its
        receiver; empty without a fabric."""
        if cluster.fabric is not None:
            self._fabric(cluster, faults)
        self.latencies = self.latency.tolist()
        """The latencies as Python floats."""

    def _fabric(self, cluster, faults: FaultView) -> None:
        """Each flow's climb, its tiers' latency, and the uplinks of the modelled tiers it crosses
        (``sim.cost.tiers``: one uplink per group and direction, the rails of a rail-optimised leaf apart)."""
        fabric = cluster.fabric
        per_node, nics = cluster.devices_per_node, cluster.nics_per_node
        src_node, dst_node = self.src // per_node, self.dst // per_node
        rail_src = ((self.src % per_node) * nics // per_node) % fabric.rails
        rail_dst = ((self.dst % per_node) * nics // per_node) % fabric.rails
        climb = np.full(len(self.flows), len(fabric.tiers) - 1, dtype=np.int64)
        groups = []  # each tier's group of every flow's sender and receiver
        for tier in range(len(fabric.tiers)):
            reach = fabric.reach(tier)
            reach = None if reach is None or reach >= cluster.nodes else reach  # one group (and no int64 overflow)
            a = src_node // reach if reach is not None else np.zeros_like(src_node)
            b = dst_node // reach if reach is not None else np.zeros_like(dst_node)
            if tier == 0 and fabric.rail_optimised:
                a, b = a * fabric.rails + rail_src, b * fabric.rails + rail_dst
            groups.append((a, b))
        for tier in reversed(range(len(fabric.tiers))):
            climb = np.where(groups[tier][0] == groups[tier][1], tier, climb)
        self.climb = np.where(self.intra, -1, climb)
        self.tier_groups = groups
        for tier, spec in enumerate(fabric.tiers):
            if spec.latency_s:
                self.latency = self.latency + np.where(self.climb >= tier, spec.latency_s, 0.0)
        modelled = modelled_tiers(cluster, {t for t, _ in faults.slow_uplinks})
        if not modelled:
            return
        self.modelled = modelled
        ids, bandwidths, base = [], [], 0
        for tier in modelled:
            count = uplink_count(cluster, tier)
            capacity = uplink_capacity_bytes_per_s(cluster, tier)
            factor = np.ones(count)
            for (t, index), f in faults.slow_uplinks.items():
                if t == tier:
                    factor[index] = f
            crosses = self.climb > tier
            for direction, group in enumerate(groups[tier]):
                ids.append(np.where(crosses, base + direction * count + group, -1))
                bandwidths.append(np.where(crosses, capacity * factor[np.where(crosses, group, 0)], np.inf))
            base += 2 * count
        self.uplink = np.stack(ids, axis=1)
        self.uplink_bandwidth = np.stack(bandwidths, axis=1)

    def bytes_id(self) -> np.ndarray:
        """Each flow's bytes, rounded as flows are told apart (``round(nbytes, 6)``,
        ``sim.engine.flows.RoundedBytes``), as a small int: equal ints, equal rounded bytes.
        Rounded once per distinct byte count (a plan has few), not once per flow."""
        if self._bytes_id is None:
            raw, raw_id = np.unique(self.nbytes, return_inverse=True)
            rounded, ids = RoundedBytes(), {}
            self._bytes_id = np.array([ids.setdefault(rounded.of(value), len(ids)) for value in raw.tolist()],
                                      dtype=np.int64)[raw_id.reshape(-1)]
        return self._bytes_id

    def __len__(self) -> int:
        return len(self.flows)

    def paths(self) -> list[tuple[tuple, tuple[float, float], float]]:
        """Each flow's ``(real port keys, their bandwidths, latency)``, a port key ``(name, id)``."""
        ports, bandwidths = self.port.tolist(), self.bandwidth.tolist()
        return [(((PORT_NAMES[a & 3], a >> 2), (PORT_NAMES[b & 3], b >> 2)), (bw_a, bw_b), latency)
                for (a, b), (bw_a, bw_b), latency in zip(ports, bandwidths, self.latencies)]

    def device_array(self, of: dict[int, int]) -> np.ndarray:
        """``of`` (device -> int, every device of a flow among its keys) as an array indexed by device id."""
        table = np.zeros(max(of, default=0) + 1, dtype=np.int64)
        table[np.fromiter(of.keys(), dtype=np.int64, count=len(of))] = np.fromiter(of.values(), dtype=np.int64,
                                                                                 count=len(of))
        return table

    def static_rates(self, together: dict[int, int]) -> list[float]:
        """Each flow's rate when only the operation it belongs to runs: its slowest port's
        bandwidth over its load there (``_shared_load``: the real flows of that operation crossing
        it, a smaller one counted by its share of the flow's bytes). An operation is the sends
        of one boundary by a class of identical devices (``together``: device -> class; they
        always send at the same instant), or one all-reduce phase (whoever sends)."""
        if not len(self):
            return []
        classes = self.device_array(together)
        is_ar = np.array([label[0] == "AR" for label in self.labels], dtype=bool)[self.label]
        operation = self.label * (int(classes.max()) + 2) + np.where(is_ar, 0, classes[self.src] + 1)
        _, operation = np.unique(operation, return_inverse=True)
        ports, port = np.unique(self.port, return_inverse=True)
        keys = operation.reshape(-1, 1) * len(ports) + port.reshape(-1, 2)
        load = self._shared_load(keys)
        rates = np.minimum(self.bandwidth[:, 0] / load[:, 0], self.bandwidth[:, 1] / load[:, 1])
        if self.uplink is not None:  # the uplinks' shares too (an uplink's id is -1 where a flow does not cross one)
            width = int(self.uplink.max(initial=0)) + 2
            keys = operation.reshape(-1, 1) * width + (self.uplink + 1)
            load = self._shared_load(keys)
            rates = np.minimum(rates, (self.uplink_bandwidth / load).min(axis=1))
        return rates.tolist()

    def _shared_load(self, keys: np.ndarray) -> np.ndarray:
        """Each flow's share of the port each entry of ``keys`` (flows × k, one key per operation and
        port) names, as the number of equal flows that would give it the same finish time.

        The flows of one operation start together and share the port fairly (processor sharing,
        Kleinrock 1967, "Time-shared systems: a theoretical treatment", §3): a flow of b bytes
        beside flows b_j ends at Σ_j min(b_j, b) / bandwidth, so its load is Σ_j min(b_j/b, 1) —
        the count of flows crossing the port when their bytes are equal (as rounded to tell flows
        apart, ``bytes_id``), fewer when a small flow ends early and leaves the port to the large
        one (an MoE stage's dense gradients beside its experts' on one NIC)."""
        _, where, load = np.unique(keys, return_inverse=True, return_counts=True)
        where = where.reshape(-1)
        flow = np.repeat(np.arange(keys.shape[0]), keys.shape[1])
        sizes = self.bytes_id()[flow]
        spread = np.full(load.shape, -1, dtype=np.int64)
        np.maximum.at(spread, where, sizes)
        low = np.full(load.shape, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(low, where, sizes)
        shared = load[where].astype(np.float64)
        mixed = np.flatnonzero((spread != low)[where])  # entries on ports that carry unequal flows of one operation
        if len(mixed):
            group, nbytes = where[mixed], self.nbytes[flow[mixed]]
            order = np.lexsort((nbytes, group))
            group, nbytes, mixed = group[order], nbytes[order], mixed[order]
            total = np.concatenate(([0.0], np.cumsum(nbytes)))
            first = np.searchsorted(group, group, side="left")  # each entry's group starts here
            end = np.searchsorted(group, group, side="right")
            run = np.concatenate(([True], (group[1:] != group[:-1]) | (nbytes[1:] != nbytes[:-1])))
            tie = np.flatnonzero(run)[np.cumsum(run) - 1]  # where its run of equal bytes starts
            smaller = total[tie] - total[first]  # the bytes of the flows that end before it
            positive = nbytes > 0
            shared[mixed[positive]] = (smaller[positive] / nbytes[positive] + (end - tie)[positive])
        return shared.reshape(keys.shape)


def row_ids(columns: list[np.ndarray]) -> np.ndarray:
    """A small int per row of equal-length columns (ints or floats): equal rows, equal ints (``np.unique``
    with ``axis=0``, without its slow row comparisons). Each column folds into the code so far
    and the code is renumbered densely, so no product outgrows int64."""
    code = np.zeros(len(columns[0]), dtype=np.int64)
    for column in columns:
        low = int(column.min(initial=0)) if column.dtype.kind == "i" else 0
        span = int(column.max(initial=0)) - low + 1 if column.dtype.kind == "i" else None
        if span is None or span * (int(code.max(initial=0)) + 1) >= 1 << 62:  # floats, or too wide: numbered first
            _, column = np.unique(column, return_inverse=True)
            column, low, span = column.reshape(-1), 0, int(column.max(initial=0)) + 1
        code = code * span + (column - low)
        _, code = np.unique(code, return_inverse=True)
        code = code.reshape(-1)
    return code


def _factors(slow: dict[int, float], size: int) -> np.ndarray:
    """Bandwidth factors by port or NIC id: 1.0 but where a slow link says otherwise."""
    factors = np.ones(max(size, max(slow, default=-1) + 1), dtype=np.float64)
    for key, factor in slow.items():
        factors[key] = factor
    return factors
