"""The 4D layout of a plan: how tensor, sequence, context and sharded data parallelism divide
a model (``Shard``), how data parallelism shards its states (``Sharding``, the ZeRO stages),
what the backward recomputes (``Recompute``), and the shape of a transformer block that the
memory (``sim.cost.memory``) and communication (``sim.cost.comm``) formulas read
(``BlockShape``).

"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from sim.core.errors import SpecError

__all__ = ["BlockShape", "Recompute", "Shard", "Sharding"]


class Sharding(str, Enum):
    """How data parallelism shards the model states over the d replicas (ZeRO stages)."""

    NONE = "none"
    """Every replica holds everything; gradients are all-reduced."""
    OPTIMIZER = "optimizer"
    """ZeRO-1 / Megatron's distributed optimizer: optimizer states sharded."""
    GRADIENTS = "gradients"
    """ZeRO-2: optimizer states and gradients sharded."""
    FULL = "full"
    """ZeRO-3 / FSDP: parameters sharded too, gathered per block before use."""


class Recompute(str, Enum):
    """What a block keeps from its forward for its backward."""

    NONE = "none"
    """Every activation the backward needs."""
    SELECTIVE = "selective"
    """All but the attention's s×s tensors, which the backward recomputes (Korthikanti et al. §5)."""
    SELECTIVE_OP = "selective-op"
    """torchtitan's op-level selective checkpointing of each transformer block: it keeps the block's
    input, the outputs of every other matrix product and of the fused attention, and runs every
    other operation of the block again in the backward (``sim.cost.kernels``' ``sac_`` tags)."""
    FULL = "full"
    """Only the block's input; the backward runs the forward again (Chen et al. 2016)."""

    def __bool__(self) -> bool:
        """Whether anything is recomputed (``none`` is false, as ``recompute: false`` reads)."""
        return self is not Recompute.NONE

    def to_json(self) -> bool | str:
        """What plan files write: ``false`` and ``true`` for none and full (as older files do), else the name."""
        return {Recompute.NONE: False, Recompute.FULL: True}.get(self, self.value)

    @classmethod
    def of(cls, value: "Recompute | bool | str") -> "Recompute":
        """A mode from what users and older plan files write: ``true``/``false`` mean full/none."""
        if isinstance(value, bool):
            return cls.FULL if value else cls.NONE
        return cls(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Shard:
    """How one device's share of a layer is cut out of the whole layer (Megatron-LM's layout)."""

    tensor: int = 1
    """t: devices of a tensor-parallel group; heads, the MLP width and the vocabulary split over them."""
    context: int = 1
    """c: devices of a context-parallel group; the sequence splits over them."""
    sequence_parallel: bool = False
    """Norms, dropouts and residuals run on s/t of the sequence (Korthikanti et al. §4.2.2)."""
    expert: int = 1
    """EP: devices of an expert-parallel group; an MoE block's routed experts split over them
    (``sim.core.experts``), count/EP on each."""
    expert_tensor: int = 1
    """ETP: devices that split each expert's MLP width (Megatron-Core's expert tensor parallelism)."""

    def __post_init__(self) -> None:
        for name, key in (("tensor", "tensor_parallel"), ("context", "context_parallel"),
                          ("expert", "expert_parallel"), ("expert_tensor", "expert_tensor_parallel")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(key, f"must be an integer >= 1, got {value!r}")

    @property
    def is_whole(self) -> bool:
        """No tensor or context parallelism: the device holds the whole layer (its experts aside:
        ``splits_experts``)."""
        return self.tensor == 1 and self.context == 1

    @property
    def splits_experts(self) -> bool:
        """Expert or expert-tensor parallelism: the device holds a share of each MoE block's experts."""
        return self.expert > 1 or self.expert_tensor > 1


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockShape:
    """One transformer block as the memory and communication formulas see it."""

    seq_len: int
    """s, tokens per sample."""
    hidden: int
    """h."""
    heads: int
    """a, attention (query) heads."""
    ffn_hidden: int
    """f, the MLP's inner width (4h in GPT)."""
    kv_heads: int | None = None
    """Key/value heads under grouped-query attention (Ainslie et al. 2023); None: as ``heads``."""
    element_bytes: int = 2
    """Bytes per activation element (2 for fp16/bf16)."""
    dropout: bool = True
    """Whether the block has dropouts (GPT, BERT) whose 1-byte masks are stashed; Llama has none."""
    gated: bool = False
    """A gated MLP (SwiGLU: Shazeer 2020): two input projections of width f."""
