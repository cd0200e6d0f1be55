"""VGG: 3×3 convolutions between five 2×2 max-pools, then three dense layers.

The depth picks the convolution widths of Simonyan & Zisserman (ICLR'15, Table 1); the
image size must survive five halvings. Layer names follow the paper's blocks
(``conv1_1`` .. ``pool5``, ``fc6`` .. ``fc8``), and the counts follow ``sim.models``'
conventions, so VGG-16's parameter count is torchvision's 138,357,544.
"""

from __future__ import annotations

from typing import Any

from sim.core.errors import SpecError
from sim.core.model_spec import LayerSpec, ModelSpec
from sim.core.specs import DTYPE_BYTES
from sim.cost import kernels as K
from sim.models.layers import MASK_BYTES, chain, classifier, linear, matmul_layer
from sim.models.params import names, resolve

__all__ = ["vgg"]

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


def _conv(name: str, c_in: int, c_out: int, size: int, d: int, *, batch_norm: bool) -> LayerSpec:
    """3×3 convolution, stride 1, padding 1 (size kept), [batch norm], ReLU.

    Forward 2·k²·C_in·C_out·H·W, parameters k²·C_in·C_out + C_out (+ 2·C_out for batch
    norm's scale and shift; Ioffe & Szegedy, ICML'15, Alg. 1). Stash: the input, the batch
    norm's input if any, and the ReLU mask.
    """
    k, pixels = 3, size * size
    params = k * k * c_in * c_out + c_out + (2 * c_out if batch_norm else 0)
    stash = d * c_in * pixels + (d * c_out * pixels if batch_norm else 0) + MASK_BYTES * c_out * pixels
    return matmul_layer(
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
    p = resolve("vgg", params)
    if p["depth"] not in _VGG_CONFIGS:
        raise SpecError("depth", f"no VGG configuration of depth {p['depth']}; valid: {names(_VGG_CONFIGS)}")
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
    layers.append(linear("fc6", c_in * size * size, _VGG_FC_WIDTH, d, dropout=True))
    layers.append(linear("fc7", _VGG_FC_WIDTH, _VGG_FC_WIDTH, d, dropout=True))
    layers.append(classifier("fc8", _VGG_FC_WIDTH, p["num_classes"], d))
    name = f"vgg-{p['depth']}" + ("-bn" if p["batch_norm"] else "")
    return chain("vgg", name, layers, 3 * p["image_size"] ** 2 * d, p)
