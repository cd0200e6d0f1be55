"""DAPPLE's planner: dynamic programming over layer prefixes and device counts.

DAPPLE (Fan et al., PPoPP'21, §4) chooses stage boundaries and per-stage replica counts by
dynamic programming: a partial plan covers the first ``j`` layers on the first ``g``
devices, and a new stage extends it by layers ``[j, j')`` on ``r`` more devices. Its value
is the pipeline latency model: with stages' forward and backward times ``F_s``, ``B_s``,
the transfer time ``C_s`` of the cut in front of stage s and all-reduce ``AR_s``,

    L = max over stages and cuts u of ( Σ_{u'<u} (F_u' + B_u') + M·busy_u ) + max_s (AR_s − Σ_{s'<s} B_s'),

the pivot form of warm-up + steady phase + ending phase (``sim.analytic.dapple_latency_s``)
in which each cut is a pipeline stage of its own (``F = B = C``, busy ``C`` per micro-batch
in each direction): transfers overlap compute, so a cut slows the steady phase only when
it is slower than the stages. ``sim.analytic.extend_pipeline`` computes L one stage at a
time, here and in ``planner.search``'s scores.
L is not a sum, so each DP state keeps the Pareto set of partial plans over the quantities
that decide how extensions fare: the running maximum, the running sum ``Σ(F+B)``, the
ending so far (a stage's all-reduce starts when the drain of backwards reaches it, so it
adds ``AR_s − Σ_{s'<s} B_s'``, DAPPLE's ``T_e``) and the drain so far. Pruning dominated partial plans is then exact for
this model; because the model is only an estimate, a plan is pruned only when another is
better by ``SLACK`` in every quantity, and the set is capped at ``PARETO_CAP`` per state.

During the DP a stage's devices are the next ``r`` in order (Append First), which fixes
whether a cut crosses servers; the best partitions are then re-placed under all three
placement policies, every schedule and recompute setting, and ranked by
``planner.search.settle`` (analytic, fast path, engine).

Layers are grouped into at most ``MAX_SEGMENTS`` segments of similar compute for long
profiles. Clusters above ``UNIFORM_ABOVE`` devices use the same replica count for every
stage (DP x PP grids), which keeps the search linear in the cluster size.
"""

from __future__ import annotations

import math
import time

from planner.costs import CostTables
from planner.search import PlannerResult, settle
from planner.space import Candidate, PlannerOptions, microbatch_sizes
from sim.analytic import PIPELINE_START, extend_pipeline
from sim.input.scenario import Scenario

__all__ = ["MAX_SEGMENTS", "PARETO_CAP", "UNIFORM_ABOVE", "dapple_planner", "segment_cuts", "partitions"]

MAX_SEGMENTS = 24
"""Most layer groups the DP cuts between (long profiles are grouped by compute)."""
PARETO_CAP = 6
"""Partial plans kept per DP state."""
SLACK = 0.03
"""A partial plan is dropped only when another beats it by this fraction in every quantity:
the latency model is an estimate, so near-ties survive for the replays to separate."""
UNIFORM_ABOVE = 64
"""Above this many devices, stages share one replica count."""
KEEP_PER_BATCH = 16
"""Complete plans kept per micro-batch size for re-scoring."""
UNEVEN_BATCHES = 3
"""Micro-batch sizes (the best by their uniform grids) searched with uneven replica counts."""
POOL = 64
"""Partitions (over all micro-batch sizes) expanded into candidates for the settling rounds."""


def segment_cuts(tables: CostTables, max_segments: int = MAX_SEGMENTS) -> list[int]:
    """Layer indices the DP may cut at: all of them, or ones that split compute evenly."""
    n = tables.num_layers
    if n <= max_segments:
        return list(range(n + 1))
    total = tables.compute_s(0, n, 1)
    weight = [sum(tables.compute_s(0, k, 1)) for k in range(n + 1)]
    whole = sum(total)
    cuts = {0, n}
    for k in range(1, max_segments):
        target = whole * k / max_segments
        cuts.add(min(range(1, n), key=lambda j: (abs(weight[j] - target), j)))
    return sorted(cuts)


def _replica_choices(num_devices: int) -> list[tuple[int, ...]]:
    """Replica-count sets to run the DP with: every count (small clusters), and one uniform
    count per run (DP x PP grids), whose best partitions the free DP may rank lower."""
    uniform = [(r,) for r in range(1, num_devices + 1) if num_devices % r == 0]
    if num_devices <= UNIFORM_ABOVE:
        return [tuple(range(1, num_devices + 1))] + uniform
    return uniform


