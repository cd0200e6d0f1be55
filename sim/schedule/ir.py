"""The schedule IR: for every rank, the ordered list of actions it performs.

A pipeline schedule says, for each rank (device), what to do next. Think of a kitchen
line: each cook (rank) owns a station (stage) and works through a ticket list in order —
"sear dish 0, sear dish 1, plate dish 0" — and can only start a ticket once the dishes it
needs have arrived from the neighbouring station. Nothing else describes a schedule: the
simulator replays these lists and the runtime executes them.

An action is ``(stage, kind, microbatch)``. Its text is the one used by
``torch.distributed.pipelining`` so schedules can be exchanged with torch:

- compute: ``2F0`` (stage 2 forward of micro-batch 0), ``2B0`` (full backward),
  ``2I0`` (backward for the input gradient only), ``2W0`` (backward for the weight
  gradient only; Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024);
- communication: ``2SEND_F0`` / ``3RECV_F0`` move an activation from stage 2 to stage 3,
  ``3SEND_B0`` / ``2RECV_B0`` move its gradient back;
- ``2REDUCE_GRAD``: the all-reduce of stage 2's gradients across its replicas (no micro-batch);
- a pair: ``(0F7;7B3)OVERLAP_F_B`` runs stage 0's forward of micro-batch 7 and stage 7's
  backward of micro-batch 3 together, so the communication of one hides under the compute of
  the other (DualPipe; DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024, §3.2.1). It is one
  step of its rank, an :class:`OverlapFB`, not an :class:`Action`: the two parts are ordinary
  actions and every rule below applies to each of them, except that neither may wait for the
  other. torch writes it the same way (``_Action(-1, OVERLAP_F_B, None, sub_actions)``).

A *step* is what one entry of a rank's list holds: an action or a pair (:data:`Step`);
``step.parts`` gives the actions it runs (the action itself, or the pair's two).

``str(step)`` and ``str(schedule)`` write the schedule file (one line per rank, steps
separated by spaces); ``sim.schedule.text`` reads it back (``parse_action``,
``parse_schedule``) and ``sim.schedule.torch_csv`` reads and writes torch's pipeline-order
CSV of the same steps.

Semantics (what an action waits for) are those of dataflow: see :func:`dependencies`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sim.core.errors import ScheduleError

__all__ = [
    "COMM_KINDS",
    "COMPUTE_KINDS",
    "OVERLAP_F_B",
    "Action",
    "ActionKind",
    "OverlapFB",
    "Ref",
    "Schedule",
    "Step",
    "Where",
    "dependencies",
    "positions",
    "wait_lists",
]


class ActionKind(StrEnum):
    """What an action does; the value is its text in torch's action strings."""

    F = "F"
    B = "B"
    I = "I"  # noqa: E741 — torch's name for the input-gradient half of a backward
    W = "W"
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"
    REDUCE_GRAD = "REDUCE_GRAD"


COMPUTE_KINDS = frozenset({ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W})
"""Kinds that run a stage's layers (they take compute time)."""

