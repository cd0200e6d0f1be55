"""Transformers: GPT (a decoder), BERT (an encoder with its masked-LM head) and Llama.

Each is an ``embedding``, ``layers`` identical blocks ``block_0`` .. ``block_{layers-1}`` and
a ``head`` that computes the loss. A block's parameters, FLOPs and stash follow Megatron-LM's
counts (Narayanan et al., SC'21, §5.1) and the activation-memory count of Korthikanti et al.
(2022, §4.1, Eq. 1; ``sim.cost.memory.block_activation_bytes``), written for any dtype and
MLP width; the conventions (what a stash holds, FLOPs per multiply-add) are ``sim.models``'.

Llama (Touvron et al. 2023; Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3) differs
from GPT in four places: RMSNorm (a weight, no bias) instead of LayerNorm, rotary position
embeddings (no position table), grouped-query attention (``kv_heads`` key and value heads),
and a SwiGLU MLP of width ``ffn_hidden`` (three matrices, no biases); it has no dropout and
its head is not tied to the embedding.

Every layer can be built as one device of a tensor- and context-parallel group sees it
(``Shard``): Megatron-LM's column- and row-parallel products and vocabulary-parallel
embedding and head (Shoeybi et al. 2019, §3), sequence parallelism (Korthikanti et al.
§4.2.2) and ring attention over the sequence (Liu et al. 2023). The embedding and the head hold
the vocabulary padded as Megatron-LM pads it, to a multiple of ``vocab_divisible_by`` × t
(``sim.models.vocab``): ``vocab`` below is that padded size.

A block's attention runs as ``attention`` says (``flash``, ``sdpa``, ``cudnn`` or ``unfused``,
``sim.core.specs.ATTENTION_KERNELS``): its kernels (``sim.cost.kernels.transformer_block``) and its
stash (``block_activation_bytes``) follow; its parameters and FLOPs do not depend on it.
``mla`` (``sim.core.mla.MlaSpec``) gives the blocks multi-head latent attention instead
(``sim.models.mla``); ``gemm_dtype: fp8`` runs their weighted products in FP8
(``sim.models.precision``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from sim.core.errors import SpecError
from sim.core.model_spec import LayerSpec, ModelSpec
from sim.core.parallelism import Recompute, Shard
from sim.core.specs import ATTENTION_KERNELS, DTYPE_BYTES, FP8
from sim.cost import kernels as K
from sim.cost.memory import BlockShape, block_activation_bytes
from sim.cost.reserved import eager_logits_cached_bytes
from sim.cost.tensor_comm import TensorParallelCollective as C
from sim.cost.tensor_comm import tensor_parallel_collectives
from sim.models.layers import LOSS_BYTES, MASK_BYTES, TOKEN_ID_BYTES, chain, fused_rotary, matmul_layer
from sim.models.mla import mla_block
from sim.models.moe import check_experts, moe_block, strip_mlp
from sim.models.mtp import merge_layers, mtp_projection, with_mtp
from sim.models.params import resolve
from sim.models.precision import GEMM_DTYPES, fp8_block, fp8_cached_block
from sim.models.vocab import padded_vocab_size

__all__ = ["bert", "gpt", "llama", "llama_ffn_hidden"]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Arch:
    """What sets a transformer family apart."""

    bias: bool
    """Linear layers have biases (GPT, BERT) or not (Llama)."""
    norm_params: int
    """Parameters per hidden unit of a norm: 2 for LayerNorm (scale, shift), 1 for RMSNorm."""
    position_table: bool
    """A learned position embedding (GPT, BERT) rather than rotary embeddings (Llama)."""
    causal: bool
    """A decoder's causal mask (GPT, Llama), which a fused attention skips; BERT attends both ways."""


_ARCH = {
    "gpt": _Arch(bias=True, norm_params=2, position_table=True, causal=True),
    "bert": _Arch(bias=True, norm_params=2, position_table=True, causal=False),
    "llama": _Arch(bias=False, norm_params=1, position_table=False, causal=True),
}


