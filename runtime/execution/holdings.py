"""What one rank holds of a plan: its stages, its slice of every micro-batch, its neighbours.

A rank (one device) belongs to one device set, so it holds every stage of that set: one
stage in most plans, v chunks with ``interleaved``. For each it needs the layers (built from
the same seeds a single process would use), which samples of a micro-batch are its own
(``sim.cost.split.sample_ranges``), which split-concat pieces it sends and receives, and
whether the neighbouring stage runs on the same rank (then tensors are handed over
without communication).

With tensor (and context) parallelism a micro-batch splits over a stage's data-parallel
replicas (``PlanSpec.replicas``); every device of a replica processes the replica's samples
(each context rank its part of every sequence: ``runtime.model.context_parallel``), and the
device at one position of a replica (its context and tensor rank) exchanges pieces with the
device at the same position of the neighbouring stage's replicas (as
``sim.engine.flows.p2p_flows``). Its layers are cut over its device set's mesh
(``runtime.model.tensor_parallel``) and, with ``sharding: full`` or ``gradients``, sharded by FSDP2
(``runtime.model.sharding``) before anyone sees their parameters.

A tied GPT embedding whose head sits on another device set is held twice (the embedding's
matrix and the head's copy, equal at start: both from the embedding's seed, as Megatron-LM's
``setup_embeddings_and_output_layer`` makes the last stage's copy equal to the first's), and so is
an untied model's table that its MTP layer reads on another device set (the layer's copy,
Megatron-Core's MTP stage: ``sim.models.mtp``), and the
copies' gradients are summed after the step over Megatron-LM's embedding groups
(``tied_groups``: the devices holding the same vocabulary slice, or the same FSDP2 shard).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.execution.comm import Piece, pieces_between
from runtime.model.config import RunnableScenario
from runtime.model.context_parallel import apply_context_parallel, context_ring
from runtime.model.experts import MoE, cut_width
from runtime.model.models import TORCH_DTYPES, TRANSFORMERS, StageModule, build_layers, num_layers
from runtime.model.recompute import apply_selective
from runtime.model.sharding import FSDP_SHARDINGS, shard_stage
from runtime.model.tensor_parallel import parallelize_stage
from sim.core.parallelism import Recompute, Sharding
from sim.cost.split import sample_ranges

__all__ = ["Holdings", "LocalStage", "column", "expert_group", "hold_stages", "local_experts", "position",
           "tied_groups"]


@dataclass(slots=True, kw_only=True)
class LocalStage:
    """One stage as this rank holds it."""

    index: int
    """Stage index in the plan."""
    module: StageModule
    params: list[torch.nn.Parameter]
    """The stage's own parameters (what its ``REDUCE_GRAD`` all-reduces)."""
    weights: list[torch.nn.Parameter]
    """Every parameter its backward feeds (a tied head or the mtp layer also feeds the embedding's matrix): W's inputs."""
    start: int
    """First sample of this replica's slice of a micro-batch."""
    size: int
    """Samples in this replica's slice."""
    recv_f: tuple[Piece, ...]
    """Pieces of the stage input arriving from stage s−1 (empty when that stage is local)."""
    send_f: tuple[Piece, ...]
    """Pieces of the stage output leaving for stage s+1."""
    recv_b: tuple[Piece, ...]
    """Pieces of the output gradient arriving from stage s+1 (the ``send_f`` pieces reversed)."""
    send_b: tuple[Piece, ...]
    """Pieces of the input gradient leaving for stage s−1 (the ``recv_f`` pieces reversed)."""
    local_prev: bool
    """Stage s−1 runs on this rank (no communication between them)."""
    local_next: bool
    """Stage s+1 runs on this rank."""


@dataclass(slots=True, kw_only=True)
class Holdings:
    stages: dict[int, LocalStage]
    """This rank's stages by index."""
    tied_groups: tuple[tuple[int, ...], ...]
    """Every embedding group of a tied embedding split across device sets (``tied_groups``; else
    empty): every rank creates every group's process group."""
    tied_devices: tuple[int, ...]
    """This rank's embedding group (empty when it holds no copy or the tie is within one device set)."""
    tied_param: torch.nn.Parameter | None
    """This rank's copy of that matrix, if it holds one."""


