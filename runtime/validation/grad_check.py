"""The single-process reference: the unsplit model on the whole batch, and the comparison.

A pipelined, replicated step is correct when it computes what one process computes on the
same weights and data: the mean loss of the whole global batch and its gradient. Split-
concat, micro-batching and gradient all-reduce only reorder fp32 sums, so the two agree to
rounding. ``compare_grads`` reports the largest absolute difference and whether every
tensor is close relative to its own scale (``|a - b| <= rtol * max|b|`` elementwise). A
tensor whose true gradient is zero (a key projection's bias: softmax ignores a constant
added to every score) holds only rounding noise, so no tensor's scale is taken below
``NOISE_FLOOR`` times the largest gradient of the model.

Tensor-parallel and sharded gradients are gathered to full tensors on their ranks
(``DTensor.full_tensor``) before they come here, so every name has its whole gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.model.config import ModelConfig
from runtime.model.context_parallel import sequence_positions
from runtime.model.experts import MoE
from runtime.model.models import TRANSFORMERS, num_layers, synthetic_batch, whole_model
from sim.core.plan import PlanSpec
from sim.cost.split import sample_ranges

__all__ = ["NOISE_FLOOR", "GradComparison", "Reference", "compare_grads", "drop_groups", "reference_step",
           "token_servers"]

NOISE_FLOOR = 1e-3
"""The smallest scale a tensor is compared at, relative to the model's largest gradient."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Reference:
    loss: float
    """Mean loss of the global batch."""
    grads: dict[str, torch.Tensor]
    """Gradient of every parameter, by name (``layers.3.qkv.weight``), on the CPU."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GradComparison:
    max_abs_grad_diff: float
    """Largest |distributed − reference| over every gradient element."""
    max_rel_grad_diff: float
    """Largest per-tensor max|difference| / max|reference|."""
    worst: str
    """Name of the tensor with the largest relative difference."""
    passed: bool
    """Every tensor within ``rtol`` of its reference."""
    compared: int
    """Number of gradient tensors compared."""


def reference_step(
    config: ModelConfig, global_batch_size: int, *, step: int = 0, seed: int = 0, device: torch.device | str = "cpu",
    drop_groups: dict[int, torch.Tensor] | None = None, token_servers: dict[int, torch.Tensor] | None = None,
) -> Reference:
    """Loss and gradients of the whole model on step ``step``'s whole batch, in one process
    (``drop_groups``: the plan's groups of tokens per MoE layer, over which a capacity factor
    drops as each device does, ``drop_groups``; ``token_servers``: each token's server of every
    expert per MoE layer, as its expert-parallel group routes it, ``token_servers``)."""
    model = whole_model(config, seed=seed, device=device)
    for index, layer in model.layers.items():
        for moe in (m for m in layer.modules() if isinstance(m, MoE)):  # the MTP layer's too
            if drop_groups:
                moe.token_groups = drop_groups[int(index)]  # a ModuleDict: keys are strings
            if token_servers and int(index) in token_servers:
                moe.token_servers = token_servers[int(index)].to(device)
    inputs, labels = synthetic_batch(config, global_batch_size, step=step, seed=seed, device=device)
    loss = model(inputs, labels)
    loss.backward()
    grads = {name: p.grad.detach().to("cpu", copy=True) for name, p in model.named_parameters()}
    return Reference(loss=float(loss.detach()), grads=grads)


def _reference_name(config: ModelConfig, name: str) -> str:
    """A tied head's own copy of the token matrix (on another stage) is the embedding's, and so
    is an MTP layer's copy (``runtime.model.mtp.MultiTokenPrediction.hold_copy``)."""
    head = f"layers.{num_layers(config) - 1}.proj.weight"
    if config.preset in TRANSFORMERS and config.values["tied_embeddings"] and name == head:
        return "layers.0.token.weight"
    if config.mtp_depth and name == f"layers.{num_layers(config) - 2}.table.weight":
        return "layers.0.token.weight"
    return name


