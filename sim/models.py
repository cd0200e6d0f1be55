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
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Callable, Mapping

from sim import kernels as K
from sim.errors import SpecError
from sim.specs import DTYPE_BYTES, OPTIMIZER_STATES, LayerSpec, ModelSpec

__all__ = ["REQUIRED", "PRESET_PARAMS", "MODEL_PRESETS", "build_model", "model_flop_per_sample"]


class _Required:
    """Marks a preset parameter without a default."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
"""The value ``PRESET_PARAMS`` gives to a parameter that the user must set."""

_TOKEN_ID_BYTES = 8
"""Bytes per token id: ``torch.long``, the index dtype of ``nn.Embedding``."""
_MASK_BYTES = 1
"""Bytes per element of a dropout or ReLU mask (Korthikanti et al., MLSys'23, §4.1)."""
_LOSS_BYTES = 4
"""Bytes per logit kept for the loss: fp32 (Korthikanti et al., MLSys'23, §4.3)."""


def _transformer_params(tied_embeddings: bool) -> Mapping[str, Any]:
    shape = {key: REQUIRED for key in ("layers", "hidden", "heads", "seq_len", "vocab")}
    extra = {"ffn_hidden": None, "tied_embeddings": tied_embeddings, "dtype": "fp16", "optimizer": "adam"}
    return MappingProxyType(shape | extra)


PRESET_PARAMS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        "bert": _transformer_params(tied_embeddings=True),
        "gpt": _transformer_params(tied_embeddings=False),
        "mlp": MappingProxyType(
            {"layers": REQUIRED, "hidden": REQUIRED, "input_size": None, "num_classes": 10}
            | {"dtype": "fp32", "optimizer": "adam"}
        ),
        "vgg": MappingProxyType(
            {"depth": 16, "image_size": 224, "num_classes": 1000, "batch_norm": False}
            | {"dtype": "fp32", "optimizer": "momentum"}
        ),
    }
)
"""Preset name -> {parameter: default, or ``REQUIRED``}.

``None`` means a default computed from other parameters: ``ffn_hidden`` = 4 × ``hidden``,
``input_size`` = ``hidden``. ``tied_embeddings``: the output projection reuses the token
embedding matrix (GPT-2 and BERT do), so the head holds no copy of it. That is exact when the
embedding and the head share a stage; across stages Megatron-LM keeps a second copy on the
last stage (Narayanan et al., SC'21), which this count leaves out.
"""

_BOOL_PARAMS = frozenset({"tied_embeddings", "batch_norm"})

_VGG_CONFIGS = {
    11: ((64,), (128,), (256, 256), (512, 512), (512, 512)),
    13: ((64, 64), (128, 128), (256, 256), (512, 512), (512, 512)),
    16: ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512)),
    19: ((64, 64), (128, 128), (256,) * 4, (512,) * 4, (512,) * 4),
}
"""Output channels of the 3×3 convolutions of each block, between max-pools
(Simonyan & Zisserman, ICLR'15, Table 1: configurations A, B, D and E)."""
_VGG_FC_WIDTH = 4096
_VGG_NUM_POOLS = 5


_MAX_SIZE = {"layers": 100_000}
"""Upper bounds that keep a typo (``layers: 1e9``) from building a model that fills memory."""


def _names(table: Mapping[Any, Any]) -> str:
    return ", ".join(str(name) for name in sorted(table))


