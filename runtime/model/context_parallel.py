"""Context parallelism: each device of a context group holds 1/c of every sequence.

A replica's c context ranks run the same layers on the same samples, each on its part of the
sequence; only attention needs the rest of it, and gets it from ``runtime.model.ring_attention``.
Everything else (norms, MLPs, the head's loss) is per token and runs on the part as it is.

**The cut** is Megatron-LM's load-balanced one (``megatron/core/utils.py``,
``get_batch_on_this_cp_rank`` → ``_get_batch_on_this_cp_rank_per_sequence_balancing``, at
NVIDIA/Megatron-LM d98e8a6): the sequence in 2c equal chunks, context rank r holding chunks r
and 2c−1−r, so that under the causal mask every rank attends over as many key/query pairs as
any other (``sequence_positions``). Token ids and labels are cut the same way (``context_batch``;
with multi-token prediction the labels ahead of each held position, from the whole sequence), and
positions come from the global indices: GPT's learned position table is read at them and
Llama's rotary angles are computed from them (``Embedding.positions``, ``Attention.positions``).

**Gradients.** Parameters are replicated over the context group, each rank's backward giving
the gradient of its own tokens; the stage's gradient all-reduce sums them, since
``PlanSpec.gradient_groups`` spans data × context (Megatron's data-parallel-with-context
group), and each rank's mean loss is scaled by 1/c so that the sum is the mean over all tokens.
"""

from __future__ import annotations

import functools

import torch
from torch.distributed.device_mesh import DeviceMesh

from runtime.model.layers import Attention, Embedding
from runtime.model.mtp import labels_ahead
from runtime.model.ring_attention import Ring, ring_attention
from runtime.model.tensor_parallel import stage_mesh

__all__ = ["apply_context_parallel", "context_batch", "context_ring", "context_tokens", "sequence_positions"]


def sequence_positions(seq_len: int, context_parallel: int, context_rank: int) -> torch.Tensor:
    """Global token indices context rank r holds, in order: chunks r and 2c−1−r of the
    sequence cut in 2c chunks of ``seq_len / 2c`` (Megatron-LM's load-balanced split)."""
    chunk = seq_len // (2 * context_parallel)
    assert chunk * 2 * context_parallel == seq_len, (seq_len, context_parallel)
    first, second = context_rank, 2 * context_parallel - 1 - context_rank
    return torch.cat([torch.arange(first * chunk, (first + 1) * chunk),
                      torch.arange(second * chunk, (second + 1) * chunk)])


def context_tokens(plan, at: int, seq_len: int, device: torch.device) -> torch.Tensor | None:
    """The global token indices held by the device at layout position ``at`` of its device set
    (``sequence_positions`` of its context rank, ``at // tensor_parallel``); None without
    context parallelism."""
    if plan.context_parallel == 1:
        return None
    return sequence_positions(seq_len, plan.context_parallel, at // plan.tensor_parallel).to(device)


def context_batch(batch: tuple[torch.Tensor, torch.Tensor], sequence: torch.Tensor,
                  mtp_depth: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A context rank's part of a whole batch (token ids, labels): both at its global indices
    ``sequence``; with multi-token prediction the labels ``mtp_depth`` positions ahead of each held
    position too (``runtime.model.mtp.labels_ahead``), since those may lie in another rank's chunk."""
    inputs, labels = batch
    return inputs[:, sequence], labels_ahead(labels, mtp_depth, sequence) if mtp_depth else labels[:, sequence]


def context_ring(mesh: DeviceMesh, rank: int) -> Ring:
    """The ring of ``rank``'s context group: the ``context`` dimension of its device set's mesh
    (the devices of one tensor rank in one replica, ``PlanSpec.context_groups``)."""
    ranks = tuple(int(r) for r in mesh.mesh.flatten().tolist())
    return Ring(ranks=ranks, index=ranks.index(rank), group=mesh.get_group())


def profile_groups(plan, rank: int, device_type: str) -> tuple[DeviceMesh | None, Ring | None]:
    """``rank``'s tensor-parallel mesh and context ring as the profile times them: every rank builds
    every group's mesh (``stage_mesh``), so both are None for a plan without such groups."""
    if plan.group_size <= 1:
        return None, None
    mesh = stage_mesh(plan, rank, device_type)
    return (mesh["tensor"] if plan.tensor_parallel > 1 else None,
            context_ring(mesh["context"], rank) if plan.context_parallel > 1 else None)


def apply_context_parallel(module: torch.nn.Module, ring: Ring, seq_len: int, device: torch.device) -> None:
    """Make every layer of ``module`` run on ``ring``'s rank's part of the sequence, in place:
    positions from the global indices, attention over the ring. Applied after tensor
    parallelism (the heads are then this tensor rank's) and before recompute and FSDP2."""
    positions = sequence_positions(seq_len, ring.size, ring.index).to(device)
    for sub in module.modules():
        if isinstance(sub, Embedding):
            sub.positions = positions
        elif isinstance(sub, Attention):
            sub.positions = positions
            sub.core = functools.partial(ring_attention, ring=ring)  # GQA expands inside its blocks