def partitions(
    tables: CostTables,
    cuts: list[int],
    num_devices: int,
    microbatch_size: int,
    num_microbatches: int,
    replica_set: tuple[int, ...],
    max_stages: int,
    keep: int,
    bound: float = math.inf,
) -> list[tuple[float, tuple[int, ...], tuple[int, ...]]]:
    """The ``keep`` best (score, bounds, replicas) by the latency model, from the Pareto DP.

    Partial plans whose estimate already exceeds ``bound`` are dropped: extending a plan never
    lowers its estimate.
    """
    cluster = tables.cluster
    per_node = cluster.devices_per_node
    M = num_microbatches
    capacity = cluster.device.memory_bytes
    last = len(cuts) - 1
    # frontier[(cut index, devices used)] = [(PipelineFold, stages, parent key, parent index, replicas)]
    frontier: dict[tuple[int, int], list[tuple]] = {(0, 0): [(PIPELINE_START, 0, None, -1, 0)]}
    stage_cost: dict[tuple, tuple[float, float]] = {}
    for ci in range(last):
        for g in range(num_devices + 1):
            records = [(i, rec) for i, rec in enumerate(frontier.get((ci, g), ())) if rec[1] < max_stages]
            if not records:
                continue
            a = cuts[ci]
            for cj in range(ci + 1, last + 1):
                b = cuts[cj]
                if tables.static_bytes(a, b) > capacity:
                    break  # longer stages only hold more parameters
                for r in replica_set:
                    if g + r > num_devices:
                        break
                    first, final = g // per_node, (g + r - 1) // per_node
                    crosses = ci > 0 and (g - 1) // per_node != final
                    cost_key = (ci, cj, r, final - first + 1, crosses, ci > 0)
                    if cost_key not in stage_cost:
                        stage_cost[cost_key] = _stage(tables, a, b, r, final - first + 1, microbatch_size, ci > 0, crosses)
                    f, bk, comm, tail = stage_cost[cost_key]
                    key = (cj, g + r)
                    target = frontier.setdefault(key, [])
                    # (a fold's total_s, lmax_s + ending_s, spelled out on this hot path)
                    worst = target[-1][0][0] + target[-1][0][2] if len(target) >= PARETO_CAP else bound
                    for index, record in records:
                        extended = extend_pipeline(record[0], f, bk, comm, tail, M)
                        if extended[0] + extended[2] >= worst:
                            continue  # the cap would drop it (it cannot dominate a kept plan)
                        _insert(target, (extended, record[1] + 1, (ci, g), index, r))
    finished = []
    for g in range(1, num_devices + 1):
        for index, record in enumerate(frontier.get((last, g), [])):
            bounds, replicas = _trace(frontier, cuts, (last, g), index)
            finished.append((record[0].total_s, bounds, replicas))
    finished.sort(key=lambda item: (item[0], len(item[2]), item[2]))
    return finished[:keep]


def _stage(tables: CostTables, a: int, b: int, r: int, nodes: int, microbatch_size: int, has_input: bool,
           crosses: bool):
    """(forward, backward, transfer of the cut in front, all-reduce + optimizer) of one stage."""
    f, bk = tables.compute_s(a, b, CostTables.slice_of(microbatch_size, r))
    comm = tables.transfer_s(a, microbatch_size, r, nodes, not crosses) if has_input else 0.0
    return f, bk, comm, tables.allreduce_s(a, b, math.ceil(r / nodes), nodes) + tables.optimizer_s(a, b)


def _insert(records: list[tuple], entry: tuple) -> None:
    """Add ``entry`` unless dominated; drop what it dominates; keep the ``PARETO_CAP`` best.

    Smaller is better for the running maximum, the fill+drain sum and the ending; a larger
    drain so far is better (later all-reduces hide behind it). ``records`` stays sorted by
    the latency estimate ``lmax + ending``, so its last entry is the one the cap drops.
    """
    keep = 1.0 - SLACK  # a plan must be clearly better to push another out
    lmax, psum, ending, drained = entry[0]
    end_bar = ending - SLACK * abs(ending)
    for record in records:
        o = record[0]
        if o[0] <= lmax * keep and o[1] <= psum * keep and o[2] <= end_bar and o[3] * keep >= drained:
            return
    records[:] = [
        record for record in records
        if not (lmax <= (o := record[0])[0] * keep and psum <= o[1] * keep and ending <= o[2] - SLACK * abs(o[2])
                and drained * keep >= o[3])
    ]
    proxy = lmax + ending  # total_s, spelled out on this hot path
    position = len(records)
    while position and records[position - 1][0][0] + records[position - 1][0][2] > proxy:
        position -= 1
    records.insert(position, entry)
    del records[PARETO_CAP:]