def _block_params(shape: BlockShape, arch: _Arch, t: int) -> tuple[float, int]:
    """(parameters on one device of a t-way group, parameter tensors) of one block.

    GPT (Narayanan et al., SC'21, §5.1): QKV and output projections with biases 4h² + 4h, MLP
    2hf + f + h, two LayerNorms 4h: 12h² + 13h when f = 4h. Column-parallel weights and biases
    split over t; the row-parallel layers' biases and the norms are replicated (Shoeybi et al.
    2019, §3). Grouped-query attention projects to h + 2·h_kv; a gated MLP has 2f inputs.
    """
    h, f, b = shape.hidden, shape.ffn_hidden, 1 if arch.bias else 0
    h_kv = (shape.kv_heads or shape.heads) * h // shape.heads
    up = 2 * f if shape.gated else f
    split = h * (h + 2 * h_kv) + b * (h + 2 * h_kv) + h * h + h * up + b * up + f * h
    replicated = 2 * b * h + 2 * arch.norm_params * h
    # QKV, output projection, the MLP's two matrices and two norms: a weight each, and a bias
    # each with biases (LayerNorm's shift counted as its bias)
    return split / t + replicated, 12 if arch.bias else 6


def _block_fwd_flop(shape: BlockShape, shard: Shard) -> float:
    """Forward FLOPs of one block for one sample on one device: 24sh² + 4s²h when f = 4h.

    Narayanan et al., SC'21, §5.1 (72·B·s·l·h²·(1 + s/6h) for forward and backward, the
    backward being twice the forward): QKV and output projections 8sh², attention scores and
    attention over values 4s²h, MLP 4shf. Causal masking is not subtracted (as there). Each
    device of a tensor-parallel group does 1/t of every product; context parallelism gives it
    s/c of the queries. The count is the same whatever kernel runs attention: a fused kernel
    skips the causal mask's half of the scores in time (``sim.cost.kernels.CAUSAL_WORK_FRACTION``),
    not in the model's FLOPs, as MFU counts them.
    """
    s, h, f = shape.seq_len, shape.hidden, shape.ffn_hidden
    h_kv = (shape.kv_heads or shape.heads) * h // shape.heads
    up = 2 * f if shape.gated else f
    q = s / shard.context
    return 2 * q * (h * (h + 2 * h_kv) + h * h + h * up + f * h) / shard.tensor + 4 * q * s * h / shard.tensor


def _transformer_block(name: str, shape: BlockShape, arch: _Arch, shard: Shard, attention: str,
                       kernels: str, mla=None) -> LayerSpec:
    s, h, d, t, c = shape.seq_len, shape.hidden, shape.element_bytes, shard.tensor, shard.context
    params, tensors = _block_params(shape, arch, t)
    degrees = dict(tensor_parallel=t, context_parallel=c, sequence_parallel=shard.sequence_parallel,
                   attention=attention)
    h_kv = (shape.kv_heads or shape.heads) * h // shape.heads
    layer = matmul_layer(
        name,
        params=params,
        fwd_flop=_block_fwd_flop(shape, shard),
        stash_bytes=block_activation_bytes(shape, **degrees),
        output_bytes=s * h * d / (c * t),
        d=d,
        kernels=K.transformer_block(s, h, shape.heads, shape.ffn_hidden, d, kv_heads=shape.kv_heads,
                                    gated=shape.gated, tensor=t, context=c,
                                    sequence_parallel=shard.sequence_parallel, dropout=shape.dropout,
                                    attention=attention, causal=arch.causal, bias=arch.bias,
                                    kernels=kernels),
        tensors=tensors,
    )
    if kernels == "fused" and not arch.position_table and mla is None:  # Llama's rotary embeddings
        layer = replace(layer, kernels=fused_rotary(layer.kernels, s / c, h / t, h_kv / t, d))
    ring = (c - 1) * 2 * d * (s / c) * h_kv / t if c > 1 else 0.0  # K and V blocks, c − 1 steps
    layer = replace(layer, selective_stash_bytes=block_activation_bytes(shape, **degrees, recompute=Recompute.SELECTIVE),
                 checkpoint_bytes=block_activation_bytes(shape, **degrees, recompute=Recompute.FULL),
                 tp_collectives=tensor_parallel_collectives(shape, tensor_parallel=t,
                                                            sequence_parallel=shard.sequence_parallel),
                 cp_ring_bytes=ring)
    if mla is None:
        return layer
    return mla_block(layer, mla, shard, seq_len=s, hidden=h, heads=shape.heads, kv_heads=shape.kv_heads or shape.heads,
                     d=d, bias=arch.bias, attention=attention, causal=arch.causal)


