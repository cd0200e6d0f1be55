"""Schedule generators: the compute order (F, B, I, W) of each rank for a named schedule.

A pipeline splits a model into S stages on S ranks and a mini-batch into M micro-batches.
Where the schedules differ is *when* each rank switches from forwards to backwards:

- ``gpipe`` runs every forward, then every backward (fill and drain; Huang et al.,
  "GPipe", NeurIPS 2019). Simple, but every micro-batch's activations stay alive at once.
- ``dapple`` (also ``1f1b``) starts backwards early: stage i runs only K_i forwards, then
  alternates one backward and one forward (Fan et al., "DAPPLE", PPoPP 2021, §5), so at
  most K_i micro-batches are alive on stage i.
- ``interleaved`` gives each rank v model chunks (virtual stages) so the pipeline fills
  v times faster (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
  Clusters Using Megatron-LM", SC 2021, §2.2).
- ``zb-h1`` splits each backward into I (input gradient, on the critical path) and W
  (weight gradient, movable) and delays W's to fill bubbles (Qi et al., "Zero Bubble
  Pipeline Parallelism", ICLR 2024, §2.1).

Every generator is ``fn(num_stages, num_microbatches, **params) -> Schedule`` and is an
entry in :data:`GENERATORS`. Generators emit compute actions only; ``passes.lower`` adds
communication. For non-interleaved schedules ``num_stages`` is also the number of ranks.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Callable

from sim.errors import ScheduleError
from sim.schedule.ir import Action, ActionKind, Schedule
from sim.schedule.policy import DapplePolicy, dapple_warmup, interleaved_warmup

__all__ = [
    "DAPPLE_POLICIES",
    "GENERATORS",
    "DapplePolicy",
    "dapple",
    "dapple_warmup",
    "generate",
    "gpipe",
    "interleaved",
    "zb_h1",
]

F, B, I, W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W

DAPPLE_POLICIES = tuple(p.value for p in DapplePolicy)
"""Warm-up policies of ``dapple`` as text: K_i = min(S−i, M) or min(2(S−i)−1, M) (DAPPLE §5;
``sim.schedule.policy``)."""


def _check_sizes(name: str, num_stages: int, num_microbatches: int) -> None:
    for key, value in (("num_stages", num_stages), ("num_microbatches", num_microbatches)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ScheduleError(f"{name}: {key}={value!r} must be an integer >= 1")


def _single(name: str, num_stages: int, num_microbatches: int, orders: list[list[Action]]):
    return Schedule(
        name=name,
        num_stages=num_stages,
        num_microbatches=num_microbatches,
        stage_ranks=tuple(range(num_stages)),
        ranks=tuple(tuple(order) for order in orders),
    )


def gpipe(num_stages: int, num_microbatches: int) -> Schedule:
    """GPipe: all forwards in micro-batch order, then all backwards (torch's ``ScheduleGPipe``)."""
    _check_sizes("gpipe", num_stages, num_microbatches)
    microbatches = range(num_microbatches)
    orders = [
        [Action(stage=s, kind=F, microbatch=m) for m in microbatches]
        + [Action(stage=s, kind=B, microbatch=m) for m in microbatches]
        for s in range(num_stages)
    ]
    return _single("gpipe", num_stages, num_microbatches, orders)


def dapple(num_stages: int, num_microbatches: int, *, policy: str = DapplePolicy.S_MINUS_I) -> Schedule:
    """DAPPLE early backward (1F1B): K_i forwards, then B/F pairs, then the remaining Bs.

    ``policy="s-i"`` keeps K_i = min(S−i, M); ``"2(s-i)-1"`` warms up with
    K_i = min(2(S−i)−1, M), which DAPPLE (Fan et al., PPoPP'21, §5) uses when cross-stage
    communication is heavy enough that a rank would otherwise idle waiting for it
    (:func:`sim.schedule.policy.dapple_warmup`).
    """
    _check_sizes("dapple", num_stages, num_microbatches)
    orders = []
    for s in range(num_stages):
        warmup = dapple_warmup(num_stages, num_microbatches, s, policy)
        order = [Action(stage=s, kind=F, microbatch=m) for m in range(warmup)]
        for m in range(num_microbatches - warmup):
            order.append(Action(stage=s, kind=B, microbatch=m))
            order.append(Action(stage=s, kind=F, microbatch=warmup + m))
        order += [
            Action(stage=s, kind=B, microbatch=m)
            for m in range(num_microbatches - warmup, num_microbatches)
        ]
        orders.append(order)
    return _single("dapple", num_stages, num_microbatches, orders)


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
    _check_sizes("interleaved", num_stages, num_microbatches)
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise ScheduleError(f"interleaved: chunks={chunks!r} must be an integer >= 1")
    rounds = max(1, num_microbatches // num_stages)
    if num_microbatches % rounds:
        raise ScheduleError(
            f"interleaved: num_microbatches={num_microbatches} is not a multiple of the "
            f"number of rounds max(1, M // S) = {rounds}; use M < 2·S or a multiple of "
            f"S={num_stages}"
        )
    per_round = num_microbatches // rounds
    orders = [
        _interleaved_rank(rank, num_stages, num_microbatches, chunks, per_round)
        for rank in range(num_stages)
    ]
    return Schedule(
        name="interleaved",
        num_stages=num_stages * chunks,
        num_microbatches=num_microbatches,
        stage_ranks=tuple(s % num_stages for s in range(num_stages * chunks)),
        ranks=tuple(tuple(order) for order in orders),
    )


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


def zb_h1(num_stages: int, num_microbatches: int) -> Schedule:
    """ZB-H1: 1F1B with each backward split into I then a delayed W (Qi et al., ICLR'24, §2.1).

    Stage i warms up with K_i = min(S−i, M) forwards like 1F1B. Each later step runs the
    oldest I, then W's (oldest first) while more than i of them are pending, then the next F;
    the leftover W's run at the end. Stage 0 runs each W right after its I; the last stage
    holds back up to S−1 W's, which shortens the chain of I's the earlier stages wait on.
    """
    _check_sizes("zb-h1", num_stages, num_microbatches)
    orders = []
    for s in range(num_stages):
        warmup = dapple_warmup(num_stages, num_microbatches, s, DapplePolicy.S_MINUS_I)
        order = [Action(stage=s, kind=F, microbatch=m) for m in range(warmup)]
        pending: deque[int] = deque()
        for m in range(num_microbatches):
            order.append(Action(stage=s, kind=I, microbatch=m))
            pending.append(m)
            while len(pending) > s:
                order.append(Action(stage=s, kind=W, microbatch=pending.popleft()))
            if warmup + m < num_microbatches:
                order.append(Action(stage=s, kind=F, microbatch=warmup + m))
        order += [Action(stage=s, kind=W, microbatch=m) for m in pending]
        orders.append(order)
    return _single("zb-h1", num_stages, num_microbatches, orders)


GENERATORS: dict[str, Callable[..., Schedule]] = {
    "gpipe": gpipe,
    "dapple": dapple,
    "1f1b": dapple,
    "interleaved": interleaved,
    "zb-h1": zb_h1,
}
"""Schedule name → generator ``fn(num_stages, num_microbatches, **params)``."""


def generate(name: str, num_stages: int, num_microbatches: int, **params: object) -> Schedule:
    """Build the named schedule; unknown names and parameters are errors listing valid ones."""
    fn = GENERATORS.get(name)
    if fn is None:
        raise ScheduleError(f"unknown schedule {name!r}; valid: {', '.join(sorted(GENERATORS))}")
    accepted = [
        p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY
    ]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        valid = ", ".join(accepted) if accepted else "none"
        raise ScheduleError(
            f"schedule {name!r} has no parameter {unknown[0]!r}; valid parameters: {valid}"
        )
    return fn(num_stages, num_microbatches, **params)
