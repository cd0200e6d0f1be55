"""Training stacks: the defaults a user of Megatron-LM, Megatron-Core, DeepSpeed or torchtitan gets.

Two runs of the same plan on two stacks differ in what they overlap, how their optimizer runs
and where its state lives, how their sharded data parallelism gathers, and what they recompute:
each stack has its own defaults, and most scenarios would otherwise repeat them by hand. A
scenario names its stack at the top level (``stack: torchtitan``); the stack's bundle is then
applied as defaults *under* the scenario's own keys: a key the scenario sets wins, and so does a
``--set`` override or a plan file given with ``--plan`` (both are merged before the stack fills
the gaps). A stack never creates a plan the scenario does not have: its ``plan.*`` values apply
only to a scenario with a plan. ``dapple-sim check`` lists every value the stack set, each with
its citation.

Which defaults: "what a user of that stack gets by following its documented recipe for large
runs" (the code's defaults, unless the stack's own large-run example changes them):

* ``megatron-lm`` — Megatron-LM's training script as its papers ran it (the SC21 and 2022
  scripts under ``examples/academic_paper_scripts/``): ``megatron/training/arguments.py``'s
  defaults, every overlap off (``--overlap-grad-reduce``, ``--overlap-param-gather``,
  ``--tp-comm-overlap`` are ``store_true``), apex's fused Adam;
* ``megatron-core`` — Megatron-Core's current large-run recipe (``examples/llama/
  train_llama3_8b_h100_fp8.sh``: ``--use-distributed-optimizer --overlap-grad-reduce
  --overlap-param-gather``), buckets of MCore's default size;
* ``deepspeed`` — DeepSpeed's ZeRO config defaults (``deepspeed/runtime/zero/config.py``):
  ``overlap_comm`` unset is true under ZeRO-3 and false below it, buckets of 5e8 elements;
* ``torchtitan`` — torchtitan as its December 2024 benchmark ran it (commit 9dec370): FSDP2
  per transformer block, resharded after forward, fp32 gradient reduction, AdamW with foreach,
  op-level selective activation checkpointing (``recompute: selective-op``);
* ``none`` — no bundle (the default).

Not here, because they are a user's choice rather than a stack's default: the sharding mode
(ZeRO stage, distributed optimizer on or off, except where the recipe turns it on), the
parallel degrees, the schedule. The attention kernel (``model.attention``) and the vocabulary's
padding (``model.vocab_divisible_by``, ``sim.models.vocab``) are set only for a generated
transformer (a measured profile already includes its attention and its vocabulary).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

from sim.core.errors import ScenarioError
from sim.input.model import ATTENTION_PRESETS
from sim.input.strict import show_value

__all__ = ["STACKS", "StackValue", "apply_stack"]

_MEGATRON = "NVIDIA/Megatron-LM"
_DEEPSPEED = "microsoft/DeepSpeed"
_TITAN = "pytorch/torchtitan@9dec370"


@dataclass(frozen=True, slots=True, kw_only=True)
class StackValue:
    """One default of a stack: the scenario key it fills, its value and where the stack says so."""

    key: str
    """Dotted scenario key, e.g. ``plan.overlap.grad_reduce``."""
    value: Any
    """The value, as a scenario file writes it (``true``, ``25MiB``, ``fused``)."""
    source: str
    """The stack's file and flag (or line) that sets it."""
    when_sharding: str | None = None
    """Applied only when the scenario's ``plan.sharding`` is this mode (DeepSpeed's ZeRO-3 defaults)."""

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "source": self.source}


def _v(key: str, value: Any, source: str, when_sharding: str | None = None) -> StackValue:
    return StackValue(key=key, value=value, source=source, when_sharding=when_sharding)


_MCORE_BUCKET = (f"{_MEGATRON} megatron/core/distributed/distributed_data_parallel.py: bucket_size = "
                 "max(40000000, 1000000 * dp_size) parameters; 40M fp32 main_grads (4 bytes) = 160MB; the "
                 "dp-dependent growth past 40 data-parallel ranks is not modelled")

