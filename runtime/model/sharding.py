"""Sharded data parallelism with torch's own building blocks, and model states by kind.

The plan's ``sharding`` (``sim.core.parallelism.Sharding``, ZeRO's stages: Rajbhandari et al.
2020, §5) maps onto torch as follows:

* ``none``: one optimizer over this rank's parameters; gradients all-reduced among the
  replicas at the stage's ``REDUCE_GRAD`` (as a 2D plan).
* ``optimizer`` (ZeRO-1): gradients still all-reduced at ``REDUCE_GRAD``, then
  ``torch.distributed.optim.ZeroRedundancyOptimizer`` steps each replica's share of the
  parameters and broadcasts the result. Per stage, over the devices that hold the same
  parameters (``PlanSpec.gradient_groups``). Tensor-parallel parameters (DTensors) enter it
  as plain tensors that alias their local shards (``DTensor.to_local``), whose gradients are
  pointed at the local gradient before every step.
* ``full`` (ZeRO-3): FSDP2's ``fully_shard`` on every layer of the stage and on the stage
  (torchtitan's ``apply_fsdp``), ``reshard_after_forward=True``, over the mesh's ``data``
  dimension; each micro-batch's backward reduce-scatters its gradients into the 1/d shard
  (FSDP2's default; ``plan.fsdp.reduce_every_microbatch: true``), or with ``false`` they accumulate
  unsharded over the micro-batches (``set_requires_gradient_sync(False)``, the executor's) and the
  stage's last backward on this rank reduce-scatters them. The gradient divide factor is 1: the executor already scales each
  slice's loss by its share of the global batch, so gradients sum. With tensor parallelism
  FSDP2 shards the tensor-parallel DTensors over the data dimension (2D, torchtitan's
  ``apply_fsdp`` after ``apply_tp``). A tied embedding and head share one parameter, which
  FSDP2 manages in one unit only (it all-gathers, swaps in and reduce-scatters a parameter
  per unit), so both stay in the stage's root unit (torch's FSDP2 docs: ``fully_shard`` "groups
  parameters together"; the unit that holds a module holds its parameters); the head reads the
  embedding's weight at each call (``runtime.model.layers.LMHead``), so it projects with the
  gathered matrix the root swapped in. torchtitan instead shards ``tok_embeddings`` and
  ``[norm, output]`` as units of their own and assigns ``output.weight`` afterwards
  (``models/qwen3/infra/parallelize.py``). The multi-token-prediction layer (``runtime.model.mtp``)
  reads the shared table the same way: it borrows it from the embedding or a tied head on its
  stage, and then it and that layer stay in the root's unit, whose forward has the table gathered
  when the layer embeds the tokens ahead, while each of its modules (norms, projection, block) is
  a unit of its own as a block is; with a copy of its own (an untied model's last stage) the layer
  is a unit holding the copy. torchtitan wraps each MTP layer as a decoder block too
  (``torchtitan/models/deepseek_v3/mtp.py`` at b5bcd76, ``apply_fsdp_to_mtp_decoder``) and calls
  ``tok_embeddings``, a unit of its own, again for the shifted tokens; here the table may be a
  tied head's matrix, read as ``weight``, hence the root.
* ``gradients`` (ZeRO-2): FSDP2 as under ``full`` but with ``reshard_after_forward=False``,
  torch's nearest equivalent (torch has no ZeRO-2 optimizer of its own; ``fully_shard``'s
  docstring: False "keeps the unsharded parameters in memory after forward and avoids the
  all-gather in backward", FSDP1's ``SHARD_GRAD_OP``; torchtitan's
  ``parallelism.fsdp_reshard_after_forward: never``, ``torchtitan/config/job_config.py`` at
  000204a). Gradients are reduce-scattered and the optimizer steps 1/d of the state, as in
  ZeRO-2 (Rajbhandari et al. 2020, §5.2: "P_os+g"; DeepSpeed's ``stage: 2`` partitions
  optimizer states and gradients), and the parameters are whole from a unit's forward to its
  backward. How it differs from ZeRO-2: FSDP2 reshards after each backward (its
  ``reshard_after_backward`` must stay True at the last micro-batch, or the next forward
  would use parameters older than the optimizer step), so between steps a device holds 1/d
  of the parameters where ZeRO-2 holds them all, and each step all-gathers the parameters
  once per unit and micro-batch forward where ZeRO-2 all-gathers the updated shards once
  after the step. So at the step's peak, the end of a forward, a device holds every unit's whole
  parameters beside its 1/d shard, (1 + 1/d) of them where ZeRO-2 holds them once. ``state_bytes``
  reports what it holds at rest (1/d); the run adds what FSDP2 held gathered
  (``runtime.measure.memory``: ``count_gathered``), and ``realisation_notes`` names the 1/d more
  than the simulator, which models ZeRO-2 (``sim.cost.memory.model_state_bytes``), predicts.

Routed experts (``runtime.model.experts``) are replicated only over their expert-data-parallel
group (``PlanSpec.expert_data_groups``: the stage's devices / (EP × ETP)), so each sharding
takes them over that group and the dense parameters over the whole data-parallel group, as
Megatron-Core does (its expert parameters in buffers and a distributed optimizer of their own
over ``expt_dp``): ZeRO-1 steps them with a ``ZeroRedundancyOptimizer`` of their own over that
group (``runtime.execution.expert_comm.optimizer_buckets``), and FSDP2 makes each expert a unit
over that group's mesh before the block's unit takes the rest (torchtitan's ``apply_fsdp``, which
shards ``moe.experts`` over its ``dp_shard_mod_ep`` mesh). A sharded expert's bytes are 1/d_e of
its whole, as the simulator counts them (``sim.cost.experts.moe_state_bytes``).

``state_bytes`` counts what a rank holds at rest by the simulator's kinds (parameters,
gradients, optimizer state): the bytes each device stores (a DTensor's local shard).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor

from runtime.model.experts import MoE
from runtime.model.layers import TransformerBlock
from runtime.model.models import OPTIMIZER_CLASSES, StageModule
from sim.core.parallelism import Sharding

__all__ = ["FSDP_SHARDINGS", "RankOptimizer", "fsdp_units", "shard_stage", "state_bytes"]

FSDP_SHARDINGS = (Sharding.GRADIENTS, Sharding.FULL)
"""The plan's shardings that run as FSDP2 (``fully_shard``)."""


