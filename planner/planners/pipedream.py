"""PipeDream's planner (Narayanan et al., SOSP'19, §3.1), a baseline behind DAPPLE's interface.

Dynamic programming that minimises the slowest stage's time, where a stage replicated ``m``
times handles ``1/m`` of the work and pays its weight synchronisation ``4(m−1)|w| / (m·B)``:
``A(j, m) = min_{i, m'} max(A(i, m−m'), 2·C_i, T(i+1→j, m'))``. That objective suits
asynchronous training; DAPPLE's paper evaluates its plans under synchronous training, as we
do (with DAPPLE's schedule, devices in order). The SimPy engine settles its best plan, so it
is compared with the other planners on equal terms.
"""

from __future__ import annotations

import math
import time

from planner.search.costs import CostTables
from planner.search.ranking import PlannerResult, settle
from planner.search.space import Candidate, PlannerOptions, microbatch_sizes
from sim.cost.links import contiguous_span, span_link
from sim.input.scenario import Scenario

__all__ = ["pipedream_planner"]


def pipedream_planner(scenario: Scenario, options: PlannerOptions, progress=None, context=None) -> PlannerResult:
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
    return settle("pipedream", scenario, candidates, options, started=started, progress=progress, context=context)


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
