"""The search space: what a plan can choose, and how a choice becomes a checked plan.

A *candidate* is a point of DAPPLE's space (Fan et al., PPoPP'21, §4):

* the stage boundaries (contiguous layer ranges, uneven allowed);
* the replica count of every stage (uneven allowed: DAPPLE's "15:1" plans);
* a placement policy that turns replica counts into device ids (§4.2):
  ``fresh`` (Fresh First: a stage takes whole unused servers first), ``append`` (Append
  First: fill the partly used server first), ``scatter`` (Scatter First: spread a stage's
  replicas over the servers, one device per server in turn). Placement decides which
  transfers and all-reduces stay on NVLink and which cross the network;
* the micro-batch size (hence the number of micro-batches, global batch / size);
* the schedule (``gpipe``, ``dapple`` with either warm-up policy, ``zb-h1``, ``interleaved``
  with its chunk count);

and the dimensions of the parallelism issue's 4D plans (``sim.core.plan.PlanSpec``):

* the tensor-parallel degree t (with Megatron's sequence parallelism whenever t > 1) and the
  context-parallel degree c: every data-parallel replica of a stage is a *unit* of t·c
  consecutive devices, placed as one (``place`` places units; with t·c dividing the server
  size a unit never crosses a server, so tensor parallelism stays on NVLink, as Megatron-LM
  requires of it);
* for a model with experts, the expert-parallel degree EP (``plan.expert_parallel``): an MoE
  block's routed experts split over EP devices of a stage, which Megatron-Core folds out of the
  stage's t·c·replicas devices (``sim.core.plan.PlanSpec.expert_groups``), so EP divides both the
  expert count and the stage's devices (``planner.search.layouts``); the expert-tensor degree
  stays 1 (each expert whole on its device);
* the data-parallel sharding (``none``/``optimizer``/``gradients``/``full``: ZeRO-1/2/3) and
  the recompute mode (``none``/``selective``/``full``).

``to_scenario`` turns a candidate into a checked, resolved plan; ``planner.search.evaluation`` replays it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from sim.core.errors import DappleError
from sim.core.parallelism import Recompute, Sharding
from sim.core.plan import PlanSpec, StageSpec, check_plan
from sim.core.specs import ClusterSpec
from sim.core.training import TrainingSpec
from sim.input.scenario import Scenario
from sim.models.mtp import check_mtp_stage
from sim.schedule.generators import V_SCHEDULES
from sim.schedule.policy import DapplePolicy

__all__ = [
    "PLACEMENTS",
    "REPLICA_FIRST",
    "SCHEDULES",
    "Candidate",
    "PlannerOptions",
    "microbatch_sizes",
    "place",
    "placements_for",
    "restrict_cluster",
    "to_scenario",
    "unit_count",
]

PLACEMENTS = ("fresh", "append", "scatter")
"""DAPPLE's device placement policies (§4.2)."""

REPLICA_FIRST = "replica"
"""A placement for fabrics: each data-parallel replica's stages on consecutive units (stage s of
replica r on unit r·S + s), so a pipeline stays low in the tiers and data parallelism is the
outermost dimension, the one that crosses the top tier (Llama 3, Dubey et al. 2024, §3.3.2: the
[TP, CP, PP, DP] order, "DP ... can tolerate longer network latency"). Uniform replica counts
only (others are placed ``fresh``); tried beside ``placements`` on a ``cluster.fabric`` (``placements_for``)."""

FAST_BUDGET_OPS = 40_000
"""Actions (of every device) the fast path's replays may compile beyond ``fast_top`` by default:
a few dozen replays of the 16-GPU paper scenarios, a handful at a thousand GPUs
(``benchmarks/planner_bench.py``)."""

MAX_CANDIDATES = 50_000
"""Complete candidates one planner scores by default: a few thousand on the 16-GPU paper
scenarios, tens of thousands at 16,384 GPUs (``benchmarks/planner_bench.py``)."""

MAX_PARTIALS = 2_000_000
"""Partial plans one planner's dynamic programme extends by default (about 0.5 million on the
default BERT-48 on 16 GPUs)."""

SCHEDULES = (("dapple", ()), ("dapple", (("policy", DapplePolicy.COMM_HEAVY.value),)), ("gpipe", ()),
             ("zb-h1", ()))
"""(schedule, parameters) the planner tries by default (``interleaved`` comes from ``chunks``)."""

