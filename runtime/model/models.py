"""Reference models in torch: one ``nn.Module`` per layer of the simulator's layer list.

``sim.models`` describes a GPT, a Llama or an MLP as a list of layers with per-sample numbers; here
the same list becomes real modules, so that a plan's layer range ``[a, b)`` is simply
modules ``a .. b-1``. Layer ``k`` maps the boundary tensor before it to the one after it:

* ``gpt`` and ``llama``: ``embedding``, ``block_i``, ``head`` (``runtime.model.layers``: GPT-2's
  pre-LN blocks; Llama's RMSNorm, rotary embeddings, grouped-query attention and SwiGLU).
  With ``tied_embeddings`` the head reuses the embedding's token matrix and holds none of
  its own. With ``gemm_dtype: fp8`` a block's weighted products run in FP8 (``runtime.model.fp8``).
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
from torch.distributed.tensor import DTensor

from runtime.model.config import ModelConfig
from runtime.model.experts import MoE, expert_seed
from runtime.model.fp8 import use_fp8
from runtime.model.layers import Embedding, LMHead, TransformerBlock, lm_loss
from runtime.model.mla import LatentAttention
from runtime.model.mtp import MTPHead, MTPModule, MultiTokenPrediction
from sim.core.specs import DTYPE_BYTES, FP8

__all__ = [
    "OPTIMIZERS",
    "OPTIMIZER_CLASSES",
    "TORCH_DTYPES",
    "TRANSFORMERS",
    "lm_loss",
    "StageModule",
    "build_layers",
    "input_dtype",
    "layer_param_bytes",
    "local_tensor",
    "make_optimizer",
    "sample_shape",
    "synthetic_batch",
    "whole_model",
]

TORCH_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
"""Scenario dtype -> torch dtype of parameters and activations (no master copies)."""

_INIT_STD = 0.02
"""GPT-2's initialisation: normal(0, 0.02) for every matrix and embedding."""


# --- GPT and Llama: runtime.model.layers ------------------------------------------------------------

TRANSFORMERS = ("gpt", "llama")
"""Presets built from ``runtime.model.layers``: an embedding, blocks and a language-model head."""


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
    """Layers of the model: an embedding, the blocks, ``mtp`` with ``mtp_depth`` and the head."""
    if config.preset in TRANSFORMERS:
        return config.values["layers"] + 2 + (1 if config.mtp_depth else 0)
    return config.values["layers"] + 1


def _new_layer(config: ModelConfig, index: int, local: tuple[int, ...] | None = None,
               rank: int | None = None) -> nn.Module:
    p, last = config.values, num_layers(config) - 1
    if config.preset in TRANSFORMERS:
        llama = config.preset == "llama"
        # the table and the head hold the padded rows as the simulator counts them at the plan's t
        # (sim.models.vocab): every tensor rank an equal slice. No token id reaches a padded row
        # (synthetic_batch draws ids below vocab), so the table's padded rows get no gradient; the
        # head's take part in the softmax, as in Megatron-LM, which pads without masking them
        vocab = config.padded_vocab
        if index == 0:
            return Embedding(vocab, p["seq_len"], p["hidden"], positions=not llama)
        if index == last:
            if config.mtp_depth:
                return MTPHead(p["hidden"], vocab, config.mtp_depth, tied=p["tied_embeddings"], llama=llama)
            return LMHead(p["hidden"], vocab, tied=p["tied_embeddings"], llama=llama)
        if config.mtp_depth and index == last - 1:  # each module's block is like the last (sim.models.mtp),
            # an MoE block where the last is one (DeepSeek-V3 §2.2), its experts laid out on this layer's devices
            return MultiTokenPrediction([MTPModule(p["hidden"], _block(config, index - 1, local,
                                                                       config.servers_of(index, rank)))
                                         for _ in range(config.mtp_depth)])
        return _block(config, index, local, config.servers_of(index, rank))
    if index == last:
        return ClassifierHead(p["hidden"], p["num_classes"])
    return LinearReLU(p["input_size"] if index == 0 else p["hidden"], p["hidden"])