def _moe_transformer_block(name: str, shape: BlockShape, arch: _Arch, shard: Shard, attention: str, kernels: str,
                           experts, mla=None) -> LayerSpec:
    """An MoE block (``sim.models.moe``): the dense block with the shared experts as its MLP, or,
    without shared experts, the dense block built at the experts' width less its MLP, then the
    router and this device's routed experts."""
    f_e = experts.ffn_hidden
    dense = replace(shape, ffn_hidden=f_e * (experts.shared or 1))
    layer = _transformer_block(name, dense, arch, shard, attention, kernels, mla)
    if not experts.shared:
        s, h, e, t, c, b = shape.seq_len, shape.hidden, shape.element_bytes, shard.tensor, shard.context, int(arch.bias)
        up = 2 * f_e if shape.gated else f_e
        mlp_params = (h * up + b * up + f_e * h) / t + b * h
        q = s / c
        layer = strip_mlp(layer, params=mlp_params * e, flop=2 * q * (h * up + f_e * h) / t,
                          stash=(up + f_e) * e * s / (t * c),  # the activation's input(s), the second linear's
                          tensors=2 * (1 + b))
    return moe_block(layer, experts, shard, seq_len=shape.seq_len, hidden=shape.hidden, d=shape.element_bytes,
                     gated=shape.gated, bias=arch.bias)


def _edge_collectives(s: int, h: int, d: int, shard: Shard, *, head: bool) -> tuple:
    """Megatron's vocabulary-parallel embedding all-reduces its output in the forward (a
    reduce-scatter with sequence parallelism, whose backward all-gathers); the head's input
    goes through operator f (all-reduce of its gradient in the backward; with sequence
    parallelism an all-gather forward and a reduce-scatter backward). The head's logits are a
    column-parallel product (``parallel_lm_logits``, megatron/model/language_model.py at cfd2e21), so
    its backward collective runs beside its weight gradient as a block's column linears' do, its
    input gathered again under sequence parallelism (``sim.cost.tensor_comm``). The cross-entropy's
    s-sized reductions are left out."""
    if shard.tensor <= 1:
        return ()
    nbytes = float(d * s / shard.context * h)
    if shard.sequence_parallel:
        kinds = (("all-gather", "forward", False), ("reduce-scatter", "backward", True),
                 ("all-gather", "regather", True)) if head else \
            (("reduce-scatter", "forward", False), ("all-gather", "backward", False))
    else:
        kinds = (("all-reduce", "backward", True),) if head else (("all-reduce", "forward", False),)
    return tuple(C(kind=kind, phase=phase, bytes=nbytes, beside=beside) for kind, phase, beside in kinds)


def _embedding(s: int, h: int, vocab: int, d: int, arch: _Arch, shard: Shard, *, bert: bool) -> LayerSpec:
    """Token (and position) embeddings; BERT adds two token types and a layer norm.

    A look-up has no matmul: forward and backward get one nominal FLOP per element of each
    table read (or scatter-added into); all of the backward is weight gradient. The stash is
    the token ids, the embedding dropout mask (Korthikanti et al. 2022, §4.3) and, for BERT,
    the layer norm's input. The token table splits over the vocabulary (t); the position and
    token-type tables are replicated.
    """
    t, q = shard.tensor, s / shard.context
    pointwise = q / t if shard.sequence_parallel else q
    tables = (3 if bert else 2) if arch.position_table else 1
    params = vocab * h / t + (s * h if arch.position_table else 0) + (2 * h + 2 * h if bert else 0)
    ids_bytes = (2 if bert else 1) * q * TOKEN_ID_BYTES
    masks = MASK_BYTES * pointwise * h if arch.bias else 0.0  # dropout (none in Llama)
    stash = ids_bytes + masks + (d * pointwise * h if bert else 0)
    return LayerSpec(
        name="embedding",
        param_bytes=float(params * d),
        param_tensors=tables + (2 if bert else 0),
        output_bytes=float(q * h * d / t),
        stash_bytes=float(stash),
        fwd_flop=float(tables * q * h),
        bwd_flop=float(tables * q * h),
        wgrad_fraction=1.0,
        kernels=K.embedding(q, h, d, tables=tables),
        tp_collectives=_edge_collectives(s, h, d, shard, head=False),
    )


