"""Baseline planners behind the same interface as DAPPLE's: Megatron's grid, PipeDream, even split, data parallel.

Each returns a ``PlannerResult`` whose best plan the SimPy engine settled, so they are
compared with DAPPLE's on equal terms (synchronous training, same cost model):

* ``pipedream`` — PipeDream's planner (``planner.planners.pipedream``);
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

import time
from dataclasses import replace

from planner.search.costs import CostTables
from planner.search.layouts import layouts, levels
from planner.search.ranking import PlannerResult, TablesCache, analytic_score, settle
from planner.search.space import Candidate, PlannerOptions, microbatch_sizes
from sim.input.plan_section import balanced_cuts
from sim.input.scenario import Scenario
from sim.schedule.policy import DapplePolicy

__all__ = ["grid_candidates", "megatron_planner", "even_planner", "dp_planner"]

GRID_LEVELS = 2
"""Cheapest fitting (recompute, sharding) levels kept per grid point."""


def megatron_planner(scenario: Scenario, options: PlannerOptions, progress=None, context=None) -> PlannerResult:
    started = time.perf_counter()
    tables = context.tables if context is not None else None
    return settle("megatron", scenario, grid_candidates(scenario, options, tables), options, started=started,
                  progress=progress, context=context)


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


def dp_planner(scenario: Scenario, options: PlannerOptions, progress=None, context=None) -> PlannerResult:
    started = time.perf_counter()
    n, layers = scenario.cluster.num_devices, scenario.model.num_layers
    tables, order = CostTables(scenario), levels(scenario, options)
    candidates = []
    for microbatch_size in microbatch_sizes(scenario.training.global_batch_size, options):
        base = Candidate(bounds=(0, layers), replicas=(n,), microbatch_size=microbatch_size, schedule="dapple",
                         params=(("policy", DapplePolicy.S_MINUS_I.value),))
        candidates += cheapest_levels(tables, scenario, base, order)
    return settle("dp", scenario, candidates, options, started=started, progress=progress, context=context)


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


def even_planner(scenario: Scenario, options: PlannerOptions, progress=None, context=None) -> PlannerResult:
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
    return settle("even", scenario, candidates, options, started=started, progress=progress, context=context)