def _block(config: ModelConfig, index: int, local: tuple[int, ...] | None,
           servers: tuple[int, ...] | None) -> nn.Module:
    """A transformer block like layer ``index`` (block ``index − 1``): an MoE block holding the
    routed experts ``local`` (``servers``: each expert's server) where the model's experts say so."""
    p, llama, experts, mlp = config.values, config.preset == "llama", config.experts, None
    if experts is not None and experts.is_moe(index - 1):  # block i is layer i + 1
        mlp = MoE(p["hidden"], count=experts.count, top_k=experts.top_k, ffn_hidden=experts.ffn_hidden,
                  shared=experts.shared, gated=llama, local=local, capacity_factor=experts.capacity_factor,
                  servers=servers, node_limit=experts.node_limit)
    attention = None if config.mla is None else LatentAttention(p["hidden"], p["heads"], config.mla)
    block = TransformerBlock(p["hidden"], p["heads"], p["ffn_hidden"], kv_heads=p.get("kv_heads"), llama=llama,
                             mlp=mlp, attention=attention)
    if config.gemm_dtype == FP8:  # the block's weighted products, as sim.models.precision prices them
        use_fp8(block, tensor_parallel=config.tensor_parallel, expert_tensor_parallel=config.expert_tensor_parallel)
    return block


def _init_(module: nn.Module, generator: torch.Generator, preset: str) -> None:
    """GPT-2 init for ``gpt`` and ``llama`` (normal 0.02, zero biases, norms ones); He init
    for ``mlp``."""
    for name, param in sorted(module.named_parameters()):
        if ".experts." in name:  # each routed expert has its own seed (_init_experts)
            continue
        with torch.no_grad():
            if isinstance(_owner(module, name), (nn.LayerNorm, nn.RMSNorm)):
                param.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias"):
                param.zero_()
            elif preset in TRANSFORMERS:
                param.normal_(0.0, _INIT_STD, generator=generator)
            else:
                param.normal_(0.0, math.sqrt(2.0 / param.shape[1]), generator=generator)


def _owner(module: nn.Module, param_name: str) -> nn.Module:
    owner = module
    for part in param_name.split(".")[:-1]:
        owner = getattr(owner, part)
    return owner


def _init_experts(module: nn.Module, seed: int, index: int) -> None:
    """GPT-2 init of each routed expert from its own seed, whichever rank holds it (the MTP
    layer's depth d: its experts numbered on after the d depths before it)."""
    for depth, moe in enumerate(m for m in module.modules() if isinstance(m, MoE)):
        _init_routed(moe, seed, index, depth * moe.count)


def _init_routed(moe: MoE, seed: int, index: int, first: int) -> None:
    for e in moe.local:
        generator = torch.Generator().manual_seed(expert_seed(seed, index, first + e))
        for name, param in sorted(moe.experts[str(e)].named_parameters()):
            with torch.no_grad():
                if name.endswith("bias"):
                    param.zero_()
                else:
                    param.normal_(0.0, _INIT_STD, generator=generator)


def build_layer(config: ModelConfig, index: int, *, seed: int = 0, device: torch.device | str = "cpu",
                local_experts: tuple[int, ...] | None = None, rank: int | None = None) -> nn.Module:
    """Layer ``index`` of the model, initialised from (``seed``, ``index``) on ``device``;
    an MoE block holds the routed experts ``local_experts`` (all by default) and routes as plan
    device ``rank`` does (``ModelConfig.servers_of``)."""
    module = _new_layer(config, index, local_experts, rank)
    generator = torch.Generator().manual_seed(seed * 1_000_003 + index)
    _init_(module, generator, config.preset)
    _init_experts(module, seed, index)
    dtype = TORCH_DTYPES[config.values["dtype"]]
    return module.to(device=device, dtype=dtype)


def build_layers(
    config: ModelConfig, indices: range | None = None, *, seed: int = 0, device: torch.device | str = "cpu",
    local_experts: dict[int, tuple[int, ...]] | None = None, rank: int | None = None,
) -> dict[int, nn.Module]:
    """Layers ``indices`` (all by default), keyed by their global index; ``local_experts[k]``:
    the routed experts layer k holds (expert parallelism; all when absent); ``rank``: the plan's
    device that holds them, whose expert-parallel group's servers it routes over (node-limited).

    A tied GPT head is tied to the embedding when both are built here; otherwise it gets
    a copy of the embedding's initial token matrix (see ``runtime.model.layers.LMHead``).
    """
    indices = range(num_layers(config)) if indices is None else indices
    local_experts = local_experts or {}
    layers = {k: build_layer(config, k, seed=seed, device=device, local_experts=local_experts.get(k), rank=rank)
              for k in indices}
    last = num_layers(config) - 1
    if config.preset in TRANSFORMERS and config.values["tied_embeddings"] and last in layers:
        head = layers[last]
        if 0 in layers:
            head.tie(layers[0].token)
        else:
            head.untie_copy(build_layer(config, 0, seed=seed, device=device).token.weight)
    if config.preset in TRANSFORMERS and config.mtp_depth and last - 1 in layers:
        _share_table(config, layers, seed, device)
    return layers


