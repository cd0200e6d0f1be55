"""Built-in models: layer lists computed from a handful of shape parameters.

A pipeline simulator needs, for every layer, four numbers per sample: how many bytes of
parameters it holds, how many FLOPs its forward and its backward take, how many bytes it
keeps from its forward until its backward (its *stash*), and how many bytes it hands to the
next layer (what crosses a cut between two stages). A measured profile gives them for one
real model; a generator computes them from the model's shape, so that "GPT with 48 blocks of
hidden 1024" can be studied without a GPU. Presets are entries of a name -> callable table::

    build_model("gpt", layers=48, hidden=1024, heads=16, seq_len=512, vocab=30522)

Conventions shared by every generator (``s`` sequence length, ``h`` hidden size, ``a`` heads,
``f`` MLP width, ``V`` vocabulary, ``d`` bytes per element of the training dtype):

* Parameter bytes are the parameter count times ``d`` (gradients take as many; optimizer
  state is ``ModelSpec.optimizer_state_bytes_per_param_byte`` on top).
* FLOPs count matrix multiplications and convolutions only, two FLOPs per multiply-add, as
  model-FLOPs utilisation does (Narayanan et al., SC'21, §5.1). The backward of a matmul is
  two matmuls of the same size (input gradient and weight gradient), so backward = 2 ×
  forward and half of it is weight gradient (``wgrad_fraction`` 0.5). Layers without any
  matmul (embedding look-up, max-pooling) get a nominal one FLOP per element they touch, so
  that a cost model driven by FLOPs does not make them free.
* The stash of a layer is what *its own* backward needs, on the device that runs it: its
  input, plus 1-byte masks for dropout and ReLU (as Korthikanti et al., MLSys'23, §4.1 count
  dropout masks). A ReLU's backward only needs to know where its output was positive; we
  count that as a 1-byte mask rather than the output itself, because the output is the next
  layer's input and is already stashed there — counting it twice would double the dominant
  term. Losses keep their logits or probabilities in fp32 (Korthikanti §4.3; PyTorch autocast
  also runs softmax and cross-entropy in fp32).
* The last layer computes the loss, a scalar per micro-batch: its output bytes are 0.

One module per family: ``sim.models.transformer`` (gpt, bert, llama), ``sim.models.vgg``,
``sim.models.mlp``; the layers they share are in ``sim.models.layers``, the parameter
table and its checks in ``sim.models.params``, and the vocabulary's padding (Megatron-LM's
``--make-vocab-size-divisible-by``) in ``sim.models.vocab``. A built model remembers its generator and
parameters (``ModelSpec.preset``).
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import Any, Callable, Mapping

from sim.core.errors import SpecError
from sim.core.model_spec import ModelSpec
from sim.core.parallelism import Shard
from sim.core.specs import DTYPE_BYTES
from sim.models.mlp import mlp
from sim.models.params import PRESET_PARAMS, REQUIRED, names
from sim.models.transformer import bert, gpt, llama
from sim.models.vgg import vgg
from sim.models.vocab import VocabPadding, padded_vocab, vocab_padding

__all__ = ["REQUIRED", "PRESET_PARAMS", "MODEL_PRESETS", "SHARDABLE", "VocabPadding", "build_model",
           "mfu_flop_per_sample", "model_flop_per_sample", "padded_vocab", "shard_model", "vocab_padding"]


MODEL_PRESETS: Mapping[str, Callable[..., ModelSpec]] = MappingProxyType(
    {"bert": bert, "gpt": gpt, "llama": llama, "mlp": mlp, "vgg": vgg}
)
"""Preset name -> generator taking the preset's parameters as keywords."""


def build_model(preset: str, **params: Any) -> ModelSpec:
    """Build the model of ``preset`` from its parameters (see ``PRESET_PARAMS``).

    Raises ``SpecError`` keyed ``preset`` for an unknown preset, or keyed by the parameter
    for an unknown, missing or invalid one.
    """
    if preset not in MODEL_PRESETS:
        raise SpecError("preset", f"unknown model preset {preset!r}; valid: {names(MODEL_PRESETS)}")
    return MODEL_PRESETS[preset](**params)


SHARDABLE = ("gpt", "llama")
"""Presets whose layers can be built as one device of a tensor- or context-parallel group sees them."""