_MEGATRON_VOCAB = (f"{_MEGATRON} megatron/training/arguments.py: --make-vocab-size-divisible-by (type=int, "
                   "default=128); megatron/training/tokenizer/tokenizer.py _vocab_size_with_padding (since 2026 "
                   "megatron/core/tokenizers/utils/build_tokenizer.py vocab_size_with_padding) pads to a multiple "
                   "of it times --tensor-model-parallel-size")

STACKS: Mapping[str, tuple[StackValue, ...]] = MappingProxyType({
    "none": (),
    "megatron-lm": (
        _v("model.attention", "unfused", f"{_MEGATRON}: attention as matmuls with the fused scale-mask-softmax "
           "kernel (Narayanan et al. 2021 §4.2); --use-flash-attn is store_true"),
        _v("model.kernels", "fused", f"{_MEGATRON}: fused LayerNorm (apex), bias-GeLU and bias-dropout-add "
           "kernels (megatron/core/fusions)"),
        _v("plan.overlap.grad_reduce", False, f"{_MEGATRON} megatron/training/arguments.py: --overlap-grad-reduce "
           "(store_true, default False)"),
        _v("plan.overlap.param_gather", False, f"{_MEGATRON} megatron/training/arguments.py: --overlap-param-gather "
           "(store_true, default False)"),
        _v("plan.overlap.tensor_parallel", False, f"{_MEGATRON} megatron/core/model_parallel_config.py: "
           "tp_comm_overlap = False"),
        _v("model.optimizer.implementation", "fused", f"{_MEGATRON} megatron/core/optimizer: apex/Transformer "
           "Engine FusedAdam (--optimizer adam, the default)"),
        _v("model.vocab_divisible_by", 128, _MEGATRON_VOCAB),
        _v("plan.overlap.reduce_after_flush", True, f"{_MEGATRON} megatron/training.py at 6fd7818 (2021-04-03) "
           "train_step: 'for model_module in model: model_module.allreduce_gradients()' after "
           "forward_backward_func returns (today finalize_model_grads at the schedule's end)"),
        _v("plan.overlap.paired_exchange", True, f"{_MEGATRON} megatron/schedules.py at 6fd7818 (2021-04-03), "
           "forward_backward_pipelining_with_interleaving: F, B, then one send_forward_backward_recv_forward_backward "
           "per steady step (megatron/core/pipeline_parallel/schedules.py keeps it while overlap_p2p_comm = False, "
           "the default)"),
    ),
    "megatron-core": (
        _v("model.attention", "cudnn", f"{_MEGATRON} examples/llama/train_llama3_8b_h100_fp8.sh: --attention-backend "
           "fused (Transformer Engine's DotProductAttention, which on Hopper prefers cuDNN's fused attention: "
           "NVIDIA/TransformerEngine transformer_engine/pytorch/attention.py at v1.9 and v1.11, 'Disabling "
           "FlashAttention to give FusedAttention preference on Hopper+')"),
        _v("model.kernels", "fused", f"{_MEGATRON}: Transformer Engine's fused RMSNorm, SwiGLU, rotary and "
           "bias-dropout-add kernels (megatron/core/fusions)"),
        _v("plan.overlap.grad_reduce", True, f"{_MEGATRON} examples/llama/train_llama3_8b_h100_fp8.sh: "
           "--overlap-grad-reduce"),
        _v("plan.overlap.param_gather", True, f"{_MEGATRON} examples/llama/train_llama3_8b_h100_fp8.sh: "
           "--overlap-param-gather"),
        _v("plan.overlap.tensor_parallel", False, f"{_MEGATRON} megatron/core/model_parallel_config.py: "
           "tp_comm_overlap = False (the recipe does not pass --tp-comm-overlap)"),
        _v("plan.overlap.bucket_size", "160MB", _MCORE_BUCKET),
        _v("plan.sharding", "optimizer", f"{_MEGATRON} examples/llama/train_llama3_8b_h100_fp8.sh: "
           "--use-distributed-optimizer (ZeRO-1)"),
        _v("model.optimizer.implementation", "fused", f"{_MEGATRON} megatron/core/optimizer: Transformer "
           "Engine/apex FusedAdam"),
        _v("model.optimizer.grad_dtype", "fp32", f"{_MEGATRON} megatron/training/arguments.py: bf16 sets "
           "accumulate_allreduce_grads_in_fp32 (main_grads_dtype fp32)"),
        _v("model.optimizer.grad_passes", ["zero", "divide", "nan_check", "norm"], f"{_MEGATRON} at core_r0.8.0 and "
           "core_v0.9.0: train_step's zero_grad_buffer (zero); param_and_grad_buffer.py start_grad_sync scales each "
           "bucket by 1/dp (average_in_collective False: divide) and NaN-checks it first (grad_data.norm, "
           "check_for_nan_in_grad from --no-check-for-nan-in-loss-and-grad, store_false: nan_check); --clip-grad 1.0's "
           "norm of the distributed optimizer's main grads (norm)"),
        _v("model.vocab_divisible_by", 128, _MEGATRON_VOCAB + " (the recipe does not pass the flag)"),
    ),
    "deepspeed": (
        _v("model.attention", "unfused", f"{_DEEPSPEED}: the model's own attention; Megatron-DeepSpeed's GPT runs "
           "Megatron's fused-softmax attention unless --use-flash-attn"),
        _v("model.kernels", "fused", f"{_DEEPSPEED}: Megatron-DeepSpeed's GPT runs Megatron's fused LayerNorm, "
           "bias-GeLU and bias-dropout-add kernels"),
        _v("plan.overlap.grad_reduce", False, f"{_DEEPSPEED} deepspeed/runtime/zero/config.py: overlap_comm "
           "unset is False below ZeRO-3 (overlap_comm_valid)"),
        _v("plan.overlap.grad_reduce", True, f"{_DEEPSPEED} deepspeed/runtime/zero/config.py: overlap_comm "
           "unset is True under ZeRO-3 (overlap_comm_valid: stage == weights)", when_sharding="full"),
        _v("plan.overlap.bucket_size", "1GB", f"{_DEEPSPEED} deepspeed/runtime/zero/config.py: reduce_bucket_size "
           "= 5e8 elements; 16-bit gradients (2 bytes) = 1GB"),
        _v("plan.fsdp.reduce_every_microbatch", True, f"{_DEEPSPEED} ZeRO-2/3 reduce-scatter (reduce_scatter = "
           "True) every micro-batch's gradients in the backward (deepspeed/runtime/zero/config.py)"),
        _v("model.optimizer.implementation", "fused", f"{_DEEPSPEED} deepspeed/ops/adam/fused_adam.py: "
           "\"optimizer\": {\"type\": \"Adam\"} builds FusedAdam on GPU"),
        _v("model.vocab_divisible_by", 128, "microsoft/Megatron-DeepSpeed megatron/arguments.py: "
           "--make-vocab-size-divisible-by (type=int, default=128); megatron/tokenizer/tokenizer.py "
           "_vocab_size_with_padding pads to a multiple of it times --tensor-model-parallel-size"),
    ),
    "torchtitan": (
        _v("model.attention", "sdpa", f"{_TITAN} torchtitan/models/llama/model.py: "
           "F.scaled_dot_product_attention(is_causal=True)"),
        _v("plan.overlap.grad_reduce", True, f"{_TITAN} torchtitan/parallelisms/parallelize_llama.py apply_fsdp: "
           "FSDP2 fully_shard per block, each block's reduce-scatter on its own stream during the backward"),
        _v("plan.fsdp.unit_layers", 1, f"{_TITAN} torchtitan/parallelisms/parallelize_llama.py apply_fsdp: "
           "fully_shard(transformer_block) for each block"),
        _v("plan.fsdp.reshard_after_forward", True, f"{_TITAN} torchtitan/parallelisms/parallelize_llama.py "
           "apply_fsdp: reshard_after_forward for every block but the last when not pipelined"),
        _v("plan.recompute", "selective-op", f"{_TITAN} train_configs/llama3_8b.toml, the benchmark's: "
           "[activation_checkpoint] mode = 'selective', selective_ac_option = 'op' (parallelize_llama.py "
           "_save_list: every other mm, SDPA's output; the rest recomputed; config_manager.py's own default "
           "is '2', every other block, and the 70B and 405B configs say mode = 'full')"),
        _v("model.optimizer.implementation", "foreach", f"{_TITAN} torchtitan/optimizer.py: foreach = not fused; "
           "--optimizer.fused store_true (default False)"),
        _v("model.optimizer.grad_dtype", "fp32", f"{_TITAN} torchtitan/config_manager.py: "
           "--training.mixed_precision_reduce default float32"),
        _v("model.kernels", "eager", f"{_TITAN} torchtitan/config_manager.py: --training.compile store_true "
           "(default False; train_configs/llama3_8b.toml compile = false), so models/norms.py RMSNorm, "
           "models/llama/model.py apply_rotary_emb, repeat_kv and SwiGLU run as eager kernels"),
        _v("plan.fsdp.fp32_shards", True, f"{_TITAN} train.py builds the model in fp32 (meta device, to_empty, "
           "init_weights); parallelize_llama.py apply_fsdp: MixedPrecisionPolicy(param_dtype=bf16, "
           "reduce_dtype=fp32), whose sharded parameters stay fp32 and are what the optimizer steps"),
        _v("model.vocab_divisible_by", 1, f"{_TITAN} train.py: model_config.vocab_size = tokenizer.n_words, "
           "unpadded (models/llama/model.py: nn.Embedding(vocab_size, dim), nn.Linear(dim, vocab_size)); "
           "a vocabulary t does not divide is sharded unevenly by DTensor, modelled at its largest shard, "
           "a multiple of t"),
    ),
})
"""Stack name -> its defaults, in the order ``check`` lists them."""




