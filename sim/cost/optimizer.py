"""The optimizer step: which kernels it launches and how many bytes they move.

An optimizer step is element-wise work over every parameter: it reads the parameters, their
gradients and the optimizer's state and writes back the parameters and the state. It is
memory-bound, so its time is its bytes over the memory bandwidth, unless the host cannot
issue its kernels that fast. How many kernels and bytes depends on the implementation
(``sim.core.specs.OPTIMIZER_IMPLEMENTATIONS``), which is what the scenario's
``optimizer: {name: adam, implementation: fused}`` names:

* ``for-loop`` — torch's single-tensor optimizers (``torch.optim``'s default on CPUs): every
  element-wise operation once per parameter tensor, each a pass over the tensor
  (``OPTIMIZER_KERNELS``: Adam 8 launches and 18 passes of 4 bytes per element);
* ``foreach`` — torch's ``foreach=True`` (its default on CUDA): the same operations and
  bytes, each one multi-tensor launch over many tensors at once;
* ``fused`` — one kernel that does the whole update per element in registers (apex and
  Transformer Engine ``FusedAdam``, which Megatron-LM and DeepSpeed use; torch's
  ``fused=True``): Adam with fp32 master weights reads p, g, m, v and writes p, m, v, 7 passes
  of 4 bytes, 28 bytes per parameter (``FUSED_PASSES``).

A multi-tensor launch (torch's ``aten/src/ATen/native/cuda/MultiTensorApply.cuh``, from apex)
takes at most ``depth_to_max_tensors`` tensors (110, 64, 48, 36, 30 for 1 to 5 tensor lists)
and 320 blocks of 65 536 elements, so a launch covers up to 36 Adam tensors (4 lists: p, g,
m, v) or about 21 million elements (``multi_tensor_launches``).

Mixed precision (16-bit parameters) adds copies: the updated fp32 master weights back into
the 16-bit parameters (read 4 bytes, write 2 per element), and, unless the gradients are kept
in fp32 already (Megatron-LM's ``main_grad``, ``ModelSpec.grad_dtype``), the 16-bit gradients
into fp32 (read 2, write 4).

**Gradient accumulation** (``model.optimizer.grad_accumulation``), the gradient work that comes
before the step. With several micro-batches per iteration each weight's gradient is the sum of
theirs, taken in one of two places:

* ``fused`` — the weight-gradient product itself accumulates into the gradient buffer (a GEMM
  with β = 1): Megatron-LM's ``--gradient-accumulation-fusion`` (NVIDIA/Megatron-LM 83b1e42,
  2022-02-13, "gradient accumulation fusion", ``fused_weight_gradient_dense``), on unless turned
  off; nothing is added;
* ``separate`` — the product writes a fresh gradient and a separate element-wise kernel adds it
  to the sum, reading both and writing one: PyTorch autograd's ``AccumulateGrad``
  (``variable.grad += new_grad`` from the second micro-batch on; the first gradient is kept as
  it is). Megatron-LM ran it so before 2022: at 6fd7818 (2021-04-03, the code of Narayanan et
  al.'s SC21 runs), ``megatron/model/distributed.py``'s ``DistributedDataParallel`` without
  ``--use-contiguous-buffers-in-ddp`` leaves the fp16 ``.grad`` to autograd, and with them its
  hook runs ``param.main_grad.add_(param.grad.data)``; the fused GEMM did not exist yet.

**Passes over the gradients around the step** (``model.optimizer.grad_passes``), element-wise
work a framework runs on every gradient besides the update itself, each a pass in the gradients'
dtype (``GRAD_PASSES``). Megatron-LM's iteration (NVIDIA/Megatron-LM at cfd2e21, 2022-04-28, the
code of Korthikanti et al. 2022's runs; defaults ``--DDP-impl local``, contiguous buffers,
``--clip-grad 1.0``) runs four: ``zero``, ``train_step`` zeroes the fp32 gradient buffer first
(``DistributedDataParallel.zero_grad_buffer``: ``MemoryBuffer.zero()``, a write); ``divide``,
``allreduce_gradients`` divides it by the data-parallel size before its all-reduce, at any size,
one too (``buffer_.data /= mpu.get_data_parallel_world_size()``: read, write; megatron/model/
distributed.py); ``unscale``, an fp16 run's ``_unscale_main_grads_and_check_for_nan``
(``torch._amp_foreach_non_finite_check_and_unscale_``: read, write; megatron/optimizer/optimizer.py);
``norm``, ``clip_grad_norm_fp32``'s ``amp_C.multi_tensor_l2norm`` (read; megatron/optimizer/
clip_grads.py; the scale after it runs only when the norm exceeds the clip, not counted).
Megatron-Core (core_r0.8.0, core_v0.9.0) adds ``nan_check`` (``GRAD_PASSES``) and, under its
distributed optimizer, runs the buffer's passes over the whole unsharded buffer (``BUFFER_PASSES``).

Per accumulated parameter one add moves ``2·g + d`` bytes (``accumulation_bytes``): the sum read
and written in the gradients' dtype g, the new gradient read in the parameters' d (6 bytes for
fp16 throughout, 10 for an fp32 ``main_grad`` of fp16 weights). It runs m − 1 times in an
iteration of m micro-batches; a replay gives every backward the same duration, so each is
charged (m − 1)/m of one add (``accumulation_s``), which makes a rank's total exact (one
micro-batch: nothing). Under ZeRO-2/3 with a reduce-scatter per micro-batch the add runs on the
device's 1/d shard of the gradients (``sim.cost.compute``).
"""

