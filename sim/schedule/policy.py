"""Warm-up policies: how many forwards a rank runs before its first backward.

A 1F1B pipeline fills like a queue at a ticket window: stage i lets K_i micro-batches in
(forwards) before it starts sending answers back (backwards), then takes one in for each
one it finishes. K_i is the whole difference between 1F1B schedules: it sets how long the
pipeline takes to fill and how many micro-batches' activations stage i holds at once.

- DAPPLE (Fan et al., "DAPPLE", PPoPP 2021, §5): K_i = min(S−i, M), policy ``"s-i"``; or,
  when cross-stage communication is heavy enough that a rank would otherwise idle waiting
  for it, K_i = min(2(S−i)−1, M), policy ``"2(s-i)-1"``. ZB-H1 warms up like ``"s-i"``.
- ``"auto"`` picks one of the two per stage from the plan's costs. A generator cannot see
  costs, so ``auto`` reaches it already decided: a per-stage tuple such as
  ``("2(s-i)-1", "2(s-i)-1", "s-i")`` made by :func:`choose_dapple_policies`.
- Interleaved 1F1B (Narayanan et al., SC 2021, §2.2), in torch's ``ScheduleInterleaved1F1B``
  order: with v chunks per rank and micro-batches in rounds of R, rank r warms up with
  (v−1)·R + 2(S−1−r) forwards, capped at the M·v forwards it runs in all; torch's
  ``ScheduleInterleavedZeroBubble`` (Qi et al., ICLR 2024) with (v−1)·R + (S−1−r).

These are the one home of those counts: the generators (``sim.schedule.generators``), the
closed forms (``sim.cost.closed_forms``) and the planner's memory estimate (``planner.search.ranking``) call them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum

from sim.core.errors import ScheduleError

__all__ = [
    "HEAVY_TRANSFER_RATIO",
    "DapplePolicy",
    "StagePolicies",
    "choose_dapple_policies",
    "dapple_warmup",
    "interleaved_peak_inflight",
    "interleaved_warmup",
    "interleaved_zb_warmup",
]


class DapplePolicy(StrEnum):
    """The warm-up policy of ``dapple``/``1f1b``; its value is the text YAML and JSON use."""

    S_MINUS_I = "s-i"
    """K_i = min(S−i, M): the fewest forwards that keep every stage busy (DAPPLE §5)."""
    COMM_HEAVY = "2(s-i)-1"
    """K_i = min(2(S−i)−1, M): extra forwards in flight hide cross-stage transfers (DAPPLE §5)."""
    AUTO = "auto"
    """One of the two per stage, from the cut's transfer time against the stage's compute
    (:func:`choose_dapple_policies`); what reaches the generator is that per-stage tuple."""


StagePolicies = str | Sequence[str]
"""A policy for every stage (``"s-i"``), or one per stage (``("2(s-i)-1", "s-i")``)."""


def _policy(policy: str) -> DapplePolicy:
    try:
        return DapplePolicy(policy)
    except ValueError:
        valid = ", ".join(p.value for p in DapplePolicy)
        raise ScheduleError(f"dapple: unknown policy {policy!r}; valid: {valid}") from None


def _stage_policy(policy: StagePolicies, num_stages: int, stage: int) -> DapplePolicy:
    if isinstance(policy, str):
        chosen = _policy(policy)
        if chosen is DapplePolicy.AUTO:
            raise ScheduleError(
                "dapple: policy 'auto' is decided per stage from the plan's costs; pass one policy per "
                "stage (sim.schedule.policy.choose_dapple_policies), e.g. policy=('2(s-i)-1', 's-i')"
            )
        return chosen
    if len(policy) != num_stages:
        raise ScheduleError(
            f"dapple: {len(policy)} per-stage policies for {num_stages} stages; give one per stage"
        )
    chosen = _policy(policy[stage])
    if chosen is DapplePolicy.AUTO:
        raise ScheduleError(f"dapple: stage {stage}'s policy is 'auto'; a per-stage policy is s-i or 2(s-i)-1")
    return chosen


def dapple_warmup(num_stages: int, num_microbatches: int, stage: int, policy: StagePolicies) -> int:
    """K_i, the forwards stage i runs before its first backward (DAPPLE §5).

    ``policy`` is one policy for all stages or a per-stage sequence (``auto``, decided).
    Also the most micro-batches stage i holds activations for under ``dapple``.
    """
    if _stage_policy(policy, num_stages, stage) is DapplePolicy.S_MINUS_I:
        return min(num_stages - stage, num_microbatches)
    return min(2 * (num_stages - stage) - 1, num_microbatches)


HEAVY_TRANSFER_RATIO = 0.0
"""Default of :func:`choose_dapple_policies`' ``heavy_ratio``: any cut whose transfers take
time counts as heavy, because under ``s-i`` every second of them shows up as idle time (see
there) while ``2(s-i)-1`` costs only memory."""


def choose_dapple_policies(
    *,
    compute_s: Sequence[float],
    transfer_s: Sequence[float],
    num_microbatches: int,
    max_warmup: Sequence[int] | None = None,
    heavy_ratio: float = HEAVY_TRANSFER_RATIO,
) -> tuple[DapplePolicy, ...]:
    """``policy: auto`` for a plan's S stages: per stage, ``s-i`` or ``2(s-i)-1``.

    ``compute_s[i]`` is stage i's forward plus backward for one micro-batch (seconds, S
    entries); ``transfer_s[i]`` is cut i's round trip for one micro-batch — its activation from
    stage i to i+1 plus the gradient back (seconds, S−1 entries); ``max_warmup[i]``, if given,
    is the most micro-batches stage i has memory for.

    DAPPLE (Fan et al., PPoPP 2021, §5) gives communication-heavy cuts 2(S−i)−1 warm-up
    micro-batches. Why: with K_i = S−i, each of stage i's micro-batches in flight must make
    the round trip through every later stage and every later cut before its backward, so in
    the steady phase stage i's period is at least t + Σ_{j≥i} x_j / (S−i) for compute t per
    stage and cut round trips x_j — it idles for the transfers, which GPipe, issuing every
    forward first, hides behind compute. 2(S−i)−1 puts S−i−1 more micro-batches in flight,
    (S−i−1)·t of slack, which covers those transfers whenever x_j ≤ t. So a cut is heavy when
    ``transfer_s[i] > heavy_ratio · compute_s[i]`` (default 0: whenever its transfers take
    time), and stage i takes 2(S−i)−1 when its cut is heavy and its memory allows.

    The choice is made for the whole pipeline, as DAPPLE's planner makes it: every stage takes
    2(S−i)−1 when some cut is heavy and every stage has the memory for it, otherwise every
    stage takes ``s-i``. Mixing the two does not pay: a stage that warms up with more
    forwards than the next (which 1F1B needs to run at all: a stage warming up with fewer
    forwards than the next deadlocks) only queues work for a neighbour that drains at its own
    rate, and on a 16-stage pipeline with one heavy stage among light ones the mixed order
    was slower than either uniform one (``benchmarks/engine_bench.py``'s 1,024-GPU plan,
    contention-free: 7.58 s against 4.94 s for s-i and 3.82 s for 2(s-i)-1, which needs more
    memory than its V100s have). The last stage's two policies agree (K = 1).
    """
    num_stages = len(compute_s)
    _check_choice_inputs(compute_s, transfer_s, num_microbatches, max_warmup, heavy_ratio)
    m = num_microbatches
    heavy = [min(2 * (num_stages - i) - 1, m) for i in range(num_stages)]
    room = list(max_warmup) if max_warmup is not None else [m] * num_stages
    light = [min(num_stages - i, m) for i in range(num_stages)]
    fits = all(heavy[i] <= room[i] for i in range(num_stages))
    wants = any(transfer_s[i] > heavy_ratio * compute_s[i] for i in range(num_stages - 1))
    differs = heavy != light  # with few micro-batches both policies cap at M alike
    policy = DapplePolicy.COMM_HEAVY if fits and wants and differs else DapplePolicy.S_MINUS_I
    return tuple(policy if i < num_stages - 1 else DapplePolicy.S_MINUS_I for i in range(num_stages))


def _check_choice_inputs(compute_s, transfer_s, num_microbatches, max_warmup, heavy_ratio) -> None:
    num_stages = len(compute_s)
    if num_stages < 1:
        raise ScheduleError("choose_dapple_policies: compute_s needs one entry per stage (>= 1)")
    if len(transfer_s) != num_stages - 1:
        raise ScheduleError(
            f"choose_dapple_policies: transfer_s has {len(transfer_s)} entries, expected one per cut "
            f"({num_stages - 1} for {num_stages} stages)"
        )
    for name, values in (("compute_s", compute_s), ("transfer_s", transfer_s), ("heavy_ratio", [heavy_ratio])):
        bad = [v for v in values if not (math.isfinite(v) and v >= 0)]
        if bad:
            raise ScheduleError(f"choose_dapple_policies: {name} holds {bad[0]!r}; use finite seconds >= 0")
    if isinstance(num_microbatches, bool) or not isinstance(num_microbatches, int) or num_microbatches < 1:
        raise ScheduleError(f"choose_dapple_policies: num_microbatches={num_microbatches!r} must be an integer >= 1")
    if max_warmup is not None and len(max_warmup) != num_stages:
        raise ScheduleError(
            f"choose_dapple_policies: max_warmup has {len(max_warmup)} entries, expected one per stage ({num_stages})"
        )


def interleaved_warmup(num_ranks: int, rank: int, num_microbatches: int, chunks: int, per_round: int) -> int:
    """Forwards rank ``rank`` runs before its first backward in interleaved 1F1B:
    min((v−1)·R + 2(S−1−r), M·v), with R = ``per_round`` micro-batches per round."""
    return min((chunks - 1) * per_round + 2 * (num_ranks - 1 - rank), num_microbatches * chunks)


def interleaved_zb_warmup(num_ranks: int, rank: int, num_microbatches: int, chunks: int, per_round: int) -> int:
    """Forwards rank ``rank`` runs before its first I in torch's interleaved zero bubble:
    min((v−1)·R + (S−1−r), M·v) — one forward per hop, not two, because the W's that follow
    fill what 1F1B leaves idle (torch's ``ScheduleInterleavedZeroBubble``, ``multiply_factor=1``)."""
    return min((chunks - 1) * per_round + (num_ranks - 1 - rank), num_microbatches * chunks)


def interleaved_peak_inflight(num_ranks: int, rank: int, num_microbatches: int, chunks: int, per_round: int) -> int:
    """Most chunk micro-batches rank ``rank`` holds activations for in interleaved 1F1B:
    its warm-up plus the forward of the first steady step, min((v−1)·R + 2(S−1−r) + 1, M·v).
    With one chunk this is min(2(S−r)−1, M)."""
    warmup = interleaved_warmup(num_ranks, rank, num_microbatches, chunks, per_round)
    return min(warmup + 1, num_microbatches * chunks)
