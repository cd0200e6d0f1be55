"""Baseline planners behind the same interface as DAPPLE's: Megatron's grid, PipeDream, even split, data parallel.

Each returns a ``PlannerResult`` whose best plan the SimPy engine settled, so they are
compared with DAPPLE's on equal terms (synchronous training, same cost model):

* ``pipedream`` — PipeDream's planner (``planner.planners.pipedream``);
* ``even`` — equal numbers of layers per stage on all devices with the GPipe schedule (the
  best stage count and micro-batch size);
* ``megatron`` — the grid search a Megatron-LM user runs (Narayanan et al., SC'21, §3.3's
  heuristics searched exhaustively): uniform tensor × context × pipeline × data degrees over
  the layouts DAPPLE's planner tries (``planner.search.layouts``; for a model with experts every
  expert-parallel degree inside a server by default, EP dividing each stage's devices, as
  Megatron-Core's ``--expert-model-parallel-size`` must), layers split evenly by compute
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
from planner.search.layouts import layouts, levels, replica_step
from planner.search.ranking import PlannerResult, TablesCache, analytic_score, settle
from planner.search.space import Candidate, PlannerOptions, microbatch_sizes, unit_count
from sim.input.plan_section import balanced_cuts
from sim.input.scenario import Scenario
from sim.schedule.policy import DapplePolicy

__all__ = ["NO_FIT_PROBES", "OVER_CAPACITY", "grid_candidates", "megatron_planner", "even_candidates", "even_planner",
           "dp_planner", "baseline_settling",
           "feeds_every_replica", "likely_to_fit", "settle_offered"]

GRID_LEVELS = 2
"""Cheapest fitting (recompute, sharding) levels kept per grid point."""

NO_FIT_PROBES = 3
"""Candidates the even, dp and PipeDream planners offer ``settle`` when none is estimated to
fit: enough for its note to name the smallest peak, few enough that "no plan fits" is found
in seconds."""

BASELINE_FAST_TOP = 4
"""Plans a baseline replays on the fast path whatever the action budget (settle's ``fast_top``)."""

BASELINE_FAST_MAX = 8
"""Plans a one-partition baseline (dp, PipeDream: its candidates differ only in micro-batch
size and recompute, which the analytic ranking orders well) replays on the fast path at most
(settle's ``fast_max``); the even split, whose candidates also differ in stage count, replays
twice as many (on ``scenarios/paper/vgg19_v100_16x1.yaml`` its best is its 13th replay)."""

BASELINE_FAST_BUDGET_OPS = 20_000
"""Actions a baseline's fast-path replays may compile beyond ``BASELINE_FAST_TOP`` (half
of ``planner.search.space.FAST_BUDGET_OPS``)."""

BASELINE_ENGINE_TOP = 2
"""Plans a baseline settles with the SimPy engine."""

BASELINE_DEVICE_REPLAYS = 1024
"""Devices × replays a baseline's settling may spend on each engine: up to 64 replays of a
16-GPU plan, 16 of a 64-GPU one, 1 from 1,024 GPUs on (a SimPy replay of a 1,024-GPU GPipe
plan of GPT-3 175B runs about 200,000 events: ``benchmarks/baselines_bench.py``)."""

OVER_CAPACITY = 1.25
"""An estimated peak above this multiple of the device's memory is "well over" it (the slack
``planner.search.ranking.settle`` gives the rough estimate)."""


def megatron_planner(scenario: Scenario, options: PlannerOptions, progress=None, context=None) -> PlannerResult:
    started = time.perf_counter()
    tables = context.tables if context is not None else None
    # a baseline's replays without the cap per device: the grid's families (chunks, micro-batch,
    # recompute) rank less surely by the closed forms than one partition's
    settling = baseline_settling(options, scenario.cluster.num_devices, 2 * BASELINE_FAST_MAX, per_device=False)
    return settle("megatron", scenario, grid_candidates(scenario, options, tables), settling, started=started,
                  progress=progress, context=context)


def grid_candidates(scenario: Scenario, options: PlannerOptions, tables: TablesCache | None = None
                    ) -> list[Candidate]:
    """The Megatron grid's candidates (the module docstring); DAPPLE's planner ranks them too."""
    cache = tables or TablesCache(scenario)
    layers = scenario.model.num_layers
    whole = len(scenario.model.cut_points) - 1  # the units a stage may start at: the mtp layer and head are one
    gbs = scenario.training.global_batch_size
    order = levels(scenario, options)
    policy = (("policy", DapplePolicy.S_MINUS_I.value),)
    candidates = []
    for t, c, e in layouts(scenario, options):
        tables = cache.layout(t, c, e)
        units, step = unit_count(scenario.cluster, t * c), replica_step((t, c, e))
        weights = [sum(tables.compute_s(k, k + 1, 1)) for k in range(layers)]
        for stages in range(1, min(whole, units, options.max_stages or units) + 1):
            if units % stages:
                continue
            dp = units // stages
            if dp % step:
                continue  # expert parallelism must divide each stage's t·c·dp devices
            bounds = balanced_cuts(weights, stages, no_cut_at=scenario.model.no_cut_at)
            for microbatch_size in microbatch_sizes(gbs, options):
                if microbatch_size % dp:
                    continue  # every replica gets whole, equal slices
                M = gbs // microbatch_size
                shapes = [("dapple", policy, 1)]
                if options.interleaved and stages > 1 and M % stages == 0:
                    shapes += [("interleaved", (), v) for v in options.chunks if whole >= stages * v]
                for name, params, v in shapes:
                    cut = bounds if v == 1 else balanced_cuts(weights, stages * v, no_cut_at=scenario.model.no_cut_at)
                    base = Candidate(bounds=cut, replicas=(dp,) * (stages * v), microbatch_size=microbatch_size,
                                     schedule=name, params=params, chunks=v, tensor_parallel=t,
                                     context_parallel=c, expert_parallel=e)
                    candidates += cheapest_levels(tables, scenario, base, order)
    return candidates


def dp_planner(scenario: Scenario, options: PlannerOptions, progress=None, context=None) -> PlannerResult:
    started = time.perf_counter()
    n, layers = scenario.cluster.num_devices, scenario.model.num_layers
    tables, order = CostTables(scenario), levels(scenario, options)
    candidates, cut = [], False
    # largest micro-batches first: fewest accumulation steps, the fastest of those that fit
    for microbatch_size in sorted(microbatch_sizes(scenario.training.global_batch_size, options), reverse=True):
        base = Candidate(bounds=(0, layers), replicas=(n,), microbatch_size=microbatch_size, schedule="dapple",
                         params=(("policy", DapplePolicy.S_MINUS_I.value),))
        if not feeds_every_replica(base):
            continue
        if len(candidates) >= options.max_candidates:
            cut = True
            break
        candidates += cheapest_levels(tables, scenario, base, order)
    return settle_offered("dp", scenario, tables, candidates, options, started=started, progress=progress, cut=cut,
                          context=context)


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
    tables = CostTables(scenario)
    candidates, cut = even_candidates(scenario, options, tables)
    return settle_offered("even", scenario, tables, candidates, options, started=started, progress=progress,
                          cut=cut, fast_max=2 * BASELINE_FAST_MAX, context=context)


def even_candidates(scenario: Scenario, options: PlannerOptions, tables: CostTables
                    ) -> tuple[list[Candidate], bool]:
    """The even split's candidates (module docstring), at most ``options.max_candidates``, and
    whether that budget cut them.

    Stage counts whose largest stage's parameters, gradients and optimizer state alone do not
    fit (``CostTables.static_bytes``: nothing here shards them) are dropped before any
    candidate is made (if every count is, the one with the smallest such stage is kept, for
    the note). The rest are tried fewest stages first: GPipe's bubble, (S−1)/(M+S−1) of the
    iteration (Huang et al., NeurIPS'19, §2.3), grows with the stage count S, so a budget stop
    keeps the least-bubbled plans.
    """
    n, points = scenario.cluster.num_devices, scenario.model.cut_points
    layers = len(points) - 1  # the units a stage may start at: the mtp layer and the head are one
    capacity = scenario.cluster.device.usable_memory_bytes
    counts = [s for s in range(2, min(n, layers, options.max_stages or n) + 1) if n % s == 0]
    states = {s: max(tables.static_bytes(a, b, n // s) for a, b in zip(_even(points, s), _even(points, s)[1:]))
              for s in counts}
    kept = [s for s in counts if states[s] <= capacity] or sorted(counts, key=lambda s: (states[s], s))[:1]
    candidates = []
    for stages in kept:
        bounds = _even(points, stages)
        for microbatch_size in microbatch_sizes(scenario.training.global_batch_size, options):
            for recompute in options.recompute:
                candidate = Candidate(bounds=bounds, replicas=(n // stages,) * stages,
                                      microbatch_size=microbatch_size, schedule="gpipe", recompute=recompute)
                if not feeds_every_replica(candidate):
                    break
                if len(candidates) >= options.max_candidates:
                    return candidates, True
                candidates.append(candidate)
    return candidates, False


def _even(points: tuple[int, ...], stages: int) -> tuple[int, ...]:
    """Bounds of ``stages`` stages of (nearly) equal unit counts, at ``points`` (``ModelSpec.cut_points``:
    every layer boundary but the mtp layer's and the head's)."""
    units = len(points) - 1
    return tuple(points[round(s * units / stages)] for s in range(stages + 1))


def feeds_every_replica(candidate: Candidate) -> bool:
    """Whether every replica of every stage gets at least one sample of each micro-batch: a
    data-parallel rank trains on a whole, positive number of samples (DeepSpeed: the global
    batch is ``train_micro_batch_size_per_gpu × gradient_accumulation_steps × GPUs``, docs
    "DeepSpeed Configuration JSON", batch size parameters); a plan leaving ranks without one
    idles them and, at 16,384 GPUs, costs minutes to replay."""
    return candidate.microbatch_size >= max(candidate.replicas) // candidate.unit


def likely_to_fit(tables: CostTables, scenario: Scenario, candidates: list[Candidate]) -> list[Candidate]:
    """``candidates`` whose estimated peak (``analytic_score``) is not well over the device's
    memory (``OVER_CAPACITY``), in order; when none is, the ``NO_FIT_PROBES`` smallest, whose
    exact count in ``settle`` names the smallest peak in its "no plan fits" note."""
    capacity = scenario.cluster.device.usable_memory_bytes
    peaks = [analytic_score(tables, scenario, c)[1] for c in candidates]
    fitting = [c for c, peak in zip(candidates, peaks) if peak <= OVER_CAPACITY * capacity]
    if fitting:
        return fitting
    smallest = sorted(range(len(candidates)), key=lambda k: (peaks[k], k))[:NO_FIT_PROBES]
    return [candidates[k] for k in sorted(smallest)]


def baseline_settling(options: PlannerOptions, num_devices: int, fast_max: int = BASELINE_FAST_MAX, *,
                      per_device: bool = True) -> PlannerOptions:
    """``options`` with the replays a baseline may spend settling: at most ``BASELINE_FAST_TOP``
    plans sure of a fast-path replay, ``BASELINE_FAST_BUDGET_OPS`` actions beyond them and
    ``fast_max`` replays in all, ``BASELINE_ENGINE_TOP`` engine verdicts, and no more of
    either than ``BASELINE_DEVICE_REPLAYS`` over the device count (a replay's resolve, memory
    count and run grow with the devices: seconds each from 1,024 GPUs on, so one of each there).
    A baseline is a reference the planners are compared with, not the answer, and its
    candidates (one family each) rank well analytically. Without ``per_device`` there is no cap
    by the device count (Megatron's grid: its families rank less surely by the closed forms)."""
    replays = max(1, BASELINE_DEVICE_REPLAYS // num_devices) if per_device else options.fast_max
    return replace(options, fast_top=min(options.fast_top, BASELINE_FAST_TOP, replays),
                   fast_max=min(options.fast_max, fast_max, replays),
                   fast_budget_ops=min(options.fast_budget_ops, BASELINE_FAST_BUDGET_OPS),
                   engine_top=min(options.engine_top, BASELINE_ENGINE_TOP, replays))


def settle_offered(name: str, scenario: Scenario, tables: CostTables, candidates: list[Candidate],
                   options: PlannerOptions, *, started: float, progress=None, cut: bool = False,
                   fast_max: int = BASELINE_FAST_MAX, context=None) -> PlannerResult:
    """``settle`` a baseline's candidates: those ``likely_to_fit``, within ``baseline_settling``'s
    replays; the others count as scored, and a list cut at ``options.max_candidates`` says so.
    With no candidate (no micro-batch size feeds every replica) nothing is replayed."""
    if not candidates:
        result = PlannerResult(planner=name, best=None, note=(
            f"no plan: no micro-batch size of the global batch ({scenario.training.global_batch_size:,}) gives "
            f"every replica of this planner's stages a sample; raise the global batch or use fewer replicas"))
        result.search_time_s = time.perf_counter() - started
        return result
    offered = likely_to_fit(tables, scenario, candidates)
    settling = baseline_settling(options, scenario.cluster.num_devices, fast_max)
    result = settle(name, scenario, offered, settling, started=started, progress=progress, context=context)
    result.spend.candidates += len(candidates) - len(offered)  # scored here for memory, not offered
    if cut:
        result.spend.reach("candidates", options.max_candidates)
    return result
