"""Layers every generator shares: matmul layers, dense layers, and the chain that joins them.

A matmul layer's backward is two matmuls of its forward's size (input gradient and weight
gradient: backward = 2 × forward, half of it weight gradient). A dense layer is a linear
map with ReLU (and dropout) as in VGG's classifier and the MLP; the classifier ends a model
with the loss, so its output is 0 bytes. ``chain`` makes a model of a layer list in which
each cut carries the previous layer's output, and records the generator that built it.
The byte sizes of token ids, masks and loss logits are the package's conventions
(``sim.models``).
"""

from __future__ import annotations

from typing import Any, Mapping

from sim.core.model_spec import LayerSpec, ModelPreset, ModelSpec
from sim.cost import kernels as K
from sim.models.params import describe

__all__ = ["LOSS_BYTES", "MASK_BYTES", "TOKEN_ID_BYTES", "chain", "classifier", "fused_rotary", "linear", "matmul_layer"]

TOKEN_ID_BYTES = 8
"""Bytes per token id: ``torch.long``, the index dtype of ``nn.Embedding``."""
MASK_BYTES = 1
"""Bytes per element of a dropout or ReLU mask (Korthikanti et al., MLSys'23, §4.1)."""
LOSS_BYTES = 4
"""Bytes per logit kept for the loss: fp32 (Korthikanti et al., MLSys'23, §4.3)."""


def chain(preset: str, name: str, layers: list[LayerSpec], input_bytes: float, p: Mapping[str, Any]) -> ModelSpec:
    """A model whose layers form a chain: a cut carries the previous layer's output.

    ``p`` is the generator's resolved parameters (``resolve``, computed defaults filled in);
    the model keeps them as its ``ModelSpec.preset``.
    """
    boundary = (float(input_bytes), *(layer.output_bytes for layer in layers[:-1]), 0.0)
    return ModelSpec(
        name=name,
        layers=tuple(layers),
        boundary_bytes=boundary,
        dtype=p["dtype"],
        optimizer=p["optimizer"],
        source=describe(preset, p),
        preset=ModelPreset(name=preset, params=tuple(sorted(p.items()))),
    )


def matmul_layer(
    name: str, *, params: int, fwd_flop: float, stash_bytes: float, output_bytes: float, d: int, kernels: tuple = (),
    tensors: int = 2,
) -> LayerSpec:
    """A layer made of matmuls: backward = 2 × forward, half of it weight gradient; ``tensors``
    parameter tensors (a weight and a bias by default)."""
    return LayerSpec(
        name=name,
        param_bytes=float(params * d),
        param_tensors=tensors,
        output_bytes=float(output_bytes),
        stash_bytes=float(stash_bytes),
        fwd_flop=float(fwd_flop),
        bwd_flop=2.0 * fwd_flop,
        wgrad_fraction=0.5,
        kernels=kernels,
    )


def linear(name: str, n_in: int, n_out: int, d: int, *, dropout: bool = False) -> LayerSpec:
    """Linear + ReLU (+ dropout): stash its input, the ReLU mask (and the dropout mask)."""
    masks = (2 if dropout else 1) * MASK_BYTES * n_out
    return matmul_layer(
        name,
        params=n_in * n_out + n_out,
        fwd_flop=2 * n_in * n_out,
        stash_bytes=d * n_in + masks,
        output_bytes=d * n_out,
        d=d,
        kernels=K.linear(n_in, n_out, d),
    )


def classifier(name: str, n_in: int, num_classes: int, d: int) -> LayerSpec:
    """Linear to the classes + softmax cross-entropy: stash its input and fp32 probabilities."""
    return matmul_layer(
        name,
        params=n_in * num_classes + num_classes,
        fwd_flop=2 * n_in * num_classes,
        stash_bytes=d * n_in + LOSS_BYTES * num_classes,
        output_bytes=0,
        d=d,
        kernels=K.classifier_loss(n_in, num_classes, d),
    )


def fused_rotary(kernels: tuple, tokens: float, q_width: float, k_width: float, d: int) -> tuple:
    """``kernels`` with Megatron-Core's rotary embedding after the QKV product (NVIDIA/Megatron-LM at core_v0.9.0,
    ``attention.py``: ``apply_rotary_pos_emb`` on the query and the key, TE's ``fused_apply_rotary_pos_emb`` under
    ``apply_rope_fusion``, on unless ``--no-rope-fusion``): each reads and writes its tensor, and so its backward."""
    rope = tuple(K.KernelSpec(name=f"rope_{x}", bytes=2 * d * tokens * w, bwd_bytes=2 * d * tokens * w)
                 for x, w in (("q", q_width), ("k", k_width)))
    return kernels[:2] + rope + kernels[2:]  # after ln1 and qkv
