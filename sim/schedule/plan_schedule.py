"""The schedule of a plan: which generator to run, or the hand-written file to trust.

A plan names its schedule (``dapple`` with a policy, ``interleaved``, ...) or a
``schedule_file``. Either way the result is the compute IR whose ranks are the plan's
distinct device sets (``PlanSpec.device_groups``) and whose stages are the plan's stages.
For ``interleaved`` the number of chunks is implied by the plan: stage ``s`` shares devices
with stage ``s + R`` for R device sets, so v = stages / R.
"""

from __future__ import annotations

from pathlib import Path

from sim.errors import ScheduleError
from sim.schedule.generators import generate
from sim.schedule.ir import Schedule, parse_schedule
from sim.schedule.check import check_schedule
from sim.plan import PlanSpec

__all__ = ["schedule_for_plan", "parse_schedule_for_plan"]


def schedule_for_plan(plan: PlanSpec, num_microbatches: int) -> Schedule:
    """The compute-only schedule that ``plan`` runs for ``num_microbatches`` micro-batches."""
    if plan.custom_schedule is not None:
        return plan.custom_schedule
    num_ranks = len(plan.device_groups)
    params = plan.params
    if plan.schedule == "interleaved":
        chunks = plan.num_stages // num_ranks
        if plan.num_stages % num_ranks:
            raise ScheduleError(
                f"interleaved needs the same number of chunks on every device set; "
                f"{plan.num_stages} stages over {num_ranks} device sets do not divide"
            )
        if params.get("chunks", chunks) != chunks:
            raise ScheduleError(
                f"chunks: {params['chunks']} given, but the plan's {plan.num_stages} stages over "
                f"{num_ranks} device sets make {chunks}; list {params['chunks'] * num_ranks} stages "
                f"(stage s on device set s mod {num_ranks}) or drop chunks"
            )
        params = {**params, "chunks": chunks}
    return generate(plan.schedule, num_ranks, num_microbatches, **params)


def parse_schedule_for_plan(plan: PlanSpec, num_microbatches: int, text: str) -> Schedule:
    """Read a hand-written schedule for ``plan``, check it fits the plan and that it runs."""
    name = Path(plan.schedule_file).name if plan.schedule_file else "schedule"
    schedule = parse_schedule(text, name=name)
    num_ranks = len(plan.device_groups)
    if schedule.num_ranks != num_ranks:
        raise ScheduleError(
            f"{name} has {schedule.num_ranks} lines (ranks) but the plan has {num_ranks} device sets; "
            "write one line per device set, in the order the stages first use them"
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
                f"{name} runs stage {stage} on line {rank + 1} but the plan puts it on device set {wanted} "
                f"(line {wanted + 1})"
            )
    check_schedule(schedule)
    return schedule
