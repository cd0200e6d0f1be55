"""Kernels: what a generated layer launches on the device, so its time can depend on its size.

"FLOPs divided by peak times one efficiency" misses three things measured pipelines show:
small matrix products run far below peak, element-wise work (layer norms, softmax, GeLU,
residual adds) is bound by memory bandwidth, and no kernel runs faster than the host can
issue it. So a generated layer lists its forward kernels, each with, per sample, its FLOPs
and the bytes it reads and writes, plus the bytes it reads once per call (its weights). The
cost model (``sim.cost.compute.kernel_time_s``) turns a kernel on ``n`` samples into

    t = max( n·flop / (peak · eff(n·flop)),  (n·bytes + fixed_bytes) / (bandwidth · mem_eff),  issue ) + overhead,

the roofline bound (Williams, Waterman & Patterson, CACM 2009), floored by the host's time to
issue the kernel (the device runs kernels asynchronously, so it waits for a kernel only if the
host has not issued it yet), with a matrix efficiency that rises with the product's dimensions
and saturates:

    eff(M, N, K) = e_max / ((1 + D/M) · (1 + D/N)),

each output dimension reaching half of its share when it equals the device's ``matmul_half_dim``
D. Its form models tile and wave quantisation: a GEMM's output is computed in tiles of roughly D
along M and N, and the parts of tiles beyond a small dimension are wasted work (NVIDIA,
"Matrix Multiplication Background User's Guide", sections on tile and wave quantisation);
a hyperbolic saturation per dimension is the simplest curve with that limit, and unlike an
efficiency that depends on the FLOP count alone (which only adds a constant per call, the
same as a launch overhead) it can be told apart from the overhead by a fit. ``e_max``, D,
the overhead and ``mem_eff`` are device parameters (``sim.core.specs.DeviceSpec``) that
``dapple-sim calibrate`` fits to measured runs.

A backward runs every matrix product twice (the input gradient and, for a layer with
weights, the weight gradient; attention's products without weights have two input
gradients) and every element-wise kernel once over twice the bytes, unless the kernel says
what its backward moves (``KernelSpec.bwd_bytes``).

Transformer kernels follow Megatron-LM's layer (Shoeybi et al., 2019; FLOPs as in
Narayanan et al., SC'21, §5.1): layer norm, QKV projection, attention scores, softmax,
attention dropout (GPT, BERT), attention over values, output projection, residual add, layer
norm, MLP up, GeLU, MLP down, residual add.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ATTENTION_CORE", "ATTENTION_DROPOUT_MASK_BYTES", "KernelSpec", "transformer_block", "embedding", "lm_head", "bert_head", "linear", "conv", "pool",
           "classifier_loss"]


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelSpec:
    """One forward kernel of a layer."""

    name: str
    flop: float = 0.0
    """FLOPs per sample (matrix products and convolutions; 0 for element-wise kernels)."""
    rows: float = 0.0
    """A product's M per sample (rows grow with the samples); N and K do not."""
    cols: float = 0.0
    """A product's N."""
    inner: float = 0.0
    """A product's K."""
    bytes: float = 0.0
    """Bytes read and written per sample (activations)."""
    fixed_bytes: float = 0.0
    """Bytes read once per call, whatever the samples (weights)."""
    weights: bool = False
    """Its backward computes a weight gradient."""
    bwd_bytes: float | None = None
    """Bytes per sample its backward reads and writes (element-wise kernels); None: twice
    ``bytes`` (the gradient and what it saved read, one gradient written)."""


def _gemm(name: str, m: float, n: float, k: float, d: int, *, weights: bool) -> KernelSpec:
    """A product of an (m × k) activation by a (k × n) matrix, per sample: m rows per sample."""
    dims = dict(flop=2 * m * n * k, rows=m, cols=n, inner=k)
    if weights:
        return KernelSpec(name=name, bytes=d * (m * k + m * n), fixed_bytes=d * k * n, weights=True, **dims)
    return KernelSpec(name=name, bytes=d * (m * k + k * n + m * n), **dims)


def _elementwise(name: str, elements: float, d: int, *, passes: int = 2, weights: bool = False) -> KernelSpec:
    """Reads and writes ``elements`` per sample (``passes`` tensors of them)."""
    return KernelSpec(name=name, bytes=passes * d * elements, weights=weights)


