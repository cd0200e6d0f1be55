"""Kernels: what a generated layer launches on the device, so its time can depend on its size.

"FLOPs divided by peak times one efficiency" misses what measured pipelines show: small matrix
products run far below peak, element-wise work (norms, softmax, GeLU, residual adds) is bound by
memory bandwidth, no kernel runs faster than the host can issue it. So a generated layer lists
its forward kernels, each with, per sample, its FLOPs and the bytes it reads and writes, plus
the bytes it reads once per call (its weights); ``sim.cost.compute.kernel_time_s`` prices one on n samples:

    t = max( max( n·flop / (peak · eff),  (n·bytes + fixed_bytes) / (bandwidth · mem_eff) ) + gap,  issue ),

the roofline bound (Williams, Waterman & Patterson, CACM 2009) and the device's launch gap, floored
by the host's time to issue the kernel (the device waits for a kernel only if the host has not
issued it yet), with a matrix efficiency that rises with the product's dimensions and saturates:

    eff(M, N, K) = e_max / ((1 + D/M) · (1 + D/N) · (1 + D/K)),

each dimension reaching half of its share at the device's ``matmul_half_dim`` D. Along M and N it
models tile and wave quantisation: the output is computed in tiles of roughly D, and the parts of
tiles beyond a small dimension are wasted (NVIDIA, "Matrix Multiplication Background User's Guide",
tile and wave quantisation); along K, each tile's fixed prologue and epilogue, which only its K
mainloop amortizes: DeepGEMM's measured H800 GEMMs at M = 4096 fall from 1358 TFLOP/s at K = 16384
to 590 at K = 512 (``sim.input.presets.DEEPGEMM_H800_FP8_TFLOPS``), far above the memory roofline,
and the H100's best MAMF shape is 2048 × 2048 with K = 13312 (``MAMF_BF16``). K takes the same D
(fitted alone, DeepGEMM's rows put it near 660 for FP8: D is the conservative end). A hyperbolic
saturation per dimension is the simplest curve with that limit, and unlike an efficiency of the
FLOP count alone (a constant per call, like a launch gap) a fit can tell it apart. ``e_max``, D, the
gap and ``mem_eff`` are ``sim.core.specs.DeviceSpec`` parameters ``dapple-sim calibrate`` fits to runs.

A backward runs every matrix product twice (the input gradient and, for a layer with
weights, the weight gradient; attention's products without weights have two input
gradients) and every element-wise kernel once over twice the bytes, unless the kernel says
what its backward moves (``KernelSpec.bwd_bytes``).

Transformer kernels follow Megatron-LM's layer (Shoeybi et al., 2019; FLOPs as in
Narayanan et al., SC'21, §5.1): layer norm, QKV projection, attention, output projection,
residual add, layer norm, MLP up, GeLU, MLP down, residual add. Attention runs as the model's
``attention`` says (``sim.core.specs.ATTENTION_KERNELS``):

* ``unfused``: attention scores, softmax, attention dropout (GPT, BERT) and attention over
  values, four kernels whose s×s scores and probabilities go through device memory;
* ``flash``, ``sdpa`` and ``cudnn``: one fused kernel (``fused_attention``; Dao et al. 2022,
  "FlashAttention", §3.1; Dao 2023, "FlashAttention-2", §3.1). It computes the scores block by
  block in on-chip memory, so what it moves is linear in s: it reads Q, K and V and writes the
  output O and the softmax's row log-sum-exp (one fp32 per query and head). Its backward reads
  Q, K, V, O, dO and the log-sum-exp, recomputes the scores and writes dQ, dK and dV: five
  products where the forward has two, 2.5 times its FLOPs (``FUSED_BACKWARD_FLOP_RATIO``). Under a
  causal mask it skips the blocks above the diagonal, about half the work
  (``CAUSAL_WORK_FRACTION``). Its rate is measured, not a roofline of its parts: the device's
  ``attention_efficiency`` (``sdpa_efficiency`` for ``sdpa``, ``cudnn_efficiency`` for ``cudnn``), ``sim.cost.compute.fused_attention_s``.
  The K and V blocks it re-reads for every block of queries (FlashAttention, Theorem 2) are
  left out: they come from L2 and the kernel is compute-bound at these sizes.

Each kernel of a block also says what torchtitan's op-level selective activation checkpointing
(``recompute: selective-op``) does with it (``sac_saved_bytes``, ``sac_recompute``). Its policy
(torchtitan 9dec370, ``torchtitan/parallelisms/parallelize_llama.py``, ``_save_list`` and
``_custom_policy``) runs at the dispatcher, op by op: it saves the output of ``aten.mm`` (but
only of the 1st, 3rd, 5th… of each block: the counter lives in a ``defaultdict`` made afresh by
``selective_checkpointing_context_fn`` for every checkpointed call, and an even count is not
saved), of ``_scaled_dot_product_flash_attention`` and ``_efficient_attention`` (output and
log-sum-exp) and of ``_c10d_functional.reduce_scatter_tensor`` (sequence parallelism's), and
recomputes everything else in the backward. torchtitan's Llama block runs its products as
``wq, wk, wv`` (``Attention.forward``), ``wo``, then ``w1, w3, w2`` (``FeedForward.forward``:
``w2(silu(w1(x)) * w3(x))``), all bias-free ``nn.Linear``, which reach the dispatcher as
``aten.mm``: so wq, wv, w1 and w2 are saved, wk, wo and w3 recomputed (``OP_SAC_PRODUCTS``).
A linear with a bias (GPT, BERT) reaches it as ``aten.addmm`` (``at::linear`` folds a
contiguous 3-D input into ``addmm``), which is not in the list: none of their products is
saved. Norms, rotary embeddings, SwiGLU and residual adds are never saved. On H100 in
December 2024 SDPA picked FlashAttention-2 over cuDNN (pytorch/pytorch#142132: cuDNN is not
chosen automatically), so ``sdpa`` and ``flash`` are saved; an unfused attention's ``bmm`` and
softmax are not.

A block's element-wise work runs as the model's ``kernels`` says (``KERNEL_MODES``): ``fused``
(Megatron-LM's and Megatron-Core's fused kernels: apex/Transformer Engine LayerNorm and RMSNorm,
bias-GeLU or SwiGLU, bias-dropout-add, one memory pass each) or ``eager``, the separate PyTorch
kernels torchtitan's Llama runs without ``training.compile`` (``eager_elementwise``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["ATTENTION_CORE", "FP32_BYTES", "KERNEL_MODES", "eager_elementwise", "eager_loss_workspace_bytes", "eager_rmsnorm", "eager_rotary", "ATTENTION_DROPOUT_MASK_BYTES", "CAUSAL_WORK_FRACTION", "FUSED_BACKWARD_FLOP_RATIO",
           "LSE_BYTES", "OP_SAC_PRODUCTS", "KernelSpec", "fused_attention", "transformer_block", "embedding", "lm_head", "bert_head", "linear", "conv", "pool",
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
    """Bytes per sample its backward reads and writes (element-wise and fused kernels); None: twice
    ``bytes`` (the gradient and what it saved read, one gradient written)."""
    fused_attention: str = ""
    """``flash`` or ``sdpa`` for a fused attention kernel (``fused_attention``), whose ``flop`` are
    the FLOPs it does and whose rate is the device's attention efficiency; empty for any other."""
    sac_saved_bytes: float = 0.0
    """Bytes per sample of its outputs that op-level selective checkpointing keeps for the
    backward (``recompute: selective-op``; see the module's docstring); 0: none."""
    backward: bool = True
    """Whether autograd runs a backward kernel for it; False for a forward-only launch (integer
    counts, copies to the host, a host synchronisation), whose backward costs nothing."""
    fp8: bool = False
    """Its matrix products (forward, input and weight gradients) run on FP8 tensor cores
    (``model.gemm_dtype: fp8``, ``sim.models.precision``), priced at the device's FP8 peak."""
    recomputed: bool = False
    """Its forward runs again in the backward whatever ``plan.recompute``: the model stashes not its
    output but its input (MLA's up-projections and norms; ``sim.models.precision``'s recipe)."""
    sac_recompute: tuple | None = None
    """What of it op-level selective checkpointing runs again in the backward: None, all of it;
    else the kernels listed (() for a kernel it saves whole; a fused product's parts that
    torchtitan runs as separate, unsaved products, such as ``wk`` of the QKV projection)."""


