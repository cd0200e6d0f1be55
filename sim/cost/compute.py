"""Cost model: how long a stage's forward and backward take, and what it keeps in memory.

A model's layers carry per-sample numbers (see ``sim.core.model_spec.LayerSpec``). This module turns
them into what one replica of a stage spends on its slice of one micro-batch, and is the one
home of a stage's compute time (the engine's compiler and the planner's prefix-sum tables,
``planner.search.costs``, both build on the functions below):

* time per layer (``layer_times_s``): a measured layer scales linearly with the samples it
  processes, as in DAPPLE's planner (Fan et al., PPoPP'21, §4.1); a generated layer is the sum
  of its kernels (``sim.cost.kernels``), each the largest of its FLOPs over the size-dependent
  matrix rate, its bytes over the memory bandwidth and the host's time to issue it; a layer
  with FLOPs but no kernels costs ``FLOPs / (device peak for the dtype × device efficiency)``; a
  kernel marked ``fp8`` (``sim.models.precision``) runs its products at the device's FP8 peak;
* a fused attention kernel (``fused_attention_s``: ``flash``, ``sdpa``) at the rate FlashAttention
  is measured to reach on the device, its backward recomputing the scores;
* what recompute adds to the backward (``recompute_extra_s``): the forward again under
  ``full``, attention's core (``attention_core_s``) under ``selective`` (Korthikanti et al.
  2022, §5), which a fused attention does not have: it keeps no s×s tensor to drop, so
  selective recompute adds nothing to its backward; under ``selective-op`` (torchtitan's op-level
  checkpointing) every kernel of a block it does not save (``op_recompute_s``);
* a framework's fixed cost around each forward and backward of a stage on a micro-batch
  (``action_overhead_s``, ``DeviceSpec.action_overhead_s``);
* under ``grad_accumulation: separate``, the add of each micro-batch's weight gradients into
  their sum, in the backward (``sim.cost.optimizer.accumulation_s``);
* the optimizer step of the scenario's implementation (fused, foreach or for-loop:
  ``sim.cost.optimizer``) over the device's share of the parameters
  (``stage_optimizer_step_s``: 1/d of them when ZeRO shards the states); a tied embedding
  split over two stages keeps a copy on the head's and all-reduces its gradient between them
  (``sim.cost.comm.tied_allreduce_s``).

``stage_cost`` sums them for a stage and adds what it keeps in memory, from ``sim.cost.memory``
(the one home of memory): its model states at rest (``stage_state_bytes``) and its
activations by recompute mode (``stage_activation_bytes``). How a micro-batch splits over a
stage's replicas is ``sim.cost.split``'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.model_spec import ModelSpec
from sim.core.parallelism import Recompute, Sharding
from sim.core.specs import DTYPE_BYTES, FP8, DeviceSpec, LinkSpec
from sim.cost.comm import tied_allreduce_s
from sim.cost.experts import moe_state_bytes, stepped_param_bytes
from sim.cost.kernels import ATTENTION_CORE, FUSED_BACKWARD_FLOP_RATIO, KernelSpec
from sim.cost.memory import StateBytes, master_shard_factor, stage_activation_bytes
from sim.cost.optimizer import BUFFER_PASSES, accumulation_s, buffer_passes_s, optimizer_step_s

__all__ = ["StageCost", "StageTime", "action_overhead_s", "all_to_all_share", "attention_core_s", "fused_attention_s", "kernel_forward_s",
           "kernel_time_s", "layer_times_s", "op_recompute_s", "optimizer_step_s", "overlapped_pair_s", "recompute_extra_s",
           "stage_cost", "stage_optimizer_step_s", "stage_time_s", "tied_copy_tensors"]


def overlapped_pair_s(forward_s: float, backward_s: float, efficiency: float) -> float:
    """Seconds an overlapped forward-backward pair (``OverlapFB``) holds its device.

    DualPipe runs the forward of one micro-batch beside the backward of another so that one
    hides under the other (DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024, §3.2.1); how
    much it hides is the scenario's ``plan.schedule.overlap_efficiency`` e in [0, 1]:
    F + B − e·min(F, B). With e = 0 the two share the device (F + B); with e = 1 the shorter
    hides fully (max(F, B)).
    """
    return forward_s + backward_s - efficiency * min(forward_s, backward_s)


def kernel_time_s(flop: float, nbytes: float, device: DeviceSpec, dtype: str,
                  dims: tuple[float, float, float] | None = None, *, efficiency: float | None = None) -> float:
    """One kernel call of ``flop`` FLOPs on an (M, N, K) product moving ``nbytes`` bytes.

    Its device time is ``sim.cost.kernels``' roofline with the dimension-dependent matrix
    efficiency. The host issues kernels asynchronously, at best one per ``kernel_issue_s``
    (the framework's and the driver's work per launch, about 5 to 25 µs per PyTorch operator),
    so the device runs ahead of it only while kernels last longer than that: a kernel takes
    ``max(device time, kernel_issue_s)``, not their sum, and a layer of tiny kernels costs its
    kernel count times the issue time whatever its size. ``kernel_overhead_s`` is device time
    each kernel adds beyond its work: on a GPU the idle gap before the next kernel of the stream
    starts, on a CPU the dispatcher's work in the kernel's own thread; a kernel takes
    ``max(device time + kernel_overhead_s, kernel_issue_s)`` (the host's issue hides the gap
    when it is the slower of the two).
    ``efficiency`` replaces the matrix efficiency (and its size dependence) with a measured rate.
    """
    compute = 0.0
    if flop > 0 and efficiency is not None:
        compute = flop / (device.peak_flop_per_s_for(dtype) * efficiency)
    elif flop > 0:
        efficiency = device.matrix_efficiency_for(dtype)
        half = device.matmul_half_dim
        if dims is not None and half > 0:
            for size in dims:  # output tiles span M and N; each tile's prologue and epilogue, K's mainloop
                efficiency /= 1.0 + half / size
        compute = flop / (device.peak_flop_per_s_for(dtype) * efficiency)
    memory = nbytes / (device.memory_bandwidth_bytes_per_s * device.memory_efficiency)
    return max(max(compute, memory) + device.kernel_overhead_s, device.kernel_issue_s)


def fused_attention_s(kernel: KernelSpec, device: DeviceSpec, dtype: str, samples: int) -> tuple[float, float]:
    """(forward, backward) seconds of a fused attention kernel (``sim.cost.kernels.fused_attention``)
    on ``samples`` samples: a roofline at the rate FlashAttention reaches on this device
    (``DeviceSpec.attention_efficiencies``, measured on its own FLOPs, so without the matrix
    products' size dependence); the backward does ``FUSED_BACKWARD_FLOP_RATIO`` times the forward's
    FLOPs (it recomputes the scores) and moves ``bwd_bytes``."""
    forward, backward = device.attention_efficiencies(kernel.fused_attention)
    flop = kernel.flop * samples
    bwd_bytes = (2 * kernel.bytes if kernel.bwd_bytes is None else kernel.bwd_bytes) * samples
    return (kernel_time_s(flop, kernel.bytes * samples, device, dtype, efficiency=forward),
            kernel_time_s(FUSED_BACKWARD_FLOP_RATIO * flop, bwd_bytes, device, dtype, efficiency=backward))


def layer_times_s(layer, device: DeviceSpec, dtype: str, samples: int) -> tuple[float, float, float]:
    """(forward, backward, weight-gradient part of the backward) seconds of ``layer`` on ``samples``."""
    if samples == 0:
        return 0.0, 0.0, 0.0
    if layer.is_measured:
        bwd = layer.bwd_s * samples
        return layer.fwd_s * samples, bwd, bwd * layer.wgrad_fraction
    if not layer.kernels:
        rate = device.peak_flop_per_s_for(dtype) * device.efficiency
        bwd = layer.bwd_flop * samples / rate
        return layer.fwd_flop * samples / rate, bwd, bwd * layer.wgrad_fraction
    fwd = bwd = wgrad = 0.0
    for k in layer.kernels:
        if k.fused_attention:  # no weights: all of its backward is input gradient
            forward, backward = fused_attention_s(k, device, dtype, samples)
            fwd, bwd = fwd + forward, bwd + backward
            continue
        flop, nbytes = k.flop * samples, k.bytes * samples + k.fixed_bytes
        m, n, inner = k.rows * samples, k.cols, k.inner
        forward = kernel_forward_s(k, device, dtype, samples)
        fwd += forward
        if k.recomputed:  # its output was not stashed: the backward runs it again first (input gradient)
            bwd += forward
        if k.flop > 0:  # two products back: the input gradient (M × K out), the weight (or second
            # input) gradient (K × N out), each with the forward's FLOPs and bytes, in the forward's
            # precision (DeepSeek-V3 §3.3.1: Fprop, Dgrad and Wgrad all in FP8)
            dtype_k = FP8 if k.fp8 else dtype
            weight_grad = kernel_time_s(flop, nbytes, device, dtype_k, (inner, n, m))
            bwd += kernel_time_s(flop, nbytes, device, dtype_k, (m, inner, n)) + weight_grad
            wgrad += weight_grad if k.weights else 0.0
        elif k.backward:  # an element-wise backward reads the gradient and what it saved, writes one
            moved = 2 * k.bytes if k.bwd_bytes is None else k.bwd_bytes
            back = kernel_time_s(0.0, moved * samples + 2 * k.fixed_bytes, device, dtype)
            bwd += back
            wgrad += back if k.weights else 0.0
    return fwd, bwd, wgrad


def kernel_forward_s(kernel: KernelSpec, device: DeviceSpec, dtype: str, samples: int) -> float:
    """Forward seconds of one kernel on ``samples`` samples (``kernel_time_s`` on its product's
    dimensions, or ``fused_attention_s``'s forward for a fused attention)."""
    if kernel.fused_attention:
        return fused_attention_s(kernel, device, dtype, samples)[0]
    dims = (kernel.rows * samples, kernel.cols, kernel.inner) if kernel.flop > 0 else None
    return kernel_time_s(kernel.flop * samples, kernel.bytes * samples + kernel.fixed_bytes, device,
                         FP8 if kernel.fp8 else dtype, dims)


def op_recompute_s(layer, device: DeviceSpec, dtype: str, samples: int) -> float:
    """Forward seconds of what op-level selective checkpointing (``recompute: selective-op``, torchtitan's
    ``selective_ac_option = 'op'``) runs again in a transformer block's backward: every kernel it
    does not save, and the unsaved parts of those it does (``KernelSpec.sac_recompute``; the policy
    in ``sim.cost.kernels``' docstring). torchtitan checkpoints only the blocks, so 0 for any other
    layer (``LayerSpec.checkpoint_bytes`` None) and without samples."""
    if layer.checkpoint_bytes is None or not samples:
        return 0.0
    again = [part for k in layer.kernels for part in ((k,) if k.sac_recompute is None else k.sac_recompute)]
    return sum((kernel_forward_s(k, device, dtype, samples) for k in again), 0.0)


def attention_core_s(layer, device: DeviceSpec, dtype: str, samples: int) -> float:
    """Forward time of a layer's attention core (scores, softmax, its dropout, attention over values), which
    selective recompute runs again in the backward; 0 for a layer without one, and for a fused
    attention (``flash``, ``sdpa``), which keeps no s×s tensor for selective recompute to drop
    (Megatron-LM's selective recompute exists for those tensors, Korthikanti et al. 2022, §5)."""
    total = 0.0
    for k in layer.kernels:
        if k.name in ATTENTION_CORE and samples:
            dims = (k.rows * samples, k.cols, k.inner) if k.flop > 0 else None
            total += kernel_time_s(k.flop * samples, k.bytes * samples + k.fixed_bytes, device, dtype, dims)
    return total


def recompute_extra_s(recompute: Recompute, fwd_s: float, again_s: float) -> float:
    """Seconds recompute adds to a stage's backward, given its forward ``fwd_s`` and ``again_s``,
    what a selective mode runs again summed over its layers: the whole forward under full
    recompute (Chen et al. 2016, §3; Korthikanti et al. 2022, Table 2); under selective recompute
    the score, softmax and value products (``attention_core_s``; Korthikanti et al. 2022, §5);
    under selective-op the kernels op-level checkpointing does not save (``op_recompute_s``;
    torchtitan's ``parallelize_llama.py``); nothing without recompute."""
    if recompute is Recompute.FULL:
        return fwd_s
    return again_s if recompute in (Recompute.SELECTIVE, Recompute.SELECTIVE_OP) else 0.0


def all_to_all_share(model: ModelSpec, device: DeviceSpec, start: int, end: int, samples: int) -> tuple[float, float]:
    """(forward, backward) share of layers ``[start, end)``'s compute (``stage_time_s``) spent in
    the layers with an expert all-to-all (``LayerSpec.a2a_bytes`` > 0, the MoE blocks), beside
    which DualPipe's communication SMs are held (``sim.cost.overlap.held_sms_s``); (0, 0) for none."""
    time = stage_time_s(model, device, start, end, samples, Recompute.NONE)
    fwd = bwd = 0.0
    for layer in model.layers[start:end]:
        if layer.a2a_bytes > 0:
            layer_fwd, layer_bwd, _ = layer_times_s(layer, device, model.dtype, samples)
            fwd, bwd = fwd + layer_fwd, bwd + layer_bwd
    return (fwd / time.fwd_s if time.fwd_s > 0 else 0.0), (bwd / time.bwd_s if time.bwd_s > 0 else 0.0)


def action_overhead_s(device: DeviceSpec, samples: int, num_layers: int) -> float:
    """The framework's fixed cost around one forward or one backward action of a stage
    (``DeviceSpec.action_overhead_s``), paid by an action with work to do; a recomputed forward
    runs inside its backward's action and pays none of its own."""
    return device.action_overhead_s if samples and num_layers > 0 else 0.0


def tied_copy_tensors(model: ModelSpec, start: int, end: int) -> int:
    """Parameter tensors a tied embedding's copy adds to the optimizer step of layers
    ``[start, end)``: one on the head's stage when the embedding is elsewhere
    (``ModelSpec.tied_copy_bytes``), else none."""
    return 1 if model.tied_copy_bytes(start, end) > 0 else 0


def _accumulation_s(model: ModelSpec, device: DeviceSpec, params: float, tensors: int, *, data_parallel: int,
                    sharding: Sharding, accumulate_unsharded: bool, num_microbatches: int) -> float:
    """Each backward's share of summing the micro-batches' weight gradients (``separate`` only): over
    the stage's gradients, or the device's 1/d shard when ZeRO-2/3 reduce-scatters every micro-batch."""
    if model.grad_accumulation != "separate":
        return 0.0
    sharded = sharding in (Sharding.GRADIENTS, Sharding.FULL) and not accumulate_unsharded
    summed = params / data_parallel if sharded else params
    return accumulation_s(device, summed, model.dtype, model.grad_dtype, tensors=tensors,
                          num_microbatches=num_microbatches)


def stage_optimizer_step_s(model: ModelSpec, device: DeviceSpec, param_bytes: float, tensors: int, *,
                           data_parallel: int = 1, sharding: Sharding = Sharding.NONE,
                           fp32_shards: bool = False, buffer_bytes: float | None = None) -> float:
    """One device's optimizer step over a stage's ``param_bytes`` in ``tensors`` tensors
    (``sim.cost.optimizer.optimizer_step_s`` with the model's optimizer, dtype and implementation).

    With the optimizer state sharded (any ``sharding`` but ``none``), each of the ``data_parallel``
    devices of the gradient group updates only its 1/d partition (Rajbhandari et al. 2020, §5.1);
    the launches stay those of every tensor, as each device steps its slice of each. With FSDP2's
    fp32 shards (``fp32_shards`` under ``full``) the step runs on fp32 weights: no master copy
    written back into 16-bit ones. The model's ``grad_passes`` run over the gradients of the same
    share (``sim.cost.optimizer.grad_pass_kernels``); under ZeRO-1 the ``BUFFER_PASSES`` run over the
    whole unsharded buffer of ``buffer_bytes`` (the device's parameters; None: ``param_bytes``).
    """
    stepped = param_bytes if sharding is Sharding.NONE else param_bytes / data_parallel
    factor = master_shard_factor(model.dtype) if fp32_shards and sharding is Sharding.FULL else 0.0
    if factor:
        return optimizer_step_s(device, model.optimizer, "fp32", stepped * factor, tensors,
                                implementation=model.optimizer_implementation, grad_dtype="fp32",
                                grad_passes=model.grad_passes)
    passes, buffer_s = model.grad_passes, 0.0
    if sharding is Sharding.OPTIMIZER:  # Megatron-Core's distributed optimizer: the DDP buffer stays whole
        buffer_s = buffer_passes_s(device, passes, (param_bytes if buffer_bytes is None else buffer_bytes)
                                   / DTYPE_BYTES[model.dtype], DTYPE_BYTES[model.grad_dtype or model.dtype])
        passes = tuple(p for p in passes if p not in BUFFER_PASSES)
    return buffer_s + optimizer_step_s(device, model.optimizer, model.dtype, stepped, tensors,
                                       implementation=model.optimizer_implementation, grad_dtype=model.grad_dtype,
                                       grad_passes=passes)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageTime:
    """Compute seconds of one replica's slice of a micro-batch on a stage's layers."""

    fwd_s: float
    """The forward action, its overhead included, seconds."""
    bwd_s: float
    """The backward action (input and weight gradients, what recompute adds, the overhead), seconds."""
    wgrad_s: float
    """Part of the layers' backward that computes weight gradients (the W of zero-bubble schedules), seconds."""


def stage_time_s(model: ModelSpec, device: DeviceSpec, start: int, end: int, samples: int,
                 recompute: Recompute) -> StageTime:
    """Forward and backward seconds of layers ``[start, end)`` on ``samples`` samples: the layers'
    times (``layer_times_s``) summed in order, what ``recompute`` adds to the backward
    (``recompute_extra_s``) and each action's overhead (``action_overhead_s``). The planner's
    tables sum the same per-layer terms with prefix sums."""
    fwd_s = bwd_s = wgrad_s = again_s = blocks_s = 0.0
    for layer in model.layers[start:end]:
        layer_fwd, layer_bwd, layer_wgrad = layer_times_s(layer, device, model.dtype, samples)
        fwd_s += layer_fwd
        bwd_s += layer_bwd
        wgrad_s += layer_wgrad
        blocks_s += layer_fwd if layer.checkpoint_bytes is not None else 0.0
        if recompute is Recompute.SELECTIVE:
            again_s += attention_core_s(layer, device, model.dtype, samples)
        elif recompute is Recompute.SELECTIVE_OP:
            again_s += op_recompute_s(layer, device, model.dtype, samples)
    # full recompute runs the stage's forward again, or only its blocks' (model.recompute_blocks_only)
    bwd_s += recompute_extra_s(recompute, blocks_s if model.recompute_blocks_only else fwd_s, again_s)
    overhead = action_overhead_s(device, samples, end - start)
    return StageTime(fwd_s=fwd_s + overhead, bwd_s=bwd_s + overhead, wgrad_s=wgrad_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageCost:
    """One replica's work on one slice of a micro-batch, for layers ``[start, end)``."""

    samples: int
    """Samples in the replica's slice of the micro-batch."""
    fwd_s: float
    """Forward time of the slice, seconds."""
    bwd_s: float
    """Full backward time (input and weight gradients, the add into their sum under ``separate`` accumulation) of the slice, seconds."""
    wgrad_s: float
    """Part of ``bwd_s`` that computes weight gradients (the W of zero-bubble schedules)."""
    param_bytes: float
    """Parameter bytes of the layers on this device (its tensor-parallel share, unsharded by ZeRO)."""
    static_bytes: float
    """Parameters, gradients and optimizer state held by the device at rest (``states.total``)."""
    states: StateBytes
    """``static_bytes`` by kind, as data-parallel sharding leaves them (``sim.cost.memory.stage_state_bytes``)."""
    optimizer_s: float
    """The replica's optimizer step over the stage's parameters, seconds, after the tied
    embedding's gradient all-reduce (``tied_allreduce_s``, included)."""
    tied_allreduce_s: float = 0.0
    """The part of ``optimizer_s`` that all-reduces a tied embedding's gradient between its two
    stages (``sim.cost.comm.tied_allreduce_s``), seconds."""
    stash_bytes: float
    """Activation bytes the slice keeps from its forward until its backward."""
    rebuilt_bytes: float = 0.0
    """What the backward holds at once beyond the stash (``sim.cost.memory.ActivationBytes.rebuilt_bytes``)."""
    input_bytes: float
    """Bytes of the slice's stage input (what the previous stage sends)."""
    output_bytes: float
    """Bytes of the slice's stage output (what the next stage receives)."""


def stage_cost(
    model: ModelSpec,
    device: DeviceSpec,
    start: int,
    end: int,
    samples: int,
    *,
    recompute: Recompute | bool = Recompute.NONE,
    data_parallel: int = 1,
    sharding: Sharding = Sharding.NONE,
    tied_link: LinkSpec | None = None,
    accumulate_unsharded: bool = False,
    expert_data_parallel: int | None = None,
    num_microbatches: int = 1,
    fp32_shards: bool = False,
) -> StageCost:
    """Cost of layers ``[start, end)`` processing ``samples`` samples on ``device``: its time
    (``stage_time_s``), its activations (``sim.cost.memory.stage_activation_bytes``), its model
    states at rest (``sim.cost.memory.stage_state_bytes``) and its optimizer step.

    ``model`` holds one device's share of each layer (``sim.models.shard_model``). With full
    recompute the backward includes a second forward and the forward keeps only checkpoints
    (``sim.cost.memory.checkpoint_bytes``), the backward rebuilding one checkpointed segment at a
    time; with selective recompute the backward runs attention's score, softmax and value
    products again and the stash leaves out their s×s tensors (Korthikanti et al. 2022, §5).
    ``data_parallel`` devices hold the same parameters; ``sharding`` divides their states over
    them (ZeRO, Rajbhandari et al. 2020, §5) and with it the optimizer step, which each device
    runs on its shard. A stage that holds the head of a tied embedding but not the embedding
    keeps its own copy of the matrix (memory and optimizer step), and a stage holding either
    end alone all-reduces its gradient with the other over ``tied_link`` (``tied_allreduce_s``).
    ``accumulate_unsharded``: sharded gradients kept whole over the micro-batches
    (``sim.cost.memory.accumulates_unsharded``). The routed experts' states are over the
    ``expert_data_parallel`` devices that hold the same experts (``sim.cost.experts``; None: as
    the dense ones). Under ``model.grad_accumulation == "separate"`` each backward adds its weight
    gradients into the sum of ``num_microbatches`` (``_accumulation_s``). ``fp32_shards``: FSDP2's
    fp32 sharded parameters are the master weights (``sim.core.overlap.FsdpSpec.fp32_shards``).
    """
    recompute = Recompute.of(recompute)
    time = stage_time_s(model, device, start, end, samples, recompute)
    kept = stage_activation_bytes(model, start, end, samples, recompute)
    params = model.stage_param_bytes(start, end)
    experts = model.expert_param_bytes(start, end)
    edp = data_parallel if expert_data_parallel is None else expert_data_parallel
    states = moe_state_bytes(model, params, experts, data_parallel=data_parallel, expert_data_parallel=edp,
                             sharding=sharding, accumulate_unsharded=accumulate_unsharded, fp32_shards=fp32_shards)
    tensors = sum(layer.optimizer_tensors for layer in model.layers[start:end]) + tied_copy_tensors(model, start, end)
    stepped = stepped_param_bytes(params, experts, data_parallel=data_parallel, expert_data_parallel=edp,
                                  sharding=sharding)
    step_s = stage_optimizer_step_s(model, device, stepped, tensors, data_parallel=data_parallel, sharding=sharding,
                                    fp32_shards=fp32_shards, buffer_bytes=params)
    tied_s = tied_allreduce_s(model, start, end, tied_link)
    add_s = _accumulation_s(model, device, params, tensors, data_parallel=data_parallel, sharding=sharding,
                            accumulate_unsharded=accumulate_unsharded, num_microbatches=num_microbatches)
    return StageCost(
        samples=samples,
        fwd_s=time.fwd_s,
        bwd_s=time.bwd_s + add_s,
        wgrad_s=time.wgrad_s + add_s,
        param_bytes=params,
        static_bytes=states.total,
        states=states,
        optimizer_s=step_s + tied_s,
        tied_allreduce_s=tied_s,
        stash_bytes=kept.stash_bytes,
        rebuilt_bytes=kept.rebuilt_bytes,
        input_bytes=model.boundary_bytes[start] * samples,
        output_bytes=model.boundary_bytes[end] * samples,
    )
