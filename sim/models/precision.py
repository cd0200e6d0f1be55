"""FP8 matrix products: which of a block's kernels run on FP8 tensor cores, and what the
expert all-to-all sends in FP8.

DeepSeek-V3 (arXiv 2412.19437, §3.3.1, Figure 6) trains with "the majority of core computation
kernels, i.e., GEMM operations, implemented in FP8 precision": the three GEMMs of every Linear
operator, Fprop, Dgrad and Wgrad, while "the embedding module, the output head, MoE gating
modules, normalization operators, and attention operators" keep their original precision.
``model.gemm_dtype: fp8`` marks exactly those products of the transformer blocks: every kernel
with a weight and FLOPs (QKV or MLA's projections, the output projection, the dense and shared
MLP, the routed experts) but the router (``KernelSpec.fp8``), which ``sim.cost.compute`` prices
at the device's FP8 peak (``DeviceSpec.peak_fp8_flop_per_s``) with the same size-dependent
efficiency as any product. The embedding, the head, the fused attention and the element-wise
kernels are unchanged; so are the parameters, gradients, optimizer state and the model FLOPs
(MFU's count), and the stash unless ``model.fp8_activations`` (below).
The products' bytes stay those of the model's dtype (they are compute-bound at these sizes).

The casts (:func:`fp8_cast_kernel`): an FP8 product's operands are quantized before it runs,
each a memory-bound pass that reads the bf16 tensor and writes FP8 with one fp32 scale per 128
(``FP8_CAST_BYTES`` per element): the input along its rows (1×128 tiles) for Fprop, the output
gradient for Dgrad, and both again, transposed, along the other axis (128×1 tiles, what Wgrad's
K-major operands need) for Wgrad. DeepSeek's profile of a DualPipe F&B pair of 4 MoE blocks at
the pre-training plan (EP 64, 4K tokens; deepseek-ai/profile-data ``train.json`` at 4496024)
runs them as kernels of their own beside the GEMMs, ``per_token_cast_to_fp8_with_channels`` and
``per_channel_cast_and_transpose`` (with ``batched_transpose``, ``cast_back`` and their kin,
about 17 ms of its 129). Fused variants (the SwiGLU's output cast in its own kernel, the
dispatch's on the sender) are counted as separate passes all the same.

Communication, §3.3.3 ("Low-Precision Communication"): the activations before the MoE
up-projections are quantized to FP8 before the dispatch, and so are the activation gradients
before the down-projections in the backward, while the combine and its gradient stay in BF16.
Of the four all-to-alls of an MoE block (dispatch and combine, forward and backward) two move
FP8 elements with one fp32 scale per 1×128 tile (§3.3.2), so the payload is
``FP8_A2A_SCALE`` = (1 + 4/128 + 2) / (2·2) of the bf16 one.

The stash, ``model.fp8_activations`` (:func:`fp8_stash_saving_bytes`): DeepSeek-V3 caches "activations
in FP8 format for the backward pass of the Linear operator" (§3.3.3, "Low-Precision Activation"),
with two exceptions: the inputs of the Linear after the attention operator, also the attention
backward's, in a custom E5M6 (12 bits), and "the inputs of the SwiGLU operator in MoE", cached in
FP8 with the SwiGLU's output recomputed in the backward; and it recomputes "all RMSNorm
operations and MLA up-projections during back-propagation" (§3.2.3), so no norm's output (the
input of the attention's and the MLP's first products) is kept. Every FP8 element carries one
fp32 scale per 128 (``FP8_CACHED_BYTES`` = 1 + 4/128 bytes; E5M6 1.5 + 4/128). Of a block's stash
(``sim.cost.memory.block_activation_bytes``, ``sim.models.moe``, ``sim.models.mla``) this drops the
attention's and the MLP's inputs, stores the output-projection input in E5M6 and, in an MoE
block (shared and routed experts), the experts' inputs and SwiGLU inputs in FP8 and their
SwiGLU outputs (the down-projections' inputs) not at all; a dense block's down-projection input
in FP8. The norms' inputs and MLA's latents stay in the model's dtype. What is recomputed runs
again in the backward (``KernelSpec.recomputed``, its forward time added there): the block's
norms and, in an MoE block, the shared and routed experts' SwiGLUs (``RECOMPUTED``).

Nor are the routed experts' outputs kept for the gate's gradient (``sim.models.moe`` keeps them,
the weighted combine's input in Megatron-Core's older unpermute). DeepEP, the all-to-all DeepSeek-V3
trained with, sends the top-k weights with the tokens (``dispatch(x, topk_idx, topk_weights)``
returns ``recv_topk_weights`` on the experts' rank), its forward combine is an unweighted sum
(``combine(x, handle)``, which saves nothing), and the weights' gradient comes back in the
backward dispatch's combine (``combine(grad_recv_x, handle, topk_weights=grad_recv_topk_weights)``;
deepseek-ai/DeepEP ``docs/legacy.md`` at dd758ca, the V1 interface of the report's time): the
weights are applied on the experts' side, where the only cached tensor after the up-projection
is the SwiGLU's input (§3.3.3), so the gate's gradient is the recomputed SwiGLU output's product
with its gradient (the weighted SwiGLU, ``weighted_bias_swiglu_impl`` of Megatron-Core's
``TEGroupedMLP``), and the ``s·top_k`` rows of ``hidden`` bf16 outputs are not stashed. DeepSeek's
training profile runs exactly those kernels: ``swiglu_forward_with_weight_and_per_token_cast_to_fp8``,
``swiglu_forward_backward_with_weight`` and ``swiglu_weight_backward_with_weight``
(deepseek-ai/profile-data ``train.json`` at 4496024).
"""