def position(plan, rank: int) -> int:
    """``rank``'s place inside its data-parallel replica: ``context rank × t + tensor rank``."""
    for s in range(plan.num_stages):
        for replica in plan.replicas(s):
            if rank in replica:
                return replica.index(rank)
    raise AssertionError(f"rank {rank} is in no stage")


def column(plan, s: int, at: int) -> tuple[int, ...]:
    """The devices at position ``at`` of every replica of stage ``s``, in replica order."""
    return tuple(replica[at] for replica in plan.replicas(s))


def hold_stages(runnable: RunnableScenario, rank: int, *, seed: int, device: torch.device, mesh=None,
                expert_mesh=None) -> Holdings:
    """Build what ``rank`` holds of ``runnable``'s plan (``mesh``: its device set's
    ``(data, context, tensor)`` mesh, needed with tensor parallelism or sharding; ``expert_mesh``:
    its expert-data-parallel mesh, needed by an MoE model under FSDP2)."""
    plan = runnable.plan
    pipeline_rank = next(r for r, group in enumerate(plan.device_groups) if rank in group)
    mine = [s for s in range(plan.num_stages) if plan.stage_ranks[s] == pipeline_rank]
    last_layer = num_layers(runnable.model) - 1
    indices = [k for s in mine for k in range(*plan.stages[s].layers)]
    layers = build_layers(runnable.model, indices, seed=seed, device=device,
                          local_experts=local_experts(runnable, rank, mine), rank=rank)
    stages = {
        s: _stage(runnable, rank, s, {k: layers[k] for k in range(*plan.stages[s].layers)}, last_layer,
                  (mesh, expert_mesh))
        for s in mine
    }
    groups, mine, tied_param = _tied(runnable, layers, last_layer, rank)
    return Holdings(stages=stages, tied_groups=groups, tied_devices=mine, tied_param=tied_param)


def expert_group(plan, s: int, rank: int) -> tuple[int, ...]:
    """``rank``'s expert-parallel group in stage ``s`` (``PlanSpec.expert_groups``)."""
    return next(group for group in plan.expert_groups(s) if rank in group)


def local_experts(runnable: RunnableScenario, rank: int, stages: list[int]) -> dict[int, tuple[int, ...]]:
    """The routed experts ``rank`` holds in each layer of ``stages``: count/EP consecutive ones,
    by its place in its expert-parallel group (Megatron-Core's ``local_expert_indices``)."""
    plan, experts = runnable.plan, runnable.model.experts
    if experts is None or plan.expert_parallel == 1:
        return {}
    per_rank = experts.count // plan.expert_parallel
    held = {}
    for s in stages:
        first = expert_group(plan, s, rank).index(rank) * per_rank
        held.update({k: tuple(range(first, first + per_rank)) for k in range(*plan.stages[s].layers)})
    return held