from __future__ import annotations

import math

from sim.core.specs import DTYPE_BYTES, DeviceSpec

__all__ = ["BUFFER_PASSES", "FUSED_PASSES", "GRAD_ACCUMULATION_MODES", "GRAD_PASSES", "grad_pass_kernels", "accumulation_bytes", "accumulation_s", "MULTI_TENSOR_BLOCK_ELEMENTS", "MULTI_TENSOR_MAX_TENSORS", "OPTIMIZER_KERNELS",
           "multi_tensor_launches", "optimizer_step_kernels", "optimizer_step_s"]

OPTIMIZER_KERNELS = {"sgd": (1, 3), "momentum": (3, 8), "adam": (8, 18), "adamw": (9, 20)}
"""Per parameter tensor, the kernels of one step of torch's single-tensor optimizer
(``torch.optim``'s for-loop implementation, the one it uses on CPU): (launches, passes over
the tensor's fp32 elements, each read or write one pass). Adam: the step counter, ``lerp_``
of the first moment (read 2, write 1), ``mul_`` and ``addcmul_`` of the second (2 + 3),
``sqrt``, ``div`` and ``add_`` of the denominator (2 each), ``addcdiv_`` into the
parameter (read 3, write 1): 8 launches, 18 passes; AdamW adds the decay ``mul_``. SGD is one
``add_``; with momentum, ``mul_`` and ``add_`` of the buffer then the parameter's ``add_``.
The foreach implementation runs the same operations (and bytes), one multi-tensor launch each."""

FUSED_PASSES = {"sgd": (3, 2), "momentum": (5, 3), "adam": (7, 4), "adamw": (7, 4)}
"""A fused step per element: (passes of 4 bytes, tensor lists of its multi-tensor kernel).
Adam and AdamW (decay folded in): read p, g, m, v, write p, m, v (7 passes, 4 lists: apex's
and torch's ``_fused_adam`` take p, g, m, v); SGD read p, g, write p; momentum read p, g and
the buffer, write p and the buffer."""

MULTI_TENSOR_MAX_TENSORS = {1: 110, 2: 64, 3: 48, 4: 36, 5: 30}
"""Tensor lists -> most tensors per multi-tensor launch (``depth_to_max_tensors``, torch's
``MultiTensorApply.cuh``: its metadata must fit the 4 KB of kernel arguments)."""
MULTI_TENSOR_BLOCK_ELEMENTS = 320 * 65_536
"""Most elements per multi-tensor launch: 320 blocks (``depth_to_max_blocks``) of ``kChunkSize``
65 536 elements."""


