"""Exhaustive search for small cases: the engine's optimum over the whole space.

Every partition of the layers into contiguous stages, every way to give the stages replicas
(at most the cluster's devices), every placement policy, micro-batch size, schedule,
recompute mode and sharding mode is a candidate (data × pipeline parallelism: the space
DAPPLE's planner is checked against, without tensor or context parallelism). Replaying each with the SimPy engine would take hours,
so the search is branch and bound on a lower bound that no replay can beat: whatever the
network does, stage s's devices compute ``M·(F_s + B_s)`` after the first micro-batch's
forwards through the stages before it, and the last micro-batch's gradient then goes back
through their backwards before stage 0's optimizer step:

    LB = max_s [ Σ_{s'<s} F_s' + M·(F_s + B_s) + max(T_s, Σ_{s'<s} B_s' + T_0) ],

where ``T_s`` is stage s's all-reduce with every flow at full port bandwidth (no flow can
beat its path) plus its optimizer step.

Candidates are replayed in order of their bound until the bound reaches the best replayed
time, so the result is the engine's optimum over the space (the first one found on ties).
It is meant for ≤ 8 devices and ≤ 12 layers (DAPPLE's planner is checked against it).
"""

from __future__ import annotations

import itertools
import time

from planner.search.costs import CostTables
from planner.search.evaluation import check_plannable, evaluate
from planner.search.ranking import PlannerResult
from planner.search.space import Candidate, PlannerOptions, microbatch_sizes
from sim.core.errors import DappleError
from sim.core.parallelism import Sharding
from sim.cost.comm import gradient_sync
from sim.input.scenario import Scenario

__all__ = ["MAX_DEVICES", "MAX_LAYERS", "exhaustive_planner", "lower_bound_s"]

MAX_DEVICES = 8
MAX_LAYERS = 12


def lower_bound_s(tables: CostTables, candidate: Candidate, num_microbatches: int, cluster=None) -> float:
    """A time no replay of ``candidate`` can beat: compute, all-reduce and optimizer steps.

    A stage's all-reduce counts each of its ring phases at full port bandwidth (no flow can
    go faster than its path), so contention can only add to it.
    """
    fwd, bwd, tail = [], [], []
    groups = candidate.devices(cluster) if cluster is not None else None
    for s, (a, b, r) in enumerate(zip(candidate.bounds, candidate.bounds[1:], candidate.replicas)):
        f, bk = tables.compute_s(a, b, CostTables.slice_of(candidate.microbatch_size, r), candidate.recompute)
        fwd.append(f)
        bwd.append(bk)
        reduce_s = _allreduce_floor_s(tables, a, b, groups[s], candidate.sharding) if groups is not None else 0.0
        tail.append(reduce_s + tables.optimizer_s(a, b, r, candidate.sharding))
    best = 0.0
    for s in range(len(fwd)):
        head = sum(fwd[:s]) + num_microbatches * (fwd[s] + bwd[s])
        best = max(best, head + max(tail[s], sum(bwd[:s]) + tail[0]))
    return best


def _allreduce_floor_s(tables: CostTables, start: int, end: int, devices, sharding: Sharding) -> float:
    """The gradient synchronisation of ``sim.cost.comm.gradient_sync`` as the engine lays it out
    (the widest server sets the ring inside, the smallest each GPU's shard across) with every
    flow at its link's full collective bandwidth: each cross-server flow a NIC of its own."""
    cluster, params = tables.cluster, tables.param_bytes(start, end)
    grad = params * tables.model.grad_bytes_per_param_byte
    if len(devices) < 2:
        return 0.0
    per_node: dict[int, int] = {}
    for d in devices:
        per_node[cluster.node_of(d)] = per_node.get(cluster.node_of(d), 0) + 1
    counts = [per_node[n] for n in sorted(per_node)]
    return sum(phase.seconds for phase in gradient_sync(counts, grad, sharding, cluster, flows_per_nic=1,
                                                           param_bytes=params))