def _resolve(preset: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """Check ``params`` against ``PRESET_PARAMS[preset]`` and fill in the defaults."""
    table = PRESET_PARAMS[preset]
    for key in sorted(params):
        if key not in table:
            raise SpecError(key, f"unknown parameter of preset {preset}; valid: {_names(table)}")
    resolved = {}
    for key, default in table.items():
        value = params.get(key, default)
        if value is REQUIRED:
            raise SpecError(key, f"required by preset {preset}; give a value (valid parameters: {_names(table)})")
        if not (value is None and default is None):  # None asks for a computed default
            _check_value(key, value)
        resolved[key] = value
    return resolved


def _check_value(key: str, value: Any) -> None:
    if key == "dtype":
        if not isinstance(value, str) or value not in DTYPE_BYTES:
            raise SpecError(key, f"unknown dtype {value!r}; valid: {_names(DTYPE_BYTES)}")
    elif key == "optimizer":
        if not isinstance(value, str) or value not in OPTIMIZER_STATES:
            raise SpecError(key, f"unknown optimizer {value!r}; valid: {_names(OPTIMIZER_STATES)}")
    elif key in _BOOL_PARAMS:
        if not isinstance(value, bool):
            raise SpecError(key, f"must be true or false, got {value!r}")
    elif isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SpecError(key, f"must be a positive integer, got {value!r}")
    elif value > _MAX_SIZE.get(key, 10**9):
        raise SpecError(key, f"{value} is beyond what this generator builds; use at most {_MAX_SIZE.get(key, 10**9)}")


def _describe(preset: str, resolved: Mapping[str, Any]) -> str:
    return f"preset {preset} (" + ", ".join(f"{key}={value}" for key, value in resolved.items()) + ")"


def _chain(name: str, layers: list[LayerSpec], input_bytes: float, p: Mapping[str, Any], source: str) -> ModelSpec:
    """A model whose layers form a chain: a cut carries the previous layer's output."""
    boundary = (float(input_bytes), *(layer.output_bytes for layer in layers[:-1]), 0.0)
    return ModelSpec(
        name=name,
        layers=tuple(layers),
        boundary_bytes=boundary,
        dtype=p["dtype"],
        optimizer=p["optimizer"],
        source=source,
    )


def _matmul_layer(
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


# --- transformers (GPT, BERT) ------------------------------------------------------------


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
    return _matmul_layer(
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
    ids_bytes = (2 if bert else 1) * s * _TOKEN_ID_BYTES
    stash = ids_bytes + _MASK_BYTES * s * h + (d * s * h if bert else 0)
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
    return _matmul_layer(
        "head",
        params=params,
        fwd_flop=2 * s * h * vocab,
        stash_bytes=2 * d * s * h + _LOSS_BYTES * s * vocab,
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
    return _matmul_layer(
        "head",
        params=params,
        fwd_flop=2 * s * h * h + 2 * s * h * vocab,
        stash_bytes=4 * d * s * h + _LOSS_BYTES * s * vocab,
        output_bytes=0,
        d=d,
        kernels=K.bert_head(s, h, vocab, d),
        tensors=5 + (0 if tied else 1),
    )


def _transformer(preset: str, params: Mapping[str, Any]) -> ModelSpec:
    p = _resolve(preset, params)
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
    input_bytes = (2 if bert else 1) * s * _TOKEN_ID_BYTES
    return _chain(f"{preset}-{p['layers']}x{h}", layers, input_bytes, p, _describe(preset, p))


def gpt(**params: Any) -> ModelSpec:
    """A GPT decoder: ``embedding``, ``block_0`` .. ``block_{layers-1}``, ``head``."""
    return _transformer("gpt", params)


def bert(**params: Any) -> ModelSpec:
    """A BERT encoder with its masked-LM head; same layer names as ``gpt``."""
    return _transformer("bert", params)


# --- dense layers shared by VGG's classifier and the MLP -----------------------------------


def _linear(name: str, n_in: int, n_out: int, d: int, *, dropout: bool = False) -> LayerSpec:
    """Linear + ReLU (+ dropout): stash its input, the ReLU mask (and the dropout mask)."""
    masks = (2 if dropout else 1) * _MASK_BYTES * n_out
    return _matmul_layer(
        name,
        params=n_in * n_out + n_out,
        fwd_flop=2 * n_in * n_out,
        stash_bytes=d * n_in + masks,
        output_bytes=d * n_out,
        d=d,
        kernels=K.linear(n_in, n_out, d),
    )


def _classifier(name: str, n_in: int, num_classes: int, d: int) -> LayerSpec:
    """Linear to the classes + softmax cross-entropy: stash its input and fp32 probabilities."""
    return _matmul_layer(
        name,
        params=n_in * num_classes + num_classes,
        fwd_flop=2 * n_in * num_classes,
        stash_bytes=d * n_in + _LOSS_BYTES * num_classes,
        output_bytes=0,
        d=d,
        kernels=K.classifier_loss(n_in, num_classes, d),
    )


# --- VGG -------------------------------------------------------------------------------


def _conv(name: str, c_in: int, c_out: int, size: int, d: int, *, batch_norm: bool) -> LayerSpec:
    """3×3 convolution, stride 1, padding 1 (size kept), [batch norm], ReLU.

    Forward 2·k²·C_in·C_out·H·W, parameters k²·C_in·C_out + C_out (+ 2·C_out for batch
    norm's scale and shift; Ioffe & Szegedy, ICML'15, Alg. 1). Stash: the input, the batch
    norm's input if any, and the ReLU mask.
    """
    k, pixels = 3, size * size
    params = k * k * c_in * c_out + c_out + (2 * c_out if batch_norm else 0)
    stash = d * c_in * pixels + (d * c_out * pixels if batch_norm else 0) + _MASK_BYTES * c_out * pixels
    return _matmul_layer(
        name,
        params=params,
        fwd_flop=2 * k * k * c_in * c_out * pixels,
        stash_bytes=stash,
        output_bytes=d * c_out * pixels,
        d=d,
        kernels=K.conv(c_in, c_out, size, d, kernel=k),
        tensors=4 if batch_norm else 2,
    )


def _max_pool(name: str, channels: int, size: int, d: int) -> LayerSpec:
    """2×2 max-pool, stride 2: one nominal FLOP per input element each way; stash the input."""
    elements = channels * size * size
    return LayerSpec(
        name=name,
        param_bytes=0.0,
        output_bytes=float(d * elements // 4),
        stash_bytes=float(d * elements),
        fwd_flop=float(elements),
        bwd_flop=float(elements),
        wgrad_fraction=0.0,
        kernels=K.pool(channels, size, d),
    )


def vgg(**params: Any) -> ModelSpec:
    """VGG (Simonyan & Zisserman, ICLR'15, Table 1): ``conv1_1`` .. ``pool5``, ``fc6``-``fc8``.

    ``fc6`` reads the last pool's output, 512·(image_size/32)² values (25088 at 224), so
    ``image_size`` must be a multiple of 32. ``fc6`` and ``fc7`` have dropout (§3.1);
    ``fc8`` includes the softmax loss.
    """
    p = _resolve("vgg", params)
    if p["depth"] not in _VGG_CONFIGS:
        raise SpecError("depth", f"no VGG configuration of depth {p['depth']}; valid: {_names(_VGG_CONFIGS)}")
    size = p["image_size"]
    step = 2**_VGG_NUM_POOLS
    if size % step:
        near = max(step, round(size / step) * step)
        raise SpecError("image_size", f"{size} is not a multiple of {step} (five 2×2 max-pools); use e.g. {near}")
    d = DTYPE_BYTES[p["dtype"]]
    layers: list[LayerSpec] = []
    c_in = 3
    for block, widths in enumerate(_VGG_CONFIGS[p["depth"]], start=1):
        for index, c_out in enumerate(widths, start=1):
            layers.append(_conv(f"conv{block}_{index}", c_in, c_out, size, d, batch_norm=p["batch_norm"]))
            c_in = c_out
        layers.append(_max_pool(f"pool{block}", c_in, size, d))
        size //= 2
    layers.append(_linear("fc6", c_in * size * size, _VGG_FC_WIDTH, d, dropout=True))
    layers.append(_linear("fc7", _VGG_FC_WIDTH, _VGG_FC_WIDTH, d, dropout=True))
    layers.append(_classifier("fc8", _VGG_FC_WIDTH, p["num_classes"], d))
    name = f"vgg-{p['depth']}" + ("-bn" if p["batch_norm"] else "")
    return _chain(name, layers, 3 * p["image_size"] ** 2 * d, p, _describe("vgg", p))


# --- MLP -------------------------------------------------------------------------------


def mlp(**params: Any) -> ModelSpec:
    """A reference MLP: ``linear_0`` .. ``linear_{layers-1}`` (linear + ReLU), then ``head``.

    ``linear_0`` maps ``input_size`` to ``hidden``, the others ``hidden`` to ``hidden``;
    ``head`` maps ``hidden`` to ``num_classes`` and computes the cross-entropy loss.
    """
    p = _resolve("mlp", params)
    if p["input_size"] is None:
        p["input_size"] = p["hidden"]
    d, hidden = DTYPE_BYTES[p["dtype"]], p["hidden"]
    widths = [p["input_size"]] + [hidden] * p["layers"]
    layers = [_linear(f"linear_{i}", widths[i], widths[i + 1], d) for i in range(p["layers"])]
    layers.append(_classifier("head", hidden, p["num_classes"], d))
    return _chain(f"mlp-{p['layers']}x{hidden}", layers, p["input_size"] * d, p, _describe("mlp", p))


MODEL_PRESETS: Mapping[str, Callable[..., ModelSpec]] = MappingProxyType(
    {"bert": bert, "gpt": gpt, "mlp": mlp, "vgg": vgg}
)
"""Preset name -> generator taking the preset's parameters as keywords."""


def build_model(preset: str, **params: Any) -> ModelSpec:
    """Build the model of ``preset`` from its parameters (see ``PRESET_PARAMS``).

    Raises ``SpecError`` keyed ``preset`` for an unknown preset, or keyed by the parameter
    for an unknown, missing or invalid one.
    """
    if preset not in MODEL_PRESETS:
        raise SpecError("preset", f"unknown model preset {preset!r}; valid: {_names(MODEL_PRESETS)}")
    return MODEL_PRESETS[preset](**params)


def model_flop_per_sample(model: ModelSpec) -> float:
    """Forward plus backward FLOPs of every layer for one sample (the numerator of MFU)."""
    return sum(layer.fwd_flop + layer.bwd_flop for layer in model.layers)
