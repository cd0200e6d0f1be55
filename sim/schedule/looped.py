"""Looped placement: v model chunks per rank, virtual stage s on rank s mod S.

Cutting the model into S·v stages and dealing them round the S ranks like cards makes
each rank hold v thin chunks instead of one thick one. A micro-batch then loops round the
ranks v times, and the pipeline fills v times faster, because the first rank can start its
next chunk while the later ranks work on the first. The three schedules differ in which
ready chunk a rank runs first, in torch 2.13's orders exactly:

- ``interleaved`` (torch's ``ScheduleInterleaved1F1B``; Narayanan et al., "Efficient
  Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC 2021, §2.2):
  depth first, rounds of micro-batches through one chunk before the next, 1F1B in between;
- ``interleaved-zb`` (torch's ``ScheduleInterleavedZeroBubble``, which torch calls the ZB1P
  schedule of Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): the same loop with
  backwards split into I and W, a shorter warm-up and the W's filling the bubbles;
- ``looped-bfs`` (torch's ``ScheduleLoopedBFS``; Lamy-Poirier, "Breadth-First Pipeline
  Parallelism", MLSys 2023, arXiv:2211.05953): breadth first, every micro-batch through a
  chunk before the next chunk, like GPipe per chunk; backwards from the last chunk and last
  micro-batch back.

torch's looped schedules need M to be a multiple of the number of rounds max(1, M // S);
``interleaved`` and ``interleaved-zb`` reject other counts with the same rule.
"""

from __future__ import annotations

from sim.core.errors import ScheduleError
from sim.schedule.gen_common import check_chunks, check_sizes, multi_chunk
from sim.schedule.ir import Action, ActionKind, Schedule
from sim.schedule.policy import interleaved_warmup, interleaved_zb_warmup

__all__ = ["interleaved", "interleaved_zb", "looped_bfs"]

F, B, I, W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W