GRAD_PASSES = {"zero": 1, "divide": 2, "unscale": 2, "norm": 1, "nan_check": 1}
"""A pass over the gradients around the step (the module docstring) -> its reads and writes of
every gradient element: zeroing the buffer writes it, dividing and unscaling read and write it,
the L2 norm reads it, and so does Megatron-Core's NaN check of each bucket before its collective
(``check_for_nan_in_grad``: ``grad_data.norm(p=2)``; megatron/core/distributed/
param_and_grad_buffer.py at core_r0.8.0 and core_v0.9.0, on by default:
``--no-check-for-nan-in-loss-and-grad`` is store_false)."""

BUFFER_PASSES = frozenset({"zero", "divide", "nan_check"})
"""The passes that run over a device's whole gradient buffer even when the optimizer's state is
sharded (ZeRO-1): Megatron-Core's distributed optimizer keeps the DDP buffer unsharded, zeroes
it (``zero_grad_buffer``), scales and NaN-checks each bucket before its reduce-scatter
(``start_grad_sync``); ``unscale`` and ``norm`` run on the optimizer's shard of main gradients."""


def grad_pass_kernels(passes: tuple[str, ...], elements: float, grad_width: int, tensors: int) -> tuple[float, int]:
    """(bytes moved, kernel launches) of ``passes`` (``GRAD_PASSES``' names) over ``elements``
    gradients of ``grad_width`` bytes in ``tensors`` tensors: ``zero`` and ``divide`` one launch on
    the contiguous buffer, ``unscale`` and ``norm`` one multi-tensor operation (one tensor list)."""
    nbytes = sum(GRAD_PASSES[name] for name in passes) * grad_width * elements
    launches = sum(1 if name in BUFFER_PASSES else multi_tensor_launches(tensors, elements, 1) for name in passes)
    return nbytes, launches


def multi_tensor_launches(tensors: int, elements: float, depth: int) -> int:
    """Launches of one multi-tensor operation over ``tensors`` tensors of ``elements`` in all
    with ``depth`` tensor lists: each launch takes at most ``MULTI_TENSOR_MAX_TENSORS[depth]``
    tensors and ``MULTI_TENSOR_BLOCK_ELEMENTS`` elements (at least one launch if any)."""
    if tensors <= 0 or elements <= 0:
        return 0
    return max(math.ceil(tensors / MULTI_TENSOR_MAX_TENSORS[depth]),
               math.ceil(elements / MULTI_TENSOR_BLOCK_ELEMENTS))


def optimizer_step_kernels(optimizer: str, dtype: str, param_bytes: float, tensors: int = 1, *,
                           implementation: str = "for-loop", grad_dtype: str | None = None,
                           grad_passes: tuple[str, ...] = ()) -> tuple[float, int]:
    """(bytes moved, kernel launches) of one optimizer step over ``tensors`` parameter tensors
    of ``param_bytes`` bytes in all (see the module doc for each implementation's counts), with
    ``grad_passes`` over their gradients (``grad_pass_kernels``)."""
    width = DTYPE_BYTES[dtype]
    elements = param_bytes / width
    if implementation == "fused":
        passes, depth = FUSED_PASSES[optimizer]
        nbytes, launches = passes * 4.0 * elements, multi_tensor_launches(tensors, elements, depth)
    else:
        per_tensor, passes = OPTIMIZER_KERNELS[optimizer]
        nbytes = passes * 4.0 * elements
        launches = per_tensor * (tensors if implementation == "for-loop"
                                 else multi_tensor_launches(tensors, elements, 3))
    if width < 4:
        copies = 1 if DTYPE_BYTES[grad_dtype or dtype] == 4 else 2  # master weights back (and gradients in)
        nbytes += copies * (width + 4.0) * elements
        launches += copies * (tensors if implementation == "for-loop" else multi_tensor_launches(tensors, elements, 2))
    if grad_passes:
        extra_bytes, extra_launches = grad_pass_kernels(grad_passes, elements, DTYPE_BYTES[grad_dtype or dtype], tensors)
        nbytes, launches = nbytes + extra_bytes, launches + extra_launches
    return nbytes, launches


