"""FP8 matrix products with DeepSeek-V3's fine-grained scales, through ``torch._scaled_mm``.

``model.gemm_dtype: fp8`` runs a transformer block's weighted products in FP8 (the simulator's
``sim.models.precision``: the attention's and MLA's projections, the output projection, the
dense, shared and routed experts' matrices; not the router, the embedding, the head, the
attention scores or the MTP projection). The recipe is DeepSeek-V3's (arXiv 2412.19437, §3.3):

* **Format** (§3.3.2, "Mantissa over Exponents"): E4M3 on every tensor, largest finite value
  ``E4M3_MAX`` = 448 (torch's ``float8_e4m3fn``); 3 mantissa bits, so a value rounds to within
  a relative 2⁻⁴ (half a step of 2⁻³).
* **Fine-grained scales** (§3.3.2, "Fine-Grained Quantization"; "Online Quantization"): an
  activation is scaled per 1×128 tile (per token, per 128 channels), a weight per 128×128
  block, each by its tile's max|x| / 448 (:func:`quantize_rows`, :func:`quantize_blocks`), so
  one outlier spoils 128 values, not the tensor. A zero tile keeps scale 1.
* **Promotion** (§3.3.2, "Increasing Accumulation Precision"): the tensor cores' partial sums
  are copied to FP32 registers every N_C = 128 elements of K and the scales applied there. Here
  each K-chunk of one tile is one ``torch._scaled_mm`` with row-wise scales (the activation's
  per token for that chunk, ``scale_a`` (M, 1); the weight block's per output column,
  ``scale_b`` (1, N)), and the chunks are summed in fp32 (:func:`scaled_product`).
* **The three GEMMs** of a Linear (§3.3.1, Figure 6), in :class:`Fp8Product`: Fprop ``y = x Wᵀ``
  (x 1×128, W 128×128); Dgrad ``dx = dy W`` (dy quantised 1×128 along the output channels, the
  same W blocks, contracted over them); Wgrad ``dW = dyᵀ x`` from the *same* per-token
  1×128-quantised dy and x, dequantised and multiplied in fp32. DeepSeek instead reads the
  cached 1×128 activations out, dequantises, transposes and requantises them into 128×1 tiles
  (§3.5.2, "Support for Transposed GEMM Operations") for an FP8 Wgrad whose tiles run along the
  tokens. That makes a token's contribution depend on the 127 others it is tiled with, so a
  gradient would change with how tokens are grouped (micro-batches, data-parallel replicas,
  expert dispatch order) and no split run could match the unsplit model. Ours carries the
  same quantisation of x and dy as Fprop and Dgrad, without the second rounding; the cost
  (an FP8 GEMM) is the simulator's to price, not this CPU runtime's to measure.
* **Precision kept**: master weights, gradients and the optimizer stay in ``model.dtype`` (fp32
  on the CPU), as DeepSeek keeps master weights and weight gradients in FP32 (§3.3.1, §3.3.3);
  the bias is added outside the product; the output and the gradients return in the inputs'
  dtypes. The expert all-to-all moves ``model.dtype``, where DeepSeek dispatches the FP8
  tiles (§3.3.3; the simulator prices those bytes): the same numbers, since the experts'
  first products quantise each token's 1×128 tiles as the dispatch would.

**Tiles never straddle shards.** Tensor parallelism cuts a column-parallel matrix on its output
channels and a row-parallel one on its input channels (``runtime.model.tensor_parallel``;
expert tensor parallelism the routed experts the same way, ``runtime.model.experts.cut_width``).
A dimension cut in p parts is tiled part by part: each part of L/p from its start in tiles of
128, the last one shorter (``tile_bounds``), so a tile is min(128, L/p) wide where L/p ≤ 128.
:class:`Fp8Linear` keeps the part length its global dimension has (``out_segment``,
``in_segment``), set from the plan's degrees when the model is built (``use_fp8``): the unsplit
reference, built knowing them, quantises exactly as the shards do, and a shard's own dimension
is one part.

**DTensor.** Under tensor parallelism ``parallelize_module`` hands the layer DTensor weights
and inputs (a Linear subclass, so ``ColwiseParallel`` and ``RowwiseParallel`` accept it). The
product runs on the local shards (``Fp8Linear.forward``): a column-parallel layer's replicated
input's local gradient is a partial sum (``to_local(grad_placements=[Partial()])``, as
DTensor's own ``mm`` gives) and its output ``Shard(-1)``; a row-parallel layer's output is a
``Partial`` sum, its bias (replicated) added as a DTensor (which spreads it over the partial
sums); the styles' output hooks then all-reduce or reduce-scatter as for any Linear. The
products are the unsplit layer's bit for bit, but the backward's sums are not (the
vocabulary-parallel loss, partial input gradients), and E4M3's rounding of dy turns a last bit
into a rounding step: tensor-parallel gradients match the unsplit FP8 model's within about
1e-2, not 1e-5 (``tests/test_runtime_fp8.py``); pipeline, data, expert and expert-tensor
parallelism, whose per-token arithmetic is the unsplit model's, within 1e-5.

Under ``recompute: selective-op`` the products run again in the backward: torchtitan's save
list (``runtime.model.recompute``) names ``aten.mm``, not ``aten._scaled_mm``.

On a GPU ``torch._scaled_mm`` wants K and N multiples of 16 and H100-class row-wise scaling;
the tiny CPU models here have no such limits.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Shard

from runtime.model.config import ModelConfig
from sim.core.specs import FP8

__all__ = ["COLUMN_PARALLEL", "E4M3", "E4M3_MAX", "ROW_PARALLEL", "TILE", "Fp8Linear", "Fp8Product",
           "check_rtol", "dequantize_rows", "quantize_blocks", "quantize_rows", "scaled_product", "tile_bounds",
           "use_fp8"]

E4M3 = torch.float8_e4m3fn
"""The FP8 format of every quantised tensor (§3.3.2: E4M3 on all tensors)."""
E4M3_MAX = 448.0
"""E4M3's largest finite value (``torch.finfo(torch.float8_e4m3fn).max``): a tile's max|x| maps to it."""
TILE = 128
"""Elements per scale along a quantised dimension, and K elements per FP32 promotion (N_C, §3.3.2)."""
COLUMN_PARALLEL = frozenset({"q", "k", "v", "w1", "w3"})
"""A block's Linears cut on their output channels under tensor parallelism (``ColwiseParallel``
in ``runtime.model.tensor_parallel._block_plan``; routed experts' w1 and w3 under expert tensor
parallelism)."""
ROW_PARALLEL = frozenset({"out", "w2"})
"""A block's Linears cut on their input channels (``RowwiseParallel``; routed experts' w2)."""
E4M3_STEP = 2.0 ** -3
"""E4M3's relative step (3 mantissa bits): one rounding of a value moves it by at most this much
of itself."""
KEPT_PRECISION = frozenset({"router"})
"""A block's Linears that stay in the model's dtype: MoE gating (§3.3.1; ``sim.models.precision``)."""


def tile_bounds(length: int, segment: int) -> tuple[tuple[int, int], ...]:
    """[start, stop) of each tile of a dimension of ``length`` made of parts of ``segment``:
    each part tiled from its own start by ``TILE``, its last tile shorter (module docstring)."""
    assert length % segment == 0, (length, segment)
    return tuple((start + a, start + min(a + TILE, segment))
                 for start in range(0, length, segment) for a in range(0, segment, TILE))


def _scales(amax: torch.Tensor) -> torch.Tensor:
    """max|x| / 448 per tile; 1 where a tile is all zeros (any scale quantises it exactly)."""
    return torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))


def _sizes(bounds: tuple[tuple[int, int], ...], device) -> torch.Tensor:
    return torch.tensor([stop - start for start, stop in bounds], device=device)


def _spread(scales: torch.Tensor, rows: torch.Tensor | None, cols: torch.Tensor) -> torch.Tensor:
    """Each tile's scale on each of its elements (``rows`` None: one tile row per row)."""
    full = scales.repeat_interleave(cols, dim=1)
    return full if rows is None else full.repeat_interleave(rows, dim=0)