def shard_stage(module: StageModule, data_mesh: DeviceMesh, *, reshard_after_forward: bool = True,
                unit_layers: int = 1, expert_mesh: DeviceMesh | None = None,
                param_dtype: torch.dtype | None = None) -> None:
    """FSDP2 on every unit of ``module``'s layers (``fsdp_units``: ``unit_layers`` consecutive blocks)
    and on ``module`` (the root), in place (``reshard_after_forward`` False: ``sharding: gradients``,
    or ``plan.fsdp.reshard_after_forward: false``); a tied embedding and head go into the root's unit
    together. Each routed expert of an MoE block is a unit of its own over ``expert_mesh`` (the
    expert-data-parallel devices) before its block's unit takes the rest. ``param_dtype`` (a 16-bit
    model's, ``plan.fsdp.fp32_shards``): the shards turn fp32 and are the optimizer's weights, each unit
    gathered in ``param_dtype`` and its gradients reduced in fp32 (FSDP2's ``MixedPrecisionPolicy``:
    "FSDP does not require any extra memory to keep a high-precision copy of the parameters")."""
    if param_dtype is not None:
        module.float()
    policy = MixedPrecisionPolicy() if param_dtype is None else \
        MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    moes = [sub for sub in module.modules() if isinstance(sub, MoE)]
    for moe in moes:
        assert expert_mesh is not None, "an MoE stage under FSDP2 needs its expert-data-parallel mesh"
        for expert in moe.experts.values():  # each called on its own tokens: its forward is the unit's
            fully_shard(expert, mesh=expert_mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    for layer in module.layers.values():  # each MTP module a unit, as a block (the layer may borrow)
        for depth in getattr(layer, "depths", ()):
            fully_shard(depth, mesh=data_mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    for unit in fsdp_units(module, unit_layers):
        fully_shard(unit if len(unit) > 1 else unit[0], mesh=data_mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    fully_shard(module, mesh=data_mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    for sub in module.modules():
        if isinstance(sub, FSDPModule):
            sub.set_gradient_divide_factor(1.0)
            sub.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM; a factor of 1 needs none
    for moe in moes:
        moe.tag_parameters()


def fsdp_units(module: StageModule, unit_layers: int) -> list[list[nn.Module]]:
    """The stage's layers as FSDP2 units, in forward order, as the simulator counts them
    (``sim.cost.memory.fsdp_unit_param_bytes``): ``unit_layers`` consecutive transformer blocks one
    ``fully_shard`` call (torch's ``fully_shard`` takes a list of modules and "groups parameters
    together"; torchtitan wraps each block), every other layer with parameters a unit of its own, which
    closes the blocks' unit. A layer that holds or borrows a tied table stays in the root's unit."""
    shared = {id(w) for layer in module.layers.values() for w in getattr(layer, "borrowed", ())}
    units: list[list[nn.Module]] = []
    run = unit_layers  # blocks in the unit being filled; unit_layers: none open
    for layer in module.layers.values():
        tied = getattr(layer, "borrowed", ()) or any(id(p) in shared for p in layer.parameters())
        if tied or not any(True for _ in layer.parameters()):
            run = unit_layers  # the root's: the next block starts a unit of its own
            continue
        block = isinstance(layer, TransformerBlock)
        if block and run < unit_layers:
            units[-1].append(layer)
            run += 1
        else:
            units.append([layer])
            run = 1 if block else unit_layers
    return units


def _nbytes(t: torch.Tensor) -> int:
    local = t.to_local() if isinstance(t, DTensor) else t
    return local.numel() * local.element_size()


@dataclass(slots=True)
class RankOptimizer:
    """This rank's optimizers: one plain one, or one ``ZeroRedundancyOptimizer`` per stage."""

    optimizers: list[torch.optim.Optimizer]
    views: list[tuple[nn.Parameter, torch.Tensor]] = field(default_factory=list)
    """(parameter, plain tensor aliasing its local shard) pairs a ZeRO optimizer steps."""

    @classmethod
    def build(cls, name: str, lr: float, buckets: list[tuple[list[nn.Parameter], object]],
              sharding: Sharding) -> RankOptimizer:
        """``buckets``: (parameters, the process group over which they are replicated), one per
        stage and kind (a stage's dense parameters over its gradient group, its routed experts over
        their expert-data-parallel group; None when alone: nothing to shard); ZeRO-1 steps each
        bucket's share over its group."""
        optim_class, kwargs = OPTIMIZER_CLASSES[name]
        if sharding is not Sharding.OPTIMIZER:
            unique = list({id(p): p for ps, _ in buckets for p in ps}.values())
            return cls([optim_class(unique, lr=lr, **kwargs)])
        optimizers, views = [], []
        for params, group in buckets:
            if not params:
                continue
            pairs = [(p, p.to_local().detach() if isinstance(p, DTensor) else p) for p in params]
            views += [(p, v) for p, v in pairs if v is not p]
            tensors = [v for _, v in pairs]
            if group is None:
                optimizers.append(optim_class(tensors, lr=lr, **kwargs))
            else:
                optimizers.append(ZeroRedundancyOptimizer(tensors, optimizer_class=optim_class,
                                                          process_group=group, lr=lr, **kwargs))
        return cls(optimizers, views)

    def zero_grad(self) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)
        for _, view in self.views:
            view.grad = None

    def step(self) -> None:
        for p, view in self.views:
            view.grad = None if p.grad is None else p.grad.to_local()
        for optimizer in self.optimizers:
            optimizer.step()

    def state_bytes(self) -> int:
        """Bytes of optimizer state on this rank (a ZeRO optimizer's own share only)."""
        total = 0
        for optimizer in self.optimizers:
            local = optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer
            for state in local.state.values():
                total += sum(_nbytes(v) for v in state.values() if torch.is_tensor(v) and v.dim() > 0)
        return total


def state_bytes(params: list[nn.Parameter], optimizer: RankOptimizer) -> dict[str, int]:
    """Parameters, gradients and optimizer state this rank stores, by the simulator's kinds
    (``sim.core.summary.MemoryBreakdown``'s keys)."""
    return {"parameters": sum(_nbytes(p) for p in params),
            "gradients": sum(_nbytes(p.grad) for p in params if p.grad is not None),
            "optimizer": optimizer.state_bytes()}
