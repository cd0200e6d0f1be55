"""Search machinery every planner shares: analytic scoring, re-scoring, and the engine's verdict.

A planner proposes candidates (``planner.search.space.Candidate``). They are ranked in three rounds
of increasing cost and fidelity, as DAPPLE's planner does with its latency model (Fan et al.,
PPoPP'21, §4.1):

1. ``analytic``: DAPPLE's latency model (warm-up, steady phase on the pivot stage, ending
   phase with each stage's all-reduce; cuts as stages of their own) on the cost tables of
   ``planner.search.costs``, plus an estimate of peak memory;
2. the fast path (contention-free replay of the exact plan, exact memory) on the best
   ``fast_top``, and on more until its replays have run ``fast_budget_ops`` actions (small
   plans replay in a few hundred actions, so small searches look much further down the
   analytic ranking). The budget counts work, not seconds, so the same scenario gives the
   same plan on any machine and under any load;
3. the SimPy engine (contention) on the best ``engine_top`` that fit in memory.

The engine's verdict is the answer. Candidates that cannot run are kept with their
``planner.search.evaluation.Rejection`` (a kind and a reason).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from functools import lru_cache

from planner.search.budget import Spend
from planner.search.costs import CostTables
from planner.search.evaluation import Evaluation, check_plannable, count_rejections, evaluate
from planner.search.space import Candidate, PlannerOptions
from sim.core.parallelism import Recompute, Sharding
from sim.core.units import format_bytes
from sim.cost.closed_forms import PIPELINE_START, extend_pipeline
from sim.input.scenario import Scenario
from sim.schedule.policy import DapplePolicy, dapple_warmup, interleaved_peak_inflight

__all__ = ["PlannerResult", "TablesCache", "analytic_score", "no_fit_note", "settle"]

log = logging.getLogger(__name__)

INTERLEAVED_REPLAYS = 3
"""Fast-path replays reserved for the best interleaved candidates."""


@dataclass(slots=True, kw_only=True)
class PlannerResult:
    """What one planner found."""

    planner: str
    best: Evaluation | None
    """The engine's best candidate, or None when nothing fits."""
    evaluations: list[Evaluation] = field(default_factory=list)
    """Every replayed candidate (fast path and engine)."""
    spend: Spend = field(default_factory=Spend)
    """What the search spent, in work (``planner.search.budget``)."""
    search_time_s: float = 0.0
    """Wall-clock seconds the search took (reported, never used to decide anything)."""
    note: str = ""

    @property
    def candidates_scored(self) -> int:
        """Candidates scored by the closed forms."""
        return self.spend.candidates


