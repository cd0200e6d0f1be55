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
        self.starts = np.full((m, n), np.nan)
        self.ends = np.full((m, n), np.nan)
        self.memory: list[tuple[np.ndarray, float]] = []  # (times of each member, bytes) in op order
        self.buffers: list[tuple[np.ndarray, float]] = []
        self.bytes_sent = np.zeros(m)
        self.joined = -1
        """The op index of the group collective it has joined and waits for, else −1."""

    def factor(self, at: np.ndarray) -> np.ndarray | float:
        """Each member's straggler factor for an action starting at ``at`` (1 without stragglers:
        x · 1 is x, as the scalar path's skipped product)."""
        return np.where(at >= self.slow_from, self.slowdown, 1.0) if self.slow else 1.0


def vector_records(workload):
    """The fast path's records (``sim.engine.result.Recorder`` per class), bundle by bundle."""
    from sim.engine.fastpath import collective_duration_s
    from sim.engine.result import Deltas, OpTimes, Recorder
    from sim.core.errors import ScheduleError

    w = workload
    classes, kinds = w.classes, w.kinds
    stride = max(w.num_microbatches, 1)
    boxes: dict[tuple, int] = {}
    kind_box = np.array([boxes.setdefault((k.dst_class, k.label[0], k.label[1]), len(boxes)) * stride
                         if k.label[0] in ("F", "B") else -1 for k in kinds], dtype=np.int64)
    kind_s = np.array([k.bytes / k.static_rate_bytes_per_s for k in kinds])
    kind_lat = np.array([k.latency_s for k in kinds])
    send_bytes = np.array([k.send_bytes_per_device for k in kinds])
    kind_dst = np.array([k.dst_class for k in kinds], dtype=np.int64)
    kind_recv = np.array([k.recv_bytes_per_device for k in kinds])
    box_count = np.zeros(len(boxes) * stride, dtype=np.int64)
    box_time = np.zeros(len(boxes) * stride)
    received: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (receiving class, time, bytes)
    n_groups = len(w.group_collectives)
    group_need = np.array([len(g.participants) for g in w.group_collectives], dtype=np.int64)
    group_s = np.array([collective_duration_s(w, g) for g in w.group_collectives])
    group_issue: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}  # (micro-batch, kind) -> latest issue, count per group
    coll_free = np.zeros(len(classes))
    coll_issued: dict[int, list] = {}  # all-reduce -> [latest issue, count, [(bundle, op index)]]
    bundles = [_Bundle(members, w, kind_box, kind_s, kind_lat, send_bytes) for members in bundles_of(w)]

    def blocked_on(b: _Bundle) -> bool:
        """Whether bundle ``b``'s next op still waits for someone (a RECV's data, a group's members)."""
        op = b.ops[b.pos]
        if op[0] == RECV and op.flows >= 0:
            keys = b.slot_box[op.flows][:, 0] + op[4]
            return bool((box_count[keys] < b.slot_box[op.flows].shape[1]).any())
        if op[0] == GROUP and b.joined == b.pos:
            gids = b.groups[:, op.collective]
            return bool((group_issue[(op.microbatch, op.kind)][1][gids] < group_need[gids]).any())
        return False

    def run(b: _Bundle) -> None:
        """Run bundle ``b`` until one of its members must wait (see ``sim.engine.fastpath``)."""
        ops, t = b.ops, b.t
        D, starts, ends = b.durations, b.starts, b.ends
        while b.pos < len(ops):
            i = b.pos
            op = ops[i]
            code = op[0]
            if code == COMPUTE:
                end = t + D[:, i] * b.factor(t)
                starts[:, i], ends[:, i] = t, end
                if op[6]:
                    b.memory.append((t, op[6]))
                end = np.maximum(end, b.beside)
                b.beside = np.zeros_like(t)
                if op.gather_bytes:
                    b.buffers.append((t, op.gather_bytes))
                    b.buffers.append((end, -op.gather_bytes))
                if op[7]:
                    b.memory.append((end, -op[7]))
                if op[8]:
                    b.buffers.append((end, -op[8]))
                t = end
            elif code == SEND:
                start = np.maximum(b.send_free, t)
                done = start
                if op.flows >= 0:
                    box, secs = b.slot_box[op.flows], b.slot_s[op.flows]
                    lat, sent_bytes = b.slot_lat[op.flows], b.slot_sent[op.flows]
                    slot_kinds = b.slot_kinds[op.flows]
                    for f in range(box.shape[1]):
                        sent = start + secs[:, f]
                        done = np.maximum(done, sent)
                        b.bytes_sent += sent_bytes[:, f]
                        keys, when = box[:, f] + op[4], sent + lat[:, f]
                        np.add.at(box_count, keys, 1)
                        np.maximum.at(box_time, keys, when)
                        k = slot_kinds[:, f]
                        received.append((kind_dst[k], when, kind_recv[k]))
                b.send_free = done
                starts[:, i], ends[:, i] = start, done
                if op[5]:
                    t = t + D[:, i] * b.factor(t)
            elif code == RECV:
                if op.flows >= 0:
                    box = b.slot_box[op.flows]
                    keys = box[:, 0] + op[4]
                    if (box_count[keys] < box.shape[1]).any():
                        break  # some member's data is not all sent yet
                    arrival = np.maximum(box_time[keys], t)
                else:
                    arrival = t
                end = arrival + D[:, i] * b.factor(arrival)
                starts[:, i], ends[:, i] = t, end
                t = end
            elif code == GROUP:
                gids = b.groups[:, op.collective]
                latest, count = group_issue.setdefault((op.microbatch, op.kind),
                                                       (np.full(n_groups, -np.inf), np.zeros(n_groups, np.int64)))
                if b.joined != i:
                    np.maximum.at(latest, gids, t)
                    np.add.at(count, gids, 1)
                    b.joined = i
                if (count[gids] < group_need[gids]).any():
                    break  # the rest of some member's group has not issued it yet
                b.joined = -1
                start = latest[gids]
                end = start + group_s[gids]
                starts[:, i], ends[:, i] = start, end
                if op.overlap:
                    b.beside = np.maximum(b.beside, end)
                else:
                    t = np.maximum(t, end)
            else:  # REDUCE: issued without waiting; the last to issue it starts it
                if op.collective < 0:
                    starts[:, i], ends[:, i] = t, t
                else:
                    entry = coll_issued.setdefault(op.collective, [-np.inf, 0, []])
                    entry[0] = max(entry[0], float(t.max()))
                    entry[1] += len(t)
                    entry[2].append((b, i))
                    coll = w.collectives[op.collective]
                    if entry[1] == len(coll.participants):
                        participants = np.array(coll.participants, dtype=np.int64)
                        start = max(entry[0], float(coll_free[participants].max()))
                        end = start + collective_duration_s(w, coll)
                        coll_free[participants] = end
                        for other, index in entry[2]:
                            other.starts[:, index], other.ends[:, index] = start, end
            b.pos = i + 1
        b.t = t

    ready, waiting = deque(bundles), []
    while ready:
        b = ready.popleft()
        run(b)
        if b.pos < len(b.ops):
            waiting.append(b)
        still = []
        for b in waiting:  # whoever it sent to or joined may go on
            (still if blocked_on(b) else ready).append(b)
        waiting = still
    stuck = [b for b in bundles if b.pos < len(b.ops)]
    if stuck:
        blocked = ", ".join(f"device {classes[int(b.members[0])].devices[0]} at {b.ops[b.pos].text}" for b in stuck[:4])
        raise ScheduleError(f"the replay cannot make progress: {blocked} wait for data that never comes")

    # what each class received, grouped by class (stable: in the order it was sent)
    if received:
        dst = np.concatenate([r[0] for r in received])
        when = np.concatenate([r[1] for r in received])
        nbytes = np.concatenate([r[2] for r in received])
        order = np.argsort(dst, kind="stable")
        dst, when, nbytes = dst[order], when[order], nbytes[order]
        bounds = np.searchsorted(dst, np.arange(len(classes) + 1))
    else:
        dst = when = nbytes = np.zeros(0)
        bounds = np.zeros(len(classes) + 1, dtype=np.int64)
    records: list = [None] * len(classes)
    for b in bundles:
        mem_t = np.stack([x for x, _ in b.memory], axis=1) if b.memory else np.zeros((len(b.members), 0))
        mem_d = np.array([d for _, d in b.memory])
        buf_t = np.stack([x for x, _ in b.buffers], axis=1) if b.buffers else np.zeros((len(b.members), 0))
        buf_d = np.array([d for _, d in b.buffers])
        for j, c in enumerate(b.members.tolist()):
            times = OpTimes(0)
            times.start.frombytes(b.starts[j].tobytes())
            times.end.frombytes(b.ends[j].tobytes())
            lo, hi = bounds[c], bounds[c + 1]
            memory, buffers = Deltas(), Deltas()
            memory.times, memory.deltas = mem_t[j], mem_d
            buffers.times = np.concatenate((buf_t[j], when[lo:hi]))
            buffers.deltas = np.concatenate((buf_d, nbytes[lo:hi]))
            start = max(float(b.t[j]), float(coll_free[c]))
            records[c] = Recorder(op_times=times, memory=memory, buffers=buffers,
                                  optimizer=(start, start + classes[c].optimizer_s),
                                  bytes_sent=float(b.bytes_sent[j]), bytes_received=float(nbytes[lo:hi].sum()))
    return records
