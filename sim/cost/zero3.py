"""ZeRO-3 as DeepSpeed ran it before v0.6: sub-module gathers one ahead, a second gather for the
recompute, an all-reduce of the gradients, one flat ring, a cap on live parameters.

FSDP2 (and DeepSpeed since v0.6) gathers a unit while the one before it computes and takes
NCCL's hierarchical path across servers (``sim.cost.overlap``, ``sim.cost.group_comm``). The
ZeRO-3 that Narayanan et al. 2021 (SC21, arXiv 2104.04473, §5.2, Table 2) compared with PTD-P —
"ZeRO-3 without model parallelism", integrated "using the DeepSpeed Python library" in early
2021 — is taken to be DeepSpeed as released then, v0.3.13–v0.3.16 (microsoft/DeepSpeed, tags of
2021-03-16 to 2021-04-29; the paper names no version), run with its defaults. Its measured throughput halves each time the GPUs double at a fixed batch
(175B on 384 → 768 → 1,536 A100: 144 → 88 → 44 TFLOP/s per GPU, the same 66.7 s an iteration at
768 and 1,536): the compute hides behind a per-GPU communication that does not shrink. What
``plan.fsdp`` says of it, each from ``deepspeed/runtime/zero/`` at v0.3.16 (the same at v0.3.13 unless said):

* ``prefetch`` (true) — the gathers run beside the compute. ``stage3.py``'s
  ``pre_sub_module_forward_function`` (and its backward twin) calls
  ``PartitionedParameterCoordinator.fetch_sub_module`` (wait for this sub-module's parameters,
  ``_synchronize_communication``: ``torch.cuda.synchronize()``) and then
  ``prefetch_next_sub_modules``, which launches the next sub-module's all-gather
  (``_all_gather(..., async_op=True)``) on the coordinator's ``comm_stream`` before this
  sub-module's compute is queued; that stream is its own (``fetch_stream = torch.cuda.Stream() if
  self.overlap_comm``, and ``overlap_comm`` is true by default under ZeRO-3,
  ``constants.py``: ``ZERO3_OPTIMIZATION_OVERLAP_COMM_DEFAULT = True``). The synchronisations
  (``partition_parameters.py``'s ``_allgather_param`` calls ``torch.cuda.synchronize()`` too)
  stop the host, not the overlap: each sub-module's compute runs beside the next one's gather,
  one gather in flight at a time. PR #1453 (v0.6, January 2022) later batched the gathers and
  made the synchronisation finer.
* ``max_reuse_distance`` (``stage3_max_reuse_distance``, 1e9 elements by default) — under full
  recompute a block's parameters are gathered three times an iteration, not twice. The forward
  releases each sub-module (``release_sub_module``); the recompute's forward in the backward
  runs the sub-modules' hooks again and gathers them, and releases each again unless
  ``_keep_for_later``: the elements used before its next use (its own backward: the later
  sub-modules' forward and backward, ``PrefetchCoordinator.get_reuse_distance_in_numel``) are
  fewer than the cap; the backward then gathers what was released (:func:`regathered_bytes`).
  On GPT only a block's last weight (the MLP's down-projection, reused at once) stays.
* ``reduce_scatter`` (false) — the gradients are all-reduced, each device keeping its shard:
  ZeRO-3 leaves ``contiguous_gradients`` false by default (``constants.py``:
  ``ZERO3_OPTIMIZATION_CONTIGUOUS_GRADIENTS_DEFAULT = False``), and ``stage3.py``'s
  ``reduce_ipg_grads`` then takes ``buffered_reduce_fallback`` → ``allreduce_bucket`` →
  ``dist.all_reduce`` (v0.3.13–v0.3.16; with it true, v0.3.16's ``reduce_scatter`` default,
  false from PR #971 to #1058, reaches ``average_tensor``'s all-reduce too): twice the
  reduce-scatter's bytes (:func:`reduced_as`).
* ``path: flat`` — each all-gather and all-reduce is one ring over the whole data-parallel
  group, every device's ``(n−1)/n`` share through the ring's slowest hop, a NIC, as ZeRO's
  cost counts it per device (Rajbhandari et al. 2020, SC20, §7.2.2). ``hierarchical`` (the
  default) lets a server's eight NICs carry one eighth each, NCCL's multi-rail rings. At 768
  and 1,536 GPUs the 175B rows move about 4.7 · 2Ψ bytes a GPU an iteration (a gather in the
  forward, 1.67 in the backward, the all-reduce's two) in 66.7 s: 24 GB/s, one 25 GB/s HDR
  NIC's, far under a server's 200 GB/s. The 530B rows at 1,120 and 2,240 GPUs would need 27 GB/s
  a GPU for the same bytes (181 s), more than the NIC: predicted 7–9% slow, unexplained.
* ``max_live_parameters`` — ``stage3_max_live_parameters`` (1e9 elements by default,
  ``constants.py``): the coordinator gathers one sub-module (a Linear's weight) at a time and
  prefetches the next only while fewer than that many elements are gathered
  (``prefetch_next_sub_modules``: ``total_available_parameter_numel <
  max_available_parameters_in_numel``), so at most the cap plus the largest sub-module's
  parameters are live, not FSDP's two whole blocks (:func:`capped_live_bytes`). The backward
  adds the running sub-module's unsharded gradient until its bucket is reduced
  (``reduce_independent_p_g_buckets_and_remove_grads``). Memory only: that the cap also stops
  the prefetch beside a sub-module larger than it (530B's 1.26e9- and 1.68e9-element weights)
  is not modelled.

Not modelled: the gradient all-reduce runs on DeepSpeed's ``reduction_stream`` during the
backward, bucket by bucket, but every ``fetch_sub_module`` synchronises the whole device, so a
bucket runs beside one sub-module's backward and shares the NIC with that sub-module's
prefetched gather; the engine replays whole actions, so the SC21 scenarios leave
``plan.overlap.grad_reduce`` off and charge the all-reduce after the backward. Sub-module by
sub-module the truth lies between that and the all-reduce hidden behind the backward; they
differ where the backward's compute outlasts its gathers (175B on 384 GPUs: predicted 8% slow).

The engine reads them in ``sim.engine.groups`` (the path and bytes of the ``FS`` gathers),
``sim.engine.collectives`` (the path and kind of the gradient collective), ``sim.engine.ops``
(blocking gathers) and ``sim.cost.memory.stage_held_bytes`` (the cap); the planner in
``planner.search.costs``. Pure Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.core.parallelism import Sharding
from sim.core.specs import DTYPE_BYTES

if TYPE_CHECKING:
    from sim.core.model_spec import ModelSpec
    from sim.core.overlap import FsdpSpec

__all__ = ["capped_live_bytes", "largest_tensor_bytes", "live_cap_bytes", "reduced_as", "regathered_bytes"]


def largest_tensor_bytes(model: ModelSpec, start: int, end: int) -> float:
    """Bytes of the largest parameter tensor of layers ``[start, end)`` on one device: the
    weight a sub-module gathers (a product's ``fixed_bytes``, ``sim.cost.kernels.KernelSpec``)
    or, for what no product reads (norms, biases, an embedding table), the rest of the layer's
    parameters as one piece. A layer without kernels (a measured profile) is one piece."""
    largest = 0.0
    for layer in model.layers[start:end]:
        weights = [k.fixed_bytes for k in layer.kernels if k.weights and 0 < k.fixed_bytes <= layer.param_bytes]
        rest = layer.param_bytes - sum(weights)
        largest = max(largest, rest if rest > 0 else 0.0, *weights)
    return largest


def live_cap_bytes(model: ModelSpec, max_live_parameters: float) -> float:
    """``stage3_max_live_parameters`` elements as bytes in the model's parameter dtype."""
    return max_live_parameters * DTYPE_BYTES[model.dtype]


def capped_live_bytes(forward_bytes: float, backward_bytes: float, *, cap_bytes: float, largest_bytes: float,
                      grad_bytes_per_param_byte: float) -> tuple[float, float]:
    """FSDP's (forward, backward) held bytes (``sim.cost.memory.unit_peak_bytes``) under
    DeepSpeed's live-parameter cap: a forward holds at most ``min(held, C + w)`` (the cap ``C``
    plus the running sub-module's largest tensor ``w``), a backward ``min(held, C + w + g·w)``
    (its gradient, unsharded until reduce-scattered, ``g`` bytes per parameter byte)."""
    forward = min(forward_bytes, cap_bytes + largest_bytes)
    backward = min(backward_bytes, cap_bytes + largest_bytes * (1.0 + grad_bytes_per_param_byte))
    return forward, backward


def _sub_module_bytes(layer) -> list[float]:
    """A layer's gathered pieces in forward order: its products' weights (``largest_tensor_bytes``'s),
    the rest of its parameters (norms, biases) with the first; one piece without kernels."""
    weights = [k.fixed_bytes for k in layer.kernels if k.weights and 0 < k.fixed_bytes <= layer.param_bytes]
    if not weights:
        return [layer.param_bytes]
    return [weights[0] + layer.param_bytes - sum(weights), *weights[1:]]


def regathered_bytes(model: ModelSpec, start: int, end: int, *, max_reuse_distance: float | None,
                     full_recompute: bool) -> float:
    """Bytes of layers ``[start, end)`` a backward gathers a second time: under full recompute,
    each recomputed block's sub-modules whose reuse distance — the elements of the later
    sub-modules, whose forward and backward run between its recompute and its backward,
    ``2·Σ_{k>j} numel_k`` — is at least ``max_reuse_distance`` (DeepSpeed's ``_keep_for_later``
    keeps it below). 0 without the cap (FSDP: one gather per backward) or without full recompute;
    a layer full recompute does not run again (an embedding, a head) is not gathered again."""
    if max_reuse_distance is None or not full_recompute:
        return 0.0
    per_element = DTYPE_BYTES[model.dtype]
    total = 0.0
    for layer in model.layers[start:end]:
        if layer.checkpoint_bytes is None:
            continue
        between = 0.0  # elements used between a sub-module's recompute and its backward
        for piece in reversed(_sub_module_bytes(layer)):
            if between >= max_reuse_distance:
                total += piece
            between += 2.0 * piece / per_element
    return total


def reduced_as(sharding: Sharding, fsdp: FsdpSpec) -> Sharding:
    """The layout of a gradient collective laid out as ``sharding``: a reduce-scatter (``full``:
    ZeRO-3's, or ZeRO-2's every micro-batch) becomes an all-reduce (``Sharding.NONE``'s) with
    ``fsdp.reduce_scatter`` false, as DeepSpeed v0.3's ZeRO-3 ran by default; any other stays."""
    return Sharding.NONE if sharding is Sharding.FULL and not fsdp.reduce_scatter else sharding
