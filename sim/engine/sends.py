"""Send streams and arrivals of the SimPy replay (``sim.engine.replay``).

A device class's SENDs leave one after the other in issue order (its ``SendStream``), each
once it is due and the one before it has left; their flows cross the network
(``sim.engine.ports``), and each flow that has left arrives in its receiver's mailbox, where
a waiting device goes on once everything it needs is in. What the network's callbacks learn
goes to flat logs (when a SEND's flows have left, which flows came in and when), written
into each class's records when the replay ends (``Sends.record_logs``): reaching into
16,384 devices' records flow by flow costs a cache miss at each step. A collective's phases
(``Sends._phases``) put their flows on the same network, one phase after the other.
"""

from __future__ import annotations

from array import array

import numpy as np

from sim.engine.workload import mailbox

__all__ = ["Diverged", "SendStream", "Sends"]


class Diverged(Exception):
    """Flows an optimistic workload treats as one (sibling kinds, ``Workload.optimistic``) did
    not leave together: its classes are not exact for this plan; replay the equitable ones."""


class SendStream:
    """A device class's send stream: its SENDs in issue order, one after the other."""

    __slots__ = ("index", "queue", "busy", "slots", "bytes_sent")

    def __init__(self, index: int, slots: tuple) -> None:
        self.index = index  # its class
        self.queue: list[tuple[float, int, object]] = []  # (due, op index, op) in issue order (short: a list)
        self.busy = False  # a SEND's flows are on the network, or the stream waits for the first to be due
        self.slots = slots  # the class's ``DeviceClass.slots``
        self.bytes_sent = 0.0  # by each device of the class (``Recorder.bytes_sent`` when it ends)


