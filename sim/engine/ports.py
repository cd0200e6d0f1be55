"""Ports and links: how transfers share bandwidth.

Think of each port as a pipe of fixed width (its bandwidth, bytes/s, per direction). A GPU
has one intra-node port per direction (NVLink/NVSwitch or PCIe); a server has
``nics_per_node`` network cards per direction. A transfer inside a server crosses the
sender's out-port and the receiver's in-port; between servers, the sender's NIC out and the
receiver's NIC in.

Contention model (processor sharing per port, bottleneck rate per flow):

* while ``n`` flows cross a port, each may use ``bandwidth / n`` of it;
* a flow moves at the smallest share among the ports on its path (the slowest port on
  its path decides), and its bytes drain at that rate;
* whenever a flow starts or finishes, the rates of the flows that share a port with it are
  recomputed at that instant, and their remaining bytes carry over;
* after its last byte leaves, a transfer still needs the link's latency to arrive.

So one transfer alone costs ``latency + bytes / min(bandwidth on its path)``; two concurrent
equal transfers through one port each take twice as long; transfers on disjoint ports do not
slow each other; a transfer between servers is limited by the NIC. Shares that one flow
leaves unused on a port are not handed to the others (not max-min fair): simple, and never
optimistic. Like any shared network, it is not monotone: a slower computation can reorder
transfers so that an iteration finishes sooner.

With ``contention=False`` every transfer runs at the rate it would have if only its own
operation used the network — the fast path's model. An operation is one all-reduce phase,
or one SEND issued by a class of identical replicas (they always send at the same instant,
so their flows share the ports they have in common in either model).

Flows stand for *flow kinds* (``sim.engine.flows``): all the real flows between two classes of
identical devices. A kind adds its weight (real flows per port) to each port class it
crosses, so symmetric devices are replayed once without changing anyone's share.
"""

from __future__ import annotations

import heapq
import math
from typing import Callable

import simpy

__all__ = ["Network"]

_EPS = 1e-12


class _Flow:
    __slots__ = ("kind", "ports", "remaining", "rate", "since", "version", "done", "owner", "finish")

    def __init__(self, kind, done: Callable, owner, now: float) -> None:
        self.kind = kind
        self.ports = tuple(p for p, _ in kind.ports)
        self.remaining = kind.bytes
        self.rate = 0.0
        self.since = now
        self.version = 0
        self.done = done
        self.owner = owner
        self.finish = math.nan
        """When its heap entry of this ``version`` says it ends."""


class Network:
    """The ports of a cluster; ``transfer`` starts a flow kind and calls back when it has left."""

    def __init__(self, env: simpy.Environment, workload, *, contention: bool) -> None:
        self.env = env
        self.contention = contention
        self.bandwidth = [p.bandwidth_bytes_per_s for p in workload.port_classes]
        self.load = [0.0] * len(self.bandwidth)
        self.share = [math.inf] * len(self.bandwidth)
        """Each port's bandwidth over its load (what one real flow through it may use)."""
        self.on_port: list[set[int]] = [set() for _ in self.bandwidth]
        self.flows: dict[int, _Flow] = {}
        self.heap: list[tuple[float, int, int]] = []
        self.dirty: set[int] = set()
        self.next_id = 0
        self.recompute_pending = False
        self.wake_at = math.inf

    def transfer(self, kind, done: Callable, owner=None, *, last: bool = False) -> None:
        """Start one flow of ``kind`` now; ``done(kind, owner)`` runs when its last byte has left.

        The rates are recomputed once for the flows that start at one instant: by an event
        after the others, or at once when the caller says this is the ``last`` of its flows and
        nothing else is due at this instant."""
        if kind.bytes <= 0:
            self._call_later(0.0, done, kind, owner)
        elif not self.contention:
            self._call_later(kind.bytes / kind.static_rate_bytes_per_s, done, kind, owner)
        else:
            fid = self.next_id
            self.next_id += 1
            self.flows[fid] = _Flow(kind, done, owner, self.env.now)
            load, share, bandwidth = self.load, self.share, self.bandwidth
            for port, weight in kind.ports:
                load[port] += weight
                share[port] = bandwidth[port] / load[port]
                self.on_port[port].add(fid)
                self.dirty.add(port)
            if last and not self.recompute_pending and self.env.peek() > self.env.now:
                self._recompute()  # nothing else happens at this instant: no event to wait for
            else:
                self._schedule_recompute()

    def _call_later(self, delay: float, callback: Callable, *args) -> None:
        self.env.timeout(delay, (callback, args)).callbacks.append(_call)

    def _schedule_recompute(self) -> None:
        # Flows that start at the same instant share one recomputation.
        if not self.recompute_pending:
            self.recompute_pending = True
            self.env.timeout(0.0).callbacks.append(self._recompute)

    def _recompute(self, _event=None) -> None:
        self.recompute_pending = False
        now = self.env.now
        dirty, on_port, flows, heap = self.dirty, self.on_port, self.flows, self.heap
        share, push = self.share, heapq.heappush
        if len(dirty) == 1:
            affected = on_port[next(iter(dirty))]
        else:
            affected = set().union(*(on_port[p] for p in dirty)) if dirty else set()
        dirty.clear()
        # each flow's update reads only its own ports' loads, so the order of the updates (a
        # set's) changes nothing; the heap breaks ties between equal finishes by flow id
        for fid in affected:
            flow = flows[fid]
            rate = math.inf  # the smallest share on its path (``min``, spelled out on this hot path)
            for p in flow.ports:
                if share[p] < rate:
                    rate = share[p]
            if rate == flow.rate:
                continue  # it drains as before: its heap entry still holds its finish
            remaining = flow.remaining - flow.rate * (now - flow.since)
            flow.remaining, flow.since = remaining, now
            finish = now + (remaining if remaining > 0.0 else 0.0) / rate
            flow.rate, flow.finish = rate, finish
            flow.version += 1
            push(heap, (finish, fid, flow.version))
        if len(heap) > 4 * len(flows) + 64:  # mostly superseded entries: keep only the live ones
            heap[:] = [entry for entry in heap if entry[1] in flows and flows[entry[1]].version == entry[2]]
            heapq.heapify(heap)
        self._arm()

    def _arm(self) -> None:
        heap, flows = self.heap, self.flows
        while heap and (heap[0][1] not in flows or flows[heap[0][1]].version != heap[0][2]):
            heapq.heappop(heap)
        if heap and heap[0][0] < self.wake_at:
            self.wake_at = when = heap[0][0]
            self.env.timeout(max(when - self.env.now, 0.0), when).callbacks.append(self._wake)

    def _wake(self, event) -> None:
        if event.value != self.wake_at:
            return  # superseded by an earlier wake-up
        self.wake_at = math.inf
        now = self.env.now
        finished = []
        heap, flows = self.heap, self.flows
        while heap and heap[0][0] <= now + _EPS * max(1.0, now):
            _, fid, version = heapq.heappop(heap)
            flow = flows.get(fid)
            if flow is None or flow.version != version:
                continue
            del flows[fid]
            for port, weight in flow.kind.ports:
                load = self.load[port] = self.load[port] - weight
                self.share[port] = self.bandwidth[port] / load if load > 0.0 else math.inf
                self.on_port[port].discard(fid)
                self.dirty.add(port)
            finished.append(flow)
        for flow in finished:
            flow.done(flow.kind, flow.owner)
        if self.dirty:
            self._recompute()
        else:
            self._arm()


def _call(event) -> None:
    """Run the ``(callback, args)`` an event carries as its value."""
    callback, args = event.value
    callback(*args)