def _lm_head(s: int, h: int, vocab: int, d: int, arch: _Arch, shard: Shard, *, tied: bool,
             kernels: str = "fused") -> LayerSpec:
    """Final norm, projection to the vocabulary, cross-entropy loss.

    Forward 2·s·h·V (Narayanan et al., SC'21, §5.1: the 6·B·s·h·V term is forward and
    backward). Stash: the norm's input, the projection's input, fp32 logits — Korthikanti et
    al. 2022, §4.3: 4·s·h·(1 + V/h) bytes for d = 2, 4sh(1 + V/h)/t with tensor and sequence
    parallelism. A tied projection reuses the embedding's matrix, so only the norm's
    parameters are counted here. The vocabulary splits over t. With ``kernels: eager``
    (torchtitan) the loss is PyTorch's cross-entropy, whose backward holds two more fp32
    logit tensors for a moment (``sim.cost.kernels.eager_loss_workspace_bytes``) while the
    allocator keeps the freed 16-bit logits' block (``sim.cost.reserved.eager_logits_cached_bytes``).
    """
    t, q = shard.tensor, s / shard.context
    inputs = 2 * d * q * h / (t if shard.sequence_parallel else 1)
    params = arch.norm_params * h + (0 if tied else h * vocab / t)
    layer = matmul_layer(
        "head",
        params=params,
        fwd_flop=2 * q * h * vocab / t,
        stash_bytes=inputs + LOSS_BYTES * q * vocab / t,
        output_bytes=0,
        d=d,
        kernels=K.lm_head(q, h, vocab, d, tensor=t, megatron=kernels == "fused"),
        tensors=arch.norm_params + (0 if tied else 1),
    )
    eager = kernels == "eager"
    workspace = K.eager_loss_workspace_bytes(q, vocab / t) if eager else 0.0
    cached = eager_logits_cached_bytes(q, vocab / t, d) if eager else 0.0
    return replace(layer, tp_collectives=_edge_collectives(s, h, d, shard, head=True),
                   backward_workspace_bytes=workspace, allocator_cached_bytes=cached)


def _bert_head(s: int, h: int, vocab: int, d: int, arch: _Arch, shard: Shard, *, tied: bool) -> LayerSpec:
    """BERT's masked-LM head: dense h×h + GeLU + layer norm, projection to V with bias, loss.

    Parameters h² + h + 2h + V, plus h·V if the projection is not tied to the token
    embedding (Devlin et al., NAACL'19, tie it, as BERT's released code does). Forward
    2sh² + 2shV over every position. Stash: dense, GeLU, layer-norm and projection inputs,
    and the fp32 logits (Korthikanti et al. 2022, §4.3). Modelled whole (no tensor parallelism).
    """
    params = h * h + h + 2 * h + vocab + (0 if tied else h * vocab)
    return matmul_layer(
        "head",
        params=params,
        fwd_flop=2 * s * h * h + 2 * s * h * vocab,
        stash_bytes=4 * d * s * h + LOSS_BYTES * s * vocab,
        output_bytes=0,
        d=d,
        kernels=K.bert_head(s, h, vocab, d),
        tensors=5 + (0 if tied else 1),
    )


