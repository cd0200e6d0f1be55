"""The schedule of a plan: which generator to run, or the hand-written file to trust.

A plan names its schedule (``dapple`` with a policy, ``interleaved``, ``zb-v``, ...) or a
``schedule_file``. Either way the result is the compute IR whose ranks are the plan's
distinct device sets (``PlanSpec.device_groups``) and whose stages are the plan's stages.
The number of chunks is implied by the plan: for the looped schedules (``interleaved``,
``interleaved-zb``, ``looped-bfs``) stage ``s`` shares devices with stage ``s + R`` for R
device sets, so v = stages / R; the V-shaped ones (``zb-v``, ``dualpipe-v``) have 2R stages,
stage s on device set s and stage 2R−1−s on it too. A ``schedule_file`` is our text form or
torch's pipeline-order CSV (``sim.schedule.torch_csv``), told apart by a ``.csv`` suffix or
by its commas.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sim.core.errors import ScheduleError
from sim.core.model_spec import ModelSpec
from sim.core.plan import PlanSpec
from sim.cost.compute import StageCost
from sim.cost.links import group_link
from sim.schedule.check import check_schedule
from sim.schedule.generators import LOOPED_SCHEDULES, generate
from sim.schedule.ir import Schedule
from sim.schedule.policy import DapplePolicy, choose_dapple_policies
from sim.schedule.text import parse_schedule
from sim.schedule.torch_csv import is_csv, parse_csv

__all__ = ["dapple_stage_policies", "parse_schedule_for_plan", "schedule_for_plan"]


def dapple_stage_policies(plan: PlanSpec, part: ModelSpec, cluster, training,
                          costs: Sequence[StageCost]) -> tuple[str, ...] | None:
    """What ``policy: auto`` decides for each of ``plan``'s stages, or None when the plan's
    policy is not ``auto`` (pass the result to :func:`schedule_for_plan` as ``stage_policies``).

    ``sim.schedule.policy.choose_dapple_policies`` on the plan's costs, as one replica
    spends them on its largest slice of a micro-batch: ``costs[s]`` is stage s's
    ``sim.cost.compute.stage_cost`` on its first replica's slice and ``part`` one device's
    share of the layers (``sim.models.shard_model``), as ``sim.schedule.resolved.resolve_plan``
    builds them:

    - ``compute_s[i]``: stage i's forward plus backward;
    - ``transfer_s[i]``: cut i's round trip, activation and gradient, each
      ``latency + bytes / bandwidth`` of the link between the two stages' devices (intra-node
      when both stages sit on one server, else inter-node), for the larger of the two sides'
      per-device slices; 0 when the two stages share devices;
    - ``max_warmup[i]``: the micro-batches whose stash fits beside the stage's model states in
      a device's usable memory (``DeviceSpec.usable_memory_bytes``).
    """
    if plan.custom_schedule is not None or plan.params.get("policy") != DapplePolicy.AUTO:
        return None
    device, m = cluster.device, training.num_microbatches
    slices = [cost.samples for cost in costs]
    compute, room = [], []
    for cost in costs:
        compute.append(cost.fwd_s + cost.bwd_s)
        free = device.usable_memory_bytes - cost.static_bytes
        room.append(m if cost.stash_bytes <= 0 else max(0, min(m, int(free // cost.stash_bytes))))
    transfer = []
    for s in range(plan.num_stages - 1):
        if plan.stage_ranks[s] == plan.stage_ranks[s + 1]:
            transfer.append(0.0)
            continue
        link = group_link(cluster, plan.stages[s].devices + plan.stages[s + 1].devices)
        nbytes = part.boundary_bytes[plan.stages[s].layers[1]] * max(slices[s], slices[s + 1])
        transfer.append(2 * (link.latency_s + nbytes / link.bandwidth_bytes_per_s) if nbytes else 0.0)
    chosen = choose_dapple_policies(compute_s=compute, transfer_s=transfer, num_microbatches=m, max_warmup=room)
    return tuple(p.value for p in chosen)


def schedule_for_plan(
    plan: PlanSpec, num_microbatches: int, *, stage_policies: Sequence[str] | None = None
) -> Schedule:
    """The compute-only schedule that ``plan`` runs for ``num_microbatches`` micro-batches.

    ``stage_policies`` is what ``policy: auto`` decided for each stage
    (``sim.schedule.policy.choose_dapple_policies`` on the plan's costs); a plan whose policy
    is ``auto`` needs it, any other plan must not give it.
    """
    if plan.custom_schedule is not None:
        return plan.custom_schedule
    num_ranks = len(plan.device_groups)
    params = dict(plan.params)
    if plan.schedule in LOOPED_SCHEDULES:
        params["chunks"] = _looped_chunks(plan, num_ranks, params)
    if params.get("policy") == DapplePolicy.AUTO:
        if stage_policies is None:
            raise ScheduleError(
                f"{plan.schedule}: policy 'auto' picks s-i or 2(s-i)-1 per stage from the plan's costs; "
                "the caller must pass stage_policies (sim.schedule.policy.choose_dapple_policies)"
            )
        params["policy"] = tuple(stage_policies)
    elif stage_policies is not None:
        raise ScheduleError(
            f"{plan.schedule}: stage_policies given, but the plan's policy is "
            f"{params.get('policy', 'none')!r}, not 'auto'"
        )
    return generate(plan.schedule, num_ranks, num_microbatches, **params)


def _looped_chunks(plan: PlanSpec, num_ranks: int, params: dict) -> int:
    chunks = plan.num_stages // num_ranks
    if plan.num_stages % num_ranks:
        raise ScheduleError(
            f"{plan.schedule} needs the same number of chunks on every device set; "
            f"{plan.num_stages} stages over {num_ranks} device sets do not divide"
        )
    if params.get("chunks", chunks) != chunks:
        raise ScheduleError(
            f"chunks: {params['chunks']} given, but the plan's {plan.num_stages} stages over "
            f"{num_ranks} device sets make {chunks}; list {params['chunks'] * num_ranks} stages "
            f"(stage s on device set s mod {num_ranks}) or drop chunks"
        )
    return chunks


def parse_schedule_for_plan(plan: PlanSpec, num_microbatches: int, text: str) -> Schedule:
    """Read a hand-written schedule (text or torch CSV) for ``plan``, check it fits the plan
    and that it runs."""
    name = Path(plan.schedule_file).name if plan.schedule_file else "schedule"
    if is_csv(text, path=plan.schedule_file):
        schedule, line = parse_csv(text, name=name), "row"
    else:
        schedule, line = parse_schedule(text, name=name), "line"
    num_ranks = len(plan.device_groups)
    if schedule.num_ranks != num_ranks:
        raise ScheduleError(
            f"{name} has {schedule.num_ranks} {line}s (ranks) but the plan has {num_ranks} device sets; "
            f"write one {line} per device set, in the order the stages first use them"
        )
    if schedule.num_stages != plan.num_stages:
        raise ScheduleError(f"{name} names {schedule.num_stages} stages but the plan has {plan.num_stages}")
    if schedule.num_microbatches != num_microbatches:
        raise ScheduleError(
            f"{name} runs {schedule.num_microbatches} micro-batches but training gives "
            f"{num_microbatches} (global_batch_size / microbatch_size)"
        )
    for stage, (rank, wanted) in enumerate(zip(schedule.stage_ranks, plan.stage_ranks)):
        if rank != wanted:
            raise ScheduleError(
                f"{name} runs stage {stage} on {line} {rank + 1} but the plan puts it on device set {wanted} "
                f"({line} {wanted + 1})"
            )
    check_schedule(schedule)
    return schedule
