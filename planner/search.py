"""Search machinery every planner shares: analytic scoring, re-scoring, and the engine's verdict.

A planner proposes candidates (``planner.space.Candidate``). They are ranked in three rounds
of increasing cost and fidelity, as DAPPLE's planner does with its latency model (Fan et al.,
PPoPP'21, §4.1):

1. ``analytic``: DAPPLE's latency model (warm-up, steady phase on the pivot stage, ending
   phase with each stage's all-reduce; cuts as stages of their own) on the cost tables of
   ``planner.costs``, plus an estimate of peak memory;
2. the fast path (contention-free replay of the exact plan, exact memory) on the best
   ``fast_top``, and on more until its replays have run ``fast_budget_ops`` actions (small
   plans replay in a few hundred actions, so small searches look much further down the
   analytic ranking). The budget counts work, not seconds, so the same scenario gives the
   same plan on any machine and under any load;
3. the SimPy engine (contention) on the best ``engine_top`` that fit in memory.

The engine's verdict is the answer. Candidates that cannot run are kept with their
``planner.evaluation.Rejection`` (a kind and a reason).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

from planner.costs import CostTables
from planner.evaluation import Evaluation, check_plannable, count_rejections, evaluate
from planner.space import Candidate, PlannerOptions
from sim.analytic import PIPELINE_START, extend_pipeline
from sim.input.scenario import Scenario
from sim.schedule.policy import DapplePolicy, dapple_warmup, interleaved_peak_inflight

__all__ = ["PlannerResult", "analytic_score", "no_fit_note", "settle"]

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
    candidates_scored: int = 0
    """Candidates scored analytically."""
    search_time_s: float = 0.0
    note: str = ""


def analytic_score(tables: CostTables, scenario: Scenario, candidate: Candidate) -> tuple[float, float]:
    """(estimated iteration seconds, estimated peak bytes per device) of ``candidate``.

    DAPPLE's pivot latency with each cut as a stage of its own (``sim.analytic.extend_pipeline``,
    as ``planner.dapple``'s DP); the micro-batches alive on stage i are M under GPipe, K_i
    otherwise (``sim.schedule.policy.dapple_warmup``).
    """
    if candidate.chunks > 1:
        return _interleaved_score(tables, scenario, candidate)
    cluster, microbatch_size = scenario.cluster, candidate.microbatch_size
    M = scenario.training.global_batch_size // microbatch_size
    groups = candidate.devices(cluster)
    S = candidate.num_stages
    policy = dict(candidate.params).get("policy", DapplePolicy.S_MINUS_I)
    fold, peak = PIPELINE_START, 0.0
    for s, (a, b, devices) in enumerate(zip(candidate.bounds, candidate.bounds[1:], groups)):
        samples = CostTables.slice_of(microbatch_size, len(devices))
        f, bk = tables.compute_s(a, b, samples)
        if candidate.recompute:
            bk += f
        nodes = {cluster.node_of(d) for d in devices}
        comm = 0.0
        if s > 0:
            previous = {cluster.node_of(d) for d in groups[s - 1]}
            comm = tables.transfer_s(a, microbatch_size, len(devices), len(nodes), len(nodes | previous) == 1)
        per_node = math.ceil(len(devices) / len(nodes))
        # stage s's last backward ends before the drain back to stage 0 (DAPPLE's T_e)
        tail = tables.allreduce_s(a, b, per_node, len(nodes)) + tables.optimizer_s(a, b)
        fold = extend_pipeline(fold, f, bk, comm, tail, M)
        alive = M if candidate.schedule == "gpipe" else dapple_warmup(S, M, s, policy)
        stash = tables.stash_bytes(a, b, samples, recompute=candidate.recompute)
        peak = max(peak, tables.static_bytes(a, b) + alive * stash)
    return fold.total_s, peak


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
    R = candidate.num_stages // v
    busy, stash, static, tail, comm = [0.0] * R, [0.0] * R, [0.0] * R, [0.0] * R, 0.0
    for s, (a, b, devices) in enumerate(zip(candidate.bounds, candidate.bounds[1:], groups)):
        g, samples = s % R, CostTables.slice_of(microbatch_size, len(devices))
        f, bk = tables.compute_s(a, b, samples)
        busy[g] += f + bk + (f if candidate.recompute else 0.0)
        stash[g] += tables.stash_bytes(a, b, samples, recompute=candidate.recompute) / v
        static[g] += tables.static_bytes(a, b)
        nodes = {cluster.node_of(d) for d in devices}
        tail[g] += tables.allreduce_s(a, b, math.ceil(len(devices) / len(nodes)), len(nodes)) + tables.optimizer_s(a, b)
        if s > 0:
            previous = {cluster.node_of(d) for d in groups[s - 1]}
            comm += 2 * tables.transfer_s(a, microbatch_size, len(devices), len(nodes), len(nodes | previous) == 1)
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
) -> PlannerResult:
    """Rank ``candidates`` analytically, re-score the best with the fast path, settle with the engine."""
    check_plannable(scenario)
    tables = CostTables(scenario)
    capacity = scenario.cluster.device.memory_bytes
    scored = []
    for candidate in dict.fromkeys(candidates):  # drop duplicates, keep order
        latency, peak = analytic_score(tables, scenario, candidate)
        # an estimate well over capacity is skipped; near it, the replay decides
        scored.append((peak > 1.25 * capacity, latency, candidate))
    scored.sort(key=lambda item: (item[0], item[1], item[2].num_stages, repr(item[2])))
    result = PlannerResult(planner=name, best=None, candidates_scored=len(scored))
    # interleaved estimates are rougher: they get their own few replays, not the others' share
    plain = [item for item in scored if item[2].chunks == 1]
    chunked = [item for item in scored if item[2].chunks > 1][: INTERLEAVED_REPLAYS]
    queue = plain[: options.fast_top] + chunked + plain[options.fast_top :]
    must = min(options.fast_top, len(plain)) + len(chunked)
    fast, spent_ops = [], 0
    for index, (_, _, candidate) in enumerate(queue[: options.fast_max]):
        if index >= must and spent_ops >= options.fast_budget_ops:
            break  # the analytic ranking is trusted beyond what the budget allows
        evaluation = evaluate(scenario, candidate, engine="fast")
        fast.append(evaluation)
        if index >= must:
            spent_ops += evaluation.replayed_ops
        if progress is not None:
            progress()
    result.evaluations.extend(fast)
    fits = sorted((e for e in fast if e.ok), key=lambda e: (e.iteration_time_s, e.candidate.num_stages))
    settled = []
    for evaluation in fits[: options.engine_top]:
        settled.append(evaluate(scenario, evaluation.candidate, engine="simpy"))
        if progress is not None:
            progress()
    result.evaluations.extend(settled)
    ok = sorted((e for e in settled if e.ok), key=lambda e: (e.iteration_time_s, e.candidate.num_stages))
    result.best = ok[0] if ok else None
    if result.best is None:
        result.note = no_fit_note(fast)
    result.search_time_s = time.perf_counter() - started
    log.info("%s: %d scored, %d replayed, best %s", name, len(scored), len(result.evaluations),
             result.best.iteration_time_s if result.best else None)
    return result


def no_fit_note(evaluations: list[Evaluation]) -> str:
    """Why nothing fits: the rejections counted by kind, and the first reason in sorted order."""
    counts = count_rejections(evaluations)
    reasons = sorted({e.rejected for e in evaluations if e.rejected})
    if not reasons:
        return "no candidate fits: nothing to evaluate"
    kinds = ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in counts.items())
    return f"no candidate fits: {reasons[0]} ({kinds})"
