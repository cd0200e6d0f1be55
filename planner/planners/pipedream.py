"""PipeDream's planner (Narayanan et al., SOSP'19, §3.1), a baseline behind DAPPLE's interface.

Dynamic programming that minimises the slowest stage's time, where a stage replicated ``m``
times handles ``1/m`` of the work and pays its weight synchronisation ``4(m−1)|w| / (m·B)``:
``A(j, m) = min_{i, m'} max(A(i, m−m'), 2·C_i, T(i+1→j, m'))``. That objective suits
asynchronous training; DAPPLE's paper evaluates its plans under synchronous training, as we
do (with DAPPLE's schedule, devices in order). The SimPy engine settles its best plan, so it
is compared with the other planners on equal terms.

What makes it answer at any scale (the objective is the paper's, unchanged):

* **Tables.** ``T(i→j, m')`` for every pair of cuts and worker count is tabulated once per
  micro-batch size (the stage's compute from ``CostTables``' prefix sums, the sync term from
  its parameter bytes), and for each ``j`` the minimum over every earlier cut ``i`` and every
  last-stage count ``m'`` is one array operation over ``(i, m, m')``.
* **Cuts.** Models longer than ``MAX_SEGMENTS`` layers are cut only where DAPPLE's DP cuts
  them (``planner.planners.dapple_dp.segment_cuts``: up to 24 groups of similar compute).
* **Worker counts in whole units.** Up to ``MAX_WORKER_COUNTS`` devices every count is
  searched. Above, workers are counted in granules of a whole server (doubled while the
  cluster still has more than ``MAX_WORKER_COUNTS`` of them): PipeDream's optimizer does the
  same for a hierarchical topology (§3.1: at level k a worker is one whole component of level
  k−1, a server of GPUs, then a rack of servers; msr-fiddle/pipedream
  ``optimizer/optimizer_graph_hierarchical.py`` solves each level with the previous level's
  machines as its workers). A stage then never splits a server, and the DP has at most
  ``MAX_WORKER_COUNTS`` counts.
* **Budget.** The DP's cells ``A(j, m)``, one per earlier cut it is extended from, are counted
  in ``spend.partials``; micro-batch sizes are tried most promising first (the DP's lower
  bound, the whole model's per-sample compute over all devices), and once the next size's DP
  would pass ``options.max_partials`` the search stops with the best plan of the sizes done
  (the first size always runs: a planner always answers).
* **Memory.** PipeDream's objective ignores memory; its plan is offered to ``settle`` under
  every micro-batch size and recompute mode, but only those whose estimated peak
  (``planner.search.ranking.analytic_score``) is not well over the device's memory, or, when
  none is, the few smallest (``planner.planners.baselines.likely_to_fit``), so that "no plan
  fits" costs a handful of counts; it settles with a baseline's replays
  (``planner.planners.baselines.baseline_settling``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from planner.planners.baselines import feeds_every_replica, settle_offered
from planner.planners.dapple_dp import MAX_SEGMENTS, segment_cuts
from planner.search.costs import CostTables
from planner.search.layouts import levels
from planner.search.ranking import PlannerResult
from planner.search.space import Candidate, PlannerOptions, microbatch_sizes
from sim.cost.links import contiguous_span, span_link
from sim.input.scenario import Scenario

__all__ = ["MAX_WORKER_COUNTS", "PipeDreamSearch", "pipedream_dp", "pipedream_planner", "pipedream_search",
           "worker_granule"]

MAX_WORKER_COUNTS = 128
"""Most worker counts the DP searches: every count up to this many devices; above, counts of
whole servers (or of groups of 2^k servers) so that there are at most this many."""


def worker_granule(num_devices: int, devices_per_node: int) -> int:
    """Devices per DP worker: 1 up to ``MAX_WORKER_COUNTS`` devices, else a whole server,
    doubled (2, 4, ... servers) while there are more than ``MAX_WORKER_COUNTS`` workers."""
    if num_devices <= MAX_WORKER_COUNTS:
        return 1
    granule = devices_per_node
    while num_devices // granule > MAX_WORKER_COUNTS and num_devices % (2 * granule) == 0:
        granule *= 2
    return granule


@dataclass(frozen=True, slots=True, kw_only=True)
class PipeDreamSearch:
    """What PipeDream's DP found over the micro-batch sizes it had the budget for."""

    bounds: tuple[int, ...]
    """Layer boundaries of the best partition, ``(0, ..., num_layers)``."""
    replicas: tuple[int, ...]
    """Devices per stage (their sum may be under the cluster's: PipeDream may leave some idle)."""
    microbatch_size: int
    """The micro-batch size whose DP gave the best value per sample."""
    partials: int
    """Cells ``A(j, m)`` the DPs filled, one per earlier cut each is extended from."""
    sizes_done: int
    """Micro-batch sizes whose DP ran (the others were past ``max_partials``)."""
    sizes_total: int
    """Micro-batch sizes there were."""


