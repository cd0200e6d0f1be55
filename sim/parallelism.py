"""Closed forms of the 4D model: what tensor, sequence, context and sharded data parallelism
divide and what they communicate, per device.

Notation as in Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", arXiv 2205.05198): s sequence length, b micro-batch size per replica,
h hidden size, a attention heads, t tensor-parallel degree, d data-parallel degree, c
context-parallel degree. Every function here is the one home of its formula; the cost model,
the compiler, the planner and the tests call it.

* ``block_activation_bytes`` — what one transformer block stashes per sample (Korthikanti et
  al., §4.1–4.3 and Table 2), written for any element width and MLP width, for grouped-query
  attention and gated MLPs;
* ``model_state_bytes`` — parameters, gradients and optimizer state per device under ZeRO
  sharding (Rajbhandari et al. 2020, "ZeRO", §5);
* ``tensor_parallel_collectives`` — the collectives Megatron-LM runs per block and micro-batch
  (Shoeybi et al. 2019, §3; with sequence parallelism Korthikanti et al. §4.2.2).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from sim.errors import SpecError

__all__ = [
    "BlockShape",
    "Shard",
    "Recompute",
    "Sharding",
    "StateBytes",
    "TensorParallelCollective",
    "block_activation_bytes",
    "model_state_bytes",
    "tensor_parallel_collectives",
]


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

    def __post_init__(self) -> None:
        for name in ("tensor", "context"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(f"{name}_parallel", f"must be an integer >= 1, got {value!r}")

    @property
    def is_whole(self) -> bool:
        """No tensor or context parallelism: the device holds the whole layer."""
        return self.tensor == 1 and self.context == 1


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


def block_activation_bytes(
    shape: BlockShape,
    *,
    tensor_parallel: int = 1,
    context_parallel: int = 1,
    sequence_parallel: bool = False,
    recompute: Recompute = Recompute.NONE,
) -> float:
    """Bytes one block stashes per sample on one device.

    Korthikanti et al. §4.1 count, per block, with e-byte elements (e = 2 gives their numbers)
    and m = 1 if there are dropouts, else 0:

    * attention: the QKV input e·sh; Q and K, e·(sh + s·h_kv); V, e·s·h_kv; the softmax output
      e·as² and its dropout mask m·as²; the output projection input e·sh; its dropout mask m·sh
      (h_kv = kv_heads·h/a: grouped-query attention shrinks K and V);
    * MLP: the first linear's input e·sh; the activation's input e·sf (a gated MLP: gate and
      up, 2e·sf); the second linear's input e·sf; its dropout mask m·sh;
    * two norms' inputs, 2e·sh.

    With e = 2, m = 1, f = 4h, h_kv = h this is sh(34 + 5as/h) (their Eq. 1). Tensor
    parallelism splits everything but the norms' inputs, the two linears' inputs and the two
    dropout masks over t, which leaves sh(10 + 24/t + 5as/(ht)) (§4.2.1); sequence parallelism
    splits those over t too, sh(34 + 5as/h)/t (§4.2.2); selective recompute drops the s×s terms,
    34sh/t (§5); full recompute keeps the block input, 2sh (2sh/t with sequence parallelism).
    Context parallelism splits the sequence over c (ring attention: Liu et al. 2023), so every
    term divides by c, the s×s terms included (each device holds s/c queries × s/c keys per
    step and keeps its own block).
    """
    s, h, a, f, e = shape.seq_len, shape.hidden, shape.heads, shape.ffn_hidden, shape.element_bytes
    t, c = tensor_parallel, context_parallel
    m = 1 if shape.dropout else 0
    h_kv = (shape.kv_heads or a) * h // a
    if recompute is Recompute.FULL:
        return e * s * h / (t if sequence_parallel else 1) / c
    replicated = 2 * e * s * h + 2 * m * s * h + 2 * e * s * h  # linear inputs, dropout masks, norm inputs
    split = e * (s * h + s * h_kv) + e * s * h_kv + e * s * h  # Q, K, V, output projection input
    split += (2 if shape.gated else 1) * e * s * f + e * s * f  # activation input(s), second linear input
    quadratic = (e + m) * a * s * s  # softmax output and its dropout mask (and the dropout's output: see below)
    quadratic += e * a * s * s if m else 0  # the dropout's output, attention over values' input
    if recompute is Recompute.SELECTIVE:
        quadratic = 0
    per_device = replicated / (t if sequence_parallel else 1) + split / t + quadratic / t
    return per_device / c


@dataclass(frozen=True, slots=True, kw_only=True)
class StateBytes:
    """Model states one device holds at rest."""

    parameters: float
    gradients: float
    optimizer: float
    """Optimizer state (with mixed precision, the fp32 master weights too)."""

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer


def model_state_bytes(param_bytes: float, *, optimizer_bytes_per_param_byte: float, data_parallel: int,
                      sharding: Sharding = Sharding.NONE, grad_bytes_per_param_byte: float = 1.0) -> StateBytes:
    """Parameters, gradients and optimizer state per device for ``param_bytes`` of parameters
    (already divided by tensor parallelism and the pipeline), over ``data_parallel`` replicas.

    ZeRO (Rajbhandari et al. 2020, §5.1, Figure 1): with 2-byte weights and Adam (12 bytes of
    state per parameter) a device holds 16Ψ unsharded, 4Ψ + 12Ψ/d with the optimizer state
    sharded (ZeRO-1), 2Ψ + 14Ψ/d with gradients too (ZeRO-2), 16Ψ/d with parameters too
    (ZeRO-3, FSDP). Gradients kept in fp32 for 16-bit weights (Megatron-LM's ``main_grad``,
    ``grad_bytes_per_param_byte`` 2) make it 18Ψ unsharded, Megatron-LM's count for "bf16
    param, fp32 grads" (its distributed-optimizer guide, ``docs/source/distrib_optimizer.md``).
    """
    d = data_parallel
    grads = param_bytes * grad_bytes_per_param_byte
    optimizer = param_bytes * optimizer_bytes_per_param_byte
    sharded = {Sharding.NONE: 0, Sharding.OPTIMIZER: 1, Sharding.GRADIENTS: 2, Sharding.FULL: 3}[sharding]
    return StateBytes(
        parameters=param_bytes / d if sharded >= 3 else param_bytes,
        gradients=grads / d if sharded >= 2 else grads,
        optimizer=optimizer / d if sharded >= 1 else optimizer,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorParallelCollective:
    """One collective over a tensor-parallel group, per block and sample."""

    kind: str
    """``all-reduce``, ``all-gather`` or ``reduce-scatter``."""
    phase: str
    """``forward``, ``backward`` or ``recompute`` (the forward a full recompute runs again)."""
    bytes: float
    """The full activation each rank contributes or receives: e·s·h per sample (all-gather and
    reduce-scatter: the gathered size; each rank holds 1/t of it)."""


def tensor_parallel_collectives(shape: BlockShape, *, tensor_parallel: int, sequence_parallel: bool = False,
                                recompute: Recompute = Recompute.NONE) -> tuple[TensorParallelCollective, ...]:
    """The collectives of one block for one sample over a tensor-parallel group (none if t = 1).

    Megatron-LM (Shoeybi et al. 2019, §3, Figure 3): operator g all-reduces the output of the
    attention's output projection and of the MLP's second linear in the forward (2 all-reduces),
    operator f all-reduces the input gradients of the QKV projection and the MLP's first linear
    in the backward (2 more). Sequence parallelism (Korthikanti et al. §4.2.2, Figure 5) turns
    each all-reduce into an all-gather before the column-parallel linear and a reduce-scatter
    after the row-parallel one (same bytes on the wire); the backward does the conjugates. A
    fully recomputed forward repeats the forward's collectives inside the backward.
    """
    if tensor_parallel <= 1:
        return ()
    nbytes = float(shape.element_bytes * shape.seq_len * shape.hidden)
    forward = ("all-gather", "reduce-scatter") * 2 if sequence_parallel else ("all-reduce",) * 2
    backward = ("all-gather", "reduce-scatter") * 2 if sequence_parallel else ("all-reduce",) * 2
    result = [TensorParallelCollective(kind=k, phase="forward", bytes=nbytes) for k in forward]
    if recompute is Recompute.FULL:
        result += [TensorParallelCollective(kind=k, phase="recompute", bytes=nbytes) for k in forward]
    result += [TensorParallelCollective(kind=k, phase="backward", bytes=nbytes) for k in backward]
    return tuple(result)
