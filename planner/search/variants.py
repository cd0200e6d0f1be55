"""The other schedules a plan's devices could run: what DAPPLE's planner must never lose to.

A plan's stages sit on device sets; the same sets, the same micro-batches, sharding and
recompute can run under any schedule that takes that many stages per set. For a plan of S
stages, one per set:

* the one-chunk schedules: GPipe, DAPPLE's 1F1B under both warm-up policies (§5), ZB-H1
  (Qi et al., ICLR'24);
* when every stage has the same replicas, the model cut into S·v chunks (each stage's layers
  in v), chunk j on set j mod S (Megatron's interleaved layout, Narayanan et al., SC'21 §2.2,
  as ``planner.planners.dapple`` builds it) under interleaved
  1F1B, torch's interleaved zero bubble and looped BFS (Lamy-Poirier, MLSys'23), for every
  chunk count the options try; and cut in 2S chunks placed in a V (chunk s on set s, chunk
  2S−1−s on set s) under ZB-V and DualPipeV (torch 2.13's ``ScheduleZBVZeroBubble``,
  ``ScheduleDualPipeV``).

A plan that already loops over v chunks has the same looped schedules with its own chunks, the
one-chunk schedules on its chunks merged back (stage k runs chunks k·v … k·v + v − 1 on set
k), and the V schedules on the merged stages.
"""

from __future__ import annotations

from dataclasses import replace

from planner.search.space import Candidate
from sim.schedule.policy import DapplePolicy

__all__ = ["LOOPED", "ONE_CHUNK", "V_SHAPED", "schedule_variants", "split_chunks"]

ONE_CHUNK = (("gpipe", ()), ("dapple", ()), ("dapple", (("policy", DapplePolicy.COMM_HEAVY.value),)), ("zb-h1", ()))
"""(schedule, parameters) of the schedules with one stage per device set."""
LOOPED = ("interleaved", "interleaved-zb", "looped-bfs")
"""Schedules with v chunks per device set, chunk k on set k mod S."""
V_SHAPED = ("zb-v", "dualpipe-v")
"""Schedules with two chunks per device set in a V."""


def split_chunks(bounds: tuple[int, ...], v: int, points: tuple[int, ...]) -> tuple[int, ...] | None:
    """Each stage's units cut into v consecutive chunks (None when a stage has fewer than v units), at
    ``points`` (``ModelSpec.cut_points``: every layer boundary but the mtp layer's and the head's)."""
    where = {point: k for k, point in enumerate(points)}
    if any(b not in where for b in bounds):
        return None
    units = tuple(where[b] for b in bounds)
    if any(b - a < v for a, b in zip(units, units[1:])):
        return None
    return tuple(points[a + (b - a) * k // v] for a, b in zip(units, units[1:]) for k in range(v)) + (bounds[-1],)


def schedule_variants(candidate: Candidate, chunk_counts: tuple[int, ...],
                      points: tuple[int, ...] | None = None) -> list[Candidate]:
    """Every other schedule ``candidate``'s device sets could run (the module docstring), in a
    fixed order; ``chunk_counts`` are the chunk counts a one-chunk plan's looped variants try;
    ``points`` the layer boundaries a chunk may start at (``ModelSpec.cut_points``; None: every one)."""
    points = points if points is not None else tuple(range(candidate.bounds[-1] + 1))
    sets = candidate.num_stages // candidate.chunks
    set_replicas = candidate.replicas[:sets]
    if candidate.chunks == 1 or candidate.schedule in V_SHAPED:
        base_bounds = candidate.bounds if candidate.chunks == 1 else None
    else:  # looped: merged back, stage k runs chunks k·v … k·v + v − 1
        base_bounds = candidate.bounds[::candidate.chunks]
    one = replace(candidate, chunks=1, replicas=set_replicas)
    out: list[Candidate] = []
    if base_bounds is not None:
        out += [replace(one, bounds=base_bounds, schedule=name, params=params) for name, params in ONE_CHUNK]
    uniform = len(set(set_replicas)) == 1 and sets > 1
    if uniform and base_bounds is not None:
        counts = chunk_counts if candidate.chunks == 1 else (candidate.chunks,)
        for v in counts:
            pieces = split_chunks(base_bounds, v, points)
            if pieces is not None:
                out += [replace(one, bounds=pieces, replicas=set_replicas * v, chunks=v, schedule=name, params=())
                        for name in LOOPED]
        pieces = split_chunks(base_bounds, 2, points)
        if pieces is not None:
            out += [replace(one, bounds=pieces, replicas=set_replicas * 2, chunks=2, schedule=name, params=())
                    for name in V_SHAPED]
    return [c for c in dict.fromkeys(out) if c != candidate]