def _per_round(name: str, torch_name: str, num_ranks: int, num_microbatches: int) -> int:
    """Micro-batches per round, as torch's looped schedules split them."""
    rounds = max(1, num_microbatches // num_ranks)
    if num_microbatches % rounds:
        raise ScheduleError(
            f"{name}: num_microbatches={num_microbatches} is not a multiple of the number of rounds "
            f"max(1, M // S) = {rounds}; use M < 2·S or a multiple of S={num_ranks} (as torch's "
            f"{torch_name})"
        )
    return num_microbatches // rounds


def _looped(name: str, num_ranks: int, num_microbatches: int, chunks: int, orders) -> Schedule:
    return multi_chunk(name, num_ranks, num_microbatches, chunks, lambda s: s % num_ranks, orders)


def interleaved(num_stages: int, num_microbatches: int, *, chunks: int = 2) -> Schedule:
    """Interleaved 1F1B with ``chunks`` virtual stages per rank, in torch 2.13's order.

    Narayanan et al. (SC'21, §2.2) place virtual stage s on rank s % S and run micro-batches
    in rounds of S through one chunk before moving to the next (depth first). Like torch's
    ``ScheduleInterleaved1F1B`` we allow any M whose rounds divide it: rounds =
    max(1, M // S), each round has M / rounds micro-batches. Rank r warms up with
    (v−1)·round + 2(S−1−r) forwards (capped at M·v), then alternates F and B, then drains Bs.
    The k-th forward uses chunk (k // round) % v; the k-th backward after warm-up uses
    chunk v−1−(k // round) % v; micro-batches of each chunk go in order.
    """
    check_sizes("interleaved", num_stages, num_microbatches)
    check_chunks("interleaved", chunks)
    per_round = _per_round("interleaved", "ScheduleInterleaved1F1B", num_stages, num_microbatches)
    orders = [
        _interleaved_rank(rank, num_stages, num_microbatches, chunks, per_round)
        for rank in range(num_stages)
    ]
    return _looped("interleaved", num_stages, num_microbatches, chunks, orders)


def _interleaved_rank(rank: int, ranks: int, num_microbatches: int, chunks: int, per_round: int):
    total = num_microbatches * chunks  # forwards (and backwards) on this rank
    warmup = interleaved_warmup(ranks, rank, num_microbatches, chunks, per_round)
    next_fwd = [0] * chunks
    next_bwd = [0] * chunks
    order: list[Action] = []

    def forward(k: int) -> None:
        chunk = (k // per_round) % chunks
        order.append(Action(stage=chunk * ranks + rank, kind=F, microbatch=next_fwd[chunk]))
        next_fwd[chunk] += 1

    def backward(k: int) -> None:
        chunk = chunks - 1 - ((k - warmup) // per_round) % chunks
        order.append(Action(stage=chunk * ranks + rank, kind=B, microbatch=next_bwd[chunk]))
        next_bwd[chunk] += 1

    for k in range(warmup):
        forward(k)
    for k in range(warmup, total):
        forward(k)
        backward(k)
    for k in range(total, total + warmup):
        backward(k)
    return order


def interleaved_zb(num_stages: int, num_microbatches: int, *, chunks: int = 2) -> Schedule:
    """Interleaved zero bubble (ZB1P) over ``chunks`` chunks per rank, torch 2.13's order.

    Qi et al. ("Zero Bubble Pipeline Parallelism", ICLR 2024) split each backward into
    I (input gradient, on the critical path) and W (weight gradient, movable) and let the
    W's fill the bubbles; torch's ``ScheduleInterleavedZeroBubble`` does so on the
    interleaved loop. Rounds of micro-batches and chunk order are those of ``interleaved``;
    rank r warms up with (v−1)·R + (S−1−r) forwards (capped at M·v), then each step runs
    one F and one I, and after its first r I's each I is followed by the oldest pending W
    (so rank r holds r W's back); the drain runs the remaining I's on the same rule, then
    the held-back W's. Same micro-batch rule as ``interleaved``.
    """
    check_sizes("interleaved-zb", num_stages, num_microbatches)
    check_chunks("interleaved-zb", chunks)
    per_round = _per_round("interleaved-zb", "ScheduleInterleavedZeroBubble", num_stages, num_microbatches)
    orders = [
        _interleaved_zb_rank(rank, num_stages, num_microbatches, chunks, per_round)
        for rank in range(num_stages)
    ]
    return _looped("interleaved-zb", num_stages, num_microbatches, chunks, orders)


def _interleaved_zb_rank(rank: int, ranks: int, num_microbatches: int, chunks: int, per_round: int):
    total = num_microbatches * chunks
    warmup = interleaved_zb_warmup(ranks, rank, num_microbatches, chunks, per_round)
    next_mb = {kind: [0] * chunks for kind in (F, I, W)}
    order: list[Action] = []
    backward_steps: list[int] = []  # the step k of each I, oldest first; W's follow them

    def forward_chunk(k: int) -> int:
        return (k // per_round) % chunks

    def backward_chunk(k: int) -> int:
        return chunks - 1 - ((k - warmup) // per_round) % chunks

    def add(kind: ActionKind, chunk: int) -> None:
        order.append(Action(stage=chunk * ranks + rank, kind=kind, microbatch=next_mb[kind][chunk]))
        next_mb[kind][chunk] += 1

    weights = 0  # W's issued so far; the next one is for backward_steps[weights]
    for k in range(total + warmup):
        if k < total:
            add(F, forward_chunk(k))
        if k < warmup:
            continue
        add(I, backward_chunk(k))
        backward_steps.append(k)
        if k - warmup >= rank:  # torch's num_1f1b_microbatches = rank
            add(W, backward_chunk(backward_steps[weights]))
            weights += 1
    for k in backward_steps[weights:]:
        add(W, backward_chunk(k))
    return order


def looped_bfs(num_stages: int, num_microbatches: int, *, chunks: int = 2) -> Schedule:
    """Breadth-first looping over ``chunks`` chunks per rank, torch 2.13's ``ScheduleLoopedBFS``.

    Lamy-Poirier ("Breadth-First Pipeline Parallelism", MLSys 2023) runs every micro-batch
    through a rank's first chunk before its second, which suits data-parallel sharding (each
    chunk's weights are gathered once). Rank r runs the forwards of its chunks in order, each
    over micro-batches 0..M−1, then the backwards from its last chunk to its first, each
    over micro-batches M−1..0 (torch's order). Any M ≥ 1.
    """
    check_sizes("looped-bfs", num_stages, num_microbatches)
    check_chunks("looped-bfs", chunks)
    orders = []
    for rank in range(num_stages):
        stages = range(rank, num_stages * chunks, num_stages)
        order = [Action(stage=s, kind=F, microbatch=m) for s in stages for m in range(num_microbatches)]
        order += [
            Action(stage=s, kind=B, microbatch=m)
            for s in reversed(stages)
            for m in reversed(range(num_microbatches))
        ]
        orders.append(order)
    return _looped("looped-bfs", num_stages, num_microbatches, chunks, orders)
