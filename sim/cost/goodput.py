"""Goodput: the share of a long run that failures and checkpoints leave to training.

A synchronous job of N devices stops whenever any one fails. With independent devices of mean
time between failures M_gpu, failures form a Poisson process of rate λ = N / M_gpu: the
cluster's mean time between failures is M = M_gpu / N. The job checkpoints every τ seconds of
training; a checkpoint stops training for δ seconds. A failure loses the work since the last
checkpoint, on average τ/2, plus the restart time R. To first order (failures rare, τ ≪ M):

    lost fraction ≈ δ/τ + (τ/2 + R)/M

and the τ that minimises it is Young's (Young 1974, "A first order approximation to the
optimum checkpoint interval", CACM 17(9)):  τ_Young = sqrt(2 δ M).  Daly (2006, "A higher
order estimate of the optimum checkpoint interval for restart dumps", Future Generation Computer Systems 22(3); its
higher-order estimate)
minimises the exact expected time instead and finds, for δ < 2M,

    τ_Daly = sqrt(2 δ M) × [1 + (1/3) sqrt(δ/(2M)) + (1/9) (δ/(2M))] − δ,     τ_Daly = M for δ ≥ 2M

(its leading terms, sqrt(2 δ M) − δ, are the form usually quoted).

Exact expected time (renewal argument, exponential failures). Training advances in segments
of L = τ + δ seconds (work, then its checkpoint); a segment completes only if no failure
strikes within it, probability e^{−L/M}. Each failed try costs the time until the failure,
X ~ Exp(M) conditioned on X < L, plus the loss ℓ (R; with asynchronous checkpoints also the
write still in flight). Failed tries before success are geometric with mean e^{L/M} − 1, and
E[X | X < L] = M − L/(e^{L/M} − 1), so one segment takes on average

    E[T(L)] = L + (e^{L/M} − 1)(E[X | X < L] + ℓ) = (e^{L/M} − 1)(M + ℓ).

A run of W seconds of work is ⌊W/τ⌋ full segments and a last one of the remainder (no
checkpoint after it). This is Daly's complete model (2006: M e^{R/M}(e^{(τ+δ)/M} − 1) per
segment) with restarts that cannot fail: M + R in place of M e^{R/M}, equal to first order in R/M.

The Monte Carlo (``monte_carlo_times_s``) draws exactly that process: per run the failures of
the full segments are negative-binomial (failures before ⌊W/τ⌋ successes of probability
e^{−L/M}), each failure's lost time a truncated exponential, all runs in one vectorised pass
of ``numpy.random.default_rng(seed)``. Its mean converges to ``expected_run_time_s``.
"""

from __future__ import annotations

import math

import numpy as np

from sim.core.errors import DappleError

__all__ = ["MAX_EXPECTED_FAILURES", "MAX_FAILURE_DRAWS", "daly_interval_s", "expected_failures",
           "expected_run_time_s", "first_order_lost_fraction", "monte_carlo_times_s", "segment_time_s",
           "young_interval_s"]

MAX_EXPECTED_FAILURES = 100_000
"""Most failures a run may expect (beyond, the job restarts more than it trains: refused)."""
MAX_FAILURE_DRAWS = 10_000_000
"""Most failures the Monte Carlo draws over all its runs (runs × expected failures), ~160 MB."""
_MAX_EXPONENT = 50.0
"""Largest L/M a segment may have: e^50 tries per segment is no run at all."""


def young_interval_s(blocking_s: float, mtbf_s: float) -> float:
    """Young (1974): τ = sqrt(2 δ M), the minimum of the first-order lost fraction."""
    return math.sqrt(2.0 * blocking_s * mtbf_s)


def daly_interval_s(blocking_s: float, mtbf_s: float) -> float:
    """Daly (2006): sqrt(2δM)[1 + sqrt(δ/2M)/3 + (δ/2M)/9] − δ for δ < 2M, else M."""
    if blocking_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = blocking_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * blocking_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - blocking_s