def compare_grads(
    config: ModelConfig, grads: list[dict[str, torch.Tensor]], reference: Reference, *, rtol: float = 1e-5
) -> GradComparison:
    """Compare each rank's named gradients (``grads``, one dict per rank) to ``reference``."""
    max_abs = max_rel = 0.0
    worst, passed, compared, seen = "", True, 0, set()
    floor = NOISE_FLOOR * max(float(g.float().abs().max()) for g in reference.grads.values())
    for rank_grads in grads:
        for name, grad in sorted(rank_grads.items()):
            ref_name = _reference_name(config, name)
            expected = reference.grads[ref_name]
            seen.add(ref_name)
            diff = float((grad.float() - expected.float()).abs().max())
            scale = max(float(expected.float().abs().max()), floor)
            rel = diff / scale if scale > 0 else diff
            if rel > max_rel:
                max_rel, worst = rel, name
            max_abs = max(max_abs, diff)
            passed = passed and diff <= rtol * scale
            compared += 1
    missing = sorted(set(reference.grads) - seen)
    assert not missing, f"no rank reported gradients of {missing[:3]}"
    return GradComparison(max_abs_grad_diff=max_abs, max_rel_grad_diff=max_rel, worst=worst, passed=passed,
                          compared=compared)


def drop_groups(plan: PlanSpec, *, microbatch_size: int, num_microbatches: int, seq_len: int,
                layers: range) -> dict[int, torch.Tensor]:
    """For each layer of ``layers``: a label per token of the global batch (flattened as
    (sample, position)), the same for exactly the tokens one device routes in one call: its
    (micro-batch, replica, context rank, tensor rank) at the layer's stage, so that a capacity
    factor drops in the reference as on the devices (``runtime.model.experts.within_capacity``).
    Context rank j holds the positions ``sequence_positions(seq_len, c, j)`` (Megatron-LM's
    load-balanced cut), and tensor rank k the k-th 1/t of them (``MoE.tensor_split`` without
    sequence parallelism)."""
    labels = {}
    for s, stage in enumerate(plan.stages):
        label = torch.empty(num_microbatches * microbatch_size, seq_len, dtype=torch.long)
        for call, _, rows, positions in _calls(plan, s, microbatch_size, num_microbatches, seq_len):
            label[rows, positions] = call
        labels.update({index: label.reshape(-1) for index in range(*stage.layers) if index in layers})
    return labels


def token_servers(plan: PlanSpec, config: ModelConfig, *, microbatch_size: int, num_microbatches: int,
                  seq_len: int) -> dict[int, torch.Tensor]:
    """For each MoE layer with node-limited routing (``ModelConfig.expert_servers``): each token
    of the global batch's server of every routed expert (tokens × count), the map of the device
    that routes and dispatches it (the ``drop_groups`` cut), so that the reference routes every
    token over the servers its expert-parallel group spans (``MoE.token_servers``)."""
    out = {}
    for s, stage in enumerate(plan.stages):
        for index in range(*stage.layers):
            if config.servers_of(index) is None:
                continue
            servers = torch.empty(num_microbatches * microbatch_size, seq_len, config.experts.count,
                                  dtype=torch.long)
            for _, device, rows, positions in _calls(plan, s, microbatch_size, num_microbatches, seq_len):
                servers[rows, positions] = torch.tensor(config.servers_of(index, device))
            out[index] = servers.reshape(-1, config.experts.count)
    return out


def _calls(plan: PlanSpec, s: int, microbatch_size: int, num_microbatches: int, seq_len: int):
    """Every (label, device, samples, positions) of stage ``s``: the tokens of the global batch
    one device routes in one call, labelled (micro-batch · replicas + replica) · c · t + its
    place j · t + k in its replica (context rank j, tensor rank k; with or without sequence
    parallelism a tensor rank dispatches its 1/t)."""
    t, c = plan.tensor_parallel, plan.context_parallel
    parts = [_device_positions(seq_len, c, j, t, k) for j in range(c) for k in range(t)]  # index j·t + k
    replicas = plan.replicas(s)
    ranges = sample_ranges(microbatch_size, tuple(replica[0] for replica in replicas))
    for m in range(num_microbatches):
        for r, replica in enumerate(replicas):
            start, end = ranges[replica[0]]
            rows = slice(m * microbatch_size + start, m * microbatch_size + end)
            for part, positions in enumerate(parts):
                yield (m * len(replicas) + r) * c * t + part, replica[part], rows, positions


def _device_positions(seq_len: int, context_parallel: int, context_rank: int, tensor_parallel: int,
                      tensor_rank: int) -> torch.Tensor:
    """The global positions one device routes: its context rank's part of the sequence
    (``sequence_positions``; all of it without context parallelism), and of that the tensor
    rank's k-th 1/t (``tensor_parallel`` 1 without tensor parallelism)."""
    held = torch.arange(seq_len) if context_parallel == 1 else \
        sequence_positions(seq_len, context_parallel, context_rank)
    width = held.numel() // tensor_parallel
    return held[tensor_rank * width:(tensor_rank + 1) * width]