def apply_stack(raw: dict, *, source: str) -> tuple[dict, str, tuple[StackValue, ...]]:
    """``raw`` without its ``stack`` key and with the stack's defaults under its own keys;
    the stack's name and the values it set (those the scenario left open), in ``STACKS`` order."""
    name = raw.get("stack", "none")
    if not isinstance(name, str) or name not in STACKS:
        raise ScenarioError(f"{source}: stack: unknown value {show_value(name)}; valid: {', '.join(sorted(STACKS))}")
    raw = {key: value for key, value in raw.items() if key != "stack"}
    if name == "none":
        return raw, name, ()
    raw = copy.deepcopy(raw)
    plan = raw.get("plan")
    sharding = plan.get("sharding", "none") if isinstance(plan, dict) else None
    used: list[StackValue] = []
    for value in STACKS[name]:
        if value.when_sharding not in (None, sharding):
            continue
        if value.when_sharding is None and any(v.key == value.key and v.when_sharding is not None
                                               and v.when_sharding == sharding for v in STACKS[name]):
            continue  # the value for this sharding mode comes instead
        if value.key in _TRANSFORMER_KEYS and not _has_attention(raw):
            continue
        if value.key == "model.kernels" and value.value == "eager" and raw["model"].get("preset") != "llama":
            continue  # eager element-wise kernels are modelled for Llama blocks only
        if _set_default(raw, value.key, value.value):
            used.append(value)
    return raw, name, tuple(used)


