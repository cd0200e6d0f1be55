"""Transformers: GPT (a decoder) and BERT (an encoder with its masked-LM head).

Both are an ``embedding``, ``layers`` identical blocks ``block_0`` .. ``block_{layers-1}``
and a ``head`` that computes the loss. A block's parameters, FLOPs and stash follow
Megatron-LM's counts (Narayanan et al., SC'21, §5.1) and the activation-memory count of
Korthikanti et al. (MLSys'23, §4.1, Eq. 1), written for any dtype and MLP width; the
conventions (what a stash holds, FLOPs per multiply-add) are ``sim.models``'.
"""

from __future__ import annotations

from typing import Any, Mapping

from sim import kernels as K
from sim.errors import SpecError
from sim.models.layers import LOSS_BYTES, MASK_BYTES, TOKEN_ID_BYTES, chain, matmul_layer
from sim.models.params import resolve
from sim.specs import DTYPE_BYTES, LayerSpec, ModelSpec

__all__ = ["bert", "gpt"]


def _block_params(h: int, f: int) -> int:
    """Parameters of one transformer block: 12h² + 13h when f = 4h.

    Narayanan et al., SC'21, §5.1 / Appendix: attention QKV and output projections with
    biases 4h² + 4h; MLP h×f and f×h with biases 2hf + f + h; two layer norms 4h.
    """
    return (4 * h * h + 4 * h) + (2 * h * f + f + h) + 4 * h


def _block_fwd_flop(s: int, h: int, f: int) -> int:
    """Forward FLOPs of one block for one sample: 24sh² + 4s²h when f = 4h.

    Narayanan et al., SC'21, §5.1 (72·B·s·l·h²·(1 + s/6h) for forward and backward, the
    backward being twice the forward): QKV and output projections 8sh², attention scores
    and attention over values 4s²h, MLP 4shf. Causal masking is not subtracted (as there).
    """
    return 8 * s * h * h + 4 * s * s * h + 4 * s * h * f


def _block_stash_bytes(s: int, h: int, a: int, f: int, d: int) -> int:
    """Bytes a block stashes for one sample, no recomputation, no tensor parallelism.

    Korthikanti et al., MLSys'23, §4.1, Eq. 1 gives s·h·(34 + 5as/h) for 2-byte activations
    and 1-byte dropout masks. Its terms, written for d bytes per element and MLP width f:
    attention (5d + 1)·sh + (2d + 1)·as² (QKV input, Q, K, V, projection input, softmax
    output, its dropout mask and output, output dropout mask); MLP (d + 1)·sh + 2d·sf
    (first linear's input, GeLU input, second linear's input, dropout mask); two layer-norm
    inputs 2d·sh. With d = 2 and f = 4h the sum is exactly Eq. 1.
    """
    return (8 * d + 2) * s * h + 2 * d * s * f + (2 * d + 1) * a * s * s


def _transformer_block(name: str, s: int, h: int, a: int, f: int, d: int) -> LayerSpec:
    return matmul_layer(
        name,
        params=_block_params(h, f),
        fwd_flop=_block_fwd_flop(s, h, f),
        stash_bytes=_block_stash_bytes(s, h, a, f, d),
        output_bytes=s * h * d,
        d=d,
        kernels=K.transformer_block(s, h, a, f, d),
        tensors=12,  # weights and biases of QKV, projection, two MLP layers and two layer norms
    )


def _embedding(s: int, h: int, vocab: int, d: int, *, bert: bool) -> LayerSpec:
    """Token and position embeddings (BERT adds two token types and a layer norm).

    A look-up has no matmul: forward and backward get one nominal FLOP per element of each
    table read (or scatter-added into); all of the backward is weight gradient. The stash is
    the token ids, the embedding dropout mask (Korthikanti et al., MLSys'23, §4.3) and, for
    BERT, the layer norm's input.
    """
    tables = 3 if bert else 2
    params = (vocab + s) * h + (2 * h + 2 * h if bert else 0)
    ids_bytes = (2 if bert else 1) * s * TOKEN_ID_BYTES
    stash = ids_bytes + MASK_BYTES * s * h + (d * s * h if bert else 0)
    return LayerSpec(
        name="embedding",
        param_bytes=float(params * d),
        param_tensors=tables + (2 if bert else 0),
        output_bytes=float(s * h * d),
        stash_bytes=float(stash),
        fwd_flop=float(tables * s * h),
        bwd_flop=float(tables * s * h),
        wgrad_fraction=1.0,
        kernels=K.embedding(s, h, d, tables=tables),
    )


def _gpt_head(s: int, h: int, vocab: int, d: int, *, tied: bool) -> LayerSpec:
    """Final layer norm, projection to the vocabulary, cross-entropy loss.

    Forward 2·s·h·V (Narayanan et al., SC'21, §5.1: the 6·B·s·h·V term is forward and
    backward). Stash: layer-norm input, projection input, fp32 logits — Korthikanti et al.,
    MLSys'23, §4.3: 4·s·h·(1 + V/h) bytes for d = 2. A tied projection reuses the embedding's
    matrix, so only the layer norm's 2h parameters are counted here.
    """
    params = 2 * h + (0 if tied else h * vocab)
    return matmul_layer(
        "head",
        params=params,
        fwd_flop=2 * s * h * vocab,
        stash_bytes=2 * d * s * h + LOSS_BYTES * s * vocab,
        output_bytes=0,
        d=d,
        kernels=K.lm_head(s, h, vocab, d),
        tensors=2 + (0 if tied else 1),
    )


def _bert_head(s: int, h: int, vocab: int, d: int, *, tied: bool) -> LayerSpec:
    """BERT's masked-LM head: dense h×h + GeLU + layer norm, projection to V with bias, loss.

    Parameters h² + h + 2h + V, plus h·V if the projection is not tied to the token
    embedding (Devlin et al., NAACL'19, tie it, as BERT's released code does). Forward
    2sh² + 2shV over every position. Stash: dense, GeLU, layer-norm and projection inputs,
    and the fp32 logits (Korthikanti et al., MLSys'23, §4.3).
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


def _transformer(preset: str, params: Mapping[str, Any]) -> ModelSpec:
    p = resolve(preset, params)
    if p["ffn_hidden"] is None:
        p["ffn_hidden"] = 4 * p["hidden"]
    s, h, a, f, vocab = p["seq_len"], p["hidden"], p["heads"], p["ffn_hidden"], p["vocab"]
    if h % a:
        divisors = [k for k in range(1, h + 1) if h % k == 0]
        near = min(divisors, key=lambda k: (abs(k - a), k))
        raise SpecError("heads", f"{a} does not divide hidden {h}; use a divisor of {h} such as {near}")
    d = DTYPE_BYTES[p["dtype"]]
    bert = preset == "bert"
    layers = [_embedding(s, h, vocab, d, bert=bert)]
    layers += [_transformer_block(f"block_{i}", s, h, a, f, d) for i in range(p["layers"])]
    head = _bert_head if bert else _gpt_head
    layers.append(head(s, h, vocab, d, tied=p["tied_embeddings"]))
    input_bytes = (2 if bert else 1) * s * TOKEN_ID_BYTES
    return chain(preset, f"{preset}-{p['layers']}x{h}", layers, input_bytes, p)


def gpt(**params: Any) -> ModelSpec:
    """A GPT decoder: ``embedding``, ``block_0`` .. ``block_{layers-1}``, ``head``."""
    return _transformer("gpt", params)


def bert(**params: Any) -> ModelSpec:
    """A BERT encoder with its masked-LM head; same layer names as ``gpt``."""
    return _transformer("bert", params)
