"""Replay: run a compiled plan (``sim.engine.compile``) on SimPy devices, links and memory.

Every device has four streams, as a GPU running NCCL does:

* a compute stream that runs its pipeline rank's actions in IR order: F, B, I and W take
  their cost-model time; a ``RECV`` blocks it until every slice it needs has arrived;
* a send stream: a ``SEND`` is issued without blocking compute (unless its link charges
  the sender for issuing it, ``LinkSpec.send_issue_s``: its flows leave at once while the
  compute stream is held up that long) and its flows (one per receiver whose slice
  overlaps the sender's: split-concat) leave together, one ``SEND`` after the other in
  issue order; a ``RECV`` whose link charges the receiver (``LinkSpec.recv_overhead_s``)
  holds the compute stream that long once its data is in;
* a receive side that buffers arriving data until the consuming action runs (receives are
  posted ahead, as ``batch_isend_irecv`` does, so a transfer starts when its send does);
* a collective stream: ``REDUCE_GRAD`` issues the stage's gradient all-reduce without
  blocking; it starts when every replica has issued it and has finished its previous
  all-reduce, and runs its phases' flows through the same ports as everything else;
* group collectives (``GROUP`` ops, ``sim.engine.groups``): one action's collective inside a
  replica's tensor- or context-parallel group or FSDP's gathers starts when every class of
  the group has issued it; a tensor-parallel one holds the compute stream until it ends, the
  others run beside the next compute op, which ends no earlier than they do.

After its last action a device waits for its all-reduces and runs the optimizer step; the
iteration ends with the last optimizer step. Memory (``sim.engine.result``) is recorded as
allocations and frees over time per device class. Classes of identical devices
(``sim.engine.symmetry``) run as one SimPy process, so the number of events grows with the number
of *distinct* devices and actions, not with replicas.

**Events per action** (the hot path, every device distinct): a compute action is one
timeout; a ``SEND`` none of its own, and each of its flows one event when it has left and one
when it arrives after the link latency (with contention, flows that start or end at one
instant share one rate recomputation and one wake-up instead of the first); a ``RECV`` one
event when it has to wait, none when its data is in; ``REDUCE_GRAD`` none on the compute
stream (its all-reduce is one process per stage). Measured on 256 BERT-48 devices in 16 stages
without symmetry: 0.94 events per action with contention (1.55 with jitter on every device,
which spreads flows over more instants), 1.2 without; at most 2 on every path.

If processes stop making progress before the end (a schedule that cannot run), ``simulate``
raises ``ScheduleError`` naming each blocked device and the action it waits on; SimPy runs
out of events rather than spinning, so this never hangs.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager

import simpy

from sim.engine.ports import Network
from sim.errors import ScheduleError
from sim.engine.result import OpTimes, Recorder, SimResult
from sim.engine.workload import COMPUTE, GROUP, RECV, SEND, Workload, mailbox, recv_mailbox

__all__ = ["simulate"]


def simulate(workload: Workload, *, contention: bool = True) -> SimResult:
    """Replay ``workload`` with the SimPy engine; ``contention=False`` equals the fast path."""
    if contention and not workload.contention:
        raise ValueError("this workload's classes are exact only without contention: compile it with "
                         "compile_workload(..., contention=True) to replay it with contention")
    with _gc_paused():
        replay = _Replay(workload, contention)
        replay.env.run()
    if replay.failure is None:
        replay.check_finished()
    records, failure = replay.records, replay.failure
    del replay  # the environment, ports and mailboxes go before the memory timelines are built
    return SimResult(workload, records, engine="simpy", contention=contention, failure=failure)


@contextmanager
def _gc_paused():
    """Pause the cyclic garbage collector during a replay.

    A replay allocates hundreds of thousands of short-lived events; with the collector on,
    its full passes over the growing heap cost about half the run time. Nothing the replay
    keeps needs cycle collection before it ends; the collector resumes afterwards.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class _Replay:
    def __init__(self, workload: Workload, contention: bool) -> None:
        self.w = workload
        self.env = simpy.Environment()
        self.net = Network(self.env, workload, contention=contention)
        n = len(workload.classes)
        self.records = [Recorder(op_times=OpTimes(len(c.ops))) for c in workload.classes]
        self.position = [0] * n
        self.finished = [False] * n
        self.boxes: dict[tuple, list] = {}  # mailbox -> [count, last arrival]
        self.waiters: dict[tuple, tuple[int, simpy.Event]] = {}
        self.send_queue: list[list[tuple[int, object]]] = [[] for _ in range(n)]
        self.send_busy = [False] * n
        self.issued: dict[int, list] = {}
        self.last_collective: list[simpy.Event | None] = [None] * n
        self.collective_done: dict[int, simpy.Event] = {}
        self.group_issued: dict[tuple, list] = {}
        self.group_done: dict[tuple, simpy.Event] = {}
        self.pending: list[list[simpy.Event]] = [[] for _ in range(n)]
        self.failure: dict | None = None
        self.processes = [self.env.process(self._device(c)) for c in range(n)]
        for c, cls in enumerate(workload.classes):
            if cls.fails_at_s is not None:
                self.env.process(self._fail(c, cls.fails_at_s))

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

    # --- compute stream ----------------------------------------------------------------------

    def _device(self, c: int):
        try:
            yield from self._actions(c)
        except simpy.Interrupt:
            return  # the device failed (``_fail``)

    def _actions(self, c: int):
        env, rec = self.env, self.records[c]
        cls = self.w.classes[c]
        ops, position, memory, buffers = cls.ops, self.position, rec.memory, rec.buffers  # ``Deltas``
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
                duration = op[5] * slowdown if slow and start >= slow_from else op[5]
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
                self._queue_send(c, i, op)
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
                if op.flows and (box is None or box[0] < len(op.flows)):
                    event = env.event()
                    self.waiters[key] = (len(op.flows), event)
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

    # --- send stream and arrivals --------------------------------------------------------------

    def _queue_send(self, c: int, i: int, op) -> None:
        self.send_queue[c].append((i, op))
        if not self.send_busy[c]:
            self._next_send(c)

    def _next_send(self, c: int) -> None:
        queue = self.send_queue[c]
        if not queue:
            self.send_busy[c] = False
            return
        self.send_busy[c] = True
        i, op = queue.pop(0)
        start, rec = self.env.now, self.records[c]
        pending = [len(op.flows)]

        def left(kind) -> None:
            self._arrive_later(kind, op.microbatch)
            pending[0] -= 1
            if pending[0] == 0:
                rec.op_times[i] = (start, self.env.now)
                self._next_send(c)

        if not op.flows:
            rec.op_times[i] = (start, start)
            self._next_send(c)
        for k in op.flows:
            kind = self.w.kinds[k]
            rec.bytes_sent += kind.send_bytes_per_device
            self.net.transfer(kind, lambda kind=kind: left(kind))

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

    # --- collectives -------------------------------------------------------------------------

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

    def _phases(self, coll):
        """Run a collective's phases one after another: each phase's flows together, then its latency."""
        for kinds, latency in coll.phases:
            if kinds:
                phase = self.env.event()
                remaining = [len(kinds)]

                def left(phase=phase, remaining=remaining) -> None:
                    remaining[0] -= 1
                    if remaining[0] == 0:
                        phase.succeed()

                for k in kinds:
                    self.net.transfer(self.w.kinds[k], left)
                yield phase
            if latency > 0:
                yield self.env.timeout(latency)

    # --- group collectives (tensor- and context-parallel groups, FSDP) ------------------------

    def _join_group(self, c: int, i: int, op) -> simpy.Event:
        """Issue class ``c``'s part of one action's group collective; the event fires when it ends."""
        key = (op.collective, op.microbatch, op.kind)
        coll = self.w.group_collectives[op.collective]
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

    # --- end -----------------------------------------------------------------------------------

    def check_finished(self) -> None:
        stuck = [c for c, ok in enumerate(self.finished) if not ok]
        if not stuck:
            return
        from sim.schedule.check import format_grid

        classes = self.w.classes
        lines, mark = [], None
        for c in stuck:
            ops, position = classes[c].ops, self.position[c]
            where = ops[position].text if position < len(ops) else "its all-reduce"
            lines.append(f"rank {classes[c].rank} (device {classes[c].devices[0]}) blocked at {where}")
            if mark is None and position < len(ops):
                mark = (classes[c].rank, position)
        raise ScheduleError(
            f"the replay stopped making progress at {self.env.now * 1e3:.3f} ms: " + "; ".join(lines[:4]),
            detail="\n".join(lines) + "\n" + format_grid(self.w.schedule, mark, window=12),
        )
