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
transfers so that an iteration finishes sooner. Nor is it smooth: n equal flows that start
δ apart on one port finish up to (n − 1)·δ apart (the first to start leaves first, well
ahead), so a difference in starts grows at every stage it crosses. Replicas in exact lockstep
and replicas whose compute times differ by one part in 10⁹ can end an iteration a few per
cent apart, and two correct replays that round differently agree only to about 1e-3 once
every device is distinct (``benchmarks/engine_bench.py`` measures both); compare jitter
studies over seeds.

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


class _Channel:
    """The flows that cross one set of ports: they always move at one rate."""

    __slots__ = ("index", "ports", "pair", "flows", "rate", "drained", "since", "version")

    def __init__(self, index: int, ports: tuple[int, ...]) -> None:
        self.index = index
        self.ports = ports
        self.pair = len(ports) == 2  # as every flow between two devices is
        self.flows: list[tuple] = []
        """A heap of ``(virtual finish, sequence, kind, done, owner)``."""
        self.rate = 0.0
        """Bytes/s of each of its flows; 0 once flows have joined or left, until the next
        recomputation sets it (and gives it a new heap entry)."""
        self.drained = 0.0
        """Bytes each of its flows has drained since it was last empty, as of ``since``."""
        self.since = 0.0
        self.version = 0
        """Of its one live entry on the network's heap."""