@lru_cache(maxsize=8192)
def servers_of(devices: tuple[int, ...], per_node: int) -> frozenset[int]:
    """The servers a device set spans (cached: candidates share their placements' sets)."""
    return frozenset(d // per_node for d in devices)


class TablesCache:
    """One ``CostTables`` per layout (tensor × context × expert degree) of a scenario, built on first use."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self._tables: dict[tuple[int, int, int], CostTables] = {}

    def __call__(self, candidate: Candidate) -> CostTables:
        return self.layout(candidate.tensor_parallel, candidate.context_parallel, candidate.expert_parallel)

    def layout(self, tensor_parallel: int, context_parallel: int, expert_parallel: int = 1) -> CostTables:
        key = (tensor_parallel, context_parallel, expert_parallel)
        if key not in self._tables:
            self._tables[key] = CostTables(self.scenario, tensor_parallel=key[0], context_parallel=key[1],
                                           expert_parallel=key[2])
        return self._tables[key]


def analytic_score(tables: CostTables, scenario: Scenario, candidate: Candidate) -> tuple[float, float]:
    """(estimated iteration seconds, estimated peak bytes per device) of ``candidate``.

    DAPPLE's pivot latency with each cut as a stage of its own (``sim.cost.closed_forms.extend_pipeline``,
    as ``planner.planners.dapple``'s DP); the micro-batches alive on stage i are M under GPipe, K_i
    otherwise (``sim.schedule.policy.dapple_warmup``). ZB-H1 (Qi et al., ICLR'24, §3.1) fills
    the 1F1B bubble with the weight-gradient halves of the backwards: (S−1)·2W less, W ≈ B/2.
    ``tables`` is the candidate's layout's (and memoise the score: planners ask for the same
    candidates more than once).
    """
    found = tables.scores.get(candidate)
    if found is None:
        found = tables.scores[candidate] = _score(tables, scenario, candidate)
    return found


def _span(cluster, nodes: set[int]) -> int | None:
    """On a fabric, the consecutive servers a stage's ``nodes`` lie in (the tiers its reduction
    crosses: Replica First spreads a stage over every pod); None without a fabric."""
    return None if cluster.fabric is None else max(nodes) - min(nodes) + 1


def _score(tables: CostTables, scenario: Scenario, candidate: Candidate) -> tuple[float, float]:
    """:func:`analytic_score`, computed."""
    if candidate.chunks > 1:
        return _interleaved_score(tables, scenario, candidate)
    cluster, microbatch_size = scenario.cluster, candidate.microbatch_size
    M = scenario.training.global_batch_size // microbatch_size
    groups = candidate.devices(cluster)
    S, unit, sharding = candidate.num_stages, candidate.unit, candidate.sharding
    policy = dict(candidate.params).get("policy", DapplePolicy.S_MINUS_I)
    fold, peak, backward, gathered = PIPELINE_START, 0.0, 0.0, 0.0
    for s, (a, b, devices) in enumerate(zip(candidate.bounds, candidate.bounds[1:], groups)):
        replicas = len(devices) // unit
        samples = CostTables.slice_of(microbatch_size, replicas)
        f, bk = tables.compute_s(a, b, samples, candidate.recompute, data_parallel=replicas, sharding=sharding)
        backward = max(backward, bk)
        nodes = servers_of(devices, cluster.devices_per_node)
        comm = 0.0
        if s > 0:
            previous = servers_of(groups[s - 1], cluster.devices_per_node)
            comm = tables.transfer_s(a, microbatch_size, replicas, len(nodes), len(nodes | previous) == 1)
        per_node = math.ceil(replicas / len(nodes))
        # stage s's last backward ends before the drain back to stage 0 (DAPPLE's T_e); its
        # reduction as the plan overlaps it, and its first forward's parameter gather
        where = dict(per_node=per_node, nodes=len(nodes), data_parallel=replicas, sharding=sharding)
        tail = tables.reduction_tail_s(a, b, samples, candidate.recompute, num_microbatches=M,
                                       span=_span(cluster, nodes), **where) + tables.optimizer_s(a, b, replicas, sharding)
        gathered += tables.first_forward_extra_s(a, b, samples, candidate.recompute, **where)
        fold = extend_pipeline(fold, f, bk, comm, tail, M)
        alive = M if candidate.schedule == "gpipe" else dapple_warmup(S, M, s, policy)
        stash = tables.stash_bytes(a, b, samples, recompute=candidate.recompute)
        peak = max(peak, tables.static_bytes(a, b, replicas, sharding) + alive * stash)
    latency = fold.total_s + gathered if gathered else fold.total_s
    if candidate.schedule == "zb-h1":
        latency -= (S - 1) * backward
    return latency, peak


def _interleaved_score(tables: CostTables, scenario: Scenario, candidate: Candidate) -> tuple[float, float]:
    """Megatron's interleaved 1F1B (Narayanan et al., SC'21, §2.2): each device set runs its
    v chunks per micro-batch, and the fill and drain shrink by v: with per-set times
    ``T_g = Σ_chunks (F + B)``, ``L ≈ M·max_g T_g + Σ_g T_g / v`` (plus transfers and the
    ending all-reduce). Rank r holds up to ``(v−1)·R + 2(R−1−r) + 1`` chunk micro-batches
    (torch's warm-up, ``sim.schedule.policy.interleaved_peak_inflight``), which sets the
    memory estimate."""
    cluster, microbatch_size, v = scenario.cluster, candidate.microbatch_size, candidate.chunks
    M = scenario.training.global_batch_size // microbatch_size
    groups = candidate.devices(cluster)
    R, sharding = candidate.num_stages // v, candidate.sharding
    busy, stash, static, tail, comm = [0.0] * R, [0.0] * R, [0.0] * R, [0.0] * R, 0.0
    for s, (a, b, devices) in enumerate(zip(candidate.bounds, candidate.bounds[1:], groups)):
        replicas = len(devices) // candidate.unit
        g, samples = s % R, CostTables.slice_of(microbatch_size, replicas)
        f, bk = tables.compute_s(a, b, samples, candidate.recompute, data_parallel=replicas, sharding=sharding)
        busy[g] += f + bk
        stash[g] += tables.stash_bytes(a, b, samples, recompute=candidate.recompute) / v
        static[g] += tables.static_bytes(a, b, replicas, sharding)
        nodes = servers_of(devices, cluster.devices_per_node)
        tail[g] += tables.reduction_tail_s(a, b, samples, candidate.recompute, per_node=math.ceil(replicas / len(nodes)),
                                           nodes=len(nodes), data_parallel=replicas, sharding=sharding,
                                           num_microbatches=M, span=_span(cluster, nodes)) \
            + tables.optimizer_s(a, b, replicas, sharding)
        if s > 0:
            previous = servers_of(groups[s - 1], cluster.devices_per_node)
            comm += 2 * tables.transfer_s(a, microbatch_size, replicas, len(nodes), len(nodes | previous) == 1)
    latency = M * max(busy) + (sum(busy) + comm) / v + max(tail)
    # M is a multiple of R for these candidates, so each round has R micro-batches
    peak = max(static[r] + interleaved_peak_inflight(R, r, M, v, R) * stash[r] for r in range(R))
    return latency, peak


def settle(
    name: str,
    scenario: Scenario,
    candidates: list[Candidate],
    options: PlannerOptions,
    *,
    started: float,
    progress=None,
    reserved: list[Candidate] = (),
    tables: TablesCache | None = None,
    context=None,
) -> PlannerResult:
    """Rank ``candidates`` analytically, re-score the best with the fast path, settle with the engine.

    The best few of ``reserved`` (by the same ranking) are replayed whatever the budget: a
    family the planner must never lose to (DAPPLE's planner reserves Megatron's grid).

    A candidate whose estimated peak is well over the device's memory (1.25×: the estimate is
    rough) is ranked after every other; ``planner.search.evaluation.evaluate`` then counts the exact
    peak before it replays one, so a candidate that cannot fit costs no replay.

    At most ``options.max_candidates`` candidates are scored (the first ones: planners propose
    the most promising first), and the result says when that budget cut the list. ``context``
    (a ``planner.search.context.SearchContext``) shares tables and evaluations with the other
    planners of one run.
    """
    check_plannable(scenario)
    tables = tables or (context.tables if context is not None else TablesCache(scenario))

    def run(candidates: list[Candidate], engine: str, resolved: dict, room=None):
        """The evaluations of ``candidates`` in order (on the context's workers, if it has any)."""
        if context is not None:
            return context.stream(candidates, engine, resolved, room)
        return (evaluate(scenario, candidate, engine=engine, resolved=resolved) for candidate in candidates)

    capacity = scenario.cluster.device.usable_memory_bytes
    scored = []
    reserved = set(reserved)
    result = PlannerResult(planner=name, best=None)
    for candidate in _within_budget(candidates, reserved, options.max_candidates, result):
        latency, peak = analytic_score(tables(candidate), scenario, candidate)
        # an estimate well over capacity is skipped; near it, the replay decides
        scored.append((peak > 1.25 * capacity, latency, candidate))
    scored.sort(key=lambda item: (item[0], item[1], item[2].num_stages, repr(item[2])))
    result.spend.candidates += len(scored)
    # interleaved and zero-bubble estimates are rougher: they get their own few replays
    plain = [item for item in scored if item[2].chunks == 1 and item[2].schedule != "zb-h1"]
    variants = [item for item in scored if item[2].chunks > 1][:INTERLEAVED_REPLAYS] \
        + [item for item in scored if item[2].schedule == "zb-h1"][:INTERLEAVED_REPLAYS]
    variants += [item for item in scored if item[2] in reserved][:INTERLEAVED_REPLAYS]
    head = list(dict.fromkeys(plain[: options.fast_top] + variants))
    taken = set(head)
    queue = head + [item for item in plain[options.fast_top :] if item not in taken]
    must = len(head)
    resolved = {}  # candidate -> its scenario, resolved once for the fast path and the engine
    fast = _fast_round(queue, must, options, run, resolved, result, progress)
    result.evaluations.extend(fast)
    fits = sorted((e for e in fast if e.ok), key=lambda e: (e.iteration_time_s, e.candidate.num_stages))
    settled = []
    chosen = fits[: options.engine_top]
    chosen += [e for e in fits if e.candidate in reserved and e not in chosen][:1]  # the reserved family's best too
    resolved = {e.candidate: resolved[e.candidate] for e in chosen if e.candidate in resolved}  # let the others' go
    for evaluation in run([e.candidate for e in chosen], "simpy", resolved):
        settled.append(evaluation)
        result.spend.count(evaluation)
        if progress is not None:
            progress()
    result.evaluations.extend(settled)
    ok = sorted((e for e in settled if e.ok), key=lambda e: (e.iteration_time_s, e.candidate.num_stages))
    result.best = ok[0] if ok else None
    if result.best is None:
        result.note = no_fit_note(fast, scenario)
    result.search_time_s = time.perf_counter() - started
    unreplayed = sum(1 for e in fast if e.summary is None)
    log.info("%s: tiers: %d scored by closed forms, %d counted for memory (%d over it, not replayed), "
             "%d replayed on the fast path, %d settled by the engine; best %s", name, len(scored), len(fast),
             unreplayed, len(fast) - unreplayed, len(settled),
             f"{result.best.iteration_time_s:.6g} s" if result.best else "none")
    return result


def _within_budget(candidates: list[Candidate], reserved: set[Candidate], limit: int, result: PlannerResult
                   ) -> list[Candidate]:
    """``candidates`` and ``reserved`` without duplicates, in order, cut at ``limit`` (the
    reserved kept whatever the budget); the cut noted in ``result.spend``."""
    unique = list(dict.fromkeys([*candidates, *reserved]))
    if len(unique) <= limit:
        return unique
    kept = set(unique[:limit])
    result.spend.reach("candidates", limit)
    return unique[:limit] + [c for c in unique[limit:] if c in reserved and c not in kept]


def _fast_round(queue: list, must: int, options: PlannerOptions, run, resolved: dict, result: PlannerResult,
                progress) -> list[Evaluation]:
    """The fast path over ``queue`` (its first ``must`` whatever the budget), within
    ``options.fast_max`` replays and ``options.fast_budget_ops`` actions beyond the first ``must``."""
    fast, spent_ops, replayed = [], 0, 0
    # at most fast_max − replayed more can be replayed: send no more ahead to the workers
    evaluations = run([candidate for _, _, candidate in queue], "fast", resolved,
                      lambda: options.fast_max - sum(e.summary is not None for e in fast))
    for index in range(len(queue)):
        if replayed >= options.fast_max or (index >= must and spent_ops >= options.fast_budget_ops):
            # the analytic ranking is trusted beyond what the budget allows
            if replayed >= options.fast_max:
                result.spend.reach("fast replays", options.fast_max)
            else:
                result.spend.reach("replayed actions", options.fast_budget_ops)
            break
        evaluation = next(evaluations)
        fast.append(evaluation)
        replayed += evaluation.summary is not None
        result.spend.count(evaluation)
        if index >= must:
            spent_ops += evaluation.replayed_ops
        if progress is not None:
            progress()
    evaluations.close()  # what workers did beyond the budget is not used
    return fast


def no_fit_note(evaluations: list[Evaluation], scenario: Scenario | None = None) -> str:
    """Why nothing fits: the smallest peak memory found and on what, what would make it fit,
    and the rejections counted by kind."""
    counts = count_rejections(evaluations)
    reasons = sorted({e.rejected for e in evaluations if e.rejected})
    if not reasons:
        return "no candidate fits: nothing to evaluate"
    kinds = ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in counts.items())
    sized = [e for e in evaluations if e.memory_bytes is not None]
    if scenario is None or not sized:
        return f"no candidate fits: {reasons[0]} ({kinds})"
    smallest = min(sized, key=lambda e: (e.memory_bytes, repr(e.candidate)))
    capacity = scenario.cluster.device.usable_memory_bytes
    need = smallest.memory_bytes / capacity
    layout = smallest.candidate.layout() or "no tensor parallelism, sharding or recompute"
    memory = scenario.cluster.device.memory_bytes
    usable = format_bytes(capacity) + (f" usable of {format_bytes(memory)}" if capacity < memory else "")
    return (f"no plan fits: the smallest peak found is {format_bytes(smallest.memory_bytes)} per device of "
            f"{usable} ({smallest.candidate.describe()}; {layout}); it would fit with about "
            f"{need:.1f}x the devices (the model's states spread over more stages and replicas), "
            f"{'full sharding, ' if smallest.candidate.sharding is not Sharding.FULL else ''}"
            f"{'full recompute, ' if smallest.candidate.recompute is not Recompute.FULL else ''}"
            f"or a device with more memory ({kinds})")