RECOMPUTE = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
SHARDING = (Sharding.NONE, Sharding.OPTIMIZER, Sharding.GRADIENTS, Sharding.FULL)
CONTEXT_PARALLEL_FROM = 16384
"""Sequences at least this long also try context parallelism (shorter ones gain nothing from it
that tensor parallelism does not give: Megatron-Core enables it for long-context training)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannerOptions:
    """What a search may choose; narrower options search faster."""

    schedules: tuple[tuple[str, tuple], ...] = SCHEDULES
    """(name, sorted parameter pairs) of the schedules to try."""
    placements: tuple[str, ...] = PLACEMENTS
    """Placement policies to try."""
    interleaved: bool = True
    """Also try Megatron's interleaved schedule on uniform plans (``chunks`` model chunks per device set)."""
    chunks: tuple[int, ...] = (2, 3, 4)
    """Model chunks per device set the interleaved schedule tries."""
    recompute: tuple[Recompute | bool, ...] = RECOMPUTE
    """Recompute modes to try (``True``/``False`` read as full/none); the cheapest that fits wins a tie."""
    sharding: tuple[Sharding, ...] = SHARDING
    """Data-parallel sharding modes to try."""
    tensor_parallel: tuple[int, ...] | None = None
    """Tensor-parallel degrees to try; None: every degree the model allows that divides the server."""
    context_parallel: tuple[int, ...] | None = None
    """Context-parallel degrees to try; None: 1, and for sequences of ``CONTEXT_PARALLEL_FROM``
    tokens or more every degree the model allows up to the server size."""
    expert_parallel: tuple[int, ...] | None = None
    """Expert-parallel degrees to try on a model with experts; None: every divisor of the expert
    count that fits inside a server (``planner.search.layouts.expert_degrees``). A dense model
    takes 1 only."""
    microbatch_sizes: tuple[int, ...] | None = None
    """Micro-batch sizes to try; None: divisors of the global batch giving 1 to ``max_microbatches`` micro-batches."""
    max_microbatches: int = 128
    """Most micro-batches per iteration the default micro-batch sizes give."""
    max_stages: int | None = None
    """Most pipeline stages; None: up to the number of layers and devices."""
    engine_top: int = 3
    """Candidates the SimPy engine settles after the fast path."""
    fast_top: int = 8
    """Candidates the fast path scores after the analytic model, at least."""
    fast_budget_ops: int = FAST_BUDGET_OPS
    """Beyond ``fast_top``, keep scoring with the fast path until its replays have compiled this
    many actions (ops of every device): a count of work, so the answer is the same on any
    machine and under any load."""
    fast_max: int = 64
    """Candidates the fast path scores at most."""
    max_candidates: int = MAX_CANDIDATES
    """Complete candidates a planner may score with the closed forms; past it, it settles what it
    has and says so (``planner.search.budget.Spend.reached``)."""
    max_partials: int = MAX_PARTIALS
    """Partial plans a planner's dynamic programme may extend (DAPPLE's Pareto extensions,
    PipeDream's cells; the points the exhaustive search bounds); past it, the planner settles
    the plans found so far and says so."""
    max_engine_replays: int = 5_000
    """SimPy replays one planner may make: the exhaustive search's bound (the others replay a
    few, ``engine_top`` and their variants); past it, the best so far, said."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One point of the space."""

    bounds: tuple[int, ...]
    """Layer boundaries, ``(0, b1, ..., num_layers)``: stage s owns ``[bounds[s], bounds[s+1])``."""
    replicas: tuple[int, ...]
    """Devices per stage."""
    microbatch_size: int
    schedule: str = "dapple"
    params: tuple = ()
    recompute: Recompute = Recompute.NONE
    """What stages keep for their backward (``True``/``False`` are read as full/none)."""
    placement: str = "append"
    chunks: int = 1
    """Model chunks per device set (``interleaved``): stage s runs on the devices of stage
    s mod (stages / chunks)."""
    tensor_parallel: int = 1
    context_parallel: int = 1
    expert_parallel: int = 1
    """EP: devices an MoE block's routed experts split over, folded out of each stage's
    t·c·replicas devices (``PlanSpec.expert_groups``); 1 for a dense model."""
    sharding: Sharding = Sharding.NONE
    on_devices: int | None = None
    """The plan uses only the cluster's first ``on_devices`` devices (whole servers, or GPUs of a
    one-server cluster; ``planner.search.subsets``), the rest idle; None: placed on all of them."""

    def __post_init__(self) -> None:
        if not isinstance(self.recompute, Recompute):
            object.__setattr__(self, "recompute", Recompute.of(self.recompute))

    @property
    def num_stages(self) -> int:
        return len(self.replicas)

    @property
    def unit(self) -> int:
        """Devices of one data-parallel replica: ``tensor_parallel × context_parallel``."""
        return self.tensor_parallel * self.context_parallel

    @property
    def sequence_parallel(self) -> bool:
        """Megatron's sequence parallelism, on whenever tensor parallelism is: it needs no more
        communication and cuts the activations the tensor group repeats (Korthikanti et al. 2022, §4.2.2)."""
        return self.tensor_parallel > 1

    def devices(self, cluster: ClusterSpec) -> tuple[tuple[int, ...], ...]:
        """Device ids of every stage: placed device sets, reused by later chunks (chunk s on set
        s mod S; under a V-shaped schedule chunk s < S on set s and chunk 2S−1−s on set s)."""
        sets = self.num_stages // self.chunks
        if self.on_devices is not None:
            cluster = restrict_cluster(cluster, self.on_devices)
        groups = place(self.replicas[:sets], cluster, self.placement, unit=self.unit)
        if self.schedule in V_SCHEDULES:
            return tuple(groups[s if s < sets else 2 * sets - 1 - s] for s in range(self.num_stages))
        return tuple(groups[s % sets] for s in range(self.num_stages))

    def layout(self) -> str:
        """``tensor 8 · sequence parallel · sharding optimizer · recompute selective``: what is not
        plain data × pipeline parallelism (empty for a DAPPLE plan of its own space)."""
        parts = []
        if self.tensor_parallel > 1:
            parts += [f"tensor {self.tensor_parallel}", "sequence parallel"]
        if self.context_parallel > 1:
            parts.append(f"context {self.context_parallel}")
        if self.expert_parallel > 1:
            parts.append(f"expert {self.expert_parallel}")
        if self.sharding is not Sharding.NONE:
            parts.append(f"sharding {self.sharding.value}")
        if self.recompute is not Recompute.NONE:
            parts.append(f"recompute {self.recompute.value}")
        return " · ".join(parts)

    def describe(self) -> str:
        """``layers [0, 27) × 8 | layers [27, 53) × 8``: half-open ranges, as plan files and
        scenarios write a stage's ``layers: [0, 27]``. Interleaved plans with one replica count
        are written ``8 device sets × 2, 3 chunks each: layers [0, 6) [6, 8) ...`` (chunk k on
        device set k mod 8); others mark each chunk's device set ``@k``."""
        sets = self.num_stages // self.chunks
        if self.chunks > 1 and len(set(self.replicas)) == 1:
            ranges = " ".join(f"[{a}, {b})" for a, b in zip(self.bounds, self.bounds[1:]))
            return f"{sets} device sets × {self.replicas[0]}, {self.chunks} chunks each: layers {ranges}"
        return " | ".join(
            f"layers [{a}, {b}) × {r}" + (f" @{s % sets}" if self.chunks > 1 else "")
            for s, (a, b, r) in enumerate(zip(self.bounds, self.bounds[1:], self.replicas))
        )