from __future__ import annotations

from dataclasses import replace

from sim.core.errors import SpecError
from sim.core.model_spec import LayerSpec
from sim.core.parallelism import Shard
from sim.core.specs import FP8
from sim.cost.kernels import KernelSpec
from sim.cost.memory import BlockShape
from sim.models.moe import busy_rows

__all__ = ["E5M6_CACHED_BYTES", "FP8_A2A_SCALE", "FP8_CACHED_BYTES", "GEMM_DTYPES", "RECOMPUTED", "fp8_block", "fp8_cast_kernel", "fp8_cached_block", "fp8_stash_saving_bytes"]

GEMM_DTYPES = (FP8,)
"""What ``model.gemm_dtype`` may name (absent: the model's dtype)."""
FP8_TILE = 128
"""Elements sharing one fp32 scaling factor along a row of an activation (§3.3.2, 1×128 tiles)."""
FP8_A2A_SCALE = (1 + 4 / FP8_TILE + 2) / (2 * 2)
"""The expert all-to-all's bytes under FP8 dispatch over its bf16 bytes (module docstring)."""
FP8_CACHED_BYTES = 1 + 4 / FP8_TILE
"""Bytes an activation element cached in FP8 takes with its share of the tile's fp32 scale (§3.3.3)."""
E5M6_CACHED_BYTES = 12 / 8 + 4 / FP8_TILE
"""The same in E5M6, the output-projection inputs' format (§3.3.3)."""
RECOMPUTED = {"norms": frozenset({"ln1", "ln2"}), "moe": frozenset({"swiglu", "silu", "swiglu_mul", "experts_act"})}
"""The kernels the recipe runs again in the backward: every block's norms ("all RMSNorm
operations", §3.2.3), an MoE block's SwiGLUs too (their outputs "recomputed", §3.3.3)."""
FP8_CAST_BYTES = 2 + FP8_CACHED_BYTES
"""Bytes a cast to FP8 moves per element: the bf16 element read, the FP8 element and its scale share written."""
KEPT_PRECISION = frozenset({"router"})
"""Weighted products of a block that stay in the model's dtype: the MoE gating (§3.3.1)."""


def fp8_block(layer: LayerSpec) -> LayerSpec:
    """``layer`` (a transformer block) with its weighted products on FP8, their casts
    (:func:`fp8_cast_kernel`) and its expert all-to-all's payload FP8 dispatch's (module docstring)."""
    kernels = tuple(replace(k, fp8=True) if k.weights and k.flop > 0 and not k.fused_attention
                    and k.name not in KEPT_PRECISION else k for k in layer.kernels)
    return replace(layer, kernels=kernels + (fp8_cast_kernel(kernels),), a2a_bytes=layer.a2a_bytes * FP8_A2A_SCALE)


