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
  every caller asks for a stage's memory at rest); ``sum_state_bytes``: a device's over the
  stages it holds; ``static_bytes``: a replica's, unsharded;
* activations — ``block_activation_bytes``: what one transformer block stashes per sample
  (Korthikanti et al., §4.1–4.3 and Table 2), any element and MLP width, grouped-query attention,
  gated MLPs; ``layer_stash_bytes``, ``checkpoint_bytes`` (``op_sac_stash_bytes`` under torchtitan's
  op-level checkpointing): a layer's per sample by recompute mode, the planner's prefix-sum terms;
  ``stage_activation_bytes``: a stage's slice of a micro-batch, with what a backward holds at once;
* buffers — ``stage_held_bytes``: what ZeRO-2/3 and FSDP hold unsharded while an action runs, one
  unit at a time, the next prefetched (``unit_peak_bytes``), or under DeepSpeed's cap (``sim.cost.zero3``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sim.core.model_spec import LayerSpec, ModelSpec
from sim.core.overlap import FsdpSpec
from sim.core.parallelism import BlockShape, Recompute, Sharding
from sim.core.specs import DTYPE_BYTES
from sim.cost.kernels import LSE_BYTES
from sim.cost.zero3 import capped_live_bytes, largest_tensor_bytes, live_cap_bytes

__all__ = ["ActivationBytes", "HeldBytes", "StateBytes", "accumulates_unsharded",
           "block_activation_bytes", "checkpoint_bytes", "fsdp_unit_param_bytes", "layer_stash_bytes",
           "model_state_bytes", "op_sac_stash_bytes", "stage_activation_bytes", "stage_held_bytes", "stage_state_bytes",
           "static_bytes", "sum_state_bytes", "unit_peak_bytes"]


def block_activation_bytes(shape: BlockShape, *, tensor_parallel: int = 1, context_parallel: int = 1,
                           sequence_parallel: bool = False, recompute: Recompute = Recompute.NONE,
                           attention: str = "unfused") -> float:
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
    """Gradient bytes, in ``ModelSpec.grad_dtype`` (1/d of them under ``gradients`` and ``full``,
    unless accumulated unsharded over the micro-batches)."""
    optimizer: float
    """Optimizer state (with mixed precision, the fp32 master weights too), bytes (1/d of it
    under any sharding)."""

    @property
    def total(self) -> float:
        """Parameters + gradients + optimizer state, bytes, summed in that order."""
        return self.parameters + self.gradients + self.optimizer