def llama_ffn_hidden(hidden: int) -> int:
    """Llama's SwiGLU width when none is given: 2/3 of 4h, rounded up to a multiple of 256
    (Touvron et al. 2023, "LLaMA", §2.2; the reference code's ``multiple_of``)."""
    return 256 * -(-(8 * hidden // 3) // 256)


def _check_divides(what: str, value: int, by: int, key: str, hint: str) -> None:
    if value % by:
        raise SpecError(key, f"{what} {value} is not divisible by {by}; {hint}")


def _check_shard(p: Mapping[str, Any], shard: Shard, preset: str) -> None:
    """Megatron's constraints: t divides the heads, the key/value heads and the MLP width; c divides
    the sequence (twice c with causal load balancing, Megatron-Core). The vocabulary is padded to a
    multiple of t instead (``sim.models.vocab``), so it never refuses a degree."""
    t, c = shard.tensor, shard.context
    if preset == "bert" and not shard.is_whole:
        raise SpecError("tensor_parallel", "bert is modelled without tensor or context parallelism; use gpt or llama")
    hint = "choose tensor_parallel among the common divisors, or change the model"
    _check_divides("heads", p["heads"], t, "tensor_parallel", hint)
    if p.get("kv_heads"):
        _check_divides("kv_heads", p["kv_heads"], t, "tensor_parallel", hint)
    _check_divides("ffn_hidden", p["ffn_hidden"], t, "tensor_parallel", hint)
    _check_divides("seq_len", p["seq_len"], 2 * c if c > 1 else 1, "context_parallel",
                   "the sequence splits into 2·context_parallel chunks (Megatron-Core's causal load balancing)")


def _transformer(preset: str, params: Mapping[str, Any], shard: Shard | None, attention: str,
                 kernels: str = "fused", experts=None, mla=None, gemm_dtype: str | None = None,
                 mtp_depth: int = 0, fp8_activations: bool = False) -> ModelSpec:
    if attention not in ATTENTION_KERNELS:
        raise SpecError("attention", f"unknown kernel {attention!r}; valid: {', '.join(ATTENTION_KERNELS)}")
    if kernels not in K.KERNEL_MODES or (kernels == "eager" and preset != "llama"):
        raise SpecError("kernels", f"{kernels!r} is not modelled for {preset}; valid: fused, or eager for llama "
                                   "(torchtitan's eager RMSNorm, rotary and SwiGLU kernels)")
    p = resolve(preset, params)
    if p["ffn_hidden"] is None:
        p["ffn_hidden"] = llama_ffn_hidden(p["hidden"]) if preset == "llama" else 4 * p["hidden"]
    if preset == "llama" and p["kv_heads"] is None:
        p["kv_heads"] = p["heads"]
    shard = shard or Shard()
    s, h, a, f = p["seq_len"], p["hidden"], p["heads"], p["ffn_hidden"]
    # the table and the head are built with the padded rows (Megatron-LM pads before building them)
    vocab = padded_vocab_size(p["vocab"], p["vocab_divisible_by"], shard.tensor)
    if h % a:
        divisors = [k for k in range(1, h + 1) if h % k == 0]
        near = min(divisors, key=lambda k: (abs(k - a), k))
        raise SpecError("heads", f"{a} does not divide hidden {h}; use a divisor of {h} such as {near}")
    kv = p.get("kv_heads")
    if kv is not None and a % kv:
        raise SpecError("kv_heads", f"{kv} does not divide heads {a}; grouped-query attention needs heads % kv_heads == 0")
    _check_shard(p, shard, preset)
    if experts is not None:
        check_experts(experts, shard, p["layers"])
    elif shard.splits_experts:
        key = "expert_parallel" if shard.expert > 1 else "expert_tensor_parallel"
        raise SpecError(key, "the model has no experts (model.experts); remove the key or set 1")
    arch, d, bert = _ARCH[preset], DTYPE_BYTES[p["dtype"]], preset == "bert"
    llama = preset == "llama"
    shape = BlockShape(seq_len=s, hidden=h, heads=a, ffn_hidden=f, kv_heads=kv, element_bytes=d,
                       dropout=not llama, gated=llama)
    layers = [_embedding(s, h, vocab, d, arch, shard, bert=bert)]
    blocks = [_moe_transformer_block(f"block_{i}", shape, arch, shard, attention, kernels, experts, mla)
              if experts is not None and experts.is_moe(i) else
              _transformer_block(f"block_{i}", shape, arch, shard, attention, kernels, mla) for i in range(p["layers"])]
    if gemm_dtype is not None and gemm_dtype not in GEMM_DTYPES:
        raise SpecError("gemm_dtype", f"unknown {gemm_dtype!r}; valid: {', '.join(GEMM_DTYPES)} (or absent: the dtype's)")
    if fp8_activations:  # DeepSeek-V3's FP8-cached stash (sim.models.precision)
        if gemm_dtype != FP8:
            raise SpecError("fp8_activations", "caches the FP8 products' inputs: set model.gemm_dtype: fp8, or remove it")
        blocks = [fp8_cached_block(b, shape, shard, experts=experts if experts is not None and experts.is_moe(i) else None,
                                   mla=mla) for i, b in enumerate(blocks)]
    layers += [fp8_block(block) for block in blocks] if gemm_dtype == FP8 else blocks
    head = _bert_head(s, h, vocab, d, arch, shard, tied=p["tied_embeddings"]) if bert else \
        _lm_head(s, h, vocab, d, arch, shard, tied=p["tied_embeddings"], kernels=kernels)
    if mtp_depth:  # DeepSeek-V3's MTP modules before the head, which they share (sim.models.mtp)
        moe = experts is not None and experts.is_moe(p["layers"] - 1)
        block = _moe_transformer_block("mtp_block", shape, arch, shard, attention, kernels, experts, mla) if moe else \
            _transformer_block("mtp_block", shape, arch, shard, attention, kernels, mla)
        if fp8_activations:
            block = fp8_cached_block(block, shape, shard, experts=experts if moe else None, mla=mla)
        block = fp8_block(block) if gemm_dtype == FP8 else block
        shared = 0 if p["tied_embeddings"] else 1  # the head's projection to the vocabulary
        projection = mtp_projection(s / shard.context, h, d, tensor=shard.tensor,
                                    sequence_parallel=shard.sequence_parallel)
        mtp, head = with_mtp(head, merge_layers("mtp", projection, block), mtp_depth,
                             head_params_bytes=shared * h * vocab / shard.tensor * d, head_tensors=shared)
        layers.append(mtp)
    layers.append(head)
    input_bytes = (2 if bert else 1) * s / shard.context * TOKEN_ID_BYTES
    model = chain(preset, f"{preset}-{p['layers']}x{h}", layers, input_bytes, p)
    table = vocab * h / (1 if bert else shard.tensor) * d
    if p["tied_embeddings"]:  # the head reuses the token table: counted once, in the embedding
        model = replace(model, tied_layers=(0, len(layers) - 1), tied_bytes=float(table))
    elif mtp_depth:  # the mtp layer reads the embedding's table: a copy on another stage (sim.models.mtp)
        model = replace(model, tied_layers=(0, len(layers) - 2), tied_bytes=float(table))
    model = replace(model, attention=attention, kernels=kernels, experts=experts, mla=mla, gemm_dtype=gemm_dtype,
                    mtp_depth=mtp_depth, fp8_activations=fp8_activations)
    return model if shard.is_whole and not shard.splits_experts else replace(model, shard=shard)


def gpt(*, shard: Shard | None = None, attention: str = "unfused", kernels: str = "fused", experts=None,
        mla=None, gemm_dtype: str | None = None, mtp_depth: int = 0, fp8_activations: bool = False,
        **params: Any) -> ModelSpec:
    """A GPT decoder: ``embedding``, ``block_0`` .. ``block_{layers-1}``, ``head`` (with ``mtp_depth``
    MTP modules, ``sim.models.mtp``); its attention runs ``attention`` (``sim.core.specs.ATTENTION_KERNELS``)."""
    return _transformer("gpt", params, shard, attention, kernels, experts, mla, gemm_dtype, mtp_depth,
                        fp8_activations)


def bert(*, shard: Shard | None = None, attention: str = "unfused", kernels: str = "fused",
         **params: Any) -> ModelSpec:
    """A BERT encoder with its masked-LM head; same layer names and ``attention`` as ``gpt``
    (``kernels``: ``fused`` only, as for ``gpt``; ``eager`` is modelled for Llama)."""
    return _transformer("bert", params, shard, attention, kernels)


def llama(*, shard: Shard | None = None, attention: str = "unfused", kernels: str = "fused", experts=None,
          mla=None, gemm_dtype: str | None = None, mtp_depth: int = 0, fp8_activations: bool = False,
        **params: Any) -> ModelSpec:
    """A Llama decoder (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU, untied head);
    ``kernels``: its element-wise work ``fused`` or ``eager`` (``sim.cost.kernels.eager_elementwise``)."""
    return _transformer("llama", params, shard, attention, kernels, experts, mla, gemm_dtype, mtp_depth,
                        fp8_activations)
