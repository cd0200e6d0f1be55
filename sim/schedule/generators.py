"""Schedule generators: the compute order (F, B, I, W) of each rank for a named schedule.

A pipeline splits a model into stages on S ranks and a mini-batch into M micro-batches.
Where the schedules differ is *when* each rank switches from forwards to backwards, and
how many stages (model chunks) each rank holds:

- one stage per rank (this module):
  - ``gpipe`` runs every forward, then every backward (fill and drain; Huang et al.,
    "GPipe", NeurIPS 2019). Simple, but every micro-batch's activations stay alive at once.
  - ``dapple`` (also ``1f1b``) starts backwards early: stage i runs only K_i forwards, then
    alternates one backward and one forward (Fan et al., "DAPPLE", PPoPP 2021, §5), so at
    most K_i micro-batches are alive on stage i.
  - ``zb-h1`` splits each backward into I (input gradient, on the critical path) and W
    (weight gradient, movable) and delays W's to fill bubbles (Qi et al., "Zero Bubble
    Pipeline Parallelism", ICLR 2024, §2.1).
- v chunks per rank, stage s on rank s mod S (``sim.schedule.looped``): ``interleaved``
  (Narayanan et al., SC 2021, §2.2), ``interleaved-zb`` (Qi et al., ICLR 2024) and
  ``looped-bfs`` (Lamy-Poirier, MLSys 2023);
- two chunks per rank in a V, rank r holding stages r and 2S−1−r (``sim.schedule.vshape``):
  ``zb-v`` (Qi et al., ICLR 2024, §6) and ``dualpipe-v`` (DeepSeek-V3 technical report, 2024).

Every generator is ``fn(num_stages, num_microbatches, **params) -> Schedule`` and is an
entry in :data:`GENERATORS`; ``num_stages`` is the number of ranks (for the multi-chunk
families the schedule has ``chunks`` times as many stages). Generators emit compute steps
only; ``passes.lower`` adds communication. :func:`stage_ranks_for` says where each family
puts its stages, which a plan must match.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Callable

from sim.core.errors import ScheduleError
from sim.schedule.gen_common import check_sizes, single_chunk
from sim.schedule.ir import Action, ActionKind, Schedule
from sim.schedule.looped import interleaved, interleaved_zb, looped_bfs
from sim.schedule.policy import DapplePolicy, StagePolicies, dapple_warmup
from sim.schedule.vshape import V_CHUNKS, dualpipe_v, v_stage_ranks, zb_v

__all__ = [
    "DAPPLE_POLICIES",
    "GENERATORS",
    "LOOPED_SCHEDULES",
    "V_SCHEDULES",
    "DapplePolicy",
    "dapple",
    "dapple_warmup",
    "dualpipe_v",
    "generate",
    "gpipe",
    "interleaved",
    "interleaved_zb",
    "looped_bfs",
    "stage_ranks_for",
    "zb_h1",
    "zb_v",
]

F, B, I, W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W

DAPPLE_POLICIES = tuple(p.value for p in DapplePolicy)
"""Warm-up policies of ``dapple`` as text: K_i = min(S−i, M) or min(2(S−i)−1, M) (DAPPLE §5;
``sim.schedule.policy``), and ``auto``, which picks one of them per stage from costs."""


def gpipe(num_stages: int, num_microbatches: int) -> Schedule:
    """GPipe: all forwards in micro-batch order, then all backwards (torch's ``ScheduleGPipe``)."""
    check_sizes("gpipe", num_stages, num_microbatches)
    microbatches = range(num_microbatches)
    orders = [
        [Action(stage=s, kind=F, microbatch=m) for m in microbatches]
        + [Action(stage=s, kind=B, microbatch=m) for m in microbatches]
        for s in range(num_stages)
    ]
    return single_chunk("gpipe", num_stages, num_microbatches, orders)


def dapple(num_stages: int, num_microbatches: int, *, policy: StagePolicies = DapplePolicy.S_MINUS_I) -> Schedule:
    """DAPPLE early backward (1F1B): K_i forwards, then B/F pairs, then the remaining Bs.

    ``policy="s-i"`` keeps K_i = min(S−i, M); ``"2(s-i)-1"`` warms up with
    K_i = min(2(S−i)−1, M), which DAPPLE (Fan et al., PPoPP'21, §5) uses when cross-stage
    communication is heavy enough that a rank would otherwise idle waiting for it
    (:func:`sim.schedule.policy.dapple_warmup`). A tuple gives each stage its own policy —
    what ``policy: auto`` becomes once :func:`sim.schedule.policy.choose_dapple_policies`
    has seen the plan's costs. K_i may not grow along the pipeline (K_i ≥ K_{i+1}): a stage
    that warms up with fewer forwards than the next deadlocks.
    """
    check_sizes("dapple", num_stages, num_microbatches)
    warmups = [dapple_warmup(num_stages, num_microbatches, s, policy) for s in range(num_stages)]
    for s in range(num_stages - 1):
        if warmups[s] < warmups[s + 1]:
            raise ScheduleError(
                f"dapple: per-stage policies {[str(p) for p in policy]} warm stage {s} up with {warmups[s]} "
                f"forwards but stage {s + 1} with {warmups[s + 1]}, which deadlocks; give stage {s} "
                "2(s-i)-1 (sim.schedule.policy.choose_dapple_policies always chooses a valid set)"
            )
    orders = []
    for s in range(num_stages):
        warmup = warmups[s]
        order = [Action(stage=s, kind=F, microbatch=m) for m in range(warmup)]
        for m in range(num_microbatches - warmup):
            order.append(Action(stage=s, kind=B, microbatch=m))
            order.append(Action(stage=s, kind=F, microbatch=warmup + m))
        order += [
            Action(stage=s, kind=B, microbatch=m)
            for m in range(num_microbatches - warmup, num_microbatches)
        ]
        orders.append(order)
    return single_chunk("dapple", num_stages, num_microbatches, orders)


def zb_h1(num_stages: int, num_microbatches: int) -> Schedule:
    """ZB-H1: 1F1B with each backward split into I then a delayed W (Qi et al., ICLR'24, §2.1).

    Stage i warms up with K_i = min(S−i, M) forwards like 1F1B. Each later step runs the
    oldest I, then W's (oldest first) while more than i of them are pending, then the next F;
    the leftover W's run at the end. Stage 0 runs each W right after its I; the last stage
    holds back up to S−1 W's, which shortens the chain of I's the earlier stages wait on.
    """
    check_sizes("zb-h1", num_stages, num_microbatches)
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
    return single_chunk("zb-h1", num_stages, num_microbatches, orders)


GENERATORS: dict[str, Callable[..., Schedule]] = {
    "gpipe": gpipe,
    "dapple": dapple,
    "1f1b": dapple,
    "interleaved": interleaved,
    "zb-h1": zb_h1,
    "interleaved-zb": interleaved_zb,
    "looped-bfs": looped_bfs,
    "zb-v": zb_v,
    "dualpipe-v": dualpipe_v,
}
"""Schedule name → generator ``fn(num_stages, num_microbatches, **params)``."""

LOOPED_SCHEDULES = frozenset({"interleaved", "interleaved-zb", "looped-bfs"})
"""Generators with v chunks per rank, stage s on rank s mod S (v from ``chunks``)."""

V_SCHEDULES = frozenset({"zb-v", "dualpipe-v"})
"""Generators with two chunks per rank in a V: stage s on rank s, then 2S−1−s."""


def stage_ranks_for(name: str, num_ranks: int, num_stages: int) -> tuple[int, ...] | None:
    """Where schedule ``name`` puts each of ``num_stages`` stages on ``num_ranks`` ranks, or
    ``None`` when it cannot place that many (one per rank, a multiple for looped, 2S for V)."""
    if name in V_SCHEDULES:
        return v_stage_ranks(num_ranks) if num_stages == V_CHUNKS * num_ranks else None
    if name in LOOPED_SCHEDULES:
        return tuple(s % num_ranks for s in range(num_stages)) if num_stages % num_ranks == 0 else None
    return tuple(range(num_stages)) if num_stages == num_ranks else None


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
