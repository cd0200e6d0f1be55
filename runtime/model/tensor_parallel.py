"""Device meshes and tensor (and sequence) parallelism with torch's DTensor building blocks.

**Meshes.** A plan's devices are laid out as in Megatron-LM (``sim.core.plan``): inside each
device set, tensor-parallel groups of t consecutive ids (innermost), then context-parallel
groups, then the data-parallel replicas. Each device set gets a ``DeviceMesh`` of shape
``(replicas, context, tensor)`` with those names, its devices in the plan's layout order; a
uniform plan (every device set the same size, numbered in order) is one
``(pipeline, data, context, tensor)`` mesh whose ``["data", "context", "tensor"]`` slice is
the set's mesh (torchtitan's ``ParallelDims.build_mesh`` layout). DAPPLE's uneven plans,
whose sets differ in replicas, keep one mesh per set: a single 4D mesh cannot hold them.
``new_group`` is collective over the world, so every rank builds every set's mesh.

**Tensor and sequence parallelism** follow torchtitan's Llama recipe
(``torchtitan/models/llama3/infra/parallelize.py``, ``apply_tp``) with
``torch.distributed.tensor.parallel.parallelize_module``: queries, keys, values and the MLP's
input matrices ``ColwiseParallel``, the attention's output and the MLP's output matrix
``RowwiseParallel``; the token embedding ``RowwiseParallel`` (vocabulary-parallel: Shoeybi et
al. 2019, §3); the head's projection ``ColwiseParallel`` to vocabulary-sharded logits and the
loss computed on them under ``loss_parallel``. With sequence parallelism (Korthikanti et al.
2022, §4.2.2) the norms are ``SequenceParallel``, each block's attention and MLP gather their
input once (``PrepareModuleInput``) and the row-parallel outputs reduce-scatter to the
device's part of the sequence.

**Tied embeddings** keep one weight for both uses, sharded ``Shard(0)`` on the vocabulary, as
Megatron-LM's ``VocabParallelEmbedding`` and output layer share it
(``megatron/core/models/common/language_module/language_module.py``
``shared_embedding_or_output_weight``: the embedding's ``word_embeddings.weight`` on a stage with
both, handed to the column-parallel output layer as its weight). The embedding is cut as above
(DTensor masks the ids outside this device's rows, looks up, then all-reduces, or reduce-scatters
with sequence parallelism); the head has no matrix of its own to cut, so ``_replicated`` gives
it the replicated input ``ColwiseParallel`` would, and ``F.linear`` on the embedding's DTensor
yields the same vocabulary-sharded logits. ``parallelize_module`` replaces the embedding's
parameter, so the head reads it at each call (``runtime.model.layers.LMHead``), torchtitan's
tie-after-parallelize (``models/qwen3/infra/parallelize.py``); autograd sums both uses'
gradients on the one parameter. A head on another stage holds a copy, cut ``ColwiseParallel``
to the same ``Shard(0)`` rows (``runtime.execution.holdings.tied_groups`` sums the copies).

**Multi-token prediction** (``runtime.model.mtp``): each module's block is cut as the main
blocks, its ``2h → h`` projection column-parallel with the output gathered, and the shifted tokens
looked up in the vocabulary-parallel table, as Megatron-Core's MTP layer does (``_parallelize_mtp``).

**Between stages** each device sends its 1/t of the sequence (Megatron's scatter-gather of
pipeline messages, Narayanan et al. SC'21 §4.1, which the simulator's boundary bytes
assume): with sequence parallelism that is what the device holds; without it the stage
output is cut (``DTensor.redistribute`` from ``Replicate`` to ``Shard(1)``, whose backward
all-gathers) and the next stage all-gathers its input (whose backward cuts again).

**Gradients** of replicated parameters next to sequence-sharded activations come out of
the backward as ``Partial`` sums; ``settle_grads`` redistributes every gradient to its
parameter's placement before the data-parallel reduction and the optimizer see it.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from runtime.model.experts import MoE
from runtime.model.layers import Embedding, LMHead, TransformerBlock
from runtime.model.models import StageModule
from runtime.model.mtp import MultiTokenPrediction
from sim.core.plan import PlanSpec

__all__ = ["MESH_DIMS", "gather_sequence", "loss_parallel_if", "parallelize_layer",
           "parallelize_stage", "scatter_sequence", "set_layout", "settle_grads", "stage_mesh", "uniform_layout"]

MESH_DIMS = ("data", "context", "tensor")
"""Names of a device set's mesh dimensions, outermost first (Megatron's order)."""


def set_layout(plan: PlanSpec, group: int) -> list[int]:
    """Device set ``group``'s devices in layout order (as its first stage lists them)."""
    members = set(plan.device_groups[group])
    first = next(stage for stage in plan.stages if set(stage.devices) == members)
    return list(first.devices)


