"""The model states of an MoE stage, by kind: dense parameters over the data-parallel group,
routed experts over the expert-data-parallel group.

A device holds its share of the dense parameters (attention, norms, router, shared experts,
embedding and head), which the t-way tensor-parallel layout splits and the data-parallel group
of stage devices / t devices (``PlanSpec.gradient_groups``) replicates, and count/EP routed experts
split ETP ways (``sim.models.moe``), which the expert-data-parallel group of stage devices /
(EP × ETP) devices (``PlanSpec.expert_data_groups``) replicates. Megatron-Core keeps the two apart:
expert parameters live in their own buffers, reduced over the expert-data-parallel group
(``megatron/core/distributed/distributed_data_parallel.py``: ``expert_parallel_buffers`` with
``parallel_state.get_expert_data_parallel_group``), and its distributed optimizer shards each over
its own group. So every sharding mode (ZeRO-1/2/3) applies to each kind over its own group:
``moe_state_bytes`` is ``sim.cost.memory.stage_state_bytes`` of each, summed by kind.
"""

from __future__ import annotations

from sim.core.model_spec import ModelSpec
from sim.core.parallelism import Sharding
from sim.cost.memory import StateBytes, stage_state_bytes, sum_state_bytes

__all__ = ["moe_state_bytes", "stepped_param_bytes"]


def moe_state_bytes(model: ModelSpec, param_bytes: float, expert_param_bytes: float, *, data_parallel: int,
                    expert_data_parallel: int, sharding: Sharding = Sharding.NONE,
                    accumulate_unsharded: bool = False, fp32_shards: bool = False) -> StateBytes:
    """Parameters, gradients and optimizer state at rest of one device holding ``param_bytes``
    (its share, routed experts included) of which ``expert_param_bytes`` are routed experts: the
    dense rest over ``data_parallel`` devices and the experts over ``expert_data_parallel``
    (ZeRO, Rajbhandari et al. 2020, §5.1, applied to each group). Without experts it is
    ``stage_state_bytes`` itself."""
    kw = dict(sharding=sharding, accumulate_unsharded=accumulate_unsharded, fp32_shards=fp32_shards)
    if not expert_param_bytes:
        return stage_state_bytes(model, param_bytes, data_parallel=data_parallel, **kw)
    dense = stage_state_bytes(model, param_bytes - expert_param_bytes, data_parallel=data_parallel, **kw)
    experts = stage_state_bytes(model, expert_param_bytes, data_parallel=expert_data_parallel, **kw)
    return sum_state_bytes((dense, experts))


def stepped_param_bytes(param_bytes: float, expert_param_bytes: float, *, data_parallel: int,
                        expert_data_parallel: int, sharding: Sharding = Sharding.OPTIMIZER) -> float:
    """The parameter bytes that, over ``data_parallel`` devices, give a sharded optimizer step the
    bytes a device updates: its 1/d of the dense and its 1/d_e of the experts
    (``sim.cost.compute.stage_optimizer_step_s`` divides by d). Unsharded (``sharding: none``)
    a device steps all it holds: its dense parameters and its own experts, ``param_bytes``."""
    if not expert_param_bytes or sharding is Sharding.NONE:
        return param_bytes
    return param_bytes - expert_param_bytes + expert_param_bytes * data_parallel / expert_data_parallel
