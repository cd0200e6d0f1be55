"""The ``model:`` section: a measured profile or a built-in generator, never both.

A model is either measured (``profile:`` a profile file, ``sim.input.profiles``, with the
batch size it was measured at) or generated from a handful of shape parameters by one of
``sim.models``' presets::

    model: {profile: profiles/dapple-v100/bert-48-pbs-2.txt, profile_batch_size: 2}
    model: {preset: gpt, layers: 48, hidden: 1024, heads: 16, seq_len: 512, vocab: 30522}

A generated model keeps the generator's name and resolved parameters
(``ModelSpec.preset``), which is what the runtime builds as torch modules. ``name:``
renames either kind for display. A generated transformer (gpt, bert, llama) also says how its
attention runs, ``attention: flash | sdpa | cudnn | unfused`` (``sim.core.specs.ATTENTION_KERNELS``),
by default the device's ``default_attention``; a measured profile's times already include its
attention, so it takes no such key. ``kernels: fused | eager`` (``sim.cost.kernels.KERNEL_MODES``,
default ``fused``) says how a generated transformer's element-wise work runs (``eager``: Llama only).
``experts:`` (gpt, llama) makes some blocks mixtures of experts (``sim.core.experts.ExpertSpec``)::

    experts: {count: 8, top_k: 2, ffn_hidden: 14336, shared: 0, layers: every,
              capacity_factor: 1.25, imbalance: 1.1}   # or imbalance: {distribution: zipf, parameter: 1.0, seed: 0}

(``node_limit: 4``: DeepSeek-V3's node-limited routing, ``sim.cost.comm.node_limited_fraction``).
``mla:`` (gpt, llama) gives the blocks multi-head latent attention (``sim.core.mla.MlaSpec``), and
``gemm_dtype: fp8`` runs their weighted products in FP8 (``sim.models.precision``)::

    mla: {q_lora_rank: 1536, kv_lora_rank: 512, rope_head_dim: 64, nope_head_dim: 128, v_head_dim: 128}
    gemm_dtype: fp8
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sim.core.errors import DappleError, SpecError
from sim.core.experts import DISTRIBUTIONS, PERMUTE_MODES, ExpertSpec, ImbalanceDraw
from sim.core.mla import MlaSpec
from sim.core.model_spec import ModelSpec
from sim.core.specs import ATTENTION_KERNELS, DTYPE_BYTES, OPTIMIZER_IMPLEMENTATIONS, OPTIMIZER_STATES
from sim.core.userfiles import PROFILE_MAX_BYTES
from sim.cost.kernels import KERNEL_MODES
from sim.cost.optimizer import GRAD_ACCUMULATION_MODES, GRAD_PASSES
from sim.input.profiles import load_profile
from sim.input.strict import StrictReader, join_key, show_text
from sim.models import MODEL_PRESETS, PRESET_PARAMS, build_model
from sim.models.precision import GEMM_DTYPES

__all__ = ["ATTENTION_PRESETS", "read_experts", "read_model"]

_PROFILE_KEYS = {"profile", "profile_batch_size", "optimizer", "dtype", "name"}
ATTENTION_PRESETS = ("bert", "gpt", "llama")
"""Generators whose blocks have attention, and so take ``model.attention``."""


def read_model(reader: StrictReader, data: Any, *, default_implementation: str = "fused",
               default_attention: str = "unfused") -> ModelSpec:
    """The model of a scenario's ``model:`` mapping; an optimizer that names no implementation
    gets ``default_implementation`` (the scenario's: fused on a preset GPU, else for-loop), and a
    transformer that names no ``attention`` gets ``default_attention`` (the device's)."""
    data = reader.mapping(data, "model")
    if ("profile" in data) == ("preset" in data):
        raise reader.fail("model", "give either 'profile' (a measured profile file) or 'preset' (gpt, bert, vgg, mlp)")
    optimizer = _optimizer(reader, data.get("optimizer"), default_implementation)
    blocks_only = reader.boolean(data, "model", "recompute_blocks_only", False)
    data = {key: value for key, value in data.items() if key != "recompute_blocks_only"}
    # the name alone goes on to the model's reader; none (a mapping without one) is the model's default
    data = {**data, "optimizer": optimizer["name"]} if optimizer["name"] is not None \
        else {key: value for key, value in data.items() if key != "optimizer"}
    model = _profiled(reader, data) if "profile" in data else _generated(reader, data, default_attention)
    model = replace(model, optimizer_implementation=optimizer["implementation"], grad_dtype=optimizer["grad_dtype"],
                    moment_dtype=optimizer["moment_dtype"],
                    grad_accumulation=optimizer["grad_accumulation"], grad_passes=optimizer["grad_passes"],
                    recompute_blocks_only=blocks_only)
    return model if "name" not in data else replace(model, name=reader.string(data, "model", "name"))


def _optimizer(reader: StrictReader, value: Any, default_implementation: str) -> dict[str, Any]:
    """``optimizer: adam`` or ``optimizer: {name: adam, implementation: fused, grad_dtype: fp32,
    moment_dtype: bf16}``: the name (None: the model's default), the step's implementation, the
    gradients' dtype, the state tensors' dtype (None: fp32).

    A mapping may leave the name out (the model's default, adam; vgg's momentum), so that
    ``--set model.optimizer.implementation=fused`` works on a file that names no optimizer."""
    if value is None or isinstance(value, str):
        return {"name": value, "implementation": default_implementation, "grad_dtype": None, "moment_dtype": None,
                "grad_accumulation": "fused", "grad_passes": ()}
    data = reader.mapping(value, "model.optimizer")
    reader.keys(data, "model.optimizer", allowed={"name", "implementation", "grad_dtype", "moment_dtype",
                                                 "grad_accumulation", "grad_passes"})
    passes = data.get("grad_passes", [])
    if not isinstance(passes, list) or not all(isinstance(name, str) and name in GRAD_PASSES for name in passes):
        raise reader.fail("model.optimizer.grad_passes", f"got {passes!r}; give a list of {', '.join(GRAD_PASSES)}")
    if len(set(passes)) != len(passes):
        raise reader.fail("model.optimizer.grad_passes", f"got {passes!r}; name each pass at most once")
    return {
        "name": reader.string(data, "model.optimizer", "name", choices=OPTIMIZER_STATES) if "name" in data else None,
        "implementation": reader.string(data, "model.optimizer", "implementation", default_implementation,
                                        choices=set(OPTIMIZER_IMPLEMENTATIONS)),
        "grad_dtype": reader.string(data, "model.optimizer", "grad_dtype", choices=DTYPE_BYTES)
        if "grad_dtype" in data else None,
        "moment_dtype": reader.string(data, "model.optimizer", "moment_dtype", choices=DTYPE_BYTES)
        if "moment_dtype" in data else None,
        "grad_accumulation": reader.string(data, "model.optimizer", "grad_accumulation", "fused",
                                           choices=set(GRAD_ACCUMULATION_MODES)),
        "grad_passes": tuple(passes),
    }


def _profiled(reader: StrictReader, data: dict) -> ModelSpec:
    if "kernels" in data:
        raise reader.fail("model.kernels", "a measured profile's times already include its kernels; remove the key "
                                           "(it chooses the element-wise kernels of a generated llama)")
    if "attention" in data:
        raise reader.fail("model.attention", "a measured profile's times already include its attention kernel; "
                                             "remove the key (it chooses the kernel of a generated gpt, bert or llama)")
    reader.keys(data, "model", allowed=_PROFILE_KEYS, required={"profile", "profile_batch_size"})
    path = reader.path(data["profile"], "model.profile", data_fallback=True, max_bytes=PROFILE_MAX_BYTES)
    try:
        return load_profile(
            path,
            profile_batch_size=reader.integer(data, "model", "profile_batch_size"),
            dtype=reader.string(data, "model", "dtype", "fp32"),
            optimizer=reader.string(data, "model", "optimizer", "adam"),
        )
    except SpecError as exc:
        raise reader.fail(join_key("model", exc.key), exc.problem) from None
    except DappleError as exc:
        raise reader.fail("model.profile", str(exc)) from None


def _generated(reader: StrictReader, data: dict, default_attention: str) -> ModelSpec:
    preset = reader.string(data, "model", "preset", choices=MODEL_PRESETS)
    params = {k: v for k, v in data.items() if k not in ("preset", "name", "attention", "kernels", "experts", "mla",
                                                         "gemm_dtype", "mtp_depth", "fp8_activations")}
    if "experts" in data:
        if preset not in ("gpt", "llama"):
            raise reader.fail("model.experts", f"preset {preset} has no experts; remove the key (it applies to gpt, llama)")
        params["experts"] = read_experts(reader, data["experts"])
    for key in ("mla", "gemm_dtype", "mtp_depth", "fp8_activations"):
        if key in data and preset not in ("gpt", "llama"):
            raise reader.fail(f"model.{key}", f"preset {preset} has no such blocks; remove the key (it applies to gpt, llama)")
    if "mla" in data:
        params["mla"] = _read_mla(reader, data["mla"])
    if "gemm_dtype" in data:
        params["gemm_dtype"] = reader.string(data, "model", "gemm_dtype", choices=set(GEMM_DTYPES))
    if "mtp_depth" in data:  # DeepSeek-V3's multi-token prediction (sim.models.mtp)
        params["mtp_depth"] = reader.integer(data, "model", "mtp_depth", minimum=0, maximum=16)
    if "fp8_activations" in data:  # DeepSeek-V3's FP8-cached stash (sim.models.precision)
        params["fp8_activations"] = reader.boolean(data, "model", "fp8_activations", False)
    if "kernels" in data:
        if preset not in ATTENTION_PRESETS:
            raise reader.fail("model.kernels", f"preset {preset} has no transformer blocks; remove the key "
                                               f"(it applies to {', '.join(ATTENTION_PRESETS)})")
        params["kernels"] = reader.string(data, "model", "kernels", choices=set(KERNEL_MODES))
    if preset in ATTENTION_PRESETS:
        params["attention"] = reader.string(data, "model", "attention", default_attention,
                                            choices=set(ATTENTION_KERNELS))
    elif "attention" in data:
        raise reader.fail("model.attention", f"preset {preset} has no attention blocks; remove the key "
                                             f"(it applies to {', '.join(ATTENTION_PRESETS)})")
    reader.keys(params, "model", allowed=set(PRESET_PARAMS[preset]) | {"attention", "kernels", "experts", "mla",
                                                                        "gemm_dtype", "mtp_depth", "fp8_activations"})
    try:
        return build_model(preset, **params)
    except SpecError as exc:
        raise reader.fail(join_key("model", exc.key), exc.problem) from None
    except (TypeError, ValueError) as exc:
        raise reader.fail("model", f"cannot build preset {preset!r}: {show_text(str(exc), 300)}") from None


def read_experts(reader: StrictReader, value: Any) -> ExpertSpec:
    """``model.experts``: the MoE blocks' router and experts (``sim.core.experts.ExpertSpec``)."""
    key = "model.experts"
    data = reader.mapping(value, key)
    reader.keys(data, key, allowed={"count", "top_k", "ffn_hidden", "shared", "layers", "capacity_factor", "imbalance",
                                    "node_limit", "permute"},
                required={"count", "top_k", "ffn_hidden"})
    layers = data.get("layers", "every")
    if isinstance(layers, list):
        layers = tuple(layers)
    elif not isinstance(layers, str):
        raise reader.fail(f"{key}.layers", "must be every, every_other or a list of block indices, e.g. [1, 3, 5]")
    imbalance, draw = data.get("imbalance", 1.0), None
    if isinstance(imbalance, dict):
        sub = f"{key}.imbalance"
        reader.keys(imbalance, sub, allowed={"distribution", "parameter", "seed"}, required={"distribution", "parameter"})
        draw = reader.build(sub, ImbalanceDraw,
                            distribution=reader.string(imbalance, sub, "distribution", choices=set(DISTRIBUTIONS)),
                            parameter=reader.number(imbalance, sub, "parameter", low=0.0, high=1e3, low_open=True),
                            seed=reader.integer(imbalance, sub, "seed", 0, minimum=0))
        imbalance = 1.0
    count = reader.integer(data, key, "count", maximum=2**16)
    try:
        return ExpertSpec(count=count, top_k=reader.integer(data, key, "top_k", maximum=2**16),
                          ffn_hidden=reader.integer(data, key, "ffn_hidden", maximum=2**22),
                          shared=reader.integer(data, key, "shared", 0, minimum=0, maximum=2**10),
                          layers=layers, capacity_factor=data.get("capacity_factor"), imbalance=imbalance, draw=draw,
                          node_limit=reader.integer(data, key, "node_limit", maximum=2**16) if "node_limit" in data else None,
                          permute=reader.string(data, key, "permute", "fused", choices=set(PERMUTE_MODES)))
    except SpecError as exc:
        raise reader.fail(join_key("model", exc.key), exc.problem) from None


_MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "rope_head_dim", "nope_head_dim", "v_head_dim")


def _read_mla(reader: StrictReader, value: Any) -> MlaSpec:
    """``model.mla``: multi-head latent attention's widths (``sim.core.mla.MlaSpec``)."""
    key = "model.mla"
    data = reader.mapping(value, key)
    reader.keys(data, key, allowed=set(_MLA_KEYS), required=set(_MLA_KEYS))
    return reader.build(key, MlaSpec, **{name: reader.integer(data, key, name, maximum=2**20) for name in _MLA_KEYS})

