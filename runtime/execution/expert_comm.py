"""The process groups of a plan's MoE blocks, and where each kind of gradient is summed.

An MoE block (``runtime.model.experts``) talks over three kinds of device sets of its stage
(``sim.core.plan.PlanSpec``, Megatron-Core's ``tp-ep-dp-pp`` layout):

* its **expert-parallel group** (``expert_groups``): the all-to-all of the tokens;
* its **expert-data-parallel group** (``expert_data_groups``): the devices that hold the same
  routed experts, over which their gradients are summed (Megatron-Core's
  ``expert_data_parallel_group``); every token routed to an expert, from whichever device of the
  expert-parallel group, already reached its gradient through the all-to-all's backward;
* **all of the stage's devices**: the router's weight, replicated on every device while each
  routes its own tokens (its replica's, and under sequence parallelism its 1/t of them).

The dense parameters keep their gradient groups (``PlanSpec.gradient_groups``). ``torch.distributed
.new_group`` is collective over the world, so every rank asks for every stage's sets, in the
same order (``device_sets``).
"""

from __future__ import annotations

from datetime import timedelta

from runtime.execution.comm import ReplicaGroups, all_reduce_grads
from runtime.execution.holdings import LocalStage, expert_group
from runtime.model.config import ModelConfig
from runtime.model.experts import EXPERT_PARAM, ROUTER_PARAM, MoE
from sim.core.plan import PlanSpec

__all__ = ["attach_expert_groups", "device_sets", "reduce_expert_grads", "split_dense"]


def device_sets(plan: PlanSpec, model: ModelConfig) -> tuple[tuple[int, ...], ...]:
    """Every device set an MoE block of ``plan`` needs a process group for (none for a dense model)."""
    if model.experts is None:
        return ()
    wanted = []
    for s in range(plan.num_stages):
        wanted += [*plan.expert_groups(s), *plan.expert_data_groups(s), plan.stages[s].devices]
    return tuple(wanted)


def attach_expert_groups(stages: dict[int, LocalStage], plan: PlanSpec, rank: int, groups: ReplicaGroups) -> None:
    """Give each MoE block of ``rank``'s stages its expert-parallel process group."""
    for s, st in stages.items():
        group = groups.group(expert_group(plan, s, rank)) if plan.expert_parallel > 1 else None
        for module in st.module.modules():
            if isinstance(module, MoE):
                module.group = group


def split_dense(params: list) -> list:
    """The dense parameters of ``params``: neither routed experts nor routers."""
    return [p for p in params if not hasattr(p, EXPERT_PARAM) and not hasattr(p, ROUTER_PARAM)]


def reduce_expert_grads(st: LocalStage, plan: PlanSpec, rank: int, groups: ReplicaGroups,
                        timeout: timedelta) -> None:
    """Sum stage ``st``'s routed-expert gradients over its expert-data-parallel group and its
    routers' over every device of the stage."""
    experts = [p for p in st.params if hasattr(p, EXPERT_PARAM)]
    routers = [p for p in st.params if hasattr(p, ROUTER_PARAM)]
    data = next(g for g in plan.expert_data_groups(st.index) if rank in g)
    for params, devices in ((experts, data), (routers, plan.stages[st.index].devices)):
        group = groups.group(devices)
        if params and group is not None:
            all_reduce_grads(params, group, timeout)
