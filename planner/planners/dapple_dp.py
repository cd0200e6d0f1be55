"""DAPPLE's dynamic programme over layer prefixes and device counts (``planner.planners.dapple`` runs it).

DAPPLE (Fan et al., PPoPP'21, §4) chooses stage boundaries and per-stage replica counts by
dynamic programming: a partial plan covers the first ``j`` layers on the first ``g``
devices, and a new stage extends it by layers ``[j, j')`` on ``r`` more devices. Its value
is the pipeline latency model: with stages' forward and backward times ``F_s``, ``B_s``,
the transfer time ``C_s`` of the cut in front of stage s and all-reduce ``AR_s``,

    L = max over stages and cuts u of ( Σ_{u'<u} (F_u' + B_u') + M·busy_u ) + max_s (AR_s − Σ_{s'<s} B_s'),

the pivot form of warm-up + steady phase + ending phase (``sim.cost.closed_forms.dapple_latency_s``)
in which each cut is a pipeline stage of its own (``F = B = C``, busy ``C`` per micro-batch
in each direction): transfers overlap compute, so a cut slows the steady phase only when
it is slower than the stages. ``sim.cost.closed_forms.extend_pipeline`` computes L one stage at a
time, here and in ``planner.search.ranking``'s scores.
L is not a sum, so each DP state keeps the Pareto set of partial plans over the quantities
that decide how extensions fare: the running maximum, the running sum ``Σ(F+B)``, the
ending so far (a stage's all-reduce starts when the drain of backwards reaches it, so it
adds ``AR_s − Σ_{s'<s} B_s'``, DAPPLE's ``T_e``) and the drain so far. Pruning dominated partial plans is then exact for
this model; because the model is only an estimate, a plan is pruned only when another is
better by ``SLACK`` in every quantity, and the set is capped at ``PARETO_CAP`` per state.

During the DP a stage's devices are the next ``r`` in order (Append First), which fixes
whether a cut crosses servers; the best partitions are then re-placed under all three
placement policies, every schedule and recompute setting, and ranked by
``planner.search.ranking.settle`` (analytic, fast path, engine).

Memory is part of the DP, so a plan that fits is never pruned for one that does not: a
stage's devices hold its model states and the activations of the micro-batches alive on it,
min(M, S − i) under DAPPLE's early backward (K_i = S − i, the least of the schedules), which
depends on the number of stages S that is not known yet. Each partial plan therefore
carries the most stages its stages allow (stage i with room for k micro-batches allows
S ≤ i + k), a sixth Pareto quantity; an extension past it is dropped. The check is
optimistic (the most sharding the options allow, no receive buffers), so it only drops what
cannot fit; ``planner.search.memory`` counts each candidate exactly before it is replayed.

Layers are grouped into at most ``MAX_SEGMENTS`` segments of similar compute for long
profiles. Clusters above ``UNIFORM_ABOVE`` units use the same replica count for every
stage (DP x PP grids), which keeps the search linear in the cluster size.

The work is counted: every partial plan extended by a stage is one *partial* in the
search's ``planner.search.budget.Spend``, and a programme that reaches its budget stops and
returns the complete plans it has.
"""

from __future__ import annotations

import math

from planner.search.budget import Spend
from planner.search.costs import CostTables
from sim.core.parallelism import Recompute, Sharding
from sim.cost.closed_forms import PIPELINE_START, extend_pipeline

__all__ = ["EVERY_COUNT_UP_TO", "MAX_SEGMENTS", "PARETO_CAP", "SLACK", "UNIFORM_ABOVE", "partitions",
           "replica_choices", "segment_cuts"]

MAX_SEGMENTS = 24
"""Most layer groups the DP cuts between (long profiles are grouped by compute)."""
PARETO_CAP = 6
"""Partial plans kept per DP state."""
SLACK = 0.03
"""A partial plan is dropped only when another beats it by this fraction in every quantity:
the latency model is an estimate, so near-ties survive for the replays to separate."""
UNIFORM_ABOVE = 64
"""Above this many units, stages share one replica count."""
EVERY_COUNT_UP_TO = 16
"""Up to this many units a stage may have any replica count; above, only counts that divide them."""


