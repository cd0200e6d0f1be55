"""Reference models in torch: one ``nn.Module`` per layer of the simulator's layer list.

``sim.models`` describes a GPT or an MLP as a list of layers with per-sample numbers; here
the same list becomes real modules, so that a plan's layer range ``[a, b)`` is simply
modules ``a .. b-1``. Layer ``k`` maps the boundary tensor before it to the one after it:

* ``gpt``: ``embedding`` (token + learned position embeddings), ``block_i`` (pre-LN
  transformer block: LN, QKV, causal attention, projection, LN, MLP with GELU, two
  residuals; Radford et al., GPT-2, 2019, §2.3), ``head`` (final LN, projection to the
  vocabulary without bias, cross-entropy). With ``tied_embeddings`` the head reuses the
  embedding's token matrix and holds none of its own.
* ``mlp``: ``linear_i`` (Linear + ReLU), ``head`` (Linear + cross-entropy).

Parameter bytes per layer equal ``LayerSpec.param_bytes`` exactly (tested). There is no
dropout, so runs are deterministic. Every layer is initialised from its own seed
(``seed``, layer index), so a rank that builds only its stage's layers gets the same
weights as a single process that builds them all. Data is synthetic: token ids or features
and labels drawn from a seed per step.

Heads return the mean loss of their batch; the executor scales each micro-batch slice's
loss by ``slice_samples / global_batch_size`` so that gradients summed over micro-batches
and replicas equal the gradient of the whole batch's mean loss.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from runtime.config import ModelConfig
from sim.specs import DTYPE_BYTES

__all__ = [
    "OPTIMIZERS",
    "TORCH_DTYPES",
    "StageModule",
    "build_layers",
    "input_dtype",
    "layer_param_bytes",
    "make_optimizer",
    "sample_shape",
    "synthetic_batch",
    "whole_model",
]

TORCH_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
"""Scenario dtype -> torch dtype of parameters and activations (no master copies)."""

_INIT_STD = 0.02
"""GPT-2's initialisation: normal(0, 0.02) for every matrix and embedding."""


# --- GPT -----------------------------------------------------------------------------------


