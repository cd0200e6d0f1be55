"""Selective recompute with torch's selective activation checkpointing (SAC).

``recompute: full`` runs a stage's forward again in its backward (the executor does it, from
the stashed stage input). The two selective modes instead wrap a region of each transformer
block in ``torch.utils.checkpoint.checkpoint(fn, *inputs, use_reentrant=False, context_fn=...)``,
whose context pair from ``create_selective_checkpoint_contexts(policy)`` asks ``policy`` about
every aten op the region runs: outputs marked ``MUST_SAVE`` are cached until the backward,
everything else runs again there (``PREFER_RECOMPUTE``); the region's inputs are kept by the
checkpoint. Regions are wrapped after tensor parallelism and before FSDP2, the order of
torchtitan's ``parallelize_llama`` (TP, activation checkpointing, compile, FSDP).

* ``selective`` (Megatron-LM's ``--recompute-granularity selective``; Korthikanti et al. 2022,
  §5): the region is the attention core (``Attention.core``: GQA's key/value expansion, then
  QKᵀ, softmax and ·V in one scaled-dot-product kernel), as Megatron-LM checkpoints its
  ``core_attention`` with Q, K and V as inputs (``_checkpointed_attention_forward``); the
  policy recomputes all of it. The block keeps everything else autograd saves (the norms' and
  the linears' inputs, the MLP's activations) and the core's inputs Q, K, V; the kernel's own
  stash (its output's log-sum-exp; an unfused attention's s×s tensors) is rebuilt.
* ``selective_op`` (torchtitan's op-level SAC: ``_apply_ac_to_transformer_block`` with
  ``mode: selective, selective_ac_option: op``, ``torchtitan/parallelisms/parallelize_llama.py``
  at 9dec370, ``_save_list`` and ``_custom_policy``): the region is the whole block; save the
  outputs of ``aten.mm`` (but every second one of a block), of the fused attention kernels
  (torchtitan lists the CUDA flash and efficient ones; the CPU flash kernel is their
  counterpart here) and of sequence parallelism's reduce-scatter, recompute everything else.
  This is the policy ``sim.cost.kernels.OP_SAC_PRODUCTS`` and
  ``sim.cost.memory.op_sac_stash_bytes`` model.

The meter (``runtime.measure.memory.SavedTensorMeter``) sees a region's inputs through its
saved-tensor hooks (the checkpoint saves them before it installs its own hooks) but not SAC's
cache, so each checkpointed call hands the cache to the meter watching it (``hold_cached``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from runtime.measure.memory import watching_meter
from runtime.model.layers import Attention, TransformerBlock
from sim.core.parallelism import Recompute

__all__ = ["TORCHTITAN_SAVE_LIST", "apply_selective"]

_aten = torch.ops.aten

TORCHTITAN_SAVE_LIST = frozenset({
    _aten.mm.default, _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_flash_attention.default, _aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default, _aten.max.default,
})
"""torchtitan's ``_save_list`` (9dec370), with the CPU flash kernel beside the CUDA ones."""


def _attention_core_policy(counts: dict, ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """``selective``: the region is the attention core, and all of it runs again."""
    return CheckpointPolicy.PREFER_RECOMPUTE


def _torchtitan_policy(counts: dict, ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """``selective_op``: torchtitan's ``_custom_policy`` (its mm counter per mode and call)."""
    mode = "recompute" if ctx.is_recompute else "forward"
    if op == _aten.mm.default:
        counts[mode] = counts.get(mode, 0) + 1
    save = op in TORCHTITAN_SAVE_LIST and not (op == _aten.mm.default and counts[mode] % 2 == 0)
    return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE


def _checkpointed(fn: Callable, policy: Callable, *inputs: torch.Tensor) -> torch.Tensor:
    caching = []

    def context_fn():
        # a fresh policy state per call, as torchtitan's selective_checkpointing_context_fn
        contexts = create_selective_checkpoint_contexts(functools.partial(policy, {}))
        caching.append(contexts[0])
        return contexts

    out = checkpoint(fn, *inputs, use_reentrant=False, context_fn=context_fn)
    meter = watching_meter()
    if meter is not None and caching:
        meter.hold_cached(caching[0].storage)
    return out


def apply_selective(module: nn.Module, recompute: Recompute) -> None:
    """Checkpoint ``recompute``'s region of every transformer block in ``module``, in place (the
    modules keep their classes and their parameters' names; only a method is wrapped)."""
    for sub in module.modules():
        if recompute is Recompute.SELECTIVE and isinstance(sub, Attention):
            sub.core = functools.partial(_checkpointed, sub.core, _attention_core_policy)
        elif recompute is Recompute.SELECTIVE_OP and isinstance(sub, TransformerBlock):
            sub.forward = functools.partial(_checkpointed, sub.forward, _torchtitan_policy)