def restrict_cluster(cluster: ClusterSpec, devices: int) -> ClusterSpec:
    """``cluster``'s first ``devices`` devices as a cluster of their own: whole servers, or the
    first GPUs of a one-server cluster (their links and devices are the cluster's)."""
    if devices == cluster.num_devices:
        return cluster
    per_node = cluster.devices_per_node
    if cluster.nodes > 1 and devices % per_node == 0 and 0 < devices < cluster.num_devices:
        return replace(cluster, nodes=devices // per_node)
    if cluster.nodes == 1 and 0 < devices < per_node:
        return replace(cluster, devices_per_node=devices, nics_per_node=min(cluster.nics_per_node, devices))
    raise DappleError(f"a plan on {devices} of {cluster.num_devices} devices: give whole servers of "
                      f"{per_node} GPUs, or fewer GPUs of one server")


def microbatch_sizes(global_batch_size: int, options: PlannerOptions) -> tuple[int, ...]:
    """Micro-batch sizes to try: divisors of the global batch, 1 to ``options.max_microbatches`` micro-batches."""
    if options.microbatch_sizes is not None:
        return tuple(m for m in options.microbatch_sizes if global_batch_size % m == 0)
    return tuple(
        d for d in range(1, global_batch_size + 1)
        if global_batch_size % d == 0 and global_batch_size // d <= options.max_microbatches
    )


def unit_grid(cluster: ClusterSpec, unit: int) -> tuple[int, int]:
    """(servers, units per server) of the cluster seen in units of ``unit`` consecutive devices:
    a unit that spans servers (t·c above the server size) makes one "server" of those it spans."""
    per_node = cluster.devices_per_node
    if unit <= per_node:
        return cluster.nodes, per_node // unit
    return cluster.num_devices // unit, 1


def placements_for(cluster: ClusterSpec, options: PlannerOptions) -> tuple[str, ...]:
    """The placements a search tries: ``options.placements``, and ``REPLICA_FIRST`` on a fabric."""
    if cluster.fabric is None or REPLICA_FIRST in options.placements:
        return options.placements
    return (*options.placements, REPLICA_FIRST)


def unit_count(cluster: ClusterSpec, unit: int) -> int:
    """Units of ``unit`` devices ``place`` can lay out: every server's whole units (``unit_grid``)."""
    servers, per_node = unit_grid(cluster, unit)
    return servers * per_node


@lru_cache(maxsize=4096)
def place(replicas: tuple[int, ...], cluster: ClusterSpec, policy: str, *, unit: int = 1) -> tuple[tuple[int, ...], ...]:
    """Device ids of every stage under a placement policy (stages placed in order; cached: the
    candidates of one partition share it).

    ``replicas`` counts units of ``unit`` consecutive devices (a replica's tensor- and
    context-parallel group); each is placed whole, so unit k holds devices ``k·unit`` to
    ``(k+1)·unit − 1``. A unit that does not divide the server (TP 16 in a 72-GPU NVL72 domain)
    never straddles two: unit j of server n starts at its device ``j·unit``, the last devices idle
    (Megatron-LM keeps tensor parallelism inside the NVLink domain; Shoeybi et al. 2019, §5).
    """
    nodes, per_node = unit_grid(cluster, unit)
    stride = cluster.devices_per_node if unit <= cluster.devices_per_node else unit
    free = [list(range(n * per_node, (n + 1) * per_node)) for n in range(nodes)]
    if sum(replicas) > nodes * per_node:
        raise DappleError(f"{sum(replicas) * unit} devices are more than the cluster's {cluster.num_devices}")
    placed = []
    if policy == REPLICA_FIRST and len(set(replicas)) == 1:  # stage s of replica r on unit r·S + s
        S = len(replicas)
        chosen = [[r * S + s for r in range(replicas[0])] for s in range(S)]
    else:
        chosen = None
    for count in replicas:
        if chosen is not None:
            units = chosen[len(placed)]
        elif policy == "scatter":
            units = _scatter(free, count)
        else:
            units = _fill(free, count, per_node, fresh=policy in ("fresh", REPLICA_FIRST))
        firsts = ((u // per_node) * stride + (u % per_node) * unit for u in sorted(units))
        placed.append(tuple(d for first in firsts for d in range(first, first + unit)))
    return tuple(placed)


def _fill(free: list[list[int]], count: int, per_node: int, *, fresh: bool) -> list[int]:
    """Fresh First takes whole unused servers first; Append First the most used server first.

    One ordering is enough: each take either empties a server or ends the stage's count.
    """
    def order(node: int):
        used = per_node - len(free[node])
        return (used > 0, node) if fresh else (-(used > 0) * used, node)

    taken: list[int] = []
    for node in sorted((n for n in range(len(free)) if free[n]), key=order):
        if len(taken) == count:
            break
        take = min(count - len(taken), len(free[node]))
        taken += free[node][:take]
        del free[node][:take]
    return taken


def _scatter(free: list[list[int]], count: int) -> list[int]:
    """One device per server in turn, over the servers with free devices."""
    taken: list[int] = []
    while len(taken) < count:
        for node in range(len(free)):
            if free[node] and len(taken) < count:
                taken.append(free[node].pop(0))
    return taken


def to_scenario(scenario: Scenario, candidate: Candidate) -> Scenario:
    """``scenario`` with ``candidate`` as its plan and micro-batch size, checked and resolved
    (``Scenario.resolved``: its schedule, lowered schedule and stage costs, built here once for
    the memory count and every engine that scores it). Raises ``DappleError`` when the
    candidate is not a plan of this model on this cluster, ``ScheduleError`` when its schedule
    cannot run it."""
    groups = candidate.devices(scenario.cluster)
    stages = tuple(
        StageSpec(layers=(a, b), devices=devices)
        for a, b, devices in zip(candidate.bounds, candidate.bounds[1:], groups)
    )
    plan = PlanSpec(stages=stages, schedule=candidate.schedule, schedule_params=candidate.params,
                    recompute=candidate.recompute, tensor_parallel=candidate.tensor_parallel,
                    sequence_parallel=candidate.sequence_parallel, context_parallel=candidate.context_parallel,
                    sharding=candidate.sharding, overlap=scenario.overlap, fsdp=scenario.fsdp,
                    expert_parallel=candidate.expert_parallel)
    training = TrainingSpec(global_batch_size=scenario.training.global_batch_size,
                            microbatch_size=candidate.microbatch_size)
    check_plan(plan, num_layers=scenario.model.num_layers, num_devices=scenario.cluster.num_devices)
    check_mtp_stage(plan, scenario.model)
    planned = replace(scenario, plan=plan, training=training)  # a new plan: resolved afresh, never the old one's
    _ = planned.resolved  # resolve now, so that a schedule that cannot run is this call's error
    return planned