_TRANSFORMER_KEYS = ("model.attention", "model.kernels", "model.vocab_divisible_by")
"""Keys only a generated transformer takes (``sim.input.model``)."""


def _has_attention(raw: dict) -> bool:
    """Whether the scenario's model is a generated transformer, which takes ``model.attention``."""
    model = raw.get("model")
    return isinstance(model, dict) and "profile" not in model and model.get("preset") in ATTENTION_PRESETS


_SHORTHANDS = {("plan", "schedule"): "name", ("model", "optimizer"): "name"}
"""Keys that take a name or a mapping: the mapping key a plain name stands for."""


def _set_default(raw: dict, dotted: str, value: Any) -> bool:
    """Set ``dotted`` to ``value`` unless the scenario sets it or lacks the section it belongs
    to (a plan, a model); True when set."""
    parts = dotted.split(".")
    node = raw.get(parts[0])
    if not isinstance(node, dict):
        return False
    path = (parts[0],)
    for part in parts[1:-1]:
        path += (part,)
        child = node.get(part)
        if isinstance(child, str) and path in _SHORTHANDS:
            child = node[part] = {_SHORTHANDS[path]: child}
        elif child is None and path == ("model", "optimizer"):
            child = node[part] = {"name": "adam"}  # the scenario's default optimizer (docs/scenario.md)
        elif child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            return False  # the scenario's own value there; the reader reports it if malformed
        node = child
    if parts[-1] in node:
        return False
    node[parts[-1]] = value
    return True