def model_state_bytes(param_bytes: float, *, optimizer_bytes_per_param_byte: float, data_parallel: int,
                      sharding: Sharding = Sharding.NONE, grad_bytes_per_param_byte: float = 1.0,
                      accumulate_unsharded: bool = False, master_bytes_per_param_byte: float = 0.0) -> StateBytes:
    """Parameters, gradients and optimizer state per device for ``param_bytes`` of parameters
    (already divided by tensor parallelism and the pipeline), over ``data_parallel`` replicas.

    ZeRO (Rajbhandari et al. 2020, §5.1, Figure 1): with 2-byte weights and Adam (12 bytes of
    state per parameter) a device holds 16Ψ unsharded, 4Ψ + 12Ψ/d with the optimizer state
    sharded (ZeRO-1), 2Ψ + 14Ψ/d with gradients too (ZeRO-2), 16Ψ/d with parameters too
    (ZeRO-3, FSDP). Gradients kept in fp32 for 16-bit weights (Megatron-LM's ``main_grad``,
    ``grad_bytes_per_param_byte`` 2) make it 18Ψ unsharded, Megatron-LM's count for "bf16
    param, fp32 grads" (its distributed-optimizer guide, ``docs/source/distrib_optimizer.md``).

    Over several micro-batches, ZeRO-2/3 and FSDP2 reduce-scatter each micro-batch's gradients
    and keep the shard (DeepSpeed's ``reduce_ready_partitions_and_remove_grads`` reduces every
    backward when gradients are partitioned, and only at the accumulation boundary under
    ZeRO-1, whose gradients stay full: ``deepspeed/runtime/zero/stage_1_and_2.py``). FSDP2's
    ``set_requires_gradient_sync(False)`` instead "avoids the communication but uses more
    gradient memory (storing the unsharded gradients)" until the last micro-batch (pytorch/pytorch
    PR #126166): ``accumulate_unsharded`` counts the full gradients then.

    ``master_bytes_per_param_byte`` > 0 (FSDP2 with fp32 shards, ``FsdpSpec.fp32_shards``; ZeRO-3
    only): the fp32 master copy is the sharded parameter itself, so it moves from the optimizer
    state to the parameters and the 16-bit shard is gone, and a gradient shard is fp32 like its
    parameter's (torch 2.13 ``foreach_reduce`` casts to ``orig_dtype``): 4 + 4 + 8 bytes over d.
    """
    d = data_parallel
    grads = param_bytes * grad_bytes_per_param_byte
    optimizer = param_bytes * optimizer_bytes_per_param_byte
    sharded = {Sharding.NONE: 0, Sharding.OPTIMIZER: 1, Sharding.GRADIENTS: 2, Sharding.FULL: 3}[sharding]
    if sharded == 3 and master_bytes_per_param_byte > 0:
        optimizer -= param_bytes * master_bytes_per_param_byte
        if not accumulate_unsharded:
            grads = param_bytes * max(grad_bytes_per_param_byte, master_bytes_per_param_byte)
        param_bytes *= master_bytes_per_param_byte
    return StateBytes(
        parameters=param_bytes / d if sharded >= 3 else param_bytes,
        gradients=grads / d if sharded >= 2 and not accumulate_unsharded else grads,
        optimizer=optimizer / d if sharded >= 1 else optimizer,
    )


def stage_state_bytes(model: ModelSpec, param_bytes: float, *, data_parallel: int = 1,
                      sharding: Sharding = Sharding.NONE, accumulate_unsharded: bool = False,
                      fp32_shards: bool = False) -> StateBytes:
    """Memory at rest of one device of a stage holding ``param_bytes`` of ``model``'s parameters
    (its tensor-parallel share, a tied embedding's copy included: ``ModelSpec.stage_param_bytes``),
    over the ``data_parallel`` devices of its gradient group: ``model_state_bytes`` with the
    model's gradient width and optimizer state per parameter byte (``accumulate_unsharded``:
    gradients kept whole over the micro-batches, ``accumulates_unsharded``; ``fp32_shards``: FSDP2's
    fp32 sharded parameters as the master weights, ``master_shard_factor``).

    The engine (through ``sim.cost.compute.stage_cost``), the planner's tables and ``dapple-sim
    check`` all call it, so a plan's memory at rest is the same number everywhere.
    """
    return model_state_bytes(param_bytes, optimizer_bytes_per_param_byte=model.optimizer_state_bytes_per_param_byte,
                             data_parallel=data_parallel, sharding=sharding,
                             grad_bytes_per_param_byte=model.grad_bytes_per_param_byte,
                             accumulate_unsharded=accumulate_unsharded,
                             master_bytes_per_param_byte=master_shard_factor(model.dtype) if fp32_shards else 0.0)


def master_shard_factor(dtype: str) -> float:
    """Bytes of an fp32 sharded parameter per byte of a ``dtype`` parameter (FSDP2's fp32 shards):
    4 / its width for 16-bit weights, 0 for fp32 ones (nothing moves: no master copy exists)."""
    width = DTYPE_BYTES[dtype]
    return 4.0 / width if width < 4 else 0.0


def accumulates_unsharded(sharding: Sharding, fsdp: FsdpSpec, num_microbatches: int) -> bool:
    """Whether a plan keeps its gradients unsharded from the first backward to the last: sharded
    gradients (``gradients``, ``full``) over several micro-batches with
    ``plan.fsdp.reduce_every_microbatch`` false (see ``model_state_bytes``)."""
    return (sharding in (Sharding.GRADIENTS, Sharding.FULL) and num_microbatches > 1
            and not fsdp.reduce_every_microbatch)