COMM_KINDS = frozenset(
    {ActionKind.SEND_F, ActionKind.RECV_F, ActionKind.SEND_B, ActionKind.RECV_B}
)
"""Point-to-point kinds added by lowering (``sim.schedule.passes.lower``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    """One step of one rank: ``str(Action(stage=2, kind=ActionKind.F, microbatch=0)) == "2F0"``."""

    stage: int
    """Pipeline stage (virtual stage for interleaved schedules), 0-based."""
    kind: ActionKind
    """What the step does."""
    microbatch: int | None
    """Micro-batch index, 0-based; ``None`` only for ``REDUCE_GRAD``."""

    def __post_init__(self) -> None:
        if (self.microbatch is None) != (self.kind is ActionKind.REDUCE_GRAD):
            raise ScheduleError(
                f"action {self.stage}{self.kind.value}{self.microbatch}: only REDUCE_GRAD "
                "has no micro-batch, every other kind needs one"
            )

    def __str__(self) -> str:
        if self.microbatch is None:
            return f"{self.stage}{self.kind.value}"
        return f"{self.stage}{self.kind.value}{self.microbatch}"

    @property
    def is_compute(self) -> bool:
        """True for F, B, I and W."""
        return self.kind in COMPUTE_KINDS

    @property
    def parts(self) -> tuple[Action, ...]:
        """The actions this step runs: itself (an :class:`OverlapFB` has two)."""
        return (self,)


OVERLAP_F_B = "OVERLAP_F_B"
"""torch's name for an overlapped forward-backward pair, as its text ends."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OverlapFB:
    """A forward and a backward one rank runs at once: ``(0F7;7B3)OVERLAP_F_B``.

    DualPipe (DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024, §3.2.1) pairs the forward
    of one micro-batch with the backward of another so that each one's communication hides
    under the other's compute; torch's ``ScheduleDualPipeV`` writes the pair as an
    ``OVERLAP_F_B`` action whose ``sub_actions`` are the two. How much the two overlap in
    time is the simulator's business; the IR only says they form one step. The parts are in
    torch's order, forward first; they may not depend on each other (the checker says so).
    A pair is not an :class:`ActionKind`: a kind names what one stage does to one
    micro-batch, and a pair is two of those, so code that reads ``step.stage`` must look at
    ``step.parts`` instead.
    """

    forward: Action
    """The forward part (kind F)."""
    backward: Action
    """The backward part: a full backward B or an input-gradient backward I."""

    def __post_init__(self) -> None:
        if self.forward.kind is not ActionKind.F or self.backward.kind not in (ActionKind.B, ActionKind.I):
            raise ScheduleError(
                f"pair ({self.forward};{self.backward}){OVERLAP_F_B}: an overlapped pair is a forward "
                f"then a backward, e.g. (0F7;7B3){OVERLAP_F_B} (B or I second)"
            )

    def __str__(self) -> str:
        return f"({self.forward};{self.backward}){OVERLAP_F_B}"

    @property
    def kind(self) -> str:
        """``"OVERLAP_F_B"``, torch's computation type (not an :class:`ActionKind`)."""
        return OVERLAP_F_B

    @property
    def is_compute(self) -> bool:
        """True: a pair runs layers."""
        return True

    @property
    def parts(self) -> tuple[Action, Action]:
        """The two actions, forward first (torch's ``sub_actions``)."""
        return (self.forward, self.backward)


