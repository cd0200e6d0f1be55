"""Communication lanes of a Gantt chart: each kind of collective its own thin lane under a row.

A simulated device's collectives are its gradient reductions (``REDUCE`` ops) and the group
collectives beside or after its actions (``GROUP`` ops, ``sim.engine.groups``): tensor-parallel
all-reduces (or all-gathers and reduce-scatters), the context-parallel ring, FSDP's
parameter gathers and ZeRO's parameter all-gather. A 4D plan has several at once, so each
kind gets a lane of its own under the device's row and a colour of its own, named in the
key; the part of it its compute stream was idle for (exposed, ``sim.engine.exposure``) is
strong, the part under compute faint. The kinds are ``COMMUNICATION_KINDS``, keyed by the
engine's collective label (``sim.engine.groups.GROUP_LABELS``, and ``REDUCE`` for the
gradient reduction): a new kind of collective (MoE's all-to-all) is one entry.
"""

from __future__ import annotations

from sim.engine.exposure import class_intervals, split_exposed
from sim.engine.workload import GROUP, REDUCE

__all__ = ["COMMUNICATION_KINDS", "OTHER_KIND", "communication_lanes", "kind_of_op"]

COMMUNICATION_KINDS: dict[str, tuple[str, str, str]] = {
    "TP": ("#1f6f8b", "#b9dbe6", "tensor-parallel"),
    "TA": ("#4682b4", "#c6dbef", "tensor-parallel beside the backward"),
    "CP": ("#2e8b57", "#bfe3cd", "context-parallel ring"),
    "FS": ("#b8860b", "#f0dca8", "FSDP gather"),
    "PG": ("#8b4513", "#e6c9b3", "ZeRO-1/2 param gather"),
    "EP": ("#c71585", "#f3c2dd", "expert all-to-all"),
    "REDUCE": ("#7b2d8e", "#d9c3e0", "gradient reduction"),
}
"""Collective kind (the engine's label) -> (colour where exposed, colour where hidden, its name
in the key), in lane order (top to bottom). Strong colours unlike the compute kinds' (blue,
orange, red, green), each faint twin a light tint of it."""

OTHER_KIND = ("0.3", "0.8", "other collective")
"""A kind the table does not name yet: grey, so that it is drawn and keyed all the same."""


def kind_of_op(workload, cls, op) -> str:
    """The collective kind of a REDUCE or GROUP op: ``REDUCE``, or its group collective's label
    (``TP``, ``TA``, ``CP``, ``FS``, ``PG``, ``EP``)."""
    if op.code == REDUCE:
        return "REDUCE"
    collective = workload.group_collectives[cls.groups[op.collective]]
    return workload.kinds[collective.phases[0][0][0]].label[0]


def communication_lanes(result, devices) -> dict[int, dict[str, tuple[list, list]]]:
    """Device -> kind -> ``(exposed, hidden)`` intervals of its collectives of that kind, cut where
    its compute stream is busy (``sim.engine.exposure.class_intervals`` and ``split_exposed``,
    what the summary's ``exposed_communication_s`` adds up over every kind at once)."""
    workload, wanted, lanes = result.workload, set(devices), {}
    for cls, record in zip(workload.classes, result.records):
        members = [d for d in cls.devices if d in wanted]
        if not members:
            continue
        communication, busy = class_intervals(cls, record)
        comm_ops = [op for op in cls.ops if op.code in (REDUCE, GROUP)]
        by_kind: dict[str, list] = {}
        if len(comm_ops) == len(communication):  # every one ran (a failed replay: one lane of all)
            for op, interval in zip(comm_ops, communication):
                by_kind.setdefault(kind_of_op(workload, cls, op), []).append(interval)
        elif communication:
            by_kind["REDUCE"] = communication
        split = {kind: split_exposed(intervals, busy) for kind, intervals in by_kind.items()}
        for device in members:
            lanes[device] = split
    return lanes