def fp8_cast_kernel(kernels) -> KernelSpec:
    """The casts of the FP8 products among ``kernels`` as one element-wise kernel (module
    docstring): per sample, the inputs (M × K each) in the forward, ``FP8_CAST_BYTES`` an element;
    in the backward the output gradients (M × N) for Dgrad, then the inputs and the output gradients
    again, transposed, for Wgrad. A grouped product's M is all its groups' rows: its FLOPs 2·M·N·K
    over 2N are M·K, over 2K M·N."""
    inputs = sum(k.flop / (2 * k.cols) for k in kernels if k.fp8)
    outputs = sum(k.flop / (2 * k.inner) for k in kernels if k.fp8)
    return KernelSpec(name="fp8_cast", bytes=FP8_CAST_BYTES * inputs, bwd_bytes=FP8_CAST_BYTES * (inputs + 2 * outputs))


def fp8_stash_saving_bytes(*, seq_len: int, hidden: int, attention_out: int, ffn_hidden: int, gated: bool, d: int,
                           moe: bool, routed_rows: float = 0.0, expert_ffn: int = 0) -> float:
    """Bytes a block's stash loses per sample to DeepSeek-V3's FP8 caching and recompute (module
    docstring): ``s·h·2d`` (the attention's and the MLP's inputs, norm outputs, recomputed), the
    output-projection input's ``s·attention_out`` elements at E5M6, and in an MoE block the shared
    MLP's SwiGLU input in FP8 and its output dropped, the ``routed_rows`` expert rows' inputs
    (``hidden``) and SwiGLU inputs in FP8, their SwiGLU outputs (``expert_ffn``) and the experts'
    outputs (``hidden``, weighted on the experts' side) dropped; in a dense
    block the down-projection's input (``ffn_hidden``) in FP8. ``gated``: a SwiGLU MLP (two inputs)."""
    s, h, f, q8 = seq_len, hidden, ffn_hidden, d - FP8_CACHED_BYTES
    saved = s * h * 2 * d + s * attention_out * (d - E5M6_CACHED_BYTES)
    act = 2 if gated else 1
    if not moe:
        return saved + s * f * q8
    saved += s * f * (act * q8 + d)
    return saved + routed_rows * (h * q8 + act * expert_ffn * q8 + expert_ffn * d + h * d)


def fp8_cached_block(layer: LayerSpec, shape: BlockShape, shard: Shard, *, experts=None, mla=None) -> LayerSpec:
    """``layer`` (a block of ``shape``; an MoE block when ``experts`` is given) with the stash
    DeepSeek-V3's FP8 caching and recompute leave (:func:`fp8_stash_saving_bytes`), modelled
    whole over the sequence and the hidden size, as DeepSeek-V3 runs (no tensor or context parallelism)."""
    if shard.tensor > 1 or shard.context > 1:
        key = "tensor_parallel" if shard.tensor > 1 else "context_parallel"
        raise SpecError(key, "model.fp8_activations is modelled without tensor or context parallelism (DeepSeek-V3 "
                             "uses neither); set 1, or remove model.fp8_activations")
    s, h = shape.seq_len, shape.hidden
    out = mla.v_head_dim * shape.heads if mla is not None else h
    if experts is None:
        saved = fp8_stash_saving_bytes(seq_len=s, hidden=h, attention_out=out, ffn_hidden=shape.ffn_hidden,
                                       gated=shape.gated, d=shape.element_bytes, moe=False)
    else:
        local = experts.count // shard.expert
        saved = fp8_stash_saving_bytes(seq_len=s, hidden=h, attention_out=out, gated=shape.gated, d=shape.element_bytes,
                                       ffn_hidden=experts.ffn_hidden * experts.shared, moe=True,
                                       routed_rows=local * busy_rows(experts, shard, s),
                                       expert_ffn=experts.ffn_hidden // shard.expert_tensor)
    again = RECOMPUTED["norms"] | (RECOMPUTED["moe"] if experts is not None else frozenset())
    kernels = tuple(replace(k, recomputed=True) if k.name in again else k for k in layer.kernels)
    return replace(layer, stash_bytes=layer.stash_bytes - saved, selective_stash_bytes=layer.selective_stash - saved,
                   kernels=kernels)