def segment_cuts(tables: CostTables, max_segments: int = MAX_SEGMENTS) -> list[int]:
    """Layer indices the DP may cut at: all of them, or ones that split compute evenly; never one
    of ``ModelSpec.no_cut_at`` (the mtp layer stays with the head, ``sim.models.mtp``)."""
    n, allowed = tables.num_layers, tables.model.cut_points
    if n <= max_segments:
        return list(allowed)
    total = tables.compute_s(0, n, 1)
    weight = [sum(tables.compute_s(0, k, 1)) for k in range(n + 1)]
    whole = sum(total)
    cuts = {0, n}
    for k in range(1, max_segments):
        target = whole * k / max_segments
        cuts.add(min(allowed[1:-1], key=lambda j: (abs(weight[j] - target), j)))
    return sorted(cuts)


def replica_choices(num_units: int, step: int = 1) -> list[tuple[int, ...]]:
    """Replica-count sets to run the DP with: every count (small clusters), and one uniform
    count per run (DP x PP grids), whose best partitions the free DP may rank lower. ``step``:
    only multiples of it (an expert-parallel layout's, ``planner.search.layouts.replica_step``)."""
    uniform = [(r,) for r in range(step, num_units + 1, step) if num_units % r == 0]
    if num_units <= EVERY_COUNT_UP_TO:
        return [tuple(range(step, num_units + 1, step))] + uniform
    if num_units <= UNIFORM_ABOVE:  # uneven, from the counts that divide the cluster (32 + 16 + 16, ...)
        return [tuple(r for (r,) in uniform)] + uniform
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
    *,
    per_node: int | None = None,
    recompute: Recompute = Recompute.NONE,
    memory_sharding: Sharding = Sharding.NONE,
    pressure: list | None = None,
    stage_costs: dict | None = None,
    spend: Spend | None = None,
    max_partials: float = math.inf,
) -> list[tuple[float, tuple[int, ...], tuple[int, ...]]]:
    """The ``keep`` best (score, bounds, replicas) by the latency model, from the Pareto DP.

    ``num_devices`` counts units (``per_node`` of them per server, the cluster's own server
    size by default). Partial plans whose estimate already exceeds ``bound`` are dropped:
    extending a plan never lowers its estimate. A stage must fit in memory with
    ``memory_sharding`` and at least one micro-batch alive, and the stages that follow it
    must not make more alive than it has room for (the module docstring). ``pressure``, if
    given, gets an entry when memory dropped or limited an extension (more recompute could help).

    ``stage_costs`` caches the stages' costs between runs that share the tables, micro-batch
    size, recompute and sharding (the costs do not depend on the replica set). The partial
    plans extended are added to ``spend.partials``; once that reaches ``max_partials`` the
    programme stops, with no complete plan from this run (``spend.reached`` says so).
    """
    dp = _ParetoDP(tables=tables, cuts=cuts, num_devices=num_devices, microbatch_size=microbatch_size,
                   num_microbatches=num_microbatches, replica_set=replica_set, max_stages=max_stages, bound=bound,
                   per_node=per_node or tables.cluster.devices_per_node, recompute=recompute,
                   memory_sharding=memory_sharding, pressure=pressure, stage_costs=stage_costs)
    spend = spend if spend is not None else Spend()
    spent = spend.partials
    # (each cut's frontier is sorted when the programme reaches it, after the cuts before it grew it)
    for ci, g in ((ci, g) for ci in range(dp.last) for g in sorted(dp.frontier[ci])):
        if spent + dp.partials >= max_partials:
            break
        dp.extend(ci, g)
    spend.partials += dp.partials
    if spend.partials >= max_partials:
        spend.reach("partial plans", int(max_partials))
        return []
    return dp.finished(keep)