def first_order_lost_fraction(interval_s: float, blocking_s: float, mtbf_s: float, loss_s: float) -> float:
    """δ/τ + (τ/2 + ℓ)/M: share of the run lost to checkpoints and failures, to first order
    (``loss_s`` = ℓ, the restart plus, asynchronously, the write a failure discards)."""
    return blocking_s / interval_s + (interval_s / 2.0 + loss_s) / mtbf_s


def _tries(length_s: float, mtbf_s: float) -> float:
    """e^{L/M} − 1: failed tries expected before a segment of ``length_s`` completes."""
    if length_s / mtbf_s > _MAX_EXPONENT:
        raise DappleError(f"a checkpoint segment of {length_s:.4g} s is {length_s / mtbf_s:.3g} times the "
                          f"cluster's MTBF of {mtbf_s:.4g} s: the run would never finish; checkpoint more often "
                          "(reliability.checkpoint.interval: auto) or write faster")
    return math.expm1(length_s / mtbf_s)


def segment_time_s(length_s: float, mtbf_s: float, loss_s: float) -> float:
    """(e^{L/M} − 1)(M + ℓ): expected seconds to complete a segment of ``length_s`` seconds."""
    return _tries(length_s, mtbf_s) * (mtbf_s + loss_s) if length_s > 0 else 0.0


def _segments(work_s: float, interval_s: float) -> tuple[int, float]:
    """Full segments of ``interval_s`` in ``work_s`` seconds of work, and the remainder."""
    full = int(work_s // interval_s)
    return full, max(work_s - full * interval_s, 0.0)


def expected_run_time_s(work_s: float, *, interval_s: float, blocking_s: float, mtbf_s: float,
                        loss_s: float) -> float:
    """Expected wall time of ``work_s`` seconds of training: full segments of τ + δ and the remainder."""
    full, rest = _segments(work_s, interval_s)
    return full * segment_time_s(interval_s + blocking_s, mtbf_s, loss_s) + segment_time_s(rest, mtbf_s, loss_s)


def expected_failures(work_s: float, *, interval_s: float, blocking_s: float, mtbf_s: float) -> float:
    """Failures expected over the run: Σ over segments of e^{L/M} − 1."""
    full, rest = _segments(work_s, interval_s)
    return full * _tries(interval_s + blocking_s, mtbf_s) + (_tries(rest, mtbf_s) if rest > 0 else 0.0)


def monte_carlo_times_s(work_s: float, *, interval_s: float, blocking_s: float, mtbf_s: float, loss_s: float,
                        runs: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Wall times (seconds) and failure counts of ``runs`` seeded runs of the failure process
    above; refuses a run that expects more than ``MAX_EXPECTED_FAILURES`` failures or draws
    more than ``MAX_FAILURE_DRAWS`` in all."""
    failures = expected_failures(work_s, interval_s=interval_s, blocking_s=blocking_s, mtbf_s=mtbf_s)
    if failures > MAX_EXPECTED_FAILURES or failures * runs > MAX_FAILURE_DRAWS:
        raise DappleError(f"the run expects {failures:,.0f} failures ({failures * runs:,.0f} over "
                          f"{runs:,} Monte Carlo runs), more than the {MAX_EXPECTED_FAILURES:,} per run and "
                          f"{MAX_FAILURE_DRAWS:,} in all drawn; lower reliability.monte_carlo.runs or the run's length")
    rng = np.random.default_rng(seed)
    full, rest = _segments(work_s, interval_s)
    times = np.full(runs, full * (interval_s + blocking_s) + rest)
    counts = np.zeros(runs, dtype=np.int64)
    for segments, length in ((full, interval_s + blocking_s), (1 if rest > 0 else 0, rest)):
        if segments == 0:
            continue
        # failures before `segments` successes, each success of probability e^{-L/M}
        k = rng.negative_binomial(segments, math.exp(-length / mtbf_s), size=runs)
        # each failure's time into its segment: Exp(M) conditioned below L, by inverse CDF
        u = rng.random(int(k.sum()))
        lost = -mtbf_s * np.log1p(-u * -math.expm1(-length / mtbf_s)) + loss_s
        times += np.bincount(np.repeat(np.arange(runs), k), weights=lost, minlength=runs)
        counts += k
    return times, counts
