"""What a replay records: for each device class, when each op ran and how its memory moved.

Every replay (the SimPy engine, the synchronous replay, the fast path and its vectorised form)
fills one ``Recorder`` per device class: ``OpTimes`` (each op's start and end, two flat arrays
of doubles), ``Deltas`` of activations and of receive buffers (time, bytes), the optimizer step
and the bytes sent and received. ``sim.engine.result.SimResult`` and ``sim.engine.memory`` read
them; nothing else writes them."""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field

__all__ = ["Deltas", "OpTimes", "Recorder"]


class OpTimes:
    """When each op of a class ran: ``times[i]`` is ``(start_s, end_s)``, or None if op i never
    ran (a failed replay). Two flat arrays of doubles (NaN for "never"), not a tuple per op: a
    16,384-device replay without symmetry holds six million of them. The replays' hot loops
    write ``start`` and ``end`` directly."""

    __slots__ = ("start", "end")

    def __init__(self, count: int) -> None:
        self.start = array("d", [math.nan]) * count
        self.end = array("d", [math.nan]) * count

    def __len__(self) -> int:
        return len(self.start)

    def __getitem__(self, i: int) -> tuple[float, float] | None:
        start = self.start[i]
        return None if start != start else (start, self.end[i])

    def __setitem__(self, i: int, times: tuple[float, float]) -> None:
        self.start[i], self.end[i] = times

    def __iter__(self):
        for start, end in zip(self.start, self.end):
            yield None if start != start else (start, end)


class Deltas:
    """``(time_s, bytes delta)`` events in any order, kept as two flat arrays of doubles (not a
    tuple or a float object each: a 16,384-device replay records millions); iterating gives the
    pairs back. The replays' hot loops append to ``times`` and ``deltas`` directly."""

    __slots__ = ("times", "deltas")

    def __init__(self) -> None:
        self.times = array("d")
        self.deltas = array("d")

    def append(self, event: tuple[float, float]) -> None:
        self.times.append(event[0])
        self.deltas.append(event[1])

    def __len__(self) -> int:
        return len(self.times)

    def __iter__(self):
        return zip(self.times, self.deltas)


@dataclass(slots=True)
class Recorder:
    """What happened to one device class during a replay (mutable, filled by the replay)."""

    op_times: OpTimes
    """Per op: (start_s, end_s), None if it never ran (a failed replay). SEND: send stream
    busy; RECV: waiting; REDUCE: the all-reduce."""
    memory: Deltas = field(default_factory=Deltas)
    """(time_s, bytes delta) of activations (stash) per device of the class, in any order."""
    buffers: Deltas = field(default_factory=Deltas)
    """(time_s, bytes delta) of receive buffers per device of the class, in any order."""
    optimizer: tuple[float, float] = (0.0, 0.0)
    """Start and end of the optimizer step."""
    bytes_sent: float = 0.0
    bytes_received: float = 0.0