class _ParetoDP:
    """The state of :func:`partitions`' dynamic programme over (cut index, units used).

    ``frontier[cut index][units used]`` holds the Pareto set of partial plans ending at that
    cut with that many units: ``(PipelineFold, stages, parent key, parent index, replicas,
    most stages)``, where *most stages* is how many stages the plan may still reach before a
    stage's room for live micro-batches runs out.
    """

    def __init__(self, *, tables: CostTables, cuts: list[int], num_devices: int, microbatch_size: int,
                 num_microbatches: int, replica_set: tuple[int, ...], max_stages: int, bound: float,
                 per_node: int, recompute: Recompute, memory_sharding: Sharding, pressure: list | None,
                 stage_costs: dict | None = None) -> None:
        self.tables, self.cuts, self.num_devices = tables, cuts, num_devices
        self.microbatch_size, self.num_microbatches = microbatch_size, num_microbatches
        self.replica_set, self.max_stages, self.bound, self.per_node = replica_set, max_stages, bound, per_node
        self.recompute, self.memory_sharding, self.pressure = recompute, memory_sharding, pressure
        self.exact = len(replica_set) == 1  # a grid (one replica count) uses every unit
        self.capacity = tables.cluster.device.usable_memory_bytes
        self.last = len(cuts) - 1
        self.widest = max(replica_set)
        self.frontier: list[dict[int, list[tuple]]] = [dict() for _ in range(self.last + 1)]
        self.frontier[0][0] = [(PIPELINE_START, 0, None, -1, 0, max_stages)]
        self.stage_cost: dict[tuple, tuple] = {} if stage_costs is None else stage_costs
        self.partials = 0
        """Partial plans extended by a stage so far."""

    def _pressed(self, why) -> None:
        """Note that memory dropped or limited an extension (the first reason is kept)."""
        if self.pressure is not None and not self.pressure:
            self.pressure.append(why)

    def extend(self, ci: int, g: int) -> None:
        """Extend every partial plan ending at cut ``ci`` with ``g`` units by one more stage."""
        records = [(i, rec) for i, rec in enumerate(self.frontier[ci][g]) if rec[1] < min(self.max_stages, rec[5])]
        if not records:
            return
        a, cuts, last, per_node, num_devices = self.cuts[ci], self.cuts, self.last, self.per_node, self.num_devices
        for cj in range(ci + 1, last + 1):
            b = cuts[cj]
            if self.tables.static_bytes(a, b, self.widest, self.memory_sharding) > self.capacity:
                self._pressed((ci, cj))
                break  # longer stages only hold more parameters
            for r in self.replica_set:
                if g + r > num_devices:
                    break
                if self.exact and (num_devices - g - r) > r * (last - cj):
                    continue  # a grid must use every unit: too few cuts left for its stages
                first, final = g // per_node, (g + r - 1) // per_node
                crosses = ci > 0 and (g - 1) // per_node != final
                cost_key = (ci, cj, r, final - first + 1, crosses, ci > 0)
                if cost_key not in self.stage_cost:
                    self.stage_cost[cost_key] = _stage(self.tables, a, b, r, final - first + 1, self.microbatch_size,
                                                       ci > 0, crosses, self.recompute, self.memory_sharding,
                                                       self.capacity)
                self._add(records, cost_key, self.frontier[cj], g + r, (ci, g), r)

    def _add(self, records: list, cost_key: tuple, ending: dict[int, list[tuple]], units: int,
             parent: tuple[int, int], r: int) -> None:
        """Each of ``records`` extended by the stage ``cost_key`` of ``r`` units, into the Pareto
        set ``ending[units]`` of the plans ending at the stage's last cut."""
        f, bk, comm, tail, room = self.stage_cost[cost_key]
        if room < 1:
            self._pressed(cost_key)
            return  # not even one micro-batch's activations fit beside the states
        target = ending.setdefault(units, [])
        M = self.num_microbatches
        self.partials += len(records)
        # (a fold's total_s, lmax_s + ending_s, spelled out on this hot path)
        worst = target[-1][0][0] + target[-1][0][2] if len(target) >= PARETO_CAP else self.bound
        for index, record in records:
            j, most = record[1], record[5]
            if room < M and j + room < most:
                most = j + int(room)
                self._pressed(cost_key)
            if j + 1 > most:
                continue  # its stages after would keep more alive than it holds
            extended = extend_pipeline(record[0], f, bk, comm, tail, M)
            if extended[0] + extended[2] >= worst:
                continue  # the cap would drop it (it cannot dominate a kept plan)
            _insert(target, (extended, j + 1, parent, index, r, most))

    def finished(self, keep: int) -> list[tuple[float, tuple[int, ...], tuple[int, ...]]]:
        """The ``keep`` best complete plans: (score, bounds, replicas), best first."""
        done = []
        for g in sorted(self.frontier[self.last]):
            if self.exact and g != self.num_devices:
                continue
            for index, record in enumerate(self.frontier[self.last][g]):
                bounds, replicas = _trace(self.frontier, self.cuts, (self.last, g), index)
                done.append((record[0].total_s, bounds, replicas))
        done.sort(key=lambda item: (item[0], len(item[2]), item[2]))
        return done[:keep]


