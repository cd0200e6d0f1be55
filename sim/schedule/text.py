"""The schedule file's text form: one line per rank, steps in torch's action text.

``parse_action("2F0")`` reads one step (``"(0F7;7B3)OVERLAP_F_B"`` reads a pair),
``parse_schedule`` a whole file: one line per rank in rank order, steps separated by spaces,
``#`` starting a comment, blank lines ignored. ``str(step)`` and ``str(schedule)`` write them
(``sim.schedule.ir``), and ``parse_schedule(str(s), name=s.name) == s`` for any schedule
whose ranks all have actions and whose highest stage and micro-batch appear in it.
``sim.schedule.torch_csv`` reads the same steps laid out as torch's CSV.
"""

from __future__ import annotations

import re

from sim.core.errors import ScheduleError
from sim.schedule.ir import (
    COMPUTE_KINDS,
    OVERLAP_F_B,
    Action,
    ActionKind,
    OverlapFB,
    Schedule,
    Step,
)

__all__ = ["parse_action", "parse_schedule", "schedule_from_ranks"]

_ACTION_RE = re.compile(r"(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|REDUCE_GRAD|F|B|I|W)(\d*)")
_PAIR_RE = re.compile(r"\(([^;()]*);([^;()]*)\)" + OVERLAP_F_B)
_FORM = "STAGE KIND [MICROBATCH], e.g. 2F0, 1SEND_F3, 0REDUCE_GRAD (kinds: " + ", ".join(
    k.value for k in ActionKind
) + f"), or a pair (FORWARD;BACKWARD){OVERLAP_F_B} such as (0F7;7B3){OVERLAP_F_B}"


def parse_action(text: str) -> Step:
    """Read one step from torch's text form (``"2F0"``, ``"(0F7;7B3)OVERLAP_F_B"``).

    The inverse of ``str(step)``.
    """
    pair = _PAIR_RE.fullmatch(text.strip())
    if pair is not None:
        forward, backward = (_parse_single(part, text) for part in pair.groups())
        return OverlapFB(forward=forward, backward=backward)
    return _parse_single(text, text)


def _parse_single(text: str, whole: str) -> Action:
    match = _ACTION_RE.fullmatch(text.strip())
    if match is None:
        inside = "" if text is whole else f" (in {whole!r})"
        raise ScheduleError(f"bad action {text!r}{inside}: expected {_FORM}")
    stage, kind_text, mb_text = match.groups()
    kind = ActionKind(kind_text)
    if kind is ActionKind.REDUCE_GRAD:
        if mb_text:
            raise ScheduleError(f"bad action {text!r}: REDUCE_GRAD takes no micro-batch")
        return Action(stage=int(stage), kind=kind, microbatch=None)
    if not mb_text:
        raise ScheduleError(f"bad action {text!r}: {kind.value} needs a micro-batch; {_FORM}")
    return Action(stage=int(stage), kind=kind, microbatch=int(mb_text))


def parse_schedule(text: str, *, name: str = "file") -> Schedule:
    """Read a schedule file: one line per rank, ``#`` comments, blank lines ignored.

    The number of stages and micro-batches are the largest indices plus one; each stage's
    rank is the one line on which its compute actions appear.
    """
    ranks: list[tuple[Step, ...]] = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        try:
            ranks.append(tuple(parse_action(w) for w in words))
        except ScheduleError as err:
            raise ScheduleError(f"{name} line {line_no}: {err}") from None
    if not ranks:
        raise ScheduleError(f"{name}: no actions (expected one line of actions per rank)")
    return schedule_from_ranks(ranks, name=name)


def schedule_from_ranks(ranks: list[tuple[Step, ...]], *, name: str) -> Schedule:
    """A schedule from its ranks' steps: stages and micro-batches are the largest indices
    plus one, each stage's rank the one rank whose compute actions name it."""
    actions = [a for acts in ranks for step in acts for a in step.parts]
    num_stages = max(a.stage for a in actions) + 1
    microbatches = [a.microbatch for a in actions if a.microbatch is not None]
    if not microbatches:
        raise ScheduleError(f"{name}: no action names a micro-batch")
    return Schedule(
        name=name,
        num_stages=num_stages,
        num_microbatches=max(microbatches) + 1,
        stage_ranks=_derive_stage_ranks(ranks, num_stages, name),
        ranks=tuple(ranks),
    )


def _derive_stage_ranks(
    ranks: list[tuple[Step, ...]], num_stages: int, name: str
) -> tuple[int, ...]:
    owners: list[set[int]] = [set() for _ in range(num_stages)]
    for rank, steps in enumerate(ranks):
        for step in steps:
            for a in step.parts:
                if a.kind in COMPUTE_KINDS:
                    owners[a.stage].add(rank)
    for stage, found in enumerate(owners):
        if len(found) != 1:
            where = f"on ranks {sorted(found)}" if found else "on no rank"
            raise ScheduleError(
                f"{name}: stage {stage} has compute actions {where}; "
                "each stage's F/B/I/W must appear on exactly one rank (line)"
            )
    return tuple(found.pop() for found in owners)
