"""The process groups of a plan's MoE blocks, and where each kind of gradient is summed.

An MoE block (``runtime.model.experts``) talks over four kinds of device sets of its stage
(``sim.core.plan.PlanSpec``, Megatron-Core's ``tp-ep-dp-pp`` layout):

* its **expert-parallel group** (``expert_groups``): the all-to-all of the tokens;
* its **expert-tensor-parallel group** (``expert_tensor_groups``, with ``expert_tensor_parallel``
  > 1): the devices that each hold 1/ETP of every local expert's width, which gather each
  other's arrived tokens and reduce-scatter the partial outputs (Megatron-Core's ``expt_tp``);
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

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from runtime.execution.comm import ReplicaGroups, all_reduce_grads
from runtime.execution.holdings import LocalStage, expert_group
from runtime.model.config import ModelConfig
from runtime.model.experts import ETP_DIM, ETP_SUMMED, EXPERT_PARAM, ROUTER_PARAM, MoE
from runtime.model.sharding import FSDP_SHARDINGS
from runtime.model.tensor_parallel import set_layout
from sim.core.plan import PlanSpec

__all__ = ["attach_expert_groups", "device_sets", "expert_data_mesh", "expert_tensor_groups", "gather_width_grads",
           "optimizer_buckets", "reduce_expert_grads", "split_dense"]


def device_sets(plan: PlanSpec, model: ModelConfig) -> tuple[tuple[int, ...], ...]:
    """Every device set an MoE block of ``plan`` needs a process group for (none for a dense model)."""
    if model.experts is None:
        return ()
    wanted = []
    for s in range(plan.num_stages):
        wanted += [*plan.expert_groups(s), *plan.expert_data_groups(s), *expert_tensor_groups(plan, s),
                   plan.stages[s].devices]
    return tuple(wanted)


def expert_tensor_groups(plan: PlanSpec, s: int) -> tuple[tuple[int, ...], ...]:
    """Stage ``s``'s expert-tensor-parallel groups: ETP consecutive devices of its layout (local
    rank r = etp + ETP·(ep + EP·edp), ``PlanSpec.expert_groups``), which cut each routed expert's
    width; none without expert tensor parallelism."""
    devices, etp = plan.stages[s].devices, plan.expert_tensor_parallel
    if etp == 1:
        return ()
    return tuple(devices[base:base + etp] for base in range(0, len(devices), etp))


def attach_expert_groups(stages: dict[int, LocalStage], plan: PlanSpec, rank: int, groups: ReplicaGroups) -> None:
    """Give each MoE block of ``rank``'s stages its expert-parallel process group."""
    for s, st in stages.items():
        group = groups.group(expert_group(plan, s, rank)) if plan.expert_parallel > 1 else None
        width = next((g for g in expert_tensor_groups(plan, s) if rank in g), None)
        for module in st.module.modules():
            if isinstance(module, MoE):
                module.group = group
                module.etp_group = None if width is None else groups.group(width)


def gather_width_grads(stages: dict[int, LocalStage], grads: dict) -> None:
    """Replace each expert-tensor slice's gradient in ``grads`` (named as the unsplit model's) by
    the whole, gathered over its expert-tensor group in place (``--check``; every rank of a group
    walks the same experts in the same order)."""
    for st in stages.values():
        for prefix, moe in st.module.named_modules():
            if not isinstance(moe, MoE) or moe.etp_group is None:
                continue
            for e in moe.local:
                for name, p in moe.experts[str(e)].named_parameters():
                    dim, key = getattr(p, ETP_DIM, None), f"{prefix}.experts.{e}.{name}"
                    if dim is None:
                        continue
                    parts = [torch.empty_like(grads[key]) for _ in range(moe.etp)]
                    dist.all_gather(parts, grads[key].contiguous(), group=moe.etp_group)
                    grads[key] = torch.cat(parts, dim=dim)


def split_dense(params: list) -> list:
    """The dense parameters of ``params``: neither routed experts nor routers."""
    return [p for p in params if not hasattr(p, EXPERT_PARAM) and not hasattr(p, ROUTER_PARAM)]


