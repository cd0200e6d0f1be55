"""V-shaped placement: two chunks per rank, rank r holding stages r and 2S−1−r.

Fold a 2S-stage pipeline in half like a hairpin: the micro-batch walks down the ranks
through stages 0..S−1, turns round on the last rank — which holds both stage S−1 and stage
S, so the turn is a local hand-off with no transfer — and walks back up through stages
S..2S−1 to finish on rank 0, where it started. Every rank holds one chunk from each leg, so
each rank's memory is balanced and the first rank, which holds the loss, is also where the
backward starts. torch numbers the stages this way (``generate_stage_to_rank_mapping(...,
style="v")``); both schedules here give torch 2.13's orders exactly:

- ``zb-v`` (torch's ``ScheduleZBVZeroBubble``; Qi et al., "Zero Bubble Pipeline
  Parallelism", ICLR 2024, §6): backwards split into I and W, the W's filling the bubbles;
  torch notes it has the zero-bubble property only when F, I and W take equal time.
- ``dualpipe-v`` (torch's ``ScheduleDualPipeV``, after DeepSeek's open DualPipe; DeepSeek-AI,
  "DeepSeek-V3 Technical Report", 2024, §3.2.1): the steady phase pairs a forward of one chunk
  with a backward of the other as one overlapped step, ``(0F7;7B3)OVERLAP_F_B``, so the
  communication of each hides under the compute of the other. torch requires at least as
  many micro-batches as stages (M ≥ 2S); so do we.
"""

from __future__ import annotations

from sim.core.errors import ScheduleError
from sim.schedule.gen_common import check_sizes, multi_chunk
from sim.schedule.ir import Action, ActionKind, OverlapFB, Schedule, Step

__all__ = ["V_CHUNKS", "dualpipe_v", "v_stage_ranks", "zb_v"]

F, B, I, W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W

V_CHUNKS = 2
"""Chunks per rank of a V-shaped schedule (torch: "requires exactly 2 stages per rank")."""


def v_stage_ranks(num_ranks: int) -> tuple[int, ...]:
    """Rank of each of the 2S stages: stage s on rank s for s < S, on rank 2S−1−s after."""
    return tuple(s if s < num_ranks else 2 * num_ranks - 1 - s for s in range(2 * num_ranks))


def _check_v_chunks(name: str, torch_name: str, chunks: object) -> None:
    if chunks != V_CHUNKS or isinstance(chunks, bool):
        raise ScheduleError(
            f"{name}: chunks={chunks!r}, but a V-shaped schedule runs exactly {V_CHUNKS} chunks per rank "
            f"(as torch's {torch_name}); drop chunks or give {V_CHUNKS}"
        )


def _v_schedule(name: str, num_ranks: int, num_microbatches: int, orders: list[list[Step]]) -> Schedule:
    owner = v_stage_ranks(num_ranks)
    return multi_chunk(name, num_ranks, num_microbatches, V_CHUNKS, owner.__getitem__, orders)


def zb_v(num_stages: int, num_microbatches: int, *, chunks: int = V_CHUNKS) -> Schedule:
    """ZB-V: zero bubble on the V (Qi et al., ICLR 2024, §6), torch's ``ScheduleZBVZeroBubble``.

    ``num_stages`` is the number of ranks S; the schedule has 2S stages. Rank r (chunks
    c0 = r, c1 = 2S−1−r) warms up with 2(S−r)−1 forwards of c0, then r pairs F(c1) F(c0),
    then S−r rounds of F(c1) I(c1) W(c1); the steady phase repeats F(c0) I(c0) W(c0) F(c1)
    I(c1) W(c1) (the F(c0) while forwards remain); the drain runs r rounds of I(c0) I(c1),
    S−r rounds of I(c0) W(c0), then the pending W's of c1 and of c0. Like torch it plans
    max(2S−1, M) micro-batches and drops those past M.
    """
    check_sizes("zb-v", num_stages, num_microbatches)
    _check_v_chunks("zb-v", "ScheduleZBVZeroBubble", chunks)
    orders: list[list[Step]] = [
        _zb_v_rank(rank, num_stages, num_microbatches) for rank in range(num_stages)
    ]
    return _v_schedule("zb-v", num_stages, num_microbatches, orders)


def _zb_v_rank(rank: int, ranks: int, num_microbatches: int) -> list[Step]:
    planned = max(2 * ranks - 1, num_microbatches)
    c0, c1 = rank, 2 * ranks - 1 - rank
    count = {(c, k): 0 for c in (c0, c1) for k in (F, I, W)}
    order: list[Step] = []

    def add(stage: int, kind: ActionKind, microbatch: int | None = None) -> None:
        mb = count[(stage, kind)] if microbatch is None else microbatch
        order.append(Action(stage=stage, kind=kind, microbatch=mb))
        if microbatch is None:
            count[(stage, kind)] += 1

    def backward(stage: int) -> None:  # I then W of the same micro-batch
        add(stage, I)
        add(stage, W)

    for _ in range(2 * (ranks - rank) - 1):
        add(c0, F)
    for _ in range(rank):
        add(c1, F)
        add(c0, F)
    for _ in range(ranks - rank):
        add(c1, F)
        backward(c1)
    while count[(c1, F)] < count[(c0, F)] or count[(c0, F)] < planned:
        if count[(c0, F)] < planned:
            add(c0, F)
        backward(c0)
        add(c1, F)
        backward(c1)
    for _ in range(rank):
        add(c0, I)
        add(c1, I)
    for _ in range(ranks - rank):
        add(c0, I)
        add(c0, W)
    for stage in (c1, c0):
        while count[(stage, W)] < count[(stage, I)]:
            add(stage, W)
    return [a for a in order if a.microbatch < num_microbatches]


