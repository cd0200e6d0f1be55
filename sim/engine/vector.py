"""The fast path vectorised: classes that share their ops run as one numpy array.

When every device is its own class (jitter drawn per device, ``--no-symmetry``) or a fault
splits a few classes off, many classes still run the very same ops: the same actions in the
same order, with their own durations (``DeviceClass.durations``) and their own partners (the
flow kinds of their slots). Such classes form a *bundle*: the fast path's rules
(``sim.engine.fastpath``) then apply to a whole bundle at once, one numpy operation per op
over the bundle's clocks instead of one Python step per op and class. A bundle runs until
one of its members waits for data, a group collective or an all-reduce that another bundle
has not sent or joined yet, as the fast path's classes do. Times are the same arithmetic,
element by element (sums, maxima, products), so they equal the fast path's to the last bit;
receive buffers are recorded in another order, which can change a memory total by rounding
at an instant where several arrive at once.

``replay`` chooses this path when the workload has many classes in few bundles
(``worth_vectorising``); for a handful of classes the scalar loop is faster.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from sim.core.errors import ScheduleError
from sim.engine import rules
from sim.engine.records import Deltas, OpTimes, Recorder
from sim.engine.rules import collective_duration_s
from sim.engine.workload import COMPUTE, GROUP, RECV, SEND

__all__ = ["vector_records", "worth_vectorising"]

MIN_CLASSES = 256
"""Fewest classes for which the vectorised path is used."""
MIN_BUNDLE = 8
"""Fewest classes per bundle, on average, for which it is used."""


def bundles_of(workload) -> list[list[int]]:
    """Classes that share one tuple of ops (compile hands it to classes whose ops are alike), in order."""
    groups: dict[int, list[int]] = {}
    for cls in workload.classes:
        groups.setdefault(id(cls.ops), []).append(cls.index)
    return list(groups.values())


def worth_vectorising(workload) -> bool:
    n = len(workload.classes)
    return n >= MIN_CLASSES and n >= MIN_BUNDLE * len(bundles_of(workload))


class _Bundle:
    """One bundle's members, their per-op tables and their state."""

    def __init__(self, members: list[int], workload, kind_box, kind_s, kind_lat, send_bytes) -> None:
        classes = workload.classes
        first = classes[members[0]]
        self.members = np.array(members, dtype=np.int64)
        self.ops = first.ops
        m, n = len(members), len(first.ops)
        self.durations = np.stack([np.asarray(classes[c].durations, dtype=float) for c in members])
        self.slowdown = np.array([classes[c].slowdown for c in members])
        self.slow_from = np.array([classes[c].slow_from_s for c in members])
        self.slow = bool((self.slowdown != 1.0).any())
        # per slot: the (member, flow) matrices of its kinds' mailboxes, seconds, latencies, bytes
        self.slot_kinds = [np.array([classes[c].slots[s] for c in members], dtype=np.int64).reshape(m, -1)
                           for s in range(len(first.slots))]
        self.slot_box = [kind_box[k] for k in self.slot_kinds]
        self.slot_s = [kind_s[k] for k in self.slot_kinds]
        self.slot_lat = [kind_lat[k] for k in self.slot_kinds]
        self.slot_sent = [send_bytes[k] for k in self.slot_kinds]
        self.groups = np.array([classes[c].groups for c in members], dtype=np.int64).reshape(m, -1)
        self.pos = 0
        self.t = np.zeros(m)
        self.send_free = np.zeros(m)
        self.beside = np.zeros(m)
        self.first = None
        """The earliest start the pipelined collectives beside the next compute op allow, or None."""
        self.starts = np.full((m, n), np.nan)
        self.ends = np.full((m, n), np.nan)
        self.plan = rules.memory_plan(first.ops)
        self.ledgers: tuple[list[tuple[np.ndarray, float]], ...] = ([], [])
        """Per ledger (``rules.ACTIVATIONS``, ``BUFFERS``): (times of each member, bytes) in op order."""
        self.bytes_sent = np.zeros(m)
        self.joined = -1
        """The op index of the group collective it has joined and waits for, else −1."""

    def factor(self, at: np.ndarray) -> np.ndarray | float:
        """Each member's straggler factor for an action starting at ``at`` (1 without stragglers:
        x · 1 is x, as the scalar path's skipped product)."""
        return np.where(at >= self.slow_from, self.slowdown, 1.0) if self.slow else 1.0