def optimizer_buckets(stages: dict[int, LocalStage], plan: PlanSpec, rank: int, groups: ReplicaGroups,
                      gradient_groups: dict[int, object]) -> list[tuple[list, object]]:
    """(parameters, the group that replicates them) for ``runtime.model.sharding.RankOptimizer``:
    per stage its dense parameters and routers over ``gradient_groups[s]`` and its routed experts
    over their expert-data-parallel group, as Megatron-Core's distributed optimizer shards each
    over its own data-parallel group (``megatron/core/optimizer/__init__.py`` at d98e8a6: the
    expert parameters' optimizer over ``intra_expt_dp_group``)."""
    buckets = []
    for s in sorted(stages):
        params = stages[s].params
        experts = [p for p in params if hasattr(p, EXPERT_PARAM)]
        buckets.append(([p for p in params if not hasattr(p, EXPERT_PARAM)], gradient_groups[s]))
        if experts:
            data = next(g for g in plan.expert_data_groups(s) if rank in g)
            buckets.append((experts, groups.group(data)))
    return buckets


def fsdp_expert_mesh(plan: PlanSpec, rank: int, device_type: str, experts) -> DeviceMesh | None:
    """``expert_data_mesh`` where FSDP2 shards routed experts (an MoE model under ``sharding:
    gradients`` or ``full``), else None."""
    if experts is None or plan.sharding not in FSDP_SHARDINGS:
        return None
    return expert_data_mesh(plan, rank, device_type)


def expert_data_mesh(plan: PlanSpec, rank: int, device_type: str) -> DeviceMesh:
    """The 1D mesh of ``rank``'s expert-data-parallel group, over which FSDP2 shards its routed
    experts (torchtitan's ``dp_shard_mod_ep`` mesh: ``apply_fsdp`` in
    ``torchtitan/experiments/llama4/infra/parallelize.py`` at bd3850be8 calls
    ``fully_shard(transformer_block.moe.experts, mesh=dp_mod_ep_mesh)`` before the block's
    ``fully_shard`` over the whole data-parallel mesh). Each device set's devices, in layout
    order, fold as (expert data, EP × ETP), ``PlanSpec.expert_data_groups``'s columns; every rank
    builds every set's mesh (``DeviceMesh`` creates its groups collectively)."""
    span = plan.expert_parallel * plan.expert_tensor_parallel
    mine = None
    for g in range(len(plan.device_groups)):
        layout = set_layout(plan, g)
        mesh = DeviceMesh(device_type, torch.tensor(layout).reshape(len(layout) // span, span),
                          mesh_dim_names=("expert_data", "expert"))
        if rank in layout:
            mine = mesh["expert_data"]
    assert mine is not None, f"rank {rank} is in no device set"
    return mine


def reduce_expert_grads(st: LocalStage, plan: PlanSpec, rank: int, groups: ReplicaGroups,
                        timeout: timedelta) -> None:
    """Sum stage ``st``'s routed-expert gradients over its expert-data-parallel group and its
    routers' over every device of the stage. Under FSDP2 (``sharding: gradients``, ``full``) the
    reduce-scatters already summed the experts over their expert-data-parallel mesh and the
    routers over the data replicas: the routers' shards are left to sum over the replica's
    devices (the tensor ranks, each of which routed its own 1/t of the tokens)."""
    experts = [p for p in st.params if hasattr(p, EXPERT_PARAM)]
    routers = [p for p in st.params if hasattr(p, ROUTER_PARAM)]
    summed = [p for p in experts if hasattr(p, ETP_SUMMED)]  # w2's bias: added on one expert-tensor rank
    width = next((g for g in expert_tensor_groups(plan, st.index) if rank in g), None)
    if summed and width is not None:
        all_reduce_grads(summed, groups.group(width), timeout)
    if plan.sharding in FSDP_SHARDINGS:
        replica = next(r for r in plan.replicas(st.index) if rank in r)
        sets = ((routers, replica),)
    else:
        data = next(g for g in plan.expert_data_groups(st.index) if rank in g)
        sets = ((experts, data), (routers, plan.stages[st.index].devices))
    for params, devices in sets:
        group = groups.group(devices) if len(devices) > 1 else None
        if params and group is not None:
            all_reduce_grads(params, group, timeout)
