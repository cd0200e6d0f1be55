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

What each op does, in time and memory, is the rule book's (``sim.engine.rules``), which the
fast path (``sim.engine.fastpath``, ``sim.engine.vector``) reads too. After its last action a
device waits for its all-reduces and runs the optimizer step; the iteration ends with the last
optimizer step. Memory (``sim.engine.result``) is recorded as allocations and frees over time
per device class. Classes of identical devices
(``sim.engine.symmetry``) run as one SimPy process, so the number of events grows with the number
of *distinct* devices and actions, not with replicas.

**Each device on its own clock.** What a device does depends on the others only through
what it waits for (its data, its group's collectives, its all-reduces), so a device process
computes its own actions' times and yields to SimPy only to wait for something a device behind
it has not done yet (``_Replay._actions_ahead``). Its sends start on the network at their own
instants; without contention a flow's time is fixed, so its arrival is known when it is sent.
A replay with a device failure, which stops every device at one instant, runs every action at
its own instant instead (``sim.engine.synchronous``, also ``simulate(..., run_ahead=False)``); the
two give the same times (a property test checks it).

**Events per action** (the hot path, every device distinct): a compute action none; a
``RECV`` one when its data is not in when the device reaches it, none otherwise; a ``SEND``
none; ``REDUCE_GRAD`` none on the compute stream (its all-reduce is one process per stage).
With contention the network (``sim.engine.ports``) keeps its own clock beside SimPy's, with
entries on its own heaps rather than SimPy events: a SEND due after its send stream is free
waits on one of its alarms (a SEND queued behind another starts when that one's flows have
left, with no alarm), a flow leaves at one of its instants (flows that end at one instant
share it), and the rates are set once per instant. Measured on 1,024 BERT-48 devices in 16
stages (``benchmarks/engine_bench.py``), every device distinct: without contention 0.09 SimPy
events per action; with contention 0.25 (plus 0.14 network instants and alarms), and 0.24
with jitter on every device (plus 0.53, as jitter spreads flows over more instants); at most
2 on every path.

If processes stop making progress before the end (a schedule that cannot run), ``simulate``
raises ``ScheduleError`` naming each blocked device and the action it waits on; SimPy runs
out of events rather than spinning, so this never hangs.
"""

from __future__ import annotations

from array import array

import simpy

from sim.core.errors import ScheduleError
from sim.engine import rules
from sim.engine.gcpause import gc_paused
from sim.engine.ports import Network
from sim.engine.records import OpTimes, Recorder
from sim.engine.result import SimResult
from sim.engine.rules import collective_duration_s
from sim.engine.sends import Diverged, Sends
from sim.engine.synchronous import Synchronous
from sim.engine.workload import COMPUTE, DETACHED_S, GROUP, RECV, SEND, Workload
from sim.schedule.check import format_grid

__all__ = ["Diverged", "simulate"]


@gc_paused()  # the replay's events and the result's timelines: millions of objects
def simulate(workload: Workload, *, contention: bool = True, run_ahead: bool = True) -> SimResult:
    """Replay ``workload`` with the SimPy engine; ``contention=False`` equals the fast path.

    ``run_ahead=False`` replays every action as its own SimPy event at its own instant (the
    synchronous replay, which device failures always use): the same times, more slowly.
    """
    if contention and not workload.contention:
        raise ValueError("this workload's classes are exact only without contention: compile it with "
                         "compile_workload(..., contention=True) to replay it with contention")
    if workload.optimistic and not contention:
        raise ValueError("an optimistic workload's classes are checked only with contention: compile it "
                         "with compile_workload(..., contention=False) to replay it without")
    replay = _Replay(workload, contention, run_ahead)
    replay.net.run()
    replay.record_logs()
    if replay.failure is None:
        replay.check_finished()
        if replay.ahead:
            replay.optimizer_steps()
    records, failure = replay.records, replay.failure
    del replay  # the environment, ports and mailboxes go before the memory timelines are built
    return SimResult(workload, records, engine="simpy", contention=contention, failure=failure)


class _Replay(Sends, Synchronous):
    """One replay of a workload: the run-ahead compute streams and collectives here, the send
    streams and arrivals in ``sim.engine.sends``, the synchronous replay in
    ``sim.engine.synchronous``."""

    def __init__(self, workload: Workload, contention: bool, run_ahead: bool = True) -> None:
        self.w = workload
        self.env = simpy.Environment()
        self.net = Network(self.env, workload, contention=contention)
        n = len(workload.classes)
        self.records = [Recorder(op_times=OpTimes(len(c.ops))) for c in workload.classes]
        self.position = [0] * n
        self.finished = [False] * n
        self.boxes: dict[tuple, list] = {}  # mailbox -> [count, last arrival]
        self.waiters: dict[tuple, tuple[int, simpy.Event]] = {}
        self._init_sends(workload)  # send streams and the logs of what arrives (``sim.engine.sends``)
        self.issued: dict[int, list] = {}
        self.last_collective: list[simpy.Event | None] = [None] * n
        self.collective_done: dict[int, simpy.Event] = {}
        self.group_issued: dict[tuple, list] = {}
        self.group_done: dict[tuple, simpy.Event] = {}
        self.group_started: dict[tuple, simpy.Event] = {}  # the synchronous replay's, with their start
        self.pending: list[list[tuple]] = [[] for _ in range(n)]  # the synchronous replay's beside collectives
        self.kinds = workload.kinds
        self.failure: dict | None = None
        # without failures (which stop everyone at one instant) each device runs ahead on its
        # own clock: see ``_actions_ahead``
        self.contention = contention
        self.ahead = run_ahead and not any(c.fails_at_s is not None for c in workload.classes)
        self.steps: dict[int, tuple] = {}  # per op list (classes share them): ``rules.steps``
        self.memory_plans: dict[int, tuple] = {}  # and ``rules.memory_plan``
        if self.ahead:
            self.kind_s = [rules.flow_alone_s(k) for k in workload.kinds]
            # mailboxes are ints, ``2 * (box * num_microbatches + microbatch)`` (the fast path's
            # numbering, ``rules.box_numbers``, doubled): ``box[key]`` counts the flows in,
            # ``box[key + 1]`` is the last arrival (side by side, one cache line for both)
            numbers, num_boxes = rules.box_numbers(workload.kinds, workload.num_microbatches)
            self.kind_box = [2 * number if number >= 0 else -1 for number in numbers]
            self.box = array("d", [0.0]) * (2 * num_boxes * max(workload.num_microbatches, 1))
            self.coll_free = [0.0] * n
            self.clock = [0.0] * n
            self.unfinished_collectives = [0] * n
            self.group_end: dict[tuple, tuple[float, float]] = {}
        self.processes = [self.env.process(self._device(c)) for c in range(n)]
        for c, cls in enumerate(workload.classes):
            if cls.fails_at_s is not None:
                self.env.process(self._fail(c, cls.fails_at_s))

    # --- compute stream ----------------------------------------------------------------------

    def steps_of(self, ops) -> tuple:
        """``rules.steps(ops)``, once per op list (classes whose ops are alike share one)."""
        steps = self.steps.get(id(ops))
        if steps is None:
            steps = self.steps[id(ops)] = rules.steps(ops)
        return steps

    def memory_plan(self, ops) -> tuple:
        """``rules.memory_plan(ops)``, once per op list (the synchronous replay reads it)."""
        plan = self.memory_plans.get(id(ops))
        if plan is None:
            plan = self.memory_plans[id(ops)] = rules.memory_plan(ops)
        return plan

    def _device(self, c: int):
        if self.ahead:
            yield from self._actions_ahead(c)
            return
        try:
            yield from self._actions(c)
        except simpy.Interrupt:
            return  # the device failed (``_fail``)

    # --- every device on its own clock (run ahead) --------------------------------------------

    def _actions_ahead(self, c: int):
        """The compute stream of class ``c`` on the device's own clock ``t``: it yields to SimPy
        only to wait for something a device behind it has not done yet (its data, its group's
        collectives), and its sends start on the network at their own instants (without
        contention they arrive when sent: ``_send_alone``). The rules are the rule book's
        (``sim.engine.rules``), as the synchronous ``_actions`` and the fast path replay them."""
        env, rec, cls = self.env, self.records[c], self.w.classes[c]
        ops, position, durations, slots, groups = cls.ops, self.position, cls.durations, cls.slots, cls.groups
        steps = self.steps_of(ops)
        starts, ends = rec.op_times.start, rec.op_times.end
        memory_at, memory_delta = rec.memory.times.append, rec.memory.deltas.append  # ``rules.ACTIVATIONS``
        buffer_at, buffer_delta = rec.buffers.times.append, rec.buffers.deltas.append  # ``rules.BUFFERS``
        kind_box, box, contention, stream = self.kind_box, self.box, self.contention, self.streams[c]
        slowdown, slow_from, slow = cls.slowdown, cls.slow_from_s, cls.slowdown != 1.0
        t, send_free = 0.0, 0.0  # its clock; when its send stream is free (without contention)
        beside: list = []  # collectives running beside the next compute op
        for i, (code, mb, flows, cost_s, alloc, gather, free, buffer) in enumerate(steps):
            if code == COMPUTE:
                overlapped = 0.0
                if beside:  # the action ends with the collectives that ran beside it
                    position[c] = i  # ``position`` is set where it waits: no one reads it otherwise
                    first, overlapped = yield from self._beside_end(beside)
                    beside = []
                    t = first if first > t else t  # it needs their first pieces (``rules.beside_bounds``)
                duration = rules.stretched_s(durations[i], t, slowdown, slow_from) if slow else durations[i]
                end = t + duration  # ``rules.compute_end`` inlined, as ``recv_end_s`` (a call per op costs ~4%)
                end = overlapped if overlapped > end else end
                starts[i], ends[i] = t, end
                if alloc:  # ``rules.MEMORY``, unrolled (see ``rules.steps``)
                    memory_at(t)
                    memory_delta(alloc)
                if gather:
                    buffer_at(t)
                    buffer_delta(gather)
                    buffer_at(end)
                    buffer_delta(-gather)
                if free:
                    memory_at(end)
                    memory_delta(-free)
                if buffer:
                    buffer_at(end)
                    buffer_delta(-buffer)
                t = end
            elif code == SEND:
                if contention:  # its flows start at ``t`` or when the send stream is free
                    self._queue_send(stream, i, ops[i], t)
                else:
                    send_free = self._send_alone(c, i, ops[i], t, send_free)
                if cost_s:  # issuing holds up the compute stream (gloo on a CPU)
                    t += rules.stretched_s(cost_s, t, slowdown, slow_from) if slow else cost_s
            elif code == RECV:
                flows = slots[flows] if flows >= 0 else ()
                arrival = t
                if flows:
                    key = kind_box[flows[0]] + 2 * mb
                    if box[key] < len(flows):
                        event = env.event()
                        self.waiters[key] = (len(flows), event)
                        position[c] = i
                        yield event
                    arrival = box[key + 1] if box[key + 1] > t else t
                cost = rules.stretched_s(cost_s, arrival, slowdown, slow_from) if slow else cost_s
                starts[i] = t
                t = ends[i] = arrival + cost  # ``rules.recv_end_s`` (``arrival`` >= ``t``)
            elif code == GROUP:
                op = ops[i]
                key = (groups[op.collective], mb, op.kind)
                done = self._join_group_ahead(c, i, op, t, key)
                if op.overlap:  # the next compute op waits for it, unless it is detached
                    beside += [(key, done, op.lead_s, op.tail_s)] if op.tail_s != DETACHED_S else []
                else:
                    if not done.triggered:
                        position[c] = i
                        yield done
                    t = rules.after_group(t, 0.0, self.group_end[key][1], False)[0]
            else:
                self._reduce_ahead(c, i, ops[i], t)
        position[c] = len(ops)
        self.clock[c] = t
        self.finished[c] = self.unfinished_collectives[c] == 0

    def _beside_end(self, beside: list):
        """Wait for the collectives that ran beside a compute op; the earliest start and end they
        allow it (``rules.beside_bounds``; a generator)."""
        first = latest = 0.0
        for key, done, lead_s, tail_s in beside:
            if not done.triggered:
                yield done
            first, latest = rules.beside_bounds(first, latest, *self.group_end[key], lead_s, tail_s)
        return first, latest

    def _send_alone(self, c: int, i: int, op, t: float, send_free: float) -> float:
        """SEND ``op`` of class ``c`` issued at ``t`` without contention: its flows' times are
        fixed, so each arrives in its mailbox when sent. When its send stream is free after it."""
        rec, kinds, kind_s, kind_box = self.records[c], self.kinds, self.kind_s, self.kind_box
        start = done = rules.send_start_s(t, send_free)
        mb = op.microbatch
        for k in (self.w.classes[c].slots[op.flows] if op.flows >= 0 else ()):
            sent = start + kind_s[k]
            if sent > done:
                done = sent
            kind = kinds[k]
            rec.bytes_sent += kind.send_bytes_per_device
            self._deliver(kind_box[k] + 2 * mb, sent + kind.latency_s, kind)
        rec.op_times.start[i], rec.op_times.end[i] = start, done
        return done

    def _reduce_ahead(self, c: int, i: int, op, t: float) -> None:
        """Class ``c`` issues its part of an all-reduce at ``t``; the last to issue it starts it."""
        if op.collective < 0:
            self.records[c].op_times[i] = (t, t)
            return
        coll = self.w.collectives[op.collective]
        key = (coll.index, op.microbatch)  # a stage's reduce-scatters, one per micro-batch
        issued = self.issued.setdefault(key, [])
        floor = -float("inf")
        if op.source >= 0:  # in buckets: from its backward's first bucket (``rules.reduce_issue_s``)
            cls, times = self.w.classes[c], self.records[c].op_times
            source_start = times.start[op.source]
            source_s = rules.stretched_s(cls.durations[op.source], source_start, cls.slowdown, cls.slow_from_s)
            t, floor = rules.reduce_issue_s(t, source_start, source_s, op.buckets, True), times.end[op.source] + op.tail_s
        issued.append((c, i, t, self.last_collective[c], floor))
        self.unfinished_collectives[c] += 1
        if self.contention:  # its previous all-reduce must end first (the sync replay's rule)
            self.last_collective[c] = self.collective_done.setdefault(key, self.env.event())
        if len(issued) < len(coll.participants):
            return
        floor = max(f for *_, f in issued)
        if self.contention:  # it runs through the ports from its last issue
            start = max(when for _, _, when, *_ in issued)
            self.env.process(self._collective_ahead(coll, issued, start, floor, self.collective_done[key]))
            return
        self._collective_ended(issued, *rules.collective_times(
            (when for _, _, when, *_ in issued), collective_duration_s(self.w, coll),
            (self.coll_free[p] for p in coll.participants), floor))

    def _collective_ahead(self, coll, issued, start: float, floor: float, done: simpy.Event):
        if start > self.env.now:
            yield self.env.timeout(start - self.env.now)
        earlier = [prev for _, _, _, prev, _ in issued if prev is not None and not prev.processed]
        if earlier:
            yield simpy.AllOf(self.env, earlier)
        begin = self.env.now
        yield from self._phases(coll)
        if floor > self.env.now:  # its last bucket, after the last backward (``rules.collective_times``)
            yield self.env.timeout(floor - self.env.now)
        self._collective_ended(issued, begin, self.env.now)
        done.succeed()

    def _collective_ended(self, issued, start: float, end: float) -> None:
        for p, index, *_ in issued:
            self.coll_free[p] = end
            self.records[p].op_times[index] = (start, end)
            self.unfinished_collectives[p] -= 1
            if self.unfinished_collectives[p] == 0 and self.position[p] == len(self.w.classes[p].ops):
                self.finished[p] = True

    def _join_group_ahead(self, c: int, i: int, op, t: float, key: tuple) -> simpy.Event:
        """Class ``c`` issues its part of one action's group collective at ``t``; the event fires
        when it has ended (``group_end[key]``)."""
        done = self.group_done.get(key)
        if done is None:
            done = self.group_done[key] = self.env.event()
        if key in self.group_end:
            return done
        coll = self.w.group_collectives[key[0]]
        issued = self.group_issued.setdefault(key, {})
        issued.setdefault(c, (i, t))
        if len(issued) == len(coll.participants):
            if self.contention:  # it runs through the ports from its last issue
                start = max(when for _, when in issued.values())
                self.env.process(self._group_ahead(coll, issued, start, key, done))
            else:
                start, end = rules.collective_times((when for _, when in issued.values()),
                                                    collective_duration_s(self.w, coll))
                self._group_ended(issued, start, end, key, done)
        return done

    def _group_ahead(self, coll, issued, start: float, key: tuple, done: simpy.Event):
        if start > self.env.now:
            yield self.env.timeout(start - self.env.now)
        begin = self.env.now
        yield from self._phases(coll)
        self._group_ended(issued, begin, self.env.now, key, done)

    def _group_ended(self, issued, start: float, end: float, key: tuple, done: simpy.Event) -> None:
        self.group_end[key] = start, end
        for p, (index, _) in issued.items():
            self.records[p].op_times[index] = (start, end)
        done.succeed()

    def optimizer_steps(self) -> None:
        """Each device's optimizer step, once its compute stream and its last all-reduce have ended."""
        for c, cls in enumerate(self.w.classes):
            start = rules.optimizer_start_s(self.clock[c], self.coll_free[c])
            self.records[c].optimizer = (start, start + cls.optimizer_s)

    # --- end -----------------------------------------------------------------------------------

    def check_finished(self) -> None:
        stuck = [c for c, ok in enumerate(self.finished) if not ok]
        if not stuck:
            return

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

