"""Preset parameters: what each generator takes, which defaults it fills in, what it rejects.

Every generator of ``sim.models`` is called with keywords; ``PRESET_PARAMS`` lists them per
preset with their defaults (``REQUIRED`` for the shape parameters a user must give, ``None``
for a default computed from the others). ``resolve`` checks a call's keywords against that
table, one ``SpecError`` keyed by the parameter per mistake, and returns the complete set;
the built model keeps it (``ModelSpec.preset``), so the runtime builds exactly what was
simulated without reading the scenario again.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

from sim.core.errors import SpecError
from sim.core.specs import DTYPE_BYTES, OPTIMIZER_STATES
from sim.models.vocab import VOCAB_DIVISIBLE_BY

__all__ = ["REQUIRED", "PRESET_PARAMS", "describe", "names", "resolve"]


class _Required:
    """Marks a preset parameter without a default."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
"""The value ``PRESET_PARAMS`` gives to a parameter that the user must set."""


def _transformer_params(tied_embeddings: bool, *, dtype: str = "fp16", kv_heads: bool = False) -> Mapping[str, Any]:
    shape = {key: REQUIRED for key in ("layers", "hidden", "heads", "seq_len", "vocab")}
    extra = {"ffn_hidden": None, "tied_embeddings": tied_embeddings, "dtype": dtype, "optimizer": "adam",
             "vocab_divisible_by": VOCAB_DIVISIBLE_BY}  # last, so that the descriptions written before it keep their order
    return MappingProxyType(shape | ({"kv_heads": None} if kv_heads else {}) | extra)


PRESET_PARAMS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        "bert": _transformer_params(tied_embeddings=True),
        "gpt": _transformer_params(tied_embeddings=True),
        "llama": _transformer_params(tied_embeddings=False, dtype="bf16", kv_heads=True),
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

``None`` means a default computed from other parameters: ``ffn_hidden`` = 4 × ``hidden``
(Llama: 2/3 of that, rounded up to a multiple of 256), ``kv_heads`` = ``heads``,
``input_size`` = ``hidden``. ``tied_embeddings``: the output projection reuses the token
embedding matrix (GPT-2, BERT and Megatron-LM's GPT, whose ``--untie-embeddings-and-output-weights``
is off by default), so the head's layer does not count it. When the embedding and the head are
on different stages the head's stage keeps a second copy, and the two copies' gradients are
all-reduced before the optimizer step, as Megatron-LM's embedding group does
(``ModelSpec.tied_copy_bytes``, ``sim.cost.compute.stage_cost``). ``vocab_divisible_by``: the
embedding and the head are built for ``vocab`` padded to a multiple of it times the
tensor-parallel degree (``sim.models.vocab``; Megatron-LM's ``--make-vocab-size-divisible-by``).
"""

_BOOL_PARAMS = frozenset({"tied_embeddings", "batch_norm"})

_MAX_SIZE: Mapping[str, int] = MappingProxyType({
    "layers": 2**14,        # 16,384: 130 x the deepest published (126, Llama 3 405B); 100,000 replayed for 20 s
    "hidden": 2**20,        # 64 x the widest published model's 16,384 (Llama 3 405B), 18,432 (PaLM)
    "ffn_hidden": 2**22,    # 4 x that hidden, the usual expansion
    "heads": 2**16,         # heads of at least 16 of the widest hidden
    "kv_heads": 2**16,
    "seq_len": 2**24,       # 16M tokens, 16 x the longest context trained (1M)
    "vocab": 2**24,         # 64 x the largest vocabulary in use (256K)
    "input_size": 2**24,
    "num_classes": 2**24,
    "image_size": 2**16,    # 65,536 pixels a side, 290 x VGG's 224
})
"""Largest value of each shape parameter, with its reason: far beyond any model trained, and
small enough that the costs stay finite and a typo (``hidden: 1e9``, ``image_size: 3.2e8``) is
refused in one line instead of planned for minutes; ``docs/scenario.md`` lists them."""
_MAX_OTHER = 10**9
"""Largest value of a count not in ``_MAX_SIZE``."""


def names(table: Mapping[Any, Any]) -> str:
    return ", ".join(str(name) for name in sorted(table))


def resolve(preset: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """Check ``params`` against ``PRESET_PARAMS[preset]`` and fill in the defaults."""
    table = PRESET_PARAMS[preset]
    for key in sorted(params):
        if key not in table:
            raise SpecError(key, f"unknown parameter of preset {preset}; valid: {names(table)}")
    resolved = {}
    for key, default in table.items():
        value = params.get(key, default)
        if value is REQUIRED:
            raise SpecError(key, f"required by preset {preset}; give a value (valid parameters: {names(table)})")
        if not (value is None and default is None):  # None asks for a computed default
            _check_value(key, value)
        resolved[key] = value
    return resolved


def _check_value(key: str, value: Any) -> None:
    if key == "dtype":
        if not isinstance(value, str) or value not in DTYPE_BYTES:
            raise SpecError(key, f"unknown dtype {value!r}; valid: {names(DTYPE_BYTES)}")
    elif key == "optimizer":
        if not isinstance(value, str) or value not in OPTIMIZER_STATES:
            raise SpecError(key, f"unknown optimizer {value!r}; valid: {names(OPTIMIZER_STATES)}")
    elif key == "vocab_divisible_by":
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise SpecError(key, f"must be a positive integer, got {value!r}; write "
                                 f"{VOCAB_DIVISIBLE_BY} (Megatron-LM's --make-vocab-size-divisible-by) or 1 "
                                 "(pad only to a multiple of tensor_parallel)")
    elif key in _BOOL_PARAMS:
        if not isinstance(value, bool):
            raise SpecError(key, f"must be true or false, got {value!r}")
    elif isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SpecError(key, f"must be a positive integer, got {value!r}")
    elif value > _MAX_SIZE.get(key, _MAX_OTHER):
        limit = _MAX_SIZE.get(key, _MAX_OTHER)
        raise SpecError(key, f"{value} is beyond what this generator builds; use at most {limit:,} "
                             f"(the limit of {key}, far beyond any model trained)")


def describe(preset: str, resolved: Mapping[str, Any]) -> str:
    """``ModelSpec.source`` of a generated model: ``preset gpt (layers=4, hidden=64, ...)``."""
    return f"preset {preset} (" + ", ".join(f"{key}={value}" for key, value in resolved.items()) + ")"
