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
kernels are unchanged; so are the parameters, gradients, optimizer state and stash (the report
also caches some activations in FP8, §3.3.3, not modelled), and the model FLOPs (MFU's count).
The products' bytes stay those of the model's dtype (they are compute-bound at these sizes).

Communication, §3.3.3 ("Low-Precision Communication"): the activations before the MoE
up-projections are quantized to FP8 before the dispatch, and so are the activation gradients
before the down-projections in the backward, while the combine and its gradient stay in BF16.
Of the four all-to-alls of an MoE block (dispatch and combine, forward and backward) two move
FP8 elements with one fp32 scale per 1×128 tile (§3.3.2), so the payload is
``FP8_A2A_SCALE`` = (1 + 4/128 + 2) / (2·2) of the bf16 one.
"""

from __future__ import annotations

from dataclasses import replace

from sim.core.model_spec import LayerSpec
from sim.core.specs import FP8

__all__ = ["FP8_A2A_SCALE", "GEMM_DTYPES", "fp8_block"]

GEMM_DTYPES = (FP8,)
"""What ``model.gemm_dtype`` may name (absent: the model's dtype)."""
FP8_TILE = 128
"""Elements sharing one fp32 scaling factor along a row of an activation (§3.3.2, 1×128 tiles)."""
FP8_A2A_SCALE = (1 + 4 / FP8_TILE + 2) / (2 * 2)
"""The expert all-to-all's bytes under FP8 dispatch over its bf16 bytes (module docstring)."""
KEPT_PRECISION = frozenset({"router"})
"""Weighted products of a block that stay in the model's dtype: the MoE gating (§3.3.1)."""


def fp8_block(layer: LayerSpec) -> LayerSpec:
    """``layer`` (a transformer block) with its weighted products on FP8 and its expert
    all-to-all's payload FP8 dispatch's (module docstring)."""
    kernels = tuple(replace(k, fp8=True) if k.weights and k.flop > 0 and not k.fused_attention
                    and k.name not in KEPT_PRECISION else k for k in layer.kernels)
    return replace(layer, kernels=kernels, a2a_bytes=layer.a2a_bytes * FP8_A2A_SCALE)
