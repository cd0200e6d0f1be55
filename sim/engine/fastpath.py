"""Fast path: time a schedule on an idealised cluster, without SimPy.

Picture each rank as a worker with a to-do list and no shared resources: links never
congest and a transfer always takes the same ``comm_s``. Then the timeline follows from two
rules: a rank does its actions one at a time, in list order; an action starts as soon as its
rank is free and everything it depends on (:func:`sim.schedule.ir.dependencies`) has
finished, plus ``comm_s`` when that result comes from another rank. This is the textbook
setting of the closed forms in :mod:`sim.cost.closed_forms`, and a cheap first estimate for the
planner before the contention-aware engine (``sim.engine``) replays the plan.

Durations per stage: F takes ``fwd_s[s]``; B takes the full backward ``bwd_s[s]``; for a
split backward, W takes ``wgrad_s[s]`` and I the rest, ``bwd_s[s] − wgrad_s[s]`` (so
``bwd_s`` means the same thing for ``dapple`` and ``zb-h1``). Sends, receives and
``REDUCE_GRAD`` take no time here: a receive completes when its data arrives.

Every rank runs until it must wait for a result not yet computed and sleeps until that result
exists, so each action is timed exactly once: O(actions).

:func:`replay` applies the same idea to a compiled plan (``sim.engine.compile``), op by op,
with the rule book's rules (``sim.engine.rules``); many classes that share their ops run as
numpy arrays instead (``sim.engine.vector``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sim.core.errors import DappleError, ScheduleError
from sim.cost.compute import overlapped_pair_s
from sim.engine import rules
from sim.engine.fast_collectives import FastCollectives
from sim.engine.gcpause import gc_paused
from sim.engine.records import OpTimes, Recorder
from sim.engine.result import SimResult
from sim.engine.vector import vector_records, worth_vectorising
from sim.engine.workload import COMPUTE, GROUP, RECV, SEND
from sim.schedule.check import check_schedule, run_ranks
from sim.schedule.ir import ActionKind, OverlapFB, Schedule, Step, wait_lists

__all__ = ["Timing", "replay", "time_schedule"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    """When everything ran, on a contention-free cluster."""

    makespan_s: float
    """Time from the first action's start (0) to the last action's end, in seconds."""
    busy_s: tuple[float, ...]
    """Per rank: seconds spent in compute actions (F, B, I, W)."""
    actions: tuple[tuple[int, Step, float, float], ...]
    """``(rank, step, start_s, end_s)`` for every step (an action or an overlapped pair), by
    rank then list order."""
    peak_inflight_microbatches: tuple[int, ...]
    """Per stage: most micro-batches whose F is done and whose backward (B, or W when the
    backward is split) is not — the activations the stage must hold at once."""

    @property
    def bubble_fraction(self) -> float:
        """Share of rank-time spent idle: 1 − Σ busy / (ranks · makespan)."""
        if self.makespan_s == 0:
            return 0.0
        return 1.0 - sum(self.busy_s) / (len(self.busy_s) * self.makespan_s)


def time_schedule(
    schedule: Schedule,
    fwd_s: Sequence[float],
    bwd_s: Sequence[float],
    *,
    wgrad_s: Sequence[float] | None = None,
    comm_s: float = 0.0,
    overlap_efficiency: float = 0.0,
) -> Timing:
    """Time ``schedule``; ``fwd_s``/``bwd_s``/``wgrad_s`` give one micro-batch's seconds per stage.

    ``wgrad_s`` (default all zero) is the weight-gradient part of ``bwd_s``, used only by
    W and I actions. ``comm_s`` is added to every dependency that crosses ranks. The schedule
    is not checked up front (that would double the cost); one that cannot run raises the
    checker's :class:`ScheduleError`, but a runnable one with, say, a duplicated action is
    timed as written — call :func:`sim.schedule.check.check_schedule` first for untrusted input.

    An overlapped pair ``(0F7;7B3)OVERLAP_F_B`` is one step that takes
    ``sim.cost.compute.overlapped_pair_s(F, B, overlap_efficiency)``: F + B by default (the two share
    the device), max(F, B) with ``overlap_efficiency=1``.
    """
    table = _durations(schedule, fwd_s, bwd_s, wgrad_s)
    if not (math.isfinite(comm_s) and comm_s >= 0):
        raise DappleError(f"fastpath: comm_s={comm_s!r} must be a finite number >= 0")
    if not (math.isfinite(overlap_efficiency) and 0.0 <= overlap_efficiency <= 1.0):
        raise DappleError(f"fastpath: overlap_efficiency={overlap_efficiency!r} must be in [0, 1]")

    def duration(step: Step) -> float:
        if type(step) is OverlapFB:
            f, b = step.forward, step.backward
            return overlapped_pair_s(table[f.kind][f.stage], table[b.kind][b.stage], overlap_efficiency)
        return table[step.kind][step.stage]

    times = _run(schedule, duration, comm_s)
    busy = tuple(
        math.fsum(duration(a) for a in acts if a.is_compute)
        for acts in schedule.ranks
    )
    return Timing(
        makespan_s=max((rank_times[-1][3] for rank_times in times if rank_times), default=0.0),
        busy_s=busy,
        actions=tuple(t for rank_times in times for t in rank_times),
        peak_inflight_microbatches=_peak_inflight(schedule),
    )


def _durations(schedule, fwd_s, bwd_s, wgrad_s) -> dict[ActionKind, tuple[float, ...]]:
    stages = schedule.num_stages
    wgrad_s = [0.0] * stages if wgrad_s is None else wgrad_s
    for name, values in (("fwd_s", fwd_s), ("bwd_s", bwd_s), ("wgrad_s", wgrad_s)):
        if len(values) != stages:
            raise DappleError(f"fastpath: {name} has {len(values)} entries, expected one per "
                              f"stage ({stages})")
        bad = [v for v in values if not (math.isfinite(v) and v >= 0)]
        if bad:
            raise DappleError(f"fastpath: {name} holds {bad[0]!r}; times must be finite and >= 0")
    over = [s for s in range(stages) if wgrad_s[s] > bwd_s[s]]
    if over:
        s = over[0]
        raise DappleError(f"fastpath: stage {s} wgrad_s={wgrad_s[s]} exceeds bwd_s={bwd_s[s]}; "
                          "wgrad_s is the weight-gradient part of the full backward")
    zero = (0.0,) * stages
    table = {kind: zero for kind in ActionKind}
    table[ActionKind.F] = tuple(fwd_s)
    table[ActionKind.B] = tuple(bwd_s)
    table[ActionKind.I] = tuple(b - w for b, w in zip(bwd_s, wgrad_s))
    table[ActionKind.W] = tuple(wgrad_s)
    return table


def _run(schedule: Schedule, duration, comm_s: float):
    """Per-rank lists of (rank, action, start_s, end_s), timed in a dependency-respecting order."""
    try:
        waits = wait_lists(schedule)
        pos, order = run_ranks(waits)
        if any(pos[r] < len(waits[r]) for r in range(schedule.num_ranks)):
            raise ScheduleError("deadlock")
        if any(not 0 <= a.stage < schedule.num_stages for acts in schedule.ranks for step in acts
               for a in step.parts):
            raise ScheduleError("stage out of range")
    except (ScheduleError, IndexError):
        check_schedule(schedule)  # a malformed schedule: explain it with the checker's grid
        raise
    begin = [[0.0] * len(acts) for acts in schedule.ranks]
    end = [[0.0] * len(acts) for acts in schedule.ranks]
    free = [0.0] * schedule.num_ranks
    for rank, i in order:
        start = free[rank]
        for other, j in waits[rank][i]:
            ready = end[other][j] + (comm_s if other != rank else 0.0)
            if ready > start:
                start = ready
        a = schedule.ranks[rank][i]
        begin[rank][i] = start
        free[rank] = end[rank][i] = start + duration(a)
    return [
        list(zip([rank] * len(acts), acts, begin[rank], end[rank]))
        for rank, acts in enumerate(schedule.ranks)
    ]


def _peak_inflight(schedule: Schedule) -> tuple[int, ...]:
    # A stage's actions all run on one rank, so list order is time order.
    live = [0] * schedule.num_stages
    peak = [0] * schedule.num_stages
    for acts in schedule.ranks:
        # a pair counts its forward, then its backward; a micro-batch's activations die at its
        # B or, when its backward is split, its W (DualPipeV splits some of a stage's and not others)
        for a in (a for step in acts for a in step.parts):
            if a.kind is ActionKind.F:
                live[a.stage] += 1
                peak[a.stage] = max(peak[a.stage], live[a.stage])
            elif a.kind is ActionKind.W or a.kind is ActionKind.B:
                live[a.stage] -= 1
    return tuple(peak)


# --- whole plans -----------------------------------------------------------------------------


@gc_paused()  # its records and the result's timelines: millions of objects
def replay(workload) -> SimResult:
    """Replay a compiled plan (``sim.engine.compile``) without contention: the planner's fast path.

    Each operation costs what it would cost alone: the flows of one SEND (issued together by
    identical replicas) share only the ports they have in common with each other, an
    all-reduce phase's flows likewise; other traffic never slows them. Ops follow the rule
    book (``sim.engine.rules``): the compute stream runs the rank's actions in order, a
    device's sends leave one SEND at a time on its send stream, all-reduces run in issue
    order on a collective stream, and the optimizer step waits for the last of them. With
    contention off the SimPy engine gives the same times; this path only skips SimPy and the
    port bookkeeping.
    """
    if workload.optimistic:
        raise ValueError("an optimistic workload's classes are checked only by the SimPy replay with contention: "
                         "compile it with compile_workload(..., contention=False) for the fast path")
    failing = [cls.devices[0] for cls in workload.classes if cls.fails_at_s is not None]
    if failing:
        raise DappleError(f"device {failing[0]} fails: device failures need the SimPy engine (--engine simpy)")
    if worth_vectorising(workload):  # many classes sharing their ops: numpy over each bundle
        return SimResult(workload, vector_records(workload), engine="fast", contention=False)
    state = _PlanState(workload)
    state.run()
    records = state.records
    del state  # its mailboxes go before the memory timelines are built (the peak of a large replay)
    return SimResult(workload, records, engine="fast", contention=False)


class _PlanState(FastCollectives):
    """Per-class cursors and clocks of a contention-free replay.

    The hot loop keeps its state in locals and looks flows up in flat per-kind tables: a
    mailbox is an int, ``box * num_microbatches + microbatch`` (``rules.box_numbers``).
    """

    def __init__(self, workload) -> None:
        self.w = workload
        n = len(workload.classes)
        self.cursor = [0] * n
        self.clock = [0.0] * n
        self.send_free = [0.0] * n
        self.coll_free = [0.0] * n
        self.records = [Recorder(op_times=OpTimes(len(c.ops))) for c in workload.classes]
        self.arrived: dict[int, list] = {}
        self.waiting: dict[int, int] = {}
        self.issued: dict[int, list] = {}
        self.group_issued: dict[tuple, dict] = {}
        self.group_end: dict[tuple, tuple[float, float]] = {}
        self.group_waiting: dict[tuple, list] = {}
        self.pending_s = [0.0] * n
        self.pending_start_s = [0.0] * n  # the earliest start the overlapped collectives allow
        self.ready = list(range(n - 1, -1, -1))
        self.kind_box = rules.box_numbers(workload.kinds, workload.num_microbatches)[0]
        self.kind_s = [rules.flow_alone_s(k) for k in workload.kinds]
        self.steps: dict[int, tuple] = {}  # per op list (classes share them): ``rules.steps``

    def run(self) -> None:
        """Run every class until it waits; a delivery or a collective wakes its waiters."""
        ready = self.ready
        while ready:
            self._advance(ready.pop())
        self._finish()

    def _advance(self, c: int) -> None:
        """Run class ``c``'s ops from its cursor until it must wait (or has none left)."""
        cls, kinds, kind_box, kind_s = self.w.classes[c], self.w.kinds, self.kind_box, self.kind_s
        ops, i, now, rec, pending = cls.ops, self.cursor[c], self.clock[c], self.records[c], self.pending_s
        pending_start = self.pending_start_s
        steps = self.steps.get(id(ops))
        if steps is None:
            steps = self.steps[id(ops)] = rules.steps(ops)
        durations, slots, arrived, send_free = cls.durations, cls.slots, self.arrived, self.send_free
        starts, ends = rec.op_times.start, rec.op_times.end
        memory_at, memory_delta = rec.memory.times.append, rec.memory.deltas.append  # ``rules.ACTIVATIONS``
        buffer_at, buffer_delta = rec.buffers.times.append, rec.buffers.deltas.append  # ``rules.BUFFERS``
        slowdown, slow_from = cls.slowdown, cls.slow_from_s
        slow = slowdown != 1.0  # x * 1.0 == x: skipping the product changes no time
        n = len(ops)
        while i < n:
            code, mb, flows, cost_s, alloc, gather, free, buffer = steps[i]
            if code == COMPUTE:
                if pending_start[c] > now:  # it needs the first piece of a pipelined collective
                    now = pending_start[c]
                duration = rules.stretched_s(durations[i], now, slowdown, slow_from) if slow else durations[i]
                # ``rules.compute_end`` and the rest of this loop's max-plus rules, inlined: a call
                # per op costs this loop ~4% (``tests/test_rules.py`` holds every replay to them)
                end = now + duration
                if pending[c] > end:  # the collectives that ran beside it
                    end = pending[c]
                starts[i], ends[i] = now, end
                pending[c] = pending_start[c] = 0.0
                if alloc:  # ``rules.MEMORY``, unrolled (see ``rules.steps``)
                    memory_at(now)
                    memory_delta(alloc)
                if gather:
                    buffer_at(now)
                    buffer_delta(gather)
                    buffer_at(end)
                    buffer_delta(-gather)
                if free:
                    memory_at(end)
                    memory_delta(-free)
                if buffer:
                    buffer_at(end)
                    buffer_delta(-buffer)
                now = end
            elif code == SEND:
                start = done = send_free[c] if send_free[c] > now else now  # ``rules.send_start_s``
                for k in (slots[flows] if flows >= 0 else ()):
                    sent = start + kind_s[k]
                    if sent > done:
                        done = sent
                    kind = kinds[k]
                    rec.bytes_sent += kind.send_bytes_per_device
                    self._deliver(kind_box[k] + mb, sent + kind.latency_s, kind)
                send_free[c] = done
                starts[i], ends[i] = start, done
                if cost_s:  # issuing holds up the compute stream (gloo on a CPU)
                    now += rules.stretched_s(cost_s, now, slowdown, slow_from) if slow else cost_s
            elif code == RECV:
                flows = slots[flows] if flows >= 0 else ()
                arrival = now
                if flows:
                    key = kind_box[flows[0]] + mb
                    got = arrived.get(key)
                    if got is None or got[0] < len(flows):
                        self.waiting[key] = c
                        break
                    arrival = got[1] if got[1] > now else now
                cost = rules.stretched_s(cost_s, arrival, slowdown, slow_from) if slow else cost_s
                starts[i] = now
                now = ends[i] = arrival + cost  # ``rules.recv_end_s`` (``arrival`` >= ``now``)
            elif code == GROUP:
                after = self._group_op(c, i, ops[i], now)
                if after is None:
                    break  # the rest of its group has not issued it yet
                now = after
            else:
                self._reduce(c, i, ops[i], now)
            i += 1
        self.cursor[c], self.clock[c] = i, now

    def _deliver(self, key: int, when: float, kind) -> None:
        got = self.arrived.get(key)
        if got is None:
            self.arrived[key] = [1, when if when > 0.0 else 0.0]
        else:
            got[0] += 1
            if when > got[1]:
                got[1] = when
        rec = self.records[kind.dst_class]
        rec.bytes_received += kind.recv_bytes_per_device
        rec.buffers.append((when, kind.recv_bytes_per_device))
        waiter = self.waiting.pop(key, None)
        if waiter is not None:
            self.ready.append(waiter)

    def _finish(self) -> None:
        classes = self.w.classes
        stuck = [c for c in range(len(classes)) if self.cursor[c] < len(classes[c].ops)]
        if stuck:
            blocked = ", ".join(f"device {classes[c].devices[0]} at {classes[c].ops[self.cursor[c]].text}" for c in stuck[:4])
            raise ScheduleError(f"the replay cannot make progress: {blocked} wait for data that never comes")
        for c, cls in enumerate(classes):
            start = rules.optimizer_start_s(self.clock[c], self.coll_free[c])
            self.records[c].optimizer = (start, start + cls.optimizer_s)
