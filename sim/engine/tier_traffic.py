"""A fabric's traffic per tier and per link, from a compilation's flows (``sim.core.fabric_traffic``).

The compiler's flow table (``sim.engine.flow_table.FlowTable``) holds one execution of every
flow label: ``("F", s)`` is one micro-batch's activations out of stage ``s``, ``("AR", s, p)``
one phase of its gradient reduction, ``("TP", s, "F")`` one forward's tensor-parallel
collectives. :func:`label_traffic` sums, once at compile time and only on a fabric, each
label's bytes per tier (the flows that climbed to the tier or above, ``FlowTable.climb``) and
per link (each NIC and group uplink, ``FlowTable.tier_groups``). :func:`fabric_traffic` then
counts how often each label runs in the iteration from the compiled ops (a SEND op sends one
label, a GROUP or REDUCE op runs its collective's labels) and multiplies out: no work in the
replays' event loops, and the same figures from every engine. Utilisation is bytes over
(capacity × iteration time), ``sim.core.fabric_traffic``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from sim.core.fabric_traffic import FabricTraffic, LinkLoad, TierTraffic
from sim.cost.tiers import uplink_capacity_bytes_per_s, uplink_count
from sim.engine.workload import GROUP, REDUCE, SEND

__all__ = ["BUSIEST", "KIND_OF", "LabelTraffic", "fabric_traffic", "label_executions", "label_traffic"]

KIND_OF = {"F": "PP", "B": "PP", "AR": "DP", "FS": "DP", "PG": "DP", "TP": "TP", "TA": "TP", "CP": "CP", "EP": "EP"}
"""The parallel group kind that sends each flow label: pipeline sends, the gradient reduction and
FSDP's or ZeRO's gathers (data parallelism), tensor, context and expert parallelism."""

KINDS = ("TP", "CP", "EP", "PP", "DP")
"""Kinds in the order they are shown."""

BUSIEST = 5
"""How many of the most utilised links a summary lists."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LabelTraffic:
    """One execution of each flow label, as bytes per tier and per link (arrays, not per flow)."""

    labels: tuple[tuple, ...]
    """The flow labels, in the flow table's order."""
    tier_names: tuple[str, ...]
    """The fabric's tiers, bottom first."""
    tier_bytes: np.ndarray
    """``(labels, tiers)``: bytes of one execution of the label that reached each tier, per direction."""
    tier_capacity_bytes_per_s: tuple[float, ...]
    """Per tier, what carries traffic into it per direction: the NICs (tier 0), the tier below's uplinks."""
    link_label: np.ndarray
    """Label index of each (label, link) pair that carries bytes."""
    link_of: np.ndarray
    """Link index of each pair (into ``link_names``)."""
    link_bytes: np.ndarray
    """Bytes of one execution of the pair's label on its link."""
    link_names: tuple[str, ...]
    """Every link: the NICs out then in, then per tier below the top its uplinks up then down."""
    link_capacity_bytes_per_s: np.ndarray
    """Each link's capacity, a slow link's factor applied, bytes/s."""