def _trace(frontier, cuts, key, index) -> tuple[tuple[int, ...], tuple[int, ...]]:
    bounds, replicas = [cuts[key[0]]], []
    while key != (0, 0):
        record = frontier[key][index]
        replicas.append(record[4])
        key, index = record[2], record[3]
        bounds.append(cuts[key[0]])
    return tuple(reversed(bounds)), tuple(reversed(replicas))


def _interleaved(found, global_batch_size: int, options: PlannerOptions) -> list[Candidate]:
    """Megatron's interleaved variant of uniform partitions: each stage's layers split in two
    chunks, chunk k of the model on device set k mod S (valid when the micro-batch count
    divides into rounds of S, as torch's ScheduleInterleaved1F1B requires)."""
    variants = []
    for _, bounds, replicas, microbatch_size in found:
        S, M = len(replicas), global_batch_size // microbatch_size
        if S < 2 or len(set(replicas)) != 1 or M % S or any(b - a < 2 for a, b in zip(bounds, bounds[1:])):
            continue
        halves = [x for a, b in zip(bounds, bounds[1:]) for x in (a, (a + b) // 2)] + [bounds[-1]]
        for placement in options.placements:
            for recompute in options.recompute:
                variants.append(Candidate(bounds=tuple(halves), replicas=replicas * 2, microbatch_size=microbatch_size,
                                          schedule="interleaved", recompute=recompute, placement=placement, chunks=2))
    return variants


def dapple_planner(scenario: Scenario, options: PlannerOptions, progress=None) -> PlannerResult:
    """DAPPLE's planner: DP over partitions and replica counts, then the shared settling rounds."""
    started = time.perf_counter()
    tables = CostTables(scenario)
    cluster = scenario.cluster
    cuts = segment_cuts(tables)
    max_stages = min(options.max_stages or len(cuts) - 1, len(cuts) - 1, cluster.num_devices)
    found = []
    gbs = scenario.training.global_batch_size
    choices = sorted(_replica_choices(cluster.num_devices), key=len)
    uniform, general = [c for c in choices if len(c) == 1], [c for c in choices if len(c) > 1]
    bounds_of: dict[int, float] = {}
    for microbatch_size in microbatch_sizes(gbs, options):
        # with more than twice as many stages as micro-batches most stages idle at any time
        stages = min(max_stages, 2 * (gbs // microbatch_size))
        bounds_of[microbatch_size] = math.inf
        for replica_set in uniform:  # DP x PP grids first: cheap, and they bound the rest
            plans = partitions(tables, cuts, cluster.num_devices, microbatch_size, gbs // microbatch_size,
                               replica_set, stages, KEEP_PER_BATCH, bound=bounds_of[microbatch_size])
            found += [(score, b, r, microbatch_size) for score, b, r in plans]
            if plans:
                bounds_of[microbatch_size] = min(bounds_of[microbatch_size], plans[0][0] * (1 + 3 * SLACK))
    # uneven replicas for the micro-batch sizes whose grids look best
    for microbatch_size in sorted(bounds_of, key=lambda m: (bounds_of[m], m))[:UNEVEN_BATCHES]:
        stages = min(max_stages, 2 * (gbs // microbatch_size))
        for replica_set in general:
            plans = partitions(tables, cuts, cluster.num_devices, microbatch_size, gbs // microbatch_size,
                               replica_set, stages, KEEP_PER_BATCH, bound=bounds_of[microbatch_size])
            found += [(score, b, r, microbatch_size) for score, b, r in plans]
    found.sort(key=lambda item: (item[0], len(item[2])))
    candidates = [
        Candidate(bounds=bounds, replicas=replicas, microbatch_size=microbatch_size, schedule=name, params=params,
                  recompute=recompute, placement=placement)
        for _, bounds, replicas, microbatch_size in found[:POOL]
        for name, params in options.schedules
        for placement in options.placements
        for recompute in options.recompute
    ]
    if options.interleaved:
        candidates += _interleaved(found[:POOL], gbs, options)
    return settle("dapple", scenario, candidates, options, started=started, progress=progress)
