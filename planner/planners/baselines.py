"""Baseline planners behind the same interface as DAPPLE's: Megatron's grid, PipeDream, even split, data parallel.

Each returns a ``PlannerResult`` whose best plan the SimPy engine settled, so they are
compared with DAPPLE's on equal terms (synchronous training, same cost model):

* ``pipedream`` — PipeDream's planner (Narayanan et al., SOSP'19, §3.1): dynamic programming
  that minimises the slowest stage's time, where a stage replicated ``m`` times handles
  ``1/m`` of the work and pays its weight synchronisation ``4(m−1)|w| / (m·B)``:
  ``A(j, m) = min_{i, m'} max(A(i, m−m'), 2·C_i, T(i+1→j, m'))``. That objective suits
  asynchronous training; DAPPLE's paper evaluates its plans under synchronous training, as
  we do (with DAPPLE's schedule, devices in order);
* ``even`` — equal numbers of layers per stage on all devices with the GPipe schedule (the
  best stage count and micro-batch size);
* ``megatron`` — the grid search a Megatron-LM user runs (Narayanan et al., SC'21, §3.3's
  heuristics searched exhaustively): uniform tensor × context × pipeline × data degrees over
  the layouts DAPPLE's planner tries (``planner.search.layouts``), layers split evenly by compute
  (no uneven stages, one replica count), devices in Megatron's order (Append First), 1F1B or
  interleaved with every chunk count the stages allow, each micro-batch size that gives every
  replica whole samples, and per grid point the cheapest recompute and sharding modes whose
  estimated memory fits;
* ``dp`` — pure data parallelism: every device holds the whole model; micro-batches are
  gradient accumulation steps, each one forward and one backward in turn (the 1F1B order of
  a one-stage pipeline, as a training loop with accumulation runs them: only one
  micro-batch's activations are alive at a time), with the cheapest ZeRO sharding and
  recompute modes whose memory fits (as DeepSpeed users and FSDP users train).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

from planner.search.costs import CostTables
from planner.search.layouts import layouts, levels
from planner.search.ranking import PlannerResult, TablesCache, analytic_score, settle
from planner.search.space import Candidate, PlannerOptions, microbatch_sizes
from sim.cost.links import contiguous_span, span_link
from sim.input.plan_section import balanced_cuts
from sim.input.scenario import Scenario
from sim.schedule.policy import DapplePolicy

__all__ = ["grid_candidates", "megatron_planner", "pipedream_planner", "even_planner", "dp_planner"]

GRID_LEVELS = 2
"""Cheapest fitting (recompute, sharding) levels kept per grid point."""


def megatron_planner(scenario: Scenario, options: PlannerOptions, progress=None) -> PlannerResult:
    started = time.perf_counter()
    return settle("megatron", scenario, grid_candidates(scenario, options), options, started=started,
                  progress=progress)


def grid_candidates(scenario: Scenario, options: PlannerOptions, tables: TablesCache | None = None
                    ) -> list[Candidate]:
    """The Megatron grid's candidates (the module docstring); DAPPLE's planner ranks them too."""
    cache = tables or TablesCache(scenario)
    n, layers = scenario.cluster.num_devices, scenario.model.num_layers
    gbs = scenario.training.global_batch_size
    order = levels(scenario, options)
    policy = (("policy", DapplePolicy.S_MINUS_I.value),)
    candidates = []
    for t, c in layouts(scenario, options):
        tables = cache.layout(t, c)
        units = n // (t * c)
        weights = [sum(tables.compute_s(k, k + 1, 1)) for k in range(layers)]
        for stages in range(1, min(layers, units, options.max_stages or units) + 1):
            if units % stages:
                continue
            dp = units // stages
            bounds = balanced_cuts(weights, stages)
            for microbatch_size in microbatch_sizes(gbs, options):
                if microbatch_size % dp:
                    continue  # every replica gets whole, equal slices
                M = gbs // microbatch_size
                shapes = [("dapple", policy, 1)]
                if options.interleaved and stages > 1 and M % stages == 0:
                    shapes += [("interleaved", (), v) for v in options.chunks if layers >= stages * v]
                for name, params, v in shapes:
                    cut = bounds if v == 1 else balanced_cuts(weights, stages * v)
                    base = Candidate(bounds=cut, replicas=(dp,) * (stages * v), microbatch_size=microbatch_size,
                                     schedule=name, params=params, chunks=v, tensor_parallel=t,
                                     context_parallel=c)
                    candidates += cheapest_levels(tables, scenario, base, order)
    return candidates


def dp_planner(scenario: Scenario, options: PlannerOptions, progress=None) -> PlannerResult:
    started = time.perf_counter()
    n, layers = scenario.cluster.num_devices, scenario.model.num_layers
    tables, order = CostTables(scenario), levels(scenario, options)
    candidates = []
    for microbatch_size in microbatch_sizes(scenario.training.global_batch_size, options):
        base = Candidate(bounds=(0, layers), replicas=(n,), microbatch_size=microbatch_size, schedule="dapple",
                         params=(("policy", DapplePolicy.S_MINUS_I.value),))
        candidates += cheapest_levels(tables, scenario, base, order)
    return settle("dp", scenario, candidates, options, started=started, progress=progress)


def cheapest_levels(tables: CostTables, scenario: Scenario, base: Candidate, order, keep: int = GRID_LEVELS
                    ) -> list[Candidate]:
    """``base`` under the first ``keep`` (recompute, sharding) levels of ``order`` whose estimated
    peak fits, or under the last (the most frugal) if none does."""
    capacity = scenario.cluster.device.usable_memory_bytes
    fitting = []
    for recompute, sharding in order:
        if sharding.value != "none" and max(base.replicas) * base.context_parallel == 1:
            continue  # nothing to shard over
        candidate = replace(base, recompute=recompute, sharding=sharding)
        if analytic_score(tables, scenario, candidate)[1] <= capacity:
            fitting.append(candidate)
            if len(fitting) >= keep:
                break
    return fitting or [replace(base, recompute=order[-1][0], sharding=order[-1][1])]


def even_planner(scenario: Scenario, options: PlannerOptions, progress=None) -> PlannerResult:
    started = time.perf_counter()
    n, layers = scenario.cluster.num_devices, scenario.model.num_layers
    candidates = []
    for stages in range(2, min(n, layers, options.max_stages or n) + 1):
        if n % stages:
            continue
        bounds = tuple(round(s * layers / stages) for s in range(stages + 1))
        for microbatch_size in microbatch_sizes(scenario.training.global_batch_size, options):
            for recompute in options.recompute:
                candidates.append(
                    Candidate(bounds=bounds, replicas=(n // stages,) * stages, microbatch_size=microbatch_size,
                              schedule="gpipe", recompute=recompute)
                )
    return settle("even", scenario, candidates, options, started=started, progress=progress)


def pipedream_planner(scenario: Scenario, options: PlannerOptions, progress=None) -> PlannerResult:
    started = time.perf_counter()
    tables = CostTables(scenario)
    n = scenario.cluster.num_devices
    best = None
    for microbatch_size in microbatch_sizes(scenario.training.global_batch_size, options):
        value, bounds, replicas = _pipedream_dp(tables, scenario, n, microbatch_size)
        per_sample = value / microbatch_size
        if best is None or per_sample < best[0]:
            best = (per_sample, bounds, replicas)
    _, bounds, replicas = best
    candidates = [
        Candidate(bounds=bounds, replicas=replicas, microbatch_size=microbatch_size, schedule="dapple",
                  recompute=recompute)
        for microbatch_size in microbatch_sizes(scenario.training.global_batch_size, options)
        for recompute in options.recompute
    ]
    return settle("pipedream", scenario, candidates, options, started=started, progress=progress)


def _pipedream_dp(tables: CostTables, scenario: Scenario, num_devices: int, microbatch_size: int):
    """PipeDream's A(j, m) over layer prefixes and worker counts, for micro-batches of ``microbatch_size``."""
    cluster, layers = scenario.cluster, tables.num_layers

    def sync_s(start: int, end: int, m: int) -> float:
        if m <= 1:
            return 0.0
        link = span_link(cluster, contiguous_span(cluster, m))
        return 4 * (m - 1) * tables.param_bytes(start, end) / (m * link.bandwidth_bytes_per_s)

    def stage_s(start: int, end: int, m: int) -> float:
        compute = sum(tables.compute_s(start, end, microbatch_size))
        return max(compute, sync_s(start, end, m)) / m

    def comm_s(boundary: int) -> float:
        link = span_link(cluster, contiguous_span(cluster, 2))  # neighbouring stages' devices
        return 2 * scenario.model.boundary_bytes[boundary] * microbatch_size / link.bandwidth_bytes_per_s

    inf = math.inf
    # A[j][m]: (slowest stage time, parent (i, m'), replicas of the last stage)
    A = [[(inf, None, 0)] * (num_devices + 1) for _ in range(layers + 1)]
    for j in range(1, layers + 1):
        for m in range(1, num_devices + 1):
            best = (stage_s(0, j, m), None, m)
            for i in range(1, j):
                comm = 2 * comm_s(i)
                for m_last in range(1, m):
                    head = A[i][m - m_last][0]
                    if head >= best[0]:
                        continue
                    value = max(head, comm, stage_s(i, j, m_last))
                    if value < best[0]:
                        best = (value, (i, m - m_last), m_last)
            A[j][m] = best
    m = min(range(1, num_devices + 1), key=lambda k: (A[layers][k][0], -k))
    value = A[layers][m][0]
    bounds, replicas, j = [layers], [], layers
    while True:
        _, parent, last = A[j][m]
        replicas.append(last)
        if parent is None:
            bounds.append(0)
            break
        j, m = parent
        bounds.append(j)
    return value, tuple(reversed(bounds)), tuple(reversed(replicas))