def _stage(runnable: RunnableScenario, rank: int, s: int, layers: dict, last_layer: int, meshes) -> LocalStage:
    plan, microbatch_size = runnable.plan, runnable.scenario.training.microbatch_size
    mesh, expert_mesh = meshes
    owner, at = plan.stage_ranks, position(plan, rank)
    if plan.expert_tensor_parallel > 1:  # each routed expert cut to this device's 1/ETP of its width
        for moe in (m for layer in layers.values() for m in layer.modules() if isinstance(m, MoE)):  # MTP's too
            cut_width(moe, plan.stages[s].devices.index(rank) % plan.expert_tensor_parallel,
                      plan.expert_tensor_parallel)
    module = StageModule(layers, is_last=last_layer in layers)
    if plan.tensor_parallel > 1:
        parallelize_stage(module, mesh["tensor"], sequence_parallel=plan.sequence_parallel, first=0 in layers)
    if plan.context_parallel > 1:  # after TP (attention's heads are then this tensor rank's), as torchtitan
        apply_context_parallel(module, context_ring(mesh["context"], rank), runnable.model.values["seq_len"],
                               next(module.parameters()).device)
    if plan.recompute in (Recompute.SELECTIVE, Recompute.SELECTIVE_OP):  # after TP, before FSDP (torchtitan)
        apply_selective(module, plan.recompute)
    if plan.sharding in FSDP_SHARDINGS:
        dtype = runnable.model.values["dtype"]  # fp32 shards of a 16-bit model gathered in its dtype
        fp32_shards = plan.fsdp.fp32_shards and plan.sharding is Sharding.FULL and dtype in ("bf16", "fp16")
        shard_stage(module, mesh["data"], unit_layers=plan.fsdp.unit_layers, expert_mesh=expert_mesh,
                    reshard_after_forward=plan.sharding is Sharding.FULL and plan.fsdp.reshard_after_forward,
                    param_dtype=TORCH_DTYPES[dtype] if fp32_shards else None)
    start, end = sample_ranges(microbatch_size, column(plan, s, at))[rank]
    prev_remote = s > 0 and owner[s - 1] != owner[s]
    next_remote = s < plan.num_stages - 1 and owner[s + 1] != owner[s]
    into = pieces_between(microbatch_size, column(plan, s - 1, at), column(plan, s, at)) if prev_remote else ()
    out_of = pieces_between(microbatch_size, column(plan, s, at), column(plan, s + 1, at)) if next_remote else ()
    params = list(module.parameters())
    # a tied head's table, or the mtp layer's read from the first stage on this device (DualPipe's V)
    borrowed = list({id(w): w for layer in layers.values() for w in getattr(layer, "borrowed", ())
                     if all(w is not p for p in params)}.values())
    return LocalStage(
        index=s, module=module, params=params, weights=params + borrowed, start=start, size=end - start,
        recv_f=tuple(p for p in into if p.dst == rank), send_b=tuple(p for p in into if p.dst == rank),
        send_f=tuple(p for p in out_of if p.src == rank), recv_b=tuple(p for p in out_of if p.src == rank),
        local_prev=s > 0 and not prev_remote, local_next=s < plan.num_stages - 1 and not next_remote,
    )


def tied_groups(plan, sharded: bool) -> tuple[tuple[int, ...], ...]:
    """Megatron-LM's embedding groups for a tied embedding whose head sits on another device set:
    the devices whose copies of the token matrix sum their gradients after the step
    (``megatron/core/distributed/finalize_model_grads.py`` ``_allreduce_word_embedding_grads`` over
    ``parallel_state.get_embedding_group()``: the first and the last pipeline rank of one tensor
    and data coordinate). One group per tensor rank k, each the devices of tensor rank k (at
    every context rank) of every replica of the first and the last stage: all hold the same
    vocabulary slice, and the one all-reduce also sums the replicas and the context ranks' parts
    (the copy is left out of the stages' ``REDUCE_GRAD``). With ``sharded`` (FSDP2, whose reduce-scatter already summed the
    replicas and left each its shard) one group per (replica, position) instead: the two devices
    that hold the same shard."""
    first, last = plan.replicas(0), plan.replicas(plan.num_stages - 1)
    if sharded:
        return tuple((a[at], b[at]) for a, b in zip(first, last) for at in range(len(a)))
    t = plan.tensor_parallel
    return tuple(tuple(sorted({r[at] for r in (*first, *last) for at in range(k, plan.group_size, t)}))
                 for k in range(t))


def _tied(runnable: RunnableScenario, layers: dict, last_layer: int, rank: int) -> tuple[
        tuple[tuple[int, ...], ...], tuple[int, ...], torch.nn.Parameter | None]:
    """(every embedding group, ``rank``'s, its copy of the token matrix) of a tied embedding
    whose head, or an untied one whose MTP layer, sits on another device set; nothing when one
    device set holds both."""
    model, plan = runnable.model, runnable.plan
    if model.preset not in TRANSFORMERS or not (model.values["tied_embeddings"] or model.mtp_depth):
        return (), (), None
    first, last = plan.stages[0].devices, plan.stages[-1].devices
    if sorted(first) == sorted(last):
        return (), (), None  # one device set holds both: the head borrows the embedding's parameter
    groups = tied_groups(plan, plan.sharding in FSDP_SHARDINGS)  # ZeRO-2 reduce-scatters too
    mine = next((g for g in groups if rank in g), ())
    if 0 in layers:
        return groups, mine, layers[0].token.weight
    if model.values["tied_embeddings"] and last_layer in layers:
        return groups, mine, layers[last_layer].proj.weight
    if last_layer - 1 in layers and layers[last_layer - 1].table is not None:  # an untied MTP layer's copy
        return groups, mine, layers[last_layer - 1].table.weight
    return groups, mine, None