def _to_e4m3(x: torch.Tensor, full_scales: torch.Tensor) -> torch.Tensor:
    # x / scale lies within ±448 up to the division's rounding: clamp so the cast never overflows
    return (x / full_scales).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


def quantize_rows(x: torch.Tensor, cols: tuple[tuple[int, int], ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 values, fp32 scales (M, len(cols))) of an activation ``x`` (M, K) in 1×128 tiles:
    per row (token) and per ``cols`` bound, divided by the tile's max|x| / 448 and rounded to
    the nearest E4M3 value."""
    x = x.float()
    scales = torch.stack([_scales(x[:, c0:c1].abs().amax(dim=1)) for c0, c1 in cols], dim=1)
    return _to_e4m3(x, _spread(scales, None, _sizes(cols, x.device))), scales


def quantize_blocks(w: torch.Tensor, rows: tuple[tuple[int, int], ...],
                    cols: tuple[tuple[int, int], ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 values, fp32 scales (len(rows), len(cols))) of a weight ``w`` (N, K) in 128×128
    blocks (``rows`` × ``cols`` bounds), each divided by its max|w| / 448."""
    w = w.float()
    scales = torch.stack([torch.stack([_scales(w[r0:r1, c0:c1].abs().amax()) for c0, c1 in cols]) for r0, r1 in rows])
    return _to_e4m3(w, _spread(scales, _sizes(rows, w.device), _sizes(cols, w.device))), scales


def dequantize_rows(q: torch.Tensor, scales: torch.Tensor, cols: tuple[tuple[int, int], ...]) -> torch.Tensor:
    """The fp32 values of ``quantize_rows``' output: each E4M3 value times its tile's scale."""
    return q.float() * _spread(scales, None, _sizes(cols, q.device))


def scaled_product(a: torch.Tensor, a_scales: torch.Tensor, b: torch.Tensor, b_scales: torch.Tensor,
                   inner: tuple[tuple[int, int], ...], outer: tuple[tuple[int, int], ...]) -> torch.Tensor:
    """fp32 ``(a × its scales) @ (b × its scales)ᵀ`` for E4M3 ``a`` (M, K) in 1×128 tiles along K
    (``a_scales`` (M, chunks)) and E4M3 ``b`` (N, K) in blocks (``b_scales`` (N blocks, chunks),
    ``outer`` the N bounds): one ``torch._scaled_mm`` per K-chunk of ``inner`` with row-wise
    scales, the chunks summed in fp32 (§3.3.2's promotion every N_C = 128)."""
    out_sizes = _sizes(outer, b.device)
    total = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float32, device=a.device)
    for c, (k0, k1) in enumerate(inner):
        mat2 = b[:, k0:k1].contiguous().t()  # (chunk, N), column-major as _scaled_mm's mat2 is on a GPU
        total += torch._scaled_mm(a[:, k0:k1].contiguous(), mat2, scale_a=a_scales[:, c:c + 1].contiguous(),
                                  scale_b=b_scales[:, c].repeat_interleave(out_sizes).unsqueeze(0),
                                  out_dtype=torch.float32)
    return total


