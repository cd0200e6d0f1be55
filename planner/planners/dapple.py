"""DAPPLE's planner (Fan et al., PPoPP'21, §4) over the 4D space, never worse than its own space.

The dynamic programme over layer prefixes and device counts, with DAPPLE's latency model and
memory, is ``planner.planners.dapple_dp``: it proposes partitions (stage boundaries and
per-stage replica counts) that this module expands into candidates and settles.

The 4D space runs the DP once per *layout* (tensor × context degree, ``planner.search.layouts``) on
*units* of t·c devices, and per recompute mode (each changes the stages' times and what they
keep); sharding is chosen per partition afterwards (the cheapest modes whose memory fits).

Where the DP proposes, the planner then makes sure of its answer: it returns a plan at least
as fast, by the SimPy engine, as every baseline's (``rivals``: pure data parallelism,
Megatron's grid, GPipe on even stages, PipeDream's plan, all in DAPPLE's space) and as every
other schedule its best plan could run on the same devices (``planner.search.variants``), by
taking the fastest of them all.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import replace

from planner.planners.baselines import dp_planner, even_planner, grid_candidates, megatron_planner
from planner.planners.dapple_dp import SLACK, partitions, replica_choices, segment_cuts
from planner.planners.pipedream import pipedream_planner
from planner.search.budget import Spend
from planner.search.context import SearchContext
from planner.search.costs import CostTables
from planner.search.evaluation import Evaluation, check_plannable
from planner.search.layouts import layouts, levels, replica_step
from planner.search.ranking import PlannerResult, analytic_score, settle
from planner.search.space import Candidate, PlannerOptions, microbatch_sizes, placements_for, unit_count, unit_grid
from planner.search.subsets import restricted, subset_sizes
from planner.search.variants import schedule_variants, split_chunks
from sim.core.parallelism import Sharding
from sim.input.scenario import Scenario

__all__ = ["KEEP_PER_BATCH", "POOL", "UNEVEN_BATCHES", "dapple_planner"]

KEEP_PER_BATCH = 16
"""Complete plans kept per micro-batch size for re-scoring."""
UNEVEN_BATCHES = 2
"""Micro-batch sizes (the best by their uniform grids) searched with uneven replica counts."""
POOL = 64
"""Partitions (over all micro-batch sizes) expanded into candidates for the settling rounds."""


def _interleaved(found, global_batch_size: int, options: PlannerOptions,
                 points: tuple[int, ...] | None = None) -> list[Candidate]:
    """Megatron's interleaved variant of uniform partitions: each stage's layers split in v
    chunks at ``points`` (``ModelSpec.cut_points``; None: every layer boundary), chunk k of the
    model on device set k mod S (valid when the micro-batch count divides into rounds of S, as
    torch's ScheduleInterleaved1F1B requires)."""
    variants = []
    for base in found:
        bounds, replicas, S = base.bounds, base.replicas, base.num_stages
        M = global_batch_size // base.microbatch_size
        if S < 2 or len(set(replicas)) != 1 or M % S:
            continue
        for v in options.chunks:
            pieces = split_chunks(bounds, v, points if points is not None else tuple(range(bounds[-1] + 1)))
            if pieces is None:
                continue
            # the model cut into S·v consecutive chunks; chunk k runs on device set k mod S (Megatron's layout)
            for placement in options.placements:
                variants.append(Candidate(bounds=tuple(pieces), replicas=replicas * v,
                                          microbatch_size=base.microbatch_size, schedule="interleaved",
                                          recompute=base.recompute, placement=placement, chunks=v,
                                          tensor_parallel=base.tensor_parallel,
                                          context_parallel=base.context_parallel, sharding=base.sharding,
                                          expert_parallel=base.expert_parallel))
    return variants


def _shardings(tables: CostTables, scenario: Scenario, base: Candidate, options: PlannerOptions) -> list[Sharding]:
    """The sharding modes to try on a partition: the fastest two whose estimated memory fits
    (or, if none does by the estimate, the one that needs the least)."""
    capacity = scenario.cluster.device.usable_memory_bytes
    scored = []
    for sharding in sorted(dict.fromkeys(options.sharding), key=list(Sharding).index):
        if sharding is not Sharding.NONE and max(base.replicas) * base.context_parallel == 1:
            continue  # nothing to shard over
        latency, peak = analytic_score(tables, scenario, replace(base, sharding=sharding))
        scored.append((peak > capacity, latency if peak <= capacity else peak, sharding))
    scored.sort(key=lambda x: (x[0], x[1], list(Sharding).index(x[2])))
    fitting = [s for over, _, s in scored if not over]
    return fitting[:2] if fitting else [scored[0][2]]


log = logging.getLogger(__name__)

RIVALS = (("dp", dp_planner), ("megatron", megatron_planner), ("even", even_planner),
          ("pipedream", pipedream_planner))
"""The baselines whose plans lie in DAPPLE's space, so its planner never returns a slower one."""
VARIANT_MARGIN = 0.02
"""A schedule variant goes to the SimPy engine when its fast-path time is within this fraction
of the leader's engine time: the fast path has no contention, so one slower by more cannot win."""


def dapple_planner(scenario: Scenario, options: PlannerOptions, progress=None, context=None) -> PlannerResult:
    """DAPPLE's planner over the 4D space: per layout and recompute mode, DP over partitions
    and replica counts; sharding per partition; the shared settling rounds; then the fastest of
    its plan, the baselines' plans and its plan's other schedules (the module docstring)."""
    started = time.perf_counter()
    context = context if context is not None else SearchContext(scenario)
    check_plannable(scenario)
    log.info("dapple: stage 1, the baselines it must beat: %s", ", ".join(name for name, _ in RIVALS))
    rivals = {name: context.run(name, planner, options, progress) for name, planner in RIVALS}  # on its bar
    spend = Spend()  # the dynamic programme's
    candidates = _candidates(scenario, options, context, spend)
    log.info("dapple: stage 2, dynamic programme: %s partial plans -> %s candidates", f"{spend.partials:,}",
             f"{len(candidates):,}")
    log.info("dapple: stage 3, settling: closed forms, fast path, SimPy engine")
    own = settle("dapple", scenario, candidates, options, started=started,
                 progress=progress, reserved=grid_candidates(scenario, options, context.tables), context=context)
    own.spend.add(spend)
    on_subsets = _on_subsets(scenario, options, context, own, progress)
    return _never_worse(own, rivals, context, options, started, progress, on_subsets)


def _on_subsets(scenario: Scenario, options: PlannerOptions, context: SearchContext, own: PlannerResult,
                progress) -> list[Evaluation]:
    """DAPPLE's search again on each of ``planner.search.subsets.subset_sizes`` (a cluster whose
    size factors badly), its settled plans replayed on the whole cluster with the rest idle;
    the work is added to ``own``'s spend."""
    if scenario.faults:
        return []  # faults name devices of the whole cluster: planned on all of them only
    found = []
    for devices in subset_sizes(scenario.cluster):
        log.info("dapple: stage 4, %s devices factor badly: planning on %s of them too",
                 f"{scenario.cluster.num_devices:,}", f"{devices:,}")
        sub = restricted(scenario, devices)
        sub_context, spend = SearchContext(sub, workers=context.workers), Spend()
        result = settle("dapple", sub, _candidates(sub, options, sub_context, spend), options,
                        started=time.perf_counter(), progress=progress,
                        reserved=grid_candidates(sub, options, sub_context.tables), context=sub_context)
        sub_context.close()
        own.spend.add(spend)
        own.spend.add(result.spend)
        moved = [replace(e.candidate, on_devices=devices) for e in result.evaluations if e.engine == "simpy" and e.ok]
        for whole in context.stream(moved, "simpy"):
            own.spend.count(whole)
            own.evaluations.append(whole)
            if whole.ok:
                found.append(whole)
    return found


def _candidates(scenario: Scenario, options: PlannerOptions, context: SearchContext, spend: Spend
                ) -> list[Candidate]:
    """The DP's best partitions, expanded into candidates (sharding, schedule, placement)."""
    found = _partitions(scenario, options, context, spend)
    found.sort(key=lambda item: (item[0], item[1].num_stages, repr(item[1])))
    gbs = scenario.training.global_batch_size
    candidates = []
    for _, base in found[:POOL]:
        tables = context.tables(base)
        for sharding in _shardings(tables, scenario, base, options):
            sharded = replace(base, sharding=sharding)
            candidates += [replace(sharded, schedule=name, params=params, placement=placement)
                           for name, params in options.schedules
                           for placement in placements_for(scenario.cluster, options)]
            if options.interleaved:
                candidates += _interleaved([sharded], gbs, options, scenario.model.cut_points)
    return candidates


def _partitions(scenario: Scenario, options: PlannerOptions, context: SearchContext, spend: Spend
                ) -> list[tuple[float, Candidate]]:
    """(score, partition) from the DP, per layout and recompute mode: DP x PP grids first for
    every micro-batch size (cheap, and they bound the rest), then uneven replica counts for the
    micro-batch sizes whose grids look best; within the partial-plan budget (``spend``). A
    recompute mode runs again only the micro-batch sizes whose DP memory limited under the
    cheaper one: where memory limited nothing, more recompute only costs time."""
    cluster, gbs = scenario.cluster, scenario.training.global_batch_size
    frugal = max(options.sharding, key=list(Sharding).index)
    recomputes = list(dict.fromkeys(r for r, _ in levels(scenario, options)))
    found = []
    for t, c, e in layouts(scenario, options):
        tables = context.tables.layout(t, c, e)
        _, per_node = unit_grid(cluster, t * c)
        num_units = unit_count(cluster, t * c)  # a unit that does not divide the server leaves GPUs idle
        cuts = segment_cuts(tables)
        max_stages = min(options.max_stages or len(cuts) - 1, len(cuts) - 1, num_units)
        choices = sorted(replica_choices(num_units, replica_step((t, c, e))), key=len)
        uniform, general = [x for x in choices if len(x) == 1], [x for x in choices if len(x) > 1]
        sizes = microbatch_sizes(gbs, options)
        for recompute in recomputes:
            bounds_of: dict[int, float] = {}
            # per micro-batch size, whether memory limited this mode's DP (else more recompute only costs time)
            pressed: dict[int, list] = {}
            costs: dict[int, dict] = {}  # per micro-batch size: the stages' costs, shared by its runs

            def run(microbatch_size: int, replica_set: tuple[int, ...]) -> None:
                stages = min(max_stages, 2 * (gbs // microbatch_size))
                plans = partitions(tables, cuts, num_units, microbatch_size, gbs // microbatch_size, replica_set,
                                   stages, KEEP_PER_BATCH, bound=bounds_of[microbatch_size], per_node=per_node,
                                   recompute=recompute, memory_sharding=frugal,
                                   pressure=pressed.setdefault(microbatch_size, []),
                                   stage_costs=costs.setdefault(microbatch_size, {}), spend=spend,
                                   max_partials=options.max_partials)
                for score, b, r in plans:
                    found.append((score, Candidate(bounds=b, replicas=r, microbatch_size=microbatch_size,
                                                   recompute=recompute, tensor_parallel=t, context_parallel=c,
                                                   expert_parallel=e)))
                if plans and len(replica_set) == 1:
                    bounds_of[microbatch_size] = min(bounds_of[microbatch_size], plans[0][0] * (1 + 3 * SLACK))

            for microbatch_size in sizes:
                bounds_of[microbatch_size] = math.inf
                for replica_set in uniform:
                    r = replica_set[0]
                    # a grid uses every unit in at most max_stages stages, and gives every replica a sample
                    if num_units // r <= max_stages and microbatch_size >= r:
                        run(microbatch_size, replica_set)
            for microbatch_size in sorted(bounds_of, key=lambda m: (bounds_of[m], m))[:UNEVEN_BATCHES]:
                for replica_set in general:
                    run(microbatch_size, replica_set)
            sizes = tuple(m for m in sizes if pressed.get(m))
            if not sizes:
                break  # memory limited nothing: recomputing more would only cost time
    return found


def _never_worse(own: PlannerResult, rivals: dict[str, PlannerResult], context: SearchContext,
                 options: PlannerOptions, started: float, progress, on_subsets: list[Evaluation]) -> PlannerResult:
    """``own`` with its best replaced by the fastest of its settled plans, the rivals' best
    plans, the plans on subsets of the devices and the other schedules of the leader's device
    sets (``planner.search.variants``), all by the SimPy engine; its spend then includes the
    rivals' and the variants'."""
    pool = [e for e in own.evaluations if e.engine == "simpy" and e.ok and e.candidate.on_devices is None]
    pool += [r.best for r in rivals.values() if r.best is not None] + on_subsets
    for rival in rivals.values():
        own.spend.add(rival.spend)
    if pool:
        leader = min(pool, key=_rank)
        close, before = [], len(own.evaluations)
        variants = schedule_variants(leader.candidate, options.chunks if options.interleaved else (),
                                     context.scenario.model.cut_points)
        for fast in context.stream(variants, "fast"):
            own.spend.count(fast)
            own.evaluations.append(fast)
            if fast.ok and fast.iteration_time_s <= leader.iteration_time_s * (1 + VARIANT_MARGIN):
                close.append(fast.candidate)
            if progress is not None:
                progress()
        log.info("dapple: stage 5, the leader's other schedules: %d on the fast path, %d close enough for the engine",
                 len(own.evaluations) - before, len(close))
        for settled in context.stream(close, "simpy"):
            own.spend.count(settled)
            own.evaluations.append(settled)
            if settled.ok:
                pool.append(settled)
            if progress is not None:
                progress()
        own.best = min(pool, key=_rank)
        own.note = _subset_note(own.best, [e for e in pool if e.candidate.on_devices is None],
                                context.scenario.cluster.num_devices)
    own.search_time_s = time.perf_counter() - started
    return own


def _rank(evaluation: Evaluation) -> tuple:
    """Fastest first; on a tie the fewer stages, then the candidate's text (a fixed order)."""
    return evaluation.iteration_time_s, evaluation.candidate.num_stages, repr(evaluation.candidate)


def _subset_note(best: Evaluation, on_all: list[Evaluation], num_devices: int) -> str:
    """What a plan on a subset of the devices is compared with: the best on all of them."""
    used = best.candidate.on_devices
    if used is None:
        return ""
    whole = min(on_all, key=_rank, default=None)
    against = (f"the best plan on all {num_devices:,} takes {whole.iteration_time_s:.4g} s" if whole is not None
               else f"no plan fits on all {num_devices:,}")
    return f"planned on {used:,} of {num_devices:,} devices ({num_devices - used:,} idle); {against}"