class Sends:
    """The send streams and arrivals of ``sim.engine.replay._Replay`` (a mixin): it reads the
    replay's ``env``, ``net``, ``records``, ``kinds``, ``ahead`` and mailboxes (``box`` and
    ``kind_box`` when devices run ahead, ``boxes`` otherwise) and wakes its ``waiters``."""

    def _init_sends(self, workload) -> None:
        self.streams = [SendStream(c, cls.slots) for c, cls in enumerate(workload.classes)]
        self.sent = array("d")  # (class, op, start, end) of each SEND, once its flows have left
        self.arrived_kind = array("l")  # the kind of each flow in (``_deliver``), in arrival order
        self.arrived_at = array("d")  # and when it came in
        self.left, self.next_send = self._left, self._next_send  # bound once, not per flow

    def record_logs(self) -> None:
        """Write what the logs hold into each class's records: the SENDs' times, the bytes its
        send stream sent, and each flow in (its receive buffer and bytes, in arrival order)."""
        records = self.records
        for stream in self.streams:
            records[stream.index].bytes_sent += stream.bytes_sent
        sent = np.frombuffer(self.sent, dtype=float).reshape(-1, 4)
        for c, rows in _by_class(sent[:, 0].astype(np.intp), len(records)):
            ops = sent[rows, 1].astype(np.intp)
            np.frombuffer(records[c].op_times.start, dtype=float)[ops] = sent[rows, 2]
            np.frombuffer(records[c].op_times.end, dtype=float)[ops] = sent[rows, 3]
        if not len(self.arrived_kind):
            return
        kinds = np.frombuffer(self.arrived_kind, dtype=f"i{self.arrived_kind.itemsize}")  # a C long
        at = np.frombuffer(self.arrived_at, dtype=float)
        dst = np.array([k.dst_class for k in self.kinds], dtype=np.intp)[kinds]
        nbytes = np.array([k.recv_bytes_per_device for k in self.kinds], dtype=float)[kinds]
        for c, rows in _by_class(dst, len(records)):
            rec, received = records[c], nbytes[rows]
            rec.buffers.times.frombytes(at[rows].tobytes())
            rec.buffers.deltas.frombytes(received.tobytes())
            rec.bytes_received += sum(received.tolist())  # in arrival order, as one by one

    def _queue_send(self, stream: SendStream, i: int, op, due: float = 0.0) -> None:
        """A class issues SEND ``op`` (op ``i``) on its send ``stream``: its flows leave at ``due`` (a
        device that runs ahead issues it early) or once the SENDs before it have left, whichever
        is later."""
        stream.queue.append((due, i, op))
        if not stream.busy:
            self._next_send(stream)

    def _next_send(self, stream: SendStream) -> None:
        """Start the first SEND in ``stream``'s queue, or wait for it (an alarm on the network's
        clock) if it is not due yet; the stream is free when its queue is empty."""
        queue, net = stream.queue, self.net
        while queue:
            due, i, op = queue[0]
            now = net.now
            if due > now:
                stream.busy = True
                net.at(due, self.next_send, stream)
                return
            del queue[0]
            flows = stream.slots[op.flows] if op.flows >= 0 else ()
            if flows:
                stream.busy = True
                kinds, left = self.kinds, self.left
                sending = [stream, i, now, len(flows), op.microbatch, None]  # what ``_left`` needs of this SEND
                for k in flows:
                    kind = kinds[k]
                    stream.bytes_sent += kind.send_bytes_per_device
                    net.transfer(kind, left, sending)
                return
            self.sent.extend((stream.index, i, now, now))
        stream.busy = False

    def _left(self, kind, sending: list) -> None:
        """One flow of a SEND has left its sender (``sending``: its send stream, op, start, flows
        to go, micro-batch, when each sibling group left)."""
        now = self.net.now
        if kind.sibling >= 0:
            if sending[5] is None:
                sending[5] = {}
            if sending[5].setdefault(kind.sibling, now) != now:
                raise Diverged(f"flows {kind.label} of class {kind.src_class} left at different times")
        if self.ahead:  # the devices keep their own clocks: they read the arrival's time
            self._deliver(self.kind_box[kind.index] + 2 * sending[4], now + kind.latency_s, kind)
        else:
            self._arrive_later(kind, sending[4])
        sending[3] -= 1
        if not sending[3]:
            stream = sending[0]
            self.sent.extend((stream.index, sending[1], sending[2], now))
            self._next_send(stream)

    def _deliver(self, key: int, when: float, kind) -> None:
        """A flow of ``kind`` arrives at ``when`` (known once it has left, or without contention
        once it is sent) in mailbox ``key``; a device waiting for it goes on when the last one is in."""
        box = self.box
        count = box[key] = box[key] + 1.0
        if when > box[key + 1]:
            box[key + 1] = when
        self.arrived_kind.append(kind.index)  # its receive buffer, in its class's records later
        self.arrived_at.append(when if when > 0.0 else 0.0)
        waiter = self.waiters.get(key)
        if waiter is not None and count >= waiter[0]:
            del self.waiters[key]
            waiter[1].succeed()

    def _arrive_later(self, kind, microbatch: int) -> None:
        key = mailbox(kind, microbatch)
        if kind.latency_s > 0:
            event = self.env.timeout(kind.latency_s)
            event.callbacks.append(lambda _event: self._arrive(key, kind))
        else:
            self._arrive(key, kind)

    def _arrive(self, key: tuple, kind) -> None:
        now = self.env.now
        box = self.boxes.setdefault(key, [0, now])
        box[0] += 1
        box[1] = now
        rec = self.records[key[0]]
        rec.bytes_received += kind.recv_bytes_per_device
        rec.buffers.append((now, kind.recv_bytes_per_device))
        waiter = self.waiters.get(key)
        if waiter is not None and box[0] >= waiter[0]:
            del self.waiters[key]
            waiter[1].succeed()

    def _phases(self, coll):
        """Run a collective's phases one after another: each phase's flows together, then its latency."""
        for kinds, latency in coll.phases:
            if kinds:
                phase = [len(kinds), self.env.event(), {}]  # flows to go, the event when they have left
                for k in kinds:
                    self.net.transfer(self.w.kinds[k], _phase_left, phase)
                yield phase[1]
            if latency > 0:
                yield self.env.timeout(latency)


def _phase_left(kind, phase: list) -> None:
    """One flow of a collective's phase has left (``phase``: flows to go, the phase's event,
    when each sibling group left)."""
    if kind.sibling >= 0 and phase[2].setdefault(kind.sibling, phase[1].env.now) != phase[1].env.now:
        raise Diverged(f"flows {kind.label} of class {kind.src_class} left at different times")
    phase[0] -= 1
    if phase[0] == 0:
        phase[1].succeed()


def _by_class(classes, n: int):
    """``(class, rows)`` for each class in ``classes`` (an int array), its rows in log order."""
    order = np.argsort(classes, kind="stable")
    bounds = np.searchsorted(classes[order], np.arange(n + 1))
    for c in np.flatnonzero(bounds[1:] > bounds[:-1]).tolist():
        yield c, order[bounds[c]:bounds[c + 1]]