class Fp8Product(torch.autograd.Function):
    """``x Wᵀ`` for 2D ``x`` (M, K) and ``W`` (N, K) with FP8 Fprop, Dgrad and Wgrad (module
    docstring); ``out_segment``, ``in_segment``: the lengths of the parts N and K are tiled in."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, out_segment: int, in_segment: int) -> torch.Tensor:
        n_bounds, k_bounds = tile_bounds(weight.shape[0], out_segment), tile_bounds(weight.shape[1], in_segment)
        xq, x_scales = quantize_rows(x, k_bounds)
        wq, w_scales = quantize_blocks(weight, n_bounds, k_bounds)
        ctx.save_for_backward(xq, x_scales, wq, w_scales)  # the FP8 operands are what the backward keeps
        ctx.bounds, ctx.dtypes = (n_bounds, k_bounds), (x.dtype, weight.dtype)
        return scaled_product(xq, x_scales, wq, w_scales, k_bounds, n_bounds).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        xq, x_scales, wq, w_scales = ctx.saved_tensors
        (n_bounds, k_bounds), (x_dtype, w_dtype) = ctx.bounds, ctx.dtypes
        gq, g_scales = quantize_rows(grad, n_bounds)  # dy in 1×128 tiles along the output channels
        # Dgrad: dx = dy W, contracted over N: W's blocks transposed, scaled per input channel
        dx = scaled_product(gq, g_scales, wq.t(), w_scales.t(), n_bounds, k_bounds)
        # Wgrad: dW = dyᵀ x from the same per-token operands, dequantised, in fp32
        dw = dequantize_rows(gq, g_scales, n_bounds).t() @ dequantize_rows(xq, x_scales, k_bounds)
        return dx.to(x_dtype), dw.to(w_dtype), None, None


class Fp8Linear(nn.Linear):
    """An ``nn.Linear`` whose product runs in FP8 (``Fp8Product``); its parameters as the Linear's.

    ``out_segment``, ``in_segment``: the lengths of the parts its output and input channels are
    cut in (tensor or expert tensor parallelism; the whole dimension otherwise), which tiles
    never straddle."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool, out_parts: int = 1,
                 in_parts: int = 1, device=None, dtype=None) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.out_segment, self.in_segment = out_features // out_parts, in_features // in_parts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._product(x, self.bias)

    def unbiased(self, x: torch.Tensor) -> torch.Tensor:
        """The product without the bias (a routed expert's w2 on expert-tensor ranks but the first)."""
        return self._product(x, None)

    def _product(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        weight = self.weight
        if not isinstance(weight, DTensor):
            y = Fp8Product.apply(x.reshape(-1, x.shape[-1]), weight, self.out_segment, self.in_segment)
            y = y.reshape(*x.shape[:-1], y.shape[-1])
            return y if bias is None else y + bias
        mesh, (placement,) = weight.device_mesh, weight.placements
        column = placement == Shard(0)
        # a column-parallel layer's replicated input gets a partial gradient from each shard
        local = x.to_local(grad_placements=[Partial()]) if column else x.to_local()
        y = Fp8Product.apply(local.reshape(-1, local.shape[-1]), weight.to_local(), self.out_segment, self.in_segment)
        y = y.reshape(*local.shape[:-1], y.shape[-1])
        if column:
            y = y if bias is None else y + bias.to_local()
            return DTensor.from_local(y, mesh, [Shard(y.dim() - 1)], run_check=False)
        y = DTensor.from_local(y, mesh, [Partial()], run_check=False)  # each shard's part of the K sum
        return y if bias is None else y + bias


def check_rtol(config: ModelConfig, rtol: float) -> float:
    """The gradient tolerance ``--check`` applies: ``rtol``, or one E4M3 step (``E4M3_STEP``)
    for FP8 products under tensor parallelism. There the backward's fp32 sums run in another
    order than the unsplit model's (the vocabulary-parallel loss, partial input gradients), and a
    last-bit difference at a rounding boundary of dy's quantisation is one E4M3 step, not one ulp
    (module docstring); the loss, computed before any such rounding, stays at ``rtol``."""
    return max(rtol, E4M3_STEP) if config.gemm_dtype == FP8 and config.tensor_parallel > 1 else rtol


def use_fp8(block: nn.Module, *, tensor_parallel: int = 1, expert_tensor_parallel: int = 1) -> None:
    """Make every weighted product of ``block`` but the router an ``Fp8Linear``, in place,
    tiled for the plan's tensor-parallel (dense and shared matrices) and expert-tensor-parallel
    (routed experts) degrees (module docstring); parameter names and values unchanged."""
    for name, linear in sorted(block.named_modules()):
        leaf = name.rsplit(".", 1)[-1]
        if type(linear) is not nn.Linear or leaf in KEPT_PRECISION:
            continue
        parts = expert_tensor_parallel if ".experts." in f".{name}" else tensor_parallel
        fp8 = Fp8Linear(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta",
                        out_parts=parts if leaf in COLUMN_PARALLEL else 1,
                        in_parts=parts if leaf in ROW_PARALLEL else 1)
        fp8.weight, fp8.bias = linear.weight, linear.bias
        parent = block.get_submodule(name.rsplit(".", 1)[0]) if "." in name else block
        setattr(parent, leaf, fp8)
