"""MLP: a stack of linear + ReLU layers and a classifier, the smallest model that pipelines.

Its numbers are easy to check by hand (a linear layer of n_in × n_out holds
n_in·n_out + n_out parameters and takes 2·n_in·n_out forward FLOPs per sample), which makes
it the reference model of the runtime's tests.
"""

from __future__ import annotations

from typing import Any

from sim.core.model_spec import ModelSpec
from sim.core.specs import DTYPE_BYTES
from sim.models.layers import chain, classifier, linear
from sim.models.params import resolve

__all__ = ["mlp"]


def mlp(**params: Any) -> ModelSpec:
    """A reference MLP: ``linear_0`` .. ``linear_{layers-1}`` (linear + ReLU), then ``head``.

    ``linear_0`` maps ``input_size`` to ``hidden``, the others ``hidden`` to ``hidden``;
    ``head`` maps ``hidden`` to ``num_classes`` and computes the cross-entropy loss.
    """
    p = resolve("mlp", params)
    if p["input_size"] is None:
        p["input_size"] = p["hidden"]
    d, hidden = DTYPE_BYTES[p["dtype"]], p["hidden"]
    widths = [p["input_size"]] + [hidden] * p["layers"]
    layers = [linear(f"linear_{i}", widths[i], widths[i + 1], d) for i in range(p["layers"])]
    layers.append(classifier("head", hidden, p["num_classes"], d))
    return chain("mlp", f"mlp-{p['layers']}x{hidden}", layers, p["input_size"] * d, p)
