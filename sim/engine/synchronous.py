"""The synchronous SimPy replay (``sim.engine.replay``): every action at its own instant.

A device failure stops every device at one instant, so a replay with one cannot let devices
run ahead on their own clocks: each action is its own SimPy event (a compute action a
timeout, a RECV an event when its data is not in), and all-reduces and group collectives are
processes that start when their last member issues them. ``simulate(..., run_ahead=False)``
replays this way too; a property test checks that it gives the run-ahead replay's times.
"""

from __future__ import annotations

import simpy

from sim.engine import rules
from sim.engine.workload import COMPUTE, DETACHED_S, GROUP, RECV, REDUCE, SEND, recv_mailbox

__all__ = ["Synchronous"]


class Synchronous:
    """The synchronous compute stream, all-reduces and group collectives of
    ``sim.engine.replay._Replay`` (a mixin): it reads and writes the replay's state (``env``,
    ``w``, ``records``, ``position``, ``finished``, the mailboxes and collective registers)
    and sends through its send streams (``sim.engine.sends``)."""

    def _fail(self, c: int, at_s: float):
        """A device dies: it stops where it is, and everyone who waits for it waits forever."""
        yield self.env.timeout(at_s)
        if self.finished[c] or self.failure is not None:
            return
        ops = self.w.classes[c].ops
        where = ops[self.position[c]].text if self.position[c] < len(ops) else "its optimizer step"
        self.failure = {"device": self.w.classes[c].devices[0], "time_s": at_s, "action": where}
        # the job stops with the device (NCCL aborts the others): the iteration is lost
        raise simpy.core.StopSimulation(self.failure)

    def _actions(self, c: int):
        """The compute stream of class ``c``, each action its own SimPy event at its own instant;
        the rules are the rule book's (``sim.engine.rules``): a wait is an event here."""
        env, rec = self.env, self.records[c]
        cls = self.w.classes[c]
        ops, position = cls.ops, self.position
        plan = self.memory_plan(ops)
        bucketed = {op.source: j for j, op in enumerate(ops) if op.code == REDUCE and op.source >= 0}
        for i, op in enumerate(ops):
            position[c] = i
            code = op.code
            if code == COMPUTE:
                yield from self._compute(c, i, plan[i], bucketed.get(i))
            elif code == SEND:
                self._queue_send(self.streams[c], i, op)
                if op.duration_s > 0:  # issuing holds up the compute stream (gloo on a CPU)
                    yield env.timeout(rules.stretched_s(op.duration_s, env.now, cls.slowdown, cls.slow_from_s))
            elif code == GROUP:
                done, started = self._join_group(c, i, op)
                if op.overlap:
                    if op.tail_s != DETACHED_S:  # a detached one holds no compute op
                        self.pending[c].append((done, started, op.lead_s, op.tail_s))
                elif not done.processed:
                    yield done
            elif code == RECV:
                yield from self._recv(c, i, op)
            elif op.source < 0:  # a bucketed one was issued during its backward (``_compute``)
                self._issue_collective(c, i, op)
        self.position[c] = len(ops)
        last = self.last_collective[c]
        if last is not None and not last.processed:
            yield last
        start = env.now
        optimizer_s = self.w.classes[c].optimizer_s
        if optimizer_s > 0:
            yield env.timeout(optimizer_s)
        rec.optimizer = (start, env.now)
        self.finished[c] = True

    def _compute(self, c: int, i: int, memory, reduce: int | None):
        """Compute op ``i`` of class ``c``: after the first pieces of the collectives issued
        beside it, for its duration, and until they have ended (``rules.beside_bounds``); a
        backward whose gradients reduce in buckets issues its REDUCE op ``reduce`` when its
        first bucket is full (``rules.reduce_issue_s``)."""
        env, rec, cls = self.env, self.records[c], self.w.classes[c]
        ledgers = (rec.memory, rec.buffers)  # per ledger (``rules.ACTIVATIONS``, ``BUFFERS``): ``Deltas``
        pending, self.pending[c] = self.pending[c], []
        first = 0.0
        for done, started, lead_s, _ in pending:
            if lead_s > 0:
                if not started.processed:
                    yield started
                first = rules.beside_bounds(first, 0.0, started.value, 0.0, lead_s, 0.0)[0]
        if first > env.now:
            yield env.timeout(first - env.now)
        start = env.now
        at_start, at_end = memory
        for ledger, nbytes in at_start:
            ledgers[ledger].append((start, nbytes))
        duration = rules.stretched_s(cls.durations[i], start, cls.slowdown, cls.slow_from_s)
        ended = None
        if reduce is not None:
            op = cls.ops[reduce]
            ended = self.env.event()
            when = rules.reduce_issue_s(start, start, duration, op.buckets, True)
            self.env.process(self._issue_later(c, reduce, op, when - start, ended))
        if duration > 0:
            yield env.timeout(duration)
        if pending:  # it ends no earlier than the collectives that ran beside it
            waiting = [done for done, *_ in pending if not done.processed]
            if waiting:
                yield simpy.AllOf(env, waiting)
            latest = 0.0
            for done, _, _, tail_s in pending:
                latest = rules.beside_bounds(0.0, latest, 0.0, done.value, 0.0, tail_s)[1]
            if latest > env.now:
                yield env.timeout(latest - env.now)
        rec.op_times[i] = (start, env.now)
        for ledger, nbytes in at_end:
            ledgers[ledger].append((env.now, nbytes))
        if ended is not None:
            ended.succeed(env.now)

    def _issue_later(self, c: int, i: int, op, delay_s: float, ended: simpy.Event):
        """Issue bucketed REDUCE op ``i`` ``delay_s`` from now; ``ended`` fires with its backward's end."""
        if delay_s > 0:
            yield self.env.timeout(delay_s)
        self._issue_collective(c, i, op, ended)

    def _recv(self, c: int, i: int, op):
        """RECV ``op`` (op ``i``) of class ``c``: wait until its flows are in, then its receive cost."""
        env, cls = self.env, self.w.classes[c]
        start = env.now
        key = recv_mailbox(c, op)
        box = self.boxes.get(key)
        flows = cls.slots[op.flows] if op.flows >= 0 else ()
        if flows and (box is None or box[0] < len(flows)):
            event = env.event()
            self.waiters[key] = (len(flows), event)
            yield event
        if op.duration_s > 0:  # taking the data in costs the compute stream (gloo on a CPU)
            yield env.timeout(rules.stretched_s(op.duration_s, env.now, cls.slowdown, cls.slow_from_s))
        self.records[c].op_times[i] = (start, env.now)

    def _issue_collective(self, c: int, i: int, op, ended: simpy.Event | None = None) -> None:
        """Issue REDUCE op ``i`` of class ``c`` now; ``ended`` (bucketed) fires with its backward's end."""
        if op.collective < 0:
            self.records[c].op_times[i] = (self.env.now, self.env.now)
            return
        coll = self.w.collectives[op.collective]
        key = (coll.index, op.microbatch)  # a stage's reduce-scatters, one per micro-batch
        issued = self.issued.setdefault(key, [])
        issued.append((c, i, self.last_collective[c], ended, op.tail_s))
        done = self.collective_done.setdefault(key, self.env.event())
        self.last_collective[c] = done
        if len(issued) == len(coll.participants):
            self.env.process(self._collective(coll, issued, done))

    def _collective(self, coll, issued, done: simpy.Event):
        earlier = [prev for _, _, prev, *_ in issued if prev is not None and not prev.processed]
        if earlier:
            yield simpy.AllOf(self.env, earlier)
        start = self.env.now
        yield from self._phases(coll)
        backwards = [(ended, tail_s) for *_, ended, tail_s in issued if ended is not None]
        if backwards:  # its last bucket, after the last backward (``rules.collective_times``)
            waiting = [ended for ended, _ in backwards if not ended.processed]
            if waiting:
                yield simpy.AllOf(self.env, waiting)
            floor = max(ended.value + tail_s for ended, tail_s in backwards)
            if floor > self.env.now:
                yield self.env.timeout(floor - self.env.now)
        for c, i, *_ in issued:
            self.records[c].op_times[i] = (start, self.env.now)
        done.succeed()

    def _join_group(self, c: int, i: int, op) -> tuple[simpy.Event, simpy.Event | None]:
        """Issue class ``c``'s part of one action's group collective: two events, which fire with
        its end and (when it has a lead) with its start, when the last member issues it."""
        g = self.w.classes[c].groups[op.collective]
        key = (g, op.microbatch, op.kind)
        coll = self.w.group_collectives[g]
        issued = self.group_issued.setdefault(key, [])
        issued.append((c, i))
        done = self.group_done.setdefault(key, self.env.event())
        # only a pipelined one's start matters (its members' ops share their lead): no event otherwise
        started = self.group_started.setdefault(key, self.env.event()) if op.lead_s > 0 else None
        if len(issued) == len(coll.participants):
            if started is not None:
                started.succeed(self.env.now)
            self.env.process(self._group(coll, issued, done))
        return done, started

    def _group(self, coll, issued, done: simpy.Event):
        start = self.env.now
        yield from self._phases(coll)
        for c, i in issued:
            self.records[c].op_times[i] = (start, self.env.now)
        done.succeed(self.env.now)