def sum_state_bytes(states: Iterable[StateBytes]) -> StateBytes:
    """The model states of a device that holds several stages (an interleaved schedule's
    chunks), each kind summed over them in stage order."""
    states = tuple(states)
    return StateBytes(**{kind: sum((getattr(x, kind) for x in states), 0.0)
                         for kind in ("parameters", "gradients", "optimizer")})


def static_bytes(model: ModelSpec, start: int, end: int) -> float:
    """Parameters + gradients + optimizer state of layers ``[start, end)`` on one replica, unsharded."""
    return stage_state_bytes(model, model.stage_param_bytes(start, end)).total


# -- activations by recompute mode ---------------------------------------------------------------

def layer_stash_bytes(layer: LayerSpec, recompute: Recompute) -> float:
    """Bytes per sample ``layer`` keeps from its forward until its backward: everything it saves
    (``stash_bytes``), or under selective recompute all but attention's s×s tensors
    (``selective_stash``, Korthikanti et al. 2022, §5), or under selective-op what op-level
    checkpointing saves of a block (``op_sac_stash_bytes``). Under full recompute a stage keeps
    only ``checkpoint_bytes``; this is then what the backward rebuilds of the layer."""
    if recompute is Recompute.SELECTIVE_OP and layer.checkpoint_bytes is not None:
        return op_sac_stash_bytes(layer)
    return layer.selective_stash if recompute is Recompute.SELECTIVE else layer.stash_bytes


def op_sac_stash_bytes(layer: LayerSpec) -> float:
    """Bytes per sample a transformer block keeps under torchtitan's op-level selective
    checkpointing (``recompute: selective-op``): the block's input, which the checkpoint wrapper
    holds (``checkpoint_bytes``), and the outputs its policy saves (``KernelSpec.sac_saved_bytes``;
    torchtitan 9dec370 ``parallelize_llama.py`` ``_save_list``, the policy in ``sim.cost.kernels``).

    For a Llama block (no biases, gated MLP) on one device of a t-way group with e-byte elements:
    the input e·sh, wq's output e·sh, wv's e·s·h_kv, the attention's output e·sh and log-sum-exp
    4as, w1's e·sf, w2's e·sh, all /t but w2's (a row-parallel partial sum), plus with sequence
    parallelism the two reduce-scatters' outputs 2e·sh/t and the input /t; with t = 1:
    e·s(4h + h_kv + f) + 4as, 63,616·s bytes for Llama 3.1 8B against 34sh = 139,264·s kept by
    selective. A block with biases (GPT, BERT) saves no product (``aten.addmm``): its input, the
    attention's output and log-sum-exp, e·2sh + 4as (/t, /c).
    """
    return layer.checkpoint_bytes + sum((k.sac_saved_bytes for k in layer.kernels), 0.0)


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
    """What the backward holds at once beyond the stash: under full recompute the largest
    checkpointed segment's stash (a block alone, or a run of other layers), under selective-op the
    largest block's stash less what it kept, and at least a layer's ``backward_workspace_bytes``."""