def shard_model(model: ModelSpec, shard: Shard) -> ModelSpec:
    """``model`` as one device of a tensor- and context-parallel group holds and runs it.

    The layers are rebuilt by the model's generator for that share (``sim.models.transformer``),
    the vocabulary padded for ``shard.tensor`` (``sim.models.vocab.padded_vocab``); a whole shard
    returns ``model`` itself. A measured profile or a preset without a sharded form
    is a ``SpecError`` keyed ``tensor_parallel`` (or ``context_parallel``) that says what to use.
    """
    if model.experts is None and shard.splits_experts:
        key = "expert_parallel" if shard.expert > 1 else "expert_tensor_parallel"
        raise SpecError(key, "the model has no experts (model.experts); remove the key or set 1")
    if shard.is_whole and not shard.splits_experts:
        return model
    key = "tensor_parallel" if shard.tensor > 1 else "context_parallel" if shard.context > 1 else "expert_parallel"
    if model.preset is None:
        raise SpecError(key, f"{model.name} is a measured profile, whose layers cannot be split over devices; "
                             f"use a built-in model ({' or '.join(SHARDABLE)}) to model {key.replace('_', ' ')}ism")
    if model.preset.name not in SHARDABLE:
        raise SpecError(key, f"preset {model.preset.name} is modelled whole; {key.replace('_', ' ')}ism is modelled "
                             f"for {', '.join(SHARDABLE)}")
    extra = {"kernels": "eager"} if model.kernels == "eager" else {}  # only llama takes it
    if model.experts is not None:
        extra["experts"] = model.experts
    if model.mla is not None:
        extra["mla"] = model.mla
    if model.gemm_dtype is not None:
        extra["gemm_dtype"] = model.gemm_dtype
    if model.mtp_depth:
        extra["mtp_depth"] = model.mtp_depth
    if model.fp8_activations:
        extra["fp8_activations"] = True
    built = MODEL_PRESETS[model.preset.name](shard=shard, attention=model.attention or "unfused",
                                             **extra, **model.preset.values)
    # what the scenario set beside the generator's parameters (sim.input.model) carries over
    return replace(built, optimizer_implementation=model.optimizer_implementation,
                   grad_dtype=model.grad_dtype, moment_dtype=model.moment_dtype,
                   grad_accumulation=model.grad_accumulation, grad_passes=model.grad_passes,
                   recompute_blocks_only=model.recompute_blocks_only)


def model_flop_per_sample(model: ModelSpec) -> float:
    """Forward plus backward FLOPs of every layer for one sample (the numerator of MFU)."""
    return sum(layer.fwd_flop + layer.bwd_flop for layer in model.layers)


def mfu_flop_per_sample(model: ModelSpec) -> float | None:
    """Model FLOPs of one sample's training step, as MFU counts them; None for a measured profile.

    A transformer (gpt, bert, llama): per token 6N + 12·L·h·s, N the non-embedding parameters
    (the blocks'), L layers, h hidden, s sequence length (Chowdhery et al. 2022, "PaLM",
    Appendix B); recomputation is not counted. With experts N counts the active parameters, the
    routed experts' top_k/count of them (as DeepSeek-V3's "37B activated" does). The count has no vocabulary term, so the padded
    rows (``sim.models.vocab``) do not enter it; Megatron-LM's own throughput count does add the
    logits, 6·s·h·V per sample with V its padded size (``megatron/training/training.py``
    ``num_floating_point_operations``: ``args.padded_vocab_size`` in its "Logit" term). Other
    generated models: their layers' forward and backward FLOPs (``model_flop_per_sample``).
    """
    if any(layer.is_measured for layer in model.layers):
        return None
    values = model.preset.values if model.preset is not None else {}
    if model.preset is None or model.preset.name not in ("gpt", "bert", "llama"):
        return model_flop_per_sample(model)
    width = DTYPE_BYTES[model.dtype]
    blocks = sum(layer.param_bytes for layer in model.layers if layer.name.startswith("block_")) / width
    if model.experts is not None:  # a token runs through top_k of the routed experts: its active parameters
        blocks -= model.expert_param_bytes() / width * (1 - model.experts.top_k / model.experts.count)
    s, h, layers = values["seq_len"], values["hidden"], values["layers"]
    return s * (6 * blocks + 12 * layers * h * s)
