"""A resolved plan: what a plan means on one model, cluster and training set-up, built once.

A plan (``sim.core.plan.PlanSpec``) says which layers run where and names a schedule; what it
*means* depends on the model, the cluster and the micro-batches. Everything that reads a plan
needs the same few things derived from it, and they are derived here, once, by
:func:`resolve_plan`, in this order (each step needs the one before):

1. one device's share of every layer (``sim.models.shard_model`` with the plan's tensor and
   context degrees);
2. what each stage costs a device on each slice of a micro-batch its replicas process
   (``sim.cost.compute.stage_cost``: the stage's recompute mode, its data-parallel group's
   size and sharding, and the link a tied embedding's gradient crosses,
   ``sim.cost.links.embedding_group_link``). A micro-batch splits over a stage's replicas like
   ``torch.tensor_split`` (``sim.cost.split.split_samples``), so a stage has at most two
   distinct slices; the first replica's is the largest;
3. the warm-up policy K_i that ``policy: auto`` chooses per stage, from those costs on the
   first replica's slice (``sim.schedule.plan_schedule.dapple_stage_policies``; Fan et al.,
   PPoPP'21, §3.2);
4. the compute schedule IR (``sim.schedule.plan_schedule.schedule_for_plan``, or the plan's
   hand-written file) and the lowered IR, with its sends, receives and gradient reductions
   (``sim.schedule.passes.lower``).

The scenario reader resolves a plan to check that its schedule runs and keeps the result
(``sim.input.scenario.Scenario.resolved``); the compiler, the planner's memory count and
the runtime read it from there, so a planner candidate that the fast path, the memory check
and the SimPy engine all score is resolved once.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.model_spec import ModelSpec
from sim.core.plan import PlanSpec
from sim.core.specs import ClusterSpec
from sim.core.training import TrainingSpec
from sim.cost.compute import StageCost, stage_cost
from sim.cost.links import embedding_group_link
from sim.cost.memory import accumulates_unsharded
from sim.cost.split import split_samples
from sim.models import shard_model
from sim.models.mtp import table_on_one_device
from sim.schedule.ir import Schedule
from sim.schedule.passes import lower
from sim.schedule.plan_schedule import dapple_stage_policies, schedule_for_plan

__all__ = ["ResolvedPlan", "resolve_plan"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ResolvedPlan:
    """A plan with everything derived from it on one model, cluster and training set-up."""

    plan: PlanSpec
    """The plan resolved."""
    num_microbatches: int
    """Micro-batches per iteration (``TrainingSpec.num_microbatches``) the schedules run."""
    model: ModelSpec
    """One device's share of every layer (``sim.models.shard_model(model, plan.shard)``)."""
    costs: tuple[tuple[StageCost, ...], ...]
    """Per stage, its cost to one device for each distinct slice of a micro-batch its replicas
    process, the first replica's (the largest) first."""
    stage_policies: tuple[str, ...] | None
    """The warm-up policy ``policy: auto`` chose per stage (``s-i`` or ``2(s-i)-1``); None when
    the plan's policy is not ``auto``."""
    schedule: Schedule
    """The compute schedule IR (already lowered when the plan's schedule file is)."""
    lowered: Schedule
    """``schedule`` with its sends, receives and gradient reductions (``sim.schedule.passes.lower``)."""

    @property
    def stage_costs(self) -> tuple[StageCost, ...]:
        """Each stage's cost on its first replica's slice (the largest)."""
        return tuple(costs[0] for costs in self.costs)

    def stage_cost(self, stage: int, samples: int) -> StageCost:
        """Stage ``stage``'s cost to a device whose replica processes ``samples`` samples of each
        micro-batch (one of the stage's slices)."""
        for cost in self.costs[stage]:
            if cost.samples == samples:
                return cost
        raise KeyError(f"stage {stage} has no replica with {samples} samples per micro-batch; its slices: "
                       f"{[cost.samples for cost in self.costs[stage]]}")


def resolve_plan(plan: PlanSpec, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> ResolvedPlan:
    """Resolve ``plan`` on ``model`` (whole, not sharded), ``cluster`` and ``training`` (see the
    module docstring); raises ``ScheduleError`` when its schedule cannot be generated."""
    part = shard_model(model, plan.shard)
    if sorted(plan.stages[0].devices) == sorted(plan.stages[-1].devices):
        part = table_on_one_device(part)  # no second copy of the token table for the mtp layer
    tied = embedding_group_link(plan, cluster)
    costs = []
    whole = accumulates_unsharded(plan.sharding, plan.fsdp, training.num_microbatches)
    for s, stage in enumerate(plan.stages):
        slices = sorted(set(split_samples(training.microbatch_size, len(plan.replicas(s)))), reverse=True)
        data = len(plan.gradient_groups(s)[0])
        costs.append(tuple(stage_cost(part, cluster.device, *stage.layers, n, recompute=plan.recompute,
                                      data_parallel=data, sharding=plan.sharding, tied_link=tied,
                                      accumulate_unsharded=whole,
                                      expert_data_parallel=len(plan.expert_data_groups(s)[0]),
                                      num_microbatches=training.num_microbatches,
                                      fp32_shards=plan.fsdp.fp32_shards)
                           for n in slices))
    first = [stage_costs[0] for stage_costs in costs]
    policies = dapple_stage_policies(plan, part, cluster, training, first)
    schedule = schedule_for_plan(plan, training.num_microbatches, stage_policies=policies)
    after_flush = plan.overlap.reduce_after_flush and not plan.overlap.grad_reduce  # buckets: during the backward
    return ResolvedPlan(plan=plan, num_microbatches=training.num_microbatches, model=part, costs=tuple(costs),
                        stage_policies=policies, schedule=schedule,
                        lowered=schedule if schedule.is_lowered else lower(schedule, reduce_after_flush=after_flush,
                                                                            paired_exchange=plan.overlap.paired_exchange))
