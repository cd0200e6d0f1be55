"""Vocabulary padding: the token table and the head hold a few rows no token uses.

A tokenizer's vocabulary rarely has a round size (GPT-2's has 50,257 tokens). Megatron-LM
does not refuse it: before building the model it pads the vocabulary with dummy tokens to the
smallest multiple of ``--make-vocab-size-divisible-by`` (default 128) times the tensor-parallel
size, so that every device of a tensor-parallel group holds an equal slice of the token table
and of the head, and the slices keep GPU-friendly shapes::

    padded = ceil(vocab / (d·t)) · d·t        # 50,257 -> 50,304 at t = 1, 51,200 at t = 8

(NVIDIA/Megatron-LM ``megatron/training/tokenizer/tokenizer.py`` ``_vocab_size_with_padding``,
moved in 2026 to ``megatron/core/tokenizers/utils/build_tokenizer.py`` ``vocab_size_with_padding``
and ``megatron/training/vocab_utils.py`` ``calculate_padded_vocab_size``; the flag and its
default in ``megatron/training/arguments.py``; microsoft/Megatron-DeepSpeed has the same
function in ``megatron/tokenizer/tokenizer.py`` and flag in ``megatron/arguments.py``.) The
padding applies at every t, t = 1 included, and the padded rows cost what real rows cost: the
embedding's and the head's parameters, the head's FLOPs and its fp32 logits all use ``padded``.

A generated transformer (gpt, bert, llama) takes the multiple as ``vocab_divisible_by``
(default 128, Megatron-LM's). ``vocab_divisible_by: 1`` pads only to a multiple of t, the
least padding that shards evenly: it models torchtitan, which does not pad (its ``train.py``
sets ``model_config.vocab_size = tokenizer.n_words``) and whose DTensor shards a vocabulary
that t does not divide unevenly; a multiple of t is the largest shard's size, the one that
sets a step's time and the peak memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.core.model_spec import ModelPreset, ModelSpec

__all__ = ["VOCAB_DIVISIBLE_BY", "VocabPadding", "padded_vocab", "padded_vocab_size", "vocab_padding"]

VOCAB_DIVISIBLE_BY = 128
"""Megatron-LM's ``--make-vocab-size-divisible-by`` default (``megatron/training/arguments.py``)."""

_FLAG = "Megatron-LM --make-vocab-size-divisible-by"


def padded_vocab_size(vocab: int, divisible_by: int, tensor_parallel: int) -> int:
    """The smallest multiple of ``divisible_by · tensor_parallel`` that is at least ``vocab``
    (Megatron-LM ``_vocab_size_with_padding``: ``ceil(vocab / multiple) * multiple``)."""
    multiple = divisible_by * tensor_parallel
    return -(-vocab // multiple) * multiple


@dataclass(frozen=True, slots=True, kw_only=True)
class VocabPadding:
    """A generated transformer's vocabulary and what it is padded to."""

    vocab: int
    """The tokenizer's vocabulary, as the scenario writes it, tokens."""
    divisible_by: int
    """``vocab_divisible_by``: the padded size is a multiple of it times the tensor-parallel degree."""
    tensor_parallel: int
    """The tensor-parallel degree t the padding is shown for."""
    padded: int
    """The padded vocabulary on one device without tensor parallelism (t = 1), tokens."""
    padded_at_tensor: int
    """The padded vocabulary at ``tensor_parallel`` (the whole table; a device holds 1/t of it), tokens."""

    @property
    def is_padded(self) -> bool:
        """Whether any padding is added at t = 1 or at ``tensor_parallel``."""
        return self.padded_at_tensor != self.vocab or self.padded != self.vocab

    def text(self) -> str:
        """One line for people: ``vocabulary 50,257 padded to 50,304 (a multiple of 128; 51,200 at
        tensor parallel 8; Megatron-LM --make-vocab-size-divisible-by)``; empty when nothing is padded."""
        if not self.is_padded:
            return ""
        d, t = self.divisible_by, self.tensor_parallel
        if self.padded != self.vocab:
            at_t = f"; {self.padded_at_tensor:,} at tensor parallel {t}" if self.padded_at_tensor != self.padded \
                else ""
            return f"vocabulary {self.vocab:,} padded to {self.padded:,} (a multiple of {d}{at_t}; {_FLAG})"
        return (f"vocabulary {self.vocab:,} padded to {self.padded_at_tensor:,} at tensor parallel {t} "
                f"(a multiple of {d} x {t}; {_FLAG})")

    def to_json(self) -> dict[str, Any]:
        return {"vocab": self.vocab, "divisible_by": self.divisible_by, "padded": self.padded,
                "tensor_parallel": self.tensor_parallel, "padded_at_tensor_parallel": self.padded_at_tensor}


def _preset(model: ModelSpec | ModelPreset) -> ModelPreset | None:
    return model.preset if isinstance(model, ModelSpec) else model


def vocab_padding(model: ModelSpec | ModelPreset, tensor_parallel: int = 1) -> VocabPadding | None:
    """The padding of ``model``'s vocabulary at t = 1 and at ``tensor_parallel``; None for a model
    without a vocabulary (a measured profile, mlp, vgg)."""
    preset = _preset(model)
    values = preset.values if preset is not None else {}
    if "vocab" not in values:
        return None
    vocab, d = values["vocab"], values.get("vocab_divisible_by", 1)
    return VocabPadding(vocab=vocab, divisible_by=d, tensor_parallel=tensor_parallel,
                        padded=padded_vocab_size(vocab, d, 1),
                        padded_at_tensor=padded_vocab_size(vocab, d, tensor_parallel))


def padded_vocab(model: ModelSpec | ModelPreset, tensor_parallel: int) -> int | None:
    """The vocabulary ``model``'s embedding and head are built with at ``tensor_parallel`` (the whole
    table; each device holds 1/t of it); None for a model without a vocabulary."""
    padding = vocab_padding(model, tensor_parallel)
    return None if padding is None else padding.padded_at_tensor
