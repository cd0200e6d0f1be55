"""Exposed communication: the part of a device's communication its compute did not hide.

A device's communication is the time its gradient reductions (``REDUCE`` ops) and its
group collectives (``GROUP`` ops: tensor- and context-parallel, FSDP's gathers) are in
flight; several may run at once, so it is the *union* of their intervals. Its compute stream
is busy while a compute op runs its own duration (``DeviceClass.durations``, stretched on a
straggler, not the wait for the collectives beside it) and during the optimizer step. Then

* ``communication_s`` = |union of communication intervals|,
* ``exposed_communication_s`` = |communication ∖ busy| — communication with the compute
  stream idle, which an overlap that worked would have hidden,
* ``overlap_fraction`` = 1 − exposed / communication (None without communication).

So a reduction ``C`` long that runs after the last backward, with nothing else to do, is all
exposed (``C``), and one entirely under a long enough backward is not (0). Waits for
point-to-point data (RECV) are not counted: the time a stage waits for its neighbour's
activations is mostly the pipeline bubble (``idle_s``), not the transfer.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from sim.engine.workload import COMPUTE, GROUP, REDUCE

__all__ = ["class_exposure", "class_intervals", "exposure_s", "op_indices", "split_exposed", "union"]


def union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Disjoint, sorted intervals covering the same time as ``intervals`` (empty ones dropped)."""
    merged: list[list[float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1][1] = end
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def _overlap_s(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Seconds two disjoint sorted interval lists share."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def exposure_s(communication, busy) -> tuple[float, float]:
    """``(communication_s, exposed_communication_s)`` of communication and busy intervals."""
    comm = union(communication)
    total = sum(e - s for s, e in comm)
    return total, total - _overlap_s(comm, union(busy))


def op_indices(ops) -> tuple[np.ndarray, np.ndarray]:
    """Where a class's compute ops and its communication ops (REDUCE, GROUP) are (classes that
    share their ops share these)."""
    codes = np.fromiter((op.code for op in ops), dtype=np.int64, count=len(ops))
    return np.flatnonzero(codes == COMPUTE), np.flatnonzero((codes == REDUCE) | (codes == GROUP))


def split_exposed(communication, busy) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """``(exposed, hidden)``: the union of ``communication`` cut where ``busy`` covers it, as
    disjoint sorted intervals (what a timeline draws strong and faint; their lengths add up to
    :func:`exposure_s`'s two numbers)."""
    exposed, hidden = [], []
    covers = union(busy)
    j = 0
    for start, end in union(communication):
        at = start
        while j < len(covers) and covers[j][1] <= at:
            j += 1
        k = j
        while at < end:
            if k < len(covers) and covers[k][0] < end:
                lo, hi = max(covers[k][0], at), min(covers[k][1], end)
                if lo > at:
                    exposed.append((at, lo))
                if hi > lo:
                    hidden.append((lo, hi))
                at = max(at, hi)
                k += 1
            else:
                exposed.append((at, end))
                at = end
    return exposed, hidden


def class_intervals(cls, record, indices: tuple[np.ndarray, np.ndarray] | None = None):
    """``(communication, busy)`` intervals of one device class from its replay's records
    (``Recorder``): its REDUCE and GROUP ops' spans, and its compute ops' own durations and
    optimizer step (see the module docstring); ``indices``: its :func:`op_indices`."""
    compute, comm = op_indices(cls.ops) if indices is None else indices
    if not len(comm):
        return [], []
    starts = np.frombuffer(record.op_times.start, dtype=float)
    ends = np.frombuffer(record.op_times.end, dtype=float)
    begin = starts[compute]
    own = np.asarray(cls.durations, dtype=float)[compute]
    if cls.slowdown != 1.0:  # ``rules.stretched_s``, element by element
        own = np.where(begin >= cls.slow_from_s, own * cls.slowdown, own)
    ran = begin == begin  # what never ran (a failed replay) is NaN
    busy = list(zip(begin[ran].tolist(), (begin + own)[ran].tolist())) + [record.optimizer]
    c_start, c_end = starts[comm], ends[comm]
    ran = c_start == c_start
    return list(zip(c_start[ran].tolist(), c_end[ran].tolist())), busy


def class_exposure(cls, record, indices: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[float, float]:
    """:func:`exposure_s` of one device class from its replay's records (``Recorder``);
    ``indices``: its :func:`op_indices`, when the caller keeps them."""
    communication, busy = class_intervals(cls, record, indices)
    if not communication and not busy:
        return 0.0, 0.0
    return exposure_s(communication, busy)
