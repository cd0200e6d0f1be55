"""ZeRO-3 as DeepSpeed ran it before v0.6: blocking gathers, one flat ring, a cap on live parameters.

FSDP2 (and DeepSpeed since v0.6) gathers a unit while the one before it computes and takes
NCCL's hierarchical path across servers (``sim.cost.overlap``, ``sim.cost.group_comm``). The
ZeRO-3 that Narayanan et al. 2021 (SC21, arXiv 2104.04473, §5.2, Table 2) compared with PTD-P —
"ZeRO-3 without model parallelism", integrated "using the DeepSpeed Python library" in early
2021 — did less, and its measured throughput halves each time the GPUs double at a fixed
batch (144 → 88 → 44 TFLOP/s per GPU for 175B on 384 → 1,536 A100): per GPU the compute halves
while the parameter and gradient traffic does not. Three settings of ``plan.fsdp`` say how:

* ``prefetch: false`` — the gathers block the compute. DeepSpeed v0.3.13–v0.5.10
  (microsoft/DeepSpeed ``deepspeed/runtime/zero/partition_parameters.py``, ``_allgather_param``)
  calls ``torch.cuda.synchronize()`` before every parameter's all-gather, and
  ``stage3.py``'s ``PartitionedParameterCoordinator.fetch_sub_module`` ends in
  ``_synchronize_communication``, another ``torch.cuda.synchronize()``; the reduction path
  waits on ``reduction_stream.synchronize()`` before each bucket (``reduce_ipg_grads``). PR
  #1453 (v0.6, January 2022: "more fine grained synchronization for communication that allows
  blocking on less work", "batching allgather calls to amortize fixed overhead and improve
  bandwidth utilization") is what lifted it. A unit's gather is then charged whole, before
  its compute: time = compute + every gather + the reduce-scatter (a bound: the one-ahead
  prefetch of ``prefetch_next_sub_modules`` could hide part of a gather behind the sub-module
  before it, the synchronisations leave little of that).
* ``path: flat`` — each all-gather and reduce-scatter is one ring over the whole data-parallel
  group, every device's ``(n−1)/n`` share of the stage's parameters through the ring's
  slowest hop, a NIC: per device per micro-batch an all-gather of ``2Ψ`` bytes in the
  forward, another in the backward and a reduce-scatter of ``2Ψ`` (fp16), ZeRO's ``3Ψ`` of
  Rajbhandari et al. 2020 (SC20, §7.2.2: "the total communication volume is 3Ψ", each device
  over its own link), about ``3 · 2Ψ · (n−1)/n / B_NIC``. ``hierarchical`` (the default) lets
  a server's eight NICs carry one eighth each, NCCL's multi-rail rings. The SC21 rows measure
  the flat cost, not the hierarchical one: at 768 and 1,536 GPUs, where communication
  dominates, 175B takes 66.7 s an iteration for 3 · 349 GB per GPU (16 GB/s per GPU, below
  one 25 GB/s HDR NIC, far below a server's 200 GB/s); per-parameter collectives (v0.3's
  ``_all_gather`` issues one ``torch.distributed.all_gather`` per parameter over ``world_size``
  output views) are the fixed overheads PR #1453 batched away.
* ``max_live_parameters`` — ``stage3_max_live_parameters`` (1e9 elements by default, v0.3's
  ``deepspeed/runtime/zero/constants.py``): the coordinator gathers one sub-module (a Linear's
  weight) at a time and prefetches the next only while fewer than that many elements are
  gathered (``prefetch_next_sub_modules``: ``total_available_parameter_numel <
  max_available_parameters_in_numel``), so at most the cap plus the largest sub-module's
  parameters are live, not FSDP's two whole blocks (:func:`capped_live_bytes`). The backward
  adds the running sub-module's unsharded gradient until its bucket is reduce-scattered
  (``reduce_independent_p_g_buckets_and_remove_grads``).

The engine reads them in ``sim.engine.groups`` (the path of the ``FS`` gathers),
``sim.engine.collectives`` (the path of the reduce-scatter), ``sim.engine.ops`` (blocking
gathers) and ``sim.cost.memory.stage_held_bytes`` (the cap). Pure Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.core.specs import DTYPE_BYTES

if TYPE_CHECKING:
    from sim.core.model_spec import ModelSpec

__all__ = ["capped_live_bytes", "largest_tensor_bytes", "live_cap_bytes"]


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