class Network:
    """The ports of a cluster; ``transfer`` starts a flow kind and calls back when it has left.

    Flows that cross the same ports (one *channel*: a path) always move at the same rate, so
    they are kept together, as one processor-sharing queue on virtual time: a channel's
    ``drained`` is the bytes each of its flows has drained since it was last empty, and a flow
    that joins when it reads ``v`` leaves when it reads ``v + bytes``. A change of shares then
    moves one entry per channel on the network's heap, not one per flow.
    """

    def __init__(self, env: simpy.Environment, workload, *, contention: bool) -> None:
        self.env = env
        self.contention = contention
        self.bandwidth = [p.bandwidth_bytes_per_s for p in workload.port_classes]
        self.load = [0.0] * len(self.bandwidth)
        self.share = [math.inf] * len(self.bandwidth)
        """Each port's bandwidth over its load (what one real flow through it may use)."""
        self.on_port: list[set[_Channel]] = [set() for _ in self.bandwidth]
        """The channels with flows on each port."""
        self.channel_of: dict[int, _Channel] = {}  # flow kind index -> its channel
        self.channel_by_ports: dict[tuple, _Channel] = {}
        self.heap: list[tuple] = []  # (finish of a channel's first flow, its index, version, the channel)
        self.busy = 0  # channels with flows
        self.dirty: set[int] = set()  # ports whose loads changed since the last recomputation
        self.next_id = 0
        self.next_at = math.inf
        """When the first flow on ``heap`` leaves (as of the last recomputation)."""
        self.now = env.now
        """The clock while ``run`` runs: SimPy's ``env.now``, read without a property call."""
        self.alarms: list[tuple] = []  # (when, sequence, callback, argument), set with ``at``

    def _channel(self, kind) -> _Channel:
        path = tuple(sorted(p for p, _ in kind.ports))
        channel = self.channel_by_ports.get(path)
        if channel is None:
            channel = self.channel_by_ports[path] = _Channel(len(self.channel_by_ports), path)
        self.channel_of[kind.index] = channel
        return channel

    def run(self) -> None:
        """Run the environment to its end, the network's instants merged with SimPy's events.

        The network keeps its own heaps: the finishes of its flows, and the alarms set with
        ``at``. Each instant runs SimPy's events at it (``Environment.step``), the flows that
        leave at it and the alarms due at it, in that order and until none is left; then the
        network sets its rates once, and the clock moves on to the earliest of SimPy's next
        event, the next finish and the next alarm. Only the clock is set here, to the
        network's instants (SimPy's ``Environment`` has no setter for it).
        """
        env = self.env
        queue, step, dirty, alarms, pop = env._queue, env.step, self.dirty, self.alarms, heapq.heappop
        now = self.now = env.now
        try:
            while True:
                if queue and queue[0][0] <= now:
                    step()
                elif self.next_at <= now:
                    self._finish(now)
                elif alarms and alarms[0][0] <= now:
                    _, _, callback, arg = pop(alarms)
                    callback(arg)
                else:  # nothing else at this instant: set the rates, and move the clock on
                    if dirty:
                        self._recompute(now)
                    then = self.next_at
                    if alarms and alarms[0][0] < then:
                        then = alarms[0][0]
                    if queue and queue[0][0] < then:
                        then = queue[0][0]
                    if then == math.inf:
                        return
                    env._now = now = self.now = then
        except simpy.core.StopSimulation:
            return  # a device failed (``sim.engine.replay``): the job stops with it

    def at(self, when: float, callback: Callable, arg) -> None:
        """Call ``callback(arg)`` at ``when`` (no earlier than now): an alarm on the network's
        clock, cheaper than a SimPy timeout; alarms due at one instant run in the order they
        were set."""
        heapq.heappush(self.alarms, (when, self.next_id, callback, arg))
        self.next_id += 1

    def transfer(self, kind, done: Callable, owner=None) -> None:
        """Start one flow of ``kind`` now; ``done(kind, owner)`` runs when its last byte has left.

        Its rate (and the rates it changes) is set once nothing else happens at this instant
        (``run``)."""
        if kind.bytes <= 0 or not kind.ports:
            self._call_later(0.0, done, kind, owner)
        elif not self.contention:
            self._call_later(kind.bytes / kind.static_rate_bytes_per_s, done, kind, owner)
        else:
            channel = self.channel_of.get(kind.index)
            if channel is None:
                channel = self._channel(kind)
            now, flows = self.now, channel.flows
            if flows:  # read its virtual time now: its rate changes
                channel.drained += channel.rate * (now - channel.since)
            else:
                channel.drained = 0.0
                self.busy += 1
                for port in channel.ports:
                    self.on_port[port].add(channel)
            channel.since, channel.rate = now, 0.0
            heapq.heappush(flows, (channel.drained + kind.bytes, self.next_id, kind, done, owner))
            self.next_id += 1
            load, share, bandwidth, dirty = self.load, self.share, self.bandwidth, self.dirty
            for port, weight in kind.ports:
                load[port] += weight
                share[port] = bandwidth[port] / load[port]
                dirty.add(port)

    def _call_later(self, delay: float, callback: Callable, *args) -> None:
        self.env.timeout(delay, (callback, args)).callbacks.append(_call)

    def _recompute(self, now: float) -> None:
        """Set the rates of the channels on the ports whose loads changed, and find the first finish."""
        dirty, on_port = self.dirty, self.on_port
        if len(dirty) == 1:
            affected = on_port[dirty.pop()]
        elif len(dirty) == 2:
            affected = on_port[dirty.pop()] | on_port[dirty.pop()]
        else:
            affected = set().union(*[on_port[p] for p in dirty])
            dirty.clear()
        share, heap, push = self.share, self.heap, heapq.heappush
        # each channel's update reads only its own ports' shares, so the order of the updates
        # (a set's) changes nothing; the heap breaks ties between equal finishes by channel
        for channel in affected:
            # the smallest share on its path (``min``, spelled out on this hot path)
            if channel.pair:
                a, b = channel.ports
                rate = share[a] if share[a] < share[b] else share[b]
            else:
                rate = math.inf
                for p in channel.ports:
                    if share[p] < rate:
                        rate = share[p]
            old = channel.rate
            if rate == old:
                continue  # it drains as before: its heap entry holds its finish
            if old:
                channel.drained += old * (now - channel.since)
                channel.since = now
            channel.rate = rate
            ahead = channel.flows[0][0] - channel.drained
            version = channel.version = channel.version + 1
            push(heap, (now + (ahead if ahead > 0.0 else 0.0) / rate, channel.index, version, channel))
        if len(heap) > 2 * self.busy + 64:  # mostly superseded entries: keep only the live ones
            heap[:] = [item for item in heap if item[3].version == item[2]]
            heapq.heapify(heap)
        while heap and (first := heap[0])[3].version != first[2]:
            heapq.heappop(heap)  # superseded
        self.next_at = heap[0][0] if heap else math.inf

    def _finish(self, now: float) -> None:
        """The flows due at ``now`` (within a tolerance) leave; their callbacks run."""
        tolerance = _EPS * now if now > 1.0 else _EPS
        limit = now + tolerance
        heap, finished, pop = self.heap, [], heapq.heappop
        load, share, bandwidth, dirty = self.load, self.share, self.bandwidth, self.dirty
        while heap and heap[0][0] <= limit:
            _, _, version, channel = pop(heap)
            if channel.version != version:
                continue
            rate, flows = channel.rate, channel.flows
            reading = channel.drained = channel.drained + rate * (now - channel.since)
            channel.since, channel.rate = now, 0.0  # its rate is set again by the recomputation
            reading += rate * tolerance  # what it drains within the tolerance
            while True:  # its first flow is due; the others that are within the tolerance too
                flow = pop(flows)
                for port, weight in flow[2].ports:
                    left = load[port] = load[port] - weight
                    share[port] = bandwidth[port] / left if left > 0.0 else math.inf
                    dirty.add(port)
                finished.append(flow)
                if not flows or flows[0][0] > reading:
                    break
            if not flows:
                self.busy -= 1
                for port in channel.ports:
                    self.on_port[port].discard(channel)
        self.next_at = math.inf  # until the recomputation after this instant (``dirty``) finds the next
        for flow in finished:
            flow[3](flow[2], flow[4])


def _call(event) -> None:
    """Run the ``(callback, args)`` an event carries as its value."""
    callback, args = event.value
    callback(*args)