def _gemm(name: str, m: float, n: float, k: float, d: int, *, weights: bool) -> KernelSpec:
    """A product of an (m × k) activation by a (k × n) matrix, per sample: m rows per sample."""
    dims = dict(flop=2 * m * n * k, rows=m, cols=n, inner=k)
    if weights:
        return KernelSpec(name=name, bytes=d * (m * k + m * n), fixed_bytes=d * k * n, weights=True, **dims)
    return KernelSpec(name=name, bytes=d * (m * k + k * n + m * n), **dims)


def _elementwise(name: str, elements: float, d: int, *, passes: int = 2, weights: bool = False) -> KernelSpec:
    """Reads and writes ``elements`` per sample (``passes`` tensors of them)."""
    return KernelSpec(name=name, bytes=passes * d * elements, weights=weights)


FUSED_BACKWARD_FLOP_RATIO = 2.5
"""A fused attention backward's FLOPs over its forward's: five products (the scores recomputed,
dV, dP, dQ, dK) against two (Dao 2023, "FlashAttention-2", §3.1, Algorithm 2; its benchmark,
``benchmarks/benchmark_flash_attention.py``'s ``flops``, counts the backward as 2.5 × forward)."""

CAUSAL_WORK_FRACTION = 0.5
"""Share of the s×s scores a fused kernel computes under a causal mask: it skips the blocks above
the diagonal (Dao 2023, §3.1.1, causal masking), and FlashAttention's benchmarks halve the
FLOPs they count for it (``flops``: ``// (2 if causal else 1)``). The model's FLOPs
(``LayerSpec.fwd_flop``, MFU) still count the whole 4s²h, as Narayanan et al. 2021 §5.1 do."""