def dualpipe_v(num_stages: int, num_microbatches: int, *, chunks: int = V_CHUNKS) -> Schedule:
    """DualPipeV (DeepSeek-V3 technical report, 2024, §3.2.1), torch's ``ScheduleDualPipeV``.

    ``num_stages`` is the number of ranks S; the schedule has 2S stages and needs M ≥ 2S.
    Rank r (chunks c0 = r, c1 = 2S−1−r), in torch's eight steps: 2(S−r−1) forwards of c0;
    r+1 pairs F(c0) F(c1); S−r−1 rounds of I(c1), a pending W, F(c1); then the main phase of
    M−2S+r+1 rounds of the overlapped pairs (F(c0);B(c1)) and (F(c1);B(c0)) — the last rank
    runs its first F(c0) and B(c1) apart, to shorten the bubble; S−r−1 rounds of B(c1) and
    (F(c1);B(c0)); r+1 rounds of backwards of c1 and c0, full B's in the first half and I's
    (their W's queued) in the second; S−r−1 rounds of a pending W and a backward of c0; and
    the r+1 pending W's.
    """
    check_sizes("dualpipe-v", num_stages, num_microbatches)
    _check_v_chunks("dualpipe-v", "ScheduleDualPipeV", chunks)
    if num_microbatches < V_CHUNKS * num_stages:
        raise ScheduleError(
            f"dualpipe-v: num_microbatches={num_microbatches} is fewer than the {V_CHUNKS * num_stages} "
            f"stages ({V_CHUNKS} per rank on {num_stages} ranks); torch's ScheduleDualPipeV needs "
            f"M >= 2·S, so use at least {V_CHUNKS * num_stages}"
        )
    orders = [_dualpipe_v_rank(rank, num_stages, num_microbatches) for rank in range(num_stages)]
    return _v_schedule("dualpipe-v", num_stages, num_microbatches, orders)


def _dualpipe_v_rank(rank: int, ranks: int, num_microbatches: int) -> list[Step]:
    c0, c1 = rank, 2 * ranks - 1 - rank
    next_f = {c0: 0, c1: 0}
    next_b = {c0: 0, c1: 0}  # a B and an I both take the next backward micro-batch
    pending_w: list[Action] = []  # W's of issued I's, oldest first
    order: list[Step] = []

    def forward(stage: int) -> Action:
        next_f[stage] += 1
        return Action(stage=stage, kind=F, microbatch=next_f[stage] - 1)

    def backward(stage: int, kind: ActionKind = B) -> Action:
        next_b[stage] += 1
        action = Action(stage=stage, kind=kind, microbatch=next_b[stage] - 1)
        if kind is I:
            pending_w.append(Action(stage=stage, kind=W, microbatch=action.microbatch))
        return action

    def pair(forward_stage: int, backward_stage: int) -> None:
        fwd = forward(forward_stage)
        order.append(OverlapFB(forward=fwd, backward=backward(backward_stage)))

    def weight_if_pending() -> None:
        if pending_w:
            order.append(pending_w.pop(0))

    for _ in range(2 * (ranks - rank - 1)):  # step 1
        order.append(forward(c0))
    for _ in range(rank + 1):  # step 2
        order.append(forward(c0))
        order.append(forward(c1))
    for _ in range(ranks - rank - 1):  # step 3: zero bubble on c1
        order.append(backward(c1, I))
        weight_if_pending()
        order.append(forward(c1))
    for i in range(num_microbatches - 2 * ranks + rank + 1):  # step 4: the overlapped main phase
        if i == 0 and rank == ranks - 1:
            order.append(forward(c0))
            order.append(backward(c1))
        else:
            pair(c0, c1)
        pair(c1, c0)
    for _ in range(ranks - rank - 1):  # step 5
        order.append(backward(c1))
        pair(c1, c0)
    split = False
    for i in range(rank + 1):  # step 6: the second half splits its backwards
        if i == (rank + 1) // 2 and rank % 2 == 1:
            split = True
        order.append(backward(c1, I if split else B))
        if i == (rank + 1) // 2 and rank % 2 == 0:
            split = True
        order.append(backward(c0, I if split else B))
    for _ in range(ranks - rank - 1):  # step 7
        weight_if_pending()
        order.append(backward(c0, I if split else B))
    for _ in range(rank + 1):  # step 8
        weight_if_pending()
    return order