def _surely_over(tables: CostTables, candidate: Candidate, capacity: float) -> bool:
    """Whether a stage's states and one micro-batch's activations already pass ``capacity``
    (every schedule keeps at least one alive), so no replay can fit the candidate."""
    for a, b, r in zip(candidate.bounds, candidate.bounds[1:], candidate.replicas):
        samples = CostTables.slice_of(candidate.microbatch_size, r)
        if tables.static_bytes(a, b, r, candidate.sharding) \
                + tables.stash_bytes(a, b, samples, recompute=candidate.recompute) > capacity:
            return True
    return False


def _compositions(total: int, parts: int):
    """Tuples of ``parts`` positive integers summing to ``total``."""
    for cuts in itertools.combinations(range(1, total), parts - 1):
        edges = (0, *cuts, total)
        yield tuple(b - a for a, b in zip(edges, edges[1:]))


def exhaustive_planner(scenario: Scenario, options: PlannerOptions, progress=None, context=None) -> PlannerResult:
    started = time.perf_counter()
    check_plannable(scenario)
    n, layers = scenario.cluster.num_devices, scenario.model.num_layers
    if n > MAX_DEVICES or layers > MAX_LAYERS:
        raise DappleError(
            f"exhaustive search is for at most {MAX_DEVICES} devices and {MAX_LAYERS} layers "
            f"(this scenario has {n} and {layers}); use --planner dapple"
        )
    tables = CostTables(scenario)
    bounded = _bounded(scenario, options, tables)
    bounded.sort(key=lambda item: (item[0], item[1].num_stages, repr(item[1])))
    result = PlannerResult(planner="exhaustive", best=None)
    result.spend.candidates = len(bounded)
    if len(bounded) >= options.max_partials:
        result.spend.reach("partial plans", options.max_partials)
    for bound, candidate in bounded:
        if result.best is not None and bound >= result.best.iteration_time_s:
            break
        if result.spend.engine_replays >= options.max_engine_replays:
            result.spend.reach("engine replays", options.max_engine_replays)
            break
        evaluation = context.evaluate(candidate, "simpy") if context is not None else \
            evaluate(scenario, candidate, engine="simpy")
        result.evaluations.append(evaluation)
        result.spend.count(evaluation)
        if progress is not None:
            progress()
        if evaluation.ok and (result.best is None or evaluation.iteration_time_s < result.best.iteration_time_s):
            result.best = evaluation
    if result.best is None:
        result.note = "no candidate fits in memory"
    elif result.spend.reached:
        result.note = "stopped at a budget: the best found, not proven optimal"
    result.search_time_s = time.perf_counter() - started
    return result


def _bounded(scenario: Scenario, options: PlannerOptions, tables: CostTables) -> list[tuple[float, Candidate]]:
    """(lower bound, candidate) of every point of the space that could fit, at most
    ``options.max_partials`` of them."""
    n = scenario.cluster.num_devices
    gbs = scenario.training.global_batch_size
    capacity = scenario.cluster.device.usable_memory_bytes
    bounded = []
    points = scenario.model.cut_points  # the mtp layer and the head are one unit (sim.models.mtp)
    for stages in range(1, min(n, len(points) - 1, options.max_stages or n) + 1):
        for sizes in _compositions(len(points) - 1, stages):
            bounds = tuple(points[k] for k in itertools.accumulate(sizes, initial=0))
            for used in range(stages, n + 1):
                for replicas in _compositions(used, stages):
                    for microbatch_size in microbatch_sizes(gbs, options):
                        for (name, params), placement, recompute, sharding in itertools.product(
                            options.schedules, options.placements, options.recompute, options.sharding
                        ):
                            if sharding is not Sharding.NONE and max(replicas) == 1:
                                continue  # nothing to shard over
                            candidate = Candidate(bounds=bounds, replicas=replicas, microbatch_size=microbatch_size,
                                                  schedule=name, params=params, recompute=recompute,
                                                  placement=placement, sharding=sharding)
                            if _surely_over(tables, candidate, capacity):
                                continue
                            bound = lower_bound_s(tables, candidate, gbs // microbatch_size, scenario.cluster)
                            bounded.append((bound, candidate))
                            if len(bounded) >= options.max_partials:
                                return bounded
    return bounded
