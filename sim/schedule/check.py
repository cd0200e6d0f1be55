"""Schedule check: reject malformed or deadlocking schedules, pointing at the culprit.

A schedule is checked the way a reviewer reads it, cheapest question first:

1. shape — every action names a stage and micro-batch in range and sits on the rank that
   owns its stage; no action appears twice; the two parts of an overlapped pair
   (``(0F7;7B3)OVERLAP_F_B``) do not wait for each other, since they run at once;
2. completeness — every (stage, micro-batch) has one F and either one B or one I and one W;
3. order on a rank — B/I after its F, W after its I, ``REDUCE_GRAD`` after the stage's last
   backward; in a lowered schedule every cross-rank hop has its send after the producer and
   its receive before the consumer, and nothing else;
4. a dry run — the ranks execute their lists under dataflow semantics
   (:func:`sim.schedule.ir.dependencies`); if some rank is left waiting for something that
   never happens, the schedule deadlocks.

The first failure raises :class:`~sim.core.errors.ScheduleError` with a one-line message
(``rank 1 step 3: 1B0 waits for 2B0 (rank 2 step 5), which never runs (deadlock)``) and,
in ``detail``, the rank × step grid with the culprit in brackets — like torch's
``_format_pipeline_order`` but with ranks as rows.

The dry run is event driven rather than round by round: a rank runs until it blocks on a
missing result, then sleeps until that result appears. Whether a set of ranks can finish does
not depend on the order they take turns, so this gives the lockstep answer in O(actions).
"""

from __future__ import annotations

import heapq
from collections import deque

from sim.core.errors import ScheduleError
from sim.schedule.ir import ActionKind, OverlapFB, Ref, Schedule, Where, wait_lists

__all__ = ["check_schedule", "format_grid", "run_ranks"]

F, B, I, W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W

_GRID_WINDOW = 12  # steps shown either side of the marked action in long schedules
_GRID_FULL = 40  # schedules up to this many steps are always shown whole


