"""Memory in closed form: what one device keeps, by kind.

Notation as in Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", arXiv 2205.05198): s sequence length, b micro-batch size per replica,
h hidden size, a attention heads, t tensor-parallel degree, d data-parallel degree, c
context-parallel degree. Every function here is the one home of its formula; the cost model
(``sim.cost.compute.stage_cost``, which the engine's compiler calls), the planner's prefix-sum
tables (``planner.search.costs``), its memory check (``planner.search.memory``), ``dapple-sim
check`` and the tests call it. A device holds three kinds of bytes:

* model states at rest — ``model_state_bytes``: parameters, gradients and optimizer state per
  device under ZeRO sharding (Rajbhandari et al. 2020, "ZeRO", §5); ``stage_state_bytes``: a
  stage's, from its parameter bytes and the model's dtypes and optimizer (the one function
  every caller asks for a stage's memory at rest); ``sum_state_bytes``: a device's over the stages it holds;
  ``static_bytes``: a replica's, unsharded;
* activations — ``block_activation_bytes``: what one transformer block stashes per sample
  (Korthikanti et al., §4.1–4.3 and Table 2), for any element width and MLP width, for
  grouped-query attention and gated MLPs; ``layer_stash_bytes`` and ``checkpoint_bytes``: what
  a layer adds to a stage's stash by recompute mode, per sample (the terms the planner's
  prefix sums are built from); ``stage_activation_bytes``: a stage's slice of a micro-batch,
  summed from those terms, with what full recompute rebuilds at once;
* buffers — ``fsdp_gather_bytes``: the other devices' shards of a stage's parameters that
  FSDP gathers for the length of an action.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sim.core.model_spec import LayerSpec, ModelSpec
from sim.core.parallelism import BlockShape, Recompute, Sharding
from sim.cost.kernels import LSE_BYTES
from sim.schedule.ir import ActionKind

__all__ = ["ActivationBytes", "StateBytes", "block_activation_bytes", "checkpoint_bytes", "fsdp_gather_bytes",
           "layer_stash_bytes", "model_state_bytes", "stage_activation_bytes", "stage_state_bytes", "static_bytes",
           "sum_state_bytes", "WGRAD_STASH_FRACTION", "compute_memory"]


def block_activation_bytes(
    shape: BlockShape,
    *,
    tensor_parallel: int = 1,
    context_parallel: int = 1,
    sequence_parallel: bool = False,
    recompute: Recompute = Recompute.NONE,
    attention: str = "unfused",
) -> float:
    """Bytes one block stashes per sample on one device, its attention run ``attention``
    (``sim.core.specs.ATTENTION_KERNELS``).

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

    A fused attention (``flash``, ``sdpa``: FlashAttention-2, Dao 2023, §3.1) keeps no s×s tensor:
    not the softmax output, nor the dropout's output, nor its mask, which the backward
    regenerates from the random generator's state. What it saves for its backward is Q, K, V,
    its output O and the softmax's row log-sum-exp (``flash_attn``'s ``save_for_backward``, with
    the generator's state, 16 bytes a call, left out). Q, K, V and O are already in the count
    above (Q and K for QKᵀ, V for attention over values, O as the output projection's input), so
    it keeps the count without its s×s terms, 34sh/t with sequence parallelism, plus the
    log-sum-exp, ``LSE_BYTES``·as/t (one fp32 per query and head, split over t with the heads and
    over c with the queries). Selective recompute then has nothing to drop and keeps the same.
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
    if attention != "unfused":  # a fused kernel: its log-sum-exp instead of the s×s tensors
        quadratic = LSE_BYTES * a * s
    elif recompute is Recompute.SELECTIVE:
        quadratic = 0
    per_device = replicated / (t if sequence_parallel else 1) + split / t + quadratic / t
    return per_device / c


# -- model states at rest ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class StateBytes:
    """Model states one device holds at rest, bytes."""

    parameters: float
    """Parameter bytes (1/d of them under ``sharding: full``)."""
    gradients: float
    """Gradient bytes, in ``ModelSpec.grad_dtype`` (1/d of them under ``gradients`` and ``full``)."""
    optimizer: float
    """Optimizer state (with mixed precision, the fp32 master weights too), bytes (1/d of it
    under any sharding)."""

    @property
    def total(self) -> float:
        """Parameters + gradients + optimizer state, bytes, summed in that order."""
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


def stage_state_bytes(model: ModelSpec, param_bytes: float, *, data_parallel: int = 1,
                      sharding: Sharding = Sharding.NONE) -> StateBytes:
    """Memory at rest of one device of a stage holding ``param_bytes`` of ``model``'s parameters
    (its tensor-parallel share, a tied embedding's copy included: ``ModelSpec.stage_param_bytes``),
    over the ``data_parallel`` devices of its gradient group: ``model_state_bytes`` with the
    model's gradient width and optimizer state per parameter byte.

    The engine (through ``sim.cost.compute.stage_cost``), the planner's tables and ``dapple-sim
    check`` all call it, so a plan's memory at rest is the same number everywhere.
    """
    return model_state_bytes(param_bytes, optimizer_bytes_per_param_byte=model.optimizer_state_bytes_per_param_byte,
                             data_parallel=data_parallel, sharding=sharding,
                             grad_bytes_per_param_byte=model.grad_bytes_per_param_byte)


def sum_state_bytes(states: Iterable[StateBytes]) -> StateBytes:
    """The model states of a device that holds several stages (an interleaved schedule's
    chunks), each kind summed over them in stage order."""
    states = tuple(states)
    return StateBytes(parameters=sum((x.parameters for x in states), 0.0),
                      gradients=sum((x.gradients for x in states), 0.0),
                      optimizer=sum((x.optimizer for x in states), 0.0))


def static_bytes(model: ModelSpec, start: int, end: int) -> float:
    """Parameters + gradients + optimizer state of layers ``[start, end)`` on one replica, unsharded
    (a tied embedding's second copy included): ``stage_state_bytes(...).total``."""
    return stage_state_bytes(model, model.stage_param_bytes(start, end)).total


# -- activations by recompute mode ---------------------------------------------------------------

def layer_stash_bytes(layer: LayerSpec, recompute: Recompute) -> float:
    """Bytes per sample ``layer`` keeps from its forward until its backward: everything it saves
    (``stash_bytes``), or under selective recompute all but attention's s×s tensors
    (``selective_stash``, Korthikanti et al. 2022, §5). Under full recompute a stage keeps only
    ``checkpoint_bytes``; this is then what the backward rebuilds of the layer."""
    return layer.selective_stash if recompute is Recompute.SELECTIVE else layer.stash_bytes


def checkpoint_bytes(model: ModelSpec, k: int, *, first: bool) -> float:
    """Bytes per sample layer ``k`` adds to its stage's checkpoints under full recompute.

    A transformer block keeps its input (``LayerSpec.checkpoint_bytes``: 2sbh, 2sbh/t with
    sequence parallelism; Megatron-LM's ``--recompute-granularity full``, Korthikanti et al. 2022,
    Table 2); a run of other layers is one segment, checkpointed at the input of its first (the
    cut before it, ``ModelSpec.boundary_bytes``: Chen et al. 2016, "Training Deep Nets with
    Sublinear Memory Cost", §3), so a layer that is not a block adds that cut when it opens a
    run (``first`` of its stage, the model's first layer, or after a block) and nothing else.
    """
    layer = model.layers[k]
    if layer.checkpoint_bytes is not None:
        return layer.checkpoint_bytes
    opens = first or k == 0 or model.layers[k - 1].checkpoint_bytes is not None
    return model.boundary_bytes[k] if opens else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ActivationBytes:
    """What one slice of a micro-batch keeps on one device of a stage, bytes."""

    stash_bytes: float
    """Kept from the forward until the backward: every layer's stash (``layer_stash_bytes``), or
    under full recompute the checkpoints (``checkpoint_bytes``)."""
    rebuilt_bytes: float
    """Full recompute: what the backward rebuilds at once, the largest checkpointed segment's
    stash (a block alone, or a run of other layers); 0 under any other mode."""


def stage_activation_bytes(model: ModelSpec, start: int, end: int, samples: int,
                           recompute: Recompute) -> ActivationBytes:
    """Activations of layers ``[start, end)`` for a slice of ``samples`` samples under ``recompute``,
    summed layer by layer from ``layer_stash_bytes`` and ``checkpoint_bytes`` (the planner sums
    the same terms with prefix sums). Full recompute keeps each segment's checkpoint and rebuilds
    one segment at a time in the backward, so it holds the checkpoints plus the largest segment."""
    stash = checkpoints = rebuilt = segment = 0.0
    for k, layer in enumerate(model.layers[start:end], start=start):
        stash += layer_stash_bytes(layer, recompute) * samples
        checkpoints += checkpoint_bytes(model, k, first=k == start) * samples
        if layer.checkpoint_bytes is not None:  # a block is a segment of its own
            rebuilt, segment = max(rebuilt, segment, layer.stash_bytes * samples), 0.0
        else:  # a run of other layers grows one segment
            segment += layer.stash_bytes * samples
            rebuilt = max(rebuilt, segment)
    if recompute is Recompute.FULL:
        return ActivationBytes(stash_bytes=checkpoints, rebuilt_bytes=rebuilt)
    return ActivationBytes(stash_bytes=stash, rebuilt_bytes=0.0)


# -- buffers ---------------------------------------------------------------------------------------

def fsdp_gather_bytes(param_bytes: float, *, data_parallel: int, sharding: Sharding) -> float:
    """Bytes FSDP gathers around an action (``sharding: full``): the other d − 1 shards of the
    stage's ``param_bytes``, held while the action runs (ZeRO-3's parameter gathers, Rajbhandari et al. 2020,
    §5.3; FSDP2's ``fully_shard`` unshards before the computation and reshards after); 0 for any
    other sharding."""
    return param_bytes * (1 - 1 / data_parallel) if sharding is Sharding.FULL else 0.0


# -- what a compute action allocates and frees ---------------------------------------------

WGRAD_STASH_FRACTION = 0.5
"""Share of a stage's stash a split backward keeps from I until W: the layer inputs that the
weight gradients need (Qi et al., ICLR'24, §2, Table 1 counts W's memory as about half of B's)."""


def compute_memory(kind: ActionKind, cost, recompute: bool) -> tuple[float, float]:
    """(bytes a compute action allocates as it starts, bytes it frees as it ends) on one device:
    a forward keeps its stash; with full recompute the forward stashes its layers' inputs and
    the backward rebuilds one checkpointed segment at a time (``StageCost.rebuilt_bytes``: the
    largest segment's); a split backward frees ``1 − WGRAD_STASH_FRACTION`` of what it kept at
    I and the rest at W. The engine's ops and the planner's count before a replay
    (``planner.search.memory``) both read it."""
    kept = cost.rebuilt_bytes if recompute else cost.stash_bytes
    rebuilt = cost.rebuilt_bytes if recompute else 0.0
    extra = cost.stash_bytes if recompute else 0.0
    f = WGRAD_STASH_FRACTION
    if kind is ActionKind.F:
        return cost.stash_bytes, 0.0
    if kind is ActionKind.B:
        return rebuilt, kept + extra
    if kind is ActionKind.I:
        return rebuilt, (1 - f) * kept + extra
    return 0.0, f * kept  # W