def _share_table(config: ModelConfig, layers: dict[int, nn.Module], seed: int, device: torch.device | str) -> None:
    """Point the MTP layer at the token table it embeds with (DeepSeek-V3 §2.2's shared
    embedding): the embedding's when it is built here, else a tied head's copy (whose gradient the
    tied group sums with the embedding's), else a copy of its own from the embedding's seed (equal
    at start: Megatron-Core's MTP stage, ``runtime.model.mtp.MultiTokenPrediction.hold_copy``)."""
    last = num_layers(config) - 1
    if 0 in layers:
        layers[last - 1].tie(layers[0].token)
    elif last in layers and layers[last].proj is not None and config.values["tied_embeddings"]:
        layers[last - 1].tie(layers[last].proj)
    else:
        layers[last - 1].hold_copy(build_layer(config, 0, seed=seed, device=device).token.weight)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The part of ``t`` this device stores (``t`` itself unless it is a DTensor)."""
    return t.to_local() if isinstance(t, DTensor) else t


def layer_param_bytes(module: nn.Module) -> int:
    """Bytes of the parameters registered in ``module`` (a DTensor's: this device's shard)."""
    return sum(local_tensor(p).numel() * p.element_size() for p in module.parameters())


def sample_shape(config: ModelConfig, cut: int) -> tuple[int, ...]:
    """Shape of one sample of the tensor that enters layer ``cut``."""
    p = config.values
    if config.preset in TRANSFORMERS:
        if config.mtp_depth and cut == num_layers(config) - 1:  # the mtp layer's 1 + D hidden states
            return (p["seq_len"], (1 + config.mtp_depth) * p["hidden"])
        return (p["seq_len"],) if cut == 0 else (p["seq_len"], p["hidden"])
    return (p["input_size"] if cut == 0 else p["hidden"],)


def input_dtype(config: ModelConfig, cut: int) -> torch.dtype:
    """Dtype of the tensor that enters layer ``cut`` (token ids are ``long``)."""
    if config.preset in TRANSFORMERS and cut == 0:
        return torch.long
    return TORCH_DTYPES[config.values["dtype"]]


def synthetic_batch(
    config: ModelConfig, num_samples: int, *, step: int, seed: int = 0, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and labels of ``num_samples`` samples for training step ``step``.

    GPT, Llama: random token ids; the labels are the ids shifted by one (next-token
    prediction). MLP: normal features and uniform class labels.
    """
    generator = torch.Generator().manual_seed(seed * 1_000_003 + 7919 * (step + 1))
    p = config.values
    if config.preset in TRANSFORMERS:
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
        self.enter = None
        """Applied to the stage input first (tensor parallelism: gather the sequence)."""
        self.leave = None
        """Applied to the stage output last (tensor parallelism: keep this device's part)."""

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        modules = list(self.layers.values())
        body = modules[:-1] if self.is_last else modules
        if self.enter is not None:
            x = self.enter(x)
        for layer in body:
            x = layer(x, labels) if getattr(layer, "wants_labels", False) else layer(x)
        if self.is_last:
            return modules[-1](x, labels)
        return x if self.leave is None else self.leave(x)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The last stage's output before the loss (for ``torch.distributed.pipelining``)."""
        modules = list(self.layers.values())
        if self.enter is not None:
            x = self.enter(x)
        for layer in modules[:-1]:
            x = layer(x)
        return modules[-1].logits(x)


OPTIMIZER_CLASSES = {
    "sgd": (torch.optim.SGD, {}),
    "momentum": (torch.optim.SGD, {"momentum": 0.9}),
    "adam": (torch.optim.Adam, {}),
    "adamw": (torch.optim.AdamW, {}),
}
"""``ModelSpec.optimizer`` name -> (torch optimizer class, keyword arguments besides ``lr``)."""

OPTIMIZERS = {name: (lambda params, lr, c=c, kw=kw: c(params, lr=lr, **kw)) for name, (c, kw) in OPTIMIZER_CLASSES.items()}
"""``ModelSpec.optimizer`` name -> ``fn(params, lr)`` building the torch optimizer."""


def make_optimizer(name: str, params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """The model's optimizer (``sim.core.specs.OPTIMIZER_STATES`` names) over ``params``."""
    return OPTIMIZERS[name](params, lr)


def whole_model(config: ModelConfig, *, seed: int = 0, device: torch.device | str = "cpu") -> StageModule:
    """Every layer in one module: the single-process reference."""
    return StageModule(build_layers(config, seed=seed, device=device), is_last=True)


def describe(config: ModelConfig) -> dict[str, Any]:
    """Preset, parameters and bytes per element (for logs and summaries)."""
    return {"preset": config.preset, **config.values, "bytes_per_element": DTYPE_BYTES[config.values["dtype"]]}
