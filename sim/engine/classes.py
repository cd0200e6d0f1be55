"""Device classes: which devices a replay may merge, and the faults that tell them apart.

Three partitions (``sim.engine.symmetry`` explains the methods):

* :meth:`Symmetry.equitable` — colour refinement over every flow and network card, seeded
  with each device's rank, slices and faults: exact with contention, where a device that
  shares a ring or a network card with a faulty one can differ from its replicas;
* :meth:`Symmetry.optimistic` — the same without the gradient all-reduces' rings: with
  contention, exact while the flows it merges move together, which the replay checks
  (``sim.engine.replay.Diverged``; ``sim.engine.run`` then replays the equitable classes);
* :meth:`Symmetry.behaviour` — for a contention-free replay: the fault-free equitable
  classes, split only where a fault reaches a device through what it waits for (the data it
  receives, its groups' collectives, the rates of its flows). One straggler among 16,384
  devices then splits its own replica's chain through the pipeline (and its tensor group),
  not the whole cluster.

:class:`FaultView` answers the compiler's questions about the scenario's faults: each
device's fault signature (a straggler's slowdown, a failure, a slow port, the key its jitter
draws under, ``sim.core.faults.jitter_key``) and each NIC's bandwidth factor.
"""

from __future__ import annotations

import numpy as np

from sim.engine.fault_view import FaultView
from sim.engine.flow_table import FlowTable, RoundedBytes, row_ids
from sim.engine.flows import static_rates
from sim.engine.symmetry import refine_arrays, refine_behaviour

__all__ = ["MAX_REFINE_ROUNDS", "Symmetry", "group_members"]

MAX_REFINE_ROUNDS = 32
"""Rounds of the equitable refinement with faults before every device gets its own class: a
fault splits one ring neighbour per round, so on a ring of replicas the refinement would
otherwise take about half the ring's length in passes over every flow (8 s for 16,384 GPUs).
The optimistic refinement, which leaves the rings out, may also take two rounds per pipeline
stage (``Symmetry.optimistic``)."""


