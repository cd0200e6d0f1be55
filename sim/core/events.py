"""Event rows: one action on one device, from its start to its end.

A replay (``sim.engine.result.SimResult.event_rows``) and a measured step
(``runtime.execution.executor``) describe a step the same way: one ``EventRow`` per action and
device, seconds from the step's start, on one of the streams a device runs (``compute``,
``send``, ``recv``, ``allreduce``). Every writer makes them with this type, and every reader
(the Gantt charts, the Chrome traces, ``events.csv``, validation) reads its fields, so a
predicted and a measured step line up action by action.

JSON is made from a row by ``EventRow.to_json()`` (the columns of ``events.csv``,
``EVENT_COLUMNS``, in order); ``EventRow.from_json`` reads such a mapping back (a measured
run's rows travel between processes and files as JSON).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["EVENT_COLUMNS", "EventRow"]

EVENT_COLUMNS = ("device", "stage", "kind", "microbatch", "action", "stream", "start_s", "end_s")
"""The columns of an event row's JSON and of ``events.csv``, in order."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EventRow:
    """One action on one device: what it was and when it ran."""

    device: int
    """The device (global rank) that ran it."""
    stage: int
    """The pipeline stage it belongs to (a looped or V schedule's chunk is a stage of its own)."""
    kind: str
    """The action's kind: ``F``, ``B``, ``I`` (input gradient), ``W`` (weight gradient),
    ``SEND_F``, ``RECV_B``, ``REDUCE``, ``OPTIM``, ... (``sim.schedule.ir``'s vocabulary)."""
    microbatch: int | None
    """The micro-batch it works on; None for per-iteration actions (``OPTIM``, all-reduces)."""
    action: str
    """The action in the schedule's text form (``0F3``, ``1SEND_F0``, ``OPTIM``): the key that
    matches a predicted row with a measured one."""
    stream: str
    """The stream it runs on: ``compute``, ``send``, ``recv`` or ``allreduce``."""
    start_s: float
    """Start, seconds from the step's start."""
    end_s: float
    """End, seconds from the step's start."""

    @property
    def duration_s(self) -> float:
        """``end_s - start_s``, seconds."""
        return self.end_s - self.start_s

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "stage": self.stage, "kind": self.kind, "microbatch": self.microbatch,
                "action": self.action, "stream": self.stream, "start_s": self.start_s, "end_s": self.end_s}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EventRow:
        """The row of ``to_json``'s mapping (extra keys are not read)."""
        return cls(**{key: data[key] for key in EVENT_COLUMNS})