def _stage(tables: CostTables, a: int, b: int, r: int, nodes: int, microbatch_size: int, has_input: bool,
           crosses: bool, recompute: Recompute, memory_sharding: Sharding, capacity: float):
    """(forward, backward, transfer of the cut in front, all-reduce + optimizer, micro-batches
    whose activations fit beside the states) of one stage on ``r`` units."""
    samples = CostTables.slice_of(microbatch_size, r)
    f, bk = tables.compute_s(a, b, samples, recompute)
    comm = tables.transfer_s(a, microbatch_size, r, nodes, not crosses) if has_input else 0.0
    # the reduction as the plan overlaps it (the DP times every stage unsharded)
    tail = tables.reduction_tail_s(a, b, samples, recompute, per_node=math.ceil(r / nodes), nodes=nodes) \
        + tables.optimizer_s(a, b)
    stash = tables.stash_bytes(a, b, samples, recompute=recompute)
    free = capacity - tables.static_bytes(a, b, r, memory_sharding)
    room = math.inf if stash <= 0 and free >= 0 else (free / stash if stash > 0 else 0.0)
    return f, bk, comm, tail, room


def _insert(records: list[tuple], entry: tuple) -> None:
    """Add ``entry`` unless dominated; drop what it dominates; keep the ``PARETO_CAP`` best.

    Smaller is better for the running maximum, the fill+drain sum and the ending; a larger
    drain so far and more stages allowed are better (later all-reduces hide behind the drain;
    later stages need the room). ``records`` stays sorted by the latency estimate
    ``lmax + ending``, so its last entry is the one the cap drops.
    """
    keep = 1.0 - SLACK  # a plan must be clearly better to push another out
    lmax, psum, ending, drained = entry[0]
    most = entry[5]
    end_bar = ending - SLACK * abs(ending)
    for record in records:
        o = record[0]
        if o[0] <= lmax * keep and o[1] <= psum * keep and o[2] <= end_bar and o[3] * keep >= drained \
                and record[5] >= most:
            return
    records[:] = [
        record for record in records
        if not (lmax <= (o := record[0])[0] * keep and psum <= o[1] * keep and ending <= o[2] - SLACK * abs(o[2])
                and drained * keep >= o[3] and most >= record[5])
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
        record = frontier[key[0]][key[1]][index]
        replicas.append(record[4])
        key, index = record[2], record[3]
        bounds.append(cuts[key[0]])
    return tuple(reversed(bounds)), tuple(reversed(replicas))
