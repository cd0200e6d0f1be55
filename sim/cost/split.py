"""How a micro-batch splits over a stage's replicas, and what crosses between two stages.

A micro-batch of ``m`` samples is split over a stage's ``r`` replicas as evenly as whole
samples allow (the first ``m mod r`` replicas take one more), like ``torch.tensor_split``;
between two stages each sender ships each receiver the overlap of their sample ranges
(split-concat; DAPPLE, Fan et al. PPoPP'21, §4). The engine's flows, the planner's tables and
the runtime's messages all come from here.
"""

from __future__ import annotations

from itertools import accumulate

__all__ = ["sample_overlaps", "sample_ranges", "split_samples"]


def split_samples(num_samples: int, num_replicas: int) -> tuple[int, ...]:
    """Samples each replica gets when ``num_samples`` are split over ``num_replicas``."""
    base, extra = divmod(num_samples, num_replicas)
    return tuple(base + (1 if index < extra else 0) for index in range(num_replicas))


def sample_ranges(microbatch_size: int, devices: tuple[int, ...]) -> dict[int, tuple[int, int]]:
    """Device -> the half-open range of a micro-batch's samples it processes, in the order
    ``devices`` lists them (:func:`split_samples`)."""
    sizes = split_samples(microbatch_size, len(devices))
    ends = list(accumulate(sizes))
    return {d: (end - size, end) for d, size, end in zip(devices, sizes, ends)}


def sample_overlaps(microbatch_size: int, senders: tuple[int, ...],
                    receivers: tuple[int, ...]) -> list[tuple[int, int, int, int]]:
    """Split-concat between two stages: ``(sender, receiver, start, end)`` for every non-empty
    overlap of a sender's and a receiver's samples, by sender then receiver."""
    # both lists of ranges are sorted and tile [0, microbatch_size): a merge, O(senders + receivers)
    send = list(sample_ranges(microbatch_size, senders).items())
    recv = list(sample_ranges(microbatch_size, receivers).items())
    overlaps, j = [], 0
    for src, (a0, a1) in send:
        while j < len(recv) and recv[j][1][1] <= a0:
            j += 1
        k = j
        while k < len(recv) and recv[k][1][0] < a1:
            dst, (b0, b1) = recv[k]
            lo, hi = max(a0, b0), min(a1, b1)
            if hi > lo:
                overlaps.append((src, dst, lo, hi))
            k += 1
    return overlaps