def uniform_layout(plan: PlanSpec) -> bool:
    """Whether the plan is one ``(pipeline, data, context, tensor)`` grid of ranks in order."""
    size = len(plan.device_groups[0])
    return all(set_layout(plan, g) == list(range(g * size, (g + 1) * size)) for g in range(len(plan.device_groups)))


def stage_mesh(plan: PlanSpec, rank: int, device_type: str) -> DeviceMesh:
    """The ``(data, context, tensor)`` mesh of ``rank``'s device set (every rank must call this)."""
    t, c = plan.tensor_parallel, plan.context_parallel
    if uniform_layout(plan):
        pipeline, size = len(plan.device_groups), len(plan.device_groups[0])
        grid = torch.arange(pipeline * size).reshape(pipeline, size // (c * t), c, t)
        return DeviceMesh(device_type, grid, mesh_dim_names=("pipeline", *MESH_DIMS))[MESH_DIMS]
    mine = None
    for g in range(len(plan.device_groups)):
        layout = set_layout(plan, g)
        mesh = DeviceMesh(device_type, torch.tensor(layout).reshape(len(layout) // (c * t), c, t),
                          mesh_dim_names=MESH_DIMS)
        if rank in layout:
            mine = mesh
    assert mine is not None, f"rank {rank} is in no device set"
    return mine


def scatter_sequence(x: torch.Tensor, mesh: DeviceMesh, dim: int = 1) -> torch.Tensor:
    """This device's 1/t of a tensor every device of ``mesh`` holds whole; the backward all-gathers."""
    return DTensor.from_local(x, mesh, [Replicate()], run_check=False).redistribute(mesh, [Shard(dim)]).to_local()


def gather_sequence(x: torch.Tensor, mesh: DeviceMesh, dim: int = 1) -> torch.Tensor:
    """The whole tensor from every device's 1/t along ``dim``; the backward keeps this device's part."""
    return DTensor.from_local(x, mesh, [Shard(dim)], run_check=False).redistribute(mesh, [Replicate()]).to_local()


def _block_plan(sequence_parallel: bool) -> dict:
    """torchtitan's ``apply_tp`` layer plan for one block (attention and MLP submodules)."""
    rowwise_out = Shard(1) if sequence_parallel else Replicate()
    layer_plan = {
        "attention.q": ColwiseParallel(), "attention.k": ColwiseParallel(), "attention.v": ColwiseParallel(),
        "attention.out": RowwiseParallel(output_layouts=rowwise_out),
        "mlp.w1": ColwiseParallel(), "mlp.w2": RowwiseParallel(output_layouts=rowwise_out),
    }
    if sequence_parallel:
        gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        layer_plan.update({"norm_1": SequenceParallel(), "norm_2": SequenceParallel(),
                           "attention": gather, "mlp": gather})
    return layer_plan


def _moe_block_plan(dense: dict, moe: MoE) -> dict:
    """An MoE block: attention and norms as the dense block; the router and the routed experts stay
    whole on each tensor rank, which routes the tokens it holds (Megatron-Core's MoE layer with
    expert_tensor_parallel 1; without sequence parallelism each dispatches its 1/t of them,
    ``MoE.tensor_split``); the shared experts are a dense MLP cut as the dense block's (under
    sequence parallelism its gather moved onto them)."""
    layer_plan = {key: style for key, style in dense.items() if not key.startswith("mlp")}
    if moe.shared is not None:
        layer_plan.update({"mlp.shared.w1": ColwiseParallel(), "mlp.shared.w2": dense["mlp.w2"]})
        if "mlp" in dense:  # sequence parallelism: the shared experts gather the sequence
            layer_plan["mlp.shared"] = dense["mlp"]
        if moe.shared.w3 is not None:
            layer_plan["mlp.shared.w3"] = ColwiseParallel()
    return layer_plan


def parallelize_layer(layer: nn.Module, mesh: DeviceMesh, *, sequence_parallel: bool) -> None:
    """Cut one layer (embedding, block or head) over ``mesh`` (1D, the tensor dimension), in place."""
    if isinstance(layer, Embedding):
        out = Shard(1) if sequence_parallel else Replicate()
        parallelize_module(layer.token, mesh, RowwiseParallel(input_layouts=Replicate(), output_layouts=out))
        if sequence_parallel and layer.position is not None:
            layer.scatter = lambda table: scatter_sequence(table, mesh, dim=0)
    elif isinstance(layer, TransformerBlock):
        blk = _block_plan(sequence_parallel)
        if isinstance(layer.mlp, MoE):
            blk = _moe_block_plan(blk, layer.mlp)
            if not sequence_parallel:  # every tensor rank holds every token: each dispatches its 1/t
                layer.mlp.tensor_split = (mesh.get_local_rank(), mesh.size(), mesh.get_group())
        elif layer.mlp.w3 is not None:
            blk["mlp.w3"] = ColwiseParallel()
        parallelize_module(layer, mesh, blk)
    elif isinstance(layer, MultiTokenPrediction):
        _parallelize_mtp(layer, mesh, sequence_parallel=sequence_parallel)
    elif isinstance(layer, LMHead):
        head = {} if layer.proj is None else {
            "proj": ColwiseParallel(input_layouts=Shard(1) if sequence_parallel else Replicate(),
                                    output_layouts=Shard(-1), use_local_output=False)}
        if sequence_parallel:  # the main norm and each MTP depth's (runtime.model.mtp.MTPHead)
            head.update({name: SequenceParallel() for name in
                         ["norm", *(f"mtp_norms.{i}" for i in range(len(getattr(layer, "mtp_norms", ()))))]})
        if layer.proj is None:  # tied: the embedding's Shard(0) table, column-parallel logits
            layer.gather = lambda x: _replicated(x, mesh)
        if head:
            parallelize_module(layer, mesh, head)
    else:
        raise AssertionError(f"no tensor-parallel plan for {type(layer).__name__}")


def _parallelize_mtp(layer: MultiTokenPrediction, mesh: DeviceMesh, *, sequence_parallel: bool) -> None:
    """DeepSeek-V3's MTP modules cut as Megatron-Core's ``MultiTokenPredictionLayer``
    (``megatron/core/transformer/multi_token_prediction.py`` at NVIDIA/Megatron-LM 00611e6,
    ``_concat_embeddings``): ``M_k`` column-parallel with its output gathered
    (``eh_proj`` with ``gather_output=False``, then ``gather_from_tensor_model_parallel_region``),
    under sequence parallelism its input all-gathered from the norms' sequence parts and its output
    scattered back over the sequence (``scatter_to_sequence_parallel_region``); each block as the
    main blocks; the tokens ahead looked up in the vocabulary-parallel table (``_lookup``)."""
    for module in layer.depths:
        parallelize_layer(module.block, mesh, sequence_parallel=sequence_parallel)
        plan = {"proj": ColwiseParallel(input_layouts=Shard(1) if sequence_parallel else Replicate(),
                                        output_layouts=Replicate())}
        if sequence_parallel:
            plan.update({"hidden_norm": SequenceParallel(), "embedding_norm": SequenceParallel()})
            module.scatter = lambda x: scatter_sequence(x, mesh)
        parallelize_module(module, mesh, plan)
    if layer.table is not None:  # its own copy on a stage away from the embedding: vocabulary-parallel
        # as the embedding's (Megatron-Core's MTP stage holds a VocabParallelEmbedding copy), so that
        # the embedding group sums shard k with shard k
        parallelize_module(layer.table, mesh, RowwiseParallel(input_layouts=Replicate()))
    layer.embed = lambda ids, weight: _lookup(ids, weight, mesh, sequence_parallel)


def _lookup(ids: torch.Tensor, weight: torch.Tensor, mesh: DeviceMesh, sequence_parallel: bool) -> torch.Tensor:
    """This device's embedded tokens from the ``Shard(0)`` (vocabulary-parallel) table, as the main
    embedding's ``RowwiseParallel`` does: DTensor masks the ids outside this device's rows, looks up,
    then all-reduces, or reduce-scatters over the sequence with sequence parallelism. A plain table
    (a layer profiled alone, tied to a fresh one) is looked up whole and, with sequence parallelism, cut."""
    out = [Shard(1)] if sequence_parallel else [Replicate()]
    if not isinstance(weight, DTensor):
        looked_up = torch.nn.functional.embedding(ids, weight)
        return scatter_sequence(looked_up, mesh) if sequence_parallel else looked_up
    ids = DTensor.from_local(ids, mesh, [Replicate()], run_check=False)
    return torch.nn.functional.embedding(ids, weight).redistribute(mesh, out).to_local()


def _replicated(x: torch.Tensor, mesh: DeviceMesh) -> DTensor:
    """The head's input as ``ColwiseParallel`` makes it for its own matrix: a replicated DTensor
    (a sequence-parallel norm's ``Shard(1)`` output all-gathered, whose backward reduce-scatters;
    a plain tensor wrapped, whose backward all-reduces the partial input gradient)."""
    x = x if isinstance(x, DTensor) else DTensor.from_local(x, mesh, [Replicate()], run_check=False)
    return x.redistribute(mesh, [Replicate()])


def parallelize_stage(module: StageModule, mesh: DeviceMesh, *, sequence_parallel: bool, first: bool) -> None:
    """Cut every layer of ``module`` over ``mesh`` (1D, the tensor dimension), in place, and
    make its input and output this device's 1/t of the sequence.

    ``first``: the stage holds the embedding (its input is token ids, not a 1/t sequence part).
    """
    for layer in module.layers.values():
        parallelize_layer(layer, mesh, sequence_parallel=sequence_parallel)
    if not sequence_parallel:  # stage boundaries carry 1/t of the sequence (the scatter-gather)
        module.enter = None if first else (lambda x: gather_sequence(x, mesh))
        module.leave = None if module.is_last else (lambda x: scatter_sequence(x, mesh))


def loss_parallel_if(tensor_parallel: int):
    """``loss_parallel()`` with tensor parallelism (the vocabulary-sharded cross-entropy's
    forward and backward both run inside it), else a context that does nothing."""
    if tensor_parallel == 1:
        return contextlib.nullcontext()

    return loss_parallel()


def settle_grads(params: list[nn.Parameter]) -> None:
    """Give every DTensor gradient its parameter's placement (a ``Partial`` sum is reduced,
    a replicated gradient of a sharded parameter cut), in parameter order on every rank."""
    for p in params:
        if isinstance(p, DTensor) and isinstance(p.grad, DTensor) and p.grad.placements != p.placements:
            p.grad = p.grad.redistribute(p.device_mesh, p.placements)