def label_traffic(table, cluster, faults) -> LabelTraffic:
    """Each label's bytes per tier and per link, from the flow table of a cluster with a fabric."""
    fabric, inter = cluster.fabric, cluster.inter_node.bandwidth_bytes_per_s
    climb, nbytes, label = table.climb, table.nbytes, table.label
    n_labels, n_tiers = len(table.labels), len(fabric.tiers)
    tier_bytes = np.stack([np.bincount(label, weights=np.where(climb >= t, nbytes, 0.0), minlength=n_labels)
                           for t in range(n_tiers)], axis=1) if len(table) else np.zeros((n_labels, n_tiers))
    nics = cluster.nodes * cluster.nics_per_node
    capacity = [nics * inter] + [uplink_count(cluster, t) * uplink_capacity_bytes_per_s(cluster, t)
                                 for t in range(n_tiers - 1)]
    names = [f"nic {i} {way}" for way in ("out", "in") for i in range(nics)]
    caps = [inter * faults.slow_nics.get(i, 1.0) for _ in ("out", "in") for i in range(nics)]
    crosses = ~table.intra
    pairs_link = [np.where(crosses, table.port[:, 0] >> 2, -1), np.where(crosses, nics + (table.port[:, 1] >> 2), -1)]
    base = 2 * nics
    for t in range(n_tiers - 1):
        count, healthy = uplink_count(cluster, t), uplink_capacity_bytes_per_s(cluster, t)
        for direction, group in zip(("up", "down"), table.tier_groups[t]):
            pairs_link.append(np.where(climb > t, base + group, -1))
            names += [f"{fabric.tiers[t].name} {g} {direction}" for g in range(count)]
            caps += [healthy * faults.slow_uplinks.get((t, g), 1.0) for g in range(count)]
            base += count
    links = np.concatenate(pairs_link)
    weights = np.tile(nbytes, len(pairs_link))
    labels = np.tile(label, len(pairs_link))
    used = links >= 0
    keys, where = np.unique(labels[used] * base + links[used], return_inverse=True)
    summed = np.bincount(where.reshape(-1), weights=weights[used], minlength=len(keys))
    return LabelTraffic(labels=tuple(table.labels), tier_names=tuple(t.name for t in fabric.tiers),
                        tier_bytes=tier_bytes, tier_capacity_bytes_per_s=tuple(capacity),
                        link_label=keys // base, link_of=keys % base, link_bytes=summed,
                        link_names=tuple(names), link_capacity_bytes_per_s=np.array(caps, dtype=np.float64))


def label_executions(workload) -> dict[tuple, int]:
    """How many times each flow label runs in the iteration: per device class, its SEND ops (one
    label each) and its GROUP and REDUCE ops (their collective's labels); the most any class runs it."""
    kinds, counts = workload.kinds, {}
    ops_count: dict[int, Counter] = {}  # classes that share their ops share these counts
    for cls in workload.classes:
        ran = ops_count.get(id(cls.ops))
        if ran is None:
            ran = ops_count[id(cls.ops)] = Counter(
                (op.code, op.flows if op.code == SEND else op.collective) for op in cls.ops
                if (op.code == SEND and op.flows >= 0) or (op.code in (GROUP, REDUCE) and op.collective >= 0))
        seen: Counter = Counter()
        for (code, slot), n in ran.items():
            if code == SEND:
                labels = {kinds[k].label for k in cls.slots[slot]}
            else:
                coll = workload.group_collectives[cls.groups[slot]] if code == GROUP else workload.collectives[slot]
                labels = {kinds[k].label for members, _ in coll.phases for k in members}
            for label in labels:
                seen[label] += n
        for label, n in seen.items():
            counts[label] = max(counts.get(label, 0), n)
    return counts


def fabric_traffic(traffic: LabelTraffic, workload, iteration_time_s: float) -> FabricTraffic:
    """The iteration's bytes and utilisation per tier and its :data:`BUSIEST` links."""
    runs = label_executions(workload)
    times = np.array([runs.get(label, 0) for label in traffic.labels], dtype=np.float64)
    kind = np.array([KINDS.index(KIND_OF[label[0]]) for label in traffic.labels], dtype=np.int64)
    tiers = []
    for t, name in enumerate(traffic.tier_names):
        per_kind = np.bincount(kind, weights=times * traffic.tier_bytes[:, t], minlength=len(KINDS)) \
            if len(kind) else np.zeros(len(KINDS))
        total, capacity = float(per_kind.sum()), traffic.tier_capacity_bytes_per_s[t]
        tiers.append(TierTraffic(name=name, bytes=total,
                                 bytes_by_kind=tuple((k, float(b)) for k, b in zip(KINDS, per_kind) if b > 0),
                                 capacity_bytes_per_s=capacity, utilisation=total / (capacity * iteration_time_s)))
    per_link = np.bincount(traffic.link_of, weights=traffic.link_bytes * times[traffic.link_label],
                           minlength=len(traffic.link_names))
    utilisation = per_link / (traffic.link_capacity_bytes_per_s * iteration_time_s)
    order = sorted(np.flatnonzero(per_link > 0).tolist(), key=lambda i: (-utilisation[i], i))
    busiest = tuple(LinkLoad(name=traffic.link_names[i], bytes=float(per_link[i]),
                             capacity_bytes_per_s=float(traffic.link_capacity_bytes_per_s[i]),
                             utilisation=float(utilisation[i])) for i in order[:BUSIEST])
    return FabricTraffic(tiers=tuple(tiers), busiest=busiest)