Step = Action | OverlapFB
"""One entry of a rank's list: an action, or an overlapped pair of two."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """A whole pipeline schedule: one ordered list of steps (actions or pairs) per rank.

    ``__post_init__`` checks only the shape; :func:`sim.schedule.check.check_schedule` checks
    that the actions are complete, well placed and free of deadlock.
    """

    name: str
    """Where it came from: a generator name (``dapple``) or ``file``."""
    num_stages: int
    """Number of (virtual) stages, >= 1."""
    num_microbatches: int
    """Micro-batches per iteration, >= 1."""
    stage_ranks: tuple[int, ...]
    """Rank that runs each stage (interleaved: stage s on rank s % num_ranks)."""
    ranks: tuple[tuple[Step, ...], ...]
    """Step list of each rank, in rank order (a step is an action or an overlapped pair)."""

    def __post_init__(self) -> None:
        if self.num_stages < 1 or self.num_microbatches < 1:
            raise ScheduleError(
                f"schedule {self.name!r}: num_stages={self.num_stages} and "
                f"num_microbatches={self.num_microbatches} must both be >= 1"
            )
        if not self.ranks:
            raise ScheduleError(f"schedule {self.name!r}: has no ranks")
        if len(self.stage_ranks) != self.num_stages:
            raise ScheduleError(
                f"schedule {self.name!r}: stage_ranks has {len(self.stage_ranks)} entries, "
                f"expected one per stage ({self.num_stages})"
            )
        bad = [r for r in self.stage_ranks if not 0 <= r < len(self.ranks)]
        if bad:
            raise ScheduleError(
                f"schedule {self.name!r}: stage_ranks {self.stage_ranks} names rank {bad[0]}, "
                f"valid ranks are 0..{len(self.ranks) - 1}"
            )

    @property
    def num_ranks(self) -> int:
        """Number of ranks (devices in one pipeline)."""
        return len(self.ranks)

    @property
    def is_lowered(self) -> bool:
        """True when the schedule holds send/receive actions."""
        return any(a.kind in COMM_KINDS for actions in self.ranks for a in actions)

    def to_text(self) -> str:
        """One line per rank, actions separated by single spaces (the schedule file format)."""
        return "\n".join(" ".join(map(str, actions)) for actions in self.ranks)

    def __str__(self) -> str:
        return self.to_text()


# --- semantics -------------------------------------------------------------------------

Ref = tuple[int, ActionKind, int | None]
"""An action as a plain ``(stage, kind, microbatch)`` tuple (hashes and compares in C)."""

Where = tuple[int, int]
"""Position of a step: ``(rank, index in that rank's list)``."""


def dependencies(
    action: Action, *, num_stages: int, stage_ranks: tuple[int, ...], lowered: bool
) -> tuple[Ref, ...]:
    """The actions ``action`` waits for (dataflow semantics).

    Compute: F(s,m) needs F(s−1,m); B or I of (s,m) needs F(s,m) and the input gradient of
    (s+1,m) — written ``(s+1, B, m)``, produced by that stage's B or, when its backward is
    split, its I; W(s,m) needs I(s,m). In a lowered schedule a cross-rank input arrives
    through a receive instead: the compute needs the ``RECV`` on its own rank, and the
    ``RECV`` needs the matching ``SEND`` to have been issued. Sends are non-blocking and
    ``REDUCE_GRAD`` waits for nothing here (their place in the list is checked statically).
    """
    s, kind, m = action.stage, action.kind, action.microbatch
    if kind is ActionKind.F:
        if s == 0:
            return ()
        if lowered and stage_ranks[s - 1] != stage_ranks[s]:
            return ((s, ActionKind.RECV_F, m),)
        return ((s - 1, ActionKind.F, m),)
    if kind is ActionKind.B or kind is ActionKind.I:
        if s == num_stages - 1:
            return ((s, ActionKind.F, m),)
        if lowered and stage_ranks[s + 1] != stage_ranks[s]:
            return ((s, ActionKind.F, m), (s, ActionKind.RECV_B, m))
        return ((s, ActionKind.F, m), (s + 1, ActionKind.B, m))
    if kind is ActionKind.W:
        return ((s, ActionKind.I, m),)
    if kind is ActionKind.RECV_F:
        return ((s - 1, ActionKind.SEND_F, m),)
    if kind is ActionKind.RECV_B:
        return ((s + 1, ActionKind.SEND_B, m),)
    return ()


def positions(schedule: Schedule) -> dict[Ref, Where]:
    """Where each action sits (for a duplicated action, its last place); both parts of a
    pair sit at the pair's place."""
    where: dict[Ref, Where] = {}
    for rank, acts in enumerate(schedule.ranks):
        for index, a in enumerate(acts):
            if type(a) is OverlapFB:
                for part in a.parts:
                    where[(part.stage, part.kind, part.microbatch)] = (rank, index)
            else:
                where[(a.stage, a.kind, a.microbatch)] = (rank, index)
    return where


def wait_lists(
    schedule: Schedule, where: dict[Ref, Where] | None = None
) -> list[list[tuple[Where, ...]]]:
    """For every rank and step, the positions of the steps it waits for.

    A pair waits for what either of its parts waits for. Raises :class:`ScheduleError`
    naming the first action whose dependency is absent; ``sim.schedule.check.check_schedule``
    explains such schedules better.
    """
    where = positions(schedule) if where is None else where
    lowered, owner, stages = schedule.is_lowered, schedule.stage_ranks, schedule.num_stages
    get = where.get
    # Dependencies differ only in the micro-batch between actions of one (stage, kind).
    templates: dict[tuple[int, ActionKind], tuple[tuple[int, ActionKind], ...]] = {}
    table: list[list[tuple[Where, ...]]] = []
    for rank, acts in enumerate(schedule.ranks):
        row: list[tuple[Where, ...]] = []
        for index, step in enumerate(acts):
            found: tuple[Where, ...] = ()
            for a in step.parts:
                s, kind, m = a.stage, a.kind, a.microbatch
                template = templates.get((s, kind))
                if template is None:
                    deps = dependencies(a, num_stages=stages, stage_ranks=owner, lowered=lowered)
                    template = templates[(s, kind)] = tuple((d[0], d[1]) for d in deps)
                part = tuple([get((s2, k2, m)) for s2, k2 in template])
                if None in part:
                    part = tuple(_locate(where, (s2, k2, m), rank, index, a) for s2, k2 in template)
                found = part if not found else found + part
            row.append(found)
        table.append(row)
    return table


def _locate(where: dict[Ref, Where], ref: Ref, rank: int, index: int, action: Action) -> Where:
    found = where.get(ref)
    if found is None and ref[1] is ActionKind.B:  # an input gradient may come from an I
        found = where.get((ref[0], ActionKind.I, ref[2]))
    if found is None:
        raise ScheduleError(
            f"rank {rank} step {index}: {action} waits for {_ref_text(ref)}, "
            "which is not in the schedule"
        )
    return found


def _ref_text(ref: Ref) -> str:
    stage, kind, mb = ref
    return f"{stage}{kind.value}" if mb is None else f"{stage}{kind.value}{mb}"