LSE_BYTES = 4
"""Bytes per query and head of the softmax's log-sum-exp a fused kernel keeps for its backward
(fp32: FlashAttention-2's ``softmax_lse``)."""


def fused_attention(kernel: str, q: float, s: int, h: int, h_kv: int, a: int, t: int, d: int, *,
                    causal: bool) -> KernelSpec:
    """The fused attention of one device, per sample: ``q`` queries of its a/t heads attend over
    ``s`` keys of width h_kv/t. Forward: reads Q, K, V, writes O and the log-sum-exp; backward:
    reads Q, K, V, O, dO and the log-sum-exp, writes dQ, dK, dV (see the module's docstring)."""
    work = 4 * q * s * h / t * (CAUSAL_WORK_FRACTION if causal else 1.0)
    queries, keys, lse = d * q * h / t, d * s * h_kv / t, LSE_BYTES * q * a / t
    return KernelSpec(name="attention", flop=work, bytes=2 * queries + 2 * keys + lse,
                      bwd_bytes=4 * queries + 4 * keys + lse, fused_attention=kernel)


def transformer_block(s: int, h: int, a: int, f: int, d: int, *, kv_heads: int | None = None, gated: bool = False,
                      tensor: int = 1, context: int = 1, sequence_parallel: bool = False,
                      dropout: bool = False, attention: str = "unfused",
                      causal: bool = True, bias: bool = False, kernels: str = "fused") -> tuple[KernelSpec, ...]:
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
    mask and writes one gradient (``ATTENTION_DROPOUT_MASK_BYTES``). With ``attention`` ``flash`` or
    ``sdpa`` the four attention kernels are one fused kernel (``fused_attention``; ``causal``: the
    decoder's mask, which it skips) that regenerates its dropout mask from the random generator's
    state (FlashAttention-2, §3.1) and keeps no s×s tensor. ``bias``: the linears have biases
    (GPT, BERT), which only changes what op-level selective checkpointing saves (the module's
    docstring). ``kernels``: ``fused`` or ``eager`` (``eager_elementwise``).
    """
    t, q = tensor, s / context
    h_kv = (kv_heads or a) * h // a
    pointwise = q / t if sequence_parallel else q
    up = 2 * f if gated else f
    saved = _op_sac_saved(gated=gated, bias=bias)
    scattered = d * q / t * h if t > 1 and sequence_parallel else 0.0  # a reduce-scatter's output, saved
    probs = a / t * q * s
    drop = (KernelSpec(name="attention_dropout", bytes=(2 * d + ATTENTION_DROPOUT_MASK_BYTES) * probs,
                       bwd_bytes=(2 * d + ATTENTION_DROPOUT_MASK_BYTES) * probs),) if dropout else ()
    if attention == "unfused":
        core = (
            _gemm("scores", q * a / t, s, h // a, d, weights=False),
            _elementwise("softmax", probs, d),
            *drop,
            _gemm("attend", q * a / t, h // a, s, d, weights=False),
        )
    else:
        fused = fused_attention(attention, q, s, h, h_kv, a, t, d, causal=causal)  # output and log-sum-exp saved
        core = (replace(fused, sac_saved_bytes=d * q * h / t + LSE_BYTES * q * a / t, sac_recompute=()),)
    mlp_parts = (("w1", f), ("w3", f)) if gated else (("w1", f),)
    block = (
        _elementwise("ln1", pointwise * h, d),
        _op_sac(_gemm("qkv", q, (h + 2 * h_kv) / t, h, d, weights=True), (("wq", h), ("wk", h_kv), ("wv", h_kv)),
                saved, d, q, h, t=t),
        *core,
        _op_sac(_gemm("proj", q, h, h / t, d, weights=True), (("wo", h),), saved, d, q, h / t, extra=scattered),
        _elementwise("residual1", pointwise * h, d, passes=3),
        _elementwise("ln2", pointwise * h, d),
        _op_sac(_gemm("mlp_up", q, up / t, h, d, weights=True), mlp_parts, saved, d, q, h, t=t),
        _elementwise("swiglu" if gated else "gelu", q * f / t, d, passes=3 if gated else 2),
        _op_sac(_gemm("mlp_down", q, h, f / t, d, weights=True), (("w2", h),), saved, d, q, f / t, extra=scattered),
        _elementwise("residual2", pointwise * h, d, passes=3),
    )
    if kernels == "fused":
        return block
    return eager_elementwise(block, pointwise=pointwise, q=q, h=h, h_q=h / t, h_kv=h_kv / t,
                             rep=h // h_kv, f=f / t, d=d)


KERNEL_MODES = ("eager", "fused")
"""How a generated block's element-wise work runs (``model.kernels``): ``fused`` kernels, one
pass each (Megatron-LM), or PyTorch's ``eager`` kernels, as torchtitan runs them."""

FP32_BYTES = 4
"""Bytes of an fp32 element: eager RMSNorm and rotary embeddings compute in fp32 (``x.float()``)."""


def eager_rmsnorm(name: str, n: float, rows: float, h: int, d: int) -> tuple[KernelSpec, ...]:
    """torchtitan's ``RMSNorm`` (9dec370, ``torchtitan/models/norms.py`` lines 96–101:
    ``_norm(x) = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)``, ``forward(x) =
    self._norm(x.float()).type_as(x) * self.weight``) on ``n`` elements in ``rows`` rows of ``h``,
    per sample: eight eager kernels, each a pass over memory. Forward: what each reads and writes
    (x in ``d`` bytes, the fp32 copies in 4, the per-row mean and rsqrt in 4 per row). Backward
    (autograd): each op reads the incoming gradient and the inputs it saved and writes a gradient
    per input: ``pow`` saves x, ``rsqrt`` its output, the two products both inputs, the casts,
    ``mean`` and ``+ eps`` nothing; the fp32 x feeds ``pow`` and the product, so autograd adds
    its two gradients (read two, write one) before the cast back."""
    w = FP32_BYTES
    return (
        KernelSpec(name=f"{name}_float", bytes=(d + w) * n, bwd_bytes=3 * w * n + (w + d) * n),
        KernelSpec(name=f"{name}_pow", bytes=2 * w * n, bwd_bytes=3 * w * n),
        KernelSpec(name=f"{name}_mean", bytes=w * n + w * rows, bwd_bytes=w * n + w * rows),
        KernelSpec(name=f"{name}_eps", bytes=2 * w * rows, bwd_bytes=2 * w * rows),
        KernelSpec(name=f"{name}_rsqrt", bytes=2 * w * rows, bwd_bytes=3 * w * rows),
        KernelSpec(name=f"{name}_scale", bytes=2 * w * n + w * rows, bwd_bytes=3 * w * n + 2 * w * rows),
        KernelSpec(name=f"{name}_cast", bytes=(w + d) * n, bwd_bytes=(d + w) * n),
        KernelSpec(name=f"{name}_weight", bytes=2 * d * n, fixed_bytes=d * h, bwd_bytes=3 * d * n),
    )


def eager_rotary(name: str, m: float, d: int) -> tuple[KernelSpec, ...]:
    """torchtitan's ``apply_rotary_emb`` on one of q and k, ``m`` elements per sample (9dec370,
    ``torchtitan/models/llama/model.py`` lines 108–113: ``view_as_complex(x.float()...)``, ``* freqs_cis``,
    ``view_as_real(...).flatten(3)``, ``type_as``; the views and reshapes move nothing): a cast to
    fp32, a complex product (m/2 complex64 values in and out; ``freqs_cis``, the same for every
    sample, is left out as cached) and the cast back. Backward: the casts back, and the product's
    gradient times the saved conjugate frequencies (read the gradient, write one)."""
    w = FP32_BYTES
    return (
        KernelSpec(name=f"{name}_float", bytes=(d + w) * m, bwd_bytes=(w + d) * m),
        KernelSpec(name=f"{name}_mul", bytes=2 * w * m, bwd_bytes=2 * w * m),
        KernelSpec(name=f"{name}_cast", bytes=(w + d) * m, bwd_bytes=(d + w) * m),
    )


def eager_elementwise(block: tuple[KernelSpec, ...], *, pointwise: float, q: float, h: int, h_q: float,
                      h_kv: float, rep: int, f: float, d: int) -> tuple[KernelSpec, ...]:
    """A Llama block's fused kernels (``transformer_block``) replaced by the eager kernels torchtitan
    runs (9dec370, ``torchtitan/models/llama/model.py``): each norm by ``eager_rmsnorm`` (on
    ``pointwise`` tokens of width ``h``); after the QKV products, ``apply_rotary_emb`` on q and k
    (``h_q`` and ``h_kv`` wide on this device, ``q`` tokens; lines 108–113) and, under grouped-query attention,
    ``repeat_kv`` (lines 116–125: ``expand`` then ``reshape``, a copy of K and of V to ``rep`` times
    their ``h_kv`` width; its backward sums the copies back); SwiGLU (``FeedForward.forward``, line
    253: ``F.silu(self.w1(x)) * self.w3(x)``) as ``silu`` (read, write; backward reads the gradient
    and its input, writes one) and the product (read two, write one; backward reads the gradient
    and both inputs, writes two), ``f`` wide. The residual adds (``h = x + ...``, lines 323–324)
    are one add each, as fused. Left out: ``output.transpose(1, 2).contiguous()`` after SDPA (whether
    it copies depends on the strides SDPA returns, not checked) and SDPA reading ``rep`` times K and V."""
    rotary = (*eager_rotary("rope_q", q * h_q, d), *eager_rotary("rope_k", q * h_kv, d))
    copies = tuple(KernelSpec(name=f"repeat_{x}", bytes=(1 + rep) * d * q * h_kv, bwd_bytes=(1 + rep) * d * q * h_kv)
                   for x in ("k", "v")) if rep > 1 else ()
    out: list[KernelSpec] = []
    for k in block:
        if k.name in ("ln1", "ln2"):
            out += eager_rmsnorm(k.name, pointwise * h, pointwise, h, d)
        elif k.name == "swiglu":
            out += [KernelSpec(name="silu", bytes=2 * d * q * f, bwd_bytes=3 * d * q * f),
                    KernelSpec(name="swiglu_mul", bytes=3 * d * q * f, bwd_bytes=5 * d * q * f)]
        else:
            out.append(k)
            if k.name == "qkv":
                out += rotary + copies
    return tuple(out)


OP_SAC_PRODUCTS = {True: ("wq", "wk", "wv", "wo", "w1", "w3", "w2"), False: ("wq", "wk", "wv", "wo", "w1", "w2")}
"""A Llama block's products in the order torchtitan runs them, with a gated MLP (True) or not
(``torchtitan/models/llama/model.py``, ``Attention.forward`` and ``FeedForward.forward``)."""


def _op_sac_saved(*, gated: bool, bias: bool) -> frozenset:
    """The products whose output op-level selective checkpointing saves: the odd ones of
    ``OP_SAC_PRODUCTS`` (``aten.mm``, counted 1, 2, … per block, saved unless the count is even);
    none with biases (``aten.addmm``, not in torchtitan's ``_save_list``)."""
    if bias:
        return frozenset()
    return frozenset(name for i, name in enumerate(OP_SAC_PRODUCTS[gated], start=1) if i % 2)


def _op_sac(kernel: KernelSpec, parts: tuple, saved: frozenset, d: int, q: float, inner: float, *, t: int = 1,
            extra: float = 0.0) -> KernelSpec:
    """``kernel``, a product that torchtitan runs as ``parts`` ((name, output width) products of
    ``inner`` each; column-parallel widths divide by ``t``), tagged with what op-level selective
    checkpointing saves of it (the saved parts' outputs, and ``extra``: a reduce-scatter's) and
    what it runs again (the other parts; all of the kernel if none is saved)."""
    kept = [width / t for name, width in parts if name in saved]
    if not kept:
        return replace(kernel, sac_saved_bytes=extra) if extra else kernel
    again = tuple(_gemm(name, q, width / t, inner, d, weights=True) for name, width in parts if name not in saved)
    return replace(kernel, sac_saved_bytes=d * q * sum(kept) + extra, sac_recompute=again)


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


def lm_head(s: int, h: int, vocab: int, d: int, *, tensor: int = 1, megatron: bool = False) -> tuple[KernelSpec, ...]:
    """Final norm, projection to the vocabulary, softmax and cross-entropy (fp32 logits), on one device's
    ``vocab / tensor`` slice of the vocabulary (Megatron's vocabulary-parallel head); ``megatron``: its
    cross-entropy pass by pass (``tensor_parallel/cross_entropy.py`` at core_v0.9.0, ``mpu/`` before):
    ``.float()``, max, subtraction and ``exp`` in place, sum, division in place (d + 36 bytes an
    element); backward, the product with the loss's gradient in place, the cast back (d + 12)."""
    v = vocab / tensor
    passes = dict(bytes=(d + 36) * s * v, bwd_bytes=(d + 12) * s * v) if megatron else dict(bytes=3 * 4 * s * v)
    return _elementwise("ln_f", s * h, d), _gemm("logits", s, v, h, d, weights=True), KernelSpec(name="loss", **passes)


def eager_loss_workspace_bytes(tokens: float, vocab: float) -> float:
    """Bytes eager cross-entropy's backward holds beside its saved fp32 log-softmax, on ``tokens``
    tokens over ``vocab`` logits: torchtitan's ``loss_fn`` (9dec370, ``train.py`` lines 131–133:
    ``F.cross_entropy(pred.flatten(0, 1).float(), ...)``) is ``nll_loss(log_softmax(x))``; backward,
    ``nll_loss`` writes its fp32 gradient (tokens × vocab) and ``_log_softmax_backward_data(grad,
    result, ...)`` (pytorch ``tools/autograd/derivatives.yaml``) reads it and the saved result and
    writes a third: two fp32 tensors beside the stash, 2·4·tokens·vocab. Megatron's
    vocabulary-parallel cross-entropy holds none: its backward updates the saved softmax in place
    (``megatron/core/tensor_parallel/cross_entropy.py``, ``_VocabParallelCrossEntropy.backward``:
    ``grad_input = softmax``)."""
    return 2 * FP32_BYTES * tokens * vocab


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