def transformer_block(s: int, h: int, a: int, f: int, d: int, *, kv_heads: int | None = None, gated: bool = False,
                      tensor: int = 1, context: int = 1, sequence_parallel: bool = False,
                      dropout: bool = False) -> tuple[KernelSpec, ...]:
    """One pre-norm transformer block on s tokens of width h, a heads, MLP width f, as one device
    of a tensor-parallel group of ``tensor`` and a context-parallel group of ``context`` runs it.

    Megatron-LM's split (Shoeybi et al. 2019, §3): the QKV projection and the MLP's first
    linear are column-parallel (output width / t), the output projection and the MLP's second
    linear row-parallel (inner width / t), heads split over t. Context parallelism (ring
    attention) gives each device s/c queries, attending over all s keys in c steps. Norms and
    residual adds run on every token of the device's s/c, or on s/(c·t) of them with sequence
    parallelism (Korthikanti et al. 2022, §4.2.2). Grouped-query attention projects to
    ``kv_heads`` key and value heads; a gated MLP (SwiGLU) has two input projections.
    With ``dropout`` (GPT, BERT) the attention probabilities go through a dropout of their own
    (Megatron-LM's ``attention_dropout`` after the fused scale-mask-softmax, the s×s tensors
    Korthikanti et al. 2022, §4.1 count: its output and 1-byte mask): it reads the
    probabilities and writes them and the mask, and its backward reads the gradient and the
    mask and writes one gradient (``ATTENTION_DROPOUT_MASK_BYTES``).
    """
    t, q = tensor, s / context
    h_kv = (kv_heads or a) * h // a
    pointwise = q / t if sequence_parallel else q
    up = 2 * f if gated else f
    probs = a / t * q * s
    drop = (KernelSpec(name="attention_dropout", bytes=(2 * d + ATTENTION_DROPOUT_MASK_BYTES) * probs,
                       bwd_bytes=(2 * d + ATTENTION_DROPOUT_MASK_BYTES) * probs),) if dropout else ()
    return (
        _elementwise("ln1", pointwise * h, d),
        _gemm("qkv", q, (h + 2 * h_kv) / t, h, d, weights=True),
        _gemm("scores", q * a / t, s, h // a, d, weights=False),
        _elementwise("softmax", probs, d),
        *drop,
        _gemm("attend", q * a / t, h // a, s, d, weights=False),
        _gemm("proj", q, h, h / t, d, weights=True),
        _elementwise("residual1", pointwise * h, d, passes=3),
        _elementwise("ln2", pointwise * h, d),
        _gemm("mlp_up", q, up / t, h, d, weights=True),
        _elementwise("swiglu" if gated else "gelu", q * f / t, d, passes=3 if gated else 2),
        _gemm("mlp_down", q, h, f / t, d, weights=True),
        _elementwise("residual2", pointwise * h, d, passes=3),
    )


ATTENTION_CORE = frozenset({"scores", "softmax", "attention_dropout", "attend"})
"""The kernels selective recompute runs again in the backward (Korthikanti et al. 2022, §5: the
QKᵀ product, softmax, softmax dropout and attention over V)."""

ATTENTION_DROPOUT_MASK_BYTES = 1
"""Bytes per element of the attention dropout's mask (a ``torch.bool``; Korthikanti et al. 2022,
§4.1 count as² bytes for it)."""


def embedding(s: int, h: int, d: int, *, tables: int) -> tuple[KernelSpec, ...]:
    """Look-ups in ``tables`` embedding tables and their sum: memory-bound, all weight gradient
    (``s`` is the tokens the device embeds; a vocabulary-parallel table writes all of them)."""
    return (_elementwise("lookup", s * h, d, passes=tables + 1, weights=True),)


def lm_head(s: int, h: int, vocab: int, d: int, *, tensor: int = 1) -> tuple[KernelSpec, ...]:
    """Final norm, projection to the vocabulary, softmax and cross-entropy (fp32 logits), on one
    device's ``vocab / tensor`` slice of the vocabulary (Megatron's vocabulary-parallel head)."""
    v = vocab / tensor
    return (
        _elementwise("ln_f", s * h, d),
        _gemm("logits", s, v, h, d, weights=True),
        KernelSpec(name="loss", bytes=3 * 4 * s * v),
    )


def bert_head(s: int, h: int, vocab: int, d: int) -> tuple[KernelSpec, ...]:
    """BERT's masked-LM head: dense, GeLU, layer norm, then as ``lm_head``."""
    return (_gemm("dense", s, h, h, d, weights=True), _elementwise("gelu", s * h, d)) + lm_head(s, h, vocab, d)


def linear(n_in: int, n_out: int, d: int) -> tuple[KernelSpec, ...]:
    """A linear layer and its ReLU on one vector per sample."""
    return (_gemm("linear", 1, n_out, n_in, d, weights=True), _elementwise("relu", n_out, d))


def classifier_loss(n_in: int, classes: int, d: int) -> tuple[KernelSpec, ...]:
    """A classifier's linear layer, softmax and cross-entropy."""
    return (_gemm("logits", 1, classes, n_in, d, weights=True), KernelSpec(name="loss", bytes=3 * 4 * classes))


def conv(c_in: int, c_out: int, size: int, d: int, *, kernel: int = 3) -> tuple[KernelSpec, ...]:
    """A same-padded convolution on a size×size image and its ReLU (implicit GEMM:
    size² rows, c_out columns, kernel²·c_in inner dimension)."""
    return (_gemm("conv", size * size, c_out, kernel * kernel * c_in, d, weights=True),
            _elementwise("relu", c_out * size * size, d))


def pool(channels: int, size: int, d: int) -> tuple[KernelSpec, ...]:
    """A 2×2 max-pool: reads the image, writes a quarter of it."""
    return (KernelSpec(name="pool", bytes=d * channels * size * size * 1.25),)
