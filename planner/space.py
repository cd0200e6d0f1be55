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
* the schedule (``gpipe``, ``dapple`` with either warm-up policy, ``interleaved``) and
  whether to recompute activations.

``to_scenario`` turns a candidate into a checked plan; ``planner.evaluation`` replays it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sim.errors import DappleError
from sim.parallelism import Recompute
from sim.plan import PlanSpec, StageSpec
from sim.schedule.policy import DapplePolicy
from sim.input.scenario import Scenario
from sim.specs import ClusterSpec, TrainingSpec

__all__ = [
    "PLACEMENTS",
    "SCHEDULES",
    "Candidate",
    "PlannerOptions",
    "microbatch_sizes",
    "place",
    "to_scenario",
]

PLACEMENTS = ("fresh", "append", "scatter")
"""DAPPLE's device placement policies (§4.2)."""

FAST_BUDGET_OPS = 250_000
"""Actions the fast path replays beyond ``fast_top`` by default: on a 2-core machine about what
half a second of replays used to buy, for the 16-GPU paper scenarios (``benchmarks/planner_bench.py``)."""

SCHEDULES = (("dapple", ()), ("dapple", (("policy", DapplePolicy.COMM_HEAVY.value),)), ("gpipe", ()))
"""(schedule, parameters) the planner tries by default."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannerOptions:
    """What a search may choose; narrower options search faster."""

    schedules: tuple[tuple[str, tuple], ...] = SCHEDULES
    """(name, sorted parameter pairs) of the schedules to try."""
    placements: tuple[str, ...] = PLACEMENTS
    """Placement policies to try."""
    interleaved: bool = True
    """Also try Megatron's interleaved schedule (two chunks per device set) on uniform plans."""
    recompute: tuple[bool, ...] = (False, True)
    """Recompute settings to try (True only matters when memory is tight)."""
    microbatch_sizes: tuple[int, ...] | None = None
    """Micro-batch sizes to try; None: divisors of the global batch giving 1 to 64 micro-batches."""
    max_stages: int | None = None
    """Most pipeline stages; None: up to the number of layers and devices."""
    engine_top: int = 3
    """Candidates the SimPy engine settles after the fast path."""
    fast_top: int = 8
    """Candidates the fast path scores after the analytic model, at least."""
    fast_budget_ops: int = FAST_BUDGET_OPS
    """Beyond ``fast_top``, keep scoring with the fast path until its replays have run this many
    actions (ops of every device class): a count of work, so the answer is the same on any
    machine and under any load."""
    fast_max: int = 200
    """Candidates the fast path scores at most."""


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
    recompute: bool = False
    placement: str = "append"
    chunks: int = 1
    """Model chunks per device set (``interleaved``): stage s runs on the devices of stage
    s mod (stages / chunks)."""

    @property
    def num_stages(self) -> int:
        return len(self.replicas)

    def devices(self, cluster: ClusterSpec) -> tuple[tuple[int, ...], ...]:
        """Device ids of every stage: placed device sets, reused by later chunks."""
        sets = self.num_stages // self.chunks
        groups = place(self.replicas[:sets], cluster, self.placement)
        return tuple(groups[s % sets] for s in range(self.num_stages))

    def describe(self) -> str:
        """``layers [0, 27) × 8 | layers [27, 53) × 8``: half-open ranges, as plan files and
        scenarios write a stage's ``layers: [0, 27]`` (chunks of one device set are marked ``@k``)."""
        sets = self.num_stages // self.chunks
        return " | ".join(
            f"layers [{a}, {b}) × {r}" + (f" @{s % sets}" if self.chunks > 1 else "")
            for s, (a, b, r) in enumerate(zip(self.bounds, self.bounds[1:], self.replicas))
        )


def microbatch_sizes(global_batch_size: int, options: PlannerOptions, max_microbatches: int = 64) -> tuple[int, ...]:
    """Micro-batch sizes to try: divisors of the global batch, 1 to ``max_microbatches`` micro-batches."""
    if options.microbatch_sizes is not None:
        return tuple(m for m in options.microbatch_sizes if global_batch_size % m == 0)
    return tuple(
        d for d in range(1, global_batch_size + 1)
        if global_batch_size % d == 0 and global_batch_size // d <= max_microbatches
    )


def place(replicas: tuple[int, ...], cluster: ClusterSpec, policy: str) -> tuple[tuple[int, ...], ...]:
    """Device ids of every stage under a placement policy (stages placed in order)."""
    free = [list(range(n * cluster.devices_per_node, (n + 1) * cluster.devices_per_node)) for n in range(cluster.nodes)]
    if sum(replicas) > cluster.num_devices:
        raise DappleError(f"{sum(replicas)} replicas need more than the cluster's {cluster.num_devices} devices")
    placed = []
    for count in replicas:
        if policy == "scatter":
            devices = _scatter(free, count)
        else:
            devices = _fill(free, count, cluster.devices_per_node, fresh=policy == "fresh")
        placed.append(tuple(sorted(devices)))
    return tuple(placed)


def _fill(free: list[list[int]], count: int, per_node: int, *, fresh: bool) -> list[int]:
    """Fresh First takes whole unused servers first; Append First the most used server first."""
    def order(node: int):
        used = per_node - len(free[node])
        return (used > 0, node) if fresh else (-(used > 0) * used, node)

    taken: list[int] = []
    while len(taken) < count:
        nodes = sorted((n for n in range(len(free)) if free[n]), key=order)
        node = nodes[0]
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
    """``scenario`` with ``candidate`` as its plan and micro-batch size (checked)."""
    from sim.plan import check_plan
    from sim.schedule.plan_schedule import dapple_stage_policies, schedule_for_plan

    groups = candidate.devices(scenario.cluster)
    stages = tuple(
        StageSpec(layers=(a, b), devices=devices)
        for a, b, devices in zip(candidate.bounds, candidate.bounds[1:], groups)
    )
    plan = PlanSpec(stages=stages, schedule=candidate.schedule, schedule_params=candidate.params,
                    recompute=Recompute.of(candidate.recompute))
    training = TrainingSpec(global_batch_size=scenario.training.global_batch_size,
                            microbatch_size=candidate.microbatch_size)
    check_plan(plan, num_layers=scenario.model.num_layers, num_devices=scenario.cluster.num_devices)
    schedule_for_plan(plan, training.num_microbatches,
                      stage_policies=dapple_stage_policies(plan, scenario.model, scenario.cluster, training))
    return replace(scenario, plan=plan, training=training)