def stage_activation_bytes(model: ModelSpec, start: int, end: int, samples: int,
                           recompute: Recompute) -> ActivationBytes:
    """Activations of layers ``[start, end)`` for a slice of ``samples`` samples under ``recompute``,
    summed layer by layer from ``layer_stash_bytes`` and ``checkpoint_bytes`` (the planner sums
    the same terms with prefix sums). Full recompute keeps each segment's checkpoint and rebuilds
    one segment at a time in the backward, so it holds the checkpoints plus the largest segment.
    A layer's backward workspace (``LayerSpec.backward_workspace_bytes``) comes on top of what its
    backward rebuilt; the layers' backwards run one at a time, so the stage holds the largest. With
    ``model.recompute_blocks_only`` full recompute checkpoints the blocks alone: the other layers keep their stash."""
    stash = checkpoints = rebuilt = segment = workspace = blocks_kept = blocks_rebuilt = 0.0
    for k, layer in enumerate(model.layers[start:end], start=start):
        stash += layer_stash_bytes(layer, recompute) * samples
        checkpoints += checkpoint_bytes(model, k, first=k == start) * samples
        held = layer.backward_workspace_bytes * samples
        workspace = max(workspace, held)
        block = layer.checkpoint_bytes is not None
        blocks_kept += (layer.checkpoint_bytes if block else layer.stash_bytes) * samples
        blocks_rebuilt = max(blocks_rebuilt, layer.stash_bytes * samples + held if block else held)
        if block:  # a block is a segment of its own
            rebuilt, segment = max(rebuilt, segment, layer.stash_bytes * samples + held), 0.0
        else:  # a run of other layers grows one segment
            segment += layer.stash_bytes * samples
            rebuilt = max(rebuilt, segment + held)
    if recompute is Recompute.FULL:
        if model.recompute_blocks_only:
            return ActivationBytes(stash_bytes=blocks_kept, rebuilt_bytes=blocks_rebuilt)
        return ActivationBytes(stash_bytes=checkpoints, rebuilt_bytes=rebuilt)
    if recompute is Recompute.SELECTIVE_OP:  # a block's backward rebuilds the rest of its stash at once
        again = max((layer.stash_bytes - op_sac_stash_bytes(layer) for layer in model.layers[start:end]
                     if layer.checkpoint_bytes is not None), default=0.0)
        workspace = max(workspace, again * samples)
    return ActivationBytes(stash_bytes=stash, rebuilt_bytes=workspace)


# -- buffers: FSDP and ZeRO by unit ---------------------------------------------------------------

def fsdp_unit_param_bytes(model: ModelSpec, start: int, end: int, unit_layers: int = 1) -> tuple[float, ...]:
    """Parameter bytes of each FSDP unit of layers ``[start, end)`` on one device, in forward order.

    A unit is one ``fully_shard`` call: ``unit_layers`` consecutive transformer blocks (layers with
    ``checkpoint_bytes``), and every other layer a unit of its own, as torchtitan wraps Llama: the
    token embedding, each ``TransformerBlock``, then the final norm with the output projection
    (torchtitan ``torchtitan/models/llama3/infra/parallelize.py``, ``apply_fsdp``). A tied
    embedding's copy (``ModelSpec.tied_copy_bytes``) belongs to the unit of the layer that reads it:
    the head, or an untied model's ``mtp`` layer (``sim.models.mtp``; the runtime's
    ``runtime.model.sharding`` puts it there).
    """
    units: list[float] = []
    unit_of = {}  # layer index -> its unit
    run = 0  # blocks in the unit being filled
    for k, layer in enumerate(model.layers[start:end], start=start):
        if layer.checkpoint_bytes is not None and 0 < run < unit_layers:
            units[-1] += layer.param_bytes
            run += 1
        else:
            units.append(layer.param_bytes)
            run = 1 if layer.checkpoint_bytes is not None else unit_layers  # a non-block closes its unit
        unit_of[k] = len(units) - 1
    tied = model.tied_copy_bytes(start, end)
    if tied and units:
        units[unit_of[model.tied_layers[1]]] += tied
    return tuple(units)


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldBytes:
    """What a compute action holds beside the model states at rest while it runs, bytes."""

    forward_bytes: float = 0.0
    """A forward: the gathered (unsharded) parameters of the units live at once."""
    backward_bytes: float = 0.0
    """A backward: the gathered parameters live at once plus the unsharded gradient of the unit
    computing, before its reduce-scatter."""