def optimizer_step_s(device: DeviceSpec, optimizer: str, dtype: str, param_bytes: float, tensors: int, *,
                     implementation: str = "for-loop", grad_dtype: str | None = None,
                     grad_passes: tuple[str, ...] = ()) -> float:
    """One optimizer step over ``tensors`` parameter tensors of ``param_bytes`` bytes in all.

    Memory-bound (``optimizer_step_kernels``' bytes over the achieved memory bandwidth) or
    issue-bound (its launches × ``kernel_issue_s``), whichever is longer, as
    ``sim.cost.compute.kernel_time_s`` takes each kernel, the device time with ``kernel_overhead_s``
    per launch. Only the
    tensors' number and total size are known, so the launches are taken as equal in size.
    """
    if param_bytes <= 0:
        return 0.0
    nbytes, launches = optimizer_step_kernels(optimizer, dtype, param_bytes, tensors, implementation=implementation,
                                              grad_dtype=grad_dtype, grad_passes=grad_passes)
    return _launched_s(device, nbytes, launches)


def _launched_s(device: DeviceSpec, nbytes: float, launches: int) -> float:
    """Seconds of ``launches`` memory-bound kernels moving ``nbytes`` in all: their bytes over the
    achieved bandwidth plus a launch gap each, no less than their issue time
    (``sim.cost.compute.kernel_time_s``'s rule)."""
    memory_s = nbytes / (device.memory_bandwidth_bytes_per_s * device.memory_efficiency)
    return max(memory_s + launches * device.kernel_overhead_s, launches * device.kernel_issue_s)


def buffer_passes_s(device: DeviceSpec, passes: tuple[str, ...], elements: float, grad_width: int) -> float:
    """Seconds of the ``BUFFER_PASSES`` among ``passes`` over a whole buffer of ``elements``
    gradients of ``grad_width`` bytes: memory-bound, one launch each (its gap added), no less than
    their launches' issue time (``sim.cost.compute.kernel_time_s``'s rule)."""
    nbytes, launches = grad_pass_kernels(tuple(p for p in passes if p in BUFFER_PASSES), elements, grad_width, 1)
    return _launched_s(device, nbytes, launches) if launches else 0.0


GRAD_ACCUMULATION_MODES = ("fused", "separate")
"""Where the micro-batches' weight gradients are summed (the module docstring, gradient accumulation)."""


def accumulation_bytes(param_bytes: float, dtype: str, grad_dtype: str | None = None) -> float:
    """Bytes one add of a micro-batch's gradients into the sum moves over ``param_bytes`` of
    ``dtype`` parameters: ``(2·g + d)`` per element, g the gradients' dtype (None: ``dtype``)."""
    d = DTYPE_BYTES[dtype]
    g = DTYPE_BYTES[grad_dtype or dtype]
    return param_bytes / d * (2 * g + d)


def accumulation_s(device: DeviceSpec, param_bytes: float, dtype: str, grad_dtype: str | None, *,
                   tensors: int, num_microbatches: int) -> float:
    """Seconds of gradient accumulation charged to each backward of a stage whose device sums
    ``param_bytes`` of gradients over ``num_microbatches`` micro-batches: (m − 1)/m of one add,
    which lasts its bytes over the device's memory rate, and no less than one launch per
    parameter tensor (autograd runs one ``AccumulateGrad`` per tensor)."""
    if num_microbatches <= 1 or param_bytes <= 0:
        return 0.0
    one = _launched_s(device, accumulation_bytes(param_bytes, dtype, grad_dtype), tensors)
    return one * (num_microbatches - 1) / num_microbatches