def pipedream_search(tables: CostTables, scenario: Scenario, options: PlannerOptions) -> PipeDreamSearch | None:
    """PipeDream's DP for each micro-batch size, most promising first, within ``options.max_partials``;
    None when no micro-batch size is left to try (``--microbatch-size`` sizes that divide no
    global batch)."""
    cluster = scenario.cluster
    n, layers = cluster.num_devices, tables.num_layers
    cuts = list(tables.model.cut_points) if layers <= MAX_SEGMENTS else segment_cuts(tables)
    granule = worker_granule(n, cluster.devices_per_node)
    sizes = microbatch_sizes(scenario.training.global_batch_size, options)
    whole = [sum(tables.compute_s(0, layers, size)) / size for size in sizes]
    order = sorted(range(len(sizes)), key=lambda k: (whole[k], -sizes[k]))  # the DP's lower bound, per sample
    cost = (n // granule) * (len(cuts) - 1) * len(cuts) // 2  # cells, one per (earlier cut, cut, workers)
    partials, best, done = 0, None, 0
    for k in order:
        if done and partials + cost > options.max_partials:
            break
        value, bounds, replicas = pipedream_dp(tables, scenario, sizes[k], cuts=cuts, granule=granule)
        partials, done = partials + cost, done + 1
        key = (value / sizes[k], k)  # ties go to the smaller size, as the sizes' own order would
        if best is None or key < best[0]:
            best = (key, bounds, replicas, sizes[k])
    if best is None:
        return None
    _, bounds, replicas, size = best
    return PipeDreamSearch(bounds=bounds, replicas=replicas, microbatch_size=size, partials=partials,
                           sizes_done=done, sizes_total=len(sizes))


def pipedream_planner(scenario: Scenario, options: PlannerOptions, progress=None, context=None) -> PlannerResult:
    started = time.perf_counter()
    tables = CostTables(scenario)
    search = pipedream_search(tables, scenario, options)
    candidates = [] if search is None else [
        Candidate(bounds=search.bounds, replicas=search.replicas, microbatch_size=size, schedule="dapple",
                  recompute=recompute)
        for size in microbatch_sizes(scenario.training.global_batch_size, options)
        for recompute in dict.fromkeys(r for r, _ in levels(scenario, options))
    ]
    candidates = [c for c in candidates if feeds_every_replica(c)]
    result = settle_offered("pipedream", scenario, tables, candidates, options, started=started, progress=progress,
                            context=context)
    if search is None:
        result.search_time_s = time.perf_counter() - started
        return result
    result.spend.partials += search.partials
    if search.sizes_done < search.sizes_total:
        result.spend.reach("partial plans", options.max_partials)
        stop = (f"stopped at the budget of {options.max_partials:,} partial plans after {search.sizes_done} of "
                f"{search.sizes_total} micro-batch sizes")
        result.note = f"{result.note}; {stop}" if result.note else stop
    result.search_time_s = time.perf_counter() - started
    return result


def pipedream_dp(tables: CostTables, scenario: Scenario, microbatch_size: int, *, cuts: list[int],
                 granule: int = 1) -> tuple[float, tuple[int, ...], tuple[int, ...]]:
    """PipeDream's ``A(j, m)`` over the layer prefixes ending at ``cuts`` and worker counts
    ``granule, 2·granule, ..., num_devices``: (the slowest stage's seconds, stage bounds,
    devices per stage). The plan may leave devices idle, as PipeDream's may (§3.1: fewer
    workers when more do not help); among equal values the most devices win."""
    cluster = scenario.cluster
    workers = cluster.num_devices // granule
    K, W = len(cuts) - 1, workers
    stage = _stage_table(tables, cluster, cuts, granule, workers, microbatch_size)
    link = span_link(cluster, contiguous_span(cluster, 2))  # neighbouring stages' devices
    # 2·C_i: the activations in and the gradients back across cut i, each 2·|a|·mb / B
    comm = [2 * (2 * scenario.model.boundary_bytes[c] * microbatch_size / link.bandwidth_bytes_per_s) for c in cuts]
    inf = np.inf
    A = np.full((K + 1, W + 1), inf)  # A[j, w]: the first cuts[j] layers on w workers
    parent = np.full((K + 1, W + 1), -1, dtype=np.int64)  # flat (i, w') of the best extension, -1: one stage
    m = np.arange(W + 1)
    head = m[:, None] - m[None, :]  # head[w, w']: workers left for the earlier stages
    valid = (head >= 1) & (m[None, :] >= 1)
    head = np.where(valid, head, 0)  # A[i, 0] is inf: no plan on no workers
    for j in range(1, K + 1):
        A[j] = stage[0, j]
        if j == 1:
            continue
        earlier = A[1:j]  # (i, w): every earlier cut's best, i = 1 .. j-1
        values = np.maximum(earlier[:, head], stage[1:j, j][:, None, :])  # (i, w, w')
        values = np.maximum(values, np.asarray(comm[1:j])[:, None, None])
        flat = values.transpose(1, 0, 2).reshape(W + 1, -1)  # (w, (i, w')): the reference's loop order
        pick = flat.argmin(axis=1)
        low = flat[m, pick]
        better = low < A[j]  # strictly: a tie keeps the single stage, then the earliest (i, w')
        A[j] = np.where(better, low, A[j])
        parent[j] = np.where(better, pick, -1)
    values = A[K, 1:]
    w = int(np.flatnonzero(values == values.min())[-1]) + 1  # the most workers among the best
    value = float(A[K, w])
    bounds, replicas, j = [cuts[K]], [], K
    while True:
        flat = int(parent[j, w])
        if flat < 0:
            replicas.append(w * granule)
            bounds.append(0)
            break
        i, last = divmod(flat, W + 1)
        i += 1
        replicas.append(last * granule)
        j, w = i, w - last
        bounds.append(cuts[j])
    return value, tuple(reversed(bounds)), tuple(reversed(replicas))


def _stage_table(tables: CostTables, cluster, cuts: list[int], granule: int, workers: int,
                 microbatch_size: int) -> np.ndarray:
    """``T[i, j, w]``: stage ``[cuts[i], cuts[j])`` on ``w`` workers of ``granule`` devices,
    ``max(compute, sync) / m`` for its ``m = w·granule`` devices, where ``sync = 4(m−1)|w| / (m·B)``
    over the link ``m`` consecutive devices cross (PipeDream §3.1); inf where ``w = 0`` or ``i ≥ j``."""
    K = len(cuts) - 1
    devices = np.arange(workers + 1, dtype=np.float64) * granule
    bandwidth = np.array([span_link(cluster, contiguous_span(cluster, int(d))).bandwidth_bytes_per_s
                          for d in devices])
    coefficient = 4 * (devices - 1)
    denominator = devices * bandwidth
    table = np.full((K + 1, K + 1, workers + 1), np.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        for i in range(K):
            ends = cuts[i + 1:]
            compute = np.array([sum(tables.compute_s(cuts[i], end, microbatch_size)) for end in ends])
            params = np.array([tables.param_bytes(cuts[i], end) for end in ends])
            sync = np.where(devices > 1, coefficient * params[:, None] / denominator, 0.0)  # (j, w)
            table[i, i + 1:] = np.maximum(compute[:, None], sync) / devices
    table[:, :, 0] = np.inf
    return table
