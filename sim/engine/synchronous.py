"""The synchronous SimPy replay (``sim.engine.replay``): every action at its own instant.

A device failure stops every device at one instant, so a replay with one cannot let devices
run ahead on their own clocks: each action is its own SimPy event (a compute action a
timeout, a RECV an event when its data is not in), and all-reduces and group collectives are
processes that start when their last member issues them. ``simulate(..., run_ahead=False)``
replays this way too; a property test checks that it gives the run-ahead replay's times.
"""

from __future__ import annotations

import simpy

from sim.engine.workload import COMPUTE, GROUP, RECV, SEND, recv_mailbox

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
        env, rec = self.env, self.records[c]
        cls = self.w.classes[c]
        ops, position, memory, buffers = cls.ops, self.position, rec.memory, rec.buffers  # ``Deltas``
        durations = cls.durations
        starts, ends = rec.op_times.start, rec.op_times.end
        timeout = env.timeout
        slowdown, slow_from = cls.slowdown, cls.slow_from_s
        slow = slowdown != 1.0  # x * 1.0 == x: skipping the product changes no time
        for i, op in enumerate(ops):
            position[c] = i
            code = op[0]
            if code == COMPUTE:
                start = env.now
                if op[6]:
                    memory.append((start, op[6]))
                if op.gather_bytes:
                    buffers.append((start, op.gather_bytes))
                duration = durations[i] * slowdown if slow and start >= slow_from else durations[i]
                if duration > 0:
                    yield timeout(duration)
                end = env.now
                starts[i], ends[i] = start, end
                if self.pending[c]:  # the action ends with the collectives that ran beside it
                    pending = [e for e in self.pending[c] if not e.processed]
                    self.pending[c] = []
                    if pending:
                        yield simpy.AllOf(env, pending)
                        end = env.now
                if op.gather_bytes:
                    buffers.append((end, -op.gather_bytes))
                if op[7]:
                    memory.append((end, -op[7]))
                if op[8]:
                    buffers.append((end, -op[8]))
            elif code == SEND:
                self._queue_send(self.streams[c], i, op)
                if op.duration_s > 0:  # issuing holds up the compute stream (gloo on a CPU)
                    yield env.timeout(op.duration_s * (cls.slowdown if env.now >= cls.slow_from_s else 1.0))
            elif code == GROUP:
                done = self._join_group(c, i, op)
                if op.overlap:
                    self.pending[c].append(done)
                elif not done.processed:
                    yield done
            elif code == RECV:
                start = env.now
                key = recv_mailbox(c, op)
                box = self.boxes.get(key)
                flows = cls.slots[op.flows] if op.flows >= 0 else ()
                if flows and (box is None or box[0] < len(flows)):
                    event = env.event()
                    self.waiters[key] = (len(flows), event)
                    yield event
                if op.duration_s > 0:  # taking the data in costs the compute stream (gloo on a CPU)
                    yield env.timeout(op.duration_s * (cls.slowdown if env.now >= cls.slow_from_s else 1.0))
                rec.op_times[i] = (start, env.now)
            else:
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

    def _issue_collective(self, c: int, i: int, op) -> None:
        if op.collective < 0:
            self.records[c].op_times[i] = (self.env.now, self.env.now)
            return
        coll = self.w.collectives[op.collective]
        issued = self.issued.setdefault(coll.index, [])
        issued.append((c, i, self.last_collective[c]))
        done = self.collective_done.setdefault(coll.index, self.env.event())
        self.last_collective[c] = done
        if len(issued) == len(coll.participants):
            self.env.process(self._collective(coll, issued, done))

    def _collective(self, coll, issued, done: simpy.Event):
        earlier = [prev for _, _, prev in issued if prev is not None and not prev.processed]
        if earlier:
            yield simpy.AllOf(self.env, earlier)
        start = self.env.now
        yield from self._phases(coll)
        for c, i, _ in issued:
            self.records[c].op_times[i] = (start, self.env.now)
        done.succeed()

    def _join_group(self, c: int, i: int, op) -> simpy.Event:
        """Issue class ``c``'s part of one action's group collective; the event fires when it ends."""
        g = self.w.classes[c].groups[op.collective]
        key = (g, op.microbatch, op.kind)
        coll = self.w.group_collectives[g]
        issued = self.group_issued.setdefault(key, [])
        issued.append((c, i))
        done = self.group_done.setdefault(key, self.env.event())
        if len(issued) == len(coll.participants):
            self.env.process(self._group(coll, issued, done))
        return done

    def _group(self, coll, issued, done: simpy.Event):
        start = self.env.now
        yield from self._phases(coll)
        for c, i in issued:
            self.records[c].op_times[i] = (start, self.env.now)
        done.succeed()