class _VectorReplay:
    """The fast path's rules (``sim.engine.rules``) over bundles: per-kind tables, mailboxes,
    group and all-reduce registers, and what each class received."""

    def __init__(self, workload) -> None:
        w = self.w = workload
        kinds = w.kinds
        stride = max(w.num_microbatches, 1)
        numbers, num_boxes = rules.box_numbers(kinds, w.num_microbatches)
        kind_box = np.array(numbers, dtype=np.int64)
        kind_s = np.array([rules.flow_alone_s(k) for k in kinds])
        kind_lat = np.array([k.latency_s for k in kinds])
        send_bytes = np.array([k.send_bytes_per_device for k in kinds])
        self.kind_dst = np.array([k.dst_class for k in kinds], dtype=np.int64)
        self.kind_recv = np.array([k.recv_bytes_per_device for k in kinds])
        self.box_count = np.zeros(num_boxes * stride, dtype=np.int64)
        self.box_time = np.zeros(num_boxes * stride)
        self.received: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (receiving class, time, bytes)
        self.n_groups = len(w.group_collectives)
        self.group_need = np.array([len(g.participants) for g in w.group_collectives], dtype=np.int64)
        self.group_s = np.array([collective_duration_s(w, g) for g in w.group_collectives])
        self.group_issue: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}  # (mb, kind) -> latest issue, count per group
        self.coll_free = np.zeros(len(w.classes))
        self.coll_issued: dict[int, list] = {}  # all-reduce -> [latest issue, count, [(bundle, op index)]]
        self.bundles = [_Bundle(members, w, kind_box, kind_s, kind_lat, send_bytes) for members in bundles_of(w)]

    def blocked_on(self, b: _Bundle) -> bool:
        """Whether bundle ``b``'s next op still waits for someone (a RECV's data, a group's members)."""
        op = b.ops[b.pos]
        if op.code == RECV and op.flows >= 0:
            keys = b.slot_box[op.flows][:, 0] + op.microbatch
            return bool((self.box_count[keys] < b.slot_box[op.flows].shape[1]).any())
        if op.code == GROUP and b.joined == b.pos:
            gids = b.groups[:, op.collective]
            return bool((self.group_issue[(op.microbatch, op.kind)][1][gids] < self.group_need[gids]).any())
        return False

    def run(self, b: _Bundle) -> None:
        """Run bundle ``b`` until one of its members must wait (see ``sim.engine.fastpath``)."""
        ops = b.ops
        while b.pos < len(ops):
            i = b.pos
            op = ops[i]
            code = op.code
            if code == COMPUTE:
                self._compute(b, i)
            elif code == SEND:
                self._send(b, i, op)
            elif code == RECV:
                if not self._recv(b, i, op):
                    break  # some member's data is not all sent yet
            elif code == GROUP:
                if not self._group(b, i, op):
                    break  # the rest of some member's group has not issued it yet
            else:
                self._reduce(b, i, op)
            b.pos = i + 1

    def _compute(self, b: _Bundle, i: int) -> None:
        t = b.t
        if b.first is not None:  # ``rules.beside_bounds``: it needs their first pieces
            t = b.t = np.maximum(t, b.first)
            b.first = None
        end = np.maximum(t + b.durations[:, i] * b.factor(t), b.beside)  # ``rules.compute_end``
        b.starts[:, i], b.ends[:, i] = t, end
        b.beside = np.zeros_like(t)
        at_start, at_end = b.plan[i]
        for ledger, nbytes in at_start:
            b.ledgers[ledger].append((t, nbytes))
        for ledger, nbytes in at_end:
            b.ledgers[ledger].append((end, nbytes))
        b.t = end

    def _send(self, b: _Bundle, i: int, op) -> None:
        t = b.t
        start = done = np.maximum(b.send_free, t)  # ``rules.send_start_s``
        if op.flows >= 0:
            box, secs = b.slot_box[op.flows], b.slot_s[op.flows]
            lat, sent_bytes = b.slot_lat[op.flows], b.slot_sent[op.flows]
            slot_kinds = b.slot_kinds[op.flows]
            for f in range(box.shape[1]):
                sent = start + secs[:, f]
                done = np.maximum(done, sent)
                b.bytes_sent += sent_bytes[:, f]
                keys, when = box[:, f] + op.microbatch, sent + lat[:, f]
                np.add.at(self.box_count, keys, 1)
                np.maximum.at(self.box_time, keys, when)
                k = slot_kinds[:, f]
                self.received.append((self.kind_dst[k], when, self.kind_recv[k]))
        b.send_free = done
        b.starts[:, i], b.ends[:, i] = start, done
        if op.duration_s:  # issuing holds up the compute stream
            b.t = t + b.durations[:, i] * b.factor(t)

    def _recv(self, b: _Bundle, i: int, op) -> bool:
        t = b.t
        if op.flows >= 0:
            box = b.slot_box[op.flows]
            keys = box[:, 0] + op.microbatch
            if (self.box_count[keys] < box.shape[1]).any():
                return False
            arrival = np.maximum(self.box_time[keys], t)
        else:
            arrival = t
        end = arrival + b.durations[:, i] * b.factor(arrival)  # ``rules.recv_end_s``
        b.starts[:, i], b.ends[:, i] = t, end
        b.t = end
        return True

    def _group(self, b: _Bundle, i: int, op) -> bool:
        gids = b.groups[:, op.collective]
        latest, count = self.group_issue.setdefault(
            (op.microbatch, op.kind), (np.full(self.n_groups, -np.inf), np.zeros(self.n_groups, np.int64)))
        if b.joined != i:
            np.maximum.at(latest, gids, b.t)
            np.add.at(count, gids, 1)
            b.joined = i
        if (count[gids] < self.group_need[gids]).any():
            return False
        b.joined = -1
        start = latest[gids]  # ``rules.collective_times``: the last issue
        end = start + self.group_s[gids]
        b.starts[:, i], b.ends[:, i] = start, end
        if op.overlap:  # ``rules.after_group``, ``rules.beside_bounds``
            b.beside = np.maximum(b.beside, end + op.tail_s)
            if op.lead_s > 0:
                b.first = start + op.lead_s if b.first is None else np.maximum(b.first, start + op.lead_s)
        else:
            b.t = np.maximum(b.t, end)
        return True

    def _reduce(self, b: _Bundle, i: int, op) -> None:
        """Issued without waiting; the last to issue it starts it."""
        if op.collective < 0:
            b.starts[:, i], b.ends[:, i] = b.t, b.t
            return
        entry = self.coll_issued.setdefault((op.collective, op.microbatch), [-np.inf, 0, [], -np.inf])
        issued = b.t
        if op.source >= 0:  # in buckets: from its backward's first bucket (``rules.reduce_issue_s``)
            source_start = b.starts[:, op.source]
            issued = source_start + b.durations[:, op.source] * b.factor(source_start) / op.buckets
            entry[3] = max(entry[3], float(b.ends[:, op.source].max()) + op.tail_s)
        entry[0] = max(entry[0], float(issued.max()))
        entry[1] += len(b.t)
        entry[2].append((b, i))
        coll = self.w.collectives[op.collective]
        if entry[1] == len(coll.participants):
            participants = np.array(coll.participants, dtype=np.int64)
            start, end = rules.collective_times((entry[0],), collective_duration_s(self.w, coll),
                                                (float(self.coll_free[participants].max()),), entry[3])
            self.coll_free[participants] = end
            for other, index in entry[2]:
                other.starts[:, index], other.ends[:, index] = start, end

    def replay(self) -> None:
        """Run the bundles until none can go on; raise ``ScheduleError`` if some never finish."""
        ready, waiting = deque(self.bundles), []
        while ready:
            b = ready.popleft()
            self.run(b)
            if b.pos < len(b.ops):
                waiting.append(b)
            still = []
            for b in waiting:  # whoever it sent to or joined may go on
                (still if self.blocked_on(b) else ready).append(b)
            waiting = still
        stuck = [b for b in self.bundles if b.pos < len(b.ops)]
        if stuck:
            classes = self.w.classes
            blocked = ", ".join(f"device {classes[int(b.members[0])].devices[0]} at {b.ops[b.pos].text}"
                                for b in stuck[:4])
            raise ScheduleError(f"the replay cannot make progress: {blocked} wait for data that never comes")

    def records(self) -> list[Recorder]:
        """Each class's ``Recorder``: its bundle's rows, and what it received (in the order it was sent)."""
        classes = self.w.classes
        if self.received:
            dst = np.concatenate([r[0] for r in self.received])
            when = np.concatenate([r[1] for r in self.received])
            nbytes = np.concatenate([r[2] for r in self.received])
            order = np.argsort(dst, kind="stable")
            dst, when, nbytes = dst[order], when[order], nbytes[order]
            bounds = np.searchsorted(dst, np.arange(len(classes) + 1))
        else:
            dst = when = nbytes = np.zeros(0)
            bounds = np.zeros(len(classes) + 1, dtype=np.int64)
        records: list = [None] * len(classes)
        for b in self.bundles:
            (mem_t, mem_d), (buf_t, buf_d) = (_ledger_arrays(b, ledger) for ledger in b.ledgers)
            for j, c in enumerate(b.members.tolist()):
                times = OpTimes(0)
                times.start.frombytes(b.starts[j].tobytes())
                times.end.frombytes(b.ends[j].tobytes())
                lo, hi = bounds[c], bounds[c + 1]
                memory, buffers = Deltas(), Deltas()
                memory.times, memory.deltas = mem_t[j], mem_d
                buffers.times = np.concatenate((buf_t[j], when[lo:hi]))
                buffers.deltas = np.concatenate((buf_d, nbytes[lo:hi]))
                start = rules.optimizer_start_s(float(b.t[j]), float(self.coll_free[c]))
                records[c] = Recorder(op_times=times, memory=memory, buffers=buffers,
                                      optimizer=(start, start + classes[c].optimizer_s),
                                      bytes_sent=float(b.bytes_sent[j]), bytes_received=float(nbytes[lo:hi].sum()))
        return records


def _ledger_arrays(b: _Bundle, events: list) -> tuple[np.ndarray, np.ndarray]:
    """One ledger's ``(times per member, deltas)``: a (members × events) array and the bytes."""
    times = np.stack([x for x, _ in events], axis=1) if events else np.zeros((len(b.members), 0))
    return times, np.array([d for _, d in events])


def vector_records(workload) -> list[Recorder]:
    """The fast path's records (``sim.engine.records.Recorder`` per class), bundle by bundle."""
    state = _VectorReplay(workload)
    state.replay()
    return state.records()