def unit_peak_bytes(unit_param_bytes: tuple[float, ...], *, grad_bytes_per_param_byte: float,
                    gather_parameters: bool, reshard_after_forward: bool = True) -> HeldBytes:
    """The most a device holds beside its shards while FSDP/ZeRO runs a stage's units
    (``unit_param_bytes``, forward order: ``fsdp_unit_param_bytes``).

    ZeRO-3/FSDP (``gather_parameters``) all-gathers a unit's whole parameters p_i (the
    all-gather's output is the unsharded tensor; the shard stays in the model states) before
    it runs and frees them after. FSDP2 issues the next unit's all-gather while the current unit
    computes (implicit prefetching: torch docs, "FSDP Notes", "FSDP Prefetch Nuances"; the
    backward prefetches the unit before), so at most two units' parameters are live:
    forward max_i (p_i + p_(i+1)), backward max_i (p_i + p_(i−1) + g·p_i), where g·p_i is the
    unit's gradient, unsharded in the gradient dtype until its reduce-scatter (the
    "reduce-scatter input" of ``fully_shard``'s post-backward; Rajbhandari et al. 2020, §5.2–5.3).

    With ``reshard_after_forward`` false the unsharded parameters stay "in memory after
    forward", avoiding the all-gather in backward (``torch.distributed.fsdp.fully_shard``,
    ``reshard_after_forward``); FSDP keeps one unsharded copy per unit, not one per
    micro-batch (a later micro-batch's forward finds it gathered), freed by the unit's
    post-backward. So a forward ends with every unit gathered, Σp, and unit i's backward holds
    the units not yet run backward, max_i (p_0 + … + p_i + g·p_i).

    ZeRO-2 holds only the unit's gradient in its backward, max_i g·p_i (DeepSpeed reduces and frees each
    bucket as the backward fills it: ``stage_1_and_2.py``, ``reduce_ready_partitions_and_remove_grads``)."""
    p, g = unit_param_bytes, grad_bytes_per_param_byte
    if not p:
        return HeldBytes()
    if not gather_parameters:
        return HeldBytes(backward_bytes=max(g * x for x in p))
    if not reshard_after_forward:
        prefix = [sum(p[:i + 1]) for i in range(len(p))]
        return HeldBytes(forward_bytes=prefix[-1], backward_bytes=max(prefix[i] + g * p[i] for i in range(len(p))))
    forward = max(p[i] + (p[i + 1] if i + 1 < len(p) else 0.0) for i in range(len(p)))
    backward = max(p[i] + (p[i - 1] if i > 0 else 0.0) + g * p[i] for i in range(len(p)))
    return HeldBytes(forward_bytes=forward, backward_bytes=backward)


def stage_held_bytes(model: ModelSpec, start: int, end: int, *, data_parallel: int, sharding: Sharding,
                     fsdp: FsdpSpec = FsdpSpec(), num_microbatches: int = 1) -> HeldBytes:
    """What a compute action of layers ``[start, end)`` holds beside the model states on one
    device (``model``: its share of each layer), over ``data_parallel`` devices: ``unit_peak_bytes``
    of the stage's units under ``sharding: full`` (parameters) or ``gradients`` (gradients only);
    nothing unsharded, under ``optimizer`` (ZeRO-1 keeps full gradients at rest) or with one
    device (nothing is sharded). Gradients accumulated unsharded (``accumulates_unsharded``)
    are counted at rest, so a unit's gradient adds nothing then. The engine's ops
    (``Op.gather_bytes``), the planner's count (``planner.search.memory``) and ``dapple-sim
    check`` all read it."""
    if data_parallel <= 1 or sharding not in (Sharding.GRADIENTS, Sharding.FULL):
        return HeldBytes()
    g = 0.0 if accumulates_unsharded(sharding, fsdp, num_microbatches) else model.grad_bytes_per_param_byte
    held = unit_peak_bytes(fsdp_unit_param_bytes(model, start, end, fsdp.unit_layers), grad_bytes_per_param_byte=g,
                           gather_parameters=sharding is Sharding.FULL,
                           reshard_after_forward=fsdp.reshard_after_forward)
    if fsdp.max_live_parameters is None or sharding is not Sharding.FULL:
        return held
    forward, backward = capped_live_bytes(held.forward_bytes, held.backward_bytes, grad_bytes_per_param_byte=g,
                                          cap_bytes=live_cap_bytes(model, fsdp.max_live_parameters),
                                          largest_bytes=largest_tensor_bytes(model, start, end))  # DeepSpeed's cap
    return HeldBytes(forward_bytes=forward, backward_bytes=backward)