class Embedding(nn.Module):
    """Token ids ``(n, s)`` -> hidden states ``(n, s, h)``: token plus learned position embedding."""

    def __init__(self, vocab: int, seq_len: int, hidden: int) -> None:
        super().__init__()
        self.token = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(seq_len, hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.token(ids) + self.position(positions)


class Block(nn.Module):
    """Pre-LN transformer block with causal self-attention (no dropout)."""

    def __init__(self, hidden: int, heads: int, ffn_hidden: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln_2 = nn.LayerNorm(hidden)
        self.fc_1 = nn.Linear(hidden, ffn_hidden)
        self.fc_2 = nn.Linear(ffn_hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, s, h = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(h, dim=2)
        q, k, v = (t.view(n, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attention.transpose(1, 2).reshape(n, s, h))
        return x + self.fc_2(F.gelu(self.fc_1(self.ln_2(x))))


class GPTHead(nn.Module):
    """Final LN, projection to the vocabulary, mean cross-entropy over every token.

    With tied embeddings the projection matrix is the embedding's token table: ``tie``
    points the head at it without registering it here (its bytes belong to the embedding,
    as in ``sim.models``). A head on another stage than the embedding gets its own copy
    instead (``untie_copy``), kept equal by summing both gradients (Narayanan et al., SC'21,
    keep the same second copy on the last stage).
    """

    def __init__(self, hidden: int, vocab: int, *, tied: bool) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(hidden)
        self.proj = None if tied else nn.Parameter(torch.empty(vocab, hidden))
        self._tied: tuple[nn.Parameter, ...] = ()  # a tuple, so the module does not register it

    def tie(self, weight: nn.Parameter) -> None:
        self._tied = (weight,)

    @property
    def borrowed(self) -> tuple[nn.Parameter, ...]:
        """Parameters this head uses but the embedding owns (its tied token matrix)."""
        return self._tied

    def untie_copy(self, weight: torch.Tensor) -> None:
        """Hold a registered copy of the embedding's token matrix (head on its own stage)."""
        self.proj = nn.Parameter(weight.detach().clone())
        self._tied = ()

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.proj if self.proj is not None else self._tied[0]
        return F.linear(self.ln_f(x), weight)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return lm_loss(self.logits(x), labels)


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every token, computed in fp32."""
    return F.cross_entropy(logits.float().flatten(0, -2), labels.flatten())


# --- MLP -----------------------------------------------------------------------------------


class LinearReLU(nn.Module):
    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.linear = nn.Linear(n_in, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.linear(x))


class ClassifierHead(nn.Module):
    """Linear to the classes and mean cross-entropy."""

    def __init__(self, n_in: int, num_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(n_in, num_classes)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.logits(x).float(), labels)


# --- building --------------------------------------------------------------------------------


def num_layers(config: ModelConfig) -> int:
    return config.values["layers"] + (2 if config.preset == "gpt" else 1)


def _new_layer(config: ModelConfig, index: int) -> nn.Module:
    p, last = config.values, num_layers(config) - 1
    if config.preset == "gpt":
        if index == 0:
            return Embedding(p["vocab"], p["seq_len"], p["hidden"])
        if index == last:
            return GPTHead(p["hidden"], p["vocab"], tied=p["tied_embeddings"])
        return Block(p["hidden"], p["heads"], p["ffn_hidden"])
    if index == last:
        return ClassifierHead(p["hidden"], p["num_classes"])
    return LinearReLU(p["input_size"] if index == 0 else p["hidden"], p["hidden"])


def _init_(module: nn.Module, generator: torch.Generator, preset: str) -> None:
    """GPT-2 init for ``gpt`` (normal 0.02, zero biases, LN ones); He init for ``mlp``."""
    for name, param in sorted(module.named_parameters()):
        with torch.no_grad():
            if isinstance(_owner(module, name), nn.LayerNorm):
                param.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias"):
                param.zero_()
            elif preset == "gpt":
                param.normal_(0.0, _INIT_STD, generator=generator)
            else:
                param.normal_(0.0, math.sqrt(2.0 / param.shape[1]), generator=generator)


def _owner(module: nn.Module, param_name: str) -> nn.Module:
    owner = module
    for part in param_name.split(".")[:-1]:
        owner = getattr(owner, part)
    return owner


def build_layer(config: ModelConfig, index: int, *, seed: int = 0, device: torch.device | str = "cpu") -> nn.Module:
    """Layer ``index`` of the model, initialised from (``seed``, ``index``) on ``device``."""
    module = _new_layer(config, index)
    generator = torch.Generator().manual_seed(seed * 1_000_003 + index)
    _init_(module, generator, config.preset)
    dtype = TORCH_DTYPES[config.values["dtype"]]
    return module.to(device=device, dtype=dtype)


def build_layers(
    config: ModelConfig, indices: range | None = None, *, seed: int = 0, device: torch.device | str = "cpu"
) -> dict[int, nn.Module]:
    """Layers ``indices`` (all by default), keyed by their global index.

    A tied GPT head is tied to the embedding when both are built here; otherwise it gets
    a copy of the embedding's initial token matrix (see ``GPTHead``).
    """
    indices = range(num_layers(config)) if indices is None else indices
    layers = {k: build_layer(config, k, seed=seed, device=device) for k in indices}
    last = num_layers(config) - 1
    if config.preset == "gpt" and config.values["tied_embeddings"] and last in layers:
        head = layers[last]
        if 0 in layers:
            head.tie(layers[0].token.weight)
        else:
            head.untie_copy(build_layer(config, 0, seed=seed, device=device).token.weight)
    return layers


def layer_param_bytes(module: nn.Module) -> int:
    """Bytes of the parameters registered in ``module``."""
    return sum(p.numel() * p.element_size() for p in module.parameters())


def sample_shape(config: ModelConfig, cut: int) -> tuple[int, ...]:
    """Shape of one sample of the tensor that enters layer ``cut``."""
    p = config.values
    if config.preset == "gpt":
        return (p["seq_len"],) if cut == 0 else (p["seq_len"], p["hidden"])
    return (p["input_size"] if cut == 0 else p["hidden"],)


def input_dtype(config: ModelConfig, cut: int) -> torch.dtype:
    """Dtype of the tensor that enters layer ``cut`` (token ids are ``long``)."""
    if config.preset == "gpt" and cut == 0:
        return torch.long
    return TORCH_DTYPES[config.values["dtype"]]


def synthetic_batch(
    config: ModelConfig, num_samples: int, *, step: int, seed: int = 0, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and labels of ``num_samples`` samples for training step ``step``.

    GPT: random token ids; the labels are the ids shifted by one (next-token prediction).
    MLP: normal features and uniform class labels.
    """
    generator = torch.Generator().manual_seed(seed * 1_000_003 + 7919 * (step + 1))
    p = config.values
    if config.preset == "gpt":
        tokens = torch.randint(0, p["vocab"], (num_samples, p["seq_len"] + 1), generator=generator)
        inputs, labels = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    else:
        inputs = torch.randn(num_samples, p["input_size"], generator=generator).to(TORCH_DTYPES[p["dtype"]])
        labels = torch.randint(0, p["num_classes"], (num_samples,), generator=generator)
    return inputs.to(device), labels.to(device)


class StageModule(nn.Module):
    """Layers ``[start, end)`` run in order; the model's last layer also takes the labels.

    Parameters are named by global layer index (``layers.3.qkv.weight``), the same names a
    whole model built in one process has, so gradients can be compared by name.
    """

    def __init__(self, layers: dict[int, nn.Module], *, is_last: bool) -> None:
        super().__init__()
        self.start = min(layers)
        self.is_last = is_last
        self.layers = nn.ModuleDict({str(k): layers[k] for k in sorted(layers)})

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        modules = list(self.layers.values())
        body = modules[:-1] if self.is_last else modules
        for layer in body:
            x = layer(x)
        return modules[-1](x, labels) if self.is_last else x

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The last stage's output before the loss (for ``torch.distributed.pipelining``)."""
        modules = list(self.layers.values())
        for layer in modules[:-1]:
            x = layer(x)
        return modules[-1].logits(x)


OPTIMIZERS = {
    "sgd": lambda params, lr: torch.optim.SGD(params, lr=lr),
    "momentum": lambda params, lr: torch.optim.SGD(params, lr=lr, momentum=0.9),
    "adam": lambda params, lr: torch.optim.Adam(params, lr=lr),
    "adamw": lambda params, lr: torch.optim.AdamW(params, lr=lr),
}
"""``ModelSpec.optimizer`` name -> ``fn(params, lr)`` building the torch optimizer."""


def make_optimizer(name: str, params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """The model's optimizer (``sim.specs.OPTIMIZER_STATES`` names) over ``params``."""
    return OPTIMIZERS[name](params, lr)


def whole_model(config: ModelConfig, *, seed: int = 0, device: torch.device | str = "cpu") -> StageModule:
    """Every layer in one module: the single-process reference."""
    return StageModule(build_layers(config, seed=seed, device=device), is_last=True)


def describe(config: ModelConfig) -> dict[str, Any]:
    """Preset, parameters and bytes per element (for logs and summaries)."""
    return {"preset": config.preset, **config.values, "bytes_per_element": DTYPE_BYTES[config.values["dtype"]]}