class Symmetry:
    """The classes of a compilation: equitable (exact with contention) or behavioural (without)."""

    def __init__(self, devices, nic_ids, table: FlowTable, cluster, faults: FaultView, rank_of, slices) -> None:
        self.devices, self.nic_ids, self.flows, self.faults = devices, nic_ids, table.flows, faults
        self.local = {d: i for i, d in enumerate(devices)}
        nic_local = {n: i for i, n in enumerate(nic_ids)}
        self.card_of = [nic_local[cluster.nic_of(d)] for d in devices]
        self.structure = [(rank_of[d], slices[d]) for d in devices]
        # each flow an edge between its devices' local ids (``devices`` is sorted), with a small
        # int for what tells flows apart: its label, its bytes (rounded) and whether it stays on one server
        self.src = np.searchsorted(np.array(devices, dtype=np.int64), table.src)
        self.dst = np.searchsorted(np.array(devices, dtype=np.int64), table.dst)
        # on a fabric with modelled uplinks, also the tier it climbs to (``FlowTable.climb``), but for
        # a gradient all-reduce's flows: the reduction ends at one instant for all its members, so
        # a ring's few hops across a pod need not split its ring (their kinds split by path instead,
        # ``sim.engine.flows.flow_kinds``, each loading the uplinks with its real flows)
        climbs = []
        if table.uplink is not None:
            is_ar = np.array([label[0] == "AR" for label in table.labels], dtype=bool)[table.label]
            climbs = [np.where(is_ar, -2, table.climb)]
        self.labels = row_ids([table.label, table.bytes_id(), table.intra.astype(np.int64), *climbs])

    def equitable(self, *, with_faults: bool) -> tuple[list[int], list[int]]:
        """Colour refinement over every flow and network card (``sim.engine.symmetry.refine``)."""
        return self._refine(slice(None), with_faults=with_faults)

    def optimistic(self) -> tuple[list[int], list[int]]:
        """Colour refinement over every flow but the gradient all-reduces' rings, with faults.

        A gradient all-reduce ends at one instant for all its members, so a device cares only
        about its end, not about which neighbour its ring flows come from; leaving the rings out
        keeps a fault from splitting the whole ring. The classes are exact with contention as
        long as the flows the replay treats as one move together (``sim.engine.flows.port_split``
        gives each port the flows it really carries); the replay checks that and says when
        they did not (``sim.engine.replay.Diverged``), and the caller then replays the
        equitable classes.
        """
        # without the rings a fault travels along its replica's pipeline chain, a stage a round
        # each way: a 128-stage pipeline settles in about 130 rounds (half a second at 16,384
        # devices), where the rings' cap would give every device its own class (a SimPy replay
        # of each of 16,384 devices: 17 s)
        depth = len({rank for rank, _ in self.structure})
        return self._refine(np.array([flow[2][0] != "AR" for flow in self.flows], dtype=bool), with_faults=True,
                            max_rounds=MAX_REFINE_ROUNDS + 2 * depth)

    def _refine(self, edges, *, with_faults: bool, max_rounds: int = MAX_REFINE_ROUNDS) -> tuple[list[int], list[int]]:
        """Colour refinement over the flows ``edges`` selects and the network cards, seeded with the
        faults or not; with faults, at most ``max_rounds`` rounds (``MAX_REFINE_ROUNDS``)."""
        f = self.faults
        with_faults = with_faults and f.any  # without faults every signature is NEUTRAL, every factor 1.0
        initial = [s + ((f.device_signature(d) if with_faults else f.NEUTRAL),)
                   for s, d in zip(self.structure, self.devices)]
        cards = [f.card_signature(n) if with_faults else 1.0 for n in self.nic_ids]
        return refine_arrays(initial, self.card_of, self.src[edges], self.dst[edges], self.labels[edges],
                             len(self.nic_ids), cards, max_rounds=max_rounds if with_faults and f.any else None)

    def behaviour(self, num_p2p: int, table, groups) -> tuple[list[int], list[float]]:
        """Classes exact without contention, and every flow's static rate under them.

        The first ``num_p2p`` flows are the point-to-point ones. Start from the fault-free
        equitable classes split by each device's faults, then refine (``refine_behaviour``) on
        the flows each device sends and receives, its senders' classes and its groups' classes;
        a new partition changes which devices send together, hence the static rates, so repeat
        until nothing splits. Without faults this is the equitable partition.
        """
        structural, _ = self.equitable(with_faults=False)
        if not self.faults.any:  # fault-free: the equitable classes, exact in either model, as ever
            return structural, static_rates(table, dict(zip(self.devices, structural)))
        n, local, flows = len(self.devices), self.local, self.flows
        p2p = range(num_p2p)
        incoming = [[] for _ in range(n)]
        for i in p2p:
            src, dst, label, _ = flows[i]
            incoming[local[dst]].append((label, local[src]))
        member_groups = [(label, [local[d] for d in members]) for label, members in groups]
        ids: dict = {}
        classes = [ids.setdefault(pair, len(ids))
                   for pair in zip(structural, (self.faults.device_signature(d) for d in self.devices))]
        rounded, latencies = RoundedBytes(), table.latencies
        while True:
            rates = static_rates(table, dict(zip(self.devices, classes)))
            sent, received = [[] for _ in range(n)], [[] for _ in range(n)]
            for i in p2p:
                src, dst, label, nbytes = flows[i]
                flow = (repr(label), rounded.of(nbytes), rates[i], latencies[i])
                sent[local[src]].append(flow)
                received[local[dst]].append(flow)
            initial = [(classes[i], tuple(sorted(sent[i])), tuple(sorted(received[i]))) for i in range(n)]
            refined = refine_behaviour(initial, incoming, member_groups)
            if max(refined, default=-1) == max(classes, default=-1):
                return refined, rates
            classes = refined


def group_members(plan, g_flows) -> list[tuple[tuple, tuple[int, ...]]]:
    """``((name, stage), devices)`` of every per-action collective group that has flows."""
    groups_of = {"TP": plan.tensor_groups, "CP": plan.context_groups, "FS": plan.gradient_groups,
                 "PG": plan.gradient_groups, "EP": plan.expert_groups, "TA": plan.tensor_groups}
    labels = sorted({(label[0], label[1]) for _, _, label, _ in g_flows})
    return [((name, s), group) for name, s in labels for group in groups_of[name](s)]


