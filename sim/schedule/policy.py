"""Warm-up policies: how many forwards a rank runs before its first backward.

A 1F1B pipeline fills like a queue at a ticket window: stage i lets K_i micro-batches in
(forwards) before it starts sending answers back (backwards), then takes one in for each
one it finishes. K_i is the whole difference between 1F1B schedules: it sets how long the
pipeline takes to fill and how many micro-batches' activations stage i holds at once.

- DAPPLE (Fan et al., "DAPPLE", PPoPP 2021, §5): K_i = min(S−i, M), policy ``"s-i"``; or,
  when cross-stage communication is heavy enough that a rank would otherwise idle waiting
  for it, K_i = min(2(S−i)−1, M), policy ``"2(s-i)-1"``. ZB-H1 warms up like ``"s-i"``.
- Interleaved 1F1B (Narayanan et al., SC 2021, §2.2), in torch's ``ScheduleInterleaved1F1B``
  order: with v chunks per rank and micro-batches in rounds of R, rank r warms up with
  (v−1)·R + 2(S−1−r) forwards, capped at the M·v forwards it runs in all.

These are the one home of those counts: the generators (``sim.schedule.generators``), the
closed forms (``sim.analytic``) and the planner's memory estimate (``planner.search``) call them.
"""

from __future__ import annotations

from enum import StrEnum

from sim.errors import ScheduleError

__all__ = ["DapplePolicy", "dapple_warmup", "interleaved_peak_inflight", "interleaved_warmup"]


class DapplePolicy(StrEnum):
    """The warm-up policy of ``dapple``/``1f1b``; its value is the text YAML and JSON use."""

    S_MINUS_I = "s-i"
    """K_i = min(S−i, M): the fewest forwards that keep every stage busy (DAPPLE §5)."""
    COMM_HEAVY = "2(s-i)-1"
    """K_i = min(2(S−i)−1, M): extra forwards in flight hide cross-stage transfers (DAPPLE §5)."""


def _policy(policy: str) -> DapplePolicy:
    try:
        return DapplePolicy(policy)
    except ValueError:
        valid = ", ".join(p.value for p in DapplePolicy)
        raise ScheduleError(f"dapple: unknown policy {policy!r}; valid: {valid}") from None


def dapple_warmup(num_stages: int, num_microbatches: int, stage: int, policy: str) -> int:
    """K_i, the forwards stage i runs before its first backward (DAPPLE §5).

    Also the most micro-batches stage i holds activations for under ``dapple``.
    """
    if _policy(policy) is DapplePolicy.S_MINUS_I:
        return min(num_stages - stage, num_microbatches)
    return min(2 * (num_stages - stage) - 1, num_microbatches)


def interleaved_warmup(num_ranks: int, rank: int, num_microbatches: int, chunks: int, per_round: int) -> int:
    """Forwards rank ``rank`` runs before its first backward in interleaved 1F1B:
    min((v−1)·R + 2(S−1−r), M·v), with R = ``per_round`` micro-batches per round."""
    return min((chunks - 1) * per_round + 2 * (num_ranks - 1 - rank), num_microbatches * chunks)


def interleaved_peak_inflight(num_ranks: int, rank: int, num_microbatches: int, chunks: int, per_round: int) -> int:
    """Most chunk micro-batches rank ``rank`` holds activations for in interleaved 1F1B:
    its warm-up plus the forward of the first steady step, min((v−1)·R + 2(S−1−r) + 1, M·v).
    With one chunk this is min(2(S−r)−1, M)."""
    warmup = interleaved_warmup(num_ranks, rank, num_microbatches, chunks, per_round)
    return min(warmup + 1, num_microbatches * chunks)