def check_schedule(schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` unless ``schedule`` is complete, placed right, deadlock-free."""
    where = _index(schedule)
    _check_pairs(schedule)
    _check_complete(schedule, where)
    _check_order(schedule, where)
    if schedule.is_lowered:
        _check_communication(schedule, where)
    _dry_run(schedule, where)


def _text(ref: Ref) -> str:
    stage, kind, mb = ref
    return f"{stage}{kind.value}" if mb is None else f"{stage}{kind.value}{mb}"


def _fail(schedule: Schedule, mark: Where | None, message: str) -> None:
    if mark is not None:
        rank, index = mark
        message = f"rank {rank} step {index}: {schedule.ranks[rank][index]} {message}"
    raise ScheduleError(message, detail=_grid(schedule, mark))


def _grid(schedule: Schedule, mark: Where | None) -> str:
    """The grid for an error: whole when short, else a window around the mark."""
    long = max(len(acts) for acts in schedule.ranks) > _GRID_FULL
    return format_grid(schedule, mark, window=_GRID_WINDOW if long else None)


def _index(schedule: Schedule) -> dict[Ref, Where]:
    """Position of every action; fails on out-of-range, misplaced or duplicate actions."""
    where: dict[Ref, Where] = {}
    owner = dict(enumerate(schedule.stage_ranks))
    valid_microbatches = {None, *range(schedule.num_microbatches)}
    for rank, acts in enumerate(schedule.ranks):
        for index, step in enumerate(acts):
            for a in step.parts:
                ref = (a.stage, a.kind, a.microbatch)
                if owner.get(ref[0]) != rank or ref[2] not in valid_microbatches or ref in where:
                    _misplaced(schedule, where, (rank, index), ref)
                where[ref] = (rank, index)
    return where


def _misplaced(schedule: Schedule, where: dict[Ref, Where], pos: Where, ref: Ref) -> None:
    stage, _, mb = ref
    step = schedule.ranks[pos[0]][pos[1]]
    part = f"its part {_text(ref)} " if type(step) is OverlapFB else ""
    if not 0 <= stage < schedule.num_stages:
        _fail(schedule, pos, f"{part}names stage {stage}, valid stages are 0..{schedule.num_stages - 1}")
    if mb is not None and not 0 <= mb < schedule.num_microbatches:
        _fail(schedule, pos, f"{part}names micro-batch {mb}, valid micro-batches are "
              f"0..{schedule.num_microbatches - 1}")
    if schedule.stage_ranks[stage] != pos[0]:
        _fail(schedule, pos, f"{part}is on rank {pos[0]} but stage {stage} runs on rank "
              f"{schedule.stage_ranks[stage]}")
    _fail(schedule, pos, f"{part}is a duplicate of step {where[ref][1]}")


def _check_pairs(schedule: Schedule) -> None:
    """The parts of an OVERLAP_F_B run at once, so the backward may not need the forward."""
    for rank, acts in enumerate(schedule.ranks):
        for index, step in enumerate(acts):
            if type(step) is not OverlapFB:
                continue
            fwd, bwd = step.forward, step.backward
            if (fwd.stage, fwd.microbatch) == (bwd.stage, bwd.microbatch):
                _fail(schedule, (rank, index), f"pairs {bwd} with the forward {fwd} it waits for; the two "
                      "parts of a pair run at once, so pair a backward with another micro-batch's forward")


def _check_complete(schedule: Schedule, where: dict[Ref, Where]) -> None:
    for s in range(schedule.num_stages):
        for m in range(schedule.num_microbatches):
            fwd, full, inp, wgt = ((s, k, m) for k in (F, B, I, W))
            if fwd in where and full in where and inp not in where and wgt not in where:
                continue  # the common case, checked first
            _check_one_microbatch(schedule, where, fwd, full, inp, wgt)


def _check_one_microbatch(schedule: Schedule, where: dict[Ref, Where], fwd, full, inp, wgt):
    head = f"stage {fwd[0]} micro-batch {fwd[2]}:"
    if fwd not in where:
        _missing(schedule, where, f"{head} forward missing (no {_text(fwd)})", (full, inp))
    if full in where and (inp in where or wgt in where):
        split = inp if inp in where else wgt
        _fail(schedule, where[split], f"splits a backward that {_text(full)} already runs in "
              "full (use either B or I and W)")
    if full in where:
        return
    if inp not in where and wgt not in where:
        _missing(schedule, where, f"{head} backward missing (no {_text(full)}, or {_text(inp)} "
                 f"and {_text(wgt)})", (fwd,))
    if inp not in where:
        _missing(schedule, where, f"{head} input gradient missing (no {_text(inp)} before "
                 f"{_text(wgt)})", (wgt,))
    if wgt not in where:
        _missing(schedule, where, f"{head} weight gradient missing (no {_text(wgt)} after "
                 f"{_text(inp)})", (inp,))


def _missing(schedule: Schedule, where: dict[Ref, Where], message: str, near: tuple[Ref, ...]):
    """Fail for an absent action; the grid marks a present action of the same micro-batch."""
    mark = next((where[ref] for ref in near if ref in where), None)
    raise ScheduleError(message, detail=_grid(schedule, mark))


def _check_order(schedule: Schedule, where: dict[Ref, Where]) -> None:
    last_grad: dict[int, Where] = {}
    for (s, kind, m), pos in where.items():
        if kind is B or kind is I:
            _require_before(schedule, where, (s, F, m), pos)
        elif kind is W:
            _require_before(schedule, where, (s, I, m), pos)
        if (kind is B or kind is W) and pos > last_grad.get(s, (-1, -1)):
            last_grad[s] = pos
    for (s, kind, _), pos in where.items():
        if kind is ActionKind.REDUCE_GRAD and pos < last_grad[s]:
            rank, index = last_grad[s]
            _fail(schedule, pos, f"runs before the stage's last backward "
                  f"{schedule.ranks[rank][index]} (step {index})")


def _require_before(schedule: Schedule, where: dict[Ref, Where], first: Ref, pos: Where) -> None:
    if where[first] > pos:
        _fail(schedule, pos, f"runs before {_text(first)} (step {where[first][1]})")


_SEND_RECV = {  # kind -> (peer stage offset, partner kind, kinds of the local compute)
    ActionKind.SEND_F: (+1, ActionKind.RECV_F, (F,)),
    ActionKind.RECV_F: (-1, ActionKind.SEND_F, (F,)),
    ActionKind.SEND_B: (-1, ActionKind.RECV_B, (B, I)),
    ActionKind.RECV_B: (+1, ActionKind.SEND_B, (B, I)),
}


def _check_communication(schedule: Schedule, where: dict[Ref, Where]) -> None:
    """Each cross-rank hop has exactly send-after-producer and receive-before-consumer."""
    owner, last = schedule.stage_ranks, schedule.num_stages - 1
    for (s, kind, m), pos in where.items():
        if kind not in _SEND_RECV:
            continue
        offset, partner_kind, compute_kinds = _SEND_RECV[kind]
        peer = s + offset
        if not 0 <= peer <= last or owner[peer] == owner[s]:
            _fail(schedule, pos, f"has no partner: stage {peer} is not on another rank")
        partner = (peer, partner_kind, m)
        if partner not in where:
            _fail(schedule, pos, f"has no matching {_text(partner)} on rank {owner[peer]}")
        compute = (s, compute_kinds[0], m)
        if compute not in where:
            compute = (s, I, m)  # a split backward
        is_send = kind is ActionKind.SEND_F or kind is ActionKind.SEND_B
        if is_send and where[compute] > pos:
            _fail(schedule, pos, f"is issued before {_text(compute)} (step "
                  f"{where[compute][1]}) computes it")
        if not is_send and where[compute] < pos:
            _fail(schedule, where[compute], f"runs before its receive {_text((s, kind, m))} "
                  f"(step {pos[1]})")
    _check_hops_lowered(schedule, where)


def _check_hops_lowered(schedule: Schedule, where: dict[Ref, Where]) -> None:
    owner = schedule.stage_ranks
    for s in range(1, schedule.num_stages):
        if owner[s - 1] == owner[s]:
            continue
        for m in range(schedule.num_microbatches):
            for recv in ((s, ActionKind.RECV_F, m), (s - 1, ActionKind.RECV_B, m)):
                if recv not in where:
                    consumer = (recv[0], F if recv[1] is ActionKind.RECV_F else B, m)
                    _missing(schedule, where, f"stage {recv[0]} micro-batch {m}: receive "
                             f"{_text(recv)} missing on rank {owner[recv[0]]} (lowered "
                             "schedule)", (consumer, (recv[0], I, m)))


def _dry_run(schedule: Schedule, where: dict[Ref, Where]) -> None:
    """Run every rank's list under dataflow semantics; fail on the first stuck action."""
    waits = wait_lists(schedule, where)
    pos, _ = run_ranks(waits)
    stuck = [(pos[r], r) for r in range(schedule.num_ranks) if pos[r] < len(waits[r])]
    if stuck:
        index, rank = min(stuck)
        blocker = next(p for p in waits[rank][index] if pos[p[0]] <= p[1])
        _fail(schedule, (rank, index), f"waits for {schedule.ranks[blocker[0]][blocker[1]]} "
              f"(rank {blocker[0]} step {blocker[1]}), which never runs (deadlock)")


def run_ranks(waits: list[list[tuple[Where, ...]]]) -> tuple[list[int], list[Where]]:
    """Advance every rank as far as its dependencies allow (the dry run).

    A rank runs until an action waits for one that has not run, then sleeps (in a heap
    keyed by the position it waits for) until that rank passes it. Returns how far each
    rank got and the order the actions ran in, which respects every dependency.
    """
    num_ranks = len(waits)
    pos = [0] * num_ranks
    order: list[Where] = []
    sleepers: list[list[tuple[int, int]]] = [[] for _ in range(num_ranks)]
    ready = deque(range(num_ranks))
    while ready:
        rank = ready.popleft()
        row, i = waits[rank], pos[rank]
        while i < len(row):
            for other, j in row[i]:
                if (pos[other] <= j) if other != rank else (j >= i):
                    heapq.heappush(sleepers[other], (j, rank))
                    break
            else:
                order.append((rank, i))
                i += 1
                continue
            break
        pos[rank] = i
        woken = sleepers[rank]
        while woken and woken[0][0] < i:
            ready.append(heapq.heappop(woken)[1])
    return pos, order


def format_grid(schedule: Schedule, mark: Where | None = None, *, window: int | None = None) -> str:
    """The rank × step grid of ``schedule``; ``mark=(rank, index)`` is bracketed and pointed at.

    ``window`` keeps only that many steps either side of the mark (without a mark, the first
    2·window+1 steps); by default the whole grid is shown.
    """
    num_steps = max((len(acts) for acts in schedule.ranks), default=0)
    first, stop = 0, num_steps
    if window is not None:
        center = mark[1] if mark is not None else window
        first, stop = max(0, center - window), min(num_steps, center + window + 1)
    cells = [
        [f"[{a}]" if mark == (rank, i) else f" {a} " for i, a in enumerate(acts[first:stop], first)]
        for rank, acts in enumerate(schedule.ranks)
    ]
    widths = [
        max([len(str(step)) + 2] + [len(row[c]) for row in cells if c < len(row)])
        for c, step in enumerate(range(first, stop))
    ]
    label = len(f"rank {schedule.num_ranks - 1}") + 1
    lines = ["step".ljust(label) + "".join(str(step).center(w) for step, w in
                                            zip(range(first, stop), widths)).rstrip()]
    for rank, row in enumerate(cells):
        lines.append(f"rank {rank}".ljust(label) + "".join(
            cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if mark is not None and mark[0] == rank:
            lines.append(" " * (label + sum(widths[: mark[1] - first]) + 1) + "^")
    if (first, stop) != (0, num_steps):
        lines.append(f"(steps {first}..{stop - 1} of 0..{num_steps - 1})")
    return "\n".join(lines)
